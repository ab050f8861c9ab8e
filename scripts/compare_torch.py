#!/usr/bin/env python3
"""Our stages beside PyTorch's scaled_dot_product_attention, on the same tensors, in one table.

Each GPU stage runs through the C ABI (build/lib/libfa_capi.so, stages/fa_capi.h) on PyTorch
tensors of its precision (FP32 stages on float32, FP16 ones on float16, BF16 ones on bfloat16).
Beside them, PyTorch's SDPA with each backend forced in turn (torch_flash, torch_efficient,
torch_cudnn, torch_math), in every precision our chosen stages use; TF32 is off, so the FP32
peers compute in true FP32. A backend that refuses a shape or dtype gets a row with status
`unsupported` and PyTorch's reason in `note`; one that runs out of memory gets status `oom`.

Every output, ours and PyTorch's, is compared with a float64 reference computed on the GPU from
the same (already rounded) inputs, on sampled heads and rows. Times come from CUDA events: a
first call (also the correctness sample), warm-up calls, then the median and minimum of timed
calls. Rows are appended to the results CSV of design.md. With --causal on (or both) the same
shapes run with causal masking too: our stages with causal set, PyTorch with is_causal=True, the
reference with keys after each query masked, and the FLOP count halved (design.md).

Guards keep a phase inside a few minutes: a stage or backend whose calls would take longer than
--max-call-seconds at a shape (predicted from its speed at the previous shape, or seen on its
first call) is skipped for that shape and larger ones: nothing is written for it, and what was
skipped is printed. Past --max-seconds the run stops and prints what it did not do.

Exit status: 0 when every row was written; 1 when one of our stages gave a wrong answer or a
CUDA error; 2 when PyTorch, a GPU or the library is missing or the command line is bad.

  python3 scripts/compare_torch.py --lib build/lib/libfa_capi.so --shapes seed001 --out torch.csv
"""

import argparse
import csv
import ctypes
import math
import os
import re
import statistics
import sys
import time
import warnings

import torch_gpu

CSV_HEADER = [
    "stage", "gpu", "B", "H", "N", "D", "dtype", "causal", "ms_median", "ms_min", "tflops", "gbps",
    "peak_bytes", "max_abs_err", "rel_l2_err", "status", "source_hash", "note",
]

# (B, H, N, D). seed001: D=128, H=16, B*N = 16384 (the seed documents' RTX 3090 table), and
# the same at D=64;
# seed004: the seed documents' three shapes; the sweeps: B=H=1 up to N = 2^17 (design.md).
PRESETS = {
    "seed001": [(32, 16, 512, 128), (16, 16, 1024, 128), (8, 16, 2048, 128), (4, 16, 4096, 128),
                (2, 16, 8192, 128), (1, 16, 16384, 128)],
    "seed001-d64": [(32, 16, 512, 64), (16, 16, 1024, 64), (8, 16, 2048, 64), (4, 16, 4096, 64),
                    (2, 16, 8192, 64), (1, 16, 16384, 64)],
    "seed004": [(1, 64, 1024, 128), (2, 64, 4096, 128), (4, 64, 8192, 128)],
    "sweep-d64": [(1, 1, 2**k, 64) for k in range(8, 18)],
    "sweep-d128": [(1, 1, 2**k, 128) for k in range(8, 18)],
    # Quick smoke test: N and D not multiples of any tile, and a D (100) that flash refuses.
    "small": [(1, 1, 64, 64), (2, 3, 257, 72), (1, 2, 1000, 100)],
}

PEERS = {  # row name -> SDPBackend member
    "torch_flash": "FLASH_ATTENTION",
    "torch_efficient": "EFFICIENT_ATTENTION",
    "torch_cudnn": "CUDNN_ATTENTION",
    "torch_math": "MATH",
}

