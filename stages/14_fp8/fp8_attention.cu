// Stage 14: attention in FP8 (e4m3) on Hopper. The schedule is stage 10's (a producer warp feeding a
// ring of K/V slots by TMA, two consumer warpgroups (three at D = 64) that ping-pong at named
// barriers and compute each tile's softmax while the previous tile's P·V runs); what changes is the
// number format of both products, which runs the tensor cores at twice the FP16 rate:
//
//   - Q, K and V arrive as e4m3 codes with FP32 descales, made by the quantization pass
//     (quantize.cu): Q per (head, 128 query rows), K per (head, 64 keys), V per (head, channel),
//     Q and K optionally rotated by a Hadamard matrix first (the dot products do not change).
//   - S = Q·Kᵀ is wgmma m64nBck32 e4m3 x e4m3 with FP32 accumulators. The descales do not enter the
//     product: the softmax scales each tile's S by descale_q · descale_k · (1/sqrt(D)) · log2(e),
//     one multiplier per K block of the tile (a tile holds whole K blocks: 192 keys, three of them,
//     at D = 128; 128 at D = 64; 64 at D = 256).
//   - The 8-bit operand rule: both shared-memory operands of an 8-bit wgmma are K-major. For
//     S = Q·Kᵀ they are already (rows of Q and K hold the head dim). For O += P·V the contraction
//     runs over keys, so V is read from V_qᵀ, (Dpad, keys), written transposed by the quantization
//     pass: a row per channel, in panels of 64 keys (one 64-byte swizzle atom, one TMA box).
//   - P in registers, once: the softmax of a tile runs on S's registers while the previous P·V
//     reads P, and the new P is packed after the wait for that P·V. P = exp2(t - m) is quantized to e4m3 times
//     2^kProbabilityShift (P <= 1 would otherwise leave 8 of e4m3's 16 binades unused, and small weights in its
//     subnormals) and handed to the P·V wgmma as its register A operand without a shuffle: the FP32 accumulator gives a
//     thread keys 2q, 2q+1, 8+2q, 9+2q of each 16 (q = lane % 4), the 8-bit A operand wants keys 4q .. 4q+3 in those
//     places, and the quantization pass stored V's keys permuted to match (kernel_key_position in quantize.hpp). Four
//     cvt.rn.satfinite.e4m3x2 per 16 keys, nothing else.
//   - The row sum l is summed from the FP32 P (or, kRowSumFromQuantizedP, from the quantized P that
//     P·V actually weights with); the 2^kProbabilityShift cancels between O and l.
//   - The epilogue multiplies O's column d by V's descale of channel d, divides by l, and writes
//     16-bit O (and the LSE) as stage 10 does.
//
// Head dims: D 1 .. 256 in buckets Dpad = 64, 128, 256 (the quantization pass pads with zeros).
// Q's and K's rows are one swizzle atom of 64 or 128 bytes, or two 128-byte panels at D = 256. The
// causal mask (bottom-right), grouped-query heads, Nq != Nk, keys past Nk masked to -inf: stage 10.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/kernel/accumulator_softmax.cuh"
#include "fa/kernel/tma_forward.cuh"
#include "fa/kernel/tma_ring.cuh"
#include "fa/kernel/tma_stage.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/kernel/wgmma_epilogue.cuh"
#include "fa/kernel/wgmma_walk.cuh"
#include "fa/launch.hpp"
#include "fp8_attention.hpp"
#include "fp8_numerics.hpp"
#include "fp8_wgmma.cuh"

// sm_90a only (wgmma, setmaxnreg): any other device pass compiles to a trap.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_STAGE14_DEVICE_CODE 1
#else
#define FA_STAGE14_DEVICE_CODE 0
#endif

