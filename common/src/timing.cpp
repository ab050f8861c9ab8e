#include "fa/timing.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "fa/cuda_check.hpp"

namespace fa {
namespace {

Timing summarize(std::vector<double> samples) {
  if (samples.empty()) return {};
  std::sort(samples.begin(), samples.end());
  const std::size_t middle = samples.size() / 2;
  const double median = samples.size() % 2 == 1 ? samples[middle] : 0.5 * (samples[middle - 1] + samples[middle]);
  return {median, samples.front()};
}

}  // namespace

Timing time_cuda(const std::function<void()>& run, int warmup, int reps, void* stream) {
  const cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  for (int i = 0; i < warmup; ++i) run();
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  FA_CUDA_CHECK(cudaEventCreate(&start));
  FA_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    FA_CUDA_CHECK(cudaEventRecord(start, cuda_stream));
    run();
    FA_CUDA_CHECK(cudaEventRecord(stop, cuda_stream));
    FA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    FA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(static_cast<double>(ms));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return summarize(samples);
}

Timing time_host(const std::function<void()>& run, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) run();
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const auto stop = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  return summarize(samples);
}

}  // namespace fa
