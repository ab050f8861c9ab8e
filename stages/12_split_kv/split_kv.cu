// Stage 12: decoding. The keys of each K/V head are split across blocks, and a second kernel merges
// the blocks' partial results with the online-softmax identity (stage 04's, now between blocks).
//
// When a model generates text, each step attends from a few new query rows (1 for plain decoding,
// 4 to 16 for speculative decoding or chunked prefill) to thousands or hundreds of thousands of
// cached keys. Stage 08 gives one block to each (query tile, query head): with B·Hq·1 blocks most
// SMs idle, and each idle SM is bandwidth left unused, since reading K and V is all the work.
// Two changes:
//
//   1. Pack the query rows of a group. The Hq/Hkv query heads that share a K/V head are
//      consecutive, so their rows are consecutive in Q: one block takes Hq/Hkv · Nq of them as one
//      tile, and each K/V byte comes from memory once per group instead of once per query head.
//   2. Split the keys. A K/V head's keys are cut into chunks, one block each; each writes its
//      rows' output over its chunk, normalized, with the chunk's log-sum-exp: a partial
//      (O_s, LSE_s). merge_partials_kernel then combines the partials of every row:
//      O = Σ_s 2^(LSE_s − M) · O_s / Σ_s 2^(LSE_s − M), M = max_s LSE_s (README, "The merge").
//
// The tile, the fragments, the swizzle and the cp.async ring are stage 08's (one 16-row strip per
// warp, Q's fragments held in registers up to D = 128). When the packed rows fit in one strip
// (Hq/Hkv · Nq <= 16: plain decoding), the four warps share the rows and split each K/V tile's keys
// instead, and merge their results at the end with the same identity, between warps. On Hopper the
// merge kernel launches while the split kernel's last blocks still run (programmatic dependent
// launch), so its launch gap is hidden. On an H100 or H200 a tile of more than one strip runs
// split_kv_wgmma.cu's kernel instead: its 64 rows are one wgmma tile. split_kv.hpp holds the split
// rule and the choice of kernel; a prefill shape (Nq >= 64) runs stage 08's kernel unchanged.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>

#include "fa/causal.hpp"
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/kernel/convert.cuh"
#include "fa/kernel/cp_async.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/mma.cuh"
#include "fa/kernel/swizzle.cuh"
#include "fa/kernel/tile_copy.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"
#include "split_kv.hpp"
#include "split_kv_device.cuh"

// sm_80 instructions (mma.sync in BF16, cp.async). Older targets compile a trap: the runner never
// launches this stage there (its descriptor says sm_80+).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_STAGE12_DEVICE_CODE 1
#else
#define FA_STAGE12_DEVICE_CODE 0
#endif

