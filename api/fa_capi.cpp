// The C ABI of fa_capi.h: looks the stage up in the registry, checks everything a caller from
// another language can get wrong (it cannot see our C++ types), and calls the stage's forward or
// backward pass. No exception and no CUDA error escapes: each becomes a status code and
// fa_last_error().
//
// Every call goes through the same steps, in this order, so that what needs no GPU is decided
// without one:
//   1. the stage id and the size-prefixed structs (read_struct: FA_INVALID_ARGUMENT, or
//      FA_UNSUPPORTED for a nonzero field past what this library knows);
//   2. the problem against the stage (fa::unsupported_reason, the harness's one place for it):
//      FA_INVALID_SHAPE when validate_problem refuses a size, FA_UNSUPPORTED for a feature the
//      stage does not have (causal, GQA, Nq != Nk, the LSE, the backward pass);
//   3. NULL pointers (FA_INVALID_ARGUMENT);
//   4. the GPU (CUDA stages): none is FA_CUDA_ERROR, a wrong architecture FA_UNSUPPORTED;
//   5. where each pointer lives (host or device, and which device): FA_INVALID_ARGUMENT;
//   6. the stage itself: its Status becomes FA_OK, FA_UNSUPPORTED or FA_CUDA_ERROR.
// The FP8 calls (fa_fp8_*: stage 14, which is no stage of the registry) take the same steps, with
// the problem checked against stage 14's limits and the GPU against its one architecture, sm_90.
#include "fa_capi.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "fa/cli.hpp"
#include "fa/cuda_check.hpp"
#include "fa/deterministic.hpp"
#include "fa/device.hpp"
#include "fa/metrics.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa/stages.hpp"

#if FA_CAPI_FP8
#include "fp8_attention.hpp"
#include "fp8_numerics.hpp"
#include "quantize.hpp"
#endif

// The layouts the header documents (LP64). A failure here means the header changed a layout that
// callers (ctypes mirrors included) depend on.
static_assert(sizeof(fa_problem) == FA_PROBLEM_SIZE_V2, "fa_problem changed size");
static_assert(offsetof(fa_problem, batch) == 8 && offsetof(fa_problem, dim) == 48 && offsetof(fa_problem, causal) == 56,
              "fa_problem changed layout");
static_assert(sizeof(fa_forward_args) == FA_FORWARD_ARGS_SIZE_V2, "fa_forward_args changed size");
static_assert(offsetof(fa_forward_args, problem) == 8 && offsetof(fa_forward_args, lse) == 48 &&
                  offsetof(fa_forward_args, stream) == 64,
              "fa_forward_args changed layout");
static_assert(sizeof(fa_backward_args) == FA_BACKWARD_ARGS_SIZE_V4, "fa_backward_args changed size");
static_assert(offsetof(fa_backward_args, problem) == 8 && offsetof(fa_backward_args, lse) == 56 &&
                  offsetof(fa_backward_args, stream) == 96 &&
                  offsetof(fa_backward_args, deterministic) == FA_BACKWARD_ARGS_SIZE_V2,
              "fa_backward_args changed layout");
static_assert(sizeof(fa_fp8_quantize_args) == FA_FP8_QUANTIZE_ARGS_SIZE_V3, "fa_fp8_quantize_args changed size");
static_assert(offsetof(fa_fp8_quantize_args, dtype) == 16 && offsetof(fa_fp8_quantize_args, q) == 24 &&
                  offsetof(fa_fp8_quantize_args, stream) == 104,
              "fa_fp8_quantize_args changed layout");
static_assert(sizeof(fa_fp8_forward_args) == FA_FP8_FORWARD_ARGS_SIZE_V3, "fa_fp8_forward_args changed size");
static_assert(offsetof(fa_fp8_forward_args, qk_dim) == 24 && offsetof(fa_fp8_forward_args, q) == 32 &&
                  offsetof(fa_fp8_forward_args, stream) == 104,
              "fa_fp8_forward_args changed layout");

namespace {

constexpr int kAbiVersion = 4;

// A struct size beyond this is not a newer header's struct but an unset `size` field; reading
// that many bytes of the caller's memory could fault.
constexpr uint32_t kMaxStructSize = 4096;

thread_local std::string last_error;

// Records why (moving a string cannot throw) and returns the status.
int fail(int status, std::string message) noexcept {
  last_error = std::move(message);
  return status;
}

// One registry entry: the descriptor and the names the C ABI hands out for it.
struct Entry {
  fa::StageDescriptor stage;
  std::string key;           // "id", or "id/precision" for a second descriptor of the same stage
  std::string architecture;  // fa::architecture_name
};

// Built once (thread-safe); may throw only while being built (out of memory).
const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = [] {
    std::vector<Entry> built;
    for (const fa::StageDescriptor& stage : fa::stages::all()) {
      const bool repeated = !built.empty() && std::strcmp(built.back().stage.id, stage.id) == 0;
      std::string key = repeated ? std::string(stage.id) + "/" + fa::precision_name(stage.precision) : stage.id;
      built.push_back(Entry{stage, std::move(key), fa::architecture_name(stage)});
    }
    return built;
  }();
  return table;
}

