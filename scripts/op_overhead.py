#!/usr/bin/env python3
"""What fa_course.attention costs beyond its kernels: the op beside PyTorch's SDPA and beside the
bare C ABI call of the same stage, in one process on one GPU.

  python3 scripts/op_overhead.py                    # BF16; the installed package, from any directory
  python3 scripts/op_overhead.py --check            # exit 1 when a budget below is missed

Two measurements, both printed as one table:

  host µs per call   at a tiny problem (--tiny, default 1x2x128x64), where the GPU work is shorter
                     than the host's: the wall time of calls in a row, without synchronizing,
                     divided by their number (a synchronize before and after, outside the timed
                     loop). Forward alone, then forward + backward (torch.autograd.grad; a quarter
                     as many calls). Budgets: the op at most SDPA's + 10 µs (forward) and + 50 µs
                     (forward + backward).
  event ms per call  at --large (default 8x16x2048x128): CUDA events recorded just before and just
                     after each call, the median of the calls after warm-up, two ways. "idle": the
                     host waits for each call's end before the next, so every call starts on an idle
                     GPU and its events time the host's latency up to the first kernel as well.
                     "queued": the calls issued back to back, as a training loop issues them, the
                     host waiting only after the last; a call's events then time what the GPU does
                     between them, host time only where the host falls behind the GPU. Budget: the
                     op within 3 % of the bare call.

Both in --rounds rounds that take op, Function, SDPA and bare in turn (--calls and --reps split
among them); each value is the median of its rounds, so that a drift of the machine falls on all
four alike.

"bare" is the library's own entry point (fa_forward_v2, fa_backward_v2 through ctypes) on tensors
allocated once, with its argument struct built once: what a caller pays who does all the work
of the op (checks, stage choice, allocation) once, outside the loop. The stages are the op's
choice (fa_course.chosen_stages), so all three run the same kernels where SDPA is not involved.
"op (py)" is the op with its C++ node turned off (fa_course.node.use(False) around each call, about
0.5 µs): the Python path and autograd.Function it runs where no node was built for this PyTorch.
"Function" is the thinnest op a Python autograd.Function can be: it allocates the outputs and the
workspace as the op does and makes the bare calls, with no checks and nothing looked up; what it
costs beyond bare is autograd's and Python's share, which no op written this way avoids.
Needs PyTorch and a CUDA GPU (sm_80 or newer); inside a checkout without installing the package:
PYTHONPATH=python FA_CAPI_LIB=build/lib/libfa_capi.so python3 scripts/op_overhead.py.
"""

import argparse
import ctypes
import statistics
import sys
import time

PROGRAM = "op_overhead"


