// CUDA error handling. Host code that cannot continue uses FA_CUDA_CHECK (throws CudaError);
// stage forward functions, which return an fa::Status (stage.hpp), use FA_CUDA_TRY /
// FA_LAUNCH_TRY / FA_STATUS_TRY instead.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace fa {

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

[[noreturn]] void throw_cuda_error(cudaError_t code, const char* expression, const char* file, int line);

}  // namespace fa

#define FA_CUDA_CHECK(expression)                                                                     \
  do {                                                                                                \
    const cudaError_t fa_status_ = (expression);                                                      \
    if (fa_status_ != cudaSuccess) fa::throw_cuda_error(fa_status_, #expression, __FILE__, __LINE__); \
  } while (0)

#define FA_CUDA_TRY(expression)                                           \
  do {                                                                    \
    const cudaError_t fa_status_ = (expression);                          \
    if (fa_status_ != cudaSuccess) return ::fa::Status::cuda(fa_status_); \
  } while (0)

// Returns a Status that is not ok (a decline or an error) to the caller.
#define FA_STATUS_TRY(expression)            \
  do {                                       \
    ::fa::Status fa_result_ = (expression);  \
    if (!fa_result_.ok()) return fa_result_; \
  } while (0)

// After a <<<...>>> launch: a bad configuration is reported here, not at the next sync.
#define FA_LAUNCH_TRY() FA_CUDA_TRY(cudaGetLastError())
