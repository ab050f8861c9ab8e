"""What compare_torch.py and ceilings.py share: PyTorch on a GPU, and FP32 that is really FP32."""

import sys
import warnings


def die(program, message):
    print(f"{program}: {message}", file=sys.stderr)
    sys.exit(2)


def load_torch(program):
    """PyTorch with a CUDA GPU, or a clear message and exit status 2."""
    try:
        import torch
    except ImportError as error:
        die(program, f"PyTorch is needed: {error}")
    if not torch.cuda.is_available():
        die(program, f"PyTorch {torch.__version__} sees no CUDA GPU (torch.version.cuda={torch.version.cuda})")
    return torch


def disable_tf32(torch, program):
    """FP32 matmuls in true FP32, then proven so: TF32 rounds the inputs to 10 mantissa bits, which
    shows as a relative error near 1e-3 on a 512-long dot product; IEEE FP32 stays near 1e-6."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        except (AttributeError, RuntimeError):  # only the newer per-backend API is left
            torch.backends.cuda.matmul.fp32_precision = "ieee"
            torch.backends.cudnn.fp32_precision = "ieee"
    generator = torch.Generator(device="cuda").manual_seed(1)
    a = torch.rand(512, 512, device="cuda", generator=generator) * 2 - 1
    b = torch.rand(512, 512, device="cuda", generator=generator) * 2 - 1
    exact = a.double() @ b.double()
    relative = ((a @ b).double() - exact).abs().max().item() / exact.abs().max().item()
    if relative > 1e-5:
        die(program, f"FP32 matmul still rounds like TF32 (relative error {relative:.1e}); FP32 cannot be measured")


def event_times_ms(torch, call, warmup, reps):
    """Runs `call` warmup times untimed, then reps times each between two CUDA events: the ms list."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times