const Entry* find_entry(const char* stage_id) noexcept {
  if (stage_id == nullptr) return nullptr;
  try {
    for (const Entry& entry : entries()) {
      if (entry.key == stage_id) return &entry;
    }
  } catch (...) {
    // the registry could not be built (out of memory): no stage can be found
  }
  return nullptr;
}

const fa::StageDescriptor* find_stage(const char* stage_id) noexcept {
  const Entry* entry = find_entry(stage_id);
  return entry != nullptr ? &entry->stage : nullptr;
}

// The stage for `stage_id`, or null with the status in `status`.
const Entry* lookup(const char* call, const char* stage_id, int& status) {
  if (stage_id == nullptr) {
    status = fail(FA_INVALID_ARGUMENT, std::string(call) + ": stage_id is NULL");
    return nullptr;
  }
  const Entry* entry = find_entry(stage_id);
  if (entry == nullptr) {
    status = fail(FA_UNKNOWN_STAGE, std::string(call) + ": unknown stage '" + stage_id +
                                        "' (fa_stage_id lists the stages of this library)");
  }
  return entry;
}

std::string cuda_message(const char* what, cudaError_t code) {
  return std::string(what) + ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")";
}

// Copies a caller's size-prefixed struct into `out` by the rule of fa_capi.h: at least
// `minimum` bytes (the size of the struct in ABI version `version`, which brought it); the bytes we
// know are copied into a zeroed local; bytes past them (a newer caller's fields) must be zero.
template <typename Struct>
int read_struct(const char* call, const char* name, const void* from, uint32_t minimum, Struct& out, int version = 2) {
  if (from == nullptr) return fail(FA_INVALID_ARGUMENT, std::string(call) + ": " + name + " is NULL");
  uint32_t size = 0;
  std::memcpy(&size, from, sizeof(size));
  if (size < minimum) {
    return fail(FA_INVALID_ARGUMENT, std::string(call) + ": " + name + "->size is " + std::to_string(size) +
                                         ", less than the " + std::to_string(minimum) + " bytes of ABI version " +
                                         std::to_string(version) + " (set size = sizeof the struct)");
  }
  if (size > kMaxStructSize) {
    return fail(FA_INVALID_ARGUMENT, std::string(call) + ": " + name + "->size is " + std::to_string(size) +
                                         ", more than any version of the struct (was size set?)");
  }
  std::memset(static_cast<void*>(&out), 0, sizeof(out));
  std::memcpy(static_cast<void*>(&out), from, std::min<std::size_t>(size, sizeof(out)));
  const unsigned char* bytes = static_cast<const unsigned char*>(from);
  for (std::size_t i = sizeof(out); i < size; ++i) {
    if (bytes[i] != 0) {
      return fail(FA_UNSUPPORTED, std::string(call) + ": " + name + " sets byte " + std::to_string(i) +
                                      ", a field newer than this library (ABI version " + std::to_string(kAbiVersion) +
                                      ", " + std::to_string(sizeof(out)) +
                                      " bytes): update libfa_capi, or leave that field zero");
    }
  }
  return FA_OK;
}

// Reads the caller's fa_problem into an fa::Problem.
int read_problem(const char* call, const fa_problem* from, fa::Problem& problem) {
  fa_problem raw;
  if (const int status = read_struct(call, "problem", from, FA_PROBLEM_SIZE_V2, raw); status != FA_OK) return status;
  if (raw.causal != 0 && raw.causal != 1) {
    return fail(FA_INVALID_ARGUMENT,
                std::string(call) + ": problem->causal is " + std::to_string(raw.causal) + "; it must be 0 or 1");
  }
  problem.batch = raw.batch;
  problem.q_heads = raw.q_heads;
  problem.kv_heads = raw.kv_heads;
  problem.q_seq = raw.q_seq;
  problem.kv_seq = raw.kv_seq;
  problem.dim = raw.dim;
  problem.causal = raw.causal == 1;
  return FA_OK;
}

// The harness's one place for what a stage takes: a size it refuses is FA_INVALID_SHAPE, a
// feature it does not have FA_UNSUPPORTED. Needs no GPU.
int check_problem(const fa::StageDescriptor& stage, const fa::Problem& problem, bool wants_lse, fa::Pass pass) {
  const std::string why = fa::unsupported_reason(stage, problem, wants_lse, pass);
  if (why.empty()) return FA_OK;
  return fail(fa::validate_problem(problem, stage.max_dim).empty() ? FA_UNSUPPORTED : FA_INVALID_SHAPE, why);
}

int check_pass(const char* call, int pass) {
  if (pass == FA_PASS_FORWARD || pass == FA_PASS_BACKWARD) return FA_OK;
  return fail(FA_INVALID_ARGUMENT, std::string(call) + ": pass is " + std::to_string(pass) +
                                       "; it must be FA_PASS_FORWARD (0) or FA_PASS_BACKWARD (1)");
}

