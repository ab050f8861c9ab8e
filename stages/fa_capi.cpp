// The C ABI of fa_capi.h: looks the stage up in the registry, checks everything a caller from
// another language can get wrong (it cannot see our C++ types), and calls the stage's forward.
// No exception and no CUDA error escapes: each becomes a status code and fa_last_error().
#include "fa_capi.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "fa/metrics.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa/stages.hpp"

namespace {

thread_local std::string last_error;

int fail(int status, std::string message) {
  last_error = std::move(message);
  return status;
}

const std::vector<fa::StageDescriptor>& registry() {
  static const std::vector<fa::StageDescriptor> stages = fa::stages::all();
  return stages;
}

// The name a stage goes by here: its id, or "id/precision" for a second descriptor of the same
// stage in another precision (e.g. "07_fp16_pipelined/bf16").
const std::vector<std::string>& stage_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < registry().size(); ++i) {
      const fa::StageDescriptor& stage = registry()[i];
      const bool repeated = i > 0 && std::strcmp(registry()[i - 1].id, stage.id) == 0;
      names.push_back(repeated ? std::string(stage.id) + "/" + fa::precision_name(stage.precision) : stage.id);
    }
    return names;
  }();
  return keys;
}

const fa::StageDescriptor* find_stage(const char* stage_id) noexcept {
  if (stage_id == nullptr) return nullptr;
  try {
    for (std::size_t i = 0; i < registry().size(); ++i) {
      if (stage_keys()[i] == stage_id) return &registry()[i];
    }
  } catch (...) {
    // the registry could not be built (out of memory): no stage can be found
  }
  return nullptr;
}

std::string cuda_message(const char* what, cudaError_t code) {
  return std::string(what) + ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")";
}

// Finds the stage and checks the problem against it; on failure records why.
int prepare(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim, int causal,
            const fa::StageDescriptor*& stage, fa::Shape& shape) {
  stage = find_stage(stage_id);
  if (stage == nullptr) {
    return fail(FA_UNKNOWN_STAGE, std::string("unknown stage '") + (stage_id ? stage_id : "(null)") + "'");
  }
  if (causal != 0 && !stage->supports_causal) {
    return fail(FA_UNSUPPORTED, std::string(stage->id) + ": this stage has no causal masking");
  }
  shape = fa::Shape{batch, heads, seq, dim, causal != 0};
  const std::string problem = fa::validate_shape(shape, stage->max_dim);
  if (!problem.empty()) return fail(FA_INVALID_SHAPE, std::string(stage->id) + ": " + problem);
  return FA_OK;
}

// A GPU too old for the stage is refused here, before its kernels could fail to launch.
int check_device(const fa::StageDescriptor& stage, int& device) {
  int major = 0;
  int minor = 0;
  cudaError_t code = cudaGetDevice(&device);
  if (code == cudaSuccess) code = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (code == cudaSuccess) code = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (code != cudaSuccess) {
    cudaGetLastError();  // not sticky: leave no stale error for the stage's launch checks
    return fail(FA_CUDA_ERROR, std::string(stage.id) + ": " + cuda_message("no usable CUDA device", code));
  }
  const int capability = 10 * major + minor;
  if (capability < stage.min_compute_capability) {
    return fail(FA_UNSUPPORTED, std::string(stage.id) + " needs compute capability " +
                                    std::to_string(stage.min_compute_capability / 10) + "." +
                                    std::to_string(stage.min_compute_capability % 10) + "; device " +
                                    std::to_string(device) + " has " + std::to_string(major) + "." +
                                    std::to_string(minor));
  }
  return FA_OK;
}

// A host pointer handed to a kernel (or a device pointer to the CPU loop) would crash the
// process or poison the CUDA context for everyone in it; the driver knows which is which.
// `device` is the current device (CUDA stages only).
int check_pointer(const fa::StageDescriptor& stage, int device, const char* name, const void* pointer) {
  if (pointer == nullptr) return fail(FA_INVALID_ARGUMENT, std::string(stage.id) + ": " + name + " is NULL");
  cudaPointerAttributes attributes{};
  const cudaError_t code = cudaPointerGetAttributes(&attributes, pointer);
  if (code != cudaSuccess) {
    cudaGetLastError();
    // Without a usable driver no device memory exists, so the pointer is host memory.
    if (stage.backend == fa::Backend::cpu) return FA_OK;
    return fail(FA_CUDA_ERROR, std::string(stage.id) + ": " + cuda_message(name, code));
  }
  if (stage.backend == fa::Backend::cpu) {
    if (attributes.type != cudaMemoryTypeDevice) return FA_OK;
    return fail(FA_INVALID_ARGUMENT,
                std::string(stage.id) + " runs on the CPU: " + name + " must be host memory, not device memory");
  }
  if (attributes.type == cudaMemoryTypeUnregistered) {
    return fail(FA_INVALID_ARGUMENT,
                std::string(stage.id) + " runs on the GPU: " + name + " is host memory, not device memory");
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != device) {
    return fail(FA_INVALID_ARGUMENT, std::string(stage.id) + ": " + name + " lives on device " +
                                         std::to_string(attributes.device) + ", the current device is " +
                                         std::to_string(device));
  }
  return FA_OK;
}

