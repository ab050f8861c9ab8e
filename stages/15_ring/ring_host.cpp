// The ring on the CPU: P ranks in host memory, FP32, the local passes of stages 01 and 11 in plain
// C++. Every call runs at once, so passes need no ordering; what it checks is the schedule itself.
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "fa/stages.hpp"
#include "rings.hpp"

namespace fa::ring {
namespace {

class HostRing final : public Ring {
 public:
  explicit HostRing(int ranks) : ranks_(ranks), stage_(stages::backward_cpu()) {}

  int ranks() const override { return ranks_; }
  int element_bytes() const override { return sizeof(float); }
  const StageDescriptor& forward_stage() const override { return stage_; }
  const StageDescriptor& backward_stage() const override { return stage_; }

  void* scratch(int rank, Scratch purpose, int64_t bytes) override {
    std::vector<float>& buffer = scratch_[{rank, purpose}];
    const size_t floats = static_cast<size_t>((bytes + 3) / 4);
    if (buffer.size() < floats) buffer.assign(floats, 0.0f);
    return buffer.data();
  }
  Status zero(int, void* data, int64_t bytes) override {
    std::memset(data, 0, static_cast<size_t>(bytes));
    return Status();
  }
  Status gather(int, void* to, const void* from, const RowBlock& part, int64_t row_bytes) override {
    for (int64_t head = 0; head < part.heads; ++head) {
      std::memcpy(static_cast<unsigned char*>(to) + head * part.count * row_bytes,
                  static_cast<const unsigned char*>(from) + (head * part.head_rows + part.first) * row_bytes,
                  static_cast<size_t>(part.count * row_bytes));
    }
    return Status();
  }
  Status forward(int, const ForwardArgs& args) override { return stage_.forward(args); }
  Status backward(int, const BackwardArgs& args) override { return stage_.backward(args); }

  Status store_partial(int, float* slot_out, float* slot_lse, const void* block_out, const float* block_lse,
                       const RowBlock& part, int64_t dim) override {
    const float* out = static_cast<const float*>(block_out);
    for (int64_t head = 0; head < part.heads; ++head) {
      for (int64_t i = 0; i < part.head_rows; ++i) {
        const int64_t row = head * part.head_rows + i;
        const bool inside = i >= part.first && i < part.first + part.count;
        const int64_t block_row = head * part.count + i - part.first;
        slot_lse[row] = inside ? block_lse[block_row] * static_cast<float>(M_LOG2E) : -INFINITY;
        for (int64_t d = 0; d < dim; ++d) slot_out[row * dim + d] = inside ? out[block_row * dim + d] : 0.0f;
      }
    }
    return Status();
  }
  Status merge(int, const float* partial_out, const float* partial_lse, int slots, void* out, float* lse, int64_t rows,
               int64_t dim) override {
    float* o = static_cast<float*>(out);
    for (int64_t row = 0; row < rows; ++row) {
      float row_max = -INFINITY;
      for (int s = 0; s < slots; ++s) row_max = std::fmax(row_max, partial_lse[s * rows + row]);
      const float shift = row_max == -INFINITY ? 0.0f : row_max;
      float sum = 0.0f;
      for (int64_t d = 0; d < dim; ++d) o[row * dim + d] = 0.0f;
      for (int s = 0; s < slots; ++s) {
        const float weight = std::exp2(partial_lse[s * rows + row] - shift);
        sum += weight;
        for (int64_t d = 0; d < dim; ++d) o[row * dim + d] += weight * partial_out[(s * rows + row) * dim + d];
      }
      for (int64_t d = 0; d < dim; ++d) o[row * dim + d] = sum > 0.0f ? o[row * dim + d] / sum : 0.0f;
      if (lse != nullptr) lse[row] = sum > 0.0f ? (row_max + std::log2(sum)) / static_cast<float>(M_LOG2E) : -INFINITY;
    }
    return Status();
  }
  Status accumulate(int, float* sum, const void* block, const RowBlock& part, int64_t dim) override {
    const float* values = static_cast<const float*>(block);
    for (int64_t head = 0; head < part.heads; ++head) {
      for (int64_t i = 0; i < part.count; ++i) {
        float* to = sum + (head * part.head_rows + part.first + i) * dim;
        const float* from = values + (head * part.count + i) * dim;
        for (int64_t d = 0; d < dim; ++d) to[d] += from[d];
      }
    }
    return Status();
  }
  Status convert(int, void* to, const float* from, int64_t elements) override {
    std::memcpy(to, from, static_cast<size_t>(elements) * sizeof(float));
    return Status();
  }
  Status pass_to_next(const std::vector<std::vector<Transfer>>& transfers, int* pass) override {
    for (const std::vector<Transfer>& rank_transfers : transfers) {
      for (const Transfer& transfer : rank_transfers) {
        std::memcpy(transfer.receive, transfer.send, static_cast<size_t>(transfer.bytes));
      }
    }
    *pass = passes_++;
    return Status();
  }
  Status wait_for_pass(int, int) override { return Status(); }
  Status synchronize() override { return Status(); }

 private:
  int ranks_;
  StageDescriptor stage_;
  std::map<std::pair<int, Scratch>, std::vector<float>> scratch_;
  int passes_ = 0;
};

}  // namespace

std::unique_ptr<Ring> make_host_ring(int ranks) { return std::make_unique<HostRing>(ranks); }

}  // namespace fa::ring