int64_t workspace_for(const fa::StageDescriptor& stage, const fa::Problem& problem, fa::Pass pass, int& status) {
  const int64_t bytes = fa::workspace_bytes(stage, problem, pass);
  status = bytes >= 0
               ? FA_OK
               : fail(FA_INTERNAL_ERROR, std::string("stage ") + stage.id + ": its workspace function returned " +
                                             std::to_string(bytes) + " bytes for " + fa::describe(problem));
  return bytes;
}

// A pointer the call needs and a name for messages.
struct Tensor {
  const char* name;
  const void* pointer;
};

// `who` starts every message: "stage 08_mma_registers", "fa_fp8_forward".
int check_not_null(const std::string& who, const std::vector<Tensor>& tensors) {
  for (const Tensor& tensor : tensors) {
    if (tensor.pointer == nullptr) return fail(FA_INVALID_ARGUMENT, who + ": " + tensor.name + " is NULL");
  }
  return FA_OK;
}

// The current device and its compute capability (90 for sm_90); FA_CUDA_ERROR when there is none.
int current_device(const std::string& who, int& device, int& capability) {
  int major = 0;
  int minor = 0;
  cudaError_t code = cudaGetDevice(&device);
  if (code == cudaSuccess) code = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (code == cudaSuccess) code = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  // The stages' driver calls (cuTensorMapEncodeTiled) need the device's context current on this
  // thread, and a thread whose runtime calls so far needed none (PyTorch's autograd worker, say)
  // has none: setting the device binds its primary context.
  if (code == cudaSuccess) code = cudaSetDevice(device);
  if (code != cudaSuccess) {
    cudaGetLastError();  // not sticky: leave no stale error for the stage's launch checks
    // No GPU at all reads as the command line says it, not as the runtime's "driver version is
    // insufficient"; a GPU that is there but unusable keeps the runtime's words.
    const fa::DeviceInfo found = fa::query_device();
    const std::string why =
        found.present ? cuda_message("no usable CUDA device", code) : fa::describe_missing_gpu(found);
    return fail(FA_CUDA_ERROR, who + ": " + why);
  }
  capability = 10 * major + minor;
  return FA_OK;
}

// A CUDA stage runs on the current device, which must exist and have the stage's architecture:
// its compute capability or newer, or exactly that one for an sm_90a-style stage. Checked here,
// before the stage's kernels could fail to launch or load.
int check_device(const Entry& entry, int& device) {
  int capability = 0;
  if (const int status = current_device(std::string("stage ") + entry.stage.id, device, capability); status != FA_OK) {
    return status;
  }
  const fa::Architecture& architecture = entry.stage.architecture;
  const bool runs = architecture.exact ? capability == architecture.compute_capability
                                       : capability >= architecture.compute_capability;
  if (!runs) {
    const std::string needed = std::to_string(architecture.compute_capability / 10) + "." +
                               std::to_string(architecture.compute_capability % 10);
    return fail(FA_UNSUPPORTED, std::string("stage ") + entry.stage.id + " needs " + entry.architecture +
                                    " (compute capability " + needed + (architecture.exact ? " exactly" : " or newer") +
                                    "); device " + std::to_string(device) + " has " + std::to_string(capability / 10) +
                                    "." + std::to_string(capability % 10));
  }
  return FA_OK;
}

// A host pointer handed to a kernel (or a device pointer to the CPU loop) would crash the
// process or poison the CUDA context for everyone in it; the driver knows which is which.
// `device` is the current device (CUDA only); `prefix` starts the messages.
int check_pointer(const std::string& prefix, fa::Backend backend, int device, const Tensor& tensor) {
  cudaPointerAttributes attributes{};
  const cudaError_t code = cudaPointerGetAttributes(&attributes, tensor.pointer);
  if (code != cudaSuccess) {
    cudaGetLastError();
    // Without a usable driver no device memory exists, so the pointer is host memory.
    if (backend == fa::Backend::cpu) return FA_OK;
    return fail(FA_CUDA_ERROR, prefix + ": " + cuda_message(tensor.name, code));
  }
  if (backend == fa::Backend::cpu) {
    if (attributes.type != cudaMemoryTypeDevice) return FA_OK;
    return fail(FA_INVALID_ARGUMENT,
                prefix + " runs on the CPU: " + tensor.name + " must be host memory, not device memory");
  }
  if (attributes.type == cudaMemoryTypeUnregistered) {
    return fail(FA_INVALID_ARGUMENT,
                prefix + " runs on the GPU: " + tensor.name + " is host memory, not device memory");
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != device) {
    return fail(FA_INVALID_ARGUMENT, prefix + ": " + tensor.name + " lives on device " +
                                         std::to_string(attributes.device) + ", the current device is " +
                                         std::to_string(device));
  }
  return FA_OK;
}

