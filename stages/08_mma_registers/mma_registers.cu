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
// stored swizzled: 16-byte chunk c of row r lives at chunk c ^ (r % 8) of that row.
//
// The rest is stage 07: the cp.async ring for K and V, four warps of 16 query rows, FP16 or
// BF16 in and out with FP32 accumulation, sm_80 and newer. New besides: causal masking, which
// skips the K/V tiles above the diagonal and masks only the tiles that cross it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fa/cuda_check.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"

// The device code of this file uses sm_80 instructions. It still compiles for older targets (the
// host code must), where the kernel body is a trap that forward() never lets run.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_STAGE08_DEVICE_CODE 1
#else
#define FA_STAGE08_DEVICE_CODE 0
#endif

namespace fa::stages {
namespace {

constexpr int kWarpSize = 32;
constexpr int kStripRows = 16;                   // query rows per warp: the M of mma.m16n8k16
constexpr int kMmaDepth = 16;                    // the K of mma.m16n8k16: 16 dims for QKᵀ, 16 keys for PV
constexpr int kChunkBytes = 16;                  // one cp.async, one ldmatrix row
constexpr int kChunkElements = kChunkBytes / 2;  // of a 16-bit type
constexpr int kSwizzleRows = 8;                  // the swizzle permutes the chunks of every 8 consecutive rows
constexpr int kMaxDim = 128;
constexpr int kMinComputeCapability = 80;
constexpr int kSharedBytesPerSm = 228 * 1024;  // H100/H200; 1 KB of it is reserved per block
constexpr float kLog2e = 1.4426950408889634f;

// Everything that sizes the kernel of one head-dim bucket (64 or 128). Change one constant and
// the rest follows; the static_asserts say when a choice cannot work.
template <int kDim, bool kExactDim>
struct Tiling {
  // Warps per block; 16-row strips per warp (the M of one mma); keys per K/V tile (Bc) and K/V
  // tiles in the cp.async ring. Br = 16·kStrips·kWarps. A warp with two strips multiplies every
  // K and V fragment it loads from shared memory into both, which halves the shared-memory reads
  // per product; the price is S and O for 32 rows in registers, so Q no longer fits beside them
  // and is re-read from shared memory every tile. D = 128: two strips, two 64-key stages, 96 KB
  // a block, two blocks per SM; D = 64: one strip, Q in registers, three stages, 56 KB a block,
  // three blocks per SM. A head dim below the bucket (padded) keeps one strip: its runtime
  // strides need the registers a second strip would take.
  static constexpr int kWarps = 4;
  static constexpr int kStrips = kExactDim ? 2 : 1;
  static constexpr int kKeys = 64;
  static constexpr int kStages = kDim <= 64 ? 3 : 2;
  // Blocks that must fit on one SM at once: a register cap for ptxas (65536 / (threads ·
  // blocks) per thread). It must not be so low that O, Q and S spill: four blocks of D = 64
  // would fit in shared memory, but their 128 registers a thread spill.
  static constexpr int kMinBlocksPerSm = kDim <= 64 && kStrips == 1 ? 3 : 2;

  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kWarpRows = kStrips * kStripRows;
  static constexpr int kQueryRows = kWarps * kWarpRows;  // Br
  static constexpr int kChunksPerRow = kDim / kChunkElements;
  static constexpr int kRowBytes = kDim * 2;
  static constexpr int kQueryTileBytes = kQueryRows * kRowBytes;
  static constexpr int kKvTileBytes = kKeys * kRowBytes;
  // Q tile (later each warp's output staging), then the ring: kStages pairs of (K tile, V tile).
  static constexpr int kSharedBytes = kQueryTileBytes + kStages * 2 * kKvTileBytes;

