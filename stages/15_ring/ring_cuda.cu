// The ring on GPUs: every rank's calls queued on its compute stream, passes on a pass stream, the
// two ordered by events. The elementwise steps of the schedule (a partial into its slot, a block's
// gradient into a sum, FP32 to the element type) are the small kernels below; the merge is stage 12's.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "fa/device_buffer.hpp"
#include "fa/kernel/convert.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/stages.hpp"
#include "ring_cuda.hpp"
#include "split_kv.hpp"

namespace fa::ring {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride loops: enough blocks to fill any GPU

unsigned blocks_for(int64_t items) {
  return static_cast<unsigned>(std::min<int64_t>(kMaxBlocks, std::max<int64_t>(1, (items + kThreads - 1) / kThreads)));
}

// Slot element (row, d) of the local rows: from the block's packed rows where the task covered the
// row, else O = 0 and LSE = -inf (log2 units, what the merge reads).
template <typename Element>
__global__ void store_partial_kernel(float* slot_out, float* slot_lse, const Element* block_out, const float* block_lse,
                                     RowBlock part, int64_t dim) {
  const int64_t elements = part.heads * part.head_rows * dim;
  for (int64_t index = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; index < elements;
       index += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = index / dim;
    const int64_t d = index % dim;
    const int64_t i = row % part.head_rows;
    const bool inside = i >= part.first && i < part.first + part.count;
    const int64_t block_row = row / part.head_rows * part.count + i - part.first;
    slot_out[index] = inside ? kernel::to_float(block_out[block_row * dim + d]) : 0.0f;
    if (d == 0) slot_lse[row] = inside ? block_lse[block_row] * kernel::kLog2e : -INFINITY;
  }
}

// sum (FP32, all local rows) += block (packed rows of `part`).
template <typename Element>
__global__ void accumulate_kernel(float* sum, const Element* block, RowBlock part, int64_t dim) {
  const int64_t elements = part.heads * part.count * dim;
  for (int64_t index = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; index < elements;
       index += int64_t{gridDim.x} * blockDim.x) {
    const int64_t block_row = index / dim;
    const int64_t row = block_row / part.count * part.head_rows + part.first + block_row % part.count;
    sum[row * dim + index % dim] += kernel::to_float(block[index]);
  }
}

template <typename Element>
__global__ void convert_kernel(Element* to, const float* from, int64_t elements) {
  for (int64_t index = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; index < elements;
       index += int64_t{gridDim.x} * blockDim.x) {
    to[index] = kernel::to_element<Element>(from[index]);
  }
}

// Events of passes are reused every kPassEvents passes: a wait for pass p is always queued before
// pass p + kPassEvents is recorded (the schedule waits for a pass within the next two).
constexpr int kPassEvents = 8;

template <typename Element>
class CudaRing final : public Ring {
 public:
  CudaRing(const std::vector<int>& devices, const LocalStages& stages, std::unique_ptr<Transport> transport,
           bool shared_pass_stream)
      : devices_(devices), stages_(stages), transport_(std::move(transport)) {
    const int ranks = static_cast<int>(devices_.size());
    compute_.resize(ranks);
    pass_stream_.resize(ranks);
    compute_done_.resize(ranks);
    pass_done_.resize(ranks);
    for (int rank = 0; rank < ranks; ++rank) {
      FA_CUDA_CHECK(cudaSetDevice(devices_[rank]));
      FA_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_[rank], cudaStreamNonBlocking));
      if (shared_pass_stream && rank > 0) {
        pass_stream_[rank] = pass_stream_[0];
      } else {
        // The highest priority: NCCL's kernels take their few SMs as soon as the stage's blocks free
        // them, instead of waiting behind the rest of the stage's grid.
        int lowest = 0;
        int highest = 0;
        FA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
        FA_CUDA_CHECK(cudaStreamCreateWithPriority(&pass_stream_[rank], cudaStreamNonBlocking, highest));
      }
      FA_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_[rank], cudaEventDisableTiming));
      for (cudaEvent_t& event : pass_done_[rank])
        FA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
  }

  ~CudaRing() override {
    for (size_t rank = 0; rank < devices_.size(); ++rank) {
      cudaSetDevice(devices_[rank]);
      cudaDeviceSynchronize();
    }
    for (auto& [owner, buffer] : scratch_) {
      cudaSetDevice(devices_[owner.first]);
      buffer = DeviceBuffer();
    }
    for (size_t rank = 0; rank < devices_.size(); ++rank) {
      cudaSetDevice(devices_[rank]);
      cudaStreamDestroy(compute_[rank]);
      if (rank == 0 || pass_stream_[rank] != pass_stream_[0]) cudaStreamDestroy(pass_stream_[rank]);
      cudaEventDestroy(compute_done_[rank]);
      for (cudaEvent_t event : pass_done_[rank]) cudaEventDestroy(event);
    }
  }

  int ranks() const override { return static_cast<int>(devices_.size()); }
  int element_bytes() const override { return sizeof(Element); }
  const StageDescriptor& forward_stage() const override { return stages_.forward; }
  const StageDescriptor& backward_stage() const override { return stages_.backward; }

  void* scratch(int rank, Scratch purpose, int64_t bytes) override {
    DeviceBuffer& buffer = scratch_[{rank, purpose}];
    if (static_cast<int64_t>(buffer.bytes()) < bytes) {
      FA_CUDA_CHECK(cudaSetDevice(devices_[rank]));
      buffer = DeviceBuffer();  // free the old one before asking for the larger
      buffer = DeviceBuffer(static_cast<size_t>(bytes));
    }
    return buffer.get();
  }
  Status zero(int rank, void* data, int64_t bytes) override {
    FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
    FA_CUDA_TRY(cudaMemsetAsync(data, 0, static_cast<size_t>(bytes), compute_[rank]));
    return Status();
  }
  Status gather(int rank, void* to, const void* from, const RowBlock& part, int64_t row_bytes) override {
    FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
    const size_t width = static_cast<size_t>(part.count * row_bytes);
    FA_CUDA_TRY(cudaMemcpy2DAsync(to, width, static_cast<const unsigned char*>(from) + part.first * row_bytes,
                                  static_cast<size_t>(part.head_rows * row_bytes), width,
                                  static_cast<size_t>(part.heads), cudaMemcpyDeviceToDevice, compute_[rank]));
    return Status();
  }
  Status forward(int rank, const ForwardArgs& args) override {
    FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
    ForwardArgs on_stream = args;
    on_stream.stream = compute_[rank];
    return stages_.forward.forward(on_stream);
  }
  Status backward(int rank, const BackwardArgs& args) override {
    FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
    BackwardArgs on_stream = args;
    on_stream.stream = compute_[rank];
    return stages_.backward.backward(on_stream);
  }
  Status store_partial(int rank, float* slot_out, float* slot_lse, const void* block_out, const float* block_lse,
                       const RowBlock& part, int64_t dim) override {
    FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
    store_partial_kernel<Element><<<blocks_for(part.heads * part.head_rows * dim), kThreads, 0, compute_[rank]>>>(
        slot_out, slot_lse, static_cast<const Element*>(block_out), block_lse, part, dim);
    FA_LAUNCH_TRY();
    return Status();
  }
  Status merge(int rank, const float* partial_out, const float* partial_lse, int slots, void* out, float* lse,
               int64_t rows, int64_t dim) override {
    FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
    return stages::split_kv::merge_partials<Element>(partial_out, partial_lse, static_cast<Element*>(out), lse, rows,
                                                     dim, slots, compute_[rank]);
  }
  Status accumulate(int rank, float* sum, const void* block, const RowBlock& part, int64_t dim) override {
    FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
    accumulate_kernel<Element><<<blocks_for(part.heads * part.count * dim), kThreads, 0, compute_[rank]>>>(
        sum, static_cast<const Element*>(block), part, dim);
    FA_LAUNCH_TRY();
    return Status();
  }
  Status convert(int rank, void* to, const float* from, int64_t elements) override {
    FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
    convert_kernel<Element>
        <<<blocks_for(elements), kThreads, 0, compute_[rank]>>>(static_cast<Element*>(to), from, elements);
    FA_LAUNCH_TRY();
    return Status();
  }

  Status pass_to_next(const std::vector<std::vector<Transfer>>& transfers, int* pass) override {
    // A pass starts after what each rank has queued so far: its sends read what that work wrote,
    // its receives overwrite what that work read.
    for (int rank = 0; rank < ranks(); ++rank) {
      FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
      FA_CUDA_TRY(cudaEventRecord(compute_done_[rank], compute_[rank]));
      FA_CUDA_TRY(cudaStreamWaitEvent(pass_stream_[rank], compute_done_[rank], 0));
    }
    FA_STATUS_TRY(transport_->exchange(transfers, pass_stream_));
    *pass = passes_++;
    for (int rank = 0; rank < ranks(); ++rank) {
      FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
      FA_CUDA_TRY(cudaEventRecord(pass_done_[rank][*pass % kPassEvents], pass_stream_[rank]));
    }
    return Status();
  }
  Status wait_for_pass(int rank, int pass) override {
    FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
    FA_CUDA_TRY(cudaStreamWaitEvent(compute_[rank], pass_done_[rank][pass % kPassEvents], 0));
    return Status();
  }
  Status synchronize() override {
    for (int rank = 0; rank < ranks(); ++rank) {
      FA_CUDA_TRY(cudaSetDevice(devices_[rank]));
      FA_CUDA_TRY(cudaStreamSynchronize(compute_[rank]));
      FA_CUDA_TRY(cudaStreamSynchronize(pass_stream_[rank]));
    }
    return Status();
  }

 private:
  std::vector<int> devices_;
  LocalStages stages_;
  std::unique_ptr<Transport> transport_;
  std::vector<cudaStream_t> compute_, pass_stream_;
  std::vector<cudaEvent_t> compute_done_;
  std::vector<std::array<cudaEvent_t, kPassEvents>> pass_done_;
  std::map<std::pair<int, Scratch>, DeviceBuffer> scratch_;
  int passes_ = 0;
};