FA_STATUS = {0: "FA_OK", 1: "FA_UNKNOWN_STAGE", 2: "FA_INVALID_SHAPE", 3: "FA_UNSUPPORTED",
             4: "FA_CUDA_ERROR", 5: "FA_INVALID_ARGUMENT", 6: "FA_INTERNAL_ERROR"}
FA_INVALID_SHAPE, FA_UNSUPPORTED = 2, 3

ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


PROGRAM = "compare_torch"


def die(message):
    torch_gpu.die(PROGRAM, message)


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        item = item.strip()
        if item in PRESETS:
            shapes.extend(PRESETS[item])
        elif re.fullmatch(r"\d+x\d+x\d+x\d+", item):
            shapes.append(tuple(int(x) for x in item.split("x")))
        else:
            die(f"unknown shape '{item}': use a preset ({', '.join(PRESETS)}) or BxHxNxD")
    return shapes


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", default="build/lib/libfa_capi.so", help="the C ABI library (default: %(default)s)")
    parser.add_argument("--out", help="results CSV to append to (default: plots/data/<gpu>/torch.csv)")
    parser.add_argument("--shapes", nargs="+", default=["small"],
                        help=f"presets ({', '.join(PRESETS)}) or BxHxNxD, separated by spaces or commas "
                             "(default: small)")
    parser.add_argument("--stages", default="all",
                        help="comma-separated stage ids or numbers (04,05_float4); 'all' = every GPU stage; "
                             "'none' = PyTorch only (default: %(default)s)")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="comma-separated PyTorch rows to run, or 'none' (default: %(default)s)")
    parser.add_argument("--dtype", help="comma-separated precisions to run (fp32,fp16,bf16); default: those of "
                                        "the chosen stages (fp16 when no stage is chosen)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up calls, the first one included (default: 3)")
    parser.add_argument("--reps", type=int, default=10, help="timed calls, at most (default: %(default)s)")
    parser.add_argument("--row-seconds", type=float, default=2.0,
                        help="timed calls per row are cut to fit about this long, 3 at least (default: %(default)s)")
    parser.add_argument("--max-call-seconds", type=float, default=2.0,
                        help="skip a stage/backend at shapes where one call takes longer (default: %(default)s)")
    parser.add_argument("--max-seconds", type=float, default=420.0,
                        help="stop the whole run after this long (default: %(default)s)")
    parser.add_argument("--check-heads", type=int, default=2, help="heads compared with float64 (default: 2)")
    parser.add_argument("--check-rows", type=int, default=1024, help="query rows per checked head (default: 1024)")
    parser.add_argument("--causal", choices=["off", "on", "both"], default="off",
                        help="causal masking: off, on, or both for every shape (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list the library's stages and exit")
    args = parser.parse_args()
    if args.warmup < 1 or args.reps < 1:
        die("--warmup and --reps must be at least 1")
    args.shape_list = parse_shapes(",".join(args.shapes))
    args.causal_modes = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    return args