namespace fa::stages {

StageDescriptor mma_registers_fp16();  // stage 08, for prefill shapes
StageDescriptor mma_registers_bf16();

namespace split_kv {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

BlockKernel block_kernel(const Problem& problem, bool hopper, bool async_copies) {
  if (keys_across_warps(problem)) return BlockKernel::keys_across_warps;
  if (hopper && async_copies && problem.dim <= kWgmmaMaxDim) return BlockKernel::wgmma;
  return BlockKernel::strip_per_warp;
}

int64_t wave_blocks(BlockKernel kernel, int sm_count, int memory_khz, int bus_bits) {
  const int64_t sms = std::min(sm_count, kMaxSmCount);
  if (kernel == BlockKernel::keys_across_warps) return sms;
  if (kernel == BlockKernel::wgmma) return sms * kWgmmaBlocksPerSm;
  // Peak bandwidth: two transfers a clock (double data rate) over the whole bus.
  const double bytes_per_second = 2.0 * memory_khz * 1e3 * bus_bits / 8;
  const double per_sm = bytes_per_second / std::max(sm_count, 1);
  const auto blocks_per_sm =
      std::clamp<int64_t>(static_cast<int64_t>(std::ceil(per_sm / kBlockBytesPerSecond)), 1, kMaxBlocksPerSm);
  return sms * blocks_per_sm;
}

KeySplit plan_split(const Problem& problem, int64_t wave_blocks) {
  if (hands_to_stage08(problem)) return {1, problem.kv_seq};
  const int64_t base_blocks = split_grid(problem, {1, problem.kv_seq}).blocks;
  // As many splits as fit in one wave of blocks: one more would start a second, mostly empty wave.
  const int64_t wanted = std::max<int64_t>(1, wave_blocks / base_blocks);
  const int64_t most = std::min(kMaxSplits, std::max<int64_t>(1, problem.kv_seq / kMinChunkKeys));
  const int64_t splits = std::min(wanted, most);
  // Whole tiles per chunk; rounding the chunk up may leave fewer chunks than asked for.
  const int64_t chunk_keys = ceil_div(ceil_div(problem.kv_seq, splits), kChunkAlign) * kChunkAlign;
  return {ceil_div(problem.kv_seq, chunk_keys), chunk_keys};
}

SplitGrid split_grid(const Problem& problem, const KeySplit& split) {
  SplitGrid grid;
  grid.packed_rows = problem.group_size() * problem.q_seq;
  grid.row_tiles = ceil_div(grid.packed_rows, kTileRows);
  grid.blocks = problem.kv_heads_total() * grid.row_tiles * split.splits;
  return grid;
}

int64_t workspace_bytes(const Problem& problem, Pass pass) {
  if (pass != Pass::forward) return 0;
  const KeySplit split = plan_split(problem, kMaxBlocksPerSm * kMaxSmCount);
  if (split.splits == 1) return 0;
  return split.splits * problem.q_rows() * (problem.dim + 1) * static_cast<int64_t>(sizeof(float));
}

}  // namespace split_kv

namespace {

using kernel::commit_copies;
using kernel::copy_tile;
using kernel::fast_exp2;
using kernel::kChunkBytes;
using kernel::kFullWarp;
using kernel::kLn2;
using kernel::kSwizzleRows;
using kernel::kWarpSize;
using kernel::load_matrices;
using kernel::load_matrices_transposed;
using kernel::mma_16x8x16;
using kernel::pack_pair;
using kernel::swizzled_chunk_index;
using kernel::swizzled_step_address;
using kernel::to_element;
using kernel::wait_copies;

constexpr int kStripRows = static_cast<int>(split_kv::kStripRows);  // query rows per warp
constexpr int kChunkElements = kChunkBytes / 2;
constexpr int kMaxDim = 256;

// One head-dim bucket (64, 128 or 256). Four warps of one strip: 64 packed query rows. The ring
// holds three 64-key stages up to D = 128 (112 KB at D = 128: two blocks per H100/H200 SM) and two
// 32-key stages at D = 256 (96 KB). Four warps can split a tile's keys when each gets whole 16-key
// steps of P·V (up to D = 128); Q's fragments fit in registers beside O up to D = 128 too.
template <int kDim>
struct Tiling {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kRows = kWarps * kStripRows;
  static constexpr int kKeys = kDim > 128 ? 32 : 64;
  static constexpr int kStages = kDim > 128 ? 2 : 3;
  static constexpr int kRowBytes = kDim * 2;
  static constexpr int kQueryTileBytes = kRows * kRowBytes;
  static constexpr int kKvTileBytes = kKeys * kRowBytes;
  static constexpr int kSharedBytes = kQueryTileBytes + kStages * 2 * kKvTileBytes;
  static constexpr bool kCanSplitKeys = kKeys / kWarps % 16 == 0;