int forward(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim, int causal, const void* q,
            const void* k, const void* v, void* o, void* workspace, void* stream) {
  const fa::StageDescriptor* stage = nullptr;
  fa::Shape shape;
  int status = prepare(stage_id, batch, heads, seq, dim, causal, stage, shape);
  if (status != FA_OK) return status;
  int device = -1;
  if (stage->backend == fa::Backend::cuda && (status = check_device(*stage, device)) != FA_OK) return status;

  const void* tensors[] = {q, k, v, o};
  const char* names[] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; ++i) {
    if ((status = check_pointer(*stage, device, names[i], tensors[i])) != FA_OK) return status;
  }
  if (fa::workspace_bytes(*stage, shape) > 0 &&
      (status = check_pointer(*stage, device, "workspace", workspace)) != FA_OK) {
    return status;
  }

  cudaGetLastError();  // the stage's launch checks must see only its own launches
  const cudaError_t code = stage->forward(shape, q, k, v, o, workspace, static_cast<cudaStream_t>(stream));
  if (code != cudaSuccess) return fail(FA_CUDA_ERROR, std::string(stage->id) + ": " + cuda_message("forward", code));
  return FA_OK;
}

}  // namespace

extern "C" {

int64_t fa_workspace_bytes(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim, int causal) {
  last_error.clear();
  try {
    const fa::StageDescriptor* stage = nullptr;
    fa::Shape shape;
    if (prepare(stage_id, batch, heads, seq, dim, causal, stage, shape) != FA_OK) return -1;
    return fa::workspace_bytes(*stage, shape);
  } catch (const std::exception& error) {
    fail(FA_INTERNAL_ERROR, error.what());
  } catch (...) {
    fail(FA_INTERNAL_ERROR, "unknown exception");
  }
  return -1;
}

int fa_forward(const char* stage_id, int64_t batch, int64_t heads, int64_t seq, int64_t dim, int causal, const void* q,
               const void* k, const void* v, void* o, void* workspace, void* stream) {
  last_error.clear();
  try {
    return forward(stage_id, batch, heads, seq, dim, causal, q, k, v, o, workspace, stream);
  } catch (const std::exception& error) {
    return fail(FA_INTERNAL_ERROR, error.what());
  } catch (...) {
    return fail(FA_INTERNAL_ERROR, "unknown exception");
  }
}

int fa_stage_count(void) {
  try {
    return static_cast<int>(registry().size());
  } catch (...) {
    return 0;  // the registry could not be built (out of memory): no stages to offer
  }
}

const char* fa_stage_id(int index) {
  if (index < 0 || index >= fa_stage_count()) return nullptr;
  return stage_keys()[static_cast<std::size_t>(index)].c_str();
}

const char* fa_stage_title(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage ? stage->title : nullptr;
}

const char* fa_stage_backend(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  if (stage == nullptr) return nullptr;
  return stage->backend == fa::Backend::cpu ? "cpu" : "cuda";
}

const char* fa_stage_precision(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage ? fa::precision_name(stage->precision) : nullptr;
}

const char* fa_stage_source_hash(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage ? stage->source_hash : nullptr;
}

int64_t fa_stage_max_dim(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage ? stage->max_dim : -1;
}

int fa_stage_min_compute_capability(const char* stage_id) {
  const fa::StageDescriptor* stage = find_stage(stage_id);
  return stage ? stage->min_compute_capability : -1;
}

double fa_tolerance(const char* precision, double max_abs_v) {
  if (precision == nullptr) return -1.0;
  for (const fa::Precision candidate : {fa::Precision::fp32, fa::Precision::fp16, fa::Precision::bf16}) {
    if (std::strcmp(precision, fa::precision_name(candidate)) == 0) return fa::tolerance(candidate, max_abs_v);
  }
  return -1.0;
}

const char* fa_last_error(void) { return last_error.c_str(); }

}  // extern "C"
