// The ceiling of stage 12's work: how fast this GPU reads memory when it does nothing else. A
// decoding step is reading K and V, so no kernel can be faster than these bytes at this rate; the
// README reports the stage and cuDNN as a share of it, beside the copy bandwidth's floor (a copy
// mixes reads and writes, and a stream of reads alone runs some percent faster).
//
// The read is the stage's own: every block streams its share of two buffers (K and V, 4 GiB each,
// or a quarter of the free memory each on a smaller GPU: long enough that the launch and the last
// blocks' tail are a fraction of a percent)
// through a three-stage ring of 64-row tiles of 256 bytes a row (D = 128 in 16-bit elements) with
// stage 07's cp.async copies, and computes nothing. Once with one block per SM and once with two;
// the faster counts.
//
//   fa_read_ceiling           prints "read_bandwidth,<GB/s>,GB/s"
//
// A rate above the memory's peak (two transfers a clock over the whole bus, from the device's
// attributes) would be a timing error: the tool reports it and fails.
// Exit codes: 0 ok, 2 an argument (it takes none; --help prints its usage), 4 no CUDA device or one
// older than sm_80, 5 a CUDA error (or less than 1 GiB of free GPU memory), 6 a rate above the peak.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/kernel/cp_async.cuh"
#include "fa/no_arguments.hpp"
#include "fa/timing.hpp"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_READ_CEILING_DEVICE_CODE 1
#else
#define FA_READ_CEILING_DEVICE_CODE 0
#endif

namespace {

constexpr int kThreads = 128;
constexpr int kStages = 3;
constexpr int kTileBytes = 64 * 256;  // 64 keys of D = 128, 16-bit elements
constexpr int kSharedBytes = kStages * 2 * kTileBytes;
constexpr int64_t kLargestBufferBytes = int64_t{4} << 30;
constexpr int64_t kSmallestBufferBytes = int64_t{256} << 20;  // still several times any GPU's L2
constexpr double kPeakMargin = 1.02;  // timing jitter allowed above the peak before it is an error

// Non-zero bytes that vary (zeros could let the hardware and its power management cheat).
__global__ void fill(uint32_t* buffer, int64_t words, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words; i += int64_t{gridDim.x} * blockDim.x) {
    buffer[i] = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  }
}

// Block b streams tiles [T·b/grid, T·(b+1)/grid) of the T = `tiles_total` tiles of both buffers: wait for the oldest
// tile, refill the slot freed one iteration ago, touch one byte of the tile so that it is read.
__global__ void __launch_bounds__(kThreads)
    stream_tiles(const unsigned char* keys, const unsigned char* values, int64_t tiles_total, int* sink) {
#if FA_READ_CEILING_DEVICE_CODE
  using fa::kernel::commit_copies;
  using fa::kernel::copy_async_16;
  using fa::kernel::wait_copies;
  extern __shared__ __align__(128) unsigned char ring[];
  const int64_t first = tiles_total * blockIdx.x / gridDim.x;
  const int tiles = static_cast<int>(tiles_total * (blockIdx.x + 1) / gridDim.x - first);
  const auto issue = [&](int tile) {
    unsigned char* slot = ring + tile % kStages * 2 * kTileBytes;
    const int64_t offset = (first + tile) * kTileBytes;
#pragma unroll
    for (int pass = 0; pass < kTileBytes / 16 / kThreads; ++pass) {
      const int chunk = pass * kThreads + threadIdx.x;
      copy_async_16(slot + chunk * 16, keys + offset + chunk * 16, 16);
      copy_async_16(slot + kTileBytes + chunk * 16, values + offset + chunk * 16, 16);
    }
  };
  for (int tile = 0; tile < kStages - 1; ++tile) {
    if (tile < tiles) issue(tile);
    commit_copies();
  }
  int touched = 0;
  for (int tile = 0; tile < tiles; ++tile) {
    wait_copies<kStages - 2>();
    __syncthreads();
    if (tile + kStages - 1 < tiles) issue(tile + kStages - 1);
    commit_copies();
    touched += ring[tile % kStages * 2 * kTileBytes + threadIdx.x];
  }
  wait_copies<0>();
  if (touched == -1) *sink = touched;  // never true: keeps the reads observable
#else
  (void)keys;
  (void)values;
  (void)tiles_total;
  (void)sink;
  __trap();  // never launched: main() refuses GPUs older than sm_80
#endif
}

