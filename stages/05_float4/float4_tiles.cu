// Stage 05: FP32 FlashAttention limited by arithmetic: 128-bit loads and register micro-tiles.
//
// Stage 04 does the right arithmetic but spends its instructions elsewhere: every multiply-add
// needs its own 32-bit shared-memory load, and data moves one float per instruction. An SM issues
// one instruction per cycle per scheduler, so a load, an address computation and an FFMA all cost
// the same slot, and FFMAs end up a minority. This stage keeps stage 04's algorithm (one pass over
// K/V, running max m and sum l, the accumulator left unnormalized and divided by l once at the
// end, as in FlashAttention-2) and changes how data moves:
//
//  1. 128 bits at a time. Global -> shared and shared -> registers use float4: one instruction
//     for four floats (ld.global.v4.f32, ld.shared.v4.f32). That needs D % 4 == 0 and 16-byte
//     aligned tensors; otherwise the very same loops do four guarded scalar loads instead (hybrid
//     loading), so any D from 1 to 256 and any pointer still work.
//  2. Register micro-tiles. With D = 128, a thread computes an 8 x 4 block of the 128 x 64 score
//     tile and owns an 8 x 8 block of the 128 x 128 output accumulator. Each float it reads from
//     shared memory then feeds 4 or 8 FFMAs instead of one, as in a hand-written SGEMM.
//
// Work layout. A block owns kQueryRows query rows of one head; each warp owns 2 * kRowsPerThread
// of them (FlashAttention-2's split: no warp needs another warp's rows). Inside a warp,
// lane = 2 * column_group + row_group:
//   - row_group (0, 1) takes the warp's rows alternately: row = warp_row0 + row_group + 2 * i;
//   - column_group (0..15) takes keys column_group + 16 * j of every K/V tile, and the head dims
//     of float4 number column_group + 16 * c of the output.
// A row's scores are spread over the 16 lanes of one row group, so its max and its sum are warp
// shuffles; the probabilities go through a small per-warp shared buffer because P·V needs every key
// of a row in every lane.
//
// Head dims are compiled in buckets (64, 128, 256); a smaller D runs in the next bucket up with
// its extra dims zero in shared memory, which changes no dot product and keeps every loop bound a
// compile-time constant.
//
// Causal masking (query i sees keys 0..i; the rule is written once, in common/include/fa/causal.hpp)
// is a second instantiation of the kernel: a block stops at the last K/V tile its last row can
// see, so tiles wholly above the diagonal are never loaded; only the tiles that cross the diagonal
// are masked key by key; the blocks with the most tiles are launched first
// (common/include/fa/kernel/launch_order.cuh). The non-causal instantiation is the kernel without
// any of it.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fa/cuda_check.hpp"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/launch_order.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"

