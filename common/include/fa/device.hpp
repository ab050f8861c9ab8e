// What the harness needs to know about the GPU: is there one, what is it, how much is free.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "fa/stage.hpp"

namespace fa {

struct DeviceInfo {
  bool present = false;
  std::string name;            // "NVIDIA H100 80GB HBM3"; "cpu" when there is no GPU
  int compute_capability = 0;  // 90 for sm_90
  int multiprocessors = 0;
  int64_t shared_memory_per_block_optin = 0;
  std::string reason;  // why no device, when !present
};

DeviceInfo query_device();

// The SM count of `device`, for a launcher that sizes its grid to the GPU (stages 10 and 12). The
// driver caches the attribute, so asking at every launch costs next to nothing; inline, so that a
// launcher compiles to the same call it made before this lived here.
inline Status multiprocessor_count(int device, int* count) {
  return Status::cuda(cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device));
}

struct MemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
MemoryInfo device_memory();

// Empty when the stage can run here, else the one-line reason (no device, GPU too old).
std::string stage_unavailable_reason(const StageDescriptor& stage, const DeviceInfo& device);

// The device name as a folder name (spaces to underscores), for plots/data/<gpu>/.
std::string gpu_folder_name(const std::string& name);

}  // namespace fa
