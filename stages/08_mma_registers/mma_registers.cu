// Stage 08: raw mma.sync with ldmatrix from a swizzled layout; scores and probabilities never
// leave registers (the FlashAttention-2 forward kernel).
//
// Stage 07 still sent every score through shared memory: WMMA's accumulator layout is
// unspecified, so the softmax had to store S, read it back row by row, write P, and load P into
// an A fragment. Here the warp computes with the PTX instruction underneath WMMA,
// mma.sync.m16n8k16, whose register layout the PTX ISA documents: in an FP32 accumulator tile
// lane l holds rows l/4 and l/4 + 8, columns 2·(l%4) and 2·(l%4) + 1. So the online softmax runs
// on the accumulators themselves: a row's 8-key pieces sit in one lane's registers, and the
// four lanes that share a row combine their maxima and sums with two warp shuffles. And two
// adjacent 8-key tiles of S, rounded to 16-bit pairs, are exactly the A fragment of P·V for
// those 16 keys: P goes from the QKᵀ accumulators to the PV multiplicands without a move.
//
// The operands come from shared memory through ldmatrix, which hands each lane the elements of
// four 8x8 matrices in the same documented layout. Its eight row addresses per matrix would all
// hit the same banks in a plain row-major tile (a row is 128 or 256 bytes), so the tiles are
// stored swizzled: 16-byte chunk c of row r lives at chunk c ^ (r % 8) of that row (at D = 96,
// rows of 12 chunks, c ^ (r / 2 % 4) within groups of 4 chunks).
//
// The rest is stage 07: the cp.async ring for K and V, FP16 or BF16 in and out with FP32
// accumulation, sm_80 and newer, head dims in buckets (here 64, 96, 128, 192 and 256, each with
// its own tile: Tiling below). New besides: causal masking, which
// skips the K/V tiles above the diagonal and masks only the tiles that cross it, and the general
// shapes of the second part of the course: grouped-query heads (several query heads read one K/V
// head), Nq != Nk with the causal mask aligned bottom-right, and the per-row log-sum-exp that the
// backward pass needs (README, "The rest of the kernel").
//
// The device helpers this stage teaches or reuses live in fa/kernel/: mma.cuh (ldmatrix and
// mma.sync), swizzle.cuh (the swizzle) and tile_copy.cuh (a tile's copy into it), taught in this
// stage's README; cp_async.cuh and convert.cuh (stage 07), exp2.cuh (stage 06), warp.cuh (stage 05),
// launch_order.cuh (stage 03).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "fa/causal.hpp"
#include "fa/cuda_check.hpp"
#include "fa/kernel/convert.cuh"
#include "fa/kernel/cp_async.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/launch_order.cuh"
#include "fa/kernel/mma.cuh"
#include "fa/kernel/swizzle.cuh"
#include "fa/kernel/tile_copy.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"

// The device code of this file uses sm_80 instructions. It still compiles for older targets (the
// host code must), where the kernel body is a trap: the runner never launches this stage there
// (its descriptor says sm_80+).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_STAGE08_DEVICE_CODE 1
#else
#define FA_STAGE08_DEVICE_CODE 0
#endif