def die(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    sys.exit(2)


def parse_shape(text):
    values = tuple(int(x) for x in text.split("x"))
    if len(values) != 4 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not BxHxNxD")
    return values


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--tiny", type=parse_shape, default=(1, 2, 128, 64), help="BxHxNxD of the host timing")
    parser.add_argument("--large", type=parse_shape, default=(8, 16, 2048, 128), help="BxHxNxD of the event timing")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--calls", type=int, default=2000, help="calls per host timing (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=50, help="event-timed calls (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=7,
                        help="rounds, each timing op, Function, SDPA and bare in turn; a value is the rounds' median "
                             "(default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a budget is missed")
    args = parser.parse_args(argv)
    if min(args.calls, args.reps, args.rounds) < 1:
        parser.error("--calls, --reps and --rounds take a positive count")
    return args


class Bare:
    """The op's stages called through the C ABI with everything prepared once: tensors, the
    workspaces, the argument structs (their pointers never change), the stream."""

    def __init__(self, torch, fa_course, q, k, v, causal):
        from fa_course import capi, ops

        self.plan = plan = ops.plan_for(q, k, v, causal)
        forward, self.forward_id, forward_bytes = plan.stage("fwd", "")
        backward, self.backward_id, backward_bytes = plan.stage("bwd", "")
        self.stages = (forward.id, backward.id)
        self.workspace_bytes = (forward_bytes, backward_bytes)
        self.function_forward = plan.library.handle.fa_forward_v2
        self.function_backward = plan.library.handle.fa_backward_v2
        self.out, self.grad_out = torch.empty_like(q), torch.randn_like(q)
        self.lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=q.device)
        self.grads = [torch.empty_like(t) for t in (q, k, v)]
        self.workspaces = [torch.empty(max(n, 1), dtype=torch.uint8, device=q.device)
                           for n in (forward_bytes, backward_bytes)]
        stream = torch.cuda.current_stream().cuda_stream
        # The forward alone writes O, as the op's forward call without gradients does; before a
        # backward pass it writes the LSE too, which the backward pass reads.
        self.forward_args, self.training_forward_args = (
            capi.FaForwardArgs(ctypes.sizeof(capi.FaForwardArgs), plan.problem_pointer, q.data_ptr(), k.data_ptr(),
                               v.data_ptr(), self.out.data_ptr(), lse, self.workspaces[0].data_ptr() if forward_bytes
                               else None, stream) for lse in (None, self.lse.data_ptr()))
        self.backward_args = capi.FaBackwardArgs(
            ctypes.sizeof(capi.FaBackwardArgs), plan.problem_pointer, q.data_ptr(), k.data_ptr(), v.data_ptr(),
            self.out.data_ptr(), self.grad_out.data_ptr(), self.lse.data_ptr(),
            *(g.data_ptr() for g in self.grads), self.workspaces[1].data_ptr() if backward_bytes else None, stream)
        self.library = plan.library

    def forward(self):
        if self.function_forward(self.forward_id, self.forward_args) != 0:
            raise RuntimeError(self.library.last_error())

    def forward_backward(self):
        if self.function_forward(self.forward_id, self.training_forward_args) != 0:
            raise RuntimeError(self.library.last_error())
        if self.function_backward(self.backward_id, self.backward_args) != 0:
            raise RuntimeError(self.library.last_error())


def thinnest_function(torch, bare):
    """An autograd.Function around the bare stages' library calls: outputs and workspace allocated
    per call as the op allocates them, nothing checked or looked up."""
    plan = bare.plan
    library, stream = plan.library, plan.stream
    forward_bytes, backward_bytes = bare.workspace_bytes

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out = torch.empty_like(q)
            lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=q.device)
            workspace = torch.empty(forward_bytes, dtype=torch.uint8, device=q.device) if forward_bytes else None
            library.run_forward(bare.forward_id, plan.problem_pointer, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                out.data_ptr(), lse.data_ptr(), workspace.data_ptr() if forward_bytes else None,
                                stream())
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse = ctx.saved_tensors
            grad_out = grad_out.contiguous()
            grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            workspace = torch.empty(backward_bytes, dtype=torch.uint8, device=q.device) if backward_bytes else None
            library.run_backward(bare.backward_id, plan.problem_pointer, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                 out.data_ptr(), grad_out.data_ptr(), lse.data_ptr(), *(g.data_ptr() for g in grads),
                                 workspace.data_ptr() if backward_bytes else None, stream(), False)
            return grads

    return Function


def host_us(torch, call, calls):
    """Wall microseconds per call over `calls` calls in a row, without synchronizing in between."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def event_ms(torch, call, reps, queued):
    """Median milliseconds between CUDA events recorded just before and just after each call; the
    host waits for each call's end before the next (idle) or only after the last (queued)."""
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        call()
        end.record()
        if not queued:
            end.synchronize()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def interleaved(measure, calls, which, rounds):
    """{name: median over `rounds` of measure(calls[name][which])}, the names taken in turn in each
    round, so that a drift of the machine (clocks, other load) falls on all of them alike."""
    values = {name: [] for name in calls}
    for _ in range(rounds):
        for name, pair in calls.items():
            values[name].append(measure(pair[which]))
    return {name: statistics.median(found) for name, found in values.items()}


