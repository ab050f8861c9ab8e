"""fa_course: the FlashAttention course's stages from Python, through the C ABI (ctypes; nothing is
built against CUDA or PyTorch), and the one definition of the benchmark CSVs.

    import fa_course
    lib = fa_course.load()                       # build*/lib/libfa_capi.so or $FA_CAPI_LIB
    [s.id for s in lib.stages()]                 # '01_cpu', '02_naive_gpu', ...
    lib.forward("01_cpu", fa_course.Problem.square(1, 2, 64, 32), q, k, v, o)
    rows = fa_course.read_results("plots/data/NVIDIA_H200/torch.csv")

Modules: schema (columns, keys, FLOP and byte formulas), results (CSV reading/writing), shapes
(Problem, presets), capi (the library), selection (which stages the PyTorch op runs), torch_gpu and
torch_runner (need PyTorch, imported lazily: `from fa_course import torch_runner` on a machine with
PyTorch and a GPU), ops (the stages as a trainable PyTorch op; importing it imports PyTorch):

    out = fa_course.attention(q, k, v, causal=True)   # fa_course.ops.attention, imported on first use
"""

from . import schema
from .capi import (FEATURES, FaError, Library, LibraryNotFoundError, Stage, find_library, forward, load, stages,
                   workspace_bytes)
from .results import (SchemaError, csv_kind, make_row, merge_results, read_csv, read_results, read_traffic,
                      read_ceilings, write_results, write_traffic, write_ceilings)
from .schema import (CEILINGS_COLUMNS, RESULTS_COLUMNS, RESULTS_KEY, TRAFFIC_COLUMNS, attention_flops,
                     attention_pairs, causal_key_end, minimum_bytes)
from .shapes import PRESETS, Problem, parse_problem, parse_shapes

__version__ = "0.2.0"


def __getattr__(name):
    """fa_course.attention is fa_course.ops.attention, imported (with PyTorch) only when asked for."""
    if name == "attention":
        from .ops import attention

        return attention
    raise AttributeError(f"module 'fa_course' has no attribute {name!r}")


__all__ = [
    "schema", "FEATURES", "FaError", "Library", "LibraryNotFoundError", "Stage", "find_library", "forward", "load",
    "stages", "workspace_bytes", "SchemaError", "csv_kind", "make_row", "merge_results", "read_csv", "read_results",
    "read_traffic", "read_ceilings", "write_results", "write_traffic", "write_ceilings", "CEILINGS_COLUMNS",
    "RESULTS_COLUMNS", "RESULTS_KEY", "TRAFFIC_COLUMNS", "attention_flops", "attention_pairs", "causal_key_end",
    "minimum_bytes", "PRESETS", "Problem", "parse_problem", "parse_shapes", "__version__",
]