namespace fa::fp8 {
namespace {

using kernel::kMmaColumns;
using kernel::kMmaRows;
using kernel::kPanelColumns;
using kernel::kPanelRowBytes;
using kernel::kSwizzleBytes;
using kernel::kWarpgroupThreads;
using kernel::kWarpSize;

constexpr int kSharedBytesPerBlock = 227 * 1024;

template <int kDim>
struct Tiling {
  // Consumer warpgroups of 64 query rows, one producer warpgroup: three at D = 64 (Br = 192), where
  // a tile has half the FLOPs per score and a third warpgroup's products fill the tensor cores while
  // the others compute their softmax; two from D = 128, where three (160 registers a thread) cannot
  // hold S, O and P of a tile (240 bytes of spills at 128 keys). A consumer's rows lie in one Q
  // scale block.
  static constexpr int kConsumers = kDim <= 64 ? 3 : 2;
  static constexpr int kQueryRows = kConsumers * kMmaRows;
  // Keys a tile (kernel_tile_keys): 192, three K scale blocks, up to D = 128; 64 at D = 256, where
  // O takes 128 registers a thread.
  static constexpr int kKeys = static_cast<int>(kernel_tile_keys(kDim));
  static constexpr int kKeySegments = kKeys / static_cast<int>(kKeyBlock);  // K scale blocks a tile
  static constexpr int kStages = 3;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = kConsumers == 3 ? 160 : 240;

  static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
  // Q and K: rows of one byte per head-dim element, one swizzle atom of 64 or 128 bytes, in panels
  // of 128 columns where D is wider.
  static constexpr int kRowBytes = kDim < 128 ? kDim : 128;
  static constexpr int kPanels = kDim / kRowBytes;
  static constexpr int kQueryPanelBytes = kQueryRows * kRowBytes;
  static constexpr int kKeyPanelBytes = kKeys * kRowBytes;
  static constexpr int kQueryTileBytes = kPanels * kQueryPanelBytes;
  static constexpr int kKeyTileBytes = kPanels * kKeyPanelBytes;
  // V_qᵀ: kDim rows (channels) of kKeys bytes, in panels of 64 keys (rows of one 64-byte swizzle
  // atom, a TMA box each).
  static constexpr int kValueRowBytes = 64;
  static constexpr int kValuePanels = kKeys / kValueRowBytes;
  static constexpr int kValuePanelBytes = kDim * kValueRowBytes;
  static constexpr int kValueTileBytes = kValuePanels * kValuePanelBytes;
  // O, 16-bit, staged for its TMA store in 64-column panels of 128-byte rows (the kit's epilogue).
  static constexpr int kOutPanelBytes = kQueryRows * kPanelRowBytes;
  static constexpr int kOutTileBytes = kDim / kPanelColumns * kOutPanelBytes;
  static constexpr int kBarriers = 2 + 4 * kStages;
  static constexpr int kSharedBytes =
      kSwizzleBytes + kQueryTileBytes + kOutTileBytes + kStages * (kKeyTileBytes + kValueTileBytes) + kBarriers * 8;

  static constexpr int kRegistersAtLaunch = 65536 / kThreads / 8 * 8;
  static_assert(kDim == 64 || kDim == 128 || kDim == 256, "the head-dim buckets");
  static_assert(kConsumers <= kernel::kMaxConsumers, "a named barrier per consumer (kernel/tma_forward.cuh)");
  static_assert(kKeys % kValueRowBytes == 0 && kValueRowBytes % kE4m3Step == 0, "whole V_qᵀ panels of 32-key steps");
  static_assert(kQueryBlock % kMmaRows == 0 && kKeys % kKeyBlock == 0,
                "a consumer's rows lie in one Q block, a tile holds whole K blocks");
  static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <=
                    kThreads * kRegistersAtLaunch,
                "setmaxnreg can only move registers the block was launched with");
  static_assert(kSharedBytes <= kSharedBytesPerBlock, "the tiles do not fit in one block's shared memory");
};

// The online softmax step on one tile of S (the kit's accumulator_softmax.cuh, with the tile's own
// scales and P's power of two): each K block of the tile (kSegments of them, 64 keys: 8 accumulator
// tiles each) has its own multiplier scale_log2[s] = descale_q · descale_k(block) · log2(e)/sqrt(D),
// so the row maxima are taken per block and scaled (the multipliers are positive) before they meet
// over the row's four threads; then the new running max m (log2 units), the factor O and l are
// rescaled by, and p · 2^kProbabilityShift = exp2(t - m + shift) in place of s, added into this
// thread's share of l (unless l is summed from the quantized P, in pack_probabilities).
template <int kTiles, int kSegments>
__device__ __forceinline__ void tile_softmax(float (&scores)[4 * kTiles], float (&row_max)[2], float (&row_sum)[2],
                                             float (&rescale)[2], const float (&scale_log2)[kSegments]) {
  constexpr int kTilesPerSegment = kTiles / kSegments;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int segment = 0; segment < kSegments; ++segment) {
      float segment_max = -INFINITY;
#pragma unroll
      for (int j = segment * kTilesPerSegment; j < (segment + 1) * kTilesPerSegment; ++j) {
        segment_max = fmaxf(segment_max, fmaxf(scores[4 * j + 2 * half], scores[4 * j + 2 * half + 1]));
      }
      tile_max = fmaxf(tile_max, segment_max * scale_log2[segment]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kernel::kFullWarp, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kernel::kFullWarp, tile_max, 2));
    const float new_max = fmaxf(row_max[half], tile_max);
    rescale[half] = kernel::fast_exp2(row_max[half] - new_max);
    row_max[half] = new_max;
    row_sum[half] *= rescale[half];
  }
  const float offset[2] = {kProbabilityShift - row_max[0], kProbabilityShift - row_max[1]};
