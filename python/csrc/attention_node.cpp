// fa_course.attention's autograd node in C++: what a call does once Python has chosen its stages
// (fa_course/ops.py, Plan): allocate O, the LSE and the workspace, call the C ABI, save what the
// backward pass reads, and in the backward pass allocate dQ, dK, dV and call the C ABI again.
// ops.py runs it for eager calls that need gradients. Written as a Python autograd.Function, a
// forward and backward pass cost 48-134 µs more host time on an H200 (python/README.md, "The cost
// of a call"): autograd calls back into Python for every backward pass. Built beside libfa_capi.so
// where CMake finds PyTorch (python/CMakeLists.txt), for exactly that PyTorch version; ops.py runs
// its Python Function where there is none.
//
// The library is the one Python loaded: its fa_forward_v2, fa_backward_v2 and fa_last_error come
// in as addresses with the plan, so this file includes the C ABI's header and links nothing of it.
#include <ATen/Context.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstdint>
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

// The message ops.py turns back into an FaError (status, stage, call) where the forward pass fails.
[[noreturn]] void fail(const char* call, const std::string& stage, int status, LastErrorCall last_error) {
  TORCH_CHECK(false, call, "('", stage, "'): status ", status, ": ", last_error());
}

struct Attention : torch::autograd::Function<Attention> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, int64_t plan_address,
                                                bool deterministic, bool with_lse) {
    const c10::intrusive_ptr<NodePlan> plan = plan_at(plan_address);
    const c10::DeviceGuard on_device(q.device());  // the library runs on the current device
    at::Tensor out = at::empty_like(q);
    at::Tensor lse = at::empty(plan->lse_shape, q.options().dtype(at::kFloat));
    const at::Tensor forward_workspace = workspace(q, plan->forward_workspace);
    fa_forward_args args;
    fa_init_forward_args(&args);
    args.problem = &plan->problem;
    args.q = q.data_ptr();
    args.k = k.data_ptr();
    args.v = v.data_ptr();
    args.o = out.data_ptr();
    args.lse = lse.data_ptr<float>();
    args.workspace = forward_workspace.defined() ? forward_workspace.data_ptr() : nullptr;
    args.stream = current_stream(q);
    const int status = plan->forward(plan->forward_stage.c_str(), &args);
    if (status != FA_OK) fail("fa_forward", plan->forward_stage, status, plan->last_error);
    ctx->set_materialize_grads(false);  // the LSE's gradient is never read: no zeros made for it
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["plan"] = plan;
    ctx->saved_data["deterministic"] = deterministic;
    if (!with_lse) return {out};
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list none(6);
    if (!grads[0].defined()) return none;  // O got no gradient: none to pass on
    const auto plan = ctx->saved_data["plan"].toCustomClass<NodePlan>();
    TORCH_CHECK(!plan->backward_stage.empty(), "fa_course.attention: no stage runs this backward pass");
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
    if (status != FA_OK) fail("fa_backward", plan->backward_stage, status, plan->last_error);
    return {grad_q, grad_k, grad_v, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t plan, bool deterministic) {
  return Attention::apply(q, k, v, plan, deterministic, false)[0];
}

std::tuple<at::Tensor, at::Tensor> attention_with_lse(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                      int64_t plan, bool deterministic) {
  torch::autograd::variable_list outputs = Attention::apply(q, k, v, plan, deterministic, true);
  return {outputs[0], outputs[1]};
}

}  // namespace

// The ops take plain tensors that ops.py has checked. Defined with a function, each is a composite
// kernel: the dispatcher calls it under every key, autograd's too, and the node records the graph.
TORCH_LIBRARY(fa_course_node, m) {
  m.class_<NodePlan>("Plan");
  m.def(
      "make_plan(int problem, str forward_stage, str backward_stage, int forward_workspace, "
      "int backward_workspace, int forward_call, int backward_call, int last_error_call) "
      "-> __torch__.torch.classes.fa_course_node.Plan",
      &make_plan);
  m.def("plan_address(__torch__.torch.classes.fa_course_node.Plan plan) -> int", &plan_address);
  m.def("attention(Tensor q, Tensor k, Tensor v, int plan, bool deterministic) -> Tensor", &attention);
  m.def("attention_with_lse(Tensor q, Tensor k, Tensor v, int plan, bool deterministic) -> (Tensor, Tensor)",
        &attention_with_lse);
}
