// Stage 12's device code shared by its two split kernels, split_kv_kernel (split_kv.cu: mma.sync,
// sm_80 on) and wgmma_split_kernel (split_kv_wgmma.cu: wgmma, sm_90a): which rows and keys a block
// takes, the mask and the online softmax on FP32 accumulator fragments, and the block's rows
// written out. Both kernels hold S and O in the same fragment layout
// (stage 08's mma.m16n8 tile: wgmma's accumulators are that layout, warp by warp), one 8-column
// tile after another: element 4j + e of a thread's array is row `group` (e < 2) or `group + 8`
// (e >= 2), column 8j + 2·quad + e % 2, where group = lane / 4 and quad = lane % 4.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "fa/causal.hpp"
#include "fa/cuda_check.hpp"
#include "fa/kernel/accumulator_softmax.cuh"
#include "fa/kernel/convert.cuh"
#include "fa/kernel/cp_async.cuh"
#include "fa/kernel/dependent_launch.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "split_kv.hpp"

namespace fa::stages::split_kv {

using kernel::kFullWarp;
using kernel::kLn2;
using kernel::kWarpSize;
using kernel::launch_dependents;  // programmatic dependent launch (kernel/dependent_launch.cuh)
using kernel::wait_for_prerequisite;
constexpr int kAccumulatorColumns = 8;  // columns of one FP32 accumulator tile: the N of mma.m16n8k16

// What one block computes. Block = (K/V head · row tiles + row tile) · splits + split: the splits of
// one tile are neighbours, and so are the row tiles of one head. Packed row r of a head's group is
// query head r / Nq of the group at position r % Nq; the group's rows are consecutive in Q and O, so
// packed row r is global row kv_head · (Hq/Hkv · Nq) + r.
struct SplitBlock {
  int split = 0;
  int64_t kv_head = 0;
  int64_t head_first_row = 0;  // global row of the head's packed row 0
  int tile_first_row = 0;      // packed row of the tile's row 0
};

__device__ __forceinline__ SplitBlock split_block(unsigned block, int splits, int row_tiles, int packed_rows,
                                                  int tile_rows) {
  __builtin_assume(splits > 0);
  __builtin_assume(row_tiles > 0);
  SplitBlock work;
  work.split = static_cast<int>(block % static_cast<unsigned>(splits));
  const unsigned head_tile = block / static_cast<unsigned>(splits);
  work.tile_first_row = static_cast<int>(head_tile % static_cast<unsigned>(row_tiles)) * tile_rows;
  work.kv_head = head_tile / static_cast<unsigned>(row_tiles);
  work.head_first_row = work.kv_head * packed_rows;
  return work;
}

// The keys of a block: its chunk [begin, begin + chunk_keys), cut at the last key any row of its
// tile sees (causal: the chunks past it load nothing), in `tiles` tiles of `tile_keys`; below
// `unmasked` every row of the tile sees every key, so tiles there need no mask.
struct BlockKeys {
  int begin = 0;
  int tiles = 0;
  int unmasked = 0;
};

__device__ __forceinline__ BlockKeys block_keys(const SplitBlock& work, int packed_rows, int tile_rows, int tile_keys,
                                                int q_seq, int kv_seq, bool causal, int chunk_keys) {
  // The causal rule (fa/causal.hpp) reads the query position r % Nq of packed row r. The tile's
  // rows cover positions first .. last, or every position when they wrap around.
  const int tile_last_row = min(packed_rows, work.tile_first_row + tile_rows) - 1;
  const int first_position = work.tile_first_row % q_seq;
  const int last_position = tile_last_row % q_seq;
  const bool all_positions = tile_last_row - work.tile_first_row + 1 >= q_seq || last_position < first_position;
  const int key_end = max(0, visible_key_limit(all_positions ? q_seq - 1 : last_position, q_seq, kv_seq, causal));
  BlockKeys keys;
  keys.begin = work.split * chunk_keys;
  keys.unmasked = visible_key_limit(all_positions ? 0 : first_position, q_seq, kv_seq, causal);
  const int end = min(key_end, keys.begin + chunk_keys);
  keys.tiles = end > keys.begin ? (end - keys.begin + tile_keys - 1) / tile_keys : 0;
  return keys;
}

// Scores of keys the row does not see become -inf: the causal mask, the keys past Nk of a partial
// last tile (zero-filled: they must weigh nothing, so -inf, never 0). `first_key` is the key of
// element 0 (the tile's first key of this thread's columns, + 2·quad); the rows' keys end below
// top_limit and bottom_limit.
template <int kTiles>
__device__ __forceinline__ void mask_scores(float (&scores)[4 * kTiles], int first_key, int top_limit,
                                            int bottom_limit) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (first_key + j * kAccumulatorColumns + e % 2 >= (e < 2 ? top_limit : bottom_limit)) {
        scores[4 * j + e] = -INFINITY;
      }
    }
  }
}