class StageLibrary:
    """The C ABI of stages/fa_capi.h through ctypes."""

    def __init__(self, path):
        if not os.path.isfile(path):
            die(f"no library at {path}: build it first (cmake --build build --target fa_capi)")
        try:
            self.lib = ctypes.CDLL(os.path.abspath(path))
        except OSError as error:
            die(f"cannot load {path}: {error}")
        i64, text, ptr = ctypes.c_int64, ctypes.c_char_p, ctypes.c_void_p
        lib = self.lib
        lib.fa_workspace_bytes.argtypes = [text, i64, i64, i64, i64, ctypes.c_int]
        lib.fa_workspace_bytes.restype = i64
        lib.fa_forward.argtypes = [text, i64, i64, i64, i64, ctypes.c_int, ptr, ptr, ptr, ptr, ptr, ptr]
        lib.fa_forward.restype = ctypes.c_int
        lib.fa_stage_count.argtypes = []
        lib.fa_stage_count.restype = ctypes.c_int
        lib.fa_stage_id.argtypes = [ctypes.c_int]
        lib.fa_stage_id.restype = text
        for name in ("fa_stage_title", "fa_stage_backend", "fa_stage_precision", "fa_stage_source_hash"):
            getattr(lib, name).argtypes = [text]
            getattr(lib, name).restype = text
        lib.fa_stage_max_dim.argtypes = [text]
        lib.fa_stage_max_dim.restype = i64
        lib.fa_tolerance.argtypes = [text, ctypes.c_double]
        lib.fa_tolerance.restype = ctypes.c_double
        lib.fa_last_error.argtypes = []
        lib.fa_last_error.restype = text

    def stages(self):
        found = []
        for index in range(self.lib.fa_stage_count()):
            sid = self.lib.fa_stage_id(index)
            found.append({
                "id": sid.decode(),
                "title": (self.lib.fa_stage_title(sid) or b"").decode(),
                "backend": self.lib.fa_stage_backend(sid).decode(),
                "precision": self.lib.fa_stage_precision(sid).decode(),
                "source_hash": self.lib.fa_stage_source_hash(sid).decode(),
                "max_dim": self.lib.fa_stage_max_dim(sid),
            })
        return found

    def workspace_bytes(self, stage_id, shape, causal):
        return self.lib.fa_workspace_bytes(stage_id.encode(), *shape, int(causal))

    def forward(self, stage_id, shape, causal, q, k, v, o, workspace, stream):
        return self.lib.fa_forward(stage_id.encode(), *shape, int(causal), q, k, v, o, workspace, stream)

    def tolerance(self, precision, max_abs_v):
        return self.lib.fa_tolerance(precision.encode(), max_abs_v)

    def last_error(self):
        return (self.lib.fa_last_error() or b"").decode()


def load_torch():
    torch = torch_gpu.load_torch(PROGRAM)
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as error:
        die(f"PyTorch {torch.__version__} lacks torch.nn.attention.sdpa_kernel (2.3 or newer needed): {error}")
    return torch, SDPBackend, sdpa_kernel