namespace fa::stages {
namespace {

using kernel::kFullWarp;
using kernel::kWarpSize;       // common/include/fa/kernel/warp.cuh: the warp this stage introduces
constexpr int kRowGroups = 2;  // row groups per warp: lane & 1
constexpr int kColumnGroups = kWarpSize / kRowGroups;  // lanes that share a row group: lane >> 1
constexpr int kMaxDim = 256;
using kernel::kLog2e;

// One compiled configuration: head-dim bucket, warps per block, rows per thread (TM) and keys per
// K/V tile (Bc). Every size below follows from these four.
//
// Shared memory, in floats (each region starts 16-byte aligned):
//   q_tile [kQueryRows][kRowStride]    this block's queries, pre-scaled (loaded once per head)
//   k_tile [kKeysPerTile][kRowStride]  the current keys
//   v_tile [kKeysPerTile][kRowStride]  the current values
//   probs  [kWarps][kRowGroups][kKeysPerTile][kProbKeyStride]  each warp's P, key-major
//
// Bank conflicts. Shared memory has 32 banks of 4 bytes; a 16-byte load is served a quarter warp
// (8 lanes, 128 bytes) at a time, conflict-free when those 8 lanes hit 8 different 16-byte bank
// groups or the same address. The paddings are chosen so that every micro-tile access is:
//   - K reads: 16 column groups read keys column_group + 16j at the same dim. A row stride of
//     D + 4 floats moves each key 4 banks over, so 8 consecutive keys cover all 32 banks.
//   - Q reads: the warp reads 2 adjacent rows (one per row group), 4 banks apart; each is a
//     broadcast to 16 lanes.
//   - V reads: 16 consecutive float4 of one row: conflict-free whatever the stride.
//   - P writes: a quarter warp is 4 keys x 2 row groups. Keys kProbKeyStride apart (12 floats for
//     TM = 8, 8 for TM = 4) fill 4 of the 8 bank groups, and the row-group halves, offset by
//     kProbGroupStride = 16 or 4 (mod 32) floats, fill the other 4.
//   - P reads: 2 addresses per warp (one per row group), in different banks; both broadcasts.
// The lane layout also pairs lanes that read the same address (lanes 2n and 2n+1 read the same K
// and V; lanes n and n^2 the same Q and P). A 16-byte load returns 512 bytes to a warp, 4 cycles
// of shared-memory bandwidth; with such pairs the hardware can return it in 2 (documented for
// sm_70/75: see the README).
template <int kDim_, int kWarps_, int kRowsPerThread_, int kKeysPerTile_>
struct Tiling {
  static constexpr int kDim = kDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kRowsPerThread = kRowsPerThread_;  // TM
  static constexpr int kRowsPerWarp = kRowGroups * kRowsPerThread;
  static constexpr int kQueryRows = kWarps * kRowsPerWarp;             // Br
  static constexpr int kKeysPerTile = kKeysPerTile_;                   // Bc
  static constexpr int kKeysPerThread = kKeysPerTile / kColumnGroups;  // TN
  static constexpr int kChunksPerRow = kDim / 4;                       // float4 per row of Q, K, V
  static constexpr int kOutputChunks = kChunksPerRow / kColumnGroups;  // float4 of O per thread and row

  static constexpr int kRowStride = kDim + 4;
  static constexpr int kProbKeyStride = kRowsPerThread + 4;
  static constexpr int kProbGroupStride = kKeysPerTile * kProbKeyStride + (kRowsPerThread == 8 ? 16 : 4);
  static constexpr int kProbWarpStride = kRowGroups * kProbGroupStride;

  static constexpr int kQueryFloats = kQueryRows * kRowStride;
  static constexpr int kTileFloats = kKeysPerTile * kRowStride;
  static constexpr int kSharedFloats = kQueryFloats + 2 * kTileFloats + kWarps * kProbWarpStride;
  static constexpr std::size_t kSharedBytes = kSharedFloats * sizeof(float);

  // float4 chunks each thread copies from global memory per Q tile and per K or V tile.
  static constexpr int kQueryLoads = kQueryRows * kChunksPerRow / kThreads;
  static constexpr int kTileLoads = kKeysPerTile * kChunksPerRow / kThreads;
  static constexpr int kRowStep = kThreads / kChunksPerRow;  // rows the whole block copies per chunk
  // The next K/V tile is fetched into registers while P·V runs, when that takes at most 64
  // registers (2 x 8 float4); otherwise (only the 64-thread T4 fallback at D = 256) after P·V.
  static constexpr bool kPrefetch = kTileLoads <= 8;

