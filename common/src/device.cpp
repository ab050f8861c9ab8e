#include "fa/device.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <sstream>

#include "fa/cuda_check.hpp"
#include "fa/stage.hpp"

namespace fa {

DeviceInfo query_device() {
  DeviceInfo info;
  info.name = "cpu";
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    info.reason = status != cudaSuccess ? std::string("no CUDA device (") + cudaGetErrorString(status) + ")"
                                        : std::string("no CUDA device");
    cudaGetLastError();  // clear the error so later calls start clean
    return info;
  }
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  FA_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  info.present = true;
  info.name = properties.name;
  info.compute_capability = properties.major * 10 + properties.minor;
  info.multiprocessors = properties.multiProcessorCount;
  info.shared_memory_per_block_optin = static_cast<int64_t>(properties.sharedMemPerBlockOptin);
  return info;
}

MemoryInfo device_memory() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

std::string stage_unavailable_reason(const StageDescriptor& stage, const DeviceInfo& device) {
  if (stage.backend == Backend::cpu) return "";
  std::ostringstream why;
  if (!device.present) {
    why << "stage " << stage.id << " needs a CUDA GPU: " << device.reason;
  } else {
    const Architecture& needed = stage.architecture;
    const bool runs = needed.exact ? device.compute_capability == needed.compute_capability
                                   : device.compute_capability >= needed.compute_capability;
    if (!runs) {
      why << "stage " << stage.id << " needs " << (needed.exact ? "exactly " : "") << "compute capability "
          << needed.compute_capability / 10 << "." << needed.compute_capability % 10
          << (needed.exact ? "" : " or newer") << " (" << architecture_name(stage) << "); " << device.name << " has "
          << device.compute_capability / 10 << "." << device.compute_capability % 10;
    }
  }
  return why.str();
}

std::string gpu_folder_name(const std::string& name) {
  std::string folder = name;
  std::replace(folder.begin(), folder.end(), ' ', '_');
  return folder;
}

}  // namespace fa
