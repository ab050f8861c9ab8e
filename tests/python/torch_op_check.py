#!/usr/bin/env python3
"""fa_course.ops, the course's attention as a PyTorch operator: forward and backward passes against
PyTorch's SDPA in float64 (computed here from the same rounded inputs, never typed in), on square,
causal, grouped-query and Nq != Nk problems; torch.library.opcheck; torch.compile(fullgraph=True)
with no graph break (torch._dynamo.explain); CUDA-graph capture and replay; and the errors a wrong
tensor gets.

Two halves, each a ctest of its own (tests/python_tests.cmake); not collected by `unittest
discover` (no test_ prefix), because without PyTorch they skip and that suite may skip nothing:

  python3 tests/python/torch_op_check.py cpu   PyTorch, no GPU needed: the op on the CPU stages
                                               (01_cpu forward, 11_backward/fp32 backward, float32)
  python3 tests/python/torch_op_check.py gpu   a CUDA GPU (sm_80+) and the library's GPU backward
                                               stage: FP16 and BF16 on the GPU stages

Exit status 77 (ctest's "skipped") with the reason when PyTorch, the GPU or the stages are missing;
with FA_REQUIRE_GPU=1 (the GPU suite) that is a failure instead (exit 1). Extra arguments go to
unittest (-v, -k PATTERN).
"""

import math
import os
import sys
import unittest

import _support  # noqa: F401  (puts python/ on sys.path)
from fa_course import capi, selection

SKIP_EXIT_CODE = 77
MODES = ("cpu", "gpu")
# the unit roundoff of each 16-bit format (and FP32 for the CPU stages)
UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24}

torch = None  # imported by main() once it is known to be there


def unavailable_reason(mode: str) -> str:
    """'' when this half can run here, else why not."""
    global torch
    try:
        import torch as imported
    except ImportError as error:
        return f"PyTorch is not installed in {sys.executable} ({error})"
    torch = imported
    if not hasattr(torch.library, "custom_op"):
        return f"PyTorch {torch.__version__} has no torch.library.custom_op (2.4 or newer needed)"
    try:
        library = capi.Library()
    except capi.LibraryNotFoundError as error:
        return f"no built library: {error}"
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


# ---- the float64 reference ---------------------------------------------------------------------


def sdpa(q, k, v, causal):
    """PyTorch's SDPA with our conventions: grouped heads (enable_gqa), the causal mask aligned
    bottom-right (causal_lower_right; is_causal=True aligns top-left)."""
    from torch.nn.attention.bias import causal_lower_right

    kwargs = {"enable_gqa": q.shape[1] != k.shape[1]}
    if causal:
        kwargs["attn_mask"] = causal_lower_right(q.shape[2], k.shape[2])
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)


def reference_lse(q, k, causal):
    """The natural log of each row's softmax denominator, in float64."""
    group = q.shape[1] // k.shape[1]
    keys = k.double().repeat_interleave(group, dim=1)
    scores = q.double() @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        rows = torch.arange(q.shape[2], device=q.device)[:, None]
        columns = torch.arange(k.shape[2], device=q.device)[None, :]
        scores = scores.masked_fill(columns > rows + k.shape[2] - q.shape[2], float("-inf"))
    return torch.logsumexp(scores, dim=-1)


