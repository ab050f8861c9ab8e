"""The course's FlashAttention as a PyTorch operator that trains: forward and backward passes of the
stages through the C ABI (ctypes, so nothing is built against PyTorch), registered with
torch.library so that autograd, torch.compile (no graph break) and CUDA graphs see an ordinary op.

    import torch
    from fa_course import ops
    q = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out = ops.attention(q, k, v, causal=True)          # (2, 8, 1024, 64); grouped-query heads
    out.float().square().sum().backward()              # q.grad, k.grad, v.grad from stage 11

Tensors: Q (B, Hq, Nq, D), K and V (B, Hkv, Nk, D), Hq a multiple of Hkv (query head h reads K/V
head h // (Hq / Hkv)), contiguous, all on one device: CUDA in float16 or bfloat16, or the CPU in
float32 (the course's plain C++ stages: slow, but it lets the op be tested where there is no GPU).
`causal` masks bottom-right aligned (query i sees keys 0 .. i + Nk - Nq, PyTorch's
causal_lower_right); a query row that sees no key gets O = 0. The scale is 1 / sqrt(D).

Which stages run: fa_course.selection says how they are chosen (the latest stage of the course
that runs on this GPU, writes the log-sum-exp and takes the problem; on an H100 or H200
10_overlap, else 08_mma_registers; the backward pass is 11_backward's). `stage=` and
`backward_stage=` name others ("08", "09_wgmma_tma"); `chosen_stages(...)` says what a call runs.

The registered ops (namespace fa_course):
  torch.ops.fa_course.attention(q, k, v, causal=False, stage="", backward_stage="") -> (O, LSE)
      LSE is FP32 (B, Hq, Nq), the natural log of each row's softmax denominator; it is saved for
      the backward pass and is not differentiable (marked so: a loss that uses it gets no gradient
      through it).
  torch.ops.fa_course.attention_backward(grad_out, q, k, v, out, lse, causal=False, stage="")
      -> (dQ, dK, dV); dK and dV summed over each K/V head's query heads. Under
      torch.use_deterministic_algorithms(True) it runs with FA_DETERMINISTIC=1 in the environment,
      which 11_backward reads: dQ from a pass of its own, bitwise the same from run to run, instead of
      FP32 atomics in no fixed order (stages/11_backward/README.md says what it costs).

Each call allocates O, the LSE, the gradients and the stage's workspace (fa_workspace_bytes_v2) as
torch tensors and runs on the current stream, so a CUDA graph captures it: the library allocates
nothing. A tensor on the wrong device, of the wrong dtype, non-contiguous or of mismatched shapes
raises TypeError or ValueError before anything runs; a problem no stage takes (a head dim past a
stage's maximum) raises fa_course.selection.UnsupportedProblem (a ValueError) with the library's
reason; a failure inside the library raises capi.FaError (a RuntimeError) with its message.

Importing this module imports torch (2.4 or newer) and registers the ops; fa_course itself imports
it only when fa_course.attention is first asked for.
"""

import contextlib
import functools
import os
from typing import Optional, Tuple

import torch

from . import capi
from .selection import UnsupportedProblem, choose_stage
from .shapes import Problem

if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_fake"):
    raise ImportError(f"fa_course.ops needs PyTorch 2.4 or newer (torch.library.custom_op); this is "
                      f"{torch.__version__}")

NAMESPACE = "fa_course"
# (the tensors' device type, their dtype) -> the precision (fa_stage_precision) of the stages that take them
DTYPES = {
    ("cuda", torch.float16): "fp16",
    ("cuda", torch.bfloat16): "bf16",
    ("cpu", torch.float32): "fp32",
}


# ---- checks that need only shapes, dtypes and devices (the fake tensors of torch.compile have them) --