namespace fa::stages {
namespace {

using kernel::commit_copies;
using kernel::copy_tile;
using kernel::fast_exp2;
using kernel::kChunkBytes;
using kernel::kFullWarp;
using kernel::kLn2;
using kernel::kLog2e;
using kernel::kWarpSize;
using kernel::load_matrices;
using kernel::load_matrices_transposed;
using kernel::mma_16x8x16;
using kernel::pack_pair;
using kernel::swizzle_group_chunks;
using kernel::swizzled_chunk_index;
using kernel::swizzled_step_address;
using kernel::wait_copies;

constexpr int kStripRows = 16;                   // query rows per warp: the M of mma.m16n8k16
constexpr int kMmaDepth = 16;                    // the K of mma.m16n8k16: 16 dims for QKᵀ, 16 keys for PV
constexpr int kChunkElements = kChunkBytes / 2;  // of a 16-bit type
constexpr int kMaxDim = 256;
constexpr int kSharedBytesPerSm = 228 * 1024;         // H100/H200; 1 KB of it is reserved per block
constexpr int kSharedBytesPerBlockSm80 = 163 * 1024;  // the most one block may opt in to on an A100
// Registers a lane needs besides the O, S and Q fragments: addresses, the row maxima and sums, and
// the loop's state.
constexpr int kOtherRegisters = 32;

// Everything that sizes the kernel of one head-dim bucket (64, 96, 128, 192 or 256). Change one
// constant and the rest follows; the static_asserts say when a choice cannot work. What bounds
// each choice is the register file: per lane, O takes kDim / 2 FP32 registers for every 16-row
// strip, S kKeys / 2, Q (when it stays in registers) kDim / 4; 255 at most (README, "The rest
// of the kernel").
template <int kDim, bool kExactDim>
struct Tiling {
  // Above D = 128 one strip's O alone is 96 or 128 registers: a warp keeps one 16-row strip, and
  // eight warps (Br = 128) share every K/V tile.
  static constexpr bool kWide = kDim > 128;
  // Warps per block; 16-row strips per warp (the M of one mma); keys per K/V tile (Bc) and K/V
  // tiles in the cp.async ring. Br = 16·kStrips·kWarps. A warp with two strips multiplies every
  // K and V fragment it loads from shared memory into both, which halves the shared-memory reads
  // per product; the price is S and O for 32 rows in registers. Q stays in registers for the
  // whole loop when O, S and Q fit under the register cap (below), else the loop re-reads it from
  // shared memory every tile: D = 64 and 96 keep it (two strips: 64 + 64 + 32 and 96 + 64 + 48),
  // D = 128 does not (128 + 64 + 64). D = 64: two strips, three 64-key stages, 64 KB a block, two
  // blocks per SM; D = 96: the same with rows of 96 dims, 96 KB; D = 128: two strips, two stages,
  // 96 KB, two blocks per SM.
  // A head dim below the bucket (padded) keeps one strip, with Q in registers: its runtime strides
  // need the registers a second strip would take (at D <= 64 that is 56 KB a block and three
  // blocks per SM). D = 192: eight warps of one strip, Q in registers, two 64-key stages, 144 KB,
  // one block per SM. D = 256: eight warps of one strip, Q re-read from shared memory (O's 128
  // registers, S's 32 and Q's 64 would be 256), and staggered loads (below), 128 KB, one block
  // per SM.
  static constexpr int kWarps = kWide ? 8 : 4;
  static constexpr int kStrips = kExactDim && !kWide ? 2 : 1;
  static constexpr int kKeys = 64;
  // Staggered loads (FlashAttention-2's schedule), at D = 256: one K slot and one V slot instead
  // of a ring of (K, V) pairs. V of tile t loads while S = Q·Kᵀ of tile t is computed, and K of
  // tile t + 1 while the softmax and P·V of tile t are. A ring of two 64-key pairs would take
  // 192 KB, more than an A100 gives a block.
  static constexpr bool kStaggered = kDim > 192;
  static constexpr int kStages = kStaggered ? 1 : kDim <= 96 ? 3 : 2;
  // Blocks that must fit on one SM at once: a register cap for ptxas (65536 / (threads ·
  // blocks) per thread, 255 at most). It must not be so low that O, Q and S spill: four blocks of
  // D = 64 would fit in shared memory, but their 128 registers a thread spill.
  static constexpr int kMinBlocksPerSm = kWide ? 1 : kDim <= 64 && kStrips == 1 ? 3 : 2;
  static constexpr int kRegisterCap = std::min(65536 / (kWarps * kWarpSize * kMinBlocksPerSm), 255);
  // Per lane: O and S of every strip, and Q's A fragments if they stay.
  static constexpr int kAccumulatorRegisters = kStrips * (kDim / 2 + kKeys / 2);
  static constexpr int kQueryRegisters = kStrips * kDim / 4;
  static constexpr bool kQueryInRegisters =
      kAccumulatorRegisters + kQueryRegisters + kOtherRegisters <= kRegisterCap && (kDim <= 192 || kExactDim);

  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kWarpRows = kStrips * kStripRows;
  static constexpr int kQueryRows = kWarps * kWarpRows;  // Br
  // A row in shared memory is the bucket's D wide: whole groups of the chunks the swizzle permutes
  // (8 chunks, or 4 at D = 96), no padding.
  static constexpr int kRowDim = kDim;
  static constexpr int kChunksPerRow = kRowDim / kChunkElements;
  static constexpr int kSwizzleGroupChunks = swizzle_group_chunks(kChunksPerRow);
  static constexpr int kRowBytes = kRowDim * 2;
  static constexpr int kQueryTileBytes = kQueryRows * kRowBytes;
  static constexpr int kKvTileBytes = kKeys * kRowBytes;
  // Q tile (later each warp's output staging), then the ring: kStages pairs of (K tile, V tile)
  // (staggered: one pair, whose K and V load at different times).
  static constexpr int kSharedBytes = kQueryTileBytes + kStages * 2 * kKvTileBytes;

  static_assert(kDim % kMmaDepth == 0, "a bucket is whole 16-dim steps of QKᵀ");
  static_assert(kKeys % kMmaDepth == 0, "a K/V tile is whole 16-key steps of P·V");
  static_assert(kStages >= 2 || kStaggered, "a pipeline needs a tile in flight while another is computed");
  static_assert(kMinBlocksPerSm * (kSharedBytes + 1024) <= kSharedBytesPerSm,
                "kMinBlocksPerSm blocks of this size do not fit in one SM's shared memory");
  static_assert(kSharedBytes <= kSharedBytesPerBlockSm80, "a block must fit on an A100 (sm_80) too");
  static_assert(kChunksPerRow % kSwizzleGroupChunks == 0, "a row is whole groups of the chunks the swizzle permutes");

