#include "fa/cuda_check.hpp"

#include <sstream>

namespace fa {

void throw_cuda_error(cudaError_t code, const char* expression, const char* file, int line) {
  std::ostringstream what;
  what << "CUDA error " << cudaGetErrorName(code) << " (" << cudaGetErrorString(code) << ") in " << expression << " at "
       << file << ":" << line;
  throw CudaError(code, what.str());
}

}  // namespace fa
