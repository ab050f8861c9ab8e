// The ceiling of stage 08's instruction: how many TFLOP/s mma.sync.m16n8k16 (FP32 accumulation)
// reaches on this GPU when it does nothing else. Every warp runs independent chains of products
// on fragments that never leave its registers, so no memory or softmax work stands in the way;
// stage 08's README reports its speed as a percentage of this number.
//
//   fa_mma_ceiling            prints "fp16_mma_sync,<TFLOP/s>,TFLOP/s" and the BF16 line
//
// Exit codes: 0 ok, 2 an argument (it takes none; --help prints its usage), 4 no CUDA device or one
// older than sm_80, 5 a CUDA error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "fa/device.hpp"
#include "fa/no_arguments.hpp"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_MMA_CEILING_DEVICE_CODE 1
#else
#define FA_MMA_CEILING_DEVICE_CODE 0
#endif

namespace {

constexpr int kChains = 8;  // independent accumulators per warp: enough to hide the mma latency
constexpr int kIterations = 4096;
constexpr int kWarpsPerBlock = 4;
constexpr int kBlocksPerSm = 8;
constexpr double kFlopsPerMma = 2.0 * 16 * 8 * 16;

template <bool kBf16>
__global__ void mma_chains(float* sink) {
#if FA_MMA_CEILING_DEVICE_CODE
  // Non-zero operands derived from the thread index (zeros could let the hardware save power).
  const unsigned seed = 0x3c003c00u ^ (threadIdx.x * 0x00010001u);
  const unsigned a[4] = {seed, seed ^ 0x1u, seed ^ 0x2u, seed ^ 0x3u};
  const unsigned b[2] = {seed ^ 0x4u, seed ^ 0x5u};
  float c[kChains][4] = {};
#pragma unroll 1
  for (int i = 0; i < kIterations; ++i) {
#pragma unroll
    for (int chain = 0; chain < kChains; ++chain) {
      if constexpr (kBf16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[chain][0]), "+f"(c[chain][1]), "+f"(c[chain][2]), "+f"(c[chain][3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
      } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[chain][0]), "+f"(c[chain][1]), "+f"(c[chain][2]), "+f"(c[chain][3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
      }
    }
  }
  float total = 0.0f;
#pragma unroll
  for (int chain = 0; chain < kChains; ++chain) total += c[chain][0] + c[chain][1] + c[chain][2] + c[chain][3];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = total;  // the products must be observable
#else
  (void)sink;
  __trap();  // never launched: main() refuses GPUs older than sm_80
#endif
}

bool ok(cudaError_t code, const char* what) {
  if (code == cudaSuccess) return true;
  std::fprintf(stderr, "fa_mma_ceiling: %s: %s\n", what, cudaGetErrorString(code));
  return false;
}

// Median TFLOP/s of timed launches after warm-up ones.
template <bool kBf16>
bool measure(int blocks, float* sink, double& tflops) {
  constexpr int kWarmup = 3;
  constexpr int kReps = 11;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  if (!ok(cudaEventCreate(&start), "cudaEventCreate") || !ok(cudaEventCreate(&stop), "cudaEventCreate")) return false;
  std::vector<float> times;
  bool fine = true;
  for (int rep = 0; rep < kWarmup + kReps && fine; ++rep) {
    fine = ok(cudaEventRecord(start), "cudaEventRecord");
    mma_chains<kBf16><<<blocks, kWarpsPerBlock * 32>>>(sink);
    fine = fine && ok(cudaGetLastError(), "launch") && ok(cudaEventRecord(stop), "cudaEventRecord") &&
           ok(cudaEventSynchronize(stop), "kernel");
    float ms = 0.0f;
    fine = fine && ok(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (rep >= kWarmup) times.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!fine) return false;
  std::nth_element(times.begin(), times.begin() + kReps / 2, times.end());
  const double mmas = static_cast<double>(blocks) * kWarpsPerBlock * kIterations * kChains;
  tflops = mmas * kFlopsPerMma / (times[kReps / 2] / 1e3) / 1e12;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const int answered = fa::answer_no_arguments(
      argc, argv, "fa_mma_ceiling",
      "prints \"fp16_mma_sync,<TFLOP/s>,TFLOP/s\" and the BF16 line\n"
      "exit codes: 0 ok, 2 an argument, 4 no CUDA device or one older than sm_80, 5 a CUDA error");
  if (answered >= 0) return answered;
  const fa::DeviceInfo gpu = fa::query_device();
  if (!gpu.present) {
    std::fprintf(stderr, "fa_mma_ceiling: %s\n", gpu.reason.c_str());
    return 4;
  }
  if (gpu.compute_capability < 80) {
    std::fprintf(stderr, "fa_mma_ceiling: %s is sm_%d; mma.sync.m16n8k16 needs sm_80\n", gpu.name.c_str(),
                 gpu.compute_capability);
    return 4;
  }
  const int blocks = gpu.multiprocessors * kBlocksPerSm;
  float* sink = nullptr;
  if (!ok(cudaMalloc(&sink, sizeof(float) * blocks * kWarpsPerBlock * 32), "cudaMalloc")) return 5;
  double fp16 = 0.0;
  double bf16 = 0.0;
  const bool fine = measure<false>(blocks, sink, fp16) && measure<true>(blocks, sink, bf16);
  cudaFree(sink);
  if (!fine) return 5;
  std::printf("fp16_mma_sync,%.6g,TFLOP/s\nbf16_mma_sync,%.6g,TFLOP/s\n", fp16, bf16);
  return 0;
}