  static_assert(kAccumulatorRegisters + (kQueryInRegisters ? kQueryRegisters : 0) + kOtherRegisters <= kRegisterCap,
                "O, S and Q leave no room under the register cap: they spill");
};

#if FA_STAGE08_DEVICE_CODE
// blockIdx.x, read in a way the compiler cannot merge with an earlier read: what the kernel
// derives from it after the K/V loop is computed there, instead of held in registers through it.
__device__ __forceinline__ unsigned block_index_again() {
  unsigned block;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(block));
  return block;
}
constexpr int kMmaKeys = 8;  // keys (or dims) per FP32 accumulator tile: the N of mma.m16n8k16

#endif

// One block: Br query rows of one (batch, query head), every warp 16·kStrips of them. With
// kExactDim the head dim is the bucket's (64, 96, 128, 192 or 256, the common case), a
// compile-time constant: every address stride below is then an immediate, which frees the
// registers two strips need.
// Q and O are (B, Hq, Nq, D), K and V (B, Hkv, Nk, D); `lse` (B, Hq, Nq) may be null.
template <typename Element, int kDim, bool kAsyncCopies, bool kExactDim>
__global__ void __launch_bounds__(Tiling<kDim, kExactDim>::kThreads, Tiling<kDim, kExactDim>::kMinBlocksPerSm)
    mma_attention_kernel(const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                         Element* __restrict__ o, float* __restrict__ lse, int q_seq, int kv_seq, int dim_argument,
                         int query_tiles, int q_heads, int kv_heads, int heads_total, bool causal, float scale_log2) {
#if FA_STAGE08_DEVICE_CODE
  using T = Tiling<kDim, kExactDim>;
  using TileLayout = kernel::SwizzledRows<T::kChunksPerRow>;  // Q, K and V tiles, swizzled
  const int dim = kExactDim ? kDim : dim_argument;
  // Where O, S and Q fit (Tiling), the warp's Q fragments stay in registers for the whole loop;
  // otherwise (D = 128's two strips, a padded D in the 256 bucket) the loop reloads them from
  // shared memory.
  constexpr bool kQueryInRegisters = T::kQueryInRegisters;
  constexpr int kDimSteps = kDim / kMmaDepth;       // 16-dim steps of QKᵀ; 16-dim pairs of O tiles
  constexpr int kKeySteps = T::kKeys / kMmaDepth;   // 16-key steps of P·V
  constexpr int kScoreTiles = T::kKeys / kMmaKeys;  // 8-key accumulator tiles of S
  constexpr int kOutTiles = kDim / kMmaKeys;        // 8-dim accumulator tiles of O

  extern __shared__ __align__(128) unsigned char shared[];
  Element* query_tile = reinterpret_cast<Element*>(shared);
  Element* ring = reinterpret_cast<Element*>(shared + T::kQueryTileBytes);  // slot s: K, then V
  constexpr int kTileElements = T::kKeys * T::kRowDim;

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  // In every accumulator tile this lane holds rows `group` and `group + 8`, columns
  // 2·quad and 2·quad + 1: the four lanes of a group share a row.
  const int group = lane / 4;
  const int quad = lane % 4;

  // Which (query tile, query head) this block computes (kernel/launch_order.cuh). Causal blocks
  // differ in work (a late query tile sees more keys), so they run heaviest first: the query tile
  // is the slow index, in reverse, and the query head the fast one. Without the mask every block
  // has the same work, and the query tile is the fast index, then the query head: the blocks in
  // flight at once are a few consecutive query heads. A group's query heads (b·Hq + h for the
  // Hq/Hkv values of h that share a K/V head) are consecutive, so either way the blocks in flight
  // read the same few K/V heads, and each K/V tile comes from HBM once and from L2 the other times.
  // (Told that the counts are positive, the compiler divides in 32 bits instead of 64.)
  __builtin_assume(query_tiles > 0);
  __builtin_assume(heads_total > 0);
  const auto work_of = [&](unsigned block) { return kernel::block_work(block, query_tiles, heads_total, causal); };
  const kernel::BlockWork work = work_of(blockIdx.x);
  const int query_tile_index = work.query_tile;
  // Grouped-query attention: this query head's K and V are those of its group, read in place.
  const int64_t kv_head = kernel::kv_head_of(work.query_head, q_heads, kv_heads);
  const Element* head_keys = k + kv_head * kv_seq * dim;
  const Element* head_values = v + kv_head * kv_seq * dim;
  const int block_first_row = query_tile_index * T::kQueryRows;
  const int warp_first_row = block_first_row + warp * T::kWarpRows;

  // Keys the block must see: all of them, or with the causal mask those its last (valid) row sees
  // (fa/causal.hpp: row i sees keys 0 .. i + Nk - Nq, aligned to the bottom-right corner). Tiles
  // past that are never loaded. Keys below `unmasked_keys`, those the block's first row sees, are
  // visible to every row of the block, so only tiles reaching past it need the mask: the partial
  // last tile, and the diagonal ones. With Nq > Nk a block may see no key at all (tiles = 0).
  const int last_row = min(q_seq, block_first_row + T::kQueryRows) - 1;
  const int key_end = causal ? static_cast<int>(causal_key_end(last_row, q_seq, kv_seq)) : kv_seq;
  const int unmasked_keys = causal ? static_cast<int>(causal_key_end(block_first_row, q_seq, kv_seq)) : kv_seq;
  const int tiles = (key_end + T::kKeys - 1) / T::kKeys;
  // The keys a row of this lane sees (strip, top or bottom half) end below this limit. Computed
  // where it is needed, on masked tiles only: kept in registers it would cost four of them.
  const auto key_limit = [&](int strip, int half) {
    const int row = warp_first_row + strip * kStripRows + group + 8 * half;
    return causal ? static_cast<int>(causal_key_end(row, q_seq, kv_seq)) : kv_seq;
  };

  // Tile t goes to ring slot t % kStages, its K, its V or both (staggered loads issue them apart).
  // On the fallback path the same call copies synchronously.
  enum Parts { kKeyPart = 1, kValuePart = 2, kBothParts = 3 };
  const auto issue_kv_tile = [&](int tile, int slot, Parts parts = kBothParts) {
    Element* key_slot = ring + 2 * slot * kTileElements;
    Element* value_slot = key_slot + kTileElements;
    const int key_base = tile * T::kKeys;
    const int valid_keys = min(T::kKeys, kv_seq - key_base);
    const int64_t tile_offset = static_cast<int64_t>(key_base) * dim;
    const auto issue = [&](Element* slot, const Element* source) {
      copy_tile<kAsyncCopies, TileLayout, T::kRowDim, T::kKeys, T::kThreads>(slot, source, valid_keys, dim);
    };
    if (parts & kKeyPart) issue(key_slot, head_keys + tile_offset);
    if (parts & kValuePart) issue(value_slot, head_values + tile_offset);
  };

  // The prologue: Q joins the first group of copies, then the ring fills all but one slot. Every
  // step commits a group, empty or not, so "tile j has landed" is always "at most kStages - 2
  // groups are still in flight" (stage 07). Staggered, only K of tile 0 joins Q's group, and every
  // wait is for all of this thread's copies.
  const Element* query_source = q + (work.query_head * q_seq + block_first_row) * dim;
  copy_tile<kAsyncCopies, TileLayout, T::kRowDim, T::kQueryRows, T::kThreads>(query_tile, query_source,
                                                                              q_seq - block_first_row, dim);
  if constexpr (T::kStaggered) {
    if (tiles > 0) issue_kv_tile(0, 0, kKeyPart);
    commit_copies();
  }
#pragma unroll
  for (int tile = 0; tile < T::kStages - 1; ++tile) {
    if (tile < tiles) issue_kv_tile(tile, tile);
    commit_copies();
  }

  // Where each lane points ldmatrix (lanes 8i .. 8i+7 give the rows of matrix i):
  //   Q (A operand):  matrices (rows 0-7, dims 0-7), (rows 8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
  //                   = registers a0a1, a2a3, a4a5, a6a7: lane l points at row l % 16, chunk l / 16.
  //   K (B of QKᵀ):   matrices (keys 0-7, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, 0-7),
  //                   (keys 8-15, 8-15) = b0b1, b2b3 of two 8-key tiles: lane l points at key
  //                   (l / 16)·8 + l % 8, chunk (l / 8) % 2.
  //   V (B of P·V, transposed on load): matrices (keys 0-7, dims 0-7), (keys 8-15, 0-7),
  //                   (keys 0-7, 8-15), (keys 8-15, 8-15) = b0b1, b2b3 of two 8-dim tiles:
  //                   lane l points at key l % 16, chunk l / 16.
  const int a_row = lane % 16;
  const int a_chunk = lane / 16;
  const int key_row = lane / 16 * 8 + lane % 8;
  const int key_chunk = lane / 8 % 2;
  // The swizzle as address arithmetic. Chunk 2·(step % 4) + bit of a row lands at chunk
  // (2·(step % 4)) ^ (bit ^ row % 8) of its group of 8: the lane's byte address for 16-dim step 0,
  // XOR 32·(step % 4), plus 128 bytes per group of 4 steps (at D = 96, groups of 4 chunks: XOR
  // 32·(step % 2), plus 64 bytes per 2 steps). Tiles and rows start on group boundaries, so the
  // XOR touches only the chunk bits. One register per operand, not four, and 16 rows down or a
  // group right are constants that ldmatrix takes as an immediate.
  constexpr int kGroupBytes = T::kSwizzleGroupChunks * kChunkBytes;
  constexpr int kBlockRowBytes = kMmaDepth * T::kRowBytes;  // 16 rows
  static_assert(
      T::kRowBytes % kGroupBytes == 0 && T::kKvTileBytes % kGroupBytes == 0 && T::kQueryTileBytes % kGroupBytes == 0,
      "rows and tiles start on swizzle-group boundaries");
  const auto step_address = [](unsigned lane_address, int step) {
    return swizzled_step_address<T::kSwizzleGroupChunks>(lane_address, step);
  };
  const auto offset = [](int row, int chunk) {
    return static_cast<unsigned>(swizzled_chunk_index<T::kChunksPerRow>(row, chunk) * kChunkBytes);
  };
  const unsigned key_lane_offset = offset(key_row, key_chunk);
  const unsigned value_lane_offset = offset(a_row, a_chunk);
  // Q (an A operand) is addressed like V: the same lane pattern, from the warp's first row.
  const unsigned query_lane_address = static_cast<unsigned>(__cvta_generic_to_shared(query_tile)) +
                                      warp * T::kWarpRows * T::kRowBytes + value_lane_offset;
  const unsigned ring_base = static_cast<unsigned>(__cvta_generic_to_shared(ring));

  // The A fragment of Q for one strip and one 16-dim step of QKᵀ.
  const auto query_address = [&](int strip, int step) {
    return step_address(query_lane_address, step) + strip * kBlockRowBytes;
  };
  // Q and tile 0 (staggered: its K) have landed. Where they fit, a warp takes its rows of Q into
  // registers for the whole loop; otherwise the loop reloads them.
  wait_copies<T::kStaggered ? 0 : T::kStages - 2>();
  __syncthreads();
  unsigned query[T::kStrips][kDimSteps][4];
  if constexpr (kQueryInRegisters) {
#pragma unroll
    for (int strip = 0; strip < T::kStrips; ++strip) {
#pragma unroll
      for (int step = 0; step < kDimSteps; ++step) load_matrices(query[strip][step], query_address(strip, step));
    }
  }

  // O for the warp's rows in FP32 accumulator tiles, never normalized until the end
  // (FlashAttention-2). Per lane, strip and row (top: `group`, bottom: `group + 8`) the running
  // max m in log2 units (m = max_j s_j · scale · log2 e) and this lane's share of the sum l: the
  // four lanes of a row each sum their own columns, combined once after the loop.
  //
  // m starts at -inf. Under the causal mask with Nq > Nk a row may see no key at all: every one
  // of its scores is then -inf, and a max of -inf would make the rescale 2^(-inf - (-inf)) = NaN.
  // Such a row starts at m = 0 instead (any finite value): its p are 2^-inf = 0, so its l and O
  // stay 0, and the end writes zeros and LSE = -inf for it. This is FlashAttention-2's "max = -inf
  // ? 0" guard, moved out of the loop: which rows see nothing is known before the first tile.
  // Every other row sees key 0, in tile 0, so its max is finite from the first tile on.
  float out[T::kStrips][kOutTiles][4] = {};
  float row_max[T::kStrips][2];
  float row_sum[T::kStrips][2] = {};
#pragma unroll
  for (int strip = 0; strip < T::kStrips; ++strip) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_first_row + strip * kStripRows + group + 8 * half;
      row_max[strip][half] = causal && causal_key_end(row, q_seq, kv_seq) == 0 ? 0.0f : -INFINITY;
    }
  }

  // At D = 96 the loop carries its tile's ring slot (tile % kStages) from tile to tile, counted
  // down, instead of computing it. Same slot, different registers: that kernel sits at the cap, and
  // ptxas spills 8 bytes of it with the slot computed (on sm_80 and sm_90) or counted up (on
  // sm_80). The other buckets compute it (their machine code is then unchanged).
  constexpr bool kCarriedSlot = kDim == 96;
