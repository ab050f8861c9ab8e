"""Our stages beside PyTorch's scaled_dot_product_attention, on the same tensors, in one table
(scripts/compare_torch.py is the command line over this module).

Each stage runs through the C ABI (capi.Library) on PyTorch tensors of its precision (FP32 stages on
float32, FP16 ones on float16, BF16 ones on bfloat16). Beside them, PyTorch's SDPA with each backend
forced in turn (torch_flash, torch_efficient, torch_cudnn, torch_math; torch_default lets PyTorch
choose), in every precision our chosen stages use; TF32 is off, so the FP32 peers compute in true
FP32. Grouped shapes (Hkv < Hq) go to SDPA with enable_gqa=True; causal masking with Nq != Nk uses
torch.nn.attention.bias.causal_lower_right (bottom-right aligned, as our stages are), is_causal=True
only for Nq = Nk.

A stage that does not take a shape (a feature it lacks, a head dim past its maximum, a GPU too old)
gets a row with status `unsupported` and the library's reason; a backend that refuses a shape or
dtype gets `unsupported` with PyTorch's reason; one that runs out of memory gets `oom`.

Every output, ours and PyTorch's, is compared with a float64 reference computed on the GPU from the
same (already rounded) inputs, on sampled heads and rows (our LSE too, where the stage writes one).
Times come from CUDA events: a first call (also the correctness sample), warm-up calls, then the
median and minimum of timed calls; where the inputs fit in L2 the cache is flushed before every
timed call (flush_l2='auto'). Rows follow fa_course.bench.schema and are merged into the results CSV (a
row replaces the one with the same key).

run(..., pass_='bwd') measures the backward pass alone instead: our stages with a backward pass
through fa_backward_v2, PyTorch's backends through torch.autograd.grad on one SDPA call's graph
(the section "the backward pass alone" below says exactly what is timed), gradients compared with a
float64 backward on sampled (batch, K/V head) groups; rows with pass = bwd and 2.5x the forward's
FLOPs. pass_='fwd+bwd' times the forward and the backward pass together, as one training step runs
them (3.5x the forward's FLOPs).

With timing='graph' every call, ours and PyTorch's, is captured once in a CUDA graph and timed as
graph replays (torch_gpu.graph_replay): one launch a call, no per-call host work on either side,
as serving engines run a decoding step. The check reads the output of the first replay. The results
schema has no column for how a row was timed, so graph rows say so in their note ("CUDA graph
replay") and go to a file of their own (default_out's torch_graph.csv), never replacing plain rows.

Guards keep a run inside a few minutes: a stage or backend whose calls would take longer than
max_call_seconds at a shape (predicted from its speed at the previous shape, or seen on its first
call) is skipped for that shape and larger ones (no row), and past max_seconds the run stops; both
are listed in the report.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import statistics
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence

from . import results
from .capi import FA_INVALID_SHAPE, FA_UNSUPPORTED, FaError, Library, Stage
from .shapes import Problem
from .torch_gpu import (L2Flush, TorchUnavailable, disable_tf32, event_times_ms, graph_replay, load_sdpa, precision_of,
                        release_cached_memory, torch_dtype)

# row name -> SDPBackend member (None: PyTorch's own choice)
PEERS: Dict[str, Optional[str]] = {
    "torch_flash": "FLASH_ATTENTION",
    "torch_efficient": "EFFICIENT_ATTENTION",
    "torch_cudnn": "CUDNN_ATTENTION",
    "torch_math": "MATH",
    "torch_default": None,
}
DEFAULT_PEERS = ["torch_flash", "torch_efficient", "torch_cudnn", "torch_math"]


class ContextLost(RuntimeError):
    """A kernel fault broke the CUDA context: nothing more can run in this process."""


# ---- our stages on PyTorch tensors -------------------------------------------------------------


def stage_forward(library: Library, stage, q, k, v, causal: bool = False, out=None, lse=None, workspace=None,
                  stream=None):
    """Runs one of our stages on PyTorch tensors: O (allocated when `out` is None), written in place.
    `lse` True allocates the FP32 log-sum-exp and returns (O, LSE). `workspace` is a uint8 tensor of at
    least library.workspace_bytes(...) bytes (allocated when None). The op's checks (fa_course.ops)
    check the tensors: of the stage's precision, on its device (the current one for a CUDA stage), O
    and the LSE not requiring grad. Raises TypeError or ValueError for a bad tensor and capi.FaError
    when the stage refuses or fails."""
    import torch

    from ..ops import check_inputs, check_output

    stage = stage if isinstance(stage, Stage) else library.stage(stage)
    problem = check_inputs(q, k, v, causal, who=stage.id, current_device=stage.is_cuda,
                           dtypes={(stage.backend, torch_dtype(torch, stage.precision)): stage.precision})
    if out is None:
        out = torch.empty_like(q)
    want_lse = lse is not None and lse is not False
    if lse is True:
        lse = torch.empty(problem.lse_shape, dtype=torch.float32, device=q.device)
    check_output("o", out, problem.q_shape, q.dtype, q.device, who=stage.id, written=True)
    if want_lse:
        check_output("lse", lse, problem.lse_shape, torch.float32, q.device, who=stage.id, written=True)
    needed = library.workspace_bytes(stage.id, problem)
    if needed and workspace is None:
        workspace = torch.empty(needed, dtype=torch.uint8, device=q.device)
    if needed and workspace.numel() * workspace.element_size() < needed:
        raise ValueError(f"{stage.id}: the workspace holds {workspace.numel() * workspace.element_size()} bytes, "
                         f"{needed} needed")
    if stage.is_cuda and stream is None:
        stream = torch.cuda.current_stream()
    library.forward(stage.id, problem, q, k, v, out, lse=lse if want_lse else None, stream=stream,
                    workspace=workspace if needed else None)
    return (out, lse) if want_lse else out


# ---- PyTorch's SDPA ----------------------------------------------------------------------------


def sdpa_call(torch, q, k, v, problem: Problem) -> Callable[[], object]:
    """PyTorch's SDPA on the problem: enable_gqa for grouped heads, causal_lower_right for a causal
    problem with Nq != Nk (is_causal=True aligns top-left, which agrees only when Nq = Nk)."""
    kwargs = {}
    if problem.grouped:
        kwargs["enable_gqa"] = True
    if problem.causal and problem.rectangular:
        from torch.nn.attention.bias import causal_lower_right

        with warnings.catch_warnings():  # "will produce NaNs when seq_len_q > seq_len_kv": the check counts them
            warnings.simplefilter("ignore")
            kwargs["attn_mask"] = causal_lower_right(problem.q_seq, problem.kv_seq)
    elif problem.causal:
        kwargs["is_causal"] = True
    function = torch.nn.functional.scaled_dot_product_attention
    return lambda: function(q, k, v, **kwargs)


# ---- the float64 reference ---------------------------------------------------------------------


def make_inputs(torch, problem: Problem, precision: str, seed: int):
    """Q, K, V uniform in [-1, 1), already in the precision the kernels see (so is the reference)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    tensors = []
    for shape in (problem.q_shape, problem.kv_shape, problem.kv_shape):
        values = torch.rand(shape, device="cuda", dtype=torch.float32, generator=generator)
        tensors.append(values.mul_(2).sub_(1).to(torch_dtype(torch, precision)))
        del values
    return tensors