  static_assert(kRowsPerThread == 4 || kRowsPerThread == 8, "P is read as float4 and padded for TM = 4 or 8");
  static_assert(kKeysPerTile % kColumnGroups == 0, "every column group gets the same number of keys");
  static_assert(kChunksPerRow % kColumnGroups == 0, "every column group gets the same number of output dims");
  static_assert(kThreads % kChunksPerRow == 0 && kKeysPerTile % kRowStep == 0 && kQueryRows % kRowStep == 0,
                "every thread copies the same number of whole chunks, always in the same column");
  static_assert(kKeysPerTile * kProbKeyStride % 32 == 0, "the row-group offset sets the P bank pattern alone");
};

// The configurations, largest first; the launcher takes the first that fits the GPU's shared
// memory per block. The first of each bucket is the one tuned for an H100/H200 (227 KB); the last
// fits the 64 KB of a T4 (sm_75); the middle one the 99-163 KB of sm_80/86/89.
using Dim64Large = Tiling<64, 4, 8, 64>;    //  77 KB: two blocks per SM on sm_80/sm_90
using Dim64Small = Tiling<64, 4, 8, 32>;    //  48 KB
using Dim128Large = Tiling<128, 8, 8, 64>;  // 185 KB: the seed shapes' configuration
using Dim128Mid = Tiling<128, 4, 8, 32>;    //  80 KB
using Dim128Small = Tiling<128, 4, 4, 32>;  //  59 KB
using Dim256Large = Tiling<256, 8, 4, 32>;  // 150 KB
using Dim256Small = Tiling<256, 2, 4, 16>;  //  52 KB

__device__ __forceinline__ float4 zero4() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// Elements col..col+3 of one row of Q, K or V, zero past the real head dim.
__device__ __forceinline__ float4 load_four(const float* __restrict__ row, int col, int dim, bool vectorized) {
  float4 four = zero4();
  // EXERCISE BEGIN: one float4 load when `vectorized`, else four scalar loads, each guarded by the real D
  if (vectorized) {
    // D % 4 == 0: col < dim means all four are inside the row, and row + col is 16-byte aligned.
    if (col < dim) four = *reinterpret_cast<const float4*>(row + col);
  } else {
    if (col < dim) four.x = row[col];
    if (col + 1 < dim) four.y = row[col + 1];
    if (col + 2 < dim) four.z = row[col + 2];
    if (col + 3 < dim) four.w = row[col + 3];
  }
  // EXERCISE END
  return four;
}

// Elements col..col+3 of one output row, those past the real head dim dropped.
__device__ __forceinline__ void store_four(float* __restrict__ row, int col, int dim, bool vectorized, float4 value) {
  if (vectorized) {
    if (col < dim) *reinterpret_cast<float4*>(row + col) = value;
    return;
  }
  if (col < dim) row[col] = value.x;
  if (col + 1 < dim) row[col + 1] = value.y;
  if (col + 2 < dim) row[col + 2] = value.z;
  if (col + 3 < dim) row[col + 3] = value.w;
}

// Global -> registers: this thread's chunks of rows [first_row, first_row + kRows) of one head,
// zero for rows past the sequence end. Consecutive threads take consecutive chunks of a row, so a
// warp reads 512 contiguous bytes per instruction (D = 128). A thread always takes the same column
// and every kRowStep-th row; offsets inside a tile fit in 32 bits, so the addresses of all its
// chunks come from one 64-bit pointer.
template <class T, int kRows>
__device__ __forceinline__ void fetch_rows(float4 (&chunks)[kRows * T::kChunksPerRow / T::kThreads],
                                           const float* __restrict__ head, int first_row, int seq, int dim,
                                           bool vectorized) {
  const int my_row = threadIdx.x / T::kChunksPerRow;
  const int col = 4 * (threadIdx.x % T::kChunksPerRow);
  const float* tile = head + static_cast<int64_t>(first_row) * dim;
#pragma unroll
  for (int n = 0; n < kRows * T::kChunksPerRow / T::kThreads; ++n) {
    const int row = my_row + n * T::kRowStep;
    chunks[n] = first_row + row < seq ? load_four(tile + row * dim, col, dim, vectorized) : zero4();
  }
}

// Registers -> shared: the same chunks into the padded tile, one 128-bit store each.
template <class T, int kRows>
__device__ __forceinline__ void store_rows(float* tile,
                                           const float4 (&chunks)[kRows * T::kChunksPerRow / T::kThreads]) {
#pragma unroll
  for (int n = 0; n < kRows * T::kChunksPerRow / T::kThreads; ++n) {
    const int row = threadIdx.x / T::kChunksPerRow + n * T::kRowStep;
    const int col = 4 * (threadIdx.x % T::kChunksPerRow);
    *reinterpret_cast<float4*>(tile + row * T::kRowStride + col) = chunks[n];
  }
}

// S = Q K^T for this thread's kRowsPerThread x kKeysPerThread block, in log2 units (Q is
// pre-scaled). q_rows points at the thread's first query row, k_rows at its first key; its other
// rows are kRowGroups rows apart, its other keys kColumnGroups keys apart.
template <class T>
__device__ __forceinline__ void score_micro_tile(float (&scores)[T::kRowsPerThread][T::kKeysPerThread],
                                                 const float* q_rows, const float* k_rows) {
#pragma unroll
  for (int i = 0; i < T::kRowsPerThread; ++i) {
#pragma unroll
    for (int j = 0; j < T::kKeysPerThread; ++j) scores[i][j] = 0.0f;
  }
  // EXERCISE BEGIN: per 4 head dims, load TM float4 of Q and TN float4 of K, then 4 * TM * TN FFMAs from registers
#pragma unroll 2
  for (int d = 0; d < T::kDim; d += 4) {
    float4 q[T::kRowsPerThread];
    float4 k[T::kKeysPerThread];
#pragma unroll
    for (int i = 0; i < T::kRowsPerThread; ++i) {
      q[i] = *reinterpret_cast<const float4*>(q_rows + i * kRowGroups * T::kRowStride + d);
    }
#pragma unroll
    for (int j = 0; j < T::kKeysPerThread; ++j) {
      k[j] = *reinterpret_cast<const float4*>(k_rows + j * kColumnGroups * T::kRowStride + d);
    }
#pragma unroll
    for (int i = 0; i < T::kRowsPerThread; ++i) {
#pragma unroll
      for (int j = 0; j < T::kKeysPerThread; ++j) {
        scores[i][j] = fmaf(q[i].x, k[j].x, scores[i][j]);
        scores[i][j] = fmaf(q[i].y, k[j].y, scores[i][j]);
        scores[i][j] = fmaf(q[i].z, k[j].z, scores[i][j]);
        scores[i][j] = fmaf(q[i].w, k[j].w, scores[i][j]);
      }
    }
  }
  // EXERCISE END
}

// O += P V for this thread's kRowsPerThread x (4 * kOutputChunks) block. probs points at the
// thread's row group in its warp's P buffer (key-major: the TM probabilities of one key are
// contiguous), v_cols at the thread's first float4 column of the value tile.
template <class T>
__device__ __forceinline__ void output_micro_tile(float4 (&out)[T::kRowsPerThread][T::kOutputChunks],
                                                  const float* probs, const float* v_cols) {
  // EXERCISE BEGIN: per key, load TM probabilities and the thread's float4 of V, then TM * 4 * kOutputChunks FFMAs
#pragma unroll 4
  for (int key = 0; key < T::kKeysPerTile; ++key) {
    float p[T::kRowsPerThread];
#pragma unroll
    for (int i = 0; i < T::kRowsPerThread; i += 4) {
      const float4 four = *reinterpret_cast<const float4*>(probs + key * T::kProbKeyStride + i);
      p[i] = four.x;
      p[i + 1] = four.y;
      p[i + 2] = four.z;
      p[i + 3] = four.w;
    }
    float4 v[T::kOutputChunks];
#pragma unroll
    for (int c = 0; c < T::kOutputChunks; ++c) {
      v[c] = *reinterpret_cast<const float4*>(v_cols + key * T::kRowStride + 4 * kColumnGroups * c);
    }
#pragma unroll
    for (int i = 0; i < T::kRowsPerThread; ++i) {
#pragma unroll
      for (int c = 0; c < T::kOutputChunks; ++c) {
        out[i][c].x = fmaf(p[i], v[c].x, out[i][c].x);
        out[i][c].y = fmaf(p[i], v[c].y, out[i][c].y);
        out[i][c].z = fmaf(p[i], v[c].z, out[i][c].z);
        out[i][c].w = fmaf(p[i], v[c].w, out[i][c].w);
      }
    }
  }
  // EXERCISE END
}

// A value combined over the 16 lanes of this lane's row group (lanes with the same lane & 1).
__device__ __forceinline__ float row_max(float value) {
#pragma unroll
  for (int offset = kRowGroups; offset < kWarpSize; offset *= 2) {
    value = fmaxf(value, __shfl_xor_sync(kFullWarp, value, offset));
  }
  return value;
}

__device__ __forceinline__ float row_sum(float value) {
#pragma unroll
  for (int offset = kRowGroups; offset < kWarpSize; offset *= 2) value += __shfl_xor_sync(kFullWarp, value, offset);
  return value;
}

// The query tile of one head that a work item covers, and the keys its rows may see.
struct BlockRows {
  int64_t head;
  int first_query;
  int key_end;       // no row of the block sees a key at or past it: later tiles are skipped
  int unmasked_end;  // every row sees every key before it: tiles ending there need no mask
};

// Which query tile of which head work item `work` is, as in stages 03 and 04 (kernel::block_work,
// in common/include/fa/kernel/launch_order.cuh): without masking the query tiles of one head, then
// the next, so that blocks resident together share a head's K and V in L2; with causal masking
// heaviest first (the last query tile of every head, then the one before, ...), so that the short
// blocks fill the SMs as the long ones finish.
template <class T, bool kCausal>
__device__ __forceinline__ BlockRows block_rows(int64_t work, int64_t query_tiles, int64_t heads_total, int seq) {
  const kernel::BlockWork item = kernel::block_work(work, static_cast<int>(query_tiles), heads_total, kCausal);
  BlockRows block;
  block.head = item.query_head;
  block.first_query = item.query_tile * T::kQueryRows;
  // Row i sees keys 0..i (causal.hpp; visible_key_limit is the rule in 32 bits): the
  // block's last row first_query + kQueryRows - 1 sees the most, its first row the fewest. Without
  // the mask every row sees all N.
  block.key_end = visible_key_limit(block.first_query + T::kQueryRows - 1, seq, seq, kCausal);
  block.unmasked_end = visible_key_limit(block.first_query, seq, seq, kCausal);
  return block;
}

// One work item per query tile of one head, numbered as block_rows says; a grid-stride loop over
// them, so any B·H·N fits in the grid. `vectorized` is uniform: D % 4 == 0 and all four tensors
// 16-byte aligned.
template <class T, bool kCausal>
__global__ void __launch_bounds__(T::kThreads, 1)
    float4_tiles_attention(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           float* __restrict__ o, int64_t heads_total, int seq, int dim, float score_scale,
                           bool vectorized) {
  extern __shared__ float4 shared_chunks[];  // float4: the base is 16-byte aligned
  float* q_tile = reinterpret_cast<float*>(shared_chunks);
  float* k_tile = q_tile + T::kQueryFloats;
  float* v_tile = k_tile + T::kTileFloats;
  float* probs = v_tile + T::kTileFloats;

  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int row_group = lane % kRowGroups;
  const int column_group = lane / kRowGroups;
  const int warp_row0 = warp * T::kRowsPerWarp;

  // Where this thread's micro-tiles start; its other rows, keys and columns are fixed strides away.
  const float* my_q_rows = q_tile + (warp_row0 + row_group) * T::kRowStride;
  const float* my_k_rows = k_tile + column_group * T::kRowStride;
  const float* my_v_cols = v_tile + 4 * column_group;
  float* my_probs = probs + warp * T::kProbWarpStride + row_group * T::kProbGroupStride;

  const int64_t query_tiles = (seq + T::kQueryRows - 1) / T::kQueryRows;
  for (int64_t work = blockIdx.x; work < query_tiles * heads_total; work += gridDim.x) {
    const BlockRows block = block_rows<T, kCausal>(work, query_tiles, heads_total, seq);
    const int first_query = block.first_query;
    const int64_t head_offset = block.head * seq * dim;
    const float* q_head = q + head_offset;
    const float* k_head = k + head_offset;
    const float* v_head = v + head_offset;

    // The query tile, multiplied once by scale·log2(e): the scores come out in log2 units, ready
    // for exp2.
    {
      float4 chunks[T::kQueryLoads];
      fetch_rows<T, T::kQueryRows>(chunks, q_head, first_query, seq, dim, vectorized);
#pragma unroll
      for (int n = 0; n < T::kQueryLoads; ++n) {
        chunks[n] = make_float4(chunks[n].x * score_scale, chunks[n].y * score_scale, chunks[n].z * score_scale,
                                chunks[n].w * score_scale);
      }
      store_rows<T, T::kQueryRows>(q_tile, chunks);
    }
    // The first K/V tile. Later tiles are fetched into registers while P·V of the current one
    // runs, so the global-memory latency hides behind arithmetic.
    float4 next_keys[T::kTileLoads];
    float4 next_values[T::kTileLoads];
    fetch_rows<T, T::kKeysPerTile>(next_keys, k_head, 0, seq, dim, vectorized);
    fetch_rows<T, T::kKeysPerTile>(next_values, v_head, 0, seq, dim, vectorized);
    store_rows<T, T::kKeysPerTile>(k_tile, next_keys);
    store_rows<T, T::kKeysPerTile>(v_tile, next_values);

    float running_max[T::kRowsPerThread];  // m of each row, log2 units
    float running_sum[T::kRowsPerThread];  // this lane's share of l: its own keys only
    float4 out[T::kRowsPerThread][T::kOutputChunks];
#pragma unroll
    for (int i = 0; i < T::kRowsPerThread; ++i) {
      running_max[i] = -INFINITY;
      running_sum[i] = 0.0f;
#pragma unroll
      for (int c = 0; c < T::kOutputChunks; ++c) out[i][c] = zero4();
    }

    // Tiles at or past key_end hold no key any row of the block sees: never loaded.
    for (int first_key = 0; first_key < block.key_end; first_key += T::kKeysPerTile) {
      __syncthreads();  // this tile's K and V (and the Q tile) are in shared memory

      float scores[T::kRowsPerThread][T::kKeysPerThread];
      score_micro_tile<T>(scores, my_q_rows, my_k_rows);

      // Keys a row does not see score -inf: those past the sequence end and, with causal masking,
      // those after the row itself. They never raise the max and weigh exp2(-inf) = 0. Only a tile
      // that crosses the diagonal or the sequence end needs the key-by-key test: one comparison
      // per tile, the same for the whole block, skips it on every other tile.
      if (first_key + T::kKeysPerTile > block.unmasked_end) {
#pragma unroll
        for (int i = 0; i < T::kRowsPerThread; ++i) {
          const int query = first_query + warp_row0 + row_group + kRowGroups * i;
          const int row_key_end = visible_key_limit(query, seq, seq, kCausal);  // rows past N get N
#pragma unroll
          for (int j = 0; j < T::kKeysPerThread; ++j) {
            if (first_key + column_group + kColumnGroups * j >= row_key_end) scores[i][j] = -INFINITY;
          }
        }
      }

      // The online softmax, row by row. All 16 lanes of a row group agree on the new max, so
      // each can keep a partial sum of its own keys: l is the sum of the 16 partial sums, taken
      // once at the end. Every row sees key 0, so after the first tile the max is finite; on the
      // first tile the old max is -inf and the rescale exp2(-inf) = 0 clears the empty history. A
      // later tile can hide every key from a row (on the diagonal): the max stays, the rescale is
      // 1 and every weight 0.
#pragma unroll
      for (int i = 0; i < T::kRowsPerThread; ++i) {
        float tile_max = scores[i][0];
#pragma unroll
        for (int j = 1; j < T::kKeysPerThread; ++j) tile_max = fmaxf(tile_max, scores[i][j]);
        const float new_max = fmaxf(running_max[i], row_max(tile_max));
        const float rescale = exp2f(running_max[i] - new_max);
        running_max[i] = new_max;
        float tile_sum = 0.0f;
#pragma unroll
        for (int j = 0; j < T::kKeysPerThread; ++j) {
          scores[i][j] = exp2f(scores[i][j] - new_max);
          tile_sum += scores[i][j];
        }
        running_sum[i] = running_sum[i] * rescale + tile_sum;
#pragma unroll
        for (int c = 0; c < T::kOutputChunks; ++c) {
          out[i][c] =
              make_float4(out[i][c].x * rescale, out[i][c].y * rescale, out[i][c].z * rescale, out[i][c].w * rescale);
        }
      }

      // P into this warp's buffer, key-major, so P·V reads a key's TM probabilities as float4.
#pragma unroll
      for (int j = 0; j < T::kKeysPerThread; ++j) {
        float* key_probs = my_probs + (column_group + kColumnGroups * j) * T::kProbKeyStride;
#pragma unroll
        for (int i = 0; i < T::kRowsPerThread; i += 4) {
          *reinterpret_cast<float4*>(key_probs + i) =
              make_float4(scores[i][j], scores[i + 1][j], scores[i + 2][j], scores[i + 3][j]);
        }
      }
      __syncwarp();  // only this warp reads its P

      const bool has_next = first_key + T::kKeysPerTile < block.key_end;
      if (T::kPrefetch && has_next) {
        fetch_rows<T, T::kKeysPerTile>(next_keys, k_head, first_key + T::kKeysPerTile, seq, dim, vectorized);
        fetch_rows<T, T::kKeysPerTile>(next_values, v_head, first_key + T::kKeysPerTile, seq, dim, vectorized);
      }

      output_micro_tile<T>(out, my_probs, my_v_cols);

      __syncthreads();  // every warp is done with this tile's K, V (and, after the last, Q)
      if (has_next) {
        if (!T::kPrefetch) {
          fetch_rows<T, T::kKeysPerTile>(next_keys, k_head, first_key + T::kKeysPerTile, seq, dim, vectorized);
          fetch_rows<T, T::kKeysPerTile>(next_values, v_head, first_key + T::kKeysPerTile, seq, dim, vectorized);
        }
        store_rows<T, T::kKeysPerTile>(k_tile, next_keys);
        store_rows<T, T::kKeysPerTile>(v_tile, next_values);
      }
    }

    // O = o / l, once, at the end.
#pragma unroll
    for (int i = 0; i < T::kRowsPerThread; ++i) {
      const float inverse_sum = 1.0f / row_sum(running_sum[i]);
      const int query = first_query + warp_row0 + row_group + kRowGroups * i;
      if (query < seq) {
        float* out_row = o + head_offset + static_cast<int64_t>(query) * dim;
#pragma unroll
        for (int c = 0; c < T::kOutputChunks; ++c) {
          const float4 value = make_float4(out[i][c].x * inverse_sum, out[i][c].y * inverse_sum,
                                           out[i][c].z * inverse_sum, out[i][c].w * inverse_sum);
          store_four(out_row, 4 * (column_group + kColumnGroups * c), dim, vectorized, value);
        }
      }
    }
  }
}

// One problem as the launch sees it. Q, K, V and O are (B·H, N, D) with D fastest.
struct Attention {
  const float* q;
  const float* k;
  const float* v;
  float* o;
  int64_t heads_total;
  int seq;
  int dim;
  float score_scale;
  bool vectorized;
  bool causal;
};

// Declines (unsupported) without launching when the GPU does not give one block the
// configuration's shared memory.
template <class T, bool kCausal>
Status launch(const Attention& attention, cudaStream_t stream) {
  const auto kernel = float4_tiles_attention<T, kCausal>;
  // Beyond 48 KB of dynamic shared memory a kernel must opt in (fa/launch.hpp).
  FA_STATUS_TRY(opt_in_shared_memory(kernel, static_cast<int64_t>(T::kSharedBytes), Carveout::driver_default));
  // Blocks past 2^31 - 1 would be covered by the grid-stride loop (the harness's size limits keep
  // the work items below that).
  const int64_t work_items = (attention.seq + T::kQueryRows - 1) / T::kQueryRows * attention.heads_total;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(work_items, INT_MAX));
  kernel<<<blocks, T::kThreads, T::kSharedBytes, stream>>>(attention.q, attention.k, attention.v, attention.o,
                                                           attention.heads_total, attention.seq, attention.dim,
                                                           attention.score_scale, attention.vectorized);
  FA_LAUNCH_TRY();
  return Status();
}

// Launches the first configuration whose shared memory the GPU gives one block: a larger one
// declines (launch) and the next is tried.
template <class T, class... Smaller>
Status launch_largest_fitting(const Attention& attention, cudaStream_t stream) {
  const Status status = attention.causal ? launch<T, true>(attention, stream) : launch<T, false>(attention, stream);
  if constexpr (sizeof...(Smaller) > 0) {
    if (status.code() == Status::Code::unsupported) return launch_largest_fitting<Smaller...>(attention, stream);
  }
  return status;
}

// The runner has checked the problem against the descriptor before this runs; a direct call (the
// stage's tests make some) is checked here too, before anything touches the GPU.
Status forward(const ForwardArgs& args) {
  FA_STATUS_TRY(check_forward_args(args, kMaxDim));
  const Problem& problem = args.problem;
  const int64_t seq = problem.q_seq;  // this stage takes Nq = Nk only (its descriptor says so)
  const Attention attention{static_cast<const float*>(args.q),
                            static_cast<const float*>(args.k),
                            static_cast<const float*>(args.v),
                            static_cast<float*>(args.o),
                            problem.q_heads_total(),
                            static_cast<int>(seq),
                            static_cast<int>(problem.dim),
                            softmax_scale(problem) * kLog2e,
                            problem.dim % 4 == 0 && all_aligned16({args.q, args.k, args.v, args.o}),
                            problem.causal};
  if (problem.dim <= 64) return launch_largest_fitting<Dim64Large, Dim64Small>(attention, args.stream);
  if (problem.dim <= 128) return launch_largest_fitting<Dim128Large, Dim128Mid, Dim128Small>(attention, args.stream);
  return launch_largest_fitting<Dim256Large, Dim256Small>(attention, args.stream);
}

}  // namespace

StageDescriptor float4_tiles() {
  StageDescriptor stage;
  stage.id = "05_float4";
  stage.title = "FlashAttention with float4 loads and register micro-tiles (FP32)";
  stage.backend = Backend::cuda;
  stage.precision = Precision::fp32;
  stage.forward = &forward;
  stage.workspace_bytes = nullptr;
  stage.max_dim = kMaxDim;
  stage.architecture = {75, false};
  stage.features.causal = true;  // and nothing else: square problems (Hq = Hkv, Nq = Nk), no LSE
  stage.trace = nullptr;
  stage.kv_passes = 1.0;  // in K+V reads per query tile: one pass over K and V
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace fa::stages