// Steps 3 to 5 of the file comment, for the pointers of one call.
int check_memory(const Entry& entry, const std::vector<Tensor>& tensors) {
  const std::string prefix = std::string("stage ") + entry.stage.id;
  if (const int status = check_not_null(prefix, tensors); status != FA_OK) return status;
  int device = -1;
  if (entry.stage.backend == fa::Backend::cuda) {
    if (const int status = check_device(entry, device); status != FA_OK) return status;
  }
  for (const Tensor& tensor : tensors) {
    if (const int status = check_pointer(prefix, entry.stage.backend, device, tensor); status != FA_OK) return status;
  }
  if (entry.stage.backend == fa::Backend::cuda) cudaGetLastError();  // the stage's checks see only its own launches
  return FA_OK;
}

// Step 6: the stage's Status as an fa_status.
int finish(const fa::StageDescriptor& stage, const char* pass, const fa::Status& status) {
  const std::string prefix = std::string("stage ") + stage.id;
  switch (status.code()) {
    case fa::Status::Code::ok:
      return FA_OK;
    case fa::Status::Code::unsupported: {
      const std::string& reason = status.reason();
      return fail(FA_UNSUPPORTED, reason.find(stage.id) != std::string::npos ? reason : prefix + ": " + reason);
    }
    case fa::Status::Code::cuda_error:
      return fail(FA_CUDA_ERROR, prefix + ": " + cuda_message(pass, status.cuda_error()));
  }
  return fail(FA_INTERNAL_ERROR, prefix + ": " + pass + " returned an unknown status");
}

// `call` names the entry point in messages (a version-1 call reports under its own name).
int64_t workspace_bytes_v2(const char* call, const char* stage_id, const fa_problem* raw_problem, int pass) {
  int status = FA_OK;
  const Entry* entry = lookup(call, stage_id, status);
  if (entry == nullptr) return -1;
  fa::Problem problem;
  if (read_problem(call, raw_problem, problem) != FA_OK || check_pass(call, pass) != FA_OK) return -1;
  const fa::Pass which = pass == FA_PASS_BACKWARD ? fa::Pass::backward : fa::Pass::forward;
  if (check_problem(entry->stage, problem, false, which) != FA_OK) return -1;
  const int64_t bytes = workspace_for(entry->stage, problem, which, status);
  return status == FA_OK ? bytes : -1;
}

int forward_v2(const char* call, const char* stage_id, const fa_forward_args* raw_args) {
  int status = FA_OK;
  const Entry* entry = lookup(call, stage_id, status);
  if (entry == nullptr) return status;
  const fa::StageDescriptor& stage = entry->stage;
  fa_forward_args raw;
  if ((status = read_struct(call, "args", raw_args, FA_FORWARD_ARGS_SIZE_V2, raw)) != FA_OK) return status;
  fa::ForwardArgs args;
  if ((status = read_problem(call, raw.problem, args.problem)) != FA_OK) return status;
  if ((status = check_problem(stage, args.problem, raw.lse != nullptr, fa::Pass::forward)) != FA_OK) return status;
  if (stage.forward == nullptr)
    return fail(FA_INTERNAL_ERROR, std::string("stage ") + stage.id + " has no forward pass");

  std::vector<Tensor> tensors = {{"q", raw.q}, {"k", raw.k}, {"v", raw.v}, {"o", raw.o}};
  if (raw.lse != nullptr) tensors.push_back({"lse", raw.lse});
  const int64_t workspace = workspace_for(stage, args.problem, fa::Pass::forward, status);
  if (status != FA_OK) return status;
  if (workspace > 0) tensors.push_back({"workspace", raw.workspace});
  if ((status = check_memory(*entry, tensors)) != FA_OK) return status;

  args.q = raw.q;
  args.k = raw.k;
  args.v = raw.v;
  args.o = raw.o;
  args.lse = raw.lse;
  args.workspace = raw.workspace;
  args.stream = static_cast<cudaStream_t>(raw.stream);
  return finish(stage, "forward", stage.forward(args));
}