def sample_heads(problem: Problem, count: int):
    """The first query head, the last, then the middle one: (b, h) pairs, `count` at most."""
    heads = problem.q_heads
    total = problem.batch * heads
    picks = list(dict.fromkeys([0, total - 1, total // 2]))[: max(1, count)]
    return [(p // heads, p % heads) for p in picks]


def sample_rows(torch, seq: int, limit: int, seed: int):
    if seq <= limit:
        return torch.arange(seq, device="cuda")
    edge = min(64, limit // 4)
    generator = torch.Generator(device="cuda").manual_seed(seed + 1)
    middle = torch.randperm(seq, device="cuda", generator=generator)[: limit - 2 * edge]
    ends = torch.cat([torch.arange(edge, device="cuda"), torch.arange(seq - edge, seq, device="cuda")])
    return torch.unique(torch.cat([ends, middle]))


@dataclasses.dataclass
class Check:
    max_abs: float
    rel_l2: float
    non_finite: int
    max_abs_v: float
    lse_max_abs: Optional[float] = None  # None: no LSE checked
    lse_mismatched: int = 0  # rows whose LSE is -inf on one side only, or not finite where it should be


def compare_with_reference(torch, problem: Problem, q, k, v, out, lse=None, check_heads: int = 2,
                           check_rows: int = 1024, seed: int = 0) -> Check:
    """Max abs and relative L2 error of `out` (and of `lse`) against float64 on sampled heads and rows,
    and the count of non-finite outputs over the whole tensor (a NaN must never vanish in a max). A row
    that sees no key (causal, Nq > Nk) expects O = 0 and LSE = -inf."""
    non_finite = int((~torch.isfinite(out)).sum().item())
    scale = 1.0 / math.sqrt(problem.dim)
    rows = sample_rows(torch, problem.q_seq, check_rows, seed)
    chunk = max(1, (1 << 25) // problem.kv_seq)  # keeps one chunk of float64 scores near 256 MiB
    keys = torch.arange(problem.kv_seq, device="cuda")
    max_abs, diff_sq, ref_sq = 0.0, 0.0, 0.0
    lse_max_abs, lse_mismatched = (0.0 if lse is not None else None), 0
    heads = sample_heads(problem, check_heads)
    for b, h in heads:
        kv = problem.kv_head_of(h)
        qh, kh, vh = q[b, h].double(), k[b, kv].double(), v[b, kv].double()
        for start in range(0, rows.numel(), chunk):
            picked = rows[start:start + chunk]
            scores = (qh[picked] @ kh.T) * scale
            if problem.causal:  # query i sees keys 0 .. i + Nk - Nq
                ends = picked[:, None] + 1 + problem.kv_seq - problem.q_seq
                scores.masked_fill_(keys[None, :] >= ends, float("-inf"))
            row_max = scores.max(dim=-1, keepdim=True).values
            empty = torch.isinf(row_max) & (row_max < 0)
            weights = torch.exp(scores - torch.where(empty, torch.zeros_like(row_max), row_max))
            sums = weights.sum(dim=-1, keepdim=True)
            expected = torch.where(empty, torch.zeros_like(sums), (weights @ vh) / torch.where(empty, torch.ones_like(sums), sums))
            difference = out[b, h][picked].double() - expected
            finite = torch.isfinite(difference)
            if finite.any():
                max_abs = max(max_abs, difference[finite].abs().max().item())
            diff_sq += torch.where(finite, difference, torch.zeros_like(difference)).square().sum().item()
            ref_sq += expected.square().sum().item()
            if lse is not None:
                expected_lse = (row_max + torch.log(sums)).squeeze(-1)
                expected_lse = torch.where(empty.squeeze(-1), torch.full_like(expected_lse, float("-inf")),
                                           expected_lse)
                got = lse[b, h][picked].double()
                both_finite = torch.isfinite(got) & torch.isfinite(expected_lse)
                agree_inf = torch.isneginf(got) & torch.isneginf(expected_lse)
                lse_mismatched += int((~(both_finite | agree_inf)).sum().item())
                if both_finite.any():
                    lse_max_abs = max(lse_max_abs, (got - expected_lse)[both_finite].abs().max().item())
    rel_l2 = math.sqrt(diff_sq / ref_sq) if ref_sq > 0 else math.sqrt(diff_sq)
    max_abs_v = max(v[b, problem.kv_head_of(h)].abs().max().item() for b, h in heads)
    return Check(max_abs, rel_l2, non_finite, max_abs_v, lse_max_abs, lse_mismatched)


# The LSE is FP32 from scores accumulated in FP32: its error stays near 1e-6 relative; this bound
# catches a wrong max, a missing rescale or a log of the wrong sum, not rounding.
LSE_TOLERANCE = 1e-3

# The relative L2 error of the worst of dQ, dK, dV above which a backward row of ours is `error`: 16
# unit roundoffs of the precision. A correct kernel stays a few roundoffs off (the rounding of P, dS
# and the output); a wrong mask, scale or sum is off by O(1). The tight, element-wise tolerances
# are the C++ tests' (fa::gradient_tolerance_unit) and tests/torch/test_op.py's (derived
# from PyTorch's own error on the same inputs).
GRADIENT_REL_L2_BOUND = {"fp16": 16 * 2.0**-11, "bf16": 16 * 2.0**-8, "fp32": 16 * 2.0**-24}


def make_grad_out(torch, problem: Problem, dtype, seed: int):
    """dO for the backward rows: N(0, 1) in the inputs' dtype, the same for every stage and backend."""
    generator = torch.Generator(device="cuda").manual_seed(seed + 2)
    values = torch.randn(problem.q_shape, device="cuda", dtype=torch.float32, generator=generator)
    return values.to(dtype)


@dataclasses.dataclass
class GradientCheck:
    max_abs: float  # the largest over dQ, dK, dV
    rel_l2: float  # the worst of the three
    non_finite: int  # over the whole of the three tensors
    per_gradient: Dict[str, float]  # max abs error of each


def sample_kv_groups(problem: Problem, count: int):
    """(b, K/V head) pairs: the first, the last, then the middle one; `count` at most."""
    total = problem.batch * problem.kv_heads
    picks = list(dict.fromkeys([0, total - 1, total // 2]))[: max(1, count)]
    return [(p // problem.kv_heads, p % problem.kv_heads) for p in picks]


def reference_gradients(torch, problem: Problem, q, k, v, grad_out, b: int, kv: int):
    """dQ (of the group's query heads), dK and dV of K/V head `kv` of batch entry `b`, in float64 from
    the rounded inputs: P = softmax(S) exactly, dV = P^T dO, dP = dO V^T, D = rowsum(dO * O),
    dS = P * (dP - D), dQ = dS K scale, dK = dS^T Q scale, summed over the group's heads. Query rows
    are taken in chunks (about 256 MiB of float64 scores each); a row that sees no key adds nothing."""
    group = problem.group_size
    heads = slice(kv * group, (kv + 1) * group)
    scale = 1.0 / math.sqrt(problem.dim)
    kh, vh = k[b, kv].double(), v[b, kv].double()
    grad_q = torch.zeros((group, problem.q_seq, problem.dim), dtype=torch.float64, device="cuda")
    grad_k = torch.zeros_like(kh)
    grad_v = torch.zeros_like(vh)
    chunk = max(1, (1 << 25) // (problem.kv_seq * group))
    keys = torch.arange(problem.kv_seq, device="cuda")
    for start in range(0, problem.q_seq, chunk):
        rows = torch.arange(start, min(problem.q_seq, start + chunk), device="cuda")
        qh = q[b, heads][:, rows].double()
        dout = grad_out[b, heads][:, rows].double()
        scores = (qh @ kh.T) * scale
        if problem.causal:
            ends = rows[:, None] + 1 + problem.kv_seq - problem.q_seq
            scores.masked_fill_((keys[None, :] >= ends)[None], float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
        weights = torch.exp(scores - row_max)
        sums = weights.sum(dim=-1, keepdim=True)
        probs = weights / torch.where(sums > 0, sums, torch.ones_like(sums))
        out = probs @ vh
        grad_v += (probs.transpose(-1, -2) @ dout).sum(dim=0)
        grad_probs = dout @ vh.T
        delta = (dout * out).sum(dim=-1, keepdim=True)
        grad_scores = probs * (grad_probs - delta)
        grad_q[:, rows] = (grad_scores @ kh) * scale
        grad_k += (grad_scores.transpose(-1, -2) @ qh).sum(dim=0) * scale
    return grad_q, grad_k, grad_v


def compare_gradients(torch, problem: Problem, inputs, grad_out, grads, check_groups: int = 2) -> GradientCheck:
    """Max abs and relative L2 errors of dQ, dK, dV against reference_gradients on sampled (batch,
    K/V head) groups, and the count of non-finite gradients over the whole tensors."""
    q, k, v = inputs
    grad_q, grad_k, grad_v = grads
    non_finite = sum(int((~torch.isfinite(g)).sum().item()) for g in grads)
    group = problem.group_size
    max_abs = {"dQ": 0.0, "dK": 0.0, "dV": 0.0}
    squares = {name: [0.0, 0.0] for name in max_abs}  # (error, reference)
    for b, kv in sample_kv_groups(problem, check_groups):
        expected = reference_gradients(torch, problem, q, k, v, grad_out, b, kv)
        got = (grad_q[b, kv * group:(kv + 1) * group], grad_k[b, kv], grad_v[b, kv])
        for name, mine, reference in zip(max_abs, got, expected):
            difference = mine.double() - reference
            finite = torch.isfinite(difference)
            difference = torch.where(finite, difference, torch.zeros_like(difference))
            max_abs[name] = max(max_abs[name], difference.abs().max().item())
            squares[name][0] += difference.square().sum().item()
            squares[name][1] += reference.square().sum().item()
    rel_l2 = max(math.sqrt(e / r) if r > 0 else math.sqrt(e) for e, r in squares.values())
    return GradientCheck(max(max_abs.values()), rel_l2, non_finite, max_abs)


# ---- helpers ------------------------------------------------------------------------------------


def one_line(text, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def oom_bytes(error) -> int:
    """The allocation PyTorch could not make, from its message ("Tried to allocate 32.00 GiB")."""
    match = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", str(error))
    if not match:
        return 0
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[match.group(2)]
    return int(float(match.group(1)) * scale)


BACKEND_WARNING_HEADERS = {"FLASH_ATTENTION": "flash attention", "EFFICIENT_ATTENTION": "memory efficient",
                           "CUDNN_ATTENTION": "cudnn attention"}


def refusal_reason(caught, error, backend: Optional[str] = None) -> str:
    """Why PyTorch refused: it explains each backend in UserWarnings before it raises ("Flash attention
    kernel not used because:", then the reasons). The forced backend's reasons, without the other
    backends' "runtime disabled" and PyTorch's source locations; else the error."""
    messages = [re.sub(r"\s*\(Triggered internally at [^)]*\)?.*$", "", " ".join(str(w.message).split()))
                for w in caught]
    groups: Dict[str, List[str]] = {}
    current = None
    for message in messages:
        header = re.match(r"(.*) kernel not used because:?$", message)
        if header:
            current = header.group(1).strip().lower()
            groups.setdefault(current, [])
        elif message and "No available kernel" not in message:
            groups.setdefault(current, []).append(message)
    wanted = BACKEND_WARNING_HEADERS.get(backend or "")
    chosen = [m for name, found in groups.items() if wanted and name and name.startswith(wanted) for m in found]
    if not chosen:
        chosen = [m for found in groups.values() for m in found if "runtime disabled" not in m]
    return one_line("; ".join(chosen) if chosen else error)


def first_call(torch, call):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = call()
    end.record()
    end.synchronize()
    return result, start.elapsed_time(end)


TIMINGS = ("plain", "graph")
GRAPH_NOTE = "CUDA graph replay"


def default_out(gpu: str, root: Optional[str] = None, timing: str = "plain") -> str:
    """plots/data/<gpu>/torch.csv of the repository; torch_graph.csv for rows timed as graph replays."""
    from .capi import REPO_ROOT

    name = "torch_graph.csv" if timing == "graph" else "torch.csv"
    return os.path.join(root or REPO_ROOT, "plots", "data", results.gpu_folder(gpu), name)


# ---- the run -----------------------------------------------------------------------------------


@dataclasses.dataclass
class RunConfig:
    warmup: int = 3  # warm-up calls, the first one included
    reps: int = 10  # timed calls, at most
    row_seconds: float = 2.0  # timed calls per row are cut to fit about this long, 3 at least
    max_call_seconds: float = 2.0  # skip a stage/backend at shapes where one call takes longer
    max_seconds: float = 420.0  # stop the whole run after this long
    check_heads: int = 2  # query heads compared with float64
    check_rows: int = 1024  # query rows per checked head
    seed: int = 0
    flush_l2: str = "auto"  # 'auto': flush before each timed call when the inputs fit in L2; 'on'; 'off'
    timing: str = "plain"  # 'plain': each call from the host; 'graph': replays of one call captured in a CUDA graph


class TorchRunner:
    """Runs stages and peers on problems and hands each row (schema.RESULTS_COLUMNS) to `sink`
    (default: merged into `out_path`). After run(): rows_written, failures (our wrong answers and
    errors), skipped (what got no row, and why)."""

    def __init__(self, library: Library, config: RunConfig = None, out_path: Optional[str] = None,
                 sink: Callable[[Dict], None] = None, printer: Callable[[str], None] = None):
        self.torch, self.sdp_backend, self.sdpa_kernel = load_sdpa()
        disable_tf32(self.torch)
        self.library = library
        self.config = config or RunConfig()
        self.gpu = self.torch.cuda.get_device_name(self.torch.cuda.current_device())
        self.out_path = out_path
        self.sink = sink or self._merge_into_file
        self.print = printer or (lambda text: print(text, flush=True))
        self.rows_written = 0
        self.rows: List[Dict] = []
        self.failures: List[str] = []
        self.skipped: List[str] = []
        self.seconds_per_flop: Dict[tuple, float] = {}  # (name, dtype, causal, pass) -> of its latest timed shape
        self.started = time.monotonic()
        self._flush: Optional[L2Flush] = None

    def _merge_into_file(self, row: Dict) -> None:
        if not self.out_path:
            return
        results.merge_results(self.out_path, [row])

    # ---- rows ----------------------------------------------------------------------------------
    def row(self, name: str, problem: Problem, precision: str, **fields) -> Dict:
        row = results.make_row(stage=name.split("/")[0], gpu=self.gpu, dtype=precision, status="ok", note="",
                               source_hash="", **{"pass": "fwd"}, **problem.row_fields())
        row.update(fields)
        self.sink(row)
        self.rows.append(row)
        self.rows_written += 1
        timing = f"{row['ms_median']} ms" if row.get("ms_median") not in (None, "") else ""
        tflops = f"{row['tflops']} TFLOP/s" if row.get("tflops") not in (None, "") else ""
        self.print(f"  {name:<24} {precision:<5} {'causal' if problem.causal else '':<6} {row['status']:<12} "
                   f"{timing:<16} {tflops:<18} err {row.get('max_abs_err') or '-':<10} {row.get('note') or ''}")
        return row

    def should_skip(self, name: str, precision: str, problem: Problem, pass_: str = "fwd") -> bool:
        flops = problem.flops(pass_)
        per_flop = self.seconds_per_flop.get((name, precision, problem.causal, pass_))
        if per_flop is not None and per_flop * flops > self.config.max_call_seconds:
            self.skipped.append(f"{name} {precision} {problem.describe()}: about {per_flop * flops:.1f} s per call "
                                f"> max-call-seconds {self.config.max_call_seconds}")
            self.print(f"  {name:<24} {precision:<5} skipped: about {per_flop * flops:.1f} s per call")
            return True
        return False

    def flush_for(self, problem: Problem, precision: str, pass_: str = "fwd"):
        """The L2 flush to run before each timed call, or None."""
        mode = self.config.flush_l2
        if mode == "off":
            return None
        if self._flush is None:
            self._flush = L2Flush(self.torch)
        if mode == "on" or problem.minimum_bytes(precision, pass_) < self._flush.bytes:
            return self._flush
        return None

    def time_calls(self, call, first_ms: float, before_each=None):
        """Warm-up and timed calls after the first one; the count shrinks for slow calls."""
        config = self.config
        first_s = max(first_ms / 1e3, 1e-6)
        warmups = max(0, min(config.warmup - 1, int(0.25 * config.row_seconds / first_s)))
        reps = max(3, min(config.reps, int(config.row_seconds / first_s)))
        times = event_times_ms(self.torch, call, warmups, reps, before_each)
        return statistics.median(times), min(times), reps

    def time_row(self, name: str, precision: str, problem: Problem, pass_: str, call, first_ms: float):
        """(median ms, min ms, notes) of `call` for a row of `pass_`: the first call's time alone when it
        took longer than max_call_seconds, else time_calls with L2 flushed where the inputs fit in it.
        Remembers the speed, for should_skip's prediction at the next shape."""
        config = self.config
        notes = []
        if first_ms / 1e3 > config.max_call_seconds:
            ms_median = ms_min = first_ms
            notes.append(f"1 call: it took more than max-call-seconds {config.max_call_seconds}")
        else:
            flush = self.flush_for(problem, precision, pass_)
            ms_median, ms_min, reps = self.time_calls(call, first_ms, flush)
            if reps != config.reps:
                notes.append(f"{reps} timed calls")
            if flush is not None:
                notes.append("L2 flushed before each call")
        self.seconds_per_flop[(name, precision, problem.causal, pass_)] = ms_median / 1e3 / problem.flops(pass_)
        return ms_median, ms_min, notes

    def measured(self, name: str, precision: str, problem: Problem, inputs, call, peak_bytes: int, source_hash: str,
                 is_ours: bool, checked_call=None):
        """Times `call` (the first call, or `checked_call` when given, also feeds the check; it returns O or
        (O, LSE)) and writes the row."""
        torch, config = self.torch, self.config
        q, k, v = inputs
        if config.timing == "graph":
            call = checked_call = graph_replay(torch, checked_call or call)
        result, first_ms = first_call(torch, checked_call or call)
        out, lse = result if isinstance(result, tuple) else (result, None)
        check = compare_with_reference(torch, problem, q, k, v, out, lse, config.check_heads, config.check_rows,
                                       config.seed)
        del result, out, lse
        flops = problem.flops()
        ms_median, ms_min, notes = self.time_row(name, precision, problem, "fwd", call, first_ms)
        if config.timing == "graph":
            notes.insert(0, GRAPH_NOTE)
        tolerance = self.library.tolerance(precision, check.max_abs_v)
        status = "ok"
        max_abs = check.max_abs
        wrong = []
        if check.non_finite:
            wrong.append(f"{check.non_finite} non-finite outputs")
            max_abs = float("nan")
        elif max_abs > tolerance:
            wrong.append(f"max_abs_err {max_abs:.3e} > tolerance {tolerance:.3e}" if is_ours
                         else f"above our {precision} tolerance {tolerance:.3e}")
        if check.lse_max_abs is not None:
            if check.lse_mismatched or check.lse_max_abs > LSE_TOLERANCE:
                wrong.append(f"LSE wrong: max abs err {check.lse_max_abs:.3e}, {check.lse_mismatched} rows not "
                             f"finite where expected (or the reverse)")
            else:
                notes.append(f"LSE max abs err {check.lse_max_abs:.1e}")
        if wrong and is_ours:
            status = "error"
            notes = ["wrong: " + "; ".join(wrong)] + notes
            self.failures.append(f"{name} {precision} {problem.describe()}: {'; '.join(wrong)}")
        else:
            notes = wrong + notes
        min_bytes = problem.minimum_bytes(precision)
        self.row(name, problem, precision, ms_median=f"{ms_median:.6g}", ms_min=f"{ms_min:.6g}",
                 tflops=f"{flops / (ms_median / 1e3) / 1e12:.6g}", gbps=f"{min_bytes / (ms_median / 1e3) / 1e9:.6g}",
                 peak_bytes=peak_bytes, max_abs_err=f"{max_abs:.3e}", rel_l2_err=f"{check.rel_l2:.3e}", status=status,
                 source_hash=source_hash, note="; ".join(notes))

    def free_bytes(self) -> int:
        return self.torch.cuda.mem_get_info()[0]

    # ---- our stages ----------------------------------------------------------------------------
    def run_stage(self, stage: Stage, problem: Problem, inputs) -> None:
        torch, library = self.torch, self.library
        name, precision = stage.id, stage.precision
        q, k, v = inputs
        reason = library.unsupported_reason(stage.id, problem)
        if reason:
            self.row(name, problem, precision, status="unsupported", source_hash=stage.source_hash,
                     note=one_line(reason))
            return
        if self.should_skip(name, precision, problem):
            return
        workspace_bytes = library.workspace_bytes(stage.id, problem)
        with_lse = stage.supports("lse")
        io_bytes = 2 * (q.numel() + k.numel()) * q.element_size()  # Q, K, V, O (the LSE is only for the check)
        try:
            out = torch.empty_like(q)
            lse = torch.empty(problem.lse_shape, dtype=torch.float32, device="cuda") if with_lse else None
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device="cuda") if workspace_bytes else None
        except torch.cuda.OutOfMemoryError:
            out = lse = workspace = None
            release_cached_memory(torch)
            self.row(name, problem, precision, status="oom", peak_bytes=io_bytes + workspace_bytes,
                     source_hash=stage.source_hash, note=f"{self.free_bytes()} bytes free")
            return
        out.fill_(float("nan"))  # poison: an element the stage never writes fails the check
        if lse is not None:
            lse.fill_(float("nan"))

        # The stream current at each call: a graph capture runs the call on its own stream.
        def call():
            library.forward(stage.id, problem, q, k, v, out, stream=torch.cuda.current_stream(), workspace=workspace)
            return out

        def checked_call():
            library.forward(stage.id, problem, q, k, v, out, lse=lse, stream=torch.cuda.current_stream(),
                            workspace=workspace)
            return out, lse

        try:
            self.measured(name, precision, problem, inputs, call, io_bytes + workspace_bytes, stage.source_hash,
                          is_ours=True, checked_call=checked_call if with_lse else None)
        except FaError as error:
            status = "unsupported" if error.status in (FA_INVALID_SHAPE, FA_UNSUPPORTED) else "error"
            self.row(name, problem, precision, status=status, source_hash=stage.source_hash,
                     note=one_line(f"{error.status_name}: {error.message}"))
            if status == "error":
                self.failures.append(f"{name} {precision} {problem.describe()}: {error.message}")
                self.require_healthy_context()
        except RuntimeError as error:  # a fault inside the kernel surfaces at the next synchronize
            self.row(name, problem, precision, status="error", source_hash=stage.source_hash, note=one_line(error))
            self.failures.append(f"{name} {precision} {problem.describe()}: {one_line(error)}")
            self.require_healthy_context()

    # ---- PyTorch -------------------------------------------------------------------------------
    def run_peer(self, peer: str, problem: Problem, inputs, precision: str) -> None:
        if self.should_skip(peer, precision, problem):
            return
        q, k, v = inputs

        def first(call):
            call()  # its output is freed before the timed calls

        def measure(call, _, peak):
            self.measured(peer, precision, problem, inputs, call, peak, "", is_ours=False)

        self.run_peer_pass(peer, problem, precision, "fwd", lambda: sdpa_call(self.torch, q, k, v, problem),
                           input_bytes=(q.numel() + 2 * k.numel()) * q.element_size(), first=first, measure=measure)

    def run_peer_pass(self, peer: str, problem: Problem, precision: str, pass_: str, make_call, input_bytes: int,
                      first, measure) -> None:
        """One pass of PyTorch's SDPA with `peer`'s backend forced: `make_call()` builds the call, `first(call)`
        runs it once untimed (the backend may refuse it there; what it returns goes to `measure`), then
        `measure(call, first's result, peak bytes)` times it and writes the row. A refusal, an out-of-memory
        error or a fault becomes the pass's row instead."""
        torch = self.torch
        fields = {"pass": pass_}
        try:
            call = make_call()
        except ImportError as error:
            self.row(peer, problem, precision, status="unsupported",
                     note=one_line(f"PyTorch {torch.__version__} lacks causal_lower_right: {error}"), **fields)
            return
        backend = PEERS[peer]
        context = self.sdpa_kernel(getattr(self.sdp_backend, backend)) if backend else _nothing()
        with context:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    result = first(call)
                    torch.cuda.synchronize()
                except torch.cuda.OutOfMemoryError as error:
                    release_cached_memory(torch)
                    self.row(peer, problem, precision, status="oom", peak_bytes=input_bytes + oom_bytes(error),
                             note=f"{self.free_bytes()} bytes free", **fields)
                    return
                except (RuntimeError, TypeError, ValueError) as error:  # TypeError: no enable_gqa before 2.5
                    self.row(peer, problem, precision, status="unsupported",
                             note=refusal_reason(caught, error, backend), **fields)
                    self.require_healthy_context()
                    return
            peak = torch.cuda.max_memory_allocated() - base + input_bytes
            try:
                measure(call, result, peak)
            except torch.cuda.OutOfMemoryError as error:
                release_cached_memory(torch)
                self.row(peer, problem, precision, status="oom", peak_bytes=input_bytes + oom_bytes(error),
                         note=f"{self.free_bytes()} bytes free", **fields)
            except RuntimeError as error:
                self.row(peer, problem, precision, status="error", note=one_line(error), **fields)
                self.require_healthy_context()

    def require_healthy_context(self) -> None:
        """After a kernel fault the CUDA context is lost for everyone in this process: ContextLost."""
        try:
            self.torch.cuda.synchronize()
        except RuntimeError as error:
            raise ContextLost(f"the CUDA context is broken ({one_line(error)}); stopping") from None

    # ---- the backward pass alone, or with the forward -------------------------------------------
    # What is timed for pass bwd, on both sides: from dO, O and the LSE already in memory (one forward
    # pass made them, untimed) to dQ, dK and dV written. Ours: one fa_backward_v2 call (its
    # preprocessing of D = rowsum(dO * O), the clearing of the FP32 dQ, the main kernel and dQ's
    # conversion). PyTorch: torch.autograd.grad(out, (q, k, v), dO, retain_graph=True) on the graph of
    # one SDPA call with the backend forced, which runs that backend's backward kernels (its own
    # preprocessing and dQ conversion included) and allocates the three gradients from the caching
    # allocator. For pass fwd+bwd the forward pass is inside the timed call: ours the stage's own
    # forward (fa_forward_v2, writing O and the LSE) then the backward; PyTorch's one SDPA call then
    # torch.autograd.grad on its fresh graph. CUDA events on the current stream bracket each call, as
    # in the forward rows.

    def run_stage_backward(self, stage: Stage, problem: Problem, inputs, pass_: str = "bwd") -> None:
        torch, library = self.torch, self.library
        name, precision = stage.id, stage.precision
        q, k, v = inputs
        reason = ("" if stage.supports("backward") else f"{stage.id} has no backward pass") or \
            library.unsupported_reason(stage.id, problem, lse=True) or \
            library.unsupported_reason(stage.id, problem, pass_="bwd")
        if reason:
            self.row(name, problem, precision, status="unsupported", source_hash=stage.source_hash,
                     note=one_line(reason), **{"pass": pass_})
            return
        if self.should_skip(name, precision, problem, pass_):
            return
        forward_bytes = library.workspace_bytes(stage.id, problem, "fwd")
        backward_bytes = library.workspace_bytes(stage.id, problem, "bwd")
        io_bytes = 4 * (q.numel() + k.numel()) * q.element_size() + 4 * problem.batch * problem.q_heads * problem.q_seq
        try:
            out, grad_out = torch.empty_like(q), make_grad_out(torch, problem, q.dtype, self.config.seed)
            lse = torch.empty(problem.lse_shape, dtype=torch.float32, device="cuda")
            grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]  # poison: unwritten elements fail
            forward_workspace = torch.empty(forward_bytes, dtype=torch.uint8, device="cuda") if forward_bytes else None
            workspace = torch.empty(backward_bytes, dtype=torch.uint8, device="cuda") if backward_bytes else None
        except torch.cuda.OutOfMemoryError:
            release_cached_memory(torch)
            self.row(name, problem, precision, status="oom", peak_bytes=io_bytes + backward_bytes,
                     source_hash=stage.source_hash, note=f"{self.free_bytes()} bytes free", **{"pass": pass_})
            return
        stream = torch.cuda.current_stream()

        def forward():
            library.forward(stage.id, problem, q, k, v, out, lse=lse, stream=stream, workspace=forward_workspace)

        def call():
            if pass_ == "fwd+bwd":
                forward()
            library.backward(stage.id, problem, q, k, v, out, grad_out, lse, *grads, stream=stream, workspace=workspace)
            return grads

        try:
            forward()
            self.measured_backward(name, precision, problem, inputs, grad_out, call,
                                   io_bytes + max(forward_bytes, backward_bytes), stage.source_hash, is_ours=True,
                                   pass_=pass_)
        except FaError as error:
            status = "unsupported" if error.status in (FA_INVALID_SHAPE, FA_UNSUPPORTED) else "error"
            self.row(name, problem, precision, status=status, source_hash=stage.source_hash,
                     note=one_line(f"{error.status_name}: {error.message}"), **{"pass": pass_})
            if status == "error":
                self.failures.append(f"{name} {precision} {pass_} {problem.describe()}: {error.message}")
                self.require_healthy_context()
        except RuntimeError as error:
            self.row(name, problem, precision, status="error", source_hash=stage.source_hash, note=one_line(error),
                     **{"pass": pass_})
            self.failures.append(f"{name} {precision} {pass_} {problem.describe()}: {one_line(error)}")
            self.require_healthy_context()

    def run_peer_backward(self, peer: str, problem: Problem, inputs, precision: str, pass_: str = "bwd") -> None:
        torch = self.torch
        if self.should_skip(peer, precision, problem, pass_):
            return
        leaves = [t.detach().requires_grad_() for t in inputs]
        grad_out = make_grad_out(torch, problem, inputs[0].dtype, self.config.seed)

        def first(forward):
            out = forward()
            torch.autograd.grad(out, leaves, grad_out, retain_graph=True)  # the backend may refuse here
            return out

        def measure(forward, out, peak):
            def call():
                if pass_ == "fwd+bwd":
                    return torch.autograd.grad(forward(), leaves, grad_out)
                return torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

            self.measured_backward(peer, precision, problem, inputs, grad_out, call, peak, "", is_ours=False,
                                   pass_=pass_)

        self.run_peer_pass(peer, problem, precision, pass_, lambda: sdpa_call(torch, *leaves, problem),
                           input_bytes=2 * sum(t.numel() for t in inputs) * inputs[0].element_size(),  # Q, K, V, dO, O
                           first=first, measure=measure)

    def measured_backward(self, name: str, precision: str, problem: Problem, inputs, grad_out, call,
                          peak_bytes: int, source_hash: str, is_ours: bool, pass_: str = "bwd") -> None:
        """Times `call` (it returns dQ, dK, dV; its first call also feeds the check against the float64
        backward) and writes the row of `pass_` (bwd: 2.5x the forward's FLOPs and the backward's
        minimum bytes; fwd+bwd: 3.5x, and both passes' bytes)."""
        config = self.config
        grads, first_ms = first_call(self.torch, call)
        check = compare_gradients(self.torch, problem, inputs, grad_out, grads, config.check_heads)
        del grads
        flops = problem.flops(pass_)
        ms_median, ms_min, notes = self.time_row(name, precision, problem, pass_, call, first_ms)
        status, wrong = "ok", []
        bound = GRADIENT_REL_L2_BOUND[precision]
        if check.non_finite:
            wrong.append(f"{check.non_finite} non-finite gradients")
        elif check.rel_l2 > bound:
            wrong.append(f"rel_l2_err {check.rel_l2:.3e} > {bound:.3e}" if is_ours
                         else f"above our {precision} gradient bound {bound:.3e}")
        notes.append("errors of " + ", ".join(f"{g} {e:.1e}" for g, e in check.per_gradient.items()) + " (max abs)")
        if wrong and is_ours:
            status = "error"
            notes = ["wrong: " + "; ".join(wrong)] + notes
            self.failures.append(f"{name} {precision} {pass_} {problem.describe()}: {'; '.join(wrong)}")
        else:
            notes = wrong + notes
        min_bytes = problem.minimum_bytes(precision, pass_)
        max_abs = float("nan") if check.non_finite else check.max_abs
        self.row(name, problem, precision, ms_median=f"{ms_median:.6g}", ms_min=f"{ms_min:.6g}",
                 tflops=f"{flops / (ms_median / 1e3) / 1e12:.6g}", gbps=f"{min_bytes / (ms_median / 1e3) / 1e9:.6g}",
                 peak_bytes=peak_bytes, max_abs_err=f"{max_abs:.3e}", rel_l2_err=f"{check.rel_l2:.3e}", status=status,
                 source_hash=source_hash, note="; ".join(notes), **{"pass": pass_})

    # ---- the whole run -------------------------------------------------------------------------
    def over_budget(self) -> bool:
        return time.monotonic() - self.started > self.config.max_seconds

    def run(self, problems: Sequence[Problem], stages: Sequence[Stage], peers: Sequence[str],
            precisions: Sequence[str], causal_modes: Sequence[bool] = (False,), pass_: str = "fwd") -> None:
        """Every problem in every precision, with each causal mode: our stages of that precision, then
        the peers; the forward pass, or with pass_='bwd' the backward pass alone, with 'fwd+bwd' both
        (see run_stage_backward). Raises ContextLost after a kernel fault (the rows so far are written)."""
        torch = self.torch
        for peer in peers:
            if peer not in PEERS:
                raise ValueError(f"unknown peer '{peer}' (choose from {', '.join(PEERS)})")
        if pass_ not in ("fwd", "bwd", "fwd+bwd"):
            raise ValueError(f"pass '{pass_}': this runner measures 'fwd', 'bwd' or 'fwd+bwd'")
        if pass_ == "fwd":
            run_stage, run_peer = self.run_stage, self.run_peer
        else:
            run_stage = functools.partial(self.run_stage_backward, pass_=pass_)
            run_peer = functools.partial(self.run_peer_backward, pass_=pass_)
        pending = [(problem, p) for problem in problems for p in precisions]
        for index, (problem, precision) in enumerate(pending):
            if self.over_budget():
                for left, left_precision in pending[index:]:
                    self.skipped.append(f"{left.describe()} {left_precision}: past max-seconds "
                                        f"{self.config.max_seconds}")
                break
            ours = [s for s in stages if s.precision == precision]
            if not ours and not peers:
                continue
            self.print(f"{problem.describe()} {precision}")
            release_cached_memory(torch)
            try:
                inputs = make_inputs(torch, problem, precision, self.config.seed)
            except torch.cuda.OutOfMemoryError:
                release_cached_memory(torch)
                self.skipped.append(f"{problem.describe()} {precision}: the inputs alone do not fit in device memory")
                continue
            for causal in causal_modes:
                masked = problem.with_causal(causal)
                for stage in ours:
                    run_stage(stage, masked, inputs)
                for peer in peers:
                    run_peer(peer, masked, inputs, precision)
            del inputs

    def report(self, stream=None) -> None:
        stream = stream or sys.stdout
        where = f" to {self.out_path}" if self.out_path else ""
        print(f"\n{self.rows_written} rows written{where} in {time.monotonic() - self.started:.0f} s", file=stream)
        if self.skipped:
            print(f"skipped (no row written) — {len(self.skipped)}:", file=stream)
            for line in self.skipped:
                print(f"  {line}", file=stream)
        if self.failures:
            print(f"FAILED — {len(self.failures)} of our rows:", file=stream)
            for line in self.failures:
                print(f"  {line}", file=stream)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


__all__ = ["PEERS", "DEFAULT_PEERS", "RunConfig", "TorchRunner", "ContextLost", "TorchUnavailable", "stage_forward",
           "sdpa_call", "compare_with_reference", "make_inputs", "default_out", "precision_of", "compare_gradients",
           "reference_gradients", "make_grad_out", "GRADIENT_REL_L2_BOUND"]