#pragma unroll 1
  for (int tile = 0, slots_after = T::kStages - 1; tile < tiles;
       ++tile, slots_after = slots_after == 0 ? T::kStages - 1 : slots_after - 1) {
    const int slot = T::kStages - 1 - slots_after;  // tile % kStages (kCarriedSlot)
    if constexpr (T::kStaggered) {
      // K of this tile has landed, and every warp is done with V of the last one: V of this tile
      // loads while S is computed.
      wait_copies<0>();
      __syncthreads();
      issue_kv_tile(tile, 0, kValuePart);
    } else {
      wait_copies<T::kStages - 2>();  // this thread's copies of tile `tile` have landed
      // Every thread's copies of the tile are visible, and every warp is done with tile - 1, whose
      // slot the next copies overwrite.
      __syncthreads();
      // Tile tile + kStages - 1 goes to the slot before this tile's (the one tile - 1 used).
      if (tile + T::kStages - 1 < tiles) {
        issue_kv_tile(tile + T::kStages - 1,
                      kCarriedSlot ? (slot == 0 ? T::kStages - 1 : slot - 1) : (tile + T::kStages - 1) % T::kStages);
      }
    }
    commit_copies();
    const unsigned key_slot = ring_base + 2 * (kCarriedSlot ? slot : tile % T::kStages) * T::kKvTileBytes;
    const unsigned value_slot = key_slot + T::kKvTileBytes;
    const int key_base = tile * T::kKeys;

    // S = Q Kᵀ for the warp's rows and the tile's keys: one ldmatrix gives the B fragments of
    // two 8-key tiles for one 16-dim step, used by every strip.
    float scores[T::kStrips][kScoreTiles][4] = {};
#pragma unroll
    for (int step = 0; step < kDimSteps; ++step) {
      unsigned strip_query[T::kStrips][4];
      if constexpr (!kQueryInRegisters) {
#pragma unroll
        for (int strip = 0; strip < T::kStrips; ++strip) load_matrices(strip_query[strip], query_address(strip, step));
      }
#pragma unroll
      for (int pair = 0; pair < kKeySteps; ++pair) {
        unsigned keys[4];
        load_matrices(keys, step_address(key_slot + key_lane_offset, step) + pair * kBlockRowBytes);
#pragma unroll
        for (int strip = 0; strip < T::kStrips; ++strip) {
          const unsigned(&a)[4] = kQueryInRegisters ? query[strip][step] : strip_query[strip];
          mma_16x8x16<Element>(scores[strip][2 * pair], a, keys[0], keys[1]);
          mma_16x8x16<Element>(scores[strip][2 * pair + 1], a, keys[2], keys[3]);
        }
      }
    }

    if constexpr (T::kStaggered) {
      // V has landed, and every warp is done with K: K of the next tile loads during the softmax
      // and P·V.
      wait_copies<0>();
      __syncthreads();
      if (tile + 1 < tiles) issue_kv_tile(tile + 1, 0, kKeyPart);
      commit_copies();
    }

    // P as the A fragments of P·V: probs[strip][j] covers keys 16j .. 16j + 15.
    unsigned probs[T::kStrips][kKeySteps][4];
#pragma unroll
    for (int strip = 0; strip < T::kStrips; ++strip) {
      float(&score)[kScoreTiles][4] = scores[strip];
      float(&running_max)[2] = row_max[strip];
      float(&running_sum)[2] = row_sum[strip];
      float(&strip_out)[kOutTiles][4] = out[strip];
      // EXERCISE BEGIN: one strip's online softmax on its S fragments (mask, max, rescale O and l, P as A)
      // Element e of score tile j is key key_base + 8j + 2·quad + e % 2 of the lane's top row
      // (e < 2) or bottom row (e >= 2). Keys the row may not see weigh nothing: -inf, never 0.
      if (key_base + T::kKeys > unmasked_keys) {
#pragma unroll
        for (int j = 0; j < kScoreTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (key_base + j * kMmaKeys + 2 * quad + e % 2 >= key_limit(strip, e / 2)) score[j][e] = -INFINITY;
          }
        }
      }
      // The row max over this lane's columns, then over the 4 lanes of the row (lanes differing in
      // bits 0 and 1). A row that sees any key sees key 0, in tile 0, so from then on its max is
      // finite and a tile the mask empties for it leaves m unchanged; on tile 0 the rescale factor
      // is 2^-inf = 0. (A row that sees no key started at m = 0: see above the loop.)
      float rescale[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kScoreTiles; ++j)
          tile_max = fmaxf(tile_max, fmaxf(score[j][2 * half], score[j][2 * half + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 2));
        const float new_max = fmaxf(running_max[half], tile_max * scale_log2);
        rescale[half] = fast_exp2(running_max[half] - new_max);
        running_max[half] = new_max;
      }
      // l rescaled to the new max, then p = 2^(s · scale · log2 e − m) in place of the scores, each
      // added straight into l. (Summing the tile's p apart and adding that to l afterwards keeps two
      // more registers live beside the scores, and at D = 128 sm_80's ptxas then spills one.)
#pragma unroll
      for (int half = 0; half < 2; ++half) running_sum[half] *= rescale[half];
#pragma unroll
      for (int j = 0; j < kScoreTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          score[j][e] = fast_exp2(fmaf(score[j][e], scale_log2, -running_max[e / 2]));
          running_sum[e / 2] += score[j][e];
        }
      }
      // Score tiles 2j and 2j + 1 hold keys 16j .. 16j + 7 and 16j + 8 .. 16j + 15 of the same
      // rows, at the same lanes as the A fragment wants them: a0a1 (top row, keys 2·quad, +1), a2a3
      // (bottom row), a4a5 and a6a7 (the same, 8 keys on). Only rounding to 16-bit pairs remains.