  static_assert(kChunksPerRow >= kSwizzleRows, "the XOR swizzle needs at least 8 chunks (64 dims) per row");
  static_assert(kKeys % kMmaDepth == 0, "a K/V tile is whole 16-key steps of P·V");
  static_assert(kStages >= 2, "a pipeline needs a tile in flight while another is computed");
  static_assert(kMinBlocksPerSm * (kSharedBytes + 1024) <= kSharedBytesPerSm,
                "kMinBlocksPerSm blocks of this size do not fit in one SM's shared memory");
};

// FP32 -> the element type, and two FP32 values as the 32 bits of a rounded pair (low first).
template <typename Element>
__device__ __forceinline__ Element to_element(float value) {
  if constexpr (std::is_same_v<Element, __half>) {
    return __float2half_rn(value);
  } else {
    return __float2bfloat16_rn(value);
  }
}

template <typename Element>
__device__ __forceinline__ unsigned pack_pair(float low, float high) {
  if constexpr (std::is_same_v<Element, __half>) {
    const __half2 pair = __floats2half2_rn(low, high);
    return *reinterpret_cast<const unsigned*>(&pair);
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const unsigned*>(&pair);
  }
}

// The swizzle. In a row-major tile the 8 row addresses of one ldmatrix 8x8 matrix are 128 or
// 256 bytes apart: all in the same four banks, an 8-way conflict. Storing chunk c of row r at
// chunk c ^ (r % 8) spreads any 8 consecutive rows' copies of one chunk over 8 different
// 16-byte bank groups, and every chunk stays whole (cp.async writes it in one piece).
template <int kChunksPerRow>
__device__ __forceinline__ int swizzled_chunk_index(int row, int chunk) {
  return row * kChunksPerRow + (chunk ^ (row & (kSwizzleRows - 1)));  // row % 8, rows being >= 0
}

// Copies `kRows` rows of a (rows x dim) matrix from global memory into a swizzled shared tile
// with ordinary loads and stores, writing zeros in the padding columns (dim..kDim) and in the rows
// past `valid_rows`. The fallback when 16-byte copies are impossible (D % 8 != 0, or a pointer
// off a 16-byte boundary): the ring still works, but every copy is synchronous.
template <typename Element, int kDim, int kRows, int kThreadCount>
__device__ void load_tile_sync(Element* tile, const Element* source, int valid_rows, int dim, int thread) {
  for (int index = thread; index < kRows * kDim; index += kThreadCount) {
    const int row = index / kDim;
    const int column = index % kDim;
    tile[swizzled_chunk_index<kDim / kChunkElements>(row, column / kChunkElements) * kChunkElements +
         column % kChunkElements] =
        row < valid_rows && column < dim ? source[static_cast<int64_t>(row) * dim + column] : to_element<Element>(0.0f);
  }
}

#if FA_STAGE08_DEVICE_CODE
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kMmaKeys = 8;  // keys (or dims) per FP32 accumulator tile: the N of mma.m16n8k16

// 2^x on the special-function unit, flushing results below 2^-126 to zero (far below anything
// a 16-bit type can hold). exp2f would wrap the same instruction in a fix-up for those results.
__device__ __forceinline__ float fast_exp2(float x) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}

// --- The asynchronous copies of stage 07 ------------------------------------------------------

// One 16-byte asynchronous copy global -> shared, cached in L2 only; with source_bytes = 0 it
// reads nothing and writes 16 zero bytes (rows past N and padding columns).
__device__ __forceinline__ void copy_async_16(void* shared_destination, const void* global_source, int source_bytes) {
  const unsigned destination = static_cast<unsigned>(__cvta_generic_to_shared(shared_destination));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(global_source),
               "r"(source_bytes)
               : "memory");
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Issues the copies of a kRows x kDim tile into a swizzled shared tile, without waiting. Eight
// (D = 64) or sixteen (D = 128) consecutive threads copy one row: whole 128-byte lines of global
// memory, and (swizzled or not) eight different bank groups of shared memory.
template <typename Element, int kDim, int kRows, int kThreadCount>
__device__ void issue_tile_async(Element* tile, const Element* source, int valid_rows, int dim, int thread) {
  constexpr int kChunksPerRow = kDim / kChunkElements;
  constexpr int kRowsPerPass = kThreadCount / kChunksPerRow;
  static_assert(kThreadCount % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows in every pass");
  // A thread copies the same chunk of every kRowsPerPass-th row, so one pointer stepped by a fixed
  // stride reaches all its sources. (Written as row · dim per pass, the compiler keeps every
  // pass's 64-bit offset in registers of its own for the whole K/V loop, where they are scarce.)
  // The passes are a multiple of 8 rows apart, so they share row % 8 and the swizzled chunk: the
  // shared destinations are one offset plus constants.
  static_assert(kRowsPerPass % kSwizzleRows == 0, "every pass keeps row % 8");
  const int first_row = thread / kChunksPerRow;
  const int chunk = thread % kChunksPerRow;
  const bool column_inside = chunk * kChunkElements < dim;
  Element* destination = tile + swizzled_chunk_index<kChunksPerRow>(first_row, chunk) * kChunkElements;
  const int64_t pass_stride = static_cast<int64_t>(kRowsPerPass) * dim;
  const Element* chunk_source = source + static_cast<int64_t>(first_row) * dim + chunk * kChunkElements;
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const bool inside = column_inside && first_row + pass * kRowsPerPass < valid_rows;
    copy_async_16(destination + pass * kRowsPerPass * kDim, inside ? chunk_source : source, inside ? 16 : 0);
    chunk_source += pass_stride;
  }
}

// --- The tensor-core instructions, in PTX -------------------------------------------------------

// ldmatrix .x4: lanes 8i .. 8i+7 give the shared addresses of the 8 rows (16 bytes each) of
// matrix i; afterwards register i of lane l holds elements (l/4, 2·(l%4)) and (l/4, 2·(l%4)+1)
// of matrix i. `.trans` hands out the transpose: elements (2·(l%4), l/4) and (2·(l%4)+1, l/4).
// volatile: the compiler must not move a shared-memory read across the barriers around it.
__device__ __forceinline__ void load_matrices(unsigned (&fragment)[4], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(shared_address));
}