def calls_for(torch, fa_course, shape, dtype, causal):
    """{name: (forward call, forward + backward call)} for the op, the op with its C++ node turned off,
    the thinnest autograd.Function, SDPA and the bare C ABI calls."""
    from fa_course import node

    batch, heads, seq, dim = shape
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=dtype) for _ in range(3))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grad_out = torch.randn_like(q)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    bare = Bare(torch, fa_course, q, k, v, causal)
    function = thinnest_function(torch, bare)

    def op_forward():
        return fa_course.attention(q, k, v, causal)

    def op_training():
        return torch.autograd.grad(fa_course.attention(*leaves, causal), leaves, grad_out)

    def function_forward():
        return function.apply(q, k, v)

    def function_training():
        return torch.autograd.grad(function.apply(*leaves), leaves, grad_out)

    def sdpa_forward():
        return sdpa(q, k, v, is_causal=causal)

    def sdpa_training():
        return torch.autograd.grad(sdpa(*leaves, is_causal=causal), leaves, grad_out)

    def without_node(call):
        def run():
            previous = node.use(False)
            try:
                return call()
            finally:
                node.use(previous)
        return run

    return {"op": (op_forward, op_training),
            "op (py)": (without_node(op_forward), without_node(op_training)),
            "Function": (function_forward, function_training),
            "SDPA": (sdpa_forward, sdpa_training),
            "bare": (bare.forward, bare.forward_backward)}, bare.stages


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as error:
        die(f"PyTorch is needed ({error}); run this on the GPU machine")
    if not torch.cuda.is_available():
        die(f"PyTorch {torch.__version__} sees no CUDA GPU")
    import fa_course

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    try:
        tiny, stages = calls_for(torch, fa_course, args.tiny, dtype, args.causal)
        large, _ = calls_for(torch, fa_course, args.large, dtype, args.causal)
    except (fa_course.LibraryNotFoundError, fa_course.UnsupportedProblem) as error:
        die(str(error))
    host_calls = max(20, args.calls // args.rounds)
    event_reps = max(5, args.reps // args.rounds)

    def timed_events(which, queued):
        return interleaved(lambda call: event_ms(torch, call, event_reps, queued), large, which, args.rounds)

    with torch.no_grad():
        forward_us = interleaved(lambda call: host_us(torch, call, host_calls), tiny, 0, args.rounds)
        events = {("forward", queued): timed_events(0, queued) for queued in (False, True)}
    training_us = interleaved(lambda call: host_us(torch, call, max(5, host_calls // 4)), tiny, 1, args.rounds)
    events.update({("fwd+bwd", queued): timed_events(1, queued) for queued in (False, True)})

    tiny_text, large_text = ("x".join(map(str, s)) for s in (args.tiny, args.large))
    from fa_course import node

    library = fa_course.load()
    runs_in = "C++" if node.module_for(library) is not None else "Python (no C++ node for this PyTorch and Python)"
    print(f"{torch.cuda.get_device_name()}; PyTorch {torch.__version__}; {library.path}; {args.dtype}"
          f"{' causal' if args.causal else ''}; stages {stages[0]} (forward), {stages[1]} (backward); the op's "
          f"eager calls: {runs_in}")
    rows = [
        (f"host us, forward, {tiny_text}", forward_us, "op <= SDPA + 10 us",
         forward_us["op"] <= forward_us["SDPA"] + 10),
        (f"host us, fwd+bwd, {tiny_text}", training_us, "op <= SDPA + 50 us",
         training_us["op"] <= training_us["SDPA"] + 50),
    ] + [(f"event ms, {which}, {'queued' if queued else 'idle'}, {large_text}", values, "op <= bare x 1.03",
          values["op"] <= values["bare"] * 1.03) for (which, queued), values in events.items()]
    names = list(tiny)
    print(f"{'':42} " + " ".join(f"{name:>9}" for name in names) + "  budget")
    for label, values, budget, met in rows:
        print(f"{label:42} " + " ".join(f"{values[name]:9.3f}" for name in names) +
              f"  {budget}: {'met' if met else 'MISSED'}")
    for (which, queued), values in events.items():
        ratios = ", ".join(f"{name} {values[name] / values['bare']:.3f}" for name in names if name != "bare")
        print(f"event ms over bare, {which}, {'queued' if queued else 'idle'}: {ratios}")
    if args.check and not all(met for *_, met in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