#pragma unroll
  for (int i = 0; i < 4 * kTiles; ++i) {
    scores[i] = kernel::fast_exp2(fmaf(scores[i], scale_log2[i / 4 / kTilesPerSegment], offset[i % 4 / 2]));
    if (!kRowSumFromQuantizedP) row_sum[i % 4 / 2] += scores[i];
  }
}

// P in registers: for 32-key step c, accumulator tiles 4c .. 4c+3 hold this thread's keys
// 8j + 2q + e (j = 0..3, e = 0, 1) of its top row (elements 4j, 4j+1) and bottom row (4j+2, 4j+3).
// The 8-bit A fragment's four registers are {top, keys 0-15 of the step}, {bottom, 0-15}, {top,
// 16-31}, {bottom, 16-31}, four bytes each, at positions 4q .. 4q+3 of their 16: taking the tiles'
// pairs in order (tile 2g: e = 0, 1; tile 2g+1: e = 0, 1) puts keys 2q, 2q+1, 8+2q, 9+2q there,
// which is where the quantization pass stored those keys of V (quantize.hpp). With
// kRowSumFromQuantizedP the row sums take the quantized values here.
template <int kSteps>
__device__ __forceinline__ void pack_probabilities(const float (&p)[16 * kSteps], unsigned (&probs)[kSteps][4],
                                                   float (&row_sum)[2]) {
#pragma unroll
  for (int c = 0; c < kSteps; ++c) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int first = 16 * c + 8 * (r / 2) + 2 * (r % 2);  // tile 4c + 2(r/2), the row r % 2
      probs[c][r] = pack_e4m3x4(p[first], p[first + 1], p[first + 4], p[first + 5]);
      if (kRowSumFromQuantizedP) row_sum[r % 2] += e4m3x4_sum(probs[c][r]);
    }
  }
}