__device__ __forceinline__ void load_matrices_transposed(unsigned (&fragment)[4], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(shared_address));
}

// D += A·B for a 16x16 A (4 registers of 16-bit pairs), a 16x8 B (2 registers) and a 16x8 FP32
// accumulator (4 registers), the warp's 32 lanes together.
template <typename Element>
__device__ __forceinline__ void mma_16x8x16(float (&accumulator)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<Element, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
#endif

// One block: Br query rows of one (batch, head), every warp 16·kStrips of them. With kExactDim
// the head dim is the bucket's (64 or 128, the common case), a compile-time constant: every
// address stride below is then an immediate, which frees the registers two strips need.
template <typename Element, int kDim, bool kAsyncCopies, bool kExactDim>
__global__ void __launch_bounds__(Tiling<kDim, kExactDim>::kThreads, Tiling<kDim, kExactDim>::kMinBlocksPerSm)
    mma_attention_kernel(const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                         Element* __restrict__ o, int seq, int dim_argument, int query_tiles, int heads_total,
                         bool causal, float scale_log2) {
#if FA_STAGE08_DEVICE_CODE
  using T = Tiling<kDim, kExactDim>;
  const int dim = kExactDim ? kDim : dim_argument;
  // One strip: the warp's Q fragments stay in registers for the whole loop. Two: no room beside
  // S and O, so the loop reloads them from shared memory.
  constexpr bool kQueryInRegisters = T::kStrips == 1;
  constexpr int kDimSteps = kDim / kMmaDepth;       // 16-dim steps of QKᵀ; 16-dim pairs of O tiles
  constexpr int kKeySteps = T::kKeys / kMmaDepth;   // 16-key steps of P·V
  constexpr int kScoreTiles = T::kKeys / kMmaKeys;  // 8-key accumulator tiles of S
  constexpr int kOutTiles = kDim / kMmaKeys;        // 8-dim accumulator tiles of O

  extern __shared__ __align__(128) unsigned char shared[];
  Element* query_tile = reinterpret_cast<Element*>(shared);
  Element* ring = reinterpret_cast<Element*>(shared + T::kQueryTileBytes);  // slot s: K, then V
  constexpr int kTileElements = T::kKeys * kDim;

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  // In every accumulator tile this lane holds rows `group` and `group + 8`, columns
  // 2·quad and 2·quad + 1: the four lanes of a group share a row.
  const int group = lane / 4;
  const int quad = lane % 4;

  // Causal blocks differ in work (a late query tile sees every key before it), so they run
  // heaviest first: the query tile is the slow index, in reverse (longest-processing-time-first;
  // the short blocks fill the tail of the grid). Without the mask every block has the same work,
  // and the query tile is the fast index instead: the blocks in flight then share a few heads'
  // K and V through L2.
  int query_tile_index;
  int64_t head;
  if (causal) {
    query_tile_index = query_tiles - 1 - static_cast<int>(blockIdx.x / heads_total);
    head = blockIdx.x % heads_total;
  } else {
    query_tile_index = static_cast<int>(blockIdx.x % query_tiles);
    head = blockIdx.x / query_tiles;
  }
  const int64_t head_offset = head * seq * dim;
  const Element* head_keys = k + head_offset;
  const Element* head_values = v + head_offset;
  const int block_first_row = query_tile_index * T::kQueryRows;
  const int warp_first_row = block_first_row + warp * T::kWarpRows;

  // Keys the block must see: all of them, or with the causal mask those up to its last row. Tiles
  // past that are never loaded. Keys below `unmasked_keys` are visible to every row of the block,
  // so only tiles reaching past it need the mask: the partial last tile, and the diagonal ones.
  const int key_end = causal ? min(seq, block_first_row + T::kQueryRows) : seq;
  const int unmasked_keys = causal ? min(seq, block_first_row + 1) : seq;
  const int tiles = (key_end + T::kKeys - 1) / T::kKeys;
  // The keys a row of this lane sees (strip, top or bottom half) end below this limit. Computed
  // where it is needed, on masked tiles only: kept in registers it would cost four of them.
  const auto key_limit = [&](int strip, int half) {
    return causal ? min(seq, warp_first_row + strip * kStripRows + group + 8 * half + 1) : seq;
  };

  // Tile t goes to ring slot t % kStages. On the fallback path the same call copies synchronously.
  const auto issue_kv_tile = [&](int tile) {
    Element* key_slot = ring + 2 * (tile % T::kStages) * kTileElements;
    Element* value_slot = key_slot + kTileElements;
    const int key_base = tile * T::kKeys;
    const int valid_keys = min(T::kKeys, seq - key_base);
    const int64_t tile_offset = static_cast<int64_t>(key_base) * dim;
    if constexpr (kAsyncCopies) {
      issue_tile_async<Element, kDim, T::kKeys, T::kThreads>(key_slot, head_keys + tile_offset, valid_keys, dim,
                                                             threadIdx.x);
      issue_tile_async<Element, kDim, T::kKeys, T::kThreads>(value_slot, head_values + tile_offset, valid_keys, dim,
                                                             threadIdx.x);
    } else {
      load_tile_sync<Element, kDim, T::kKeys, T::kThreads>(key_slot, head_keys + tile_offset, valid_keys, dim,
                                                           threadIdx.x);
      load_tile_sync<Element, kDim, T::kKeys, T::kThreads>(value_slot, head_values + tile_offset, valid_keys, dim,
                                                           threadIdx.x);
    }
  };

  // The prologue: Q joins the first group of copies, then the ring fills all but one slot. Every
  // step commits a group, empty or not, so "tile j has landed" is always "at most kStages - 2
  // groups are still in flight" (stage 07).
  const Element* query_source = q + head_offset + static_cast<int64_t>(block_first_row) * dim;
  if constexpr (kAsyncCopies) {
    issue_tile_async<Element, kDim, T::kQueryRows, T::kThreads>(query_tile, query_source, seq - block_first_row, dim,
                                                                threadIdx.x);
  } else {
    load_tile_sync<Element, kDim, T::kQueryRows, T::kThreads>(query_tile, query_source, seq - block_first_row, dim,
                                                              threadIdx.x);
  }
#pragma unroll
  for (int tile = 0; tile < T::kStages - 1; ++tile) {
    if (tile < tiles) issue_kv_tile(tile);
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
  // XOR 32·(step % 4), plus 128 bytes per group of 4 steps. Tiles and rows start on 128-byte
  // boundaries, so the XOR touches only the chunk bits. One register per operand, not four, and
  // 16 rows down or 128 bytes right are constants that ldmatrix takes as an immediate.
  constexpr int kStepsPerGroup = kSwizzleRows / 2;  // 16-dim steps per group of 8 chunks
  constexpr int kGroupBytes = kSwizzleRows * kChunkBytes;
  constexpr int kBlockRowBytes = kMmaDepth * T::kRowBytes;  // 16 rows
  static_assert(
      T::kRowBytes % kGroupBytes == 0 && T::kKvTileBytes % kGroupBytes == 0 && T::kQueryTileBytes % kGroupBytes == 0,
      "rows and tiles start on 128-byte boundaries");
  const auto step_address = [](unsigned lane_address, int step) {
    return (lane_address ^ step % kStepsPerGroup * 2 * kChunkBytes) + step / kStepsPerGroup * kGroupBytes;
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
  // Q and tile 0 have landed. With one strip a warp takes its 16 rows of Q into registers for the
  // whole loop; with two, there is no room beside S and O, and the loop reloads them.
  wait_copies<T::kStages - 2>();
  __syncthreads();
  unsigned query[kDimSteps][4];
  if constexpr (kQueryInRegisters) {
#pragma unroll
    for (int step = 0; step < kDimSteps; ++step) load_matrices(query[step], query_address(0, step));
  }

  // O for the warp's rows in FP32 accumulator tiles, never normalized until the end
  // (FlashAttention-2). Per lane, strip and row (top: `group`, bottom: `group + 8`) the running
  // max m in log2 units (m = max_j s_j · scale · log2 e) and this lane's share of the sum l: the
  // four lanes of a row each sum their own columns, combined once after the loop.
  float out[T::kStrips][kOutTiles][4] = {};
  float row_max[T::kStrips][2];
  float row_sum[T::kStrips][2] = {};
#pragma unroll
  for (int strip = 0; strip < T::kStrips; ++strip) row_max[strip][0] = row_max[strip][1] = -INFINITY;

#pragma unroll 1
  for (int tile = 0; tile < tiles; ++tile) {
    wait_copies<T::kStages - 2>();  // this thread's copies of tile `tile` have landed
    // Every thread's copies of the tile are visible, and every warp is done with tile - 1, whose
    // slot the next copies overwrite.
    __syncthreads();
    if (tile + T::kStages - 1 < tiles) issue_kv_tile(tile + T::kStages - 1);
    commit_copies();
    const unsigned key_slot = ring_base + 2 * (tile % T::kStages) * T::kKvTileBytes;
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
          const unsigned(&a)[4] = kQueryInRegisters ? query[step] : strip_query[strip];
          mma_16x8x16<Element>(scores[strip][2 * pair], a, keys[0], keys[1]);
          mma_16x8x16<Element>(scores[strip][2 * pair + 1], a, keys[2], keys[3]);
        }
      }
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
      // bits 0 and 1). Every row sees key 0 in tile 0, so from then on its max is finite and a tile
      // the mask empties for it leaves m unchanged; on tile 0 the rescale factor is 2^-inf = 0.
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
  Element* staging = query_tile + warp * T::kWarpRows * kDim;
#pragma unroll
  for (int strip = 0; strip < T::kStrips; ++strip) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[strip][half];
      sum += __shfl_xor_sync(kFullWarp, sum, 1);
      sum += __shfl_xor_sync(kFullWarp, sum, 2);
      const float inverse_sum = 1.0f / sum;
      const int row = strip * kStripRows + group + 8 * half;
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) {
        const int position = swizzled_chunk_index<T::kChunksPerRow>(row, n) * kChunkElements + 2 * quad;
        *reinterpret_cast<unsigned*>(staging + position) =
            pack_pair<Element>(out[strip][n][2 * half] * inverse_sum, out[strip][n][2 * half + 1] * inverse_sum);
      }
    }
  }
  __syncwarp();
  constexpr int kRowsPerPass = kWarpSize / T::kChunksPerRow;