  static_assert(kRows == split_kv::kTileRows, "the host's split rule counts tiles of this many rows");
  static_assert(split_kv::kChunkAlign % kKeys == 0, "a chunk is whole K/V tiles");
  static_assert(kDim % (kSwizzleRows * kChunkElements) == 0, "a row is whole groups of 8 chunks");
  static_assert(kSharedBytes <= 163 * 1024, "a block must fit on an A100 (sm_80) too");
  static_assert(kCanSplitKeys == (kDim <= split_kv::kKeysAcrossWarpsMaxDim), "the host's rule knows which split keys");
};

#if FA_STAGE12_DEVICE_CODE
constexpr int kMmaDepth = 16;                            // the K of mma.m16n8k16: 16 dims for QKᵀ, 16 keys for PV
constexpr int kMmaKeys = split_kv::kAccumulatorColumns;  // keys (or dims) per FP32 accumulator tile

// Tile j (4 floats) of a thread's accumulator array (split_kv_device.cuh's layout), as
// mma_16x8x16 takes it.
__device__ __forceinline__ float (&accumulator_tile(float* accumulators, int j))[4] {
  return *reinterpret_cast<float(*)[4]>(accumulators + 4 * j);
}

// The four warps of a block that split the keys hold (m_w, l_w, O_w) of the same 16 rows over
// different keys, O_w unnormalized: merge them into warp 0's registers with the identity of the
// merge kernel (README, "The merge"), through `exchange` (the ring's shared memory, free once every
// warp is done with it): M = max m_w, L = Σ 2^(m_w − M) · l_w, O = Σ 2^(m_w − M) · O_w. A warp with
// l_w = 0 (none of its keys visible to the row) weighs 0; a row with no visible key keeps L = 0.
template <int kDim>
__device__ __forceinline__ void merge_warps(float (&out)[kDim / 2], float (&row_max)[2], float (&row_sum)[2],
                                            unsigned char* exchange, int warp, int group, int quad) {
  using T = Tiling<kDim>;
  constexpr int kStride = kDim + 8;                     // floats per exchanged row: 8 more shift each row's banks
  float2* stats = reinterpret_cast<float2*>(exchange);  // [warp][row]: (m, l)
  float* partial = reinterpret_cast<float*>(exchange) + 2 * T::kWarps * kStripRows;  // [warp - 1][row][dim]
  static_assert((2 * T::kWarps * kStripRows + (T::kWarps - 1) * kStripRows * kStride) * sizeof(float) <=
                    T::kStages * 2 * T::kKvTileBytes,
                "the exchange fits in the ring");
  __syncthreads();  // every warp is done reading the ring
  if (quad == 0) {
#pragma unroll
    for (int half = 0; half < 2; ++half) stats[warp * kStripRows + group + 8 * half] = {row_max[half], row_sum[half]};
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = group + 8 * half;
    float merged_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < T::kWarps; ++w) {
      const float2 other = stats[w * kStripRows + row];
      if (other.y > 0.0f) merged_max = fmaxf(merged_max, other.x);
    }
    float merged_sum = 0.0f;
#pragma unroll
    for (int w = 0; w < T::kWarps; ++w) {
      const float2 other = stats[w * kStripRows + row];
      if (other.y > 0.0f) merged_sum += fast_exp2(other.x - merged_max) * other.y;
    }
    const float weight = row_sum[half] > 0.0f ? fast_exp2(row_max[half] - merged_max) : 0.0f;
#pragma unroll
    for (int n = 0; n < kDim / kMmaKeys; ++n) {
      out[4 * n + 2 * half] *= weight;
      out[4 * n + 2 * half + 1] *= weight;
      if (warp != 0) {
        *reinterpret_cast<float2*>(&partial[((warp - 1) * kStripRows + row) * kStride + n * kMmaKeys + 2 * quad]) =
            make_float2(out[4 * n + 2 * half], out[4 * n + 2 * half + 1]);
      }
    }
    row_max[half] = merged_max;
    row_sum[half] = merged_sum;
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = group + 8 * half;
#pragma unroll
    for (int w = 1; w < T::kWarps; ++w) {
#pragma unroll
      for (int n = 0; n < kDim / kMmaKeys; ++n) {
        const float2 other = *reinterpret_cast<const float2*>(
            &partial[((w - 1) * kStripRows + row) * kStride + n * kMmaKeys + 2 * quad]);
        out[4 * n + 2 * half] += other.x;
        out[4 * n + 2 * half + 1] += other.y;
      }
    }
  }
}

#endif

// One block: up to 64 packed query rows of one K/V head's group (split_kv_device.cuh, SplitBlock),
// against one chunk of its keys. kKeysAcrossWarps (at most 16 packed rows): every warp takes those
// rows against a quarter of each K/V tile's keys, and the warps merge their results before the
// block writes them. With `partial_out` null (one split) the block writes O and the LSE itself;
// otherwise it writes its chunk's normalized output and log-sum-exp (log2 units) for
// merge_partials_kernel. The bounds promise one block an SM, so that up to 255 registers a thread
// are allowed: without it, ptxas held the D = 64 kernel to 128 (a fourth block an SM) and spilled.
template <typename Element, int kDim, bool kAsync, bool kKeysAcrossWarps>
__global__ void __launch_bounds__(Tiling<kDim>::kThreads, 1)
    split_kv_kernel(const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                    Element* __restrict__ o, float* __restrict__ lse, float* __restrict__ partial_out,
                    float* __restrict__ partial_lse, int q_seq, int kv_seq, int dim, int packed_rows, int row_tiles,
                    int splits, int chunk_keys, int64_t q_rows, bool causal, float scale_log2) {
#if FA_STAGE12_DEVICE_CODE
  using T = Tiling<kDim>;
  using TileLayout = kernel::SwizzledRows<kDim / kChunkElements>;  // Q, K and V tiles, swizzled
  static_assert(!kKeysAcrossWarps || T::kCanSplitKeys, "each warp's share of a tile is whole 16-key steps");
  // The keys of a tile one warp computes: all of them, or its quarter.
  constexpr int kWarpKeys = kKeysAcrossWarps ? T::kKeys / T::kWarps : T::kKeys;
  constexpr int kDimSteps = kDim / kMmaDepth;
  constexpr int kKeySteps = kWarpKeys / kMmaDepth;
  constexpr int kScoreTiles = kWarpKeys / kMmaKeys;
  constexpr bool kQueryInRegisters = kDim <= 128;  // beside O: up to 64 + 32 registers
  using namespace split_kv;                        // the device helpers both split kernels share (split_kv_device.cuh)

  extern __shared__ __align__(128) unsigned char shared[];
  Element* query_tile = reinterpret_cast<Element*>(shared);
  Element* ring = reinterpret_cast<Element*>(shared + T::kQueryTileBytes);  // slot s: K, then V
  constexpr int kTileElements = T::kKeys * kDim;

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group = lane / 4;  // accumulator rows `group` and `group + 8`
  const int quad = lane % 4;   // accumulator columns 2·quad and 2·quad + 1

  const SplitBlock work = split_block(blockIdx.x, splits, row_tiles, packed_rows, T::kRows);
  const BlockKeys keys = block_keys(work, packed_rows, T::kRows, T::kKeys, q_seq, kv_seq, causal, chunk_keys);
  // Each warp's rows (a strip of its own, or all of them strip 0) and where its keys start in every
  // tile (0, or 16 · warp).
  const int warp_strip = kKeysAcrossWarps ? 0 : warp;
  const int warp_first_row = work.tile_first_row + warp_strip * kStripRows;
  const int warp_key_offset = kKeysAcrossWarps ? warp * kWarpKeys : 0;
  const bool warp_has_rows = warp_first_row < packed_rows;  // Hq/Hkv · Nq may not fill the tile
  // The keys packed row `row` sees end below this limit (at most Nk; 0 or less for none).
  const auto key_limit = [&](int row) { return visible_key_limit(row % q_seq, q_seq, kv_seq, causal); };

  const int64_t kv_offset = work.kv_head * kv_seq * dim;
  const auto issue_kv_tile = [&](int tile) {
    Element* key_slot = ring + 2 * (tile % T::kStages) * kTileElements;
    const int key_base = keys.begin + tile * T::kKeys;
    const int valid_keys = min(T::kKeys, kv_seq - key_base);
    const int64_t offset = kv_offset + static_cast<int64_t>(key_base) * dim;
    copy_tile<kAsync, TileLayout, kDim, T::kKeys, T::kThreads>(key_slot, k + offset, valid_keys, dim);
    copy_tile<kAsync, TileLayout, kDim, T::kKeys, T::kThreads>(key_slot + kTileElements, v + offset, valid_keys, dim);
  };

  // The prologue (stage 07's ring): Q joins the first group of copies, then all but one slot fill.
  copy_tile<kAsync, TileLayout, kDim, T::kRows, T::kThreads>(
      query_tile, q + (work.head_first_row + work.tile_first_row) * dim, packed_rows - work.tile_first_row, dim);
#pragma unroll
  for (int tile = 0; tile < T::kStages - 1; ++tile) {
    if (tile < keys.tiles) issue_kv_tile(tile);
    commit_copies();
  }

  // ldmatrix addressing, as in stage 08: Q and V (A operand, and B transposed) point lane l at row
  // l % 16, chunk l / 16; K at key (l / 16)·8 + l % 8, chunk (l / 8) % 2. The swizzle of 16-dim step
  // s is an XOR of 32·(s % 4) bytes plus 128 bytes per group of four steps.
  constexpr int kBlockRowBytes = kMmaDepth * T::kRowBytes;
  const auto step_address = [](unsigned lane_address, int step) {
    return swizzled_step_address<kSwizzleRows>(lane_address, step);
  };
  const auto offset = [](int row, int chunk) {
    return static_cast<unsigned>(swizzled_chunk_index<kDim / kChunkElements>(row, chunk) * kChunkBytes);
  };
  const unsigned key_lane_offset = offset(lane / 16 * 8 + lane % 8, lane / 8 % 2);
  const unsigned value_lane_offset = offset(lane % 16, lane / 16);
  const unsigned warp_keys_bytes = warp_key_offset / kMmaDepth * kBlockRowBytes;  // its first key's row
  const unsigned query_lane_address = static_cast<unsigned>(__cvta_generic_to_shared(query_tile)) +
                                      warp_strip * kStripRows * T::kRowBytes + value_lane_offset;
  const unsigned ring_base = static_cast<unsigned>(__cvta_generic_to_shared(ring));

  // O unnormalized in FP32 tiles; per row (top, bottom) the running max m (log2 units) and this
  // lane's share of the sum l. A row that sees the warp's first key of this chunk (in tile 0) has a
  // finite max from tile 0 on. A row that sees none of the warp's keys (causal: its keys end before
  // them; the rule's keys are a prefix) starts at m = 0 instead of -inf, so its rescale is never
  // 2^(-inf + inf) = NaN: its p are all 0, and it ends with l = 0.
  float out[kDim / 2] = {};
  float row_max[2];
  float row_sum[2] = {};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_max[half] = key_limit(warp_first_row + group + 8 * half) <= keys.begin + warp_key_offset ? 0.0f : -INFINITY;
  }