// Median GB/s (bytes read per second) of timed launches of `blocks` blocks after warm-up ones.
double measure(int blocks, const unsigned char* keys, const unsigned char* values, int64_t buffer_bytes, int* sink) {
  constexpr int kWarmup = 3;
  constexpr int kReps = 11;
  const fa::Timing timing = fa::time_cuda(
      [&] {
        stream_tiles<<<blocks, kThreads, kSharedBytes>>>(keys, values, buffer_bytes / kTileBytes, sink);
        FA_CUDA_CHECK(cudaGetLastError());
      },
      kWarmup, kReps, nullptr);
  return 2.0 * buffer_bytes / (timing.ms_median / 1e3) / 1e9;
}

// The device's read ceiling in GB/s; 0 with a message when it has too little free memory. Throws
// fa::CudaError on a CUDA error.
double read_ceiling(int sms) {
  FA_CUDA_CHECK(cudaFuncSetAttribute(stream_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int64_t buffer_bytes =
      std::min<int64_t>(kLargestBufferBytes, static_cast<int64_t>(free_bytes) / 4) / kTileBytes * kTileBytes;
  if (buffer_bytes < kSmallestBufferBytes) {
    std::fprintf(stderr, "fa_read_ceiling: %.0f MiB of GPU memory free; it needs at least %lld MiB\n",
                 free_bytes / 1048576.0, static_cast<long long>(4 * kSmallestBufferBytes >> 20));
    return 0.0;
  }
  unsigned char* keys = nullptr;
  unsigned char* values = nullptr;
  int* sink = nullptr;
  FA_CUDA_CHECK(cudaMalloc(&keys, buffer_bytes));
  FA_CUDA_CHECK(cudaMalloc(&values, buffer_bytes));
  FA_CUDA_CHECK(cudaMalloc(&sink, sizeof(int)));
  fill<<<sms * 4, 256>>>(reinterpret_cast<uint32_t*>(keys), buffer_bytes / 4, 0x9e3779b9u);
  fill<<<sms * 4, 256>>>(reinterpret_cast<uint32_t*>(values), buffer_bytes / 4, 0x7f4a7c15u);
  FA_CUDA_CHECK(cudaGetLastError());
  const double gbps =
      std::max(measure(sms, keys, values, buffer_bytes, sink), measure(2 * sms, keys, values, buffer_bytes, sink));
  cudaFree(keys);
  cudaFree(values);
  cudaFree(sink);
  return gbps;
}

}  // namespace

int main(int argc, char** argv) {
  const int answered = fa::answer_no_arguments(
      argc, argv, "fa_read_ceiling",
      "prints \"read_bandwidth,<GB/s>,GB/s\"\n"
      "exit codes: 0 ok, 2 an argument, 4 no CUDA device or one older than sm_80, 5 a CUDA error,\n"
      "6 a rate above the peak");
  if (answered >= 0) return answered;
  const fa::DeviceInfo gpu = fa::query_device();
  if (!gpu.present) {
    std::fprintf(stderr, "fa_read_ceiling: %s\n", gpu.reason.c_str());
    return 4;
  }
  if (gpu.compute_capability < 80) {
    std::fprintf(stderr, "fa_read_ceiling: %s is sm_%d; cp.async needs sm_80\n", gpu.name.c_str(),
                 gpu.compute_capability);
    return 4;
  }
  int device = 0;
  int memory_khz = 0;
  int bus_bits = 0;
  double gbps = 0.0;
  try {
    FA_CUDA_CHECK(cudaGetDevice(&device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, device));
    FA_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
    gbps = read_ceiling(gpu.multiprocessors);
  } catch (const fa::CudaError& error) {
    std::fprintf(stderr, "fa_read_ceiling: %s\n", error.what());
    return 5;
  }
  if (gbps == 0.0) return 5;
  const double peak_gbps = 2.0 * memory_khz * 1e3 * bus_bits / 8 / 1e9;
  if (gbps > kPeakMargin * peak_gbps) {
    std::fprintf(stderr, "fa_read_ceiling: measured %.1f GB/s, above the memory's peak of %.1f GB/s: a timing error\n",
                 gbps, peak_gbps);
    return 6;
  }
  std::printf("read_bandwidth,%.6g,GB/s\n", gbps);
  return 0;
}