def torch_dtype(torch, precision):
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def make_inputs(torch, shape, precision, seed):
    """Uniform in [-1, 1), already in the precision the kernels see (so is the reference)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    tensors = []
    for _ in range(3):
        values = torch.rand(shape, device="cuda", dtype=torch.float32, generator=generator)
        tensors.append(values.mul_(2).sub_(1).to(torch_dtype(torch, precision)))
        del values
    return tensors


def sample_heads(shape, count):
    """The first head, the last, then the middle one: (b, h) pairs, `count` at most."""
    heads = shape[1]
    total = shape[0] * heads
    picks = list(dict.fromkeys([0, total - 1, total // 2]))[: max(1, count)]
    return [(p // heads, p % heads) for p in picks]


def sample_rows(torch, seq, limit, seed):
    if seq <= limit:
        return torch.arange(seq, device="cuda")
    edge = min(64, limit // 4)
    generator = torch.Generator(device="cuda").manual_seed(seed + 1)
    middle = torch.randperm(seq, device="cuda", generator=generator)[: limit - 2 * edge]
    ends = torch.cat([torch.arange(edge, device="cuda"), torch.arange(seq - edge, seq, device="cuda")])
    return torch.unique(torch.cat([ends, middle]))


def attention_flops(shape, causal):
    """4·B·H·N²·D, halved with causal masking (design.md)."""
    flops = 4.0 * shape[0] * shape[1] * shape[2] ** 2 * shape[3]
    return flops / 2 if causal else flops


def compare_with_reference(torch, q, k, v, out, causal, args):
    """Max abs error and relative L2 error against float64 on sampled heads and rows, and the
    count of non-finite outputs over the whole tensor (a NaN must never vanish in a max)."""
    non_finite = int((~torch.isfinite(out)).sum().item())
    seq, dim = q.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(dim)
    rows = sample_rows(torch, seq, args.check_rows, args.seed)
    chunk = max(1, (1 << 25) // seq)  # keeps one chunk of float64 scores near 256 MiB
    max_abs, diff_sq, ref_sq = 0.0, 0.0, 0.0
    for b, h in sample_heads(tuple(q.shape), args.check_heads):
        qh, kh, vh = q[b, h].double(), k[b, h].double(), v[b, h].double()
        for start in range(0, rows.numel(), chunk):
            picked = rows[start:start + chunk]
            scores = (qh[picked] @ kh.T) * scale
            if causal:  # query i sees keys 0..i
                later = torch.arange(seq, device="cuda")[None, :] > picked[:, None]
                scores.masked_fill_(later, float("-inf"))
            probabilities = torch.softmax(scores, dim=-1)
            expected = probabilities @ vh
            difference = out[b, h][picked].double() - expected
            finite = torch.isfinite(difference)
            if finite.any():
                max_abs = max(max_abs, difference[finite].abs().max().item())
            diff_sq += torch.where(finite, difference, torch.zeros_like(difference)).square().sum().item()
            ref_sq += expected.square().sum().item()
    rel_l2 = math.sqrt(diff_sq / ref_sq) if ref_sq > 0 else 0.0
    max_abs_v = max(v[b, h].abs().max().item() for b, h in sample_heads(tuple(q.shape), args.check_heads))
    return max_abs, rel_l2, non_finite, max_abs_v


def time_calls(torch, call, first_ms, args):
    """Warm-up and timed calls after the first one; the count shrinks for slow calls."""
    first_s = max(first_ms / 1e3, 1e-6)
    warmups = max(0, min(args.warmup - 1, int(0.25 * args.row_seconds / first_s)))
    reps = max(3, min(args.reps, int(args.row_seconds / first_s)))
    times = torch_gpu.event_times_ms(torch, call, warmups, reps)
    return statistics.median(times), min(times), reps


def first_call(torch, call):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    result = call()
    end.record()
    end.synchronize()
    return result, start.elapsed_time(end)


def oom_bytes(error):
    """The allocation PyTorch could not make, from its message ("Tried to allocate 32.00 GiB")."""
    match = re.search(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)", str(error))
    if not match:
        return 0
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[match.group(2)]
    return int(float(match.group(1)) * scale)


def one_line(text, limit=240):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refusal_reason(caught, error):
    """PyTorch explains why a backend refused in UserWarnings before it raises."""
    reasons = [one_line(w.message, 160) for w in caught if "No available kernel" not in str(w.message)]
    reasons = [r for r in reasons if r]
    return one_line("; ".join(reasons) if reasons else error)


class Run:
    def __init__(self, torch, library, args, gpu, out_path):
        self.torch = torch
        self.library = library
        self.args = args
        self.gpu = gpu
        self.out_path = out_path
        self.rows_written = 0
        self.failures = []
        self.skipped = []
        self.seconds_per_flop = {}  # (name, dtype) -> of its latest timed shape
        self.started = time.monotonic()

    def row(self, name, shape, precision, causal, **fields):
        batch, heads, seq, dim = shape
        row = {"stage": name.split("/")[0], "gpu": self.gpu, "B": batch, "H": heads, "N": seq, "D": dim, "dtype": precision,
               "causal": int(causal), "ms_median": "", "ms_min": "", "tflops": "", "gbps": "", "peak_bytes": "",
               "max_abs_err": "", "rel_l2_err": "", "status": "ok", "source_hash": "", "note": ""}
        row.update(fields)
        new_file = not os.path.exists(self.out_path) or os.path.getsize(self.out_path) == 0
        with open(self.out_path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_HEADER, lineterminator="\n")
            if new_file:
                writer.writeheader()
            writer.writerow(row)
        self.rows_written += 1
        timing = f"{row['ms_median']} ms" if row["ms_median"] != "" else ""
        print(f"  {name:<22} {precision:<5} {'causal' if causal else '':<6} {row['status']:<12} {timing:<16} "
              f"{row['tflops'] and str(row['tflops']) + ' TFLOP/s':<18} err {row['max_abs_err'] or '-':<10} "
              f"{row['note']}", flush=True)

    def should_skip(self, name, precision, shape, causal):
        flops = attention_flops(shape, causal)
        per_flop = self.seconds_per_flop.get((name, precision, causal))
        if per_flop is not None and per_flop * flops > self.args.max_call_seconds:
            self.skipped.append(f"{name} {precision} {shape}{' causal' if causal else ''}: about {per_flop * flops:.1f} s per call "
                                f"> --max-call-seconds {self.args.max_call_seconds}")
            print(f"  {name:<22} {precision:<5} skipped: about {per_flop * flops:.1f} s per call", flush=True)
            return True
        return False

    def measured(self, name, precision, shape, causal, call, output_of, inputs, peak_bytes, source_hash, is_ours):
        """Times `call` (the first call also feeds the check) and writes the row."""
        torch, args = self.torch, self.args
        q, k, v = inputs
        result, first_ms = first_call(torch, call)
        max_abs, rel_l2, non_finite, max_abs_v = compare_with_reference(torch, q, k, v, output_of(result), causal, args)
        del result
        flops = attention_flops(shape, causal)
        if first_ms / 1e3 > args.max_call_seconds:
            ms_median = ms_min = first_ms
            reps_note = f"1 call: it took more than --max-call-seconds {args.max_call_seconds}"
        else:
            ms_median, ms_min, reps = time_calls(torch, call, first_ms, args)
            reps_note = "" if reps == args.reps else f"{reps} timed calls"
        self.seconds_per_flop[(name, precision, causal)] = ms_median / 1e3 / flops
        tolerance = self.library.tolerance(precision, max_abs_v)
        status, notes = "ok", [reps_note] if reps_note else []
        if non_finite:
            status = "error" if is_ours else "ok"
            notes.append(f"{non_finite} non-finite outputs")
            max_abs = float("nan")
        elif max_abs > tolerance:
            if is_ours:
                status = "error"
                notes.append(f"wrong: max_abs_err {max_abs:.3e} > tolerance {tolerance:.3e}")
            else:
                notes.append(f"above our {precision} tolerance {tolerance:.3e}")
        if status == "error":
            self.failures.append(f"{name} {precision} {shape}: {'; '.join(notes)}")
        min_bytes = 4 * shape[0] * shape[1] * shape[2] * shape[3] * ELEMENT_BYTES[precision]
        self.row(name, shape, precision, causal, ms_median=f"{ms_median:.6g}", ms_min=f"{ms_min:.6g}",
                 tflops=f"{flops / (ms_median / 1e3) / 1e12:.6g}",
                 gbps=f"{min_bytes / (ms_median / 1e3) / 1e9:.6g}", peak_bytes=peak_bytes,
                 max_abs_err=f"{max_abs:.3e}", rel_l2_err=f"{rel_l2:.3e}", status=status,
                 source_hash=source_hash, note="; ".join(notes))

    def free_bytes(self):
        return self.torch.cuda.mem_get_info()[0]

    def run_stage(self, stage, shape, causal, inputs):
        torch, library = self.torch, self.library
        name, precision = stage["id"], stage["precision"]
        q, k, v = inputs
        if shape[3] > stage["max_dim"]:
            self.row(name, shape, precision, causal, status="unsupported", source_hash=stage["source_hash"],
                     note=f"D={shape[3]} exceeds the stage's maximum head dim {stage['max_dim']}")
            return
        if self.should_skip(name, precision, shape, causal):
            return
        workspace_bytes = library.workspace_bytes(name, shape, causal)
        if workspace_bytes < 0:
            self.row(name, shape, precision, causal, status="unsupported", source_hash=stage["source_hash"],
                     note=one_line(library.last_error()))
            return
        io_bytes = 4 * q.numel() * q.element_size()
        try:
            out = torch.empty_like(q)
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device="cuda") if workspace_bytes else None
        except torch.cuda.OutOfMemoryError:
            out = workspace = None
            torch.cuda.empty_cache()
            self.row(name, shape, precision, causal, status="oom", peak_bytes=io_bytes + workspace_bytes,
                     source_hash=stage["source_hash"], note=f"{self.free_bytes()} bytes free")
            return
        out.fill_(float("nan"))  # poison: an element the stage never writes fails the check
        stream = torch.cuda.current_stream().cuda_stream
        workspace_ptr = workspace.data_ptr() if workspace is not None else None

        def call():
            code = library.forward(name, shape, causal, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                   workspace_ptr, stream)
            if code != 0:
                raise StageError(code, library.last_error())
            return out

        try:
            self.measured(name, precision, shape, causal, call, lambda result: result, inputs, io_bytes + workspace_bytes,
                          stage["source_hash"], is_ours=True)
        except StageError as error:
            status = "unsupported" if error.code in (FA_INVALID_SHAPE, FA_UNSUPPORTED) else "error"
            self.row(name, shape, precision, causal, status=status, source_hash=stage["source_hash"],
                     note=one_line(f"{FA_STATUS.get(error.code, error.code)}: {error.message}"))
            if status == "error":
                self.failures.append(f"{name} {precision} {shape}: {error.message}")
                self.require_healthy_context()
        except RuntimeError as error:  # a fault inside the kernel surfaces at the next synchronize
            self.row(name, shape, precision, causal, status="error", source_hash=stage["source_hash"],
                     note=one_line(error))
            self.failures.append(f"{name} {precision} {shape}: {one_line(error)}")
            self.require_healthy_context()

    def run_peer(self, peer, shape, causal, inputs, precision):
        torch = self.torch
        q, k, v = inputs
        if self.should_skip(peer, precision, shape, causal):
            return
        backend = getattr(self.sdp_backend, PEERS[peer])
        input_bytes = 3 * q.numel() * q.element_size()

        def call():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        with self.sdpa_kernel(backend):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    out = call()
                    torch.cuda.synchronize()
                except torch.cuda.OutOfMemoryError as error:
                    torch.cuda.empty_cache()
                    self.row(peer, shape, precision, causal, status="oom", peak_bytes=input_bytes + oom_bytes(error),
                             note=f"{self.free_bytes()} bytes free")
                    return
                except RuntimeError as error:
                    self.row(peer, shape, precision, causal, status="unsupported", note=refusal_reason(caught, error))
                    self.require_healthy_context()
                    return
            peak = torch.cuda.max_memory_allocated() - base + input_bytes
            del out
            try:
                self.measured(peer, precision, shape, causal, call, lambda result: result, inputs, peak, "", is_ours=False)
            except torch.cuda.OutOfMemoryError as error:
                torch.cuda.empty_cache()
                self.row(peer, shape, precision, causal, status="oom", peak_bytes=input_bytes + oom_bytes(error),
                         note=f"{self.free_bytes()} bytes free")
            except RuntimeError as error:
                self.row(peer, shape, precision, causal, status="error", note=one_line(error))
                self.require_healthy_context()

    def require_healthy_context(self):
        """After a kernel fault the CUDA context is lost for everyone in this process."""
        try:
            self.torch.cuda.synchronize()
        except RuntimeError as error:
            print(f"compare_torch: the CUDA context is broken ({one_line(error)}); stopping", file=sys.stderr)
            self.report()
            sys.exit(1)

    def over_budget(self):
        return time.monotonic() - self.started > self.args.max_seconds

    def report(self):
        print(f"\n{self.rows_written} rows appended to {self.out_path} in {time.monotonic() - self.started:.0f} s")
        if self.skipped:
            print(f"skipped (no row written) — {len(self.skipped)}:")
            for line in self.skipped:
                print(f"  {line}")
        if self.failures:
            print(f"FAILED — {len(self.failures)} of our rows:")
            for line in self.failures:
                print(f"  {line}")


class StageError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def choose_stages(all_stages, text):
    gpu_stages = [s for s in all_stages if s["backend"] == "cuda"]
    if text == "all":
        return gpu_stages
    if text == "none":
        return []
    chosen = []
    for item in text.split(","):
        item = item.strip()
        # a stage number or folder name picks every descriptor of that stage (fp16 and bf16)
        matches = [s for s in all_stages if s["id"] == item or s["id"].split("/")[0] == item
                   or s["id"].split("_")[0] == item.zfill(2)]
        if not matches:
            die(f"no stage '{item}' in the library (it has: {', '.join(s['id'] for s in all_stages)})")
        if matches[0]["backend"] != "cuda":
            die(f"{matches[0]['id']} runs on the CPU: this script compares GPU stages")
        chosen.extend(matches)
    return chosen


def default_out(gpu):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(root, "plots", "data", gpu.replace(" ", "_"), "torch.csv")


def check_existing_header(path):
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, newline="") as handle:
            header = next(csv.reader(handle), [])
        if [h.strip() for h in header] != CSV_HEADER:
            die(f"{path} has a different header; expected: {','.join(CSV_HEADER)}")


def main():
    args = parse_args()
    library = StageLibrary(args.lib)
    all_stages = library.stages()
    if not all_stages:
        die(f"{args.lib} holds no stages")
    if args.list:
        for s in all_stages:
            print(f"{s['id']:<22} {s['backend']:<5} {s['precision']:<5} max D {s['max_dim']:<4} "
                  f"{s['source_hash']}  {s['title']}")
        return 0
    stages = choose_stages(all_stages, args.stages)
    peers = [] if args.peers == "none" else [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers:
        if peer not in PEERS:
            die(f"unknown peer '{peer}' (choose from {', '.join(PEERS)})")
    precisions = sorted({s["precision"] for s in stages}) or ["fp16"]
    if args.dtype:
        precisions = [p.strip() for p in args.dtype.split(",")]
        for p in precisions:
            if p not in ELEMENT_BYTES:
                die(f"unknown dtype '{p}' (choose from {', '.join(ELEMENT_BYTES)})")

    torch, sdp_backend, sdpa_kernel = load_torch()
    torch_gpu.disable_tf32(torch, PROGRAM)
    gpu = torch.cuda.get_device_name(0)
    out_path = args.out or default_out(gpu)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    check_existing_header(out_path)
    print(f"{gpu}; PyTorch {torch.__version__} (CUDA {torch.version.cuda}); stages: "
          f"{', '.join(s['id'] for s in stages) or 'none'}; peers: {', '.join(peers) or 'none'}; "
          f"dtypes: {', '.join(precisions)}")

    run = Run(torch, library, args, gpu, out_path)
    run.sdp_backend, run.sdpa_kernel = sdp_backend, sdpa_kernel
    pending = [(shape, p) for shape in args.shape_list for p in precisions]
    for index, (shape, precision) in enumerate(pending):
        if run.over_budget():
            for left_shape, left_precision in pending[index:]:
                run.skipped.append(f"{left_shape} {left_precision}: past --max-seconds {args.max_seconds}")
            break
        ours = [s for s in stages if s["precision"] == precision]
        if not ours and not peers:
            continue
        print(f"B={shape[0]} H={shape[1]} N={shape[2]} D={shape[3]} {precision}", flush=True)
        torch.cuda.empty_cache()
        try:
            inputs = make_inputs(torch, shape, precision, args.seed)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            run.skipped.append(f"{shape} {precision}: the inputs alone do not fit in device memory")
            continue
        for causal in args.causal_modes:
            for stage in ours:
                run.run_stage(stage, shape, causal, inputs)
            for peer in peers:
                run.run_peer(peer, shape, causal, inputs, precision)
        del inputs
    run.report()
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