int backward_v2(const char* call, const char* stage_id, const fa_backward_args* raw_args) {
  int status = FA_OK;
  const Entry* entry = lookup(call, stage_id, status);
  if (entry == nullptr) return status;
  const fa::StageDescriptor& stage = entry->stage;
  fa_backward_args raw;
  if ((status = read_struct(call, "args", raw_args, FA_BACKWARD_ARGS_SIZE_V2, raw)) != FA_OK) return status;
  if (raw.deterministic != 0 && raw.deterministic != 1) {
    return fail(FA_INVALID_ARGUMENT, std::string(call) + ": args->deterministic is " +
                                         std::to_string(raw.deterministic) + "; it must be 0 or 1");
  }
  fa::BackwardArgs args;
  if ((status = read_problem(call, raw.problem, args.problem)) != FA_OK) return status;
  if ((status = check_problem(stage, args.problem, false, fa::Pass::backward)) != FA_OK) return status;
  if (stage.backward == nullptr) {
    return fail(FA_INTERNAL_ERROR, std::string("stage ") + stage.id + " declares a backward pass but has none");
  }

  std::vector<Tensor> tensors = {{"q", raw.q},           {"k", raw.k},           {"v", raw.v},
                                 {"o", raw.o},           {"grad_o", raw.grad_o}, {"lse", raw.lse},
                                 {"grad_q", raw.grad_q}, {"grad_k", raw.grad_k}, {"grad_v", raw.grad_v}};
  const int64_t workspace = workspace_for(stage, args.problem, fa::Pass::backward, status);
  if (status != FA_OK) return status;
  if (workspace > 0) tensors.push_back({"workspace", raw.workspace});
  if ((status = check_memory(*entry, tensors)) != FA_OK) return status;

  args.q = raw.q;
  args.k = raw.k;
  args.v = raw.v;
  args.o = raw.o;
  args.grad_o = raw.grad_o;
  args.lse = raw.lse;
  args.grad_q = raw.grad_q;
  args.grad_k = raw.grad_k;
  args.grad_v = raw.grad_v;
  args.workspace = raw.workspace;
  args.stream = static_cast<cudaStream_t>(raw.stream);
  const fa::DeterministicBackward mode(raw.deterministic == 1);
  return finish(stage, "backward", stage.backward(args));
}

// Called in a catch block: records the exception in flight and returns its status, FA_CUDA_ERROR
// for a CUDA error the harness threw (fa::CudaError), else FA_INTERNAL_ERROR.
int status_of_current_exception() noexcept {
  int status = FA_INTERNAL_ERROR;
  const char* what = "unknown exception";
  try {
    throw;
  } catch (const fa::CudaError& error) {
    status = FA_CUDA_ERROR;
    what = error.what();
  } catch (const std::exception& error) {
    what = error.what();
  } catch (...) {
  }
  try {
    last_error = what;
  } catch (...) {
    last_error.clear();  // out of memory for the message: the status still says what kind
  }
  return status;
}

fa_problem square_problem(int64_t batch, int64_t heads, int64_t seq, int64_t dim, int causal) {
  fa_problem problem;
  fa_init_problem(&problem);
  problem.batch = batch;
  problem.q_heads = heads;
  problem.kv_heads = heads;
  problem.q_seq = seq;
  problem.kv_seq = seq;
  problem.dim = dim;
  problem.causal = causal != 0 ? 1 : 0;
  return problem;
}

int64_t guarded_workspace_bytes(const char* call, const char* stage_id, const fa_problem* problem, int pass) noexcept {
  last_error.clear();
  try {
    return workspace_bytes_v2(call, stage_id, problem, pass);
  } catch (...) {
    status_of_current_exception();
    return -1;
  }
}

// A call that returns an fa_status: `body` runs with the last error cleared, and nothing it throws
// crosses the C boundary (the exception becomes the status and the message).
template <typename Body>
int guarded(Body&& body) noexcept {
  last_error.clear();
  try {
    return body();
  } catch (...) {
    return status_of_current_exception();
  }
}

int guarded_forward(const char* call, const char* stage_id, const fa_forward_args* args) noexcept {
  return guarded([&] { return forward_v2(call, stage_id, args); });
}

// ---- FP8: stage 14 -------------------------------------------------------------------------------

#if FA_CAPI_FP8

constexpr int64_t kFp8MaxDim = 256;  // stage 14 takes stage 10's head dims, 1 .. 256

// The problem against stage 14's limits: a size it refuses is FA_INVALID_SHAPE.
int read_fp8_problem(const char* call, const fa_problem* from, fa::Problem& problem) {
  if (const int status = read_problem(call, from, problem); status != FA_OK) return status;
  const std::string why = fa::validate_problem(problem, kFp8MaxDim);
  return why.empty() ? FA_OK : fail(FA_INVALID_SHAPE, std::string(call) + ": " + why);
}

int read_dtype(const char* call, const char* name, int value, fa::Precision& precision) {
  if (value == FA_DTYPE_FP16 || value == FA_DTYPE_BF16) {
    precision = value == FA_DTYPE_FP16 ? fa::Precision::fp16 : fa::Precision::bf16;
    return FA_OK;
  }
  return fail(FA_INVALID_ARGUMENT, std::string(call) + ": " + name + " is " + std::to_string(value) +
                                       "; it must be FA_DTYPE_FP16 (1) or FA_DTYPE_BF16 (2)");
}

int read_flag(const char* call, const char* name, int value) {
  if (value == 0 || value == 1) return FA_OK;
  return fail(FA_INVALID_ARGUMENT,
              std::string(call) + ": " + name + " is " + std::to_string(value) + "; it must be 0 or 1");
}

