// Stage 10's last round on the device (README, "The last round"): the parts a split piece is computed
// in and their merge. The host's plan of the parts is last_round.hpp's; piece_order.cuh's sizes the
// grid and the workspace.
#pragma once

#include <cstdint>

#include "fa/kernel/tma_forward.cuh"

namespace fa::stages::overlap {

// The pieces of a launch whose last round is split (README, "The last round"): from `split_from` on,
// index split_from + s · parts + p is part p of piece split_from + s, its key tiles
// p · tiles / parts .. (p + 1) · tiles / parts - 1. Without kSplit every index is a whole piece.
// kConsumers: the consumer warpgroups of a block, each of which keeps a state of its own.
template <bool kSplit, int kConsumers>
struct SplitPieces {
  const int& split_from;
  const int& parts;

  __device__ __forceinline__ int64_t piece_of(int64_t index) const { return (index - split_from) / parts; }
  __device__ __forceinline__ int part_of(int64_t index) const { return static_cast<int>((index - split_from) % parts); }
  __device__ __forceinline__ bool is_part(int64_t index) const { return kSplit && index >= split_from; }

  // The piece or part at `index`, given `whole`(i), the whole piece i (kernel::piece_at).
  template <typename WholePiece>
  __device__ __forceinline__ kernel::Piece at(int64_t index, const WholePiece& whole) const {
    if (!is_part(index)) return whole(index);
    kernel::Piece piece = whole(split_from + piece_of(index));
    const int part = part_of(index);
    piece.first_tile = part * piece.tiles / parts;
    piece.tiles = (part + 1) * piece.tiles / parts;
    return piece;
  }

  // A consumer warpgroup's epilogue of the piece or part at `index`: a part leaves its state in the
  // workspace (`states`, `arrivals`: kernel::merge_parts), and the last of its piece's parts to arrive
  // merges them all. Whether this warpgroup writes the rows: the others pass through the epilogue
  // with their first row at Nq, where nothing is written (a branch around it would move the loop's
  // matrix descriptors out of uniform registers: ptxas 13.0).
  template <int kOutFloats>
  __device__ __forceinline__ bool merge(int64_t index, float (&out)[kOutFloats], float (&row_max)[2],
                                        float (&row_sum)[2], float* states, int* arrivals, int consumer,
                                        int thread) const {
    constexpr int kDim = 2 * kOutFloats;
    if (!is_part(index)) return true;
    const int64_t slot = piece_of(index) * kConsumers + consumer;
    return kernel::merge_parts<kDim>(out, row_max, row_sum,
                                     states + slot * parts * kernel::kPartStateFloats<kDim> * kernel::kWarpgroupThreads,
                                     arrivals + slot, parts, part_of(index), consumer, thread);
  }
};

}  // namespace fa::stages::overlap