def gradients(function, q, k, v, grad_out, causal, dtype=None):
    """(O, dQ, dK, dV) of `function` at q, k, v (cast to `dtype` when given) for the gradient dO."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in (q, k, v)]
    out = function(*leaves, causal)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.dtype))
    return (out.detach(),) + tuple(g.detach() for g in grads)


def make_problem(shape, dtype, device, seed=0):
    """Q, K, V in [-1, 1) and dO ~ N(0, 1), already in `dtype` (so the reference sees what we see)."""
    batch, q_heads, kv_heads, q_seq, kv_seq, dim = shape
    generator = torch.Generator(device=device).manual_seed(seed)

    def uniform(*size):
        return (torch.rand(size, generator=generator, device=device) * 2 - 1).to(dtype)

    q, k, v = uniform(batch, q_heads, q_seq, dim), uniform(batch, kv_heads, kv_seq, dim), uniform(batch, kv_heads,
                                                                                                   kv_seq, dim)
    grad_out = torch.randn(batch, q_heads, q_seq, dim, generator=generator, device=device).to(dtype)
    return q, k, v, grad_out


# square; causal with odd sizes; grouped-query (and multi-query) causal; Nq < Nk causal; Nq > Nk (no
# mask: with one, PyTorch's reference gives NaN for the rows that see no key)
GPU_SHAPES = [
    ((2, 4, 4, 128, 128, 64), False),
    ((1, 4, 4, 257, 257, 128), True),
    ((2, 8, 2, 200, 200, 64), True),
    ((1, 4, 1, 96, 96, 100), True),
    ((1, 4, 4, 100, 300, 64), True),
    ((1, 4, 2, 300, 100, 128), False),
]
CPU_SHAPES = [
    ((2, 2, 2, 33, 33, 16), False),
    ((1, 4, 2, 20, 50, 32), True),
    ((1, 2, 1, 50, 20, 8), False),
]


class OpCase(unittest.TestCase):
    """What both halves test, on `device` with `dtypes`."""

    device = "cpu"
    dtypes = ()
    shapes = ()

    @classmethod
    def setUpClass(cls):
        from fa_course import ops

        cls.ops = ops
        cls.library = capi.load()

    def check_against_float64(self, shape, causal, dtype):
        q, k, v, grad_out = make_problem(shape, dtype, self.device)
        out, lse = self.ops.attention_with_lse(q, k, v, causal)
        ours = gradients(self.ops.attention, q, k, v, grad_out, causal)
        exact = gradients(sdpa, q, k, v, grad_out, causal, torch.float64)
        theirs = gradients(sdpa, q, k, v, grad_out, causal)  # PyTorch in this dtype: what its rounding costs
        where = f"{dtype} {shape} causal={causal} stages={self.ops.chosen_stages(q, k, v, causal)}"
        precision = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
        tolerance = self.library.tolerance(precision, v.abs().max().item())
        self.assertLessEqual((out.double() - exact[0]).abs().max().item(), tolerance, f"O, {where}")
        self.assertTrue(torch.equal(out, ours[0]), f"attention and attention_with_lse differ, {where}")
        lse_error = (lse.double() - reference_lse(q, k, causal)).abs().max().item()
        self.assertLessEqual(lse_error, 1e-3, f"LSE, {where}")
        roundoff = UNIT_ROUNDOFF[str(dtype).replace("torch.", "")]
        for name, mine, torch_value, reference in zip(("dQ", "dK", "dV"), ours[1:], theirs[1:], exact[1:]):
            self.assertEqual(mine.dtype, dtype)
            self.assertTrue(torch.isfinite(mine).all().item(), f"{name} not finite, {where}")
            error = (mine.double() - reference).abs().max().item()
            torch_error = (torch_value.double() - reference).abs().max().item()
            # PyTorch's own error on these inputs, with room for a different order of additions, and
            # a floor of two roundings of the largest gradient for a case where PyTorch is exact
            allowed = 4 * torch_error + 2 * roundoff * reference.abs().max().item()
            self.assertLessEqual(error, allowed, f"{name}: max abs err {error:.3e} > {allowed:.3e} (PyTorch's "
                                                 f"{torch_error:.3e}), {where}")

    def test_forward_and_backward_against_float64(self):
        for dtype in self.dtypes:
            for shape, causal in self.shapes:
                with self.subTest(dtype=dtype, shape=shape, causal=causal):
                    self.check_against_float64(shape, causal, dtype)

    def test_opcheck(self):
        if not hasattr(torch.library, "opcheck"):
            self.skipTest(f"PyTorch {torch.__version__} has no torch.library.opcheck")
        dtype = self.dtypes[-1]  # BF16 on the GPU: opcheck's tolerance holds dQ's atomics' last-bit differences
        q, k, v, grad_out = make_problem((1, 4, 2, 40, 56, 64), dtype, self.device)
        leaves = [t.requires_grad_() for t in (q, k, v)]
        torch.library.opcheck(torch.ops.fa_course.attention.default, tuple(leaves), {"causal": True})
        out, lse = torch.ops.fa_course.attention(q, k, v, True)
        torch.library.opcheck(torch.ops.fa_course.attention_backward.default,
                              (grad_out, q.detach(), k.detach(), v.detach(), out.detach(), lse, True))

    def test_the_lse_is_not_differentiable(self):
        q, k, v, _ = make_problem((1, 2, 2, 16, 16, 32), self.dtypes[0], self.device)
        out, lse = self.ops.attention_with_lse(q.requires_grad_(), k, v)
        self.assertTrue(out.requires_grad)
        self.assertFalse(lse.requires_grad)
        self.assertEqual(lse.dtype, torch.float32)
        self.assertEqual(tuple(lse.shape), (1, 2, 16))

    def compile_backend(self):
        return "inductor"

    def test_torch_compile_fullgraph_without_graph_breaks(self):
        q, k, v, grad_out = make_problem((1, 4, 2, 64, 64, 64), self.dtypes[0], self.device)

        def step(q, k, v):
            return (self.ops.attention(q, k, v, causal=True).float() * grad_out.float()).sum()

        explained = torch._dynamo.explain(step)(q, k, v)
        self.assertEqual(explained.graph_break_count, 0, str(explained.break_reasons))
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True, backend=self.compile_backend())
        eager = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        traced = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        step(*eager).backward()
        compiled(*traced).backward()
        for name, a, b in zip("qkv", eager, traced):
            # dQ is summed with FP32 atomics in no fixed order: equal within a 16-bit rounding, not bitwise
            torch.testing.assert_close(b.grad, a.grad, atol=1e-2, rtol=1e-2, msg=f"d{name} compiled vs eager")

    def test_wrong_tensors_raise_clear_errors(self):
        dtype = self.dtypes[0]
        q, k, v, _ = make_problem((1, 4, 2, 16, 16, 32), dtype, self.device)
        cases = {
            "non-contiguous": ((q.transpose(1, 2).contiguous().transpose(1, 2), k, v), ValueError, "contiguous"),
            "float64": ((q.double(), k.double(), v.double()), TypeError, "takes"),
            "mixed dtypes": ((q, k.double(), v), TypeError, "one dtype"),
            "heads": ((q[:, :3].contiguous(), k, v), ValueError, "multiple"),
            "head dims": ((q[..., :16].contiguous(), k, v), ValueError, "head dim"),
            "3-D": ((q[0], k, v), ValueError, "4-D"),
            "k and v": ((q, k, v[:, :, :8].contiguous()), ValueError, "differ in shape"),
            "not a tensor": ((q.tolist(), k, v), TypeError, "torch.Tensor"),
        }
        for name, (args, error, text) in cases.items():
            with self.subTest(name):
                with self.assertRaisesRegex(error, text):
                    self.ops.attention(*args)
        with self.assertRaisesRegex(self.ops.UnsupportedProblem, "head dim"):  # the library's own reason
            wide = torch.zeros(1, 1, 4, 1024, dtype=dtype, device=self.device)
            self.ops.attention(wide, wide, wide)
        with self.assertRaisesRegex(self.ops.UnsupportedProblem, "no stage"):
            self.ops.attention(q, k, v, stage="no_such_stage")


class CpuOp(OpCase):
    """The op on the CPU stages (float32), where there is no GPU."""

    device = "cpu"
    dtypes = ()
    shapes = CPU_SHAPES

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dtypes = (torch.float32,)

    def compile_backend(self):
        return "aot_eager"  # inductor on the CPU needs a C++ compiler and a minute; the graph is the point

    def test_the_cpu_stages_are_chosen(self):
        q, k, v, _ = make_problem((1, 2, 2, 8, 8, 16), torch.float32, "cpu")
        forward, backward = self.ops.chosen_stages(q, k, v)
        self.assertEqual(self.library.stage(forward).backend, "cpu")
        self.assertTrue(self.library.stage(backward).supports("backward"))

    def test_a_refusal_in_the_backward_pass_reaches_the_caller(self):
        q, k, v, grad_out = make_problem((1, 2, 2, 8, 8, 16), torch.float32, "cpu")
        out = self.ops.attention(q.requires_grad_(), k, v, backward_stage="no_such_stage")
        with self.assertRaisesRegex(self.ops.UnsupportedProblem, "no_such_stage"):
            out.backward(grad_out)

    def test_the_package_offers_the_op(self):
        import fa_course

        self.assertIs(fa_course.attention, self.ops.attention)

    def test_cuda_dtypes_on_the_cpu_are_refused(self):
        q = torch.zeros(1, 1, 4, 16, dtype=torch.float16)
        with self.assertRaisesRegex(TypeError, "float16 on cpu"):
            self.ops.attention(q, q, q)


class GpuOp(OpCase):
    """The op on the GPU stages in FP16 and BF16."""

    device = "cuda"
    shapes = GPU_SHAPES

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dtypes = (torch.float16, torch.bfloat16)

    def test_the_fastest_forward_stage_is_chosen_and_others_can_be_named(self):
        q, k, v, grad_out = make_problem((1, 4, 4, 128, 128, 64), torch.float16, "cuda")
        forward, backward = self.ops.chosen_stages(q, k, v)
        capability = torch.cuda.get_device_capability()
        runs_here = [s.folder for s in self.library.stages() if s.is_cuda and s.precision == "fp16"
                     and s.supports("lse") and not s.supports("backward")
                     and not selection.runs_on(s, "cuda", 10 * capability[0] + capability[1])]
        # Nq = 128: a prefill problem, which a decoding stage would hand to an earlier stage's kernel.
        prefill = [folder for folder in runs_here if folder not in selection.DECODE_STAGES]
        self.assertEqual(forward.split("/")[0], max(prefill), "the latest forward stage that runs here")
        self.assertTrue(self.library.stage(backward).supports("backward"))
        decoding = [folder for folder in runs_here if folder in selection.DECODE_STAGES]
        if decoding:  # a few query rows against many keys: the decoding stage's own kernel
            q_decode, k_decode, v_decode, _ = make_problem((1, 4, 2, 4, 1000, 64), torch.float16, "cuda")
            decode_forward, _ = self.ops.chosen_stages(q_decode, k_decode, v_decode)
            self.assertEqual(decode_forward.split("/")[0], max(decoding))
        named = self.ops.attention(q, k, v, stage="08")
        chosen = self.ops.attention(q, k, v)
        torch.testing.assert_close(named, chosen, atol=2e-3, rtol=0)

    def test_wrong_devices_raise_clear_errors(self):
        q, k, v, _ = make_problem((1, 2, 2, 16, 16, 32), torch.float16, "cuda")
        with self.assertRaisesRegex(ValueError, "one device"):
            self.ops.attention(q, k.cpu(), v)
        with self.assertRaisesRegex(TypeError, "float32 on CPU"):
            self.ops.attention(q.float(), k.float(), v.float())  # FP32 on the GPU: no stage writes an LSE

    def test_a_head_dim_the_backward_refuses_is_an_error_not_a_crash(self):
        dims = [s.max_dim for s in self.library.stages() if s.is_cuda and s.supports("backward")]
        dim = max(dims) + 8
        q, k, v, grad_out = make_problem((1, 2, 2, 32, 32, dim), torch.float16, "cuda")
        q.requires_grad_()
        with self.assertRaisesRegex(ValueError, "head dim"):
            out = self.ops.attention(q, k, v, causal=True)
            out.backward(grad_out)
        torch.cuda.synchronize()  # the context is still healthy

    def test_cuda_graph_capture_and_replay(self):
        shape = (2, 8, 2, 256, 256, 64)
        q, k, v, grad_out = make_problem(shape, torch.bfloat16, "cuda")
        static = [t.clone().requires_grad_() for t in (q, k, v)]

        def step():
            out = self.ops.attention(*static, causal=True)
            return (out,) + torch.autograd.grad(out, static, grad_out)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture (stage choice, cuFuncSetAttribute)
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        fresh_q, fresh_k, fresh_v, _ = make_problem(shape, torch.bfloat16, "cuda", seed=7)
        with torch.no_grad():
            for target, value in zip(static, (fresh_q, fresh_k, fresh_v)):
                target.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        expected = gradients(self.ops.attention, fresh_q, fresh_k, fresh_v, grad_out, True)
        # BF16's default tolerance: a last-bit difference in dQ (FP32 atomics in no fixed order) passes
        for name, replayed, eager in zip(("O", "dQ", "dK", "dV"), captured, expected):
            torch.testing.assert_close(replayed, eager, msg=f"{name} replayed vs eager")


def main(argv):
    if not argv or argv[0] not in MODES:
        print(f"usage: {os.path.basename(__file__)} {{{'|'.join(MODES)}}} [unittest arguments]", file=sys.stderr)
        return 2
    mode = argv[0]
    reason = unavailable_reason(mode)
    if reason:
        if os.environ.get("FA_REQUIRE_GPU") == "1":
            print(f"FAILED: {reason} -- and FA_REQUIRE_GPU=1, so this is a failure, not a skip")
            return 1
        print(f"SKIPPED: {reason}")
        return SKIP_EXIT_CODE
    case = CpuOp if mode == "cpu" else GpuOp
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(case)
    verbosity = 2 if "-v" in argv[1:] else 1
    patterns = [argv[i + 1] for i, a in enumerate(argv[1:-1], start=1) if a == "-k"]
    if patterns:
        suite = unittest.TestSuite(t for t in suite if any(p in t.id() for p in patterns))
    result = unittest.TextTestRunner(verbosity=verbosity).run(suite)
    if result.skipped and os.environ.get("FA_REQUIRE_GPU") == "1":
        print(f"FAILED: {len(result.skipped)} skipped with FA_REQUIRE_GPU=1")
        return 1
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
