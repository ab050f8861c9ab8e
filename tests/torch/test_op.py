"""fa_course.attention (fa_course.ops), the course's attention as a PyTorch operator: forward and
backward passes against PyTorch's SDPA in float64 (computed here from the same rounded inputs, never
typed in), on square, causal, grouped-query and Nq != Nk problems; torch.library.opcheck of the two
registered ops; torch.compile(fullgraph=True) with no graph break (torch._dynamo.explain);
CUDA-graph capture and replay; the deterministic backward; and the errors a wrong tensor gets, also
on a call whose kind the op has seen before (its checks' verdict is kept per kind of call).

Two halves, each a ctest of its own (tests/python_tests.cmake runs them through run.py):

  TestCpuOp   PyTorch, no GPU needed: the op on the CPU stages (01_cpu forward, 11_backward/fp32
              backward, float32)
  TestGpuOp   a CUDA GPU (sm_80+) and the library's GPU backward stage: FP16 and BF16 on the GPU stages

A half that cannot run here (no PyTorch, no GPU, no backward stage) skips with the reason
(availability.py). By hand: `python3 -m pytest tests/torch -k Gpu`.
"""

import importlib.util
import math
import os
import threading

import pytest

import availability  # also puts the fa_course package on sys.path

torch = pytest.importorskip("torch")

# the unit roundoff of each 16-bit format (and FP32 for the CPU stages)
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
PRECISIONS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}

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


@pytest.fixture(scope="class", autouse=True)
def runs_here(request):
    """Each half skips, saying why, where it cannot run."""
    reason = availability.unavailable_reason(request.cls.mode)
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def ops():
    from fa_course import ops

    return ops


@pytest.fixture(scope="module")
def library():
    from fa_course import capi

    return capi.load()


def pytest_generate_tests(metafunc):
    """`case`: every (dtype, shape, causal) of the class, one test each."""
    if "case" in metafunc.fixturenames:
        cls = metafunc.cls
        cases = [(dtype, shape, causal) for dtype in cls.dtypes for shape, causal in cls.shapes]
        names = [f"{PRECISIONS[d]}-{'x'.join(map(str, s))}{'-causal' if c else ''}" for d, s, c in cases]
        metafunc.parametrize("case", cases, ids=names)


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

    q = uniform(batch, q_heads, q_seq, dim)
    k, v = uniform(batch, kv_heads, kv_seq, dim), uniform(batch, kv_heads, kv_seq, dim)
    grad_out = torch.randn(batch, q_heads, q_seq, dim, generator=generator, device=device).to(dtype)
    return q, k, v, grad_out


