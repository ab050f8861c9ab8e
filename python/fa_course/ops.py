"""The course's FlashAttention as a PyTorch operator that trains: forward and backward passes of the
stages through the C ABI (ctypes), registered with torch.library so that autograd, torch.compile (no
graph break) and CUDA graphs see an ordinary op.

    import torch, fa_course
    q = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 2, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out = fa_course.attention(q, k, v, causal=True)    # (2, 8, 1024, 64); grouped-query heads
    out.float().square().sum().backward()              # q.grad, k.grad, v.grad (stage 13 or 11)

Tensors: Q (B, Hq, Nq, D), K and V (B, Hkv, Nk, D), Hq a multiple of Hkv (query head h reads K/V
head h // (Hq / Hkv)), contiguous, all on one device: CUDA in float16 or bfloat16, or the CPU in
float32 (the course's plain C++ stages: slow, but it lets the op be tested where there is no GPU).
`causal` masks bottom-right aligned (query i sees keys 0 .. i + Nk - Nq, PyTorch's
causal_lower_right); a query row that sees no key gets O = 0. The scale is 1 / sqrt(D).

Which stages run: fa_course.selection says how they are chosen (the latest stage of the course
that runs on this GPU, writes the log-sum-exp and takes the problem; on an H100 or H200
10_overlap and 13_wgmma_backward, else 08_mma_registers and 11_backward). `stage=` and
`backward_stage=` name others ("08", "09_wgmma_tma"); `chosen_stages(...)` says what a call runs.
`deterministic=True` (or torch.use_deterministic_algorithms(True) when the backward pass runs)
makes dQ bitwise the same from run to run: the backward stage's ordered dQ pass instead of adds in no
fixed order (the READMEs of stages 11 and 13 say what it costs).

The registered ops (namespace fa_course; autograd is fa_course.attention's, around them):
  torch.ops.fa_course.attention(q, k, v, causal=False, stage="") -> (O, LSE)
      LSE is FP32 (B, Hq, Nq), the natural log of each row's softmax denominator; it is saved for
      the backward pass and is not differentiable.
  torch.ops.fa_course.attention_backward(grad_out, q, k, v, out, lse, causal=False, stage="",
      deterministic=False) -> (dQ, dK, dV); dK and dV summed over each K/V head's query heads.

The cost of a call: what does not change between calls with tensors of the same shapes, dtype
and device (the checks' verdict, the stages chosen, their workspace sizes, the C problem struct
and the argument structs but for their addresses) is worked out on the first such call and kept (a
Plan); later calls allocate O, the LSE, the gradients and the workspace as torch tensors from
PyTorch's caching allocator on the current stream (so a CUDA graph captures them: the library
allocates nothing) and call the library.
An eager call on plain tensors goes straight to the ops' implementation (_straight says when),
skipping the dispatcher's round trip: through the C++ node (fa_course.node; its autograd node where
the call needs gradients) where one was built for this PyTorch and Python, else in Python here.
Elsewhere autograd is _Attention, an autograd.Function around the ops (cheaper than an autograd
kernel on them), and torch.compile, fake tensors and dispatch modes see the ops.

Errors: a tensor on the wrong device, of the wrong dtype, non-contiguous or of mismatched shapes
raises TypeError or ValueError before anything runs; a problem no stage takes (a head dim past a
stage's maximum) raises UnsupportedProblem (a ValueError) with the library's reason; a failure
inside the library raises FaError (a RuntimeError) with its message.

Importing this module imports torch (2.4 or newer) and registers the ops; `import fa_course` does
when PyTorch is installed.
"""

import contextlib
import ctypes
import threading
from typing import Dict, Optional, Tuple

import torch

from . import capi, node
from .problem import Problem
from .selection import UnsupportedProblem, choose_stage

if not hasattr(torch.library, "register_fake"):
    raise ImportError(f"fa_course.attention needs PyTorch 2.4 or newer (torch.library.register_fake); this is "
                      f"{torch.__version__}")