#pragma unroll
      for (int j = 0; j < kKeySteps; ++j) {
        probs[strip][j][0] = pack_pair<Element>(score[2 * j][0], score[2 * j][1]);
        probs[strip][j][1] = pack_pair<Element>(score[2 * j][2], score[2 * j][3]);
        probs[strip][j][2] = pack_pair<Element>(score[2 * j + 1][0], score[2 * j + 1][1]);
        probs[strip][j][3] = pack_pair<Element>(score[2 * j + 1][2], score[2 * j + 1][3]);
      }
      // O rescaled to the new max last, once the scores are packed and their registers free.
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) strip_out[n][e] *= rescale[e / 2];
      }
      // EXERCISE END
    }

    // O += P V: one transposing ldmatrix gives the B fragments of two 8-dim tiles for 16 keys,
    // used by every strip.
#pragma unroll
    for (int j = 0; j < kKeySteps; ++j) {
#pragma unroll
      for (int pair = 0; pair < kDimSteps; ++pair) {
        unsigned values[4];
        load_matrices_transposed(values, step_address(value_slot + value_lane_offset, pair) + j * kBlockRowBytes);
#pragma unroll
        for (int strip = 0; strip < T::kStrips; ++strip) {
          mma_16x8x16<Element>(out[strip][2 * pair], probs[strip][j], values[0], values[1]);
          mma_16x8x16<Element>(out[strip][2 * pair + 1], probs[strip][j], values[2], values[3]);
        }
      }
    }
  }

  // O / l, rounded to the element type. Each lane holds 2 columns of 2 rows per tile: stored
  // straight to global memory that would be 4-byte writes, 8 rows apart. Instead the warp stages
  // its 16 rows in its own (no longer needed) rows of the Q tile, swizzled like every tile
  // (conflict-free), and writes them out as whole 16-byte chunks, a row's chunks side by side.
  Element* staging = query_tile + warp * T::kWarpRows * T::kRowDim;
