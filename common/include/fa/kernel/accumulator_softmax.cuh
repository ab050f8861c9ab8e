// The online softmax on FP32 accumulator fragments (taught in stage 08's README, the online softmax
// on mma.sync's registers; stage 09's, "The wgmma accumulator layout": wgmma's accumulators are the
// same layout, warp by warp). Element 4j + e of a thread's array is row `group` (e < 2) or
// `group + 8` (e >= 2), column 8j + 2·quad + e % 2, where group = lane / 4 and quad = lane % 4; the
// four threads of a quad share the two rows. The running max m is kept in log2 units
// (s · scale · log2 e), so each exponential is one exp2 on the special-function unit; P, rounded to
// 16-bit pairs, is the A operand of P·V where the scores were.
#pragma once

#include <cmath>

#include "fa/kernel/convert.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/warp.cuh"

namespace fa::kernel {

// Scores of keys the row does not see become -inf: the causal mask, the keys past Nk of a partial
// last tile (zero-filled: they must weigh nothing, so -inf, never 0). `tile_key` is the tile's
// first key; the keys of this thread's top row (half 0) and bottom row (half 1) end below
// key_limit(half).
template <int kTiles, typename KeyLimit>
__device__ __forceinline__ void mask_scores(float (&scores)[4 * kTiles], int tile_key, int quad, KeyLimit key_limit) {
  constexpr int kColumns = 8;  // of one accumulator tile
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (tile_key + j * kColumns + 2 * quad + e % 2 >= key_limit(e / 2)) scores[4 * j + e] = -INFINITY;
    }
  }
}

// One tile's step: the tile's row max over the four threads of each row, the new running max m,
// `rescale` = 2^(m_old − m_new) for O and l, then p = 2^(s · scale · log2 e − m) in place of s,
// added into this thread's share of l. The caller rescales O (when and where its schedule says).
// With kSlackLog2 > 0 the max is lazy (FlashAttention-4's; stage 10's README, "The lazy rescale"):
// m moves only when the tile's max passes it by more than kSlackLog2, so p stays at or below 2^kSlackLog2
// and, while no row moves, `rescale` is exactly 1 and O need not be touched.
template <int kTiles, int kSlackLog2 = 0>
__device__ __forceinline__ void online_softmax(float (&scores)[4 * kTiles], float (&row_max)[2], float (&row_sum)[2],
                                               float (&rescale)[2], float scale_log2) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      tile_max = fmaxf(tile_max, fmaxf(scores[4 * j + 2 * half], scores[4 * j + 2 * half + 1]));
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 2));
    if constexpr (kSlackLog2 == 0) {
      const float new_max = fmaxf(row_max[half], tile_max * scale_log2);
      rescale[half] = fast_exp2(row_max[half] - new_max);
      row_max[half] = new_max;
    } else {
      const float tile_max_log2 = tile_max * scale_log2;
      const bool moves = tile_max_log2 > row_max[half] + kSlackLog2;
      rescale[half] = moves ? fast_exp2(row_max[half] - tile_max_log2) : 1.0f;
      if (moves) row_max[half] = tile_max_log2;
    }
    row_sum[half] *= rescale[half];
  }
#pragma unroll
  for (int i = 0; i < 4 * kTiles; ++i) {
    scores[i] = fast_exp2(fmaf(scores[i], scale_log2, -row_max[i % 4 / 2]));
    row_sum[i % 4 / 2] += scores[i];
  }
}

// O rescaled by the factor of its rows (element i of a thread's accumulators is row i % 4 / 2). With
// a lazy max (kSlackLog2 > 0) a warp whose rows all kept their max skips the multiplies.
template <int kSlackLog2, int kElements>
__device__ __forceinline__ void rescale_output(float (&out)[kElements], const float (&rescale)[2]) {
  if (kSlackLog2 > 0 && __all_sync(kFullWarp, rescale[0] == 1.0f && rescale[1] == 1.0f)) return;
#pragma unroll
  for (int i = 0; i < kElements; ++i) out[i] *= rescale[i % 4 / 2];
}

// P as the A operand of P·V in registers: score tiles 2j and 2j + 1 hold keys 16j .. 16j + 15 of
// this thread's two rows, exactly where mma.m16n8k16's A fragment wants them (and wgmma's register
// A, warp by warp): {top row keys 2·quad, +1}, {bottom row, same keys}, {top row, 8 keys on},
// {bottom row, 8 on}.
template <typename Element, int kKeySteps>
__device__ __forceinline__ void pack_probabilities(const float (&scores)[8 * kKeySteps],
                                                   unsigned (&probs)[kKeySteps][4]) {
#pragma unroll
  for (int j = 0; j < kKeySteps; ++j) {
    probs[j][0] = pack_pair<Element>(scores[8 * j + 0], scores[8 * j + 1]);
    probs[j][1] = pack_pair<Element>(scores[8 * j + 2], scores[8 * j + 3]);
    probs[j][2] = pack_pair<Element>(scores[8 * j + 4], scores[8 * j + 5]);
    probs[j][3] = pack_pair<Element>(scores[8 * j + 6], scores[8 * j + 7]);
  }
}

}  // namespace fa::kernel