NAMESPACE = "fa_course"
# (the tensors' device type, their dtype) -> the precision (fa_stage_precision) of the stages that take them
DTYPES = {
    ("cuda", torch.float16): "fp16",
    ("cuda", torch.bfloat16): "bf16",
    ("cpu", torch.float32): "fp32",
}


# ---- the checks, written once (the fake tensors of torch.compile have all they read) -------------
# The op's, fa_course.fp8's and the benchmark runner's (fa_course.bench.torch_runner.stage_forward).


def check_inputs(q, k, v, causal: bool = False, *, who: str = "fa_course.attention", dtypes=None,
                 current_device: bool = False) -> Problem:
    """The problem of q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D); TypeError or ValueError, saying
    what is wrong, unless they are tensors that `who` takes: of one of `dtypes`' (device type,
    dtype) pairs (DTYPES when None; fa_course.fp8 and stage_forward pass their own) and, with
    `current_device`, on the current CUDA device when on one (for a caller that does not make
    theirs current, as the op does)."""
    dtypes = DTYPES if dtypes is None else dtypes
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{who}: {name} must be a torch.Tensor, not {type(tensor).__name__}")
        if tensor.dim() != 4:
            raise ValueError(f"{who}: {name} must be 4-D (batch, heads, seq, dim), not "
                             f"{tuple(tensor.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{who}: q, k and v must be on one device, not {q.device}, {k.device} and "
                         f"{v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{who}: q, k and v must have one dtype, not {q.dtype}, {k.dtype} and {v.dtype}")
    if (q.device.type, q.dtype) not in dtypes:
        takes = ", ".join(f"{dtype} on {device.upper()}" for device, dtype in dtypes)
        raise TypeError(f"{who} takes {takes}; the tensors are {q.dtype} on {q.device}")
    if current_device and q.device.type == "cuda" and q.device.index not in (None, torch.cuda.current_device()):
        raise ValueError(f"{who}: the tensors are on {q.device}, but the current device is "
                         f"cuda:{torch.cuda.current_device()} (make theirs current: torch.cuda.device(...))")
    if k.shape != v.shape:
        raise ValueError(f"{who}: k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"{who}: q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head dim")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"{who}: q's {q.shape[1]} heads are not a multiple of k's {k.shape[1]} "
                         f"(grouped-query attention needs Hq = G * Hkv)")
    if q.numel() == 0 or k.numel() == 0:
        raise ValueError(f"{who}: empty tensors: q {tuple(q.shape)}, k {tuple(k.shape)}")
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not tensor.is_contiguous():
            raise ValueError(f"{who}: {name} is not contiguous (stride {tuple(tensor.stride())}); the "
                             f"layout is (batch, heads, seq, dim) with dim fastest: call .contiguous()")
    batch, q_heads, q_seq, dim = (int(x) for x in q.shape)
    return Problem(batch, q_heads, int(k.shape[1]), q_seq, int(k.shape[2]), dim, bool(causal))


def check_output(name: str, tensor, shape, dtype, device, *, who: str = "fa_course.attention",
                 written: bool = False) -> None:
    """TypeError or ValueError unless `tensor` is a contiguous `dtype` tensor of `shape` on `device`
    and, when the library writes it in place (`written`), one that does not require grad (autograd
    would not see the write)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{who}: {name} must be a torch.Tensor, not {type(tensor).__name__}")
    if tensor.dtype != dtype or tensor.device != device:
        raise TypeError(f"{who}: {name} must be {dtype} on {device}, not {tensor.dtype} on {tensor.device}")
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{who}: {name} must have shape {tuple(shape)}, not {tuple(tensor.shape)}")
    if not tensor.is_contiguous():
        raise ValueError(f"{who}: {name} is not contiguous")
    if written and tensor.requires_grad:
        raise ValueError(f"{who}: {name} is written in place and must not require grad")


def check_saved(grad_out, q, out, lse) -> None:
    """The backward pass's own tensors: dO and O shaped like q, the LSE FP32 (B, Hq, Nq)."""
    check_output("grad_out", grad_out, q.shape, q.dtype, q.device)
    check_output("out", out, q.shape, q.dtype, q.device)
    check_output("lse", lse, q.shape[:3], torch.float32, q.device)