#pragma unroll
  for (int strip = 0; strip < T::kStrips; ++strip) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[strip][half];
      sum += __shfl_xor_sync(kFullWarp, sum, 1);
      sum += __shfl_xor_sync(kFullWarp, sum, 2);
      row_sum[strip][half] = sum;  // the row's whole l, for the log-sum-exp below
      // l = 0 only for a row that sees no key (its O is 0 too): it writes zeros, not 0/0.
      const float inverse_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int row = strip * kStripRows + group + 8 * half;
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) {
        const int position = swizzled_chunk_index<T::kChunksPerRow>(row, n) * kChunkElements + 2 * quad;
        *reinterpret_cast<unsigned*>(staging + position) =
            pack_pair<Element>(out[strip][n][2 * half] * inverse_sum, out[strip][n][2 * half + 1] * inverse_sum);
      }
    }
  }
  // The rows of O and the LSE this warp writes, among all B·Hq·Nq. Derived from the block index
  // again rather than kept from the prologue: a 64-bit offset held through the K/V loop costs two
  // registers that the D = 128 kernel does not have (block_index_again: a read the compiler
  // cannot merge with the first one).
  const kernel::BlockWork output_work = work_of(block_index_again());
  const int64_t warp_output_row =
      output_work.query_head * q_seq + output_work.query_tile * T::kQueryRows + warp * T::kWarpRows;
  __syncwarp();
  // As in copy_tile (fa/kernel/tile_copy.cuh), a row is written by kLanesPerRow lanes (8 at D = 64
  // and 192, 4 at D = 96, 16 at D = 128, 32 at D = 256), each taking every kLanesPerRow-th chunk.
  constexpr int kLanesPerRow = std::gcd(kWarpSize, T::kChunksPerRow);
  constexpr int kRowsPerPass = kWarpSize / kLanesPerRow;
