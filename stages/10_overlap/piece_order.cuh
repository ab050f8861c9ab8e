// Stage 10's order of pieces, planned on the host (README, "Persistent blocks" and "The last round"):
// how many blocks start, whether they take their pieces round-robin or from the causal queue, and
// which pieces of the last round are split into parts, with the workspace all of that needs.
// `Tiling` is overlap.cu's: Tiling<kDim> sizes the kernel of one head-dim bucket. The kernel's side
// of the split pieces, their parts and merge, is split_pieces.cuh's.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/kernel/tma_forward.cuh"
#include "fa/kernel/tma_stage.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "last_round.hpp"
#include "split_pieces.cuh"

namespace fa::stages::overlap {

// What the blocks of a launch take: indices below `pieces` (whole pieces, then from `split_from` on
// the `parts` parts of each split piece: split_pieces.cuh), round-robin or, given `queue`, from the
// queue's counter; a part leaves its state in `part_states` and counts itself in `part_arrivals`.
struct PieceOrder {
  int pieces;
  int* queue;
  int split_from;
  int parts;
  float* part_states;
  int* part_arrivals;
};

// The workspace: stage 09's padded copies of Q, K and V where D is not a multiple of 8, then, 16-byte
// aligned, under the causal mask the queue's counter; without it, where pieces may be split (D <= 64
// or > 128, more than one K/V tile), a counter of arrivals per split piece and consumer, then their
// states.
inline int64_t queue_offset(const Problem& problem) {
  return (kernel::tma_workspace_bytes(problem, Pass::forward) + 15) / 16 * 16;
}

struct SplitSpace {
  int64_t arrivals;       // ints
  int64_t states_offset;  // bytes from the workspace's start
  int64_t state_floats;
  int64_t bytes() const { return states_offset + state_floats * 4; }
};

template <template <int> class Tiling, int kDim>
SplitSpace split_space(const Problem& problem) {
  using T = Tiling<kDim>;
  const int64_t pieces = (problem.q_seq + T::kQueryRows - 1) / T::kQueryRows * problem.q_heads_total();
  const int64_t split_pieces = T::kSplitLastRound && problem.kv_seq > T::kKeys ? std::min(pieces, kMaxSplitPieces) : 0;
  const int64_t arrivals = split_pieces * T::kConsumers;
  return {arrivals, queue_offset(problem) + (arrivals * 4 + 15) / 16 * 16,
          arrivals * kMaxParts * kernel::kPartStateFloats<kDim> * kernel::kWarpgroupThreads};
}

template <template <int> class Tiling>
int64_t workspace_bytes(const Problem& problem, Pass pass) {
  if (problem.causal) return queue_offset(problem) + 16;
  const int64_t bytes = kernel::tma_workspace_bytes(problem, pass);
  if (problem.dim <= 64) return std::max(bytes, split_space<Tiling, 64>(problem).bytes());
  if (problem.dim <= 128) return bytes;
  return std::max(bytes, problem.dim <= 192 ? split_space<Tiling, 192>(problem).bytes()
                                            : split_space<Tiling, 256>(problem).bytes());
}

// The order of a launch's `pieces` and the blocks that take them (`blocks`). Persistent blocks, one
// per SM (a block takes an SM's shared memory), each looping over pieces, where O has a tile of its
// own. Under the causal mask the pieces differ in weight, and a fixed round-robin balances them worse
// than the hardware starting one block per piece on whichever SM frees first: there the blocks take
// their pieces from a queue, a counter in the workspace zeroed here (without a workspace, one block
// per piece). At D = 192 and 256 the next Q has to wait for the epilogue anyway: one block per piece,
// and each loops once. Without the mask the pieces are alike: the last round's may be split; blocks
// one per piece run in rounds too, as many at once as there are SMs.
template <template <int> class Tiling, int kDim>
Status plan_pieces(const Problem& problem, int64_t pieces, void* workspace, cudaStream_t stream, PieceOrder* order,
                   int64_t* blocks) {
  using T = Tiling<kDim>;
  unsigned char* const space = static_cast<unsigned char*>(workspace);
  int* queue = nullptr;
  if (T::Layout::kOutTile && problem.causal && space != nullptr) {
    queue = reinterpret_cast<int*>(space + queue_offset(problem));
    FA_CUDA_TRY(cudaMemsetAsync(queue, 0, sizeof(int), stream));
  }
  const bool persistent = T::Layout::kOutTile && (!problem.causal || queue != nullptr);
  LastRound last_round{pieces, 1};
  const SplitSpace split = split_space<Tiling, kDim>(problem);
  int multiprocessors = 0;
  if (persistent || T::kSplitLastRound) {
    int device = 0;
    FA_CUDA_TRY(cudaGetDevice(&device));
    FA_STATUS_TRY(multiprocessor_count(device, &multiprocessors));
  }
  if (!problem.causal && split.arrivals > 0 && space != nullptr) {
    const int64_t tiles = (problem.kv_seq + T::kKeys - 1) / T::kKeys;
    last_round = plan_last_round(pieces, tiles, multiprocessors);
  }
  const int64_t units = last_round.units(pieces);
  FA_STATUS_TRY(check_grid(units));
  *order = {static_cast<int>(units), queue,   static_cast<int>(last_round.split_from),
            last_round.parts,        nullptr, nullptr};
  if (last_round.parts > 1) {
    order->part_arrivals = reinterpret_cast<int*>(space + queue_offset(problem));
    order->part_states = reinterpret_cast<float*>(space + split.states_offset);
    const int64_t arrivals = (pieces - last_round.split_from) * T::kConsumers;
    FA_CUDA_TRY(cudaMemsetAsync(order->part_arrivals, 0, static_cast<std::size_t>(arrivals) * 4, stream));
  }
  *blocks = persistent ? std::min<int64_t>(units, multiprocessors) : units;
  return Status();
}

}  // namespace fa::stages::overlap