// A block computes pieces blockIdx.x, blockIdx.x + gridDim.x, ... of the (query tile, query head)
// pieces, as stage 10: threads 0-127 the producer warpgroup (thread 0 issues every copy), then the
// consumer warpgroups of 64 query rows. The maps: Q_q (B·Hq) x Nq x Dpad bytes, K_q (B·Hkv) x Nk x
// Dpad, V_qᵀ (B·Hkv) x Dpad x Nk_pad, O (B·Hq) x Nq x D of Element (when store_by_copy_engine).
template <typename Element, int kDim>
__global__ void __launch_bounds__(Tiling<kDim>::kThreads, 1)
    fp8_attention_kernel(const __grid_constant__ CUtensorMap query_map, const __grid_constant__ CUtensorMap key_map,
                         const __grid_constant__ CUtensorMap value_map, const __grid_constant__ CUtensorMap out_map,
                         Element* __restrict__ o, float* __restrict__ lse, const float* __restrict__ q_descale,
                         const float* __restrict__ k_descale, const float* __restrict__ v_descale, int q_seq,
                         int kv_seq, int dim, int query_tiles, int q_heads, int kv_heads, int heads_total, int pieces,
                         int q_blocks, int k_blocks, bool causal, bool store_by_copy_engine, float scale_log2) {
#if FA_STAGE14_DEVICE_CODE
  using T = Tiling<kDim>;
  using namespace kernel;
  constexpr int kKeySteps = T::kKeys / kE4m3Step;      // 32-key steps of P·V
  constexpr int kScoreTiles = T::kKeys / kMmaColumns;  // 8-key accumulator tiles of S

  // Shared memory, aligned to 1024 bytes (the 128-byte swizzle's period): the Q tile, the O
  // staging tile, then ring slot s = (K tile, V_qᵀ tile), then the barriers.
  extern __shared__ unsigned char shared_memory[];
  unsigned char* shared =
      shared_memory + ((kSwizzleBytes - shared_address(shared_memory) % kSwizzleBytes) % kSwizzleBytes);
  unsigned char* query_tile = shared;
  unsigned char* out_tile = shared + T::kQueryTileBytes;
  unsigned char* ring = out_tile + T::kOutTileBytes;
  constexpr int kSlotBytes = T::kKeyTileBytes + T::kValueTileBytes;
  uint64_t* barriers = reinterpret_cast<uint64_t*>(ring + T::kStages * kSlotBytes);
  uint64_t* query_full = barriers;
  uint64_t* query_free = barriers + 1;
  uint64_t* key_full = barriers + 2;
  uint64_t* value_full = barriers + 2 + T::kStages;
  uint64_t* key_free = barriers + 2 + 2 * T::kStages;
  uint64_t* value_free = barriers + 2 + 3 * T::kStages;
  const auto key_slot = [&](int slot) { return ring + slot * kSlotBytes; };
  const auto value_slot = [&](int slot) { return ring + slot * kSlotBytes + T::kKeyTileBytes; };

  // The pieces, as stage 10's (kernel/tma_forward.cuh).
  const auto piece_at = [&](int64_t index) {
    return kernel::piece_at<T::kQueryRows, T::kKeys>(index, query_tiles, heads_total, q_heads, kv_heads, q_seq, kv_seq,
                                                     causal);
  };

  constexpr int kConsumerWarps = T::kConsumers * kWarpgroupThreads / kWarpSize;
  if (threadIdx.x == 0) {
    barrier_init(query_full, 1);
    barrier_init(query_free, kConsumerWarps);
    for (int slot = 0; slot < T::kStages; ++slot) {
      barrier_init(&key_full[slot], 1);
      barrier_init(&value_full[slot], 1);
      barrier_init(&key_free[slot], kConsumerWarps);
      barrier_init(&value_free[slot], kConsumerWarps);
    }
    fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / kWarpgroupThreads;
  if (warpgroup == 0) {
    // ---- The producer: stage 10's ring, with 8-bit tiles ----------------------------------------
    // Written out, not the kit's produce_pieces (tma_forward.cuh): that one copies 64-column
    // panels into slots of two equal tiles, where Q's and K's panels here are 128 bytes wide and a
    // slot holds a K tile and a V_qᵀ tile of another shape.
    release_registers<T::kProducerRegisters>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&query_map);
      prefetch_tensor_map(&key_map);
      prefetch_tensor_map(&value_map);
      int ring_tile = 0;
      int round = 0;
      for (int64_t index = blockIdx.x; index < pieces; index += gridDim.x, ++round) {
        const Piece piece = piece_at(index);
        if (round > 0) barrier_wait(query_free, (round - 1) & 1);
        barrier_arrive_expect_bytes(query_full, T::kQueryTileBytes);
        for (int panel = 0; panel < T::kPanels; ++panel) {
          copy_box_to_shared(shared_address(query_tile + panel * T::kQueryPanelBytes), &query_map,
                             shared_address(query_full), panel * T::kRowBytes, piece.first_row, piece.query_head);
        }
        for (int tile = 0; tile < piece.tiles; ++tile, ++ring_tile) {
          const int slot = ring_tile % T::kStages;
          const int pass = ring_tile / T::kStages;
          const int key_base = tile * T::kKeys;
          if (pass > 0) barrier_wait(&key_free[slot], (pass - 1) & 1);
          barrier_arrive_expect_bytes(&key_full[slot], T::kKeyTileBytes);
          for (int panel = 0; panel < T::kPanels; ++panel) {
            copy_box_to_shared(shared_address(key_slot(slot) + panel * T::kKeyPanelBytes), &key_map,
                               shared_address(&key_full[slot]), panel * T::kRowBytes, key_base, piece.kv_head);
          }
          // V_qᵀ: a box of kDim channels x 64 keys per panel, at (key_base + 64 p, channel 0).
          if (pass > 0) barrier_wait(&value_free[slot], (pass - 1) & 1);
          barrier_arrive_expect_bytes(&value_full[slot], T::kValueTileBytes);
          for (int panel = 0; panel < T::kValuePanels; ++panel) {
            copy_box_to_shared(shared_address(value_slot(slot) + panel * T::kValuePanelBytes), &value_map,
                               shared_address(&value_full[slot]), key_base + panel * T::kValueRowBytes, 0,
                               piece.kv_head);
          }
        }
      }
    }
  } else {
    // ---- The consumers ---------------------------------------------------------------------------
    claim_registers<T::kConsumerRegisters>();
    const int consumer = __shfl_sync(kFullWarp, warpgroup, 0) - 1;  // warp-uniform: Q's descriptor in uniform registers
    const int thread = threadIdx.x % kWarpgroupThreads;
    const int warp = thread / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    const int group = lane / 4;
    const int quad = lane % 4;
    const int diagonal = 1 + kv_seq - q_seq;

    // Q's descriptor: this warpgroup's 64 rows of the Q tile.
    const uint64_t query_descriptor =
        e4m3_descriptor<T::kRowBytes>(shared_address(query_tile + consumer * kMmaRows * T::kRowBytes));

    float out[kDim / 2];
    float row_max[2];
    float row_sum[2];
    float scores[T::kKeys / 2];
    unsigned probs[kKeySteps][4];

    // S = Q·Kᵀ of ring tile r: kDim / 32 wgmma m64nBck32, the first overwriting the accumulators.
    const auto issue_scores_of = [&](int r) {
      wait_slot_full<T::kStages>(key_full, r);
      const uint64_t key_descriptor = e4m3_descriptor<T::kRowBytes>(shared_address(key_slot(r % T::kStages)));
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kDim / kE4m3Step; ++step) {
        const uint64_t a =
            advance_descriptor(query_descriptor, e4m3_step_offset<T::kRowBytes, T::kQueryPanelBytes>(step));
        const uint64_t b = advance_descriptor(key_descriptor, e4m3_step_offset<T::kRowBytes, T::kKeyPanelBytes>(step));
        if (step == 0) {
          wgmma_e4m3_shared<T::kKeys, false>(scores, a, b);
        } else {
          wgmma_e4m3_shared<T::kKeys, true>(scores, a, b);
        }
      }
      wgmma_commit();
    };
    // O += P·V of ring tile r: one wgmma m64nDk32 per 32 keys, P from registers, V_qᵀ K-major (a
    // 32-key step is 32 bytes along its rows, a new panel every 64 keys).
    const auto issue_values_of = [&](int r) {
      wait_slot_full<T::kStages>(value_full, r);
      const uint64_t value_descriptor = e4m3_descriptor<T::kValueRowBytes>(shared_address(value_slot(r % T::kStages)));
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < kKeySteps; ++c) {
        wgmma_e4m3_registers<kDim>(
            out, probs[c],
            advance_descriptor(value_descriptor, e4m3_step_offset<T::kValueRowBytes, T::kValuePanelBytes>(c)));
      }
      wgmma_commit();
    };
    const auto release = [&](uint64_t* free_barrier) { release_to_producer(free_barrier, lane); };
    const kernel::Turns<T::kConsumers> turn{consumer};  // ping-pong, as stage 10 (kernel/tma_forward.cuh)
    turn.open();

    int ring_tile = 0;
    int round = 0;
