// fa_course.attention's eager calls in C++: what a call does once Python has chosen its stages
// (fa_course/ops.py, Plan): allocate O, the LSE and the workspace, call the C ABI, and, where the
// call needs gradients, an autograd node that saves what the backward pass reads and in the backward
// pass allocates dQ, dK, dV and calls the C ABI again. Written as a Python autograd.Function, a
// forward and backward pass cost 48-134 µs more host time on an H200 (python/README.md, "The cost
// of a call"): autograd calls back into Python for every backward pass. Built beside libfa_capi.so
// where CMake finds PyTorch (python/CMakeLists.txt), for exactly that PyTorch and that Python; ops.py
// runs its Python code where there is none.
//
// The file is two things at once: a torch library (the Plan class, made through torch.ops once per
// kind of call) and a Python extension module, fa_torch_node, whose two functions are what a call
// runs: a pybind11 call costs a few µs less host time than one through torch.ops's dispatcher, and
// at the shapes where the GPU waits for the host that is the op's whole overhead. A failure comes
// back as its message (a str), which the Python side raises as the error it stands for
// (fa_course.node.library_error).
//
// The library is the one Python loaded: its fa_forward_v2, fa_backward_v2 and fa_last_error come
// in as addresses with the plan, so this file includes the C ABI's header and links nothing of it.
#include <ATen/Context.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/autograd.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "fa_capi.h"