// P virtual ranks on one GPU: a pass is one device-to-device copy per transfer, on the shared stream.
class LoopbackTransport final : public Transport {
 public:
  Status exchange(const std::vector<std::vector<Transfer>>& transfers,
                  const std::vector<cudaStream_t>& pass_streams) override {
    for (size_t rank = 0; rank < transfers.size(); ++rank) {
      for (const Transfer& transfer : transfers[rank]) {
        FA_CUDA_TRY(cudaMemcpyAsync(transfer.receive, transfer.send, static_cast<size_t>(transfer.bytes),
                                    cudaMemcpyDeviceToDevice, pass_streams[rank]));
      }
    }
    return Status();
  }
};

}  // namespace

std::unique_ptr<Ring> make_cuda_ring(const std::vector<int>& devices, const LocalStages& stages,
                                     std::unique_ptr<Transport> transport, bool shared_pass_stream) {
  if (stages.forward.precision != stages.backward.precision) {
    throw std::invalid_argument("the ring's forward and backward stages must share one precision");
  }
  if (stages.forward.precision == Precision::fp16) {
    return std::make_unique<CudaRing<__half>>(devices, stages, std::move(transport), shared_pass_stream);
  }
  if (stages.forward.precision == Precision::bf16) {
    return std::make_unique<CudaRing<__nv_bfloat16>>(devices, stages, std::move(transport), shared_pass_stream);
  }
  throw std::invalid_argument("the GPU ring takes FP16 or BF16 stages");
}