  // Q's fragments, loaded once (Q arrived with tile 0) where they fit in registers beside O.
  unsigned query_held[kQueryInRegisters ? kDimSteps : 1][4];
  if constexpr (kQueryInRegisters) {
    wait_copies<T::kStages - 2>();
    __syncthreads();
#pragma unroll
    for (int step = 0; step < kDimSteps; ++step)
      load_matrices(query_held[step], step_address(query_lane_address, step));
  }

#pragma unroll 1
  for (int tile = 0; tile < keys.tiles; ++tile) {
    wait_copies<T::kStages - 2>();
    __syncthreads();  // tile `tile` is visible to all; every warp is done with the slot refilled next
    if (tile + T::kStages - 1 < keys.tiles) issue_kv_tile(tile + T::kStages - 1);
    commit_copies();
    if (!warp_has_rows) continue;  // a warp of padding rows only keeps the ring going
    const unsigned key_slot = ring_base + 2 * (tile % T::kStages) * T::kKvTileBytes + warp_keys_bytes;
    const unsigned value_slot = key_slot + T::kKvTileBytes;
    const int key_base = keys.begin + tile * T::kKeys + warp_key_offset;  // the warp's first key

    // S = Q Kᵀ, Q's fragments from registers, or re-read from shared memory at every 16-dim step.
    float scores[4 * kScoreTiles] = {};
#pragma unroll
    for (int step = 0; step < kDimSteps; ++step) {
      unsigned query[4];
      if constexpr (kQueryInRegisters) {
#pragma unroll
        for (int i = 0; i < 4; ++i) query[i] = query_held[step][i];
      } else {
        load_matrices(query, step_address(query_lane_address, step));
      }
#pragma unroll
      for (int pair = 0; pair < kKeySteps; ++pair) {
        unsigned key_fragments[4];
        load_matrices(key_fragments, step_address(key_slot + key_lane_offset, step) + pair * kBlockRowBytes);
        mma_16x8x16<Element>(accumulator_tile(scores, 2 * pair), query, key_fragments[0], key_fragments[1]);
        mma_16x8x16<Element>(accumulator_tile(scores, 2 * pair + 1), query, key_fragments[2], key_fragments[3]);
      }
    }

    // Stage 08's online softmax on the fragments (split_kv_device.cuh): mask, row max, rescale l,
    // p = 2^(s · scale · log2 e − m) added into l, P packed as the A fragments of P·V.
    if (key_base + kWarpKeys > keys.unmasked) {
      mask_scores<kScoreTiles>(scores, key_base + 2 * quad, key_limit(warp_first_row + group),
                               key_limit(warp_first_row + group + 8));
    }
    float rescale[2];
    online_softmax<kScoreTiles>(scores, row_max, row_sum, rescale, scale_log2);
    unsigned probs[kKeySteps][4];
    pack_probabilities<Element, kKeySteps>(scores, probs);
    kernel::rescale_output<0>(out, rescale);

    // O += P V.
#pragma unroll
    for (int j = 0; j < kKeySteps; ++j) {
#pragma unroll
      for (int pair = 0; pair < kDimSteps; ++pair) {
        unsigned values[4];
        load_matrices_transposed(values, step_address(value_slot + value_lane_offset, pair) + j * kBlockRowBytes);
        mma_16x8x16<Element>(accumulator_tile(out, 2 * pair), probs[j], values[0], values[1]);
        mma_16x8x16<Element>(accumulator_tile(out, 2 * pair + 1), probs[j], values[2], values[3]);
      }
    }
  }
  wait_copies<0>();  // no copy may still be writing shared memory when the block exits