def load_training_example():
    """python/examples/train_attention.py as a module: its model is the one the training example trains."""
    path = os.path.join(availability.REPO, "python", "examples", "train_attention.py")
    spec = importlib.util.spec_from_file_location("train_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# name -> (the arguments, made from a valid q, k, v; the error; a word of its message)
WRONG_CALLS = {
    "non-contiguous": (lambda q, k, v: (q.transpose(1, 2).contiguous().transpose(1, 2), k, v), ValueError,
                       "contiguous"),
    "float64": (lambda q, k, v: (q.double(), k.double(), v.double()), TypeError, "takes"),
    "mixed dtypes": (lambda q, k, v: (q, k.double(), v), TypeError, "one dtype"),
    "heads": (lambda q, k, v: (q[:, :3].contiguous(), k, v), ValueError, "multiple"),
    "head dims": (lambda q, k, v: (q[..., :16].contiguous(), k, v), ValueError, "head dim"),
    "3-D": (lambda q, k, v: (q[0], k, v), ValueError, "4-D"),
    "k and v": (lambda q, k, v: (q, k, v[:, :, :8].contiguous()), ValueError, "differ in shape"),
    "not a tensor": (lambda q, k, v: (q.tolist(), k, v), TypeError, "torch.Tensor"),
}


class OpChecks:
    """What both halves test, on `device` with `dtypes`."""

    mode = ""
    device = ""
    dtypes = ()
    shapes = ()
    compile_backend = "inductor"
    example_head_dim = 64  # the training example's

    def test_forward_and_backward_against_float64(self, ops, library, case):
        dtype, shape, causal = case
        q, k, v, grad_out = make_problem(shape, dtype, self.device)
        out, lse = ops.attention_with_lse(q, k, v, causal)
        ours = gradients(ops.attention, q, k, v, grad_out, causal)
        exact = gradients(sdpa, q, k, v, grad_out, causal, torch.float64)
        theirs = gradients(sdpa, q, k, v, grad_out, causal)  # PyTorch in this dtype: what its rounding costs
        where = f"{dtype} {shape} causal={causal} stages={ops.chosen_stages(q, k, v, causal)}"
        tolerance = library.tolerance(PRECISIONS[dtype], v.abs().max().item())
        assert (out.double() - exact[0]).abs().max().item() <= tolerance, f"O, {where}"
        assert torch.equal(out, ours[0]), f"attention and attention_with_lse differ, {where}"
        # a call that needs no gradients and returns O alone has the library write no LSE
        assert torch.equal(out, ops.attention(q, k, v, causal)), f"O without the LSE differs, {where}"
        lse_error = (lse.double() - reference_lse(q, k, causal)).abs().max().item()
        assert lse_error <= 1e-3, f"LSE, {where}"
        for name, mine, torch_value, reference in zip(("dQ", "dK", "dV"), ours[1:], theirs[1:], exact[1:]):
            assert mine.dtype == dtype
            assert torch.isfinite(mine).all().item(), f"{name} not finite, {where}"
            error = (mine.double() - reference).abs().max().item()
            torch_error = (torch_value.double() - reference).abs().max().item()
            # PyTorch's own error on these inputs, with room for a different order of additions, and
            # a floor of two roundings of the largest gradient for a case where PyTorch is exact
            allowed = 4 * torch_error + 2 * UNIT_ROUNDOFF[dtype] * reference.abs().max().item()
            assert error <= allowed, (f"{name}: max abs err {error:.3e} > {allowed:.3e} (PyTorch's "
                                      f"{torch_error:.3e}), {where}")

    def test_opcheck(self, ops):  # the fixture registers torch.ops.fa_course
        """The two ops as torch.compile sees them (schema, fake tensors, dispatch). Autograd is not
        theirs but fa_course.attention's (an autograd.Function around them), which the gradient
        tests check, so the inputs here do not require grad."""
        if not hasattr(torch.library, "opcheck"):
            pytest.skip(f"PyTorch {torch.__version__} has no torch.library.opcheck")
        dtype = self.dtypes[-1]  # BF16 on the GPU: opcheck's tolerance holds dQ's atomics' last-bit differences
        q, k, v, grad_out = make_problem((1, 4, 2, 40, 56, 64), dtype, self.device)
        torch.library.opcheck(torch.ops.fa_course.attention.default, (q, k, v), {"causal": True})
        out, lse = torch.ops.fa_course.attention(q, k, v, True)
        for deterministic in (False, True):
            torch.library.opcheck(torch.ops.fa_course.attention_backward.default,
                                  (grad_out, q, k, v, out, lse, True, "", deterministic))

    def test_the_lse_is_not_differentiable(self, ops):
        q, k, v, _ = make_problem((1, 2, 2, 16, 16, 32), self.dtypes[0], self.device)
        out, lse = ops.attention_with_lse(q.requires_grad_(), k, v)
        assert out.requires_grad
        assert not lse.requires_grad
        assert lse.dtype == torch.float32
        assert tuple(lse.shape) == (1, 2, 16)

    def test_a_gradient_cut_below_the_output_is_not_an_error(self, ops):
        """A Function downstream that gives O no gradient: the op's backward receives None (it asks
        autograd not to make zeros for gradients nobody computed) and passes none on."""
        class Cut(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, grad):
                return None

        q, k, v, _ = make_problem((1, 2, 2, 16, 16, 32), self.dtypes[0], self.device)
        q.requires_grad_()
        (Cut.apply(ops.attention(q, k, v)).float().sum() + q.float().sum()).backward()
        assert torch.equal(q.grad, torch.ones_like(q))

    def test_a_thread_that_made_no_cuda_call_runs_both_passes(self, ops):
        """PyTorch's autograd worker runs the backward pass on a thread of its own, often before that
        thread has made a CUDA call that binds the device's context (the Hopper stages build their
        tensor maps with the driver, which needs one). A fresh thread, served from the allocator's
        cache, must get what this one gets (the GPU backward in its deterministic mode: the same bits)."""
        q, k, v, grad_out = make_problem((1, 2, 2, 128, 128, 64), self.dtypes[-1], self.device)

        def both_passes():
            out, lse = ops.attention_with_lse(q, k, v, True)
            grads = ops.attention_backward(grad_out, q, k, v, out, lse, True, deterministic=True)
            return [t.cpu() for t in (out, lse, *grads)]

        expected = both_passes()  # its tensors on the device go back to the cache for the thread's
        results, errors = [], []

        def on_a_fresh_thread():
            try:
                results.append(both_passes())
            except Exception as error:  # noqa: BLE001 -- reported by the assertion below
                errors.append(error)

        thread = threading.Thread(target=on_a_fresh_thread)
        thread.start()
        thread.join()
        assert not errors, f"{type(errors[0]).__name__}: {errors[0]}"
        for name, mine, theirs in zip(("O", "LSE", "dQ", "dK", "dV"), results[0], expected):
            if self.device == "cpu" and name == "dQ":  # the CPU stage adds dQ by OpenMP atomics, in no fixed order
                assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-6), "dQ differs on the fresh thread"
            else:
                assert torch.equal(mine, theirs), f"{name} differs on the fresh thread"

    def test_torch_compile_fullgraph_without_graph_breaks(self, ops):
        q, k, v, grad_out = make_problem((1, 4, 2, 64, 64, 64), self.dtypes[0], self.device)

        def step(q, k, v):
            return (ops.attention(q, k, v, causal=True).float() * grad_out.float()).sum()

        explained = torch._dynamo.explain(step)(q, k, v)
        assert explained.graph_break_count == 0, str(explained.break_reasons)
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True, backend=self.compile_backend)
        eager = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        traced = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        step(*eager).backward()
        compiled(*traced).backward()
        for name, a, b in zip("qkv", eager, traced):
            # dQ is summed with FP32 atomics in no fixed order: equal within a 16-bit rounding, not bitwise
            torch.testing.assert_close(b.grad, a.grad, atol=1e-2, rtol=1e-2, msg=f"d{name} compiled vs eager")

    def test_the_training_example_compiles_without_graph_breaks(self, ops):
        """The training example's model (python/examples/train_attention.py, small) with our op: no graph break
        in torch._dynamo.explain, and one compiled training step gives eager's loss and gradients."""
        example = load_training_example()
        args = example.parse_args(["--layers", "2", "--heads", "4", "--kv-heads", "2", "--seq", "32", "--head-dim",
                                   str(self.example_head_dim)])
        torch.manual_seed(0)
        model = example.build_model(torch, 20, args, lambda q, k, v: ops.attention(q, k, v, causal=True))
        model = model.to(self.device)
        tokens = torch.randint(0, 20, (2, args.seq), device=self.device)
        # on the GPU the example's BF16 autocast, which hands the op BF16 tensors; on the CPU float32
        autocast = torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.device == "cuda")

        def training_loss(module):
            with autocast:
                logits = module(tokens)
            return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())

        with autocast:
            explained = torch._dynamo.explain(model)(tokens)
        assert explained.graph_break_count == 0, str(explained.break_reasons)
        assert explained.graph_count == 1
        torch._dynamo.reset()
        eager_loss = training_loss(model)
        eager_loss.backward()
        eager_grads = [p.grad.detach().clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        compiled_loss = training_loss(torch.compile(model, fullgraph=True, backend=self.compile_backend))
        compiled_loss.backward()
        tolerance = 2e-2 if self.device == "cuda" else 1e-4
        torch.testing.assert_close(compiled_loss, eager_loss, atol=tolerance, rtol=tolerance)
        for parameter, eager_grad in zip(model.parameters(), eager_grads):
            torch.testing.assert_close(parameter.grad, eager_grad, atol=tolerance, rtol=tolerance)

    @pytest.mark.parametrize("name", list(WRONG_CALLS))
    def test_a_wrong_tensor_raises_a_clear_error(self, ops, name):
        q, k, v, _ = make_problem((1, 4, 2, 16, 16, 32), self.dtypes[0], self.device)
        make_arguments, error, text = WRONG_CALLS[name]
        with pytest.raises(error, match=text):
            ops.attention(*make_arguments(q, k, v))

    def test_a_wrong_tensor_is_refused_after_a_right_one_of_the_same_kind(self, ops):
        """The op keeps its checks' verdict per (shapes, dtypes, devices, causal): contiguity, which
        that key does not hold, is checked at every call."""
        q, k, v, _ = make_problem((1, 4, 2, 16, 16, 32), self.dtypes[0], self.device)
        ops.attention(q, k, v)
        strided = q.transpose(1, 2).contiguous().transpose(1, 2)
        assert strided.shape == q.shape
        with pytest.raises(ValueError, match="contiguous"):
            ops.attention(strided, k, v)

    def test_a_tensor_on_another_device_is_refused_after_a_right_call(self, ops):
        """The kept verdict is keyed by q's device: k's and v's are compared with it at every call."""
        q, k, v, _ = make_problem((1, 4, 2, 16, 16, 32), self.dtypes[0], self.device)
        ops.attention(q, k, v)
        for arguments in ((q, k.to("meta"), v), (q, k, v.to("meta"))):
            with pytest.raises(ValueError, match="one device"):
                ops.attention(*arguments)

    def test_a_problem_no_stage_takes_is_refused_with_the_library_reason(self, ops):
        q, k, v, _ = make_problem((1, 4, 2, 16, 16, 32), self.dtypes[0], self.device)
        with pytest.raises(ops.UnsupportedProblem, match="head dim"):  # the library's own reason
            wide = torch.zeros(1, 1, 4, 1024, dtype=self.dtypes[0], device=self.device)
            ops.attention(wide, wide, wide)
        with pytest.raises(ops.UnsupportedProblem, match="no stage"):
            ops.attention(q, k, v, stage="no_such_stage")


    def test_the_cpp_node_and_the_python_function_agree(self, ops, library):
        """Where the C++ autograd node was built for this PyTorch (ctest says so: FA_TORCH_NODE_BUILT),
        an eager call runs through it, and the Python Function gives the same bits (the deterministic
        backward: no atomics' order in dQ); where none was, the op runs the Python Function."""
        from fa_course import node

        built = os.environ.get("FA_TORCH_NODE_BUILT", "")
        expected = os.path.basename(built) == node.FILE_NAME
        assert (node.module_for(library) is not None) == expected, f"node built: {built or 'none'}; this PyTorch " \
                                                                 f"looks for {node.FILE_NAME}"
        q, k, v, grad_out = make_problem((1, 4, 2, 40, 56, 32), self.dtypes[-1], self.device)
        for causal, with_lse in ((False, False), (True, True)):
            results = {}
            for through_node in (True, False):
                previous = node.use(through_node)
                try:
                    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
                    outputs = ops.attention_with_lse(*leaves, causal, deterministic=True) if with_lse else \
                        (ops.attention(*leaves, causal, deterministic=True),)
                    python_function = type(outputs[0].grad_fn).__name__ == "_AttentionBackward"
                    assert python_function == (not (through_node and expected)), type(outputs[0].grad_fn)
                    grads = torch.autograd.grad(outputs[0], leaves, grad_out)
                    results[through_node] = [t.detach() for t in outputs] + list(grads)
                finally:
                    node.use(previous)
                with torch.no_grad():  # the forward pass alone: the same O
                    assert torch.equal(ops.attention(q, k, v, causal), results[through_node][0])
            for name, a, b in zip(("O", "LSE", "dQ", "dK", "dV") if with_lse else ("O", "dQ", "dK", "dV"),
                                  results[True], results[False]):
                assert torch.equal(a, b), f"{name} causal={causal}: the C++ node and the Python Function differ"

    def test_the_graph_keeps_its_plan_after_the_op_forgets_it(self, ops):
        """A graph waiting for its backward pass holds what it needs, when the op's plans are gone."""
        import gc

        q, k, v, grad_out = make_problem((1, 2, 2, 24, 24, 32), self.dtypes[0], self.device)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = ops.attention(*leaves, True)
        expected = torch.autograd.grad(ops.attention(*leaves, True), leaves, grad_out)
        ops._plans.clear()
        gc.collect()
        for name, mine, theirs in zip(("dQ", "dK", "dV"), torch.autograd.grad(out, leaves, grad_out), expected):
            torch.testing.assert_close(mine, theirs, msg=name)

    def test_a_library_refusal_in_the_cpp_node_is_raised_as_an_fa_error(self, ops, library):
        """A failed forward call comes back from the node's module as its message (no C++ exception
        crosses into Python), which the op raises as the library's FaError, with and without gradients;
        a failed backward pass is autograd's RuntimeError with the library's message."""
        from fa_course import capi, node

        module = node.module_for(library)
        if module is None:
            assert not os.environ.get("FA_TORCH_NODE_BUILT"), f"{node.FILE_NAME} was built but not loaded"
            return  # no node for this PyTorch and Python: the op runs its Python code (the test above)
        q, k, v, _ = make_problem((1, 2, 2, 16, 16, 32), self.dtypes[0], self.device)
        plan = ops.plan_for(q, k, v, False)
        # the plan's copy stays alive in `kept` while the calls use its address
        kept, address = node.make_plan(library, plan.problem_pointer, b"no_such_stage", b"", 0, 0)
        for result in (module.forward(q, k, v, address, False),
                       module.attention(*(t.clone().requires_grad_() for t in (q, k, v)), address, False, True)):
            assert isinstance(result, str), type(result)
            with pytest.raises(capi.FaError, match="no_such_stage") as raised:
                ops._node_result(result)
            assert raised.value.call == "fa_forward" and raised.value.stage == "no_such_stage"
        # a failure in the backward pass, which autograd runs: a RuntimeError with the library's message
        _, forward_id, forward_bytes = plan.stage("fwd", "")
        kept, address = node.make_plan(library, plan.problem_pointer, forward_id, b"no_such_stage", forward_bytes, 0)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = module.attention(*leaves, address, False, False)
        with pytest.raises(RuntimeError, match=r"fa_backward\('no_such_stage'\): status"):
            torch.autograd.grad(out, leaves, torch.ones_like(out))

    def test_a_library_failure_in_the_cpp_node_is_an_fa_error(self):
        from fa_course import capi, node

        text = "fa_backward('13_wgmma_backward/bf16'): status 3: out of GPU memory\nException raised from fail"
        error = node.library_error(RuntimeError(text))
        assert isinstance(error, capi.FaError)
        assert (error.status, error.stage, error.call, error.message) == (3, "13_wgmma_backward/bf16", "fa_backward",
                                                                          "out of GPU memory")
        other = RuntimeError("CUDA error: an illegal memory access was encountered")
        assert node.library_error(other) is other
        from_message = node.library_error(str(other))  # a message the node's module returned
        assert type(from_message) is RuntimeError and str(from_message) == str(other)


class TestCpuOp(OpChecks):
    """The op on the CPU stages (float32), where there is no GPU."""

    mode = "cpu"
    device = "cpu"
    dtypes = (torch.float32,)
    shapes = CPU_SHAPES
    compile_backend = "aot_eager"  # inductor on the CPU needs a C++ compiler and a minute; the graph is the point
    example_head_dim = 16  # the CPU stages are slow

    def test_the_cpu_stages_are_chosen(self, ops, library):
        q, k, v, _ = make_problem((1, 2, 2, 8, 8, 16), torch.float32, "cpu")
        forward, backward = ops.chosen_stages(q, k, v)
        assert library.stage(forward).backend == "cpu"
        assert library.stage(backward).supports("backward")

    def test_a_refusal_in_the_backward_pass_reaches_the_caller(self, ops):
        q, k, v, grad_out = make_problem((1, 2, 2, 8, 8, 16), torch.float32, "cpu")
        out = ops.attention(q.requires_grad_(), k, v, backward_stage="no_such_stage")
        with pytest.raises(ops.UnsupportedProblem, match="no_such_stage"):
            out.backward(grad_out)

    def test_the_package_offers_the_op(self, ops):
        import fa_course

        assert fa_course.attention is ops.attention
        assert {"attention", "Library", "Problem", "FaError", "UnsupportedProblem"} <= set(fa_course.__all__)

    def test_the_benchmark_runner_checks_its_tensors_with_the_ops_checks(self, ops, library):
        """fa_course.bench.torch_runner.stage_forward (a stage through the C ABI, as the benchmarks run
        it) refuses what the op refuses, a tensor of another stage's precision, and an output that
        requires grad (the library writes it in place)."""
        from fa_course.bench import torch_runner

        q, k, v, _ = make_problem((1, 4, 2, 16, 16, 32), torch.float32, "cpu")
        out, lse = torch_runner.stage_forward(library, "01_cpu", q, k, v, lse=True)
        expected_out, expected_lse = ops.attention_with_lse(q, k, v, stage="01_cpu")
        assert torch.equal(out, expected_out) and torch.equal(lse, expected_lse)
        for name, (make_arguments, error, text) in WRONG_CALLS.items():
            with pytest.raises(error, match=text):
                torch_runner.stage_forward(library, "01_cpu", *make_arguments(q, k, v))
        for written in ({"out": torch.empty_like(q).requires_grad_()},
                        {"lse": torch.empty(1, 4, 16).requires_grad_()}):
            with pytest.raises(ValueError, match="must not require grad"):
                torch_runner.stage_forward(library, "01_cpu", q, k, v, **written)
        with pytest.raises(ValueError, match="lse must have shape"):
            torch_runner.stage_forward(library, "01_cpu", q, k, v, lse=torch.empty(1, 4, 17))
        for stage in (s for s in library.stages() if s.is_cuda):
            with pytest.raises(TypeError, match=f"{stage.id} takes .* on CUDA"):
                torch_runner.stage_forward(library, stage, q, k, v)

    def test_cuda_dtypes_on_the_cpu_are_refused(self, ops):
        q = torch.zeros(1, 1, 4, 16, dtype=torch.float16)
        with pytest.raises(TypeError, match="float16 on cpu"):
            ops.attention(q, q, q)


class TestGpuOp(OpChecks):
    """The op on the GPU stages in FP16 and BF16."""

    mode = "gpu"
    device = "cuda"
    dtypes = (torch.float16, torch.bfloat16)
    shapes = GPU_SHAPES

    def test_the_fastest_forward_stage_is_chosen_and_others_can_be_named(self, ops, library):
        from fa_course import selection

        q, k, v, grad_out = make_problem((1, 4, 4, 128, 128, 64), torch.float16, "cuda")
        forward, backward = ops.chosen_stages(q, k, v)
        capability = torch.cuda.get_device_capability()
        runs_here = [s.folder for s in library.stages() if s.is_cuda and s.precision == "fp16"
                     and s.supports("lse") and not s.supports("backward")
                     and not selection.runs_on(s, "cuda", 10 * capability[0] + capability[1])]
        # Nq = 128: a prefill problem, which a decoding stage would hand to an earlier stage's kernel.
        prefill = [folder for folder in runs_here if folder not in selection.DECODE_STAGES]
        assert forward.split("/")[0] == max(prefill), "the latest forward stage that runs here"
        assert library.stage(backward).supports("backward")
        decoding = [folder for folder in runs_here if folder in selection.DECODE_STAGES]
        if decoding:  # a few query rows against many keys: the decoding stage's own kernel
            q_decode, k_decode, v_decode, _ = make_problem((1, 4, 2, 4, 1000, 64), torch.float16, "cuda")
            decode_forward, _ = ops.chosen_stages(q_decode, k_decode, v_decode)
            assert decode_forward.split("/")[0] == max(decoding)
        named = ops.attention(q, k, v, stage="08")
        chosen = ops.attention(q, k, v)
        torch.testing.assert_close(named, chosen, atol=2e-3, rtol=0)

    def test_wrong_devices_raise_clear_errors(self, ops):
        q, k, v, _ = make_problem((1, 2, 2, 16, 16, 32), torch.float16, "cuda")
        with pytest.raises(ValueError, match="one device"):
            ops.attention(q, k.cpu(), v)
        with pytest.raises(TypeError, match="float32 on CPU"):
            ops.attention(q.float(), k.float(), v.float())  # FP32 on the GPU: no stage writes an LSE

    def test_tensors_on_a_gpu_that_is_not_the_current_one(self, ops):
        """The library runs on the current device: each pass makes the tensors' current for its call.
        (Where this process sees one GPU there is no other, and the op does not ask.)"""
        def both_passes(q, k, v, grad_out):
            out, lse = ops.attention_with_lse(q, k, v, True)
            return (out,) + ops.attention_backward(grad_out, q, k, v, out, lse, True, deterministic=True)

        q, k, v, grad_out = make_problem((1, 4, 2, 64, 64, 64), torch.float16, "cuda")
        expected = both_passes(q, k, v, grad_out)
        other = torch.device("cuda", torch.cuda.device_count() - 1)
        with torch.cuda.device(0):
            moved = both_passes(*(t.to(other) for t in (q, k, v, grad_out)))
        for name, mine, theirs in zip(("O", "dQ", "dK", "dV"), moved, expected):
            assert mine.device == other, name
            torch.testing.assert_close(mine.cpu(), theirs.cpu(), msg=f"{name} on {other}")

    def test_a_head_dim_the_backward_refuses_is_an_error_not_a_crash(self, ops, library):
        dims = [s.max_dim for s in library.stages() if s.is_cuda and s.supports("backward")]
        dim = max(dims) + 8
        q, k, v, grad_out = make_problem((1, 2, 2, 32, 32, dim), torch.float16, "cuda")
        q.requires_grad_()
        with pytest.raises(ValueError, match="head dim"):
            out = ops.attention(q, k, v, causal=True)
            out.backward(grad_out)
        torch.cuda.synchronize()  # the context is still healthy

    def test_deterministic_algorithms_make_the_gradients_bitwise_repeatable(self, ops):
        # attention(..., deterministic=True), or torch.use_deterministic_algorithms(True): 11_backward's
        # dQ pass instead of atomics. Four query heads a group and six key tiles: the atomics would add
        # each dQ element in any order.
        q, k, v, grad_out = make_problem((2, 8, 2, 300, 700, 128), torch.float16, "cuda", seed=3)

        def deterministic(q, k, v, causal):
            return ops.attention(q, k, v, causal, deterministic=True)

        first = gradients(deterministic, q, k, v, grad_out, True)
        second = gradients(deterministic, q, k, v, grad_out, True)
        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            third = gradients(ops.attention, q, k, v, grad_out, True)
        finally:
            torch.use_deterministic_algorithms(previous)
        for name, a, b, c in zip(("O", "dQ", "dK", "dV"), first, second, third):
            assert torch.equal(a, b), f"{name} differs between two deterministic runs"
            assert torch.equal(a, c), f"{name}: deterministic=True and use_deterministic_algorithms differ"
        with_atomics = gradients(ops.attention, q, k, v, grad_out, True)
        for name, a, b in zip(("O", "dQ", "dK", "dV"), first, with_atomics):
            torch.testing.assert_close(a, b, msg=f"{name}: deterministic vs atomics")

    def test_cuda_graph_capture_and_replay(self, ops):
        shape = (2, 8, 2, 256, 256, 64)
        q, k, v, grad_out = make_problem(shape, torch.bfloat16, "cuda")
        static = [t.clone().requires_grad_() for t in (q, k, v)]

        def step():
            out = ops.attention(*static, causal=True)
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
        expected = gradients(ops.attention, fresh_q, fresh_k, fresh_v, grad_out, True)
        # BF16's default tolerance: a last-bit difference in dQ (FP32 atomics in no fixed order) passes
        for name, replayed, eager in zip(("O", "dQ", "dK", "dV"), captured, expected):
            torch.testing.assert_close(replayed, eager, msg=f"{name} replayed vs eager")