#pragma unroll
  for (int first = 0; first < T::kWarpRows; first += kRowsPerPass) {
    const int row = first + lane / T::kChunksPerRow;
    const int chunk = lane % T::kChunksPerRow;
    const int64_t query_row = warp_first_row + row;
    const int column = chunk * kChunkElements;
    if (query_row >= seq || column >= dim) continue;
    const Element* staged = staging + swizzled_chunk_index<T::kChunksPerRow>(row, chunk) * kChunkElements;
    Element* destination = o + head_offset + query_row * dim + column;
    if constexpr (kAsyncCopies) {
      *reinterpret_cast<uint4*>(destination) = *reinterpret_cast<const uint4*>(staged);
    } else {
#pragma unroll
      for (int e = 0; e < kChunkElements; ++e) {
        if (column + e < dim) destination[e] = staged[e];
      }
    }
  }
#else
  __trap();  // never launched: forward() refuses GPUs older than sm_80
#endif
}

template <typename Element, int kDim, bool kAsyncCopies, bool kExactDim>
cudaError_t launch(const Shape& shape, const Element* q, const Element* k, const Element* v, Element* o,
                   cudaStream_t stream) {
  using T = Tiling<kDim, kExactDim>;
  const auto kernel = &mma_attention_kernel<Element, kDim, kAsyncCopies, kExactDim>;
  int device = 0;
  int shared_limit = 0;
  FA_CUDA_TRY(cudaGetDevice(&device));
  FA_CUDA_TRY(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (T::kSharedBytes > shared_limit) return cudaErrorInvalidConfiguration;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSharedBytes));
  FA_CUDA_TRY(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));

  const int64_t query_tiles = (shape.seq + T::kQueryRows - 1) / T::kQueryRows;
  const int64_t blocks = query_tiles * shape.heads_total();
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  const float scale_log2 = softmax_scale(shape) * kLog2e;
  kernel<<<static_cast<unsigned>(blocks), T::kThreads, T::kSharedBytes, stream>>>(
      q, k, v, o, static_cast<int>(shape.seq), static_cast<int>(shape.dim), static_cast<int>(query_tiles),
      static_cast<int>(shape.heads_total()), shape.causal, scale_log2);
  FA_LAUNCH_TRY();
  return cudaSuccess;
}