#pragma unroll
  for (int index = 0; index < T::kWarpRows * T::kChunksPerRow / kWarpSize; ++index) {
    const int row = index / (T::kChunksPerRow / kLanesPerRow) * kRowsPerPass + lane / kLanesPerRow;
    const int chunk = index % (T::kChunksPerRow / kLanesPerRow) * kLanesPerRow + lane % kLanesPerRow;
    const int column = chunk * kChunkElements;
    if (warp_first_row + row >= q_seq || column >= dim) continue;
    const Element* staged = staging + swizzled_chunk_index<T::kChunksPerRow>(row, chunk) * kChunkElements;
    Element* destination = o + (warp_output_row + row) * dim + column;
    if constexpr (kAsyncCopies) {
      *reinterpret_cast<uint4*>(destination) = *reinterpret_cast<const uint4*>(staged);
    } else {
#pragma unroll
      for (int e = 0; e < kChunkElements; ++e) {
        if (column + e < dim) destination[e] = staged[e];
      }
    }
  }

  // The log-sum-exp, when asked: LSE = log Σ_j exp(s_j · scale) = (m + log2 l) · ln 2 in the
  // loop's log2 units (m already holds the scale and log2 e); -inf for a row that sees no key
  // (l = 0). One lane of the four that share a row writes it. Last, once O is out: written while O
  // is still in registers, the same few instructions push ptxas into spilling in the K/V loop of
  // the D = 128 kernel.
  if (lse != nullptr && quad == 0) {
#pragma unroll
    for (int strip = 0; strip < T::kStrips; ++strip) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = strip * kStripRows + group + 8 * half;
        const float sum = row_sum[strip][half];
        if (warp_first_row + row < q_seq) {
          lse[warp_output_row + row] = sum > 0.0f ? (row_max[strip][half] + log2f(sum)) * kLn2 : -INFINITY;
        }
      }
    }
  }
