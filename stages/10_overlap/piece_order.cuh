// Stage 10's order of pieces (README, "Persistent blocks" and "The last round"): which pieces a block
// computes and when. Up to D = 128 the blocks are persistent, one per SM: without the mask each takes
// blockIdx.x, blockIdx.x + gridDim.x, ...; under it, blockIdx.x and then whichever piece is next in a
// queue (a counter in the workspace; kernel/tma_forward.cuh, produce_pieces). Without the mask the
// last round's pieces may be split by their key tiles into parts (last_round.hpp plans them,
// split_pieces.cuh computes them). Here: the kernel's arguments for that order, the workspace they
// take, and the grid.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/kernel/mbarrier.cuh"
#include "fa/kernel/tma_forward.cuh"
#include "fa/kernel/tma_stage.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "last_round.hpp"

namespace fa::stages::overlap {

// What the kernel needs besides the count of pieces and parts: the queue's counter (null: the pieces
// in turn), the first split piece (the count of pieces where none is) and the parts of each, and the
// split pieces' states and arrivals.
struct PieceOrder {
  int* queue = nullptr;
  int split_from = 0;
  int parts = 1;
  float* part_states = nullptr;
  int* part_arrivals = nullptr;
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

// T: the head-dim bucket's Tiling (overlap.cu).
template <int kDim, typename T>
SplitSpace split_space(const Problem& problem) {
  const int64_t pieces = (problem.q_seq + T::kQueryRows - 1) / T::kQueryRows * problem.q_heads_total();
  const int64_t split_pieces = T::kSplitLastRound && problem.kv_seq > T::kKeys ? std::min(pieces, kMaxSplitPieces) : 0;
  const int64_t arrivals = split_pieces * T::kConsumers;
  return {arrivals, queue_offset(problem) + (arrivals * 4 + 15) / 16 * 16,
          arrivals * kMaxParts * kernel::kPartStateFloats<kDim> * kernel::kWarpgroupThreads};
}

template <int kDim, typename T>
int64_t workspace_bytes(const Problem& problem, Pass pass) {
  if (problem.causal) return queue_offset(problem) + 16;
  const int64_t bytes = kernel::tma_workspace_bytes(problem, pass);
  return T::kSplitLastRound ? std::max(bytes, split_space<kDim, T>(problem).bytes()) : bytes;
}

// The order of `pieces` pieces, and the grid: persistent blocks, one per SM (a block takes an SM's
// shared memory), each looping over pieces, where O has a tile of its own. Under the causal mask the
// pieces differ in weight, and a fixed round-robin balances them worse than the hardware starting one
// block per piece on whichever SM frees first: there the blocks take their pieces from the queue,
// zeroed here (without a workspace, one block per piece). At D = 192 and 256 the next Q has to wait
// for the epilogue anyway: one block per piece, and each loops once. Without the mask the pieces are
// alike: the last round's may be split. Blocks one per piece run in rounds too: as many at once as
// there are SMs. `units`: the pieces and parts of the launch.
template <int kDim, typename T>
Status plan_pieces(const ForwardArgs& args, int64_t pieces, PieceOrder* order, int64_t* units, int64_t* blocks) {
  const Problem& problem = args.problem;
  unsigned char* workspace = static_cast<unsigned char*>(args.workspace);
  *order = PieceOrder{};
  if (T::Layout::kOutTile && problem.causal && workspace != nullptr) {
    order->queue = reinterpret_cast<int*>(workspace + queue_offset(problem));
    FA_CUDA_TRY(cudaMemsetAsync(order->queue, 0, sizeof(int), args.stream));
  }
  const bool persistent = T::Layout::kOutTile && (!problem.causal || order->queue != nullptr);
  LastRound last_round{pieces, 1};
  const SplitSpace split = split_space<kDim, T>(problem);
  int multiprocessors = 0;
  if (persistent || T::kSplitLastRound) {
    int device = 0;
    FA_CUDA_TRY(cudaGetDevice(&device));
    FA_STATUS_TRY(multiprocessor_count(device, &multiprocessors));
  }
  if (!problem.causal && split.arrivals > 0 && workspace != nullptr) {
    const int64_t tiles = (problem.kv_seq + T::kKeys - 1) / T::kKeys;
    last_round = plan_last_round(pieces, tiles, multiprocessors);
  }
  order->split_from = static_cast<int>(last_round.split_from);
  order->parts = last_round.parts;
  if (last_round.parts > 1) {
    order->part_arrivals = reinterpret_cast<int*>(workspace + queue_offset(problem));
    order->part_states = reinterpret_cast<float*>(workspace + split.states_offset);
    const int64_t arrivals = (pieces - last_round.split_from) * T::kConsumers;
    FA_CUDA_TRY(cudaMemsetAsync(order->part_arrivals, 0, static_cast<std::size_t>(arrivals) * 4, args.stream));
  }
  *units = last_round.units(pieces);
  *blocks = persistent ? std::min<int64_t>(*units, multiprocessors) : *units;
  return check_grid(*units);
}

// A block's next piece after piece `index`, the round-th it computed: the next in turn, or the
// queue's, whose index the producer wrote beside the next Q (`pieces` when there is none).
template <int kQueryBuffers>
__device__ __forceinline__ int64_t next_piece(int64_t index, int round, const int* queue, uint64_t* query_full,
                                              int* piece_slots) {
  if (queue == nullptr) return index + gridDim.x;
  kernel::barrier_wait(&query_full[(round + 1) % kQueryBuffers], ((round + 1) / kQueryBuffers) & 1);
  return atomicAdd(&piece_slots[(round + 1) % kQueryBuffers], 0);
}

}  // namespace fa::stages::overlap