// Steps 3 to 5 of the file comment for an FP8 call: no NULL, an sm_90 GPU (the only one stage 14's
// kernels run on: wgmma on e4m3), device memory on it, and the alignments TMA and the kernels need:
// 16 bytes for the e4m3 tensors (`aligned16`), 256 for the workspace.
int check_fp8_memory(const char* call, const std::vector<Tensor>& tensors, const std::vector<Tensor>& aligned16,
                     const void* workspace) {
  if (const int status = check_not_null(call, tensors); status != FA_OK) return status;
  int device = -1;
  int capability = 0;
  if (const int status = current_device(call, device, capability); status != FA_OK) return status;
  if (capability != 90) {
    return fail(FA_UNSUPPORTED, std::string(call) +
                                    ": FP8 attention (stage 14) runs on sm_90 (H100, H200) only; device " +
                                    std::to_string(device) + " has compute capability " +
                                    std::to_string(capability / 10) + "." + std::to_string(capability % 10));
  }
  for (const Tensor& tensor : tensors) {
    if (const int status = check_pointer(call, fa::Backend::cuda, device, tensor); status != FA_OK) return status;
  }
  for (const Tensor& tensor : aligned16) {
    if (reinterpret_cast<std::uintptr_t>(tensor.pointer) % 16 != 0) {
      return fail(FA_INVALID_ARGUMENT, std::string(call) + ": " + tensor.name + " must start on a 16-byte boundary");
    }
  }
  if (workspace != nullptr && reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) {
    return fail(FA_INVALID_ARGUMENT, std::string(call) + ": the workspace must start on a 256-byte boundary");
  }
  cudaGetLastError();  // stage 14's checks see only its own launches
  return FA_OK;
}

// Step 6: stage 14's Status as an fa_status.
int finish_fp8(const char* call, const fa::Status& status) {
  switch (status.code()) {
    case fa::Status::Code::ok:
      return FA_OK;
    case fa::Status::Code::unsupported:
      return fail(FA_UNSUPPORTED, std::string(call) + ": " + status.reason());
    case fa::Status::Code::cuda_error:
      return fail(FA_CUDA_ERROR, std::string(call) + ": " + cuda_message("stage 14", status.cuda_error()));
  }
  return fail(FA_INTERNAL_ERROR, std::string(call) + ": stage 14 returned an unknown status");
}

int64_t fp8_workspace_bytes(const fa_problem* raw_problem, int call) {
  const char* name = "fa_fp8_workspace_bytes";
  fa::Problem problem;
  if (read_fp8_problem(name, raw_problem, problem) != FA_OK) return -1;
  switch (call) {
    case FA_FP8_QUANTIZE:
      return fa::fp8::quantize_scratch_bytes(problem);
    case FA_FP8_FORWARD:  // the room to arrange Q, K and V; fa_fp8_attention's too, which quantizes there
    case FA_FP8_ATTENTION:
      return fa::fp8::fp8_workspace_bytes(problem);
    default:
      fail(FA_INVALID_ARGUMENT, std::string(name) + ": call is " + std::to_string(call) +
                                    "; it must be FA_FP8_QUANTIZE (0), FA_FP8_FORWARD (1) or FA_FP8_ATTENTION (2)");
      return -1;
  }
}

int fp8_quantize(const fa_fp8_quantize_args* raw_args) {
  const char* call = "fa_fp8_quantize";
  fa_fp8_quantize_args raw;
  int status = read_struct(call, "args", raw_args, FA_FP8_QUANTIZE_ARGS_SIZE_V3, raw, 3);
  fa::Problem problem;
  fa::Precision precision = fa::Precision::fp16;
  if (status == FA_OK) status = read_fp8_problem(call, raw.problem, problem);
  if (status == FA_OK) status = read_dtype(call, "args->dtype", raw.dtype, precision);
  if (status == FA_OK) status = read_flag(call, "args->rotate", raw.rotate);
  if (status == FA_OK) {
    status = check_fp8_memory(call,
                              {{"q", raw.q},
                               {"k", raw.k},
                               {"v", raw.v},
                               {"q_fp8", raw.q_fp8},
                               {"k_fp8", raw.k_fp8},
                               {"v_fp8", raw.v_fp8},
                               {"q_descale", raw.q_descale},
                               {"k_descale", raw.k_descale},
                               {"v_descale", raw.v_descale},
                               {"workspace", raw.workspace}},
                              {{"q_fp8", raw.q_fp8}, {"k_fp8", raw.k_fp8}, {"v_fp8", raw.v_fp8}}, nullptr);
  }
  if (status != FA_OK) return status;
  fa::fp8::QuantizedOutputs out;
  out.q = static_cast<uint8_t*>(raw.q_fp8);
  out.k = static_cast<uint8_t*>(raw.k_fp8);
  out.v_transposed = static_cast<uint8_t*>(raw.v_fp8);
  out.q_descale = raw.q_descale;
  out.k_descale = raw.k_descale;
  out.v_descale = raw.v_descale;
  out.v_amax = raw.workspace;
  return finish_fp8(call, fa::fp8::quantize_into(problem, precision, raw.q, raw.k, raw.v, raw.rotate == 1, out,
                                                 static_cast<cudaStream_t>(raw.stream)));
}