#pragma unroll 1
    for (int64_t index = blockIdx.x; index < pieces; index += gridDim.x, ++round) {
      const Piece piece = piece_at(index);
      const int consumer_first_row = piece.first_row + consumer * kMmaRows;
      const int warp_first_row = consumer_first_row + warp * 16;
      const auto key_limit = [&](int half) {
        return causal ? min(kv_seq, warp_first_row + group + 8 * half + diagonal) : kv_seq;
      };
      start_rows<kDim>(out, row_max, row_sum, warp_first_row, group, q_seq, kv_seq, causal);
      // This consumer's Q block (rows past the last one take the last block's scale: their output
      // is never written); each tile's K blocks from key_base / 64.
      const int query_block = min(consumer_first_row / static_cast<int>(kQueryBlock), q_blocks - 1);
      const float query_scale = q_descale[static_cast<int64_t>(piece.query_head) * q_blocks + query_block] * scale_log2;
      // A K block past the last key (the last tile's) has no descale: its scores are masked to
      // -inf, so the last block's stands in. Where a tile holds several K blocks (D <= 128), each
      // tile's descales are loaded at the end of the softmax before, so that their address
      // arithmetic and loads are done under the next products' issue, not in the softmax
      // (README, "Tried and dropped": one block a tile, at D = 256, keeps them in the softmax).
      const float* key_scales = k_descale + static_cast<int64_t>(piece.kv_head) * k_blocks;
      constexpr bool kKeyScalesAhead = T::kKeySegments > 1;
      float tile_key_scales[T::kKeySegments];
      const auto load_key_scales = [&](int tile) {
#pragma unroll
        for (int s = 0; s < T::kKeySegments; ++s) {
          tile_key_scales[s] = key_scales[min(tile * T::kKeySegments + s, k_blocks - 1)];
        }
      };
      if (kKeyScalesAhead) load_key_scales(0);
      const auto softmax = [&](int tile, float(&rescale)[2]) {
        const int key_base = tile * T::kKeys;
        if (key_base + T::kKeys > piece.unmasked_keys) {
          mask_scores<kScoreTiles>(scores, key_base, quad, key_limit);
        }
        if (!kKeyScalesAhead) load_key_scales(tile);
        float scale[T::kKeySegments];
#pragma unroll
        for (int s = 0; s < T::kKeySegments; ++s) scale[s] = query_scale * tile_key_scales[s];
        tile_softmax<kScoreTiles, T::kKeySegments>(scores, row_max, row_sum, rescale, scale);
        if (kKeyScalesAhead) load_key_scales(tile + 1);
      };

      barrier_wait(query_full, round & 1);

      // Stage 10's rounds: S of tile t and P·V of tile t - 1 issued together, the wait for S alone,
      // the softmax of tile t on S's registers while P·V still reads `probs`; P of tile t packed into
      // `probs` after the wait for P·V (one P in registers: 24 of them at 192 keys).
      const int tiles = piece.tiles;
      float rescale[2];
      const auto issue_round = [&](int tile) {
        const int r = ring_tile + tile;
        turn.take();
        issue_scores_of(r);
        rescale_output<0>(out, rescale);
        issue_values_of(r - 1);
        turn.pass();
        wgmma_wait<1>();
        fence_registers(scores);
        softmax(tile, rescale);
      };
      const auto complete_round = [&](int tile) {
        const int r = ring_tile + tile;
        wgmma_wait<0>();
        fence_registers(out);
        fence_registers(probs);
        pack_probabilities<kKeySteps>(scores, probs, row_sum);
        release(&key_free[r % T::kStages]);
        release(&value_free[(r - 1) % T::kStages]);
      };
      if (tiles > 0) {
        turn.take();
        issue_scores_of(ring_tile);
        turn.pass();
        wgmma_wait<0>();
        fence_registers(scores);
        softmax(0, rescale);
        pack_probabilities<kKeySteps>(scores, probs, row_sum);
        release(&key_free[ring_tile % T::kStages]);
      }
      if (tiles > 1) {
        issue_round(1);
#pragma unroll 1
        for (int tile = 2; tile < tiles; ++tile) {
          complete_round(tile - 1);
          issue_round(tile);
        }
        complete_round(tiles - 1);
      }
      release(query_free);  // every S = Q·Kᵀ of the piece has completed: the next Q may land
      if (tiles > 0) {
        turn.take();
        rescale_output<0>(out, rescale);
        issue_values_of(ring_tile + tiles - 1);
        turn.pass();
        wgmma_wait<0>();
        fence_registers(out);
        release(&value_free[(ring_tile + tiles - 1) % T::kStages]);
      }
      ring_tile += tiles;

      // ---- The epilogue ------------------------------------------------------------------------
      // O's column d times V's descale of channel d (this thread's columns 8n + 2q, +1); then the
      // kit's epilogue divides by l and stages 16-bit O. l and O both carry 2^kProbabilityShift,
      // which cancels; the LSE takes m - shift. Written out, not the kit's write_piece_output
      // (tma_forward.cuh): here one barrier precedes the choice of store, where the kit's waits in
      // each branch, and ptxas schedules the two differently; the measured rows ran this one.
      const float* channel_scales = v_descale + static_cast<int64_t>(piece.kv_head) * kDim;
#pragma unroll
      for (int n = 0; n < kDim / kMmaColumns; ++n) {
        const float2 scale = *reinterpret_cast<const float2*>(channel_scales + kMmaColumns * n + 2 * quad);
        out[4 * n] *= scale.x;
        out[4 * n + 1] *= scale.y;
        out[4 * n + 2] *= scale.x;
        out[4 * n + 3] *= scale.y;
      }
      const float lse_max[2] = {row_max[0] - kProbabilityShift, row_max[1] - kProbabilityShift};
      if (store_by_copy_engine && thread == 0) wait_stores_read();
      sync_threads(kEpilogueBarrier + consumer, kWarpgroupThreads);
      stage_output_rows<Element, kDim, T::kOutPanelBytes>(out, lse_max, row_sum, out_tile, consumer * kMmaRows, warp,
                                                          group, quad, consumer_first_row, q_seq, lse,
                                                          piece.query_head);
      fence_shared_for_async_proxy();
      sync_threads(kEpilogueBarrier + consumer, kWarpgroupThreads);
      if (store_by_copy_engine) {
        if (thread == 0 && consumer_first_row < q_seq) {
          store_staged_rows<kDim / kPanelColumns, T::kOutPanelBytes>(&out_map, out_tile, consumer * kMmaRows,
                                                                     consumer_first_row, piece.query_head);
        }
      } else {
        copy_staged_rows<Element, T::kOutPanelBytes>(o, out_tile, consumer * kMmaRows, thread, consumer_first_row,
                                                     q_seq, dim, piece.query_head);
      }
    }
    turn.close();
    if (store_by_copy_engine && thread == 0) wait_stores_read();
  }