def _check_types(q, k, v) -> None:
    """The dispatcher would refuse a non-tensor too, but with the whole value printed."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"fa_course.attention: {name} must be a torch.Tensor, not {type(tensor).__name__}")


def _check_inputs(q, k, v) -> None:
    _check_types(q, k, v)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != 4:
            raise ValueError(f"fa_course.attention: {name} must be 4-D (batch, heads, seq, dim), not "
                             f"{tuple(tensor.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"fa_course.attention: q, k and v must be on one device, not {q.device}, {k.device} and "
                         f"{v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"fa_course.attention: q, k and v must have one dtype, not {q.dtype}, {k.dtype} and {v.dtype}")
    if (q.device.type, q.dtype) not in DTYPES:
        takes = ", ".join(f"{dtype} on {device.upper()}" for device, dtype in DTYPES)
        raise TypeError(f"fa_course.attention takes {takes}; the tensors are {q.dtype} on {q.device}")
    if k.shape != v.shape:
        raise ValueError(f"fa_course.attention: k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"fa_course.attention: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head dim")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"fa_course.attention: q's {q.shape[1]} heads are not a multiple of k's {k.shape[1]} "
                         f"(grouped-query attention needs Hq = G * Hkv)")
    if q.numel() == 0 or k.numel() == 0:
        raise ValueError(f"fa_course.attention: empty tensors: q {tuple(q.shape)}, k {tuple(k.shape)}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not tensor.is_contiguous():
            raise ValueError(f"fa_course.attention: {name} is not contiguous (stride {tuple(tensor.stride())}); the "
                             f"layout is (batch, heads, seq, dim) with dim fastest: call .contiguous()")


def _check_saved(grad_out, q, out, lse) -> None:
    if grad_out.shape != q.shape or out.shape != q.shape:
        raise ValueError(f"fa_course.attention_backward: grad_out {tuple(grad_out.shape)} and out "
                         f"{tuple(out.shape)} must be shaped like q {tuple(q.shape)}")
    if grad_out.dtype != q.dtype or out.dtype != q.dtype or grad_out.device != q.device or out.device != q.device:
        raise TypeError(f"fa_course.attention_backward: grad_out ({grad_out.dtype}, {grad_out.device}) and out "
                        f"({out.dtype}, {out.device}) must match q ({q.dtype}, {q.device})")
    if lse.dtype != torch.float32 or lse.device != q.device or lse.shape != q.shape[:3]:
        raise ValueError(f"fa_course.attention_backward: lse must be float32 {tuple(q.shape[:3])} on {q.device}, not "
                         f"{lse.dtype} {tuple(lse.shape)} on {lse.device}")
    for name, tensor in (("grad_out", grad_out), ("out", out), ("lse", lse)):
        if not tensor.is_contiguous():
            raise ValueError(f"fa_course.attention_backward: {name} is not contiguous")


# ---- what runs ---------------------------------------------------------------------------------


def _problem(q, k, causal: bool) -> Problem:
    batch, q_heads, q_seq, dim = (int(x) for x in q.shape)
    return Problem(batch, q_heads, int(k.shape[1]), q_seq, int(k.shape[2]), dim, bool(causal))


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> int:
    major, minor = torch.cuda.get_device_capability(device_index)
    return 10 * major + minor


def _stage(pass_: str, q, problem: Problem, requested: str) -> capi.Stage:
    backend = q.device.type
    capability = _capability(q.device.index if q.device.index is not None else torch.cuda.current_device()) \
        if backend == "cuda" else 0
    return choose_stage(capi.load(), pass_, backend, DTYPES[(backend, q.dtype)], problem, capability,
                        requested or None)


def chosen_stages(q, k, v, causal: bool = False, stage: Optional[str] = None,
                  backward_stage: Optional[str] = None) -> Tuple[str, str]:
    """(forward stage id, backward stage id) that attention(q, k, v, ...) runs; UnsupportedProblem
    when no stage takes the problem in either pass (the op itself finds out about the backward pass
    only when it runs it: call this first to refuse a training step before its forward pass)."""
    _check_inputs(q, k, v)
    problem = _problem(q, k, causal)
    return _stage("fwd", q, problem, stage or "").id, _stage("bwd", q, problem, backward_stage or "").id


def _workspace(library: capi.Library, stage: capi.Stage, problem: Problem, pass_: str, device):
    needed = library.workspace_bytes(stage.id, problem, pass_)
    return torch.empty(needed, dtype=torch.uint8, device=device) if needed else None


def _on_device(device):
    """The tensors' CUDA device made the current one for the call (the library runs on the current
    device and refuses pointers of another); nothing for CPU tensors."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _stream(device):
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


