// The epilogue of a Hopper attention kernel (taught in stage 09's README, "The block" and "The
// fence.proxy.async rule"): a consumer warpgroup's 64 rows of O, normalized by l, rounded to the
// element type and staged in shared memory in the 128-byte swizzle TMA reads, then stored by the
// copy engine (one box of 64 rows per panel) or, where O cannot be described to TMA, element by
// element. The accumulator layout is accumulator_softmax.cuh's. sm_90 and newer.
#pragma once

#include <cmath>
#include <cstdint>

#include "fa/kernel/convert.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/tma.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/kernel/wgmma_walk.cuh"

namespace fa::kernel {

// l from the four threads of each row; O / l in this thread's places of the warpgroup's rows, which
// start at row `first_tile_row` of `tile` (panels of kPanelBytes), swizzled like the tiles TMA
// writes; and, when `lse` is not null, the log-sum-exp of the rows that exist (`first_row` is the
// warpgroup's first query row of head `query_head`, of q_seq). After it, the writing threads fence
// for the async proxy before TMA reads the staging.
template <typename Element, int kDim, int kPanelBytes>
__device__ __forceinline__ void stage_output_rows(const float (&out)[kDim / 2], const float (&row_max)[2],
                                                  const float (&row_sum)[2], unsigned char* tile, int first_tile_row,
                                                  int warp, int group, int quad, int first_row, int q_seq, float* lse,
                                                  int query_head) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = row_sum[half];
    sum += __shfl_xor_sync(kFullWarp, sum, 1);
    sum += __shfl_xor_sync(kFullWarp, sum, 2);
    // l = 0 only for a row that sees no key (its O is 0 too): it writes zeros, not 0/0.
    const float inverse_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int row = warp * 16 + group + 8 * half;  // within the warpgroup's 64
    const int query_row = first_row + row;
    // LSE = (m + log2 l) · ln 2 (m holds the scale and log2 e); -inf for a row that sees no key.
    if (lse != nullptr && quad == 0 && query_row < q_seq) {
      lse[static_cast<int64_t>(query_head) * q_seq + query_row] =
          sum > 0.0f ? (row_max[half] + log2f(sum)) * kLn2 : -INFINITY;
    }
#pragma unroll
    for (int n = 0; n < kDim / kMmaColumns; ++n) {
      // Columns 8n + 2·quad, +1: panel n / 8, 16-byte chunk n % 8, stored at chunk (n % 8) ^ (row % 8).
      const int offset =
          n / 8 * kPanelBytes + (first_tile_row + row) * kPanelRowBytes + (n % 8 ^ row % kSwizzleRows) * 16 + quad * 4;
      *reinterpret_cast<unsigned*>(tile + offset) =
          pack_pair<Element>(out[4 * n + 2 * half] * inverse_sum, out[4 * n + 2 * half + 1] * inverse_sum);
    }
  }
}

// One thread stores the staged rows (from row `first_tile_row` of `tile`) as one box of 64 rows per
// panel at (first_row, query_head) of `map` (rows past Nq and columns past D are not written), and
// commits the stores as one bulk group.
template <int kPanels, int kPanelBytes>
__device__ __forceinline__ void store_staged_rows(const CUtensorMap* map, unsigned char* tile, int first_tile_row,
                                                  int first_row, int query_head) {
  for (int panel = 0; panel < kPanels; ++panel) {
    copy_box_to_global(map, shared_address(tile + panel * kPanelBytes + first_tile_row * kPanelRowBytes),
                       panel * kPanelColumns, first_row, query_head);
  }
  commit_stores();
}

// The fallback (D not a multiple of 8, or O off a 16-byte boundary): the warpgroup's threads copy
// the staged rows to `o` (rows of `dim` elements) element by element.
template <typename Element, int kPanelBytes>
__device__ __forceinline__ void copy_staged_rows(Element* o, const unsigned char* tile, int first_tile_row, int thread,
                                                 int first_row, int q_seq, int dim, int query_head) {
  for (int index = thread; index < kMmaRows * dim; index += kWarpgroupThreads) {
    const int row = index / dim;
    const int column = index % dim;
    if (first_row + row >= q_seq) break;
    const int offset = column / kPanelColumns * kPanelBytes + (first_tile_row + row) * kPanelRowBytes +
                       ((column % kPanelColumns / 8) ^ (row % kSwizzleRows)) * 16 + column % 8 * 2;
    o[(static_cast<int64_t>(query_head) * q_seq + first_row + row) * dim + column] =
        *reinterpret_cast<const Element*>(tile + offset);
  }
}

}  // namespace fa::kernel
