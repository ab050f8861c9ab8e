"""The results CSV of design.md, written once: its columns, its key, and the FLOP and byte counts
every row's TFLOP/s and GB/s are computed from. The C++ harness (common/src/report.cpp) writes the
same header; a test checks that the two agree.
"""

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
# One row per key in a data set (design.md, "One coherent data set per GPU").
RESULTS_KEY = ["stage", "gpu", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal", "pass"]

CEILINGS_COLUMNS = ["gpu", "metric", "value", "unit"]
CEILINGS_KEY = ["gpu", "metric"]

TRAFFIC_COLUMNS = [
    "stage", "gpu", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal", "pass",
    "dram_read_bytes", "dram_write_bytes", "l2_bytes", "predicted_bytes",
]
TRAFFIC_KEY = RESULTS_KEY

PASSES = ("fwd", "bwd", "fwd+bwd")
PEERS = ["torch_flash", "torch_efficient", "torch_cudnn", "torch_math", "torch_default"]
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
STATUSES = ("ok", "oom", "unsupported", "error")


def causal_key_end(row, q_seq, kv_seq):
    """Keys [0, end) that query row `row` sees under the bottom-right-aligned causal mask
    (common/include/fa/causal.hpp)."""
    return max(0, min(kv_seq, row + 1 + kv_seq - q_seq))


def attention_pairs(q_seq, kv_seq, causal):
    """(query, key) pairs that count: Nq·Nk; causal, Nq·Nk/2 for a square problem (the published
    convention) and the exact number of unmasked pairs otherwise."""
    if not causal:
        return q_seq * kv_seq
    if q_seq == kv_seq:
        return q_seq * kv_seq / 2
    # Rows from max(0, Nq - Nk) on see start, start + 1, ... keys (never past Nk: the last row
    # sees exactly Nk): the sum of causal_key_end in closed form.
    seeing_rows = min(q_seq, kv_seq)
    start = causal_key_end(q_seq - seeing_rows, q_seq, kv_seq)
    return seeing_rows * start + seeing_rows * (seeing_rows - 1) // 2


def attention_flops(batch, q_heads, q_seq, kv_seq, dim, causal, pass_="fwd"):
    """Forward 4·B·Hq·pairs·D; backward 2.5 times that; fwd+bwd 3.5 times."""
    forward = 4.0 * batch * q_heads * attention_pairs(q_seq, kv_seq, causal) * dim
    return {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[pass_] * forward


def minimum_bytes(batch, q_heads, kv_heads, q_seq, kv_seq, dim, dtype, pass_="fwd", with_lse=False):
    """The fewest bytes any implementation moves (common/src/problem.cpp): forward reads Q, K, V
    and writes O (and the FP32 LSE when asked); backward reads Q, K, V, O, dO, LSE and writes dQ,
    dK, dV."""
    width = ELEMENT_BYTES[dtype]
    q_bytes = batch * q_heads * q_seq * dim * width
    kv_bytes = batch * kv_heads * kv_seq * dim * width
    lse_bytes = batch * q_heads * q_seq * 4
    forward = 2 * q_bytes + 2 * kv_bytes + (lse_bytes if with_lse else 0)
    backward = 4 * q_bytes + 4 * kv_bytes + lse_bytes
    return {"fwd": forward, "bwd": backward, "fwd+bwd": forward + backward}[pass_]


def bandwidth_floor_ms(batch, q_heads, kv_heads, q_seq, kv_seq, dim, dtype, copy_gbps, pass_="fwd"):
    """The time minimum_bytes take at the measured copy bandwidth (ceilings.csv's copy_bandwidth, in
    GB/s of bytes read plus written). A memory-bound kernel (decoding, where the bytes are essentially
    K and V) comes close, and may pass it by some percent: a stream of reads alone runs faster than a
    copy's mix of reads and writes."""
    return minimum_bytes(batch, q_heads, kv_heads, q_seq, kv_seq, dim, dtype, pass_) / (copy_gbps * 1e9) * 1e3