// Three kernels per bucket, so none carries another's registers: cp.async with the bucket's own
// head dim (two strips at D = 128), cp.async with a padded head dim, and the synchronous
// fallback (always padded or misaligned, so never exact).
template <typename Element, int kDim>
cudaError_t launch_bucket(const Shape& shape, const Element* q, const Element* k, const Element* v, Element* o,
                          bool async_copies, cudaStream_t stream) {
  if (!async_copies) return launch<Element, kDim, false, false>(shape, q, k, v, o, stream);
  return shape.dim == kDim ? launch<Element, kDim, true, true>(shape, q, k, v, o, stream)
                           : launch<Element, kDim, true, false>(shape, q, k, v, o, stream);
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

template <typename Element>
cudaError_t forward(const Shape& shape, const void* q, const void* k, const void* v, void* o, void* /*workspace*/,
                    cudaStream_t stream) {
  if (!validate_shape(shape, kMaxDim).empty()) return cudaErrorInvalidValue;
  if (q == nullptr || k == nullptr || v == nullptr || o == nullptr) return cudaErrorInvalidValue;
  int device = 0;
  int major = 0;
  int minor = 0;
  FA_CUDA_TRY(cudaGetDevice(&device));
  FA_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FA_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major * 10 + minor < kMinComputeCapability) return cudaErrorInvalidDeviceFunction;  // no mma.m16n8k16 BF16
  const auto* qe = static_cast<const Element*>(q);
  const auto* ke = static_cast<const Element*>(k);
  const auto* ve = static_cast<const Element*>(v);
  auto* oe = static_cast<Element*>(o);
  // 16-byte copies and stores need every row to start on a 16-byte boundary.
  const bool async_copies =
      shape.dim % kChunkElements == 0 && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(o);
  // Two buckets; smaller head dims are zero-padded up to 64 (the swizzle needs 8 chunks a row).
  if (shape.dim <= 64) return launch_bucket<Element, 64>(shape, qe, ke, ve, oe, async_copies, stream);
  return launch_bucket<Element, 128>(shape, qe, ke, ve, oe, async_copies, stream);
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
  stage.min_compute_capability = kMinComputeCapability;
  stage.trace = nullptr;
  stage.supports_causal = true;
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