std::unique_ptr<Ring> make_loopback_ring(int ranks, const LocalStages& stages) {
  int device = 0;
  FA_CUDA_CHECK(cudaGetDevice(&device));
  return make_cuda_ring(std::vector<int>(static_cast<size_t>(ranks), device), stages,
                        std::make_unique<LoopbackTransport>(), true);
}

LocalStages local_stages(Precision precision, int compute_capability, int backward_stage) {
  const bool half = precision == Precision::fp16;
  const bool hopper = compute_capability == 90;
  if (backward_stage != 11 && backward_stage != 13) {
    throw std::invalid_argument("the ring's backward stage is 11 or 13, not " + std::to_string(backward_stage));
  }
  if (backward_stage == 13 && !hopper) {
    throw std::invalid_argument("stage 13's backward runs on an H100 or H200 (sm_90a) only; stage 11's runs here");
  }
  LocalStages local;
  if (hopper) {
    local.forward = half ? stages::overlap_fp16() : stages::overlap_bf16();
  } else {
    local.forward = half ? stages::mma_registers_fp16() : stages::mma_registers_bf16();
  }
  if (backward_stage == 13) {
    local.backward = half ? stages::wgmma_backward_fp16() : stages::wgmma_backward_bf16();
  } else {
    local.backward = half ? stages::backward_fp16() : stages::backward_bf16();
  }
  return local;
}

}  // namespace fa::ring