# ---- the ops -------------------------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::attention", mutates_args=())
def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, stage: str = "",
                       backward_stage: str = "") -> Tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE) of the chosen forward stage (see the module docstring); `backward_stage` is kept for
    the backward pass."""
    _check_inputs(q, k, v)
    problem = _problem(q, k, causal)
    library = capi.load()
    with _on_device(q.device):
        chosen = _stage("fwd", q, problem, stage)
        out = torch.empty_like(q)
        lse = torch.empty(problem.lse_shape, dtype=torch.float32, device=q.device)
        workspace = _workspace(library, chosen, problem, "fwd", q.device)
        library.forward(chosen.id, problem, q, k, v, out, lse=lse, stream=_stream(q.device), workspace=workspace)
    return out, lse


@attention_with_lse.register_fake
def _attention_fake(q, k, v, causal=False, stage="", backward_stage=""):
    _check_inputs(q, k, v)
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@contextlib.contextmanager
def _deterministic_if_asked():
    """FA_DETERMINISTIC=1 for the call when PyTorch is asked for deterministic algorithms (and the
    environment does not already say so), then the environment as it was."""
    if not torch.are_deterministic_algorithms_enabled() or os.environ.get("FA_DETERMINISTIC") == "1":
        yield
        return
    previous = os.environ.get("FA_DETERMINISTIC")
    os.environ["FA_DETERMINISTIC"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["FA_DETERMINISTIC"]
        else:
            os.environ["FA_DETERMINISTIC"] = previous


@torch.library.custom_op(f"{NAMESPACE}::attention_backward", mutates_args=())
def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, causal: bool = False,
                       stage: str = "") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of the chosen backward stage from the forward's O and LSE and the gradient dO."""
    _check_inputs(q, k, v)
    _check_saved(grad_out, q, out, lse)
    problem = _problem(q, k, causal)
    library = capi.load()
    with _on_device(q.device):
        chosen = _stage("bwd", q, problem, stage)
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        workspace = _workspace(library, chosen, problem, "bwd", q.device)
        with _deterministic_if_asked():
            library.backward(chosen.id, problem, q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v,
                             stream=_stream(q.device), workspace=workspace)
    return grad_q, grad_k, grad_v


@attention_backward.register_fake
def _attention_backward_fake(grad_out, q, k, v, out, lse, causal=False, stage=""):
    _check_inputs(q, k, v)
    _check_saved(grad_out, q, out, lse)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, _stage_name, backward_stage = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal = causal
    ctx.backward_stage = backward_stage
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    # dO arrives in whatever layout the graph above made (sum().backward() gives an expanded one)
    grad_q, grad_k, grad_v = attention_backward(grad_out.contiguous(), q, k, v, out, lse, ctx.causal,
                                                ctx.backward_stage)
    return grad_q, grad_k, grad_v, None, None, None


attention_with_lse.register_autograd(_backward, setup_context=_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, stage: Optional[str] = None,
              backward_stage: Optional[str] = None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(D)) V through the course's stages, differentiable in q, k and v (the
    module docstring says what it takes and raises). `stage`, `backward_stage`: run these instead of
    the automatic choice (a stage id, folder or number)."""
    _check_types(q, k, v)
    out, _ = attention_with_lse(q, k, v, causal, stage or "", backward_stage or "")
    return out


__all__ = ["attention", "attention_with_lse", "attention_backward", "chosen_stages", "UnsupportedProblem",
           "NAMESPACE", "DTYPES"]