int fp8_forward(const fa_fp8_forward_args* raw_args) {
  const char* call = "fa_fp8_forward";
  fa_fp8_forward_args raw;
  int status = read_struct(call, "args", raw_args, FA_FP8_FORWARD_ARGS_SIZE_V3, raw, 3);
  fa::Problem problem;
  fa::Precision out_precision = fa::Precision::fp16;
  if (status == FA_OK) status = read_fp8_problem(call, raw.problem, problem);
  if (status == FA_OK) status = read_dtype(call, "args->out_dtype", raw.out_dtype, out_precision);
  if (status == FA_OK) status = read_flag(call, "args->v_layout", raw.v_layout);
  if (status != FA_OK) return status;
  const int64_t dim_padded = fa::fp8::pad_dim(problem.dim);
  const int64_t qk_dim = raw.qk_dim == 0 ? problem.dim : raw.qk_dim;
  if (qk_dim != problem.dim && qk_dim != dim_padded) {
    return fail(FA_INVALID_SHAPE, std::string(call) + ": args->qk_dim is " + std::to_string(raw.qk_dim) +
                                      "; rows of q and k hold dim (" + std::to_string(problem.dim) + ") or Dpad (" +
                                      std::to_string(dim_padded) + ") codes");
  }
  // Padding Q and K or transposing V needs the workspace; inputs in the kernel's layouts need none.
  const bool arranges = qk_dim != dim_padded || raw.v_layout == FA_FP8_V_ROWS;
  std::vector<Tensor> tensors = {{"q", raw.q},
                                 {"k", raw.k},
                                 {"v", raw.v},
                                 {"q_descale", raw.q_descale},
                                 {"k_descale", raw.k_descale},
                                 {"v_descale", raw.v_descale},
                                 {"o", raw.o}};
  if (raw.lse != nullptr) tensors.push_back({"lse", raw.lse});
  if (arranges) tensors.push_back({"workspace", raw.workspace});
  std::vector<Tensor> aligned16;
  if (qk_dim == dim_padded) aligned16 = {{"q", raw.q}, {"k", raw.k}};
  if (raw.v_layout == FA_FP8_V_TRANSPOSED) aligned16.push_back({"v", raw.v});
  if ((status = check_fp8_memory(call, tensors, aligned16, arranges ? raw.workspace : nullptr)) != FA_OK) {
    return status;
  }
  fa::fp8::E4m3Rows rows;
  rows.q = static_cast<const uint8_t*>(raw.q);
  rows.k = static_cast<const uint8_t*>(raw.k);
  rows.qk_dim = qk_dim;
  rows.v = static_cast<const uint8_t*>(raw.v);
  rows.v_transposed = raw.v_layout == FA_FP8_V_TRANSPOSED;
  rows.q_descale = raw.q_descale;
  rows.k_descale = raw.k_descale;
  rows.v_descale = raw.v_descale;
  const cudaStream_t stream = static_cast<cudaStream_t>(raw.stream);
  fa::fp8::QuantizedInputs inputs;
  const fa::Status arranged = fa::fp8::arrange_e4m3(problem, rows, raw.workspace, &inputs, stream);
  if (!arranged.ok()) return finish_fp8(call, arranged);
  return finish_fp8(call, fa::fp8::fp8_forward_quantized(problem, inputs, out_precision, raw.o, raw.lse, stream));
}

int fp8_attention(const fa_forward_args* raw_args, int dtype, int rotate) {
  const char* call = "fa_fp8_attention";
  fa_forward_args raw;
  int status = read_struct(call, "args", raw_args, FA_FORWARD_ARGS_SIZE_V2, raw);
  fa::ForwardArgs args;
  fa::Precision precision = fa::Precision::fp16;
  if (status == FA_OK) status = read_fp8_problem(call, raw.problem, args.problem);
  if (status == FA_OK) status = read_dtype(call, "dtype", dtype, precision);
  if (status == FA_OK) status = read_flag(call, "rotate", rotate);
  if (status != FA_OK) return status;
  std::vector<Tensor> tensors = {{"q", raw.q}, {"k", raw.k}, {"v", raw.v}, {"o", raw.o}, {"workspace", raw.workspace}};
  if (raw.lse != nullptr) tensors.push_back({"lse", raw.lse});
  if ((status = check_fp8_memory(call, tensors, {}, raw.workspace)) != FA_OK) return status;
  args.q = raw.q;
  args.k = raw.k;
  args.v = raw.v;
  args.o = raw.o;
  args.lse = raw.lse;
  args.workspace = raw.workspace;
  args.stream = static_cast<cudaStream_t>(raw.stream);
  fa::fp8::ForwardOptions options;
  options.rotate = rotate == 1;
  return finish_fp8(call, fa::fp8::fp8_forward(args, precision, options));
}

#else

// A library built without stage 14 (FA_ONLY_STAGES left it out): every FP8 call says so.
int fp8_missing(const char* call) {
  return fail(FA_UNSUPPORTED, std::string(call) + ": this library was built without stage 14 (FP8)");
}

#endif

}  // namespace