namespace {

using ForwardCall = int (*)(const char*, const fa_forward_args*);
using BackwardCall = int (*)(const char*, const fa_backward_args*);
using LastErrorCall = const char* (*)();

// One kind of call (shapes, dtype, device, mask, stages), made once by ops.py's Plan. Held by
// reference count: by the Python Plan (a torch ScriptObject), and by every autograd node that still
// has to run its backward pass. A call names it by its address (plan_address): cheaper to pass
// than the ScriptObject, and alive for the call, which the Python Plan outlives.
struct NodePlan : torch::CustomClassHolder {
  fa_problem problem{};
  std::string forward_stage;
  std::string backward_stage;  // empty: no stage runs the backward pass (a forward-only plan)
  int64_t forward_workspace = 0;
  int64_t backward_workspace = 0;
  ForwardCall forward = nullptr;
  BackwardCall backward = nullptr;
  LastErrorCall last_error = nullptr;
  int64_t lse_shape[3] = {};  // (B, Hq, Nq)
};

c10::intrusive_ptr<NodePlan> make_plan(int64_t problem, std::string forward_stage, std::string backward_stage,
                                       int64_t forward_workspace, int64_t backward_workspace, int64_t forward,
                                       int64_t backward, int64_t last_error) {
  auto plan = c10::make_intrusive<NodePlan>();
  plan->problem = *reinterpret_cast<const fa_problem*>(problem);
  plan->forward_stage = std::move(forward_stage);
  plan->backward_stage = std::move(backward_stage);
  plan->forward_workspace = forward_workspace;
  plan->backward_workspace = backward_workspace;
  plan->forward = reinterpret_cast<ForwardCall>(forward);
  plan->backward = reinterpret_cast<BackwardCall>(backward);
  plan->last_error = reinterpret_cast<LastErrorCall>(last_error);
  plan->lse_shape[0] = plan->problem.batch;
  plan->lse_shape[1] = plan->problem.q_heads;
  plan->lse_shape[2] = plan->problem.q_seq;
  return plan;
}

int64_t plan_address(const c10::intrusive_ptr<NodePlan>& plan) { return reinterpret_cast<int64_t>(plan.get()); }

c10::intrusive_ptr<NodePlan> plan_at(int64_t address) {
  return c10::intrusive_ptr<NodePlan>::reclaim_copy(reinterpret_cast<NodePlan*>(address));
}

// The current stream of the tensors' device (what PyTorch's own ops run on), or null for the CPU.
void* current_stream(const at::Tensor& tensor) {
  if (!tensor.is_cuda()) return nullptr;
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(tensor.device()).native_handle();
}

at::Tensor workspace(const at::Tensor& like, int64_t bytes) {
  return bytes > 0 ? at::empty({bytes}, like.options().dtype(at::kByte)) : at::Tensor();
}

// The message ops.py turns back into an FaError (status, stage, call) where a library call fails.
std::string failure_message(const char* call, const std::string& stage, int status, LastErrorCall last_error) {
  return std::string(call) + "('" + stage + "'): status " + std::to_string(status) + ": " + last_error();
}

// O and, where `with_lse`, the LSE (a training call's, which the backward pass reads), or the
// library's failure: the forward stage run on q's device and its current stream.
struct ForwardResult {
  at::Tensor out;
  at::Tensor lse;
  std::string failure;  // empty where the library ran
};

ForwardResult run_forward(const NodePlan& plan, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          bool with_lse) {
  const c10::DeviceGuard on_device(q.device());  // the library runs on the current device
  at::Tensor out = at::empty_like(q);
  at::Tensor lse = with_lse ? at::empty(plan.lse_shape, q.options().dtype(at::kFloat)) : at::Tensor();
  const at::Tensor forward_workspace = workspace(q, plan.forward_workspace);
  fa_forward_args args;
  fa_init_forward_args(&args);
  args.problem = &plan.problem;
  args.q = q.data_ptr();
  args.k = k.data_ptr();
  args.v = v.data_ptr();
  args.o = out.data_ptr();
  args.lse = with_lse ? lse.data_ptr<float>() : nullptr;
  args.workspace = forward_workspace.defined() ? forward_workspace.data_ptr() : nullptr;
  args.stream = current_stream(q);
  const int status = plan.forward(plan.forward_stage.c_str(), &args);
  if (status != FA_OK) return {{}, {}, failure_message("fa_forward", plan.forward_stage, status, plan.last_error)};
  return {out, lse, {}};
}

// A failure of the forward pass is returned, not thrown: on the lent H200 (GCC 13, PyTorch 2.11) a
// library refusal raised here with TORCH_CHECK (a c10::Error) ended the process in a segmentation
// fault, so nothing here makes one. The backward pass, which autograd runs, can only throw: a
// std::runtime_error, which the same machine raised as a RuntimeError.
struct Attention : torch::autograd::Function<Attention> {
  // Where the library fails: an empty output (autograd takes no undefined one), and the message in
  // `failure`.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, int64_t plan_address,
                                                bool deterministic, bool with_lse, std::string* failure) {
    const c10::intrusive_ptr<NodePlan> plan = plan_at(plan_address);
    ForwardResult result = run_forward(*plan, q, k, v, true);
    if (!result.failure.empty()) {
      *failure = std::move(result.failure);
      return {at::empty({0}, q.options())};
    }
    ctx->set_materialize_grads(false);  // the LSE's gradient is never read: no zeros made for it
    ctx->save_for_backward({q, k, v, result.out, result.lse});
    ctx->saved_data["plan"] = plan;
    ctx->saved_data["deterministic"] = deterministic;
    if (!with_lse) return {result.out};
    ctx->mark_non_differentiable({result.lse});
    return {result.out, result.lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list none(7);
    if (!grads[0].defined()) return none;  // O got no gradient: none to pass on
    const auto plan = ctx->saved_data["plan"].toCustomClass<NodePlan>();
    if (plan->backward_stage.empty()) throw std::runtime_error("fa_course.attention: no stage runs this backward pass");
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const c10::DeviceGuard on_device(q.device());
    // dO arrives in whatever layout the graph above made (sum().backward() gives an expanded one)
    const at::Tensor grad_out = grads[0].contiguous();
    at::Tensor grad_q = at::empty_like(q);
    at::Tensor grad_k = at::empty_like(k);
    at::Tensor grad_v = at::empty_like(v);
    const at::Tensor backward_workspace = workspace(q, plan->backward_workspace);
    fa_backward_args args;
    fa_init_backward_args(&args);
    args.problem = &plan->problem;
    args.q = q.data_ptr();
    args.k = k.data_ptr();
    args.v = v.data_ptr();
    args.o = out.data_ptr();
    args.grad_o = grad_out.data_ptr();
    args.lse = lse.data_ptr<float>();
    args.grad_q = grad_q.data_ptr();
    args.grad_k = grad_k.data_ptr();
    args.grad_v = grad_v.data_ptr();
    args.workspace = backward_workspace.defined() ? backward_workspace.data_ptr() : nullptr;
    args.stream = current_stream(q);
    // ops.backward_is_deterministic's rule: asked for by the call, or torch.use_deterministic_algorithms
    args.deterministic = ctx->saved_data["deterministic"].toBool() || at::globalContext().deterministicAlgorithms();
    const int status = plan->backward(plan->backward_stage.c_str(), &args);
    if (status != FA_OK)
      throw std::runtime_error(failure_message("fa_backward", plan->backward_stage, status, plan->last_error));
    return {grad_q, grad_k, grad_v, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The two calls of the module: O, or (O, LSE) where `with_lse`; a str, the failure's message, where
// the library fails (or PyTorch throws: an allocation it refuses).
pybind11::object result_or_message(const at::Tensor& out, const at::Tensor& lse, const std::string& failure) {
  if (!failure.empty()) return pybind11::str(failure);
  if (!lse.defined()) return pybind11::cast(out);
  return pybind11::make_tuple(out, lse);
}

// A call's result, or the message of what PyTorch or the library threw while making it (an
// allocation PyTorch refuses): returned as a str like a library failure, never raised from here.
template <typename Call>
pybind11::object result_or_thrown_message(Call&& call) {
  try {
    return call();
  } catch (const c10::Error& error) {
    return pybind11::str(error.what_without_backtrace());
  } catch (const std::exception& error) {
    return pybind11::str(error.what());
  }
}

// A call without gradients: no autograd node, and no LSE unless asked for.
pybind11::object forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t plan, bool with_lse) {
  return result_or_thrown_message([&] {
    const ForwardResult result = run_forward(*plan_at(plan), q, k, v, with_lse);
    return result_or_message(result.out, result.lse, result.failure);
  });
}

// A call that needs gradients: the outputs of the autograd node (Attention) it makes.
pybind11::object attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t plan,
                           bool deterministic, bool with_lse) {
  return result_or_thrown_message([&] {
    std::string failure;
    const torch::autograd::variable_list outputs = Attention::apply(q, k, v, plan, deterministic, with_lse, &failure);
    return result_or_message(outputs[0], with_lse && failure.empty() ? outputs[1] : at::Tensor(), failure);
  });
}

}  // namespace

// The plan class, made once per kind of call through torch.ops (ops.py keeps it).
TORCH_LIBRARY(fa_course_node, m) {
  m.class_<NodePlan>("Plan");
  m.def(
      "make_plan(int problem, str forward_stage, str backward_stage, int forward_workspace, "
      "int backward_workspace, int forward_call, int backward_call, int last_error_call) "
      "-> __torch__.torch.classes.fa_course_node.Plan",
      &make_plan);
  m.def("plan_address(__torch__.torch.classes.fa_course_node.Plan plan) -> int", &plan_address);
}

// The calls: plain tensors that ops.py has checked, the plan's address (plan_address).
PYBIND11_MODULE(fa_torch_node, module) {
  module.def("forward", &forward, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("plan"),
             pybind11::arg("with_lse"));
  module.def("attention", &attention, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("plan"),
             pybind11::arg("deterministic"), pybind11::arg("with_lse"));
}