#else
  __trap();  // never launched: fp8_forward declines every GPU but sm_90
#endif
}

// ---- Host ----------------------------------------------------------------------------------------

// A tensor map over `matrices` stacked row-major byte matrices of rows x columns (e4m3 codes), in
// boxes of box_columns bytes x box_rows rows, swizzled by the box's width (64 or 128 bytes: one
// atom, as the descriptors of fp8_wgmma.cuh read it). Rows of a multiple of 16 bytes (TMA).
Status encode_e4m3_stack(CUtensorMap& map, const void* base, uint64_t columns, uint64_t rows, uint64_t matrices,
                         uint32_t box_columns, uint32_t box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = kernel::tensor_map_encoder();
  if (encode == nullptr) return Status::unsupported("the CUDA driver has no cuTensorMapEncodeTiled (needs 12.0+)");
  const cuuint64_t sizes[3] = {columns, rows, matrices};
  const cuuint64_t strides[2] = {columns, columns * rows};
  const cuuint32_t box[3] = {box_columns, box_rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), sizes, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, box_columns == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return Status::unsupported("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(static_cast<int>(result)) +
                               ") for an e4m3 " + std::to_string(matrices) + " x " + std::to_string(rows) + " x " +
                               std::to_string(columns) + " tensor");
  }
  return Status();
}