  add_row_sums(row_sum);
  if constexpr (kKeysAcrossWarps) {
    merge_warps<kDim>(out, row_max, row_sum, shared + T::kQueryTileBytes, warp, group, quad);
  }
  if (!kKeysAcrossWarps || warp == 0) {  // with the keys across warps, warp 0 holds the merged rows
    write_rows<Element, kDim>(out, row_max, row_sum, warp_first_row, group, quad, packed_rows, work.head_first_row, dim,
                              work.split, q_rows, o, lse, partial_out, partial_lse);
  }
  // This block's rows are written: once every block is here, the merge kernel may launch. Its blocks
  // start while the last blocks of this grid finish, instead of after them and a launch gap.
  launch_dependents();
#else
  __trap();  // never launched: the runner refuses GPUs older than sm_80 (the descriptor's architecture)
#endif
}

constexpr int kMergeWarps = 4;
constexpr int kPartialsInFlight = 8;  // partial rows a warp loads before it uses the first

// Row `row` of O from its `splits` partials: (O_s, LSE_s) with O_s normalized over chunk s and
// LSE_s = m_s + log2 l_s. Each lane holds dims lane, lane + 32, ... The merge reads every partial
// once and is bound by the latency of those reads, not their bytes: the loads of kPartialsInFlight
// splits are issued before any is used, so a warp costs its splits / kPartialsInFlight round trips.
// With more splits than that, kWarpsPerRow = 4 warps share a row (a block a row), each taking every
// fourth group of kPartialsInFlight splits, and add their sums through shared memory; otherwise a
// warp takes a row of its own (four rows a block). On Hopper this kernel starts while the split
// kernel still runs (programmatic dependent launch), so the partials are not read-only data for
// this kernel's lifetime: their pointers are not __restrict__, and the loads are ordinary ones that
// stay below griddepcontrol.wait. Through the read-only path (ld.global.nc, what const __restrict__
// pointers get) ptxas moved loads above the wait at D = 256.
template <typename Element, int kDim, int kWarpsPerRow>
__global__ void __launch_bounds__(kMergeWarps* kWarpSize)
    merge_partials_kernel(const float* partial_out, const float* partial_lse, Element* __restrict__ o,
                          float* __restrict__ lse, int64_t q_rows, int dim, int splits) {
#if FA_STAGE12_DEVICE_CODE
  static_assert(kMergeWarps % kWarpsPerRow == 0, "a block holds whole rows");
  constexpr int kDimsPerLane = kDim / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int part = warp % kWarpsPerRow;  // this warp's share of the row's splits
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kMergeWarps / kWarpsPerRow) + warp / kWarpsPerRow;
  if (row >= q_rows) return;          // every warp of the row: it does not exist
  split_kv::wait_for_prerequisite();  // the split kernel has finished: every partial is written

  float merged[kDimsPerLane] = {};  // Σ_s w_s · O_s for this lane's dims
  float row_max = -INFINITY;        // M = max_s LSE_s
  float row_sum = 0.0f;             // Σ_s w_s, w_s = 2^(LSE_s − M)
  // EXERCISE BEGIN: merge the partials of one row (stage 04's rescale, now between blocks)
  // Every block has finished, so M is known before any sum: the max first, then each partial
  // weighed by w_s. A chunk that saw no key of the row has LSE_s = -inf and weighs nothing; a row
  // that sees no key at all has M = -inf, and weighs every chunk 2^(-inf - 0) = 0 instead of NaN.
  // This warp sums its share of the splits: kPartialsInFlight of them from part · kPartialsInFlight
  // on, then every kWarpsPerRow · kPartialsInFlight (the row's warps add their sums afterwards).
  // The loads of its first share go out before the LSEs are read: neither waits for the other, so
  // the two reads cost one round trip.
  float partial[kPartialsInFlight][kDimsPerLane];
  const auto load_partials = [&](int first) {
#pragma unroll
    for (int j = 0; j < kPartialsInFlight; ++j) {
      const float* split_row = partial_out + ((first + j) * q_rows + row) * dim;
#pragma unroll
      for (int d = 0; d < kDimsPerLane; ++d) {
        const int column = d * kWarpSize + lane;
        partial[j][d] = first + j < splits && column < dim ? split_row[column] : 0.0f;
      }
    }
  };
  int first = part * kPartialsInFlight;
  load_partials(first);
  constexpr int kMaxSplitsPerLane = static_cast<int>(split_kv::kMaxSplits) / kWarpSize;
  __shared__ float split_weights[kMergeWarps][split_kv::kMaxSplits];
  float split_lse[kMaxSplitsPerLane];  // LSE_s of splits lane, lane + 32, ...
