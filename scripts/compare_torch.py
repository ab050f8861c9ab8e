#!/usr/bin/env python3
"""Our stages beside PyTorch's scaled_dot_product_attention, on the same tensors, in one table.

The command line over fa_course.bench.torch_runner (python/fa_course/bench/torch_runner.py says what is run and
checked): each chosen GPU stage through the C ABI on PyTorch tensors of its precision, and PyTorch's
SDPA with each backend forced (torch_flash, torch_efficient, torch_cudnn, torch_math; torch_default
on request), all compared with a float64 reference and timed with CUDA events. Rows (DESIGN.md's
results schema) are merged into --out: a row replaces the one with the same key (stage, gpu, shape,
dtype, causal, pass); a file with the older B,H,N,D header is rewritten in the current one.

Shapes: presets (seed001, seed001-d64, sweep-head-dims, seed004, sweep-d64, sweep-d128, small, gqa,
mqa, decode, decode-sweep, small-general), BxHxNxD, or BxHqxHkvxNqxNkxD; --kv-heads and --seq-k override Hkv and Nk of every
shape. --causal on|both adds causal masking (bottom-right aligned: is_causal=True for Nq = Nk,
causal_lower_right otherwise). A stage that does not take a shape gets an `unsupported` row with the
library's reason.

--pass bwd measures the backward pass alone instead (fa_course/bench/torch_runner.py, "the backward pass
alone", says exactly what is timed on each side): our stages with a backward pass (11_backward)
through fa_backward_v2 after one untimed forward pass, PyTorch's backends through
torch.autograd.grad on the graph of one SDPA call; rows with pass = bwd, FLOPs 2.5x the forward's,
gradients compared with a float64 backward on sampled (batch, K/V head) groups. --pass fwd+bwd times
both passes in one call, as a training step runs them (ours: the stage's forward then its backward;
PyTorch's: one SDPA call and torch.autograd.grad on its graph); FLOPs 3.5x the forward's.

--timing graph times every call, ours and PyTorch's, as replays of one call captured in a CUDA graph
(the way serving engines run a decoding step) instead of plain calls from the host; the rows say
"CUDA graph replay" in their note and go to plots/data/<gpu>/torch_graph.csv by default, beside the
plain rows of torch.csv. Either way the L2 cache is flushed before each timed call where the inputs
fit in it (--flush-l2 auto), and a spin kernel holds the GPU while the host submits the call
(fa_course.bench.torch_gpu.GpuHold), so that the events time GPU work alone, never the host's Python,
ctypes or dispatch time (tens of microseconds: most of a decoding call, and a few percent of a
millisecond kernel when the GPU waits for it).

Guards keep a phase inside a few minutes: a stage or backend whose calls would take longer than
--max-call-seconds at a shape is skipped for that shape and larger ones (no row), and past
--max-seconds the run stops; what was skipped is printed.

Exit status: 0 when every row was written; 1 when one of our stages gave a wrong answer or a CUDA
error; 2 when PyTorch, a GPU or the library is missing or the command line is bad.

  python3 scripts/compare_torch.py --lib build/lib/libfa_capi.so --shapes seed001 --out torch.csv
  python3 scripts/compare_torch.py --shapes decode gqa --stages 08 --peers torch_flash,torch_default
  python3 scripts/compare_torch.py --shapes decode-sweep --stages 12 --dtype fp16,bf16 --timing graph \
      --peers torch_flash,torch_efficient,torch_cudnn,torch_default
  python3 scripts/compare_torch.py --pass bwd --shapes 4x16x4096x128 --stages 11 --dtype fp16,bf16 \
      --peers torch_flash,torch_cudnn,torch_efficient
"""

import argparse
import dataclasses
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

from fa_course import capi  # noqa: E402
from fa_course.bench import results, shapes  # noqa: E402
from fa_course.bench.schema import ELEMENT_BYTES  # noqa: E402

PROGRAM = "compare_torch"