# ---- what runs, worked out once per kind of call ----------------------------------------------


def on_device(device):
    """The tensors' CUDA device made the current one (the library runs on the current device and
    refuses pointers of another); nothing for CPU tensors."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


try:  # the raw cudaStream_t of the current stream, as torch.compile's generated code reads it
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # a PyTorch without CUDA
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


class Plan:
    """Everything about a call that its tensors' shapes, dtype and device decide: the problem, the
    stages each pass runs and their workspace sizes, the C problem struct. Made by plan_for."""

    def __init__(self, library: capi.Library, problem: Problem, device: torch.device, dtype):
        self.library = library
        self.problem = problem
        self.device = device
        self.device_index = device.index if device.type == "cuda" else None
        self.capability = _capability(self.device_index) if device.type == "cuda" else 0
        # Where this process sees one GPU, the current device is the tensors' (there is no other):
        # calls then skip asking for it (torch.cuda.current_device() is a Python call of its own).
        self.device_may_differ = self.device_index is not None and torch.cuda.device_count() > 1
        self.precision = DTYPES[(device.type, dtype)]
        self.lse_shape = problem.lse_shape
        self.problem_pointer = ctypes.pointer(capi.FaProblem.of(problem))
        # The argument structs with the size and the problem set: a call fills in the addresses of a
        # copy (cheaper than a struct built field by field; the copy holds the problem's address,
        # and this Plan keeps the problem alive)
        self.forward_args = capi.FaForwardArgs(ctypes.sizeof(capi.FaForwardArgs), self.problem_pointer)
        self.backward_args = capi.FaBackwardArgs(ctypes.sizeof(capi.FaBackwardArgs), self.problem_pointer)
        self._stages: Dict[Tuple[str, str], Tuple[capi.Stage, bytes, int]] = {}
        self._node_plans: Dict[Tuple[str, str], Tuple[int, bool, object]] = {}

    def stage(self, pass_: str, requested: str) -> Tuple[capi.Stage, bytes, int]:
        """(stage, its id as bytes, its workspace bytes) for `pass_` ('fwd' or 'bwd'), the automatic
        choice or the one `requested`; chosen on the first call that needs it, so a forward-only
        caller is never refused for the backward pass."""
        chosen = self._stages.get((pass_, requested))
        if chosen is None:
            stage = choose_stage(self.library, pass_, self.device.type, self.precision, self.problem, self.capability,
                                 requested or None)
            chosen = (stage, stage.id.encode(), self.library.workspace_bytes(stage.id, self.problem, pass_))
            self._stages[(pass_, requested)] = chosen
        return chosen

    def node_plan(self, requested: str, backward_requested: str):
        """(the address of the C++ node's copy of this plan for these stage requests, whether a stage runs
        its backward pass, the copy itself: node.make_plan), made once and kept with this plan. Where no
        stage runs the backward pass, a call that needs gradients runs the Python Function, which
        refuses when the backward pass runs, as it always has."""
        key = (requested, backward_requested)
        found = self._node_plans.get(key)
        if found is None:
            _, forward_id, forward_bytes = self.stage("fwd", requested)
            try:
                _, backward_id, backward_bytes = self.stage("bwd", backward_requested)
            except UnsupportedProblem:
                backward_id, backward_bytes = b"", 0
            kept, address = node.make_plan(self.library, self.problem_pointer, forward_id, backward_id, forward_bytes,
                                           backward_bytes)
            found = (address, bool(backward_id), kept)
            self._node_plans[key] = found
        return found

    def elsewhere(self) -> bool:
        """Whether the tensors are on a CUDA device other than the current one (the call then makes
        theirs current: the library runs on the current device)."""
        return self.device_may_differ and torch.cuda.current_device() != self.device_index

    def stream(self) -> Optional[int]:
        return _raw_stream(self.device_index) if self.device_index is not None else None

    def workspace(self, size: int):
        return torch.empty(size, dtype=torch.uint8, device=self.device) if size else None


_capabilities: Dict[int, int] = {}


def _capability(device_index: int) -> int:
    if device_index not in _capabilities:
        major, minor = torch.cuda.get_device_capability(device_index)
        _capabilities[device_index] = 10 * major + minor
    return _capabilities[device_index]


_plans: Dict[tuple, Plan] = {}
_plans_lock = threading.Lock()
# Plans kept at most (a few hundred bytes each); past that they are made afresh, as on a first call.
MAX_PLANS = 4096


def plan_for(q, k, v, causal: bool) -> Plan:
    """The Plan of a call on these tensors: kept per (shapes, dtypes, q's device, causal), so the
    checks run once for each. What the key does not hold is checked at every call: k and v on q's
    device (two comparisons cost less than two more devices hashed in the key), and contiguity."""
    device = q.device
    key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, device, causal)
    plan = _plans.get(key)
    if (plan is not None and k.device == device and v.device == device and q.is_contiguous() and k.is_contiguous()
            and v.is_contiguous()):
        return plan
    problem = check_inputs(q, k, v, causal)  # raises for a call that failed the per-call checks above
    if plan is None:
        with _plans_lock:
            plan = _plans.get(key)
            if plan is None:
                if len(_plans) >= MAX_PLANS:
                    _plans.clear()
                plan = Plan(capi.load(), problem, device, q.dtype)
                _plans[key] = plan
    return plan


def chosen_stages(q, k, v, causal: bool = False, stage: Optional[str] = None,
                  backward_stage: Optional[str] = None) -> Tuple[str, str]:
    """(forward stage id, backward stage id) that attention(q, k, v, ...) runs; UnsupportedProblem
    when no stage takes the problem in either pass (the op itself finds out about the backward pass
    only when it runs it: call this first to refuse a training step before its forward pass)."""
    plan = plan_for(q, k, v, bool(causal))
    return plan.stage("fwd", stage or "")[0].id, plan.stage("bwd", backward_stage or "")[0].id


# ---- the ops ---------------------------------------------------------------------------------------

_library = torch.library.Library(NAMESPACE, "DEF")
_library.define("attention(Tensor q, Tensor k, Tensor v, bool causal=False, str stage=\"\") -> (Tensor, Tensor)")
_library.define("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                "bool causal=False, str stage=\"\", bool deterministic=False) -> (Tensor, Tensor, Tensor)")


def _forward(q, k, v, causal=False, stage=""):
    """(O, LSE) of the chosen forward stage."""
    return _forward_planned(plan_for(q, k, v, causal), q, k, v, stage)


def _forward_planned(plan, q, k, v, stage, with_lse=True):
    """(O, LSE); with_lse False: (O, None), the LSE neither allocated nor written (a forward call
    without gradients that returns O alone)."""
    if plan.elsewhere():
        with torch.cuda.device(plan.device_index):
            return _forward_planned(plan, q, k, v, stage, with_lse)
    _, stage_id, workspace_bytes = plan.stage("fwd", stage)
    out = torch.empty_like(q)
    # the sizes one by one: PyTorch parses them faster than a tuple (about 0.8 us a call on a slow CPU)
    lse = torch.empty(*plan.lse_shape, dtype=torch.float32, device=plan.device) if with_lse else None
    workspace = plan.workspace(workspace_bytes)
    args = capi.FaForwardArgs.from_buffer_copy(plan.forward_args)
    args.q, args.k, args.v, args.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    if with_lse:
        args.lse = lse.data_ptr()
    args.workspace = workspace.data_ptr() if workspace is not None else None
    args.stream = plan.stream()
    plan.library.call_forward(stage_id, args)
    return out, lse


def _backward(grad_out, q, k, v, out, lse, causal=False, stage="", deterministic=False, saved_by_us=False):
    """(dQ, dK, dV) of the chosen backward stage from the forward's O and LSE and the gradient dO.
    `saved_by_us`: O and LSE are the forward's own and dO autograd's, made contiguous (_Attention),
    so their checks would only repeat what holds by construction."""
    plan = plan_for(q, k, v, causal)
    if plan.elsewhere():
        with torch.cuda.device(plan.device_index):
            return _backward(grad_out, q, k, v, out, lse, causal, stage, deterministic, saved_by_us)
    if not saved_by_us:
        check_saved(grad_out, q, out, lse)
    _, stage_id, workspace_bytes = plan.stage("bwd", stage)
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    workspace = plan.workspace(workspace_bytes)
    args = capi.FaBackwardArgs.from_buffer_copy(plan.backward_args)
    args.q, args.k, args.v, args.o, args.lse = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr()
    args.grad_o, args.grad_q = grad_out.data_ptr(), grad_q.data_ptr()
    args.grad_k, args.grad_v = grad_k.data_ptr(), grad_v.data_ptr()
    args.workspace = workspace.data_ptr() if workspace is not None else None
    args.stream = plan.stream()
    args.deterministic = int(deterministic)
    plan.library.call_backward(stage_id, args)
    return grad_q, grad_k, grad_v


# What _straight asks at every eager call, looked up once (torch.compile knows these functions as
# themselves, whatever the name they are called by)
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_torch_function_mode_enabled = torch._C._is_torch_function_mode_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _straight(q, k, v) -> bool:
    """Whether a call may go straight to the implementation above instead of through the dispatcher,
    which would only route it there: eager PyTorch (not torch.compile's tracing) on plain tensors
    (not fake, functional or other subclasses, not meta) with no torch-function or dispatch mode
    active (a profiler's, FakeTensorMode). Anything else takes the registered op."""
    return (type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor and not q.is_meta
            and not _is_compiling() and not _torch_function_mode_enabled() and not _dispatch_modes())


for _device in ("CPU", "CUDA"):
    _library.impl("attention", _forward, _device)
    _library.impl("attention_backward", _backward, _device)


@torch.library.register_fake(f"{NAMESPACE}::attention", lib=_library)
def _forward_fake(q, k, v, causal=False, stage=""):
    check_inputs(q, k, v, causal)
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.register_fake(f"{NAMESPACE}::attention_backward", lib=_library)
def _backward_fake(grad_out, q, k, v, out, lse, causal=False, stage="", deterministic=False):
    check_inputs(q, k, v, causal)
    check_saved(grad_out, q, out, lse)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def backward_is_deterministic(requested: bool) -> bool:
    """Whether a backward pass about to run makes dQ bitwise repeatable: asked for by the call, or
    by torch.use_deterministic_algorithms(True) in force now (the op's and fa_course.ring's rule)."""
    return requested or torch.are_deterministic_algorithms_enabled()


class _Attention(torch.autograd.Function):
    """Autograd around the two ops (cheaper per call than an autograd kernel registered on the op).
    `with_lse`: the LSE is an output too (attention_with_lse); otherwise O alone, which saves autograd
    an output to wrap."""

    @staticmethod
    def forward(ctx, q, k, v, causal, stage, backward_stage, deterministic, with_lse):
        ctx.set_materialize_grads(False)  # the LSE's gradient is never read: no zeros made for it
        out, lse = _forward(q, k, v, causal, stage) if _straight(q, k, v) else \
            torch.ops.fa_course.attention.default(q, k, v, causal, stage)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        ctx.backward_stage = backward_stage
        ctx.deterministic = deterministic
        if not with_lse:
            return out
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, *_grad_lse):
        if grad_out is None:  # O got no gradient (a Function below it gave none): none to pass on
            return None, None, None, None, None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        deterministic = backward_is_deterministic(ctx.deterministic)
        # dO arrives in whatever layout the graph above made (sum().backward() gives an expanded one)
        if _straight(q, k, v):
            grad_q, grad_k, grad_v = _backward(grad_out.contiguous(), q, k, v, out, lse, ctx.causal,
                                               ctx.backward_stage, deterministic, saved_by_us=True)
        else:
            grad_q, grad_k, grad_v = torch.ops.fa_course.attention_backward.default(
                grad_out.contiguous(), q, k, v, out, lse, ctx.causal, ctx.backward_stage, deterministic)
        return grad_q, grad_k, grad_v, None, None, None, None, None


def _attention(q, k, v, causal, stage, backward_stage, deterministic, with_lse):
    """attention (with_lse False: O) and attention_with_lse (True: O and the LSE)."""
    if not (isinstance(q, _Tensor) and isinstance(k, _Tensor) and isinstance(v, _Tensor)):
        check_inputs(q, k, v)  # says which is not a tensor
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if _straight(q, k, v):
        plan = plan_for(q, k, v, bool(causal))
        module = node.module_for(plan.library)
        if module is not None:
            address, has_backward, _ = plan.node_plan(stage or "", backward_stage or "")
            if not needs_grad:
                return _node_result(module.forward(q, k, v, address, with_lse))
            if has_backward:
                return _node_result(module.attention(q, k, v, address, bool(deterministic), with_lse))
        elif not needs_grad:
            out, lse = _forward_planned(plan, q, k, v, stage or "", with_lse)
            return (out, lse) if with_lse else out
    if needs_grad:
        return _Attention.apply(q, k, v, bool(causal), stage or "", backward_stage or "", bool(deterministic),
                                with_lse)
    out, lse = torch.ops.fa_course.attention.default(q, k, v, bool(causal), stage or "")
    return (out, lse) if with_lse else out


def _node_result(result):
    """What a call of the C++ node returned: its outputs, or, where it failed, its message raised as the
    error it stands for (an FaError for a failure of the library)."""
    if result.__class__ is str:
        raise node.library_error(result)
    return result


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                       stage: Optional[str] = None, backward_stage: Optional[str] = None,
                       deterministic: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE): attention (below) and the FP32 log-sum-exp (B, Hq, Nq), which is not differentiable."""
    return _attention(q, k, v, causal, stage, backward_stage, deterministic, True)


def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, causal: bool = False, stage: Optional[str] = None,
                       deterministic: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) from the forward's O and LSE (attention_with_lse) and the gradient dO: the backward
    pass alone, for callers that run their own autograd (fa_course.ring)."""
    if _straight(q, k, v):
        return _backward(grad_out, q, k, v, out, lse, bool(causal), stage or "", bool(deterministic))
    return torch.ops.fa_course.attention_backward.default(grad_out, q, k, v, out, lse, bool(causal), stage or "",
                                                          bool(deterministic))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, *,
              stage: Optional[str] = None, backward_stage: Optional[str] = None,
              deterministic: bool = False) -> torch.Tensor:
    """softmax(Q K^T / sqrt(D)) V through the course's stages, differentiable in q, k and v.

    q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D), contiguous: float16 or bfloat16 on a CUDA GPU, or
    float32 on the CPU. `causal`: the bottom-right aligned mask. `stage`, `backward_stage`: run these
    instead of the automatic choice (a stage id, folder or number). `deterministic`: dQ bitwise the
    same from run to run (also when torch.use_deterministic_algorithms(True) is in force when the
    backward pass runs). Raises TypeError or ValueError for a tensor it does not take,
    UnsupportedProblem when no stage takes the problem, FaError when the library fails."""
    return _attention(q, k, v, causal, stage, backward_stage, deterministic, False)


__all__ = ["attention", "attention_with_lse", "attention_backward", "chosen_stages", "check_inputs", "check_output",
           "UnsupportedProblem", "NAMESPACE", "DTYPES"]