extern "C" {

int fa_abi_version(void) { return kAbiVersion; }

int64_t fa_workspace_bytes_v2(const char* stage_id, const fa_problem* problem, int pass) {
  return guarded_workspace_bytes("fa_workspace_bytes_v2", stage_id, problem, pass);
}

int fa_forward_v2(const char* stage_id, const fa_forward_args* args) {
  return guarded_forward("fa_forward_v2", stage_id, args);
}

int fa_backward_v2(const char* stage_id, const fa_backward_args* args) {
  return guarded([&] { return backward_v2("fa_backward_v2", stage_id, args); });
}

int64_t fa_workspace_bytes(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim, int causal) {
  const fa_problem problem = square_problem(batch, heads, seq, dim, causal);
  return guarded_workspace_bytes("fa_workspace_bytes", stage_id, &problem, FA_PASS_FORWARD);
}

int fa_forward(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim, int causal, const void* q,
               const void* k, const void* v, void* o, void* workspace, void* stream) {
  const fa_problem problem = square_problem(batch, heads, seq, dim, causal);
  fa_forward_args args;
  fa_init_forward_args(&args);
  args.problem = &problem;
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = o;
  args.workspace = workspace;
  args.stream = stream;
  return guarded_forward("fa_forward", stage_id, &args);
}

#if FA_CAPI_FP8
int64_t fa_fp8_workspace_bytes(const fa_problem* problem, int call) {
  int64_t bytes = -1;
  guarded([&] {
    bytes = fp8_workspace_bytes(problem, call);
    return FA_OK;
  });
  return bytes;
}
int fa_fp8_quantize(const fa_fp8_quantize_args* args) {
  return guarded([&] { return fp8_quantize(args); });
}
int fa_fp8_forward(const fa_fp8_forward_args* args) {
  return guarded([&] { return fp8_forward(args); });
}
int fa_fp8_attention(const fa_forward_args* args, int dtype, int rotate) {
  return guarded([&] { return fp8_attention(args, dtype, rotate); });
}
#else
int64_t fa_fp8_workspace_bytes(const fa_problem*, int) {
  guarded([] { return fp8_missing("fa_fp8_workspace_bytes"); });
  return -1;
}
int fa_fp8_quantize(const fa_fp8_quantize_args*) {
  return guarded([] { return fp8_missing("fa_fp8_quantize"); });
}
int fa_fp8_forward(const fa_fp8_forward_args*) {
  return guarded([] { return fp8_missing("fa_fp8_forward"); });
}
int fa_fp8_attention(const fa_forward_args*, int, int) {
  return guarded([] { return fp8_missing("fa_fp8_attention"); });
}
#endif

int fa_stage_features(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  if (stage == nullptr) return -1;
  const fa::Features& features = stage->features;
  return (features.causal ? FA_FEATURE_CAUSAL : 0) | (features.grouped ? FA_FEATURE_GROUPED : 0) |
         (features.rectangular ? FA_FEATURE_RECTANGULAR : 0) | (features.lse ? FA_FEATURE_LSE : 0) |
         (features.backward ? FA_FEATURE_BACKWARD : 0);
}

const char* fa_stage_architecture(const char* stage_id) {
  const Entry* entry = find_entry(stage_id);
  return entry != nullptr ? entry->architecture.c_str() : nullptr;
}

double fa_stage_kv_passes(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage != nullptr ? stage->kv_passes : -1.0;
}

int fa_stage_count(void) {
  try {
    return static_cast<int>(entries().size());
  } catch (...) {
    return 0;  // the registry could not be built (out of memory): no stages to offer
  }
}

const char* fa_stage_id(int index) {
  if (index < 0 || index >= fa_stage_count()) return nullptr;
  return entries()[static_cast<std::size_t>(index)].key.c_str();  // built by fa_stage_count: cannot throw
}

const char* fa_stage_title(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage != nullptr ? stage->title : nullptr;
}

const char* fa_stage_backend(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  if (stage == nullptr) return nullptr;
  return stage->backend == fa::Backend::cpu ? "cpu" : "cuda";
}

const char* fa_stage_precision(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage != nullptr ? fa::precision_name(stage->precision) : nullptr;
}

const char* fa_stage_source_hash(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage != nullptr ? stage->source_hash : nullptr;
}

int64_t fa_stage_max_dim(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage != nullptr ? stage->max_dim : -1;
}

int fa_stage_min_compute_capability(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  if (stage == nullptr) return -1;
  return stage->backend == fa::Backend::cpu ? 0 : stage->architecture.compute_capability;
}

double fa_tolerance(const char* precision, double max_abs_v) {
  if (precision == nullptr) return -1.0;
  try {
    for (const fa::Precision candidate : {fa::Precision::fp32, fa::Precision::fp16, fa::Precision::bf16}) {
      if (std::strcmp(precision, fa::precision_name(candidate)) == 0) return fa::tolerance(candidate, max_abs_v);
    }
  } catch (...) {
    // fa::tolerance does not throw; nothing may cross the C boundary if it ever did
  }
  return -1.0;
}

const char* fa_last_error(void) { return last_error.c_str(); }

}  // extern "C"