def die(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv=None):
    from fa_course.bench.torch_runner import DEFAULT_PEERS, PEERS, TIMINGS, RunConfig  # no torch import at module level

    defaults = RunConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="the C ABI library (default: $FA_CAPI_LIB, else the one installed with "
                                      "the package)")
    parser.add_argument("--out", help="results CSV to merge rows into (default: plots/data/<gpu>/torch.csv)")
    parser.add_argument("--shapes", nargs="+", default=["small"],
                        help=f"presets ({', '.join(shapes.PRESETS)}), BxHxNxD or BxHqxHkvxNqxNkxD, separated by "
                             "spaces or commas (default: small)")
    parser.add_argument("--kv-heads", type=int, help="use this many key/value heads (Hkv) in every shape")
    parser.add_argument("--seq-k", type=int, help="use this many keys (Nk) in every shape")
    parser.add_argument("--stages", default="all",
                        help="comma-separated stage ids or numbers (04,05_float4); 'all' = every GPU stage (with "
                             "--pass bwd or fwd+bwd: every one with a backward pass); 'none' = PyTorch only (default: "
                             "%(default)s)")
    parser.add_argument("--pass", dest="pass_", choices=["fwd", "bwd", "fwd+bwd"], default="fwd",
                        help="the forward pass, the backward pass alone, or both (default: %(default)s)")
    parser.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                        help=f"comma-separated PyTorch rows to run ({', '.join(PEERS)}), or 'none' "
                             "(default: %(default)s)")
    parser.add_argument("--dtype", help="comma-separated precisions to run (fp32,fp16,bf16); default: those of "
                                        "the chosen stages (fp16 when no stage is chosen)")
    parser.add_argument("--warmup", type=int, default=defaults.warmup,
                        help="warm-up calls, the first one included (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=defaults.reps, help="timed calls, at most (default: %(default)s)")
    parser.add_argument("--row-seconds", type=float, default=defaults.row_seconds,
                        help="timed calls per row are cut to fit about this long, 3 at least (default: %(default)s)")
    parser.add_argument("--max-call-seconds", type=float, default=defaults.max_call_seconds,
                        help="skip a stage/backend at shapes where one call takes longer (default: %(default)s)")
    parser.add_argument("--max-seconds", type=float, default=defaults.max_seconds,
                        help="stop the whole run after this long (default: %(default)s)")
    parser.add_argument("--check-heads", type=int, default=defaults.check_heads,
                        help="heads compared with float64 (default: %(default)s)")
    parser.add_argument("--check-rows", type=int, default=defaults.check_rows,
                        help="query rows per checked head (default: %(default)s)")
    parser.add_argument("--causal", choices=["off", "on", "both"], default="off",
                        help="causal masking: off, on, or both for every shape (default: %(default)s)")
    parser.add_argument("--flush-l2", choices=["auto", "on", "off"], default=defaults.flush_l2,
                        help="flush L2 before each timed call: auto = where the inputs fit in it (default: "
                             "%(default)s)")
    parser.add_argument("--timing", choices=TIMINGS, default=defaults.timing,
                        help="plain calls from the host, or replays of one call captured in a CUDA graph (rows "
                             "noted 'CUDA graph replay', by default in torch_graph.csv) (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--list", action="store_true", help="list the library's stages and exit")
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.reps < 1:
        die("--warmup and --reps must be at least 1")
    if args.timing == "graph" and args.pass_ != "fwd":
        die("--timing graph times the forward pass only")
    try:
        problems = shapes.parse_shapes(args.shapes)
    except ValueError as error:
        die(str(error))
    overrides = {}
    if args.kv_heads is not None:
        overrides["kv_heads"] = args.kv_heads
    if args.seq_k is not None:
        overrides["kv_seq"] = args.seq_k
    if overrides:
        problems = [dataclasses.replace(p, **overrides) for p in problems]
        for problem in problems:
            reason = problem.validate()
            if reason:
                die(f"{problem.describe()}: {reason} (--kv-heads must divide every shape's heads)")
    args.problems = list(dict.fromkeys(problems))
    args.causal_modes = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    args.config = RunConfig(warmup=args.warmup, reps=args.reps, row_seconds=args.row_seconds,
                            max_call_seconds=args.max_call_seconds, max_seconds=args.max_seconds,
                            check_heads=args.check_heads, check_rows=args.check_rows, seed=args.seed,
                            flush_l2=args.flush_l2, timing=args.timing)
    return args


def choose_stages(library, text, pass_="fwd"):
    """The GPU descriptors the selection names (a folder or number also names a stage's CPU
    descriptor, as 11_backward/fp32: left out); with pass_ 'bwd' or 'fwd+bwd' those with a backward
    pass."""
    if text == "none":
        return []
    if text == "all":
        chosen = library.stages()
    else:
        try:
            chosen = library.select(text)
        except capi.FaError as error:
            die(error.message)
    gpu = [s for s in chosen if s.is_cuda]
    if chosen and not gpu and text != "all":
        die(f"{', '.join(s.id for s in chosen)} run(s) on the CPU: this script compares GPU stages")
    if pass_ != "fwd":
        without = [s.id for s in gpu if not s.supports("backward")]
        gpu = [s for s in gpu if s.supports("backward")]
        if without and text != "all":
            print(f"{PROGRAM}: no backward pass, left out: {', '.join(without)}", file=sys.stderr)
        if not gpu:
            die(f"no chosen GPU stage has a backward pass ({library.path})")
    return gpu


def main(argv=None):
    args = parse_args(argv)
    try:
        library = capi.Library(args.lib)
    except capi.LibraryNotFoundError as error:
        die(str(error))
    all_stages = library.stages()
    if not all_stages:
        die(f"{library.path} holds no stages")
    if args.list:
        for s in all_stages:
            kv = "-" if s.kv_passes is None else f"{s.kv_passes:g}"
            print(f"{s.id:<24} {s.backend:<5} {s.precision:<5} max D {s.max_dim:<4} {s.architecture:<7} "
                  f"kv passes {kv:<3} {','.join(sorted(s.features)) or '-':<40} {s.source_hash}  {s.title}")
        return 0
    stages = choose_stages(library, args.stages, args.pass_)

    from fa_course.bench import torch_runner

    peers = [] if args.peers == "none" else [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers:
        if peer not in torch_runner.PEERS:
            die(f"unknown peer '{peer}' (choose from {', '.join(torch_runner.PEERS)})")
    precisions = sorted({s.precision for s in stages}) or ["fp16"]
    if args.dtype:
        precisions = [p.strip() for p in args.dtype.split(",")]
        for p in precisions:
            if p not in ELEMENT_BYTES:
                die(f"unknown dtype '{p}' (choose from {', '.join(ELEMENT_BYTES)})")

    try:
        runner = torch_runner.TorchRunner(library, args.config)
    except torch_runner.TorchUnavailable as error:
        die(str(error))
    runner.out_path = args.out or torch_runner.default_out(runner.gpu, REPO, timing=args.timing)
    os.makedirs(os.path.dirname(os.path.abspath(runner.out_path)), exist_ok=True)
    if os.path.exists(runner.out_path) and os.path.getsize(runner.out_path) > 0:
        try:  # a file of another kind, or with a key twice, is refused before anything runs
            results.read_results(runner.out_path)
        except (results.SchemaError, ValueError) as error:
            die(f"cannot merge into {runner.out_path}: {error}")
    torch = runner.torch
    print(f"{runner.gpu}; PyTorch {torch.__version__} (CUDA {torch.version.cuda}); {library.path} (ABI "
          f"{library.abi_version}); stages: {', '.join(s.id for s in stages) or 'none'}; peers: "
          f"{', '.join(peers) or 'none'}; dtypes: {', '.join(precisions)}; pass: {args.pass_}; timing: "
          f"{args.timing}", flush=True)
    try:
        runner.run(args.problems, stages, peers, precisions, args.causal_modes, args.pass_)
    except torch_runner.ContextLost as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        runner.report()
        return 1
    runner.report()
    return 1 if runner.failures else 0


if __name__ == "__main__":
    sys.exit(main())