#pragma unroll
  for (int i = 0; i < kMaxSplitsPerLane; ++i) {
    const int split = i * kWarpSize + lane;
    split_lse[i] = split < splits ? partial_lse[split * q_rows + row] : -INFINITY;
    row_max = fmaxf(row_max, split_lse[i]);
  }
#pragma unroll
  for (int width = kWarpSize / 2; width > 0; width /= 2)
    row_max = fmaxf(row_max, __shfl_xor_sync(kFullWarp, row_max, width));
  const float shift = row_max == -INFINITY ? 0.0f : row_max;
#pragma unroll
  for (int i = 0; i < kMaxSplitsPerLane; ++i) {
    const float weight = fast_exp2(split_lse[i] - shift);
    row_sum += weight;
    split_weights[warp][i * kWarpSize + lane] = weight;
  }
#pragma unroll
  for (int width = kWarpSize / 2; width > 0; width /= 2) row_sum += __shfl_xor_sync(kFullWarp, row_sum, width);
  __syncwarp();  // every lane's weights are in shared memory
#pragma unroll 1
  while (first < splits) {
#pragma unroll
    for (int j = 0; j < kPartialsInFlight; ++j) {
      const float weight = split_weights[warp][min(first + j, splits - 1)];
#pragma unroll
      for (int d = 0; d < kDimsPerLane; ++d) merged[d] = fmaf(weight, partial[j][d], merged[d]);
    }
    first += kWarpsPerRow * kPartialsInFlight;
    if (first < splits) load_partials(first);
  }
  // EXERCISE END
  if constexpr (kWarpsPerRow > 1) {  // the row's warps add their sums into its first warp's
    __shared__ float shares[kMergeWarps][kDim];
#pragma unroll
    for (int d = 0; d < kDimsPerLane; ++d) shares[warp][d * kWarpSize + lane] = merged[d];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int other = 1; other < kWarpsPerRow; ++other) {
#pragma unroll
      for (int d = 0; d < kDimsPerLane; ++d) merged[d] += shares[warp + other][d * kWarpSize + lane];
    }
  }
  const float inverse_sum = row_sum > 0.0f ? 1.0f / row_sum : 0.0f;
