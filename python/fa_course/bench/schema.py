"""The results CSV of DESIGN.md, written once: its columns, its key, and the FLOP and byte counts
every row's TFLOP/s and GB/s are computed from. The C++ harness (common/src/report.cpp) writes the
same header; a test checks that the two agree. The counts are a problem's (fa_course/problem.py
defines them; Problem.flops and Problem.minimum_bytes use them).
"""

from ..problem import ELEMENT_BYTES, attention_flops, attention_pairs, causal_key_end, minimum_bytes  # noqa: F401

RESULTS_COLUMNS = [
    "stage", "gpu", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal", "pass",
    "ms_median", "ms_min", "tflops", "gbps", "peak_bytes", "max_abs_err", "rel_l2_err",
    "status", "source_hash", "note",
]
# Files written before the second part of the course have B, H, N, D and no pass: H is Hq = Hkv,
# N is Nq = Nk, pass is fwd.
LEGACY_RESULTS_COLUMNS = [
    "stage", "gpu", "B", "H", "N", "D", "dtype", "causal", "ms_median", "ms_min", "tflops", "gbps",
    "peak_bytes", "max_abs_err", "rel_l2_err", "status", "source_hash", "note",
]
# One row per key in a data set (DESIGN.md, "One coherent data set per GPU").
RESULTS_KEY = ["stage", "gpu", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal", "pass"]

CEILINGS_COLUMNS = ["gpu", "metric", "value", "unit"]
CEILINGS_KEY = ["gpu", "metric"]

TRAFFIC_COLUMNS = [
    "stage", "gpu", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal", "pass",
    "dram_read_bytes", "dram_write_bytes", "l2_bytes", "predicted_bytes",
]
TRAFFIC_KEY = RESULTS_KEY

PASSES = ("fwd", "bwd", "fwd+bwd")
# The rows of other people's kernels (no source_hash): PyTorch's SDPA backends (the torch runner), and
# cuDNN's FP8 attention through the cuDNN frontend (scripts/fp8_peers.py, beside stage 14).
PEERS = ["torch_flash", "torch_efficient", "torch_cudnn", "torch_math", "torch_default", "cudnn_fp8"]
STATUSES = ("ok", "oom", "unsupported", "error")


def bandwidth_floor_ms(batch, q_heads, kv_heads, q_seq, kv_seq, dim, dtype, copy_gbps, pass_="fwd"):
    """The time minimum_bytes take at the measured copy bandwidth (ceilings.csv's copy_bandwidth, in
    GB/s of bytes read plus written). A memory-bound kernel (decoding, where the bytes are essentially
    K and V) comes close, and may pass it by some percent: a stream of reads alone runs faster than a
    copy's mix of reads and writes."""
    return minimum_bytes(batch, q_heads, kv_heads, q_seq, kv_seq, dim, dtype, pass_) / (copy_gbps * 1e9) * 1e3
