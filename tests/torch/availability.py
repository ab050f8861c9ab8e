"""Whether the op's tests of one half can run in this interpreter, and if not, why: the test
classes skip with this reason, and run.py turns it into ctest's "skipped" (or a failure under
FA_REQUIRE_GPU=1) before pytest starts. Importing it puts the fa_course package on sys.path (no
pip install needed); it imports nothing heavy until asked."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))


def unavailable_reason(mode: str) -> str:
    """'' when the `mode` half (cpu: the CPU stages in float32; gpu: the GPU stages in FP16 and
    BF16; fp8: fa_course.fp8, whose GPU tests skip by themselves without an H100) can run here, else
    why not."""
    try:
        import torch
    except ImportError as error:
        return f"PyTorch is not installed in {sys.executable} ({error})"
    if not hasattr(torch.library, "custom_op"):
        return f"PyTorch {torch.__version__} has no torch.library.custom_op (2.4 or newer needed)"
    from fa_course import capi

    try:
        library = capi.Library()
    except capi.LibraryNotFoundError as error:
        return f"no built library: {error}"
    if mode == "fp8":
        return "" if library.abi_version >= 3 else f"{library.path} has no FP8 calls (C ABI version 3)"
    wanted = {"cpu": [("cpu", "fp32")], "gpu": [("cuda", "fp16"), ("cuda", "bf16")]}[mode]
    for backend, precision in wanted:
        if not any(s.backend == backend and s.precision == precision and s.supports("backward")
                   for s in library.stages()):
            return f"{library.path} has no {backend} backward stage in {precision} (stage 11_backward not built)"
    if mode == "gpu":
        if not torch.cuda.is_available():
            return f"PyTorch {torch.__version__} sees no CUDA GPU"
        major, minor = torch.cuda.get_device_capability()
        if major < 8:
            return f"{torch.cuda.get_device_name()} is sm_{major}{minor}; the backward stage needs sm_80 or newer"
    return ""