#pragma unroll
  for (int d = 0; d < kDimsPerLane; ++d) {
    const int column = d * kWarpSize + lane;
    if (column < dim) o[row * dim + column] = to_element<Element>(merged[d] * inverse_sum);
  }
  if (lse != nullptr && lane == 0) lse[row] = row_sum > 0.0f ? (row_max + log2f(row_sum)) * kLn2 : -INFINITY;
#else
  __trap();
#endif
}

// The split kernel (mma.sync), of the bucket and copy path the caller chose.
template <typename Element, int kDim, bool kAsync>
Status launch_split(const ForwardArgs& args, const split_kv::KeySplit& split, bool keys_across_warps,
                    float* partial_out, float* partial_lse) {
  using T = Tiling<kDim>;
  const auto kernel = [&]() {
    if constexpr (T::kCanSplitKeys) {
      if (keys_across_warps) return &split_kv_kernel<Element, kDim, kAsync, true>;
    }
    return &split_kv_kernel<Element, kDim, kAsync, false>;
  }();
  return split_kv::launch_split_kernel<Element>(kernel, T::kThreads, T::kSharedBytes, args, split, partial_out,
                                                partial_lse);
}

// The merge kernel, launched with programmatic stream serialization where the GPU has it
// (`early_merge`: sm_90 on), so that it can start before the split kernel ends.
template <typename Element, int kDim>
Status launch_merge(const ForwardArgs& args, const split_kv::KeySplit& split, bool early_merge,
                    const float* partial_out, const float* partial_lse) {
  const Problem& problem = args.problem;
  cudaLaunchAttribute early;
  early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  const bool warps_share_rows = split.splits > kPartialsInFlight;
  const int64_t rows_per_block = warps_share_rows ? 1 : kMergeWarps;
  config.gridDim = dim3(static_cast<unsigned>((problem.q_rows() + rows_per_block - 1) / rows_per_block));
  config.blockDim = dim3(kMergeWarps * kWarpSize);
  config.stream = args.stream;
  config.attrs = &early;
  config.numAttrs = early_merge ? 1 : 0;
  const auto merge_kernel =
      warps_share_rows ? &merge_partials_kernel<Element, kDim, kMergeWarps> : &merge_partials_kernel<Element, kDim, 1>;
  return Status::cuda(cudaLaunchKernelEx(&config, merge_kernel, partial_out, partial_lse, static_cast<Element*>(args.o),
                                         args.lse, problem.q_rows(), static_cast<int>(problem.dim),
                                         static_cast<int>(split.splits)));
}

// The wave of `kernel` on `device`, from the device's attributes. Asking for the memory clock takes
// the driver about as long as a short decoding step (it is not cached like the SM count), so each
// device is asked once.
Status device_wave_blocks(split_kv::BlockKernel kernel, int device, int64_t* wave) {
  struct Attributes {
    int sm_count = 0;
    int memory_khz = 0;
    int bus_bits = 0;
  };
  static std::mutex mutex;
  static std::map<int, Attributes> known;
  const std::lock_guard<std::mutex> lock(mutex);
  if (known.find(device) == known.end()) {
    Attributes asked;
    FA_STATUS_TRY(multiprocessor_count(device, &asked.sm_count));
    FA_STATUS_TRY(Status::cuda(cudaDeviceGetAttribute(&asked.memory_khz, cudaDevAttrMemoryClockRate, device)));
    FA_STATUS_TRY(Status::cuda(cudaDeviceGetAttribute(&asked.bus_bits, cudaDevAttrGlobalMemoryBusWidth, device)));
    known[device] = asked;
  }
  const Attributes& device_attributes = known[device];
  *wave = split_kv::wave_blocks(kernel, device_attributes.sm_count, device_attributes.memory_khz,
                                device_attributes.bus_bits);
  return Status();
}

