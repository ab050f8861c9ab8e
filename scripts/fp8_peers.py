#!/usr/bin/env python3
"""Stage 14 (FP8 attention) beside its peers, on the same tensors in one process: the FP16 stage it
must beat (stage 10), PyTorch's cuDNN attention in FP16, and cuDNN's own FP8 attention.

Measured at each shape (the forward pass; one results row each, DESIGN.md's schema):

  14_fp8/quantize    fa_course.fp8.quantize(q, k, v): the quantization pass alone (block scales, the
                     rotation, e4m3), its cost; tflops 0 (no attention FLOPs), gbps = FP16 in + e4m3 out
  14_fp8/attention   fa_course.fp8.attention_quantized on that pass's output: the attention alone
  14_fp8             fa_course.fp8.attention(q, k, v): both, 16-bit in and out (what a caller pays)
  10_overlap         stage 10 through the C ABI in FP16 and in BF16 (the torch runner's call and check)
  torch_cudnn        PyTorch's scaled_dot_product_attention with the cuDNN backend forced, FP16
  cudnn_fp8          cuDNN's FP8 attention through the cuDNN frontend's Python API (graph.sdpa_fp8): Q, K,
                     V quantized here to e4m3 with one scale per tensor (448 / amax; the descales are
                     amax / 448), P with scale 448, O in FP16 where cuDNN builds it, else in e4m3 with
                     scale 448 / max|V| (O is a convex combination of V's rows); the call timed is the
                     graph's execution alone, beside 14_fp8/attention (the note says which O)

Shapes (default): the standard sweep from N = 4096 at D = 128 (4x16x4096x128, 2x16x8192x128,
1x16x16384x128) and the large-head shapes (2x64x4096x128, 4x64x8192x128), each non-causal and causal;
4x16x4096x64 and 4x16x4096x256 non-causal. --shapes and --causal replace that plan.

The inputs are the torch runner's (uniform in [-1, 1), seed --seed), made once per shape in FP32 and
rounded to FP16, and to BF16 for stage 10's BF16 row: every row of a shape sees the same values.
Every output is compared with attention in float64 on those 16-bit inputs (the FP8 rows' error so
includes their quantization, as stage 14's accuracy table counts it): on --check-heads heads (the
first, the last, then the middle one) and --check-rows query rows per head (64 at each end, the rest
drawn at random), fa_course.bench.torch_runner.compare_with_reference: the largest absolute error
(max_abs_err) and the relative L2 error (rel_l2_err) over those rows. Stage 14 is judged by its own
contract (stages/14_fp8/fp8_tolerance.hpp: every element within 2·2^-4·max|V|, its log-sum-exp
within 2^-4; the L2 error within 2·2^-4 of O's here, where the tests and bin/14_fp8 take P·|V|'s,
which is larger: on these shapes O's norm does not vanish), stage 10 by the library's FP16/BF16
tolerance; a peer's row notes an error above those but is never `error`.

Times: CUDA events around each call with the GPU rested first and a spin kernel ahead of the call
(fa_course.bench.torch_gpu.event_times_ms, through the torch runner's time_row: warm-up calls, then
the median and minimum of up to --reps timed calls; the L2 cache flushed before each where the inputs
fit in it). Rows are merged into --out as they come (a row replaces the one with its key); the data
set's file is plots/data/<gpu>/fp8.csv, merged there like the other kinds:

  python3 scripts/fp8_peers.py --lib build-gpu/lib/libfa_capi.so --out OUTDIR/data/fp8.csv
  python3 -m fa_course.bench.data merge OUTDIR/data plots/data/NVIDIA_H200     # PYTHONPATH=python

Stage 14's rows carry the library's source_hash for 14_fp8 when the library lists it, else the one
scripts/source_hash.py computes for this tree (the library built from it). Exit status: 0 when every
row was written; 1 when one of our stages gave a wrong answer or failed; 2 when PyTorch, a GPU, the
cuDNN frontend, the library or fa_course.fp8 is missing (one line saying which), or the command line
is bad. --rows leaves rows out (then what they need is not asked for).

The cuDNN frontend is not part of the GPU machine's image, which is offline: its wheel travels with
the working tree in the git-ignored .whl/ folder (nvidia-cudnn-frontend 1.32.0 for CPython 3.12,
11.6 MB; it imports there with --no-deps, cuDNN 9.19 behind it, without its optional CuTe DSL
engines). Here, where pip reaches PyPI:

  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \\
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl nvidia-cudnn-frontend==1.32.0

and on the GPU machine, first in the command (with .whl carried along):

  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
      .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/python
"""

