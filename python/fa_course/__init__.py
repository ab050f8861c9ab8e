"""fa_course: the FlashAttention course's CUDA stages as a PyTorch op, through their C ABI (ctypes;
nothing is built against PyTorch).

    import torch, fa_course
    out = fa_course.attention(q, k, v, causal=True)    # trains; torch.compile and CUDA graphs see one op

    lib = fa_course.Library()                          # the library installed with the package
    [s.id for s in lib.stages()]                       # '01_cpu', '02_naive_gpu', ...
    lib.forward("01_cpu", fa_course.Problem.square(1, 2, 64, 32), q, k, v, o)

    out = fa_course.fp8.attention(q, k, v)             # FP8 (e4m3), forward only, H100/H200 (stage 14)

`pip install python/` (from the repository) builds the library and ships it inside the package;
fa_course.Library(path) or $FA_CAPI_LIB names another (a development build of the checkout).
The benchmark and data tools (results CSVs, presets, the PyTorch side-by-side runner) are
fa_course.bench, which the op never imports. python/README.md documents all of it.
"""

import types

from .capi import FaError, Library, LibraryNotFoundError, Stage, load, stages
from .problem import Problem
from .selection import UnsupportedProblem

try:
    from . import fp8
    from .ops import attention, attention_with_lse, chosen_stages
except ImportError as _error:  # PyTorch missing or too old: the rest of the package works without it
    if isinstance(_error, ModuleNotFoundError) and _error.name != "torch":
        raise
    _TORCH_MISSING = f"fa_course's op needs PyTorch 2.4 or newer (pip install torch): {_error}"

    def _fp8_missing(*args, **kwargs):
        raise ModuleNotFoundError(_TORCH_MISSING, name="torch")

    # fa_course.fp8's three calls, each saying that PyTorch is missing
    fp8 = types.ModuleType("fa_course.fp8", "FP8 attention (stage 14); here its calls raise ModuleNotFoundError: "
                                            "PyTorch is missing.")
    fp8.quantize = fp8.attention_quantized = fp8.attention = _fp8_missing

    def attention(q, k, v, causal=False, *, stage=None, backward_stage=None, deterministic=False):
        """softmax(Q K^T / sqrt(D)) V; here it raises ModuleNotFoundError: PyTorch is missing."""
        raise ModuleNotFoundError(_TORCH_MISSING, name="torch")

    def attention_with_lse(q, k, v, causal=False, stage=None, backward_stage=None, deterministic=False):
        """(O, LSE); here it raises ModuleNotFoundError: PyTorch is missing."""
        raise ModuleNotFoundError(_TORCH_MISSING, name="torch")

    def chosen_stages(q, k, v, causal=False, stage=None, backward_stage=None):
        """The stages attention would run; here it raises ModuleNotFoundError: PyTorch is missing."""
        raise ModuleNotFoundError(_TORCH_MISSING, name="torch")

__version__ = "0.3.0"

__all__ = ["attention", "attention_with_lse", "chosen_stages", "fp8", "Library", "Stage", "load", "stages", "Problem",
           "FaError", "LibraryNotFoundError", "UnsupportedProblem", "__version__"]
