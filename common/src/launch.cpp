#include "fa/launch.hpp"

#include <climits>
#include <string>

namespace fa {

Status opt_in_shared_memory(const void* kernel, int64_t bytes, Carveout carveout) {
  int device = 0;
  int limit = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return Status::cuda(error);
  if (const cudaError_t error = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      error != cudaSuccess) {
    return Status::cuda(error);
  }
  if (bytes > limit) {
    return Status::unsupported("the kernel needs " + std::to_string(bytes) + " bytes of shared memory per block; " +
                               "this GPU allows " + std::to_string(limit));
  }
  if (const cudaError_t error =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
      error != cudaSuccess) {
    return Status::cuda(error);
  }
  const int preference =
      carveout == Carveout::max_shared ? cudaSharedmemCarveoutMaxShared : cudaSharedmemCarveoutDefault;
  return Status::cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, preference));
}

Status check_grid(int64_t blocks) {
  if (blocks <= INT_MAX) return Status();
  return Status::unsupported("the problem needs " + std::to_string(blocks) + " blocks; a launch takes at most " +
                             std::to_string(INT_MAX));
}

}  // namespace fa