import argparse
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

from fa_course.bench import results, shapes  # noqa: E402

PROGRAM = "fp8_peers"

ROWS = ["14_fp8/quantize", "14_fp8/attention", "14_fp8", "10_overlap", "10_overlap/bf16", "torch_cudnn", "cudnn_fp8"]
STAGE14_ROWS = {"14_fp8/quantize", "14_fp8/attention", "14_fp8"}
PLAN = [("4x16x4096x128", (False, True)), ("2x16x8192x128", (False, True)), ("1x16x16384x128", (False, True)),
        ("2x64x4096x128", (False, True)), ("4x64x8192x128", (False, True)),
        ("4x16x4096x64", (False,)), ("4x16x4096x256", (False,))]

# Stage 14's accuracy contract (stages/14_fp8/fp8_tolerance.hpp), against the reference on the 16-bit inputs.
E4M3_UNIT = 2.0**-4
FP8_REL_L2 = 2 * E4M3_UNIT
FP8_LSE = E4M3_UNIT
E4M3_MAX = 448.0


def die(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    sys.exit(2)


def one_line(text, limit=240):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results CSV to merge the rows into (OUTDIR/data/fp8.csv)")
    parser.add_argument("--lib", help="the C ABI library (default: $FA_CAPI_LIB, else the one installed with the "
                                      "package); fa_course.fp8 is pointed at it too")
    parser.add_argument("--shapes", nargs="+", help="presets or BxHxNxD / BxHqxHkvxNqxNkxD instead of the plan")
    parser.add_argument("--causal", choices=["off", "on", "both"],
                        help="causal masking for every shape (default: the plan's: both at D = 128, off otherwise)")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows to run (default: %(default)s)")
    parser.add_argument("--no-rotate", action="store_true", help="stage 14 without the Hadamard rotation (its "
                                                                 "rows say so in their note)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up calls (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=20, help="timed calls, at most (default: %(default)s)")
    parser.add_argument("--check-heads", type=int, default=2, help="heads compared with float64 (default: "
                                                                   "%(default)s)")
    parser.add_argument("--check-rows", type=int, default=1024, help="query rows per checked head (default: "
                                                                     "%(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        die(f"--rows: no row {', '.join(unknown)} (these are: {', '.join(ROWS)})")
    if args.warmup < 1 or args.reps < 1:
        die("--warmup and --reps must be at least 1")
    try:
        if args.shapes:
            modes = {"off": (False,), "on": (True,), "both": (False, True), None: (False,)}[args.causal]
            args.problems = [p.with_causal(c) for p in shapes.parse_shapes(args.shapes) for c in modes]
        else:
            modes = {"off": (False,), "on": (True,), "both": (False, True)}.get(args.causal)
            args.problems = [p.with_causal(c) for spec, plan in PLAN for p in shapes.parse_shapes(spec)
                             for c in (modes or plan)]
    except ValueError as error:
        die(str(error))
    return args


# ---- what the run needs, each refused in one line --------------------------------------------------


def load_requirements(args):
    """(torch, cudnn or None, library, fp8 module or None); exits 2 naming the first thing missing."""
    from fa_course.bench import torch_gpu

    try:
        torch = torch_gpu.load_torch()
    except torch_gpu.TorchUnavailable as error:
        die(error)
    cudnn = None
    if "cudnn_fp8" in args.rows:
        try:
            import cudnn
        except Exception as error:  # ImportError, or an OSError from the backend library it loads
            die(f"the cuDNN frontend's Python package is needed for cudnn_fp8 ({one_line(error, 160)}); carry its "
                f"wheel in .whl/ (this script's docstring), or leave the row out with --rows")
    if args.lib:
        os.environ["FA_CAPI_LIB"] = os.path.abspath(args.lib)
    from fa_course import capi

    try:
        library = capi.Library(args.lib)
    except capi.LibraryNotFoundError as error:
        die(one_line(error))
    fp8 = None
    if STAGE14_ROWS & set(args.rows):
        try:
            from fa_course import fp8
        except ImportError as error:
            die(f"fa_course.fp8 is needed for stage 14's rows ({one_line(error, 160)})")
    return torch, cudnn, library, fp8


def stage14_hash(library):
    """The library's source_hash of 14_fp8 where it lists the stage, else this tree's (scripts/source_hash.py)."""
    from fa_course import capi
    from fa_course.bench import source_hash

    try:
        return library.stage("14_fp8").source_hash
    except capi.FaError:
        pass
    try:
        return source_hash.stage_hash("14_fp8", REPO)
    except (OSError, FileNotFoundError):
        return ""


# ---- cuDNN's FP8 attention ---------------------------------------------------------------------------


def per_tensor_e4m3(torch, x):
    """x in e4m3 with one scale (448 / amax), and its descale amax / 448 as a (1, 1, 1, 1) FP32 tensor."""
    amax = x.abs().amax().float().clamp_min(1e-12)
    quantized = (x.float() * (E4M3_MAX / amax)).to(torch.float8_e4m3fn)
    return quantized, (amax / E4M3_MAX).reshape(1, 1, 1, 1)


class Refused(Exception):
    """A peer that does not take the problem (its row is `unsupported`, with the reason)."""


class CudnnFp8:
    """graph.sdpa_fp8 of the cuDNN frontend on one problem: built once, then `call()` executes it on the
    current stream and returns O (FP16, or e4m3 that `dequantized()` turns into FP32)."""

    def __init__(self, torch, cudnn, handle, problem, q, k, v):
        self.torch, self.cudnn, self.handle, self.problem = torch, cudnn, handle, problem
        (self.q, self.dq), (self.k, self.dk), (self.v, self.dv) = (per_tensor_e4m3(torch, x) for x in (q, k, v))
        amax_v = self.dv * E4M3_MAX
        self.scale_o_fp8 = E4M3_MAX / amax_v
        refusals = []
        types = cudnn.data_type
        for o_type in (types.HALF, types.FP8_E4M3):
            for declare_amax_s in (False, True):
                try:
                    self._build(o_type, declare_amax_s)
                    self.refusals = refusals
                    return
                except Exception as error:  # cudnnGraphNotSupportedError, RuntimeError, TypeError, ValueError
                    refusals.append(f"O {'FP16' if o_type == types.HALF else 'e4m3'}"
                                    f"{', Amax_S declared' if declare_amax_s else ''}: {one_line(error, 200)}")
        raise Refused("cuDNN built no FP8 attention graph: " + " | ".join(refusals))

    def _build(self, o_type, declare_amax_s):
        torch, cudnn, problem = self.torch, self.cudnn, self.problem
        e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32,
                              handle=self.handle)
        inputs = {name: graph.tensor(name=name, dim=list(x.shape), stride=list(x.stride()), data_type=e4m3)
                  for name, x in (("q", self.q), ("k", self.k), ("v", self.v))}
        scalar = dict(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32)
        scales = {name: graph.tensor(name=name, **scalar)
                  for name in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")}
        kwargs = dict(attn_scale=1.0 / math.sqrt(problem.dim), use_causal_mask=problem.causal, name="sdpa_fp8")
        try:
            o, _, amax_s, amax_o = graph.sdpa_fp8(**inputs, **scales, generate_stats=False, **kwargs)
        except TypeError:  # a frontend from before generate_stats
            o, _, amax_s, amax_o = graph.sdpa_fp8(**inputs, **scales, is_inference=True, **kwargs)
        fp16_out = o_type == cudnn.data_type.HALF
        self.out = torch.empty(problem.q_shape, device="cuda", dtype=torch.float16 if fp16_out else torch.float8_e4m3fn)
        o.set_output(True).set_dim(list(self.out.shape)).set_stride(list(self.out.stride())).set_data_type(o_type)
        self.amax_o = torch.empty((1, 1, 1, 1), device="cuda", dtype=torch.float32)
        amax_o.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
        pack = {inputs["q"]: self.q, inputs["k"]: self.k, inputs["v"]: self.v, o: self.out, amax_o: self.amax_o}
        if declare_amax_s:
            self.amax_s = torch.empty((1, 1, 1, 1), device="cuda", dtype=torch.float32)
            amax_s.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
            pack[amax_s] = self.amax_s
        scale_o = torch.ones_like(self.dq) if fp16_out else self.scale_o_fp8
        values = {"descale_q": self.dq, "descale_k": self.dk, "descale_v": self.dv,
                  "descale_s": torch.full_like(self.dq, 1.0 / E4M3_MAX), "scale_s": torch.full_like(self.dq, E4M3_MAX),
                  "scale_o": scale_o}
        pack.update({scales[name]: value.contiguous() for name, value in values.items()})
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        self.workspace = torch.empty(max(1, graph.get_workspace_size()), device="cuda", dtype=torch.uint8)
        self.graph, self.pack, self.fp16_out = graph, pack, fp16_out
        self.descale_o = None if fp16_out else 1.0 / self.scale_o_fp8

    def call(self):
        self.graph.execute(self.pack, self.workspace, handle=self.handle)
        return self.out

    def checked_call(self):
        """O as the check reads it: FP16, or e4m3 times its descale in FP32."""
        out = self.call()
        return out if self.fp16_out else out.float() * self.descale_o

    @property
    def output_note(self):
        return "O FP16" if self.fp16_out else "O e4m3 (scale 448/max|V|; Hopper's cuDNN writes FP8 O)"

    @property
    def io_bytes(self):
        return self.q.numel() + self.k.numel() + self.v.numel() + self.out.numel() * self.out.element_size()


# ---- the run ---------------------------------------------------------------------------------------


class Fp8Peers:
    def __init__(self, args, torch, cudnn, library, fp8):
        from fa_course.bench import torch_runner

        self.args, self.torch, self.cudnn, self.library, self.fp8 = args, torch, cudnn, library, fp8
        self.tr = torch_runner
        config = torch_runner.RunConfig(warmup=args.warmup, reps=args.reps, check_heads=args.check_heads,
                                        check_rows=args.check_rows, seed=args.seed, max_seconds=1e9)
        self.runner = torch_runner.TorchRunner(library, config, sink=self.write)
        self.gpu = self.runner.gpu
        self.failures = self.runner.failures
        self.rows_written = 0
        self.hash14 = stage14_hash(library) if STAGE14_ROWS & set(args.rows) else ""
        self.rotate = not args.no_rotate
        self.handle = None
        if cudnn is not None:
            self.handle = cudnn.create_handle()
            cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        self.stage10 = {}
        if {"10_overlap", "10_overlap/bf16"} & set(args.rows):
            from fa_course import capi

            try:
                for stage in library.select("10_overlap"):
                    self.stage10["10_overlap" if stage.precision == "fp16" else "10_overlap/bf16"] = stage
            except capi.FaError:  # no stage 10 in this library: its rows say so
                pass

    def write(self, row):
        results.merge_results(self.args.out, [row])
        self.rows_written += 1

    def row(self, name, problem, status="ok", note="", dtype="fp16", **fields):
        """One row of ours (14_fp8...) or of cudnn_fp8, dtype fp16: the precision of the tensors they are
        quantized from (so a shape's rows share a key but for the stage)."""
        row = results.make_row(stage=name, gpu=self.gpu, dtype=dtype, status=status, note=note,
                               source_hash=self.hash14 if name.startswith("14_fp8") else "",
                               **{"pass": "fwd"}, **problem.row_fields())
        row.update(fields)
        self.write(row)
        print(f"  {name:<24} {dtype:<5} {'causal' if problem.causal else '':<6} {status:<12} "
              f"{str(row.get('ms_median') or '') + ' ms':<16} {str(row.get('tflops') or '') + ' TFLOP/s':<18} "
              f"err {row.get('max_abs_err') or '-':<10} {note}", flush=True)

    def timed(self, name, problem, call, checked_call, io_bytes, flops, check_inputs, judge):
        """(status, notes, fields) of a row: the first call is `checked_call` (it returns O or (O, LSE), compared
        with the reference; `judge(check)` gives the reasons the row is wrong, [] when right) or, when None,
        `call` unchecked; then `call` timed."""
        torch, config = self.torch, self.runner.config
        result, first_ms = self.tr.first_call(torch, checked_call or call)
        notes, wrong = [], []
        check = None
        if checked_call is not None:
            out, lse = result if isinstance(result, tuple) else (result, None)
            q, k, v = check_inputs
            check = self.tr.compare_with_reference(torch, problem, q, k, v, out, lse, config.check_heads,
                                                   config.check_rows, config.seed)
            del out, lse
            wrong = judge(check)
        del result
        ms_median, ms_min, timing_notes = self.runner.time_row(name, "fp16", problem, "fwd", call, first_ms)
        ours = name.startswith("14_fp8")
        status = "ok"
        if wrong and ours:
            status = "error"
            notes.append("wrong: " + "; ".join(wrong))
            self.failures.append(f"{name} {problem.describe()}: {'; '.join(wrong)}")
        else:
            notes += wrong
        if check is not None and check.lse_max_abs is not None and not wrong:
            notes.append(f"LSE max abs err {check.lse_max_abs:.1e}")
        fields = dict(ms_median=f"{ms_median:.6g}", ms_min=f"{ms_min:.6g}",
                      tflops=f"{flops / (ms_median / 1e3) / 1e12:.6g}" if flops else "0",
                      gbps=f"{io_bytes / (ms_median / 1e3) / 1e9:.6g}")
        if check is not None:
            max_abs = float("nan") if check.non_finite else check.max_abs
            fields.update(max_abs_err=f"{max_abs:.3e}", rel_l2_err=f"{check.rel_l2:.3e}")
        return status, notes + timing_notes, fields

    def guarded(self, name, problem, measure):
        """Runs `measure()` -> (status, notes, fields) and writes its row; an out-of-memory error, a refusal
        or a fault becomes the row instead."""
        torch = self.torch
        try:
            status, notes, fields = measure()
        except torch.cuda.OutOfMemoryError as error:
            self.tr.release_cached_memory(torch)
            self.row(name, problem, "oom", f"{torch.cuda.mem_get_info()[0]} bytes free; {one_line(error, 120)}")
            return
        except Exception as error:  # a refusal (Refused, the fp8 API's ValueError or FaError), or a fault
            refused = isinstance(error, (Refused, ValueError, TypeError, NotImplementedError)) or (
                getattr(error, "refused", False) is True)
            status = "unsupported" if refused else "error"
            self.row(name, problem, status, one_line(f"{type(error).__name__}: {error}"))
            if status == "error" and name.startswith("14_fp8"):
                self.failures.append(f"{name} {problem.describe()}: {one_line(error)}")
            self.runner.require_healthy_context()
            return
        self.row(name, problem, status, "; ".join(notes), **fields)

    # -- stage 14
    def fp8_judge(self, check):
        wrong = []
        if check.non_finite:
            wrong.append(f"{check.non_finite} non-finite outputs")
        elif check.max_abs > 2 * E4M3_UNIT * check.max_abs_v:
            wrong.append(f"max_abs_err {check.max_abs:.3e} > 2·2^-4·max|V| = {2 * E4M3_UNIT * check.max_abs_v:.3e}")
        if check.rel_l2 > FP8_REL_L2:
            wrong.append(f"rel_l2_err {check.rel_l2:.3e} > {FP8_REL_L2:g}")
        if check.lse_max_abs is not None and (check.lse_mismatched or check.lse_max_abs > FP8_LSE):
            wrong.append(f"LSE max abs err {check.lse_max_abs:.3e} > {FP8_LSE:g} ({check.lse_mismatched} rows not "
                         f"finite where expected, or the reverse)")
        return wrong

    def run_stage14(self, problem, inputs):
        fp8, torch = self.fp8, self.torch
        q, k, v = inputs
        causal, rotate = problem.causal, self.rotate
        suffix = "" if rotate else "; no rotation"
        elements = q.numel() + k.numel() + v.numel()
        flops = problem.flops()
        if "14_fp8/quantize" in self.args.rows:
            self.guarded("14_fp8/quantize", problem, lambda: self._noted(self.timed(
                "14_fp8/quantize", problem, lambda: fp8.quantize(q, k, v, rotate=rotate), None,
                io_bytes=3 * elements, flops=0, check_inputs=inputs, judge=lambda c: []),
                "quantize alone (no attention FLOPs: tflops 0; gbps: FP16 Q, K, V read, e4m3 written)" + suffix))
        if "14_fp8/attention" in self.args.rows:
            def attention_alone():
                quantized = fp8.quantize(q, k, v, rotate=rotate)
                torch.cuda.synchronize()
                return self._noted(self.timed(
                    "14_fp8/attention", problem,
                    lambda: fp8.attention_quantized(quantized, causal=causal, out_dtype=q.dtype),
                    lambda: fp8.attention_quantized(quantized, causal=causal, out_dtype=q.dtype, return_lse=True),
                    io_bytes=elements + 2 * q.numel(), flops=flops, check_inputs=inputs, judge=self.fp8_judge),
                    "attention alone, on the quantized tensors (e4m3 in, FP16 O)" + suffix)
            self.guarded("14_fp8/attention", problem, attention_alone)
        if "14_fp8" in self.args.rows:
            self.guarded("14_fp8", problem, lambda: self._noted(self.timed(
                "14_fp8", problem, lambda: fp8.attention(q, k, v, causal=causal, rotate=rotate),
                lambda: fp8.attention(q, k, v, causal=causal, rotate=rotate, return_lse=True),
                io_bytes=problem.minimum_bytes("fp16"), flops=flops, check_inputs=inputs, judge=self.fp8_judge),
                "quantize+attention (FP16 in and out)" + suffix))

    @staticmethod
    def _noted(measured, note):
        status, notes, fields = measured
        return status, [note] + notes, fields

    # -- cuDNN FP8
    def run_cudnn_fp8(self, problem, inputs):
        if problem.causal and problem.rectangular:
            self.row("cudnn_fp8", problem, "unsupported", "bottom-right causal masks are not wired here (square "
                                                          "shapes only)")
            return
        q, k, v = inputs

        def measure():
            peer = CudnnFp8(self.torch, self.cudnn, self.handle, problem, q, k, v)

            def judge(check):
                tolerance = 2 * E4M3_UNIT * check.max_abs_v
                return [f"above stage 14's max error {tolerance:.3e}"] if check.max_abs > tolerance else []

            status, notes, fields = self.timed(
                "cudnn_fp8", problem, peer.call, peer.checked_call,
                io_bytes=peer.io_bytes, flops=problem.flops(), check_inputs=inputs, judge=judge)
            return status, [f"e4m3 Q, K, V per-tensor scales, P scale 448, {peer.output_note}; graph execution "
                            f"alone"] + notes, fields

        self.guarded("cudnn_fp8", problem, measure)

    # -- the shape
    def run_shape(self, problem):
        torch, tr = self.torch, self.tr
        print(problem.describe(), flush=True)
        tr.release_cached_memory(torch)
        rows = self.args.rows
        try:
            inputs16 = tr.make_inputs(torch, problem, "fp16", self.args.seed)
        except torch.cuda.OutOfMemoryError:
            tr.release_cached_memory(torch)
            for name in rows:
                stage, dtype = ("10_overlap", "bf16") if name == "10_overlap/bf16" else (name, "fp16")
                self.row(stage, problem, "oom", f"{torch.cuda.mem_get_info()[0]} bytes free: no inputs", dtype)
            return
        if STAGE14_ROWS & set(rows):
            self.run_stage14(problem, inputs16)
        if "10_overlap" in rows:
            self.run_stage10("10_overlap", problem, inputs16)
        if "10_overlap/bf16" in rows:
            inputs_bf16 = tr.make_inputs(torch, problem, "bf16", self.args.seed)
            self.run_stage10("10_overlap/bf16", problem, inputs_bf16)
            del inputs_bf16
        if "torch_cudnn" in rows:
            self.runner.run_peer("torch_cudnn", problem, inputs16, "fp16")
        if "cudnn_fp8" in rows:
            self.run_cudnn_fp8(problem, inputs16)
        del inputs16

    def run_stage10(self, name, problem, inputs):
        stage = self.stage10.get(name)
        if stage is None:
            self.row("10_overlap", problem, "unsupported", f"{self.library.path} has no {name}",
                     "bf16" if name.endswith("/bf16") else "fp16")
            return
        self.runner.run_stage(stage, problem, inputs)


def main(argv=None):
    args = parse_args(argv)
    torch, cudnn, library, fp8 = load_requirements(args)
    from fa_course.bench import torch_runner

    if os.path.exists(args.out) and os.path.getsize(args.out) > 0:
        try:  # a file of another kind, or with a key twice, is refused before anything runs
            results.read_results(args.out)
        except (results.SchemaError, ValueError) as error:
            die(f"cannot merge into {args.out}: {error}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    try:
        run = Fp8Peers(args, torch, cudnn, library, fp8)
    except torch_runner.TorchUnavailable as error:
        die(error)
    try:
        backend = cudnn.backend_version_string() if cudnn else "-"
    except Exception:  # an attribute, not a function, in some version
        backend = getattr(cudnn, "backend_version_string", "-")
    print(f"{run.gpu}; PyTorch {torch.__version__} (CUDA {torch.version.cuda}); cuDNN frontend "
          f"{getattr(cudnn, '__version__', 'not loaded')} (cuDNN {backend}); {library.path}; rows: "
          f"{', '.join(args.rows)}; {len(args.problems)} problems", flush=True)
    try:
        for problem in args.problems:
            run.run_shape(problem)
    except torch_runner.ContextLost as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return 1
    print(f"{run.rows_written} rows merged into {args.out}")
    for failure in run.failures:
        print(f"  wrong or failed: {failure}")
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