// Stage 08's online softmax on a tile of scores (the row max over the four threads of each row,
// the rescale of O and l, p = 2^(s · scale · log2 e − m) in place of s): the kit's.
using kernel::online_softmax;

// P as the A fragments of P·V: score tiles 2j and 2j + 1 hold keys 16j .. 16j + 15 of this thread's
// two rows, where mma.m16n8k16's A (and wgmma's register A) wants them: {top row, keys 2·quad and
// +1}, {bottom row, the same}, {top row, 8 keys on}, {bottom row, 8 keys on}.
template <typename Element, int kKeySteps>
__device__ __forceinline__ void pack_probabilities(const float (&scores)[8 * kKeySteps],
                                                   unsigned (&probs)[kKeySteps][4]) {
#pragma unroll
  for (int j = 0; j < kKeySteps; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      probs[j][i] = kernel::pack_pair<Element>(scores[8 * j + 2 * i], scores[8 * j + 2 * i + 1]);
  }
}

// The whole l of each row: the four threads of the row add their shares (all of them, before any
// leaves for a padding row).
__device__ __forceinline__ void add_row_sums(float (&row_sum)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_sum[half] += __shfl_xor_sync(kFullWarp, row_sum[half], 1);
    row_sum[half] += __shfl_xor_sync(kFullWarp, row_sum[half], 2);
  }
}

// This thread's share of rows `first_row + group` and `+ 8` (packed rows), normalized by l (0 for a
// row that saw no key of the chunk: it writes zeros). One split (partial_out null): O in the element
// type and the LSE in natural-log units. Several: FP32 O_s and LSE_s in log2 units, row `row` of
// split s at s · (B·Hq·Nq) + row, for merge_partials_kernel.
template <typename Element, int kDim>
__device__ __forceinline__ void write_rows(const float (&out)[kDim / 2], const float (&row_max)[2],
                                           const float (&row_sum)[2], int first_row, int group, int quad,
                                           int packed_rows, int64_t head_first_row, int dim, int split, int64_t q_rows,
                                           Element* o, float* lse, float* partial_out, float* partial_lse) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float sum = row_sum[half];
    const int row = first_row + group + 8 * half;
    if (row >= packed_rows) continue;
    const float inverse_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
    const float log2_sum_exp = sum > 0.0f ? row_max[half] + log2f(sum) : -INFINITY;
    const int64_t global_row = head_first_row + row;
    const int64_t partial_row = split * q_rows + global_row;
#pragma unroll
    for (int n = 0; n < kDim / kAccumulatorColumns; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int column = n * kAccumulatorColumns + 2 * quad + e;
        if (column >= dim) continue;
        const float value = out[4 * n + 2 * half + e] * inverse_sum;
        if (partial_out == nullptr) {
          o[global_row * dim + column] = kernel::to_element<Element>(value);
        } else {
          partial_out[partial_row * dim + column] = value;
        }
      }
    }
    if (quad != 0) continue;
    if (partial_out == nullptr) {
      if (lse != nullptr) lse[global_row] = log2_sum_exp * kLn2;
    } else {
      partial_lse[partial_row] = log2_sum_exp;
    }
  }
}

// Host side: launches a split kernel of either kind (both take these parameters) on split_grid's
// blocks, `threads` a block, with `shared_bytes` of dynamic shared memory.
template <typename Element, typename Kernel>
Status launch_split_kernel(Kernel* kernel, int threads, int shared_bytes, const ForwardArgs& args,
                           const KeySplit& split, float* partial_out, float* partial_lse) {
  const Problem& problem = args.problem;
  FA_STATUS_TRY(opt_in_shared_memory(kernel, shared_bytes));
  const SplitGrid grid = split_grid(problem, split);
  FA_STATUS_TRY(check_grid(grid.blocks));
  // Every count fits an int: the runner checked the problem against validate_problem's limits.
  kernel<<<static_cast<unsigned>(grid.blocks), threads, shared_bytes, args.stream>>>(
      static_cast<const Element*>(args.q), static_cast<const Element*>(args.k), static_cast<const Element*>(args.v),
      static_cast<Element*>(args.o), args.lse, partial_out, partial_lse, static_cast<int>(problem.q_seq),
      static_cast<int>(problem.kv_seq), static_cast<int>(problem.dim), static_cast<int>(grid.packed_rows),
      static_cast<int>(grid.row_tiles), static_cast<int>(split.splits), static_cast<int>(split.chunk_keys),
      problem.q_rows(), problem.causal, softmax_scale(problem) * kernel::kLog2e);
  FA_LAUNCH_TRY();
  return Status();
}

}  // namespace fa::stages::split_kv