template <typename Element>
Status forward(const ForwardArgs& args) {
  const Problem& problem = args.problem;
  if (split_kv::hands_to_stage08(problem)) {
    const StageDescriptor stage08 = std::is_same_v<Element, __half> ? mma_registers_fp16() : mma_registers_bf16();
    return stage08.forward(args);
  }
  int device = 0;
  int major = 0;
  int minor = 0;
  FA_STATUS_TRY(Status::cuda(cudaGetDevice(&device)));
  FA_STATUS_TRY(Status::cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)));
  FA_STATUS_TRY(Status::cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)));
  // cp.async needs whole 16-byte chunks: a head dim that is a multiple of 8 and aligned rows.
  const bool async_copies = problem.dim % kChunkElements == 0 && all_aligned16({args.q, args.k, args.v});
  const split_kv::BlockKernel kernel = split_kv::block_kernel(problem, major == 9 && minor == 0, async_copies);
  int64_t wave = 0;
  FA_STATUS_TRY(device_wave_blocks(kernel, device, &wave));
  const split_kv::KeySplit split = split_kv::plan_split(problem, wave);
  const bool merge = split.splits > 1;
  if (merge && args.workspace == nullptr) {
    return Status::unsupported("stage 12 needs its workspace for the partial results of a split");
  }
  float* partial_out = merge ? static_cast<float*>(args.workspace) : nullptr;
  float* partial_lse = merge ? partial_out + split.splits * problem.q_elements() : nullptr;
  return dispatch_head_dim<64, 128, kMaxDim>(problem.dim, [&](auto bucket) {
    constexpr int kDim = decltype(bucket)::value;
    const bool keys_across_warps = kernel == split_kv::BlockKernel::keys_across_warps;
    const Status launched = [&]() {
      if constexpr (kDim <= split_kv::kWgmmaMaxDim) {  // block_kernel picks wgmma up to that bucket only
        if (kernel == split_kv::BlockKernel::wgmma) {
          return split_kv::launch_wgmma_split<Element, kDim>(args, split, partial_out, partial_lse);
        }
      }
      return async_copies
                 ? launch_split<Element, kDim, true>(args, split, keys_across_warps, partial_out, partial_lse)
                 : launch_split<Element, kDim, false>(args, split, keys_across_warps, partial_out, partial_lse);
    }();
    if (!launched.ok() || !merge) return launched;
    return launch_merge<Element, kDim>(args, split, major >= 9, partial_out, partial_lse);
  });
}

}  // namespace

template <typename Element>
Status split_kv::merge_partials(const float* partial_out, const float* partial_lse, Element* out, float* lse,
                                int64_t rows, int64_t dim, int64_t splits, cudaStream_t stream) {
  if (splits < 1 || splits > split_kv::kMaxSplits) {
    return Status::unsupported("the merge takes 1 to " + std::to_string(split_kv::kMaxSplits) + " partials");
  }
  ForwardArgs args;
  args.problem = Problem::square(1, 1, rows, dim);
  args.o = out;
  args.lse = lse;
  args.stream = stream;
  split_kv::KeySplit split;
  split.splits = splits;
  return dispatch_head_dim<64, 128, kMaxDim>(dim, [&](auto bucket) {
    return launch_merge<Element, decltype(bucket)::value>(args, split, false, partial_out, partial_lse);
  });
}

template Status split_kv::merge_partials<__half>(const float*, const float*, __half*, float*, int64_t, int64_t, int64_t,
                                                 cudaStream_t);
template Status split_kv::merge_partials<__nv_bfloat16>(const float*, const float*, __nv_bfloat16*, float*, int64_t,
                                                        int64_t, int64_t, cudaStream_t);

namespace {

StageDescriptor describe(Precision precision, ForwardFn forward_function, const char* title) {
  StageDescriptor stage;
  stage.id = "12_split_kv";
  stage.title = title;
  stage.backend = Backend::cuda;
  stage.precision = precision;
  stage.forward = forward_function;
  stage.workspace_bytes = &split_kv::workspace_bytes;
  stage.max_dim = kMaxDim;
  stage.architecture = {80, false};  // BF16 mma.m16n8k16 and cp.async
  stage.features.causal = true;
  stage.features.grouped = true;
  stage.features.rectangular = true;
  stage.features.lse = true;
  stage.features.backward = false;
  stage.trace = nullptr;
  stage.kv_passes = 1.0;
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace

StageDescriptor split_kv_fp16() {
  return describe(Precision::fp16, &forward<__half>,
                  "split-KV decoding: a group's query rows packed, keys split across blocks, partials merged (FP16)");
}

StageDescriptor split_kv_bf16() {
  return describe(Precision::bf16, &forward<__nv_bfloat16>,
                  "split-KV decoding: a group's query rows packed, keys split across blocks, partials merged (BF16)");
}

}  // namespace fa::stages