#else
  __trap();  // never launched: the runner refuses GPUs older than sm_80 (the descriptor's architecture)
#endif
}

template <typename Element, int kDim, bool kAsyncCopies, bool kExactDim>
Status launch(const ForwardArgs& args) {
  using T = Tiling<kDim, kExactDim>;
  const Problem& problem = args.problem;
  const auto kernel = &mma_attention_kernel<Element, kDim, kAsyncCopies, kExactDim>;
  FA_STATUS_TRY(opt_in_shared_memory(kernel, T::kSharedBytes));
  // One block per (query tile, query head); K/V heads are not launched over: each block finds
  // its group's K/V head (kernel::kv_head_of).
  const int64_t query_tiles = (problem.q_seq + T::kQueryRows - 1) / T::kQueryRows;
  const int64_t blocks = query_tiles * problem.q_heads_total();
  FA_STATUS_TRY(check_grid(blocks));
  const float scale_log2 = softmax_scale(problem) * kLog2e;
  // Every count below fits an int: the runner has checked the problem against validate_problem's
  // limits (B·Hq <= 2^20, N <= 2^24) and the grid against 2^31 - 1.
  kernel<<<static_cast<unsigned>(blocks), T::kThreads, T::kSharedBytes, args.stream>>>(
      static_cast<const Element*>(args.q), static_cast<const Element*>(args.k), static_cast<const Element*>(args.v),
      static_cast<Element*>(args.o), args.lse, static_cast<int>(problem.q_seq), static_cast<int>(problem.kv_seq),
      static_cast<int>(problem.dim), static_cast<int>(query_tiles), static_cast<int>(problem.q_heads),
      static_cast<int>(problem.kv_heads), static_cast<int>(problem.q_heads_total()), problem.causal, scale_log2);
  FA_LAUNCH_TRY();
  return Status();
}

// Three kernels per bucket, so none carries another's registers: cp.async with the bucket's own
// head dim (two strips up to D = 128), cp.async with a padded head dim, and the synchronous
// fallback (always padded or misaligned, so never exact).
template <typename Element, int kDim>
Status launch_bucket(const ForwardArgs& args, bool async_copies) {
  if (!async_copies) return launch<Element, kDim, false, false>(args);
  return args.problem.dim == kDim ? launch<Element, kDim, true, true>(args) : launch<Element, kDim, true, false>(args);
}

// The runner has checked the problem (sizes, head dim, features) and the GPU (sm_80 or newer)
// against the descriptor before this runs.
template <typename Element>
Status forward(const ForwardArgs& args) {
  // 16-byte copies and stores need every row to start on a 16-byte boundary (the LSE is written
  // one float at a time and needs nothing).
  const bool async_copies = args.problem.dim % kChunkElements == 0 && all_aligned16({args.q, args.k, args.v, args.o});
  // Five buckets; smaller head dims are zero-padded up to 64 (the swizzle needs 8 chunks a row),
  // the others up to the next bucket.
  return dispatch_head_dim<64, 96, 128, 192, kMaxDim>(args.problem.dim, [&](auto bucket) {
    return launch_bucket<Element, decltype(bucket)::value>(args, async_copies);
  });
}

StageDescriptor describe(Precision precision, ForwardFn forward_function, const char* title) {
  StageDescriptor stage;
  stage.id = "08_mma_registers";
  stage.title = title;
  stage.backend = Backend::cuda;
  stage.precision = precision;
  stage.forward = forward_function;
  stage.workspace_bytes = nullptr;
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

StageDescriptor mma_registers_fp16() {
  return describe(Precision::fp16, &forward<__half>,
                  "mma.sync + ldmatrix from swizzled shared memory: S and P stay in registers (FP16)");
}

StageDescriptor mma_registers_bf16() {
  return describe(Precision::bf16, &forward<__nv_bfloat16>,
                  "mma.sync + ldmatrix from swizzled shared memory: S and P stay in registers (BF16)");
}

}  // namespace fa::stages