template <typename Element, int kDim>
Status launch(const Problem& problem, const QuantizedInputs& inputs, Element* o, float* lse, cudaStream_t stream) {
  using T = Tiling<kDim>;
  const QuantizedLayout layout = quantized_layout(problem);
  CUtensorMap query_map{};
  CUtensorMap key_map{};
  CUtensorMap value_map{};
  CUtensorMap out_map{};
  FA_STATUS_TRY(encode_e4m3_stack(query_map, inputs.q, kDim, problem.q_seq, problem.q_heads_total(), T::kRowBytes,
                                  T::kQueryRows));
  FA_STATUS_TRY(
      encode_e4m3_stack(key_map, inputs.k, kDim, problem.kv_seq, problem.kv_heads_total(), T::kRowBytes, T::kKeys));
  FA_STATUS_TRY(encode_e4m3_stack(value_map, inputs.v_transposed, layout.kv_seq_padded, kDim, problem.kv_heads_total(),
                                  T::kValueRowBytes, kDim));
  // O by TMA where it can be described (D a multiple of 8, O 16-byte aligned); else element by element.
  const bool store_by_copy_engine = problem.dim % kernel::kTmaAlignElements == 0 && aligned16(o);
  if (store_by_copy_engine) {
    FA_STATUS_TRY(kernel::encode_matrix_stack(out_map, std::is_same_v<Element, __nv_bfloat16>, o, problem.dim,
                                              problem.q_seq, problem.q_heads_total(), kPanelColumns, kMmaRows));
  }
  const auto kernel = &fp8_attention_kernel<Element, kDim>;
  FA_STATUS_TRY(opt_in_shared_memory(kernel, T::kSharedBytes));
  const int64_t query_tiles = (problem.q_seq + T::kQueryRows - 1) / T::kQueryRows;
  const int64_t pieces = query_tiles * problem.q_heads_total();
  FA_STATUS_TRY(check_grid(pieces));
  // Persistent blocks without the causal mask; with it one block per piece (stage 10 takes causal
  // pieces from a queue instead, which this stage does not).
  int64_t blocks = pieces;
  if (!problem.causal) {
    int device = 0;
    int multiprocessors = 0;
    FA_CUDA_TRY(cudaGetDevice(&device));
    FA_STATUS_TRY(multiprocessor_count(device, &multiprocessors));
    blocks = std::min<int64_t>(pieces, multiprocessors);
  }
  const float scale_log2 = softmax_scale(problem) * kernel::kLog2e;
  kernel<<<static_cast<unsigned>(blocks), T::kThreads, T::kSharedBytes, stream>>>(
      query_map, key_map, value_map, out_map, o, lse, inputs.q_descale, inputs.k_descale, inputs.v_descale,
      static_cast<int>(problem.q_seq), static_cast<int>(problem.kv_seq), static_cast<int>(problem.dim),
      static_cast<int>(query_tiles), static_cast<int>(problem.q_heads), static_cast<int>(problem.kv_heads),
      static_cast<int>(problem.q_heads_total()), static_cast<int>(pieces), static_cast<int>(layout.q_blocks),
      static_cast<int>(layout.k_blocks), problem.causal, store_by_copy_engine, scale_log2);
  FA_LAUNCH_TRY();
  return Status();
}

// Exactly sm_90 (wgmma and setmaxnreg of sm_90a exist on Hopper alone).
Status check_device() {
  const DeviceInfo device = query_device();
  if (!device.present) return Status::unsupported("stage 14 needs a CUDA device: " + device.reason);
  if (device.compute_capability != 90) {
    return Status::unsupported("stage 14 runs on sm_90 (H100/H200) only; this GPU is sm_" +
                               std::to_string(device.compute_capability));
  }
  return Status();
}

}  // namespace

int64_t fp8_workspace_bytes(const Problem& problem) { return quantized_layout(problem).bytes; }

Status fp8_forward_quantized(const Problem& problem, const QuantizedInputs& inputs, Precision out_precision, void* o,
                             float* lse, cudaStream_t stream) {
  if (const std::string why = validate_problem(problem, kernel::kTmaMaxDim); !why.empty()) {
    return Status::unsupported(why);
  }
  if (out_precision != Precision::fp16 && out_precision != Precision::bf16) {
    return Status::unsupported("stage 14 writes O in FP16 or BF16");
  }
  if (inputs.q == nullptr || inputs.k == nullptr || inputs.v_transposed == nullptr || inputs.q_descale == nullptr ||
      inputs.k_descale == nullptr || inputs.v_descale == nullptr || o == nullptr) {
    return Status::unsupported("stage 14 needs Q, K, Vᵀ, their descales and O (a pointer is null)");
  }
  if (!all_aligned16({inputs.q, inputs.k, inputs.v_transposed})) {
    return Status::unsupported("stage 14: TMA reads the e4m3 tensors only from 16-byte aligned addresses");
  }
  FA_STATUS_TRY(check_device());
  return dispatch_head_dim<64, 128, 256>(problem.dim, [&](auto bucket) {
    constexpr int kDim = decltype(bucket)::value;
    return out_precision == Precision::fp16
               ? launch<__half, kDim>(problem, inputs, static_cast<__half*>(o), lse, stream)
               : launch<__nv_bfloat16, kDim>(problem, inputs, static_cast<__nv_bfloat16*>(o), lse, stream);
  });
}

Status fp8_forward(const ForwardArgs& args, Precision precision, const ForwardOptions& options) {
  FA_STATUS_TRY(check_forward_args(args, kernel::kTmaMaxDim));
  FA_STATUS_TRY(check_device());
  QuantizedInputs inputs;
  FA_STATUS_TRY(quantize_inputs(args.problem, precision, args.q, args.k, args.v, options.rotate, args.workspace,
                                &inputs, args.stream));
  return fp8_forward_quantized(args.problem, inputs, precision, args.o, args.lse, args.stream);
}

}  // namespace fa::fp8
