// Stage 11, second half: the FlashAttention-2 backward pass on mma.sync (sm_80 and newer).
//
// backward_cpu.cpp is the algorithm; this file is the same loop nest on the tensor cores. One
// block owns one key tile of one K/V head (128 keys, 8 warps; 64 keys, 4 warps where shared memory
// is short: Tiling) and keeps that tile's dK and dV in registers, in the FP32 accumulators of
// mma.sync, while it walks every query tile of every query head that reads the K/V head (its
// grouped-query heads included, so dK and dV are summed in registers and written once: no
// workspace and no second pass for them):
//
//   block (K/V head h, keys j0..j0+127)        the query tiles of h's group, in turn
//   ┌────────────┐                             ┌───────────┬───────────┬─────
//   │ K, V tiles │  S^T = K Q^T                │ Q, dO,    │ Q, dO,    │
//   │            │  P^T = exp2(S^T − LSE)      │ LSE, D    │ LSE, D    │ ...
//   │ dK, dV in  │  dP^T = V dO^T              │ tile 0    │ tile 1    │
//   │ registers  │  dS^T = P^T ∘ (dP^T − D)    └───────────┴───────────┴─────
//   └────────────┘  P^T, dS^T -> shared         cp.async ring: tile t+1 lands
//                   dV += P^T dO, dK += dS^T Q  while tile t is computed
//                   dQ += dS K (FP32 atomics into a workspace)
//
// The five products are the forward's mma.m16n8k16 with ldmatrix, shared among the warps as
// FlashAttention-2 shares them (each warp a 32-row strip of every output; the diagram is in the
// kernel) by one function, warp_multiply. dV and dK need P^T and dS^T by whole key strips, and dQ
// needs dS the other way round (rows = queries), so both go through shared memory once.
//
// dQ gets a share from every key tile, i.e. from many blocks: each adds its share to an FP32
// workspace with atomic adds (16 bytes at a time on sm_90; the workspace is laid out so that a
// warp's atomic covers whole lines of L2), and a last kernel scales it and rounds it to the
// element type. Atomic adds in FP32 land in whatever order the blocks reach them, so
// this dQ is not bitwise deterministic from run to run (dK and dV are: one block sums each in a
// fixed order). In the deterministic mode (fa/deterministic.hpp) a pass of its own makes dQ
// instead (grad_query_kernel, below: query tiles own dQ and re-walk the keys), the same bits every
// run, at a price the README measures. Before the main kernel, a preprocessing kernel computes
// D_i = rowsum(dO ∘ O).
//
// The Q, dO, K and V tiles are stored swizzled, as stage 08 stores them: rows stay whole 128-byte
// lines of shared memory, which the cp.async copies fill in the fewest writes. (Rows padded by 16
// bytes, as P^T and dS^T still are, avoid ldmatrix's bank conflicts too, but a padded row
// straddles two lines: the copies cost twice the shared-memory wavefronts and 1.6 times the L2
// sectors. The README measures it.)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fa/causal.hpp"
#include "fa/cuda_check.hpp"
#include "fa/deterministic.hpp"
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

// The device code uses sm_80 instructions; for older targets the kernels are traps the runner
// never launches (the descriptor says sm_80+), as in stage 08.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_STAGE11_DEVICE_CODE 1
#else
#define FA_STAGE11_DEVICE_CODE 0
#endif

namespace fa::stages {

// The forward pass is stage 08's: it writes the LSE this pass rebuilds P from.
StageDescriptor mma_registers_fp16();
StageDescriptor mma_registers_bf16();

namespace {

using kernel::commit_copies;
using kernel::copy_tile;
using kernel::fast_exp2;
using kernel::kFullWarp;
using kernel::kLog2e;
using kernel::kWarpSize;
using kernel::load_matrices;
using kernel::load_matrices_transposed;
using kernel::mma_16x8x16;
using kernel::pack_pair;
using kernel::swizzled_step_address;
using kernel::to_element;
using kernel::wait_copies;

constexpr int kMmaRows = 16;       // the M of mma.m16n8k16
constexpr int kMmaDepth = 16;      // its K
constexpr int kMmaCols = 8;        // its N: the columns of one FP32 accumulator tile
constexpr int kChunkElements = 8;  // 16 bytes of a 16-bit type: one cp.async, one ldmatrix row
constexpr int kMaxDim = 256;
constexpr int kMaxGradDims = 128;  // the dims of dK, dV and dQ one block owns, at most (registers)
// The FP32 dQ workspace holds each query head's rows rounded up to a multiple of this (the largest
// Br of any tiling), in tiles of Br rows × the bucket's D: a step's atomics stay inside its own
// tile and need no bounds test (rows past Nq and dims past D add zeros to floats nobody reads).
// The layout inside a tile is the atomics' (Tiling::accumulator_offset).
constexpr int kAccumulatorRowMultiple = 128;
constexpr int kWarpStrip = 32;  // the output rows of a warp's share of a product: two mma row tiles
// Everything that sizes the kernel of one head-dim bucket. Eight warps (128 keys; 64 query rows a
// step, 128 at D = 64) where shared memory allows: each Q and dO tile brought in serves twice the
// keys, and a step twice the queries. Four warps (64 keys; 32 rows, 64 at D = 64) where it does
// not: GPUs with less than 165 KB a block (D = 128) or 166 KB (D = 64), an A100's 163 KB
// included, and D = 256.
//
// The warps tile each product the way FlashAttention-2 does (the layouts below), so that an
// operand read from shared memory serves several warps' worth of output: a warp computes 32 keys
// of S^T, dP^T, dK and dV, and 32 query rows of dQ.
template <int kDim, int kWarpCount>
struct Tiling {
  static constexpr int kWarps = kWarpCount;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kKeys = kWarps * kMmaRows;  // Bc
  // 8 warps an SM: 255 registers a thread, and no further block for ptxas to spill registers for.
  static constexpr int kBlocksPerSm = 8 / kWarps;
  // Query rows per step (Br): as many as the registers allow, so that each step's two barriers and
  // each warp's operand loads serve as many products as they can. At D = 64 the eight-warp block
  // takes 128 (S^T and dP^T of a warp are then 32 keys × 64 queries: 64 registers each).
  static constexpr int kQueries = kDim <= 64 ? (kWarps == 8 ? 128 : 64) : (kWarps == 8 ? 64 : 32);
  static constexpr int kStages = 2;  // query tiles in the cp.async ring
  // The output dims a block owns: all of them up to D = 128. At D = 256 dK and dV would not fit in
  // the registers: two blocks share each key tile, one for each half of the dims of dK, dV and dQ.
  // Both compute S^T and dP^T over all the dims, which costs two products twice.
  static constexpr int kGradDims = kDim < kMaxGradDims ? kDim : kMaxGradDims;
  static constexpr int kDimParts = kDim / kGradDims;

  // S^T, dP^T, dK, dV: the warps that share a strip of 32 keys split the step's queries (S^T, dP^T)
  // or the block's dims (dK, dV) between them.
  static constexpr int kWarpKeys = kWarpStrip;
  static constexpr int kKeyStrips = kKeys / kWarpKeys;
  static constexpr int kStripWarps = kWarps / kKeyStrips;
  static constexpr int kWarpQueries = kQueries / kStripWarps;
  static constexpr int kWarpGradDims = kGradDims / kStripWarps;
  // dQ: the step's Br × kGradDims split among the warps, 32 query rows (all Br if fewer) × kDqDims.
  static constexpr int kDqWarpQueries = kQueries < kWarpStrip ? kQueries : kWarpStrip;
  static constexpr int kDqQueryStrips = kQueries / kDqWarpQueries;
  static constexpr int kDqDims = kGradDims * kDqQueryStrips / kWarps;

  static constexpr int kRowStride = kDim;                         // a swizzled row, in elements
  static constexpr int kScoreStride = kQueries + kChunkElements;  // P^T and dS^T rows (one key), in elements
  static constexpr int kKvTileElements = kKeys * kRowStride;
  static constexpr int kScoreTileElements = kKeys * kScoreStride;
  static constexpr int kQueryTileElements = kQueries * kRowStride;
  // Shared memory, in elements of the 16-bit type: K, V, P^T, dS^T, then per ring slot Q and dO,
  // then per ring slot the FP32 LSE and D of the slot's rows.
  static constexpr int kProbOffset = 2 * kKvTileElements;
  static constexpr int kGradScoreOffset = kProbOffset + kScoreTileElements;
  static constexpr int kRingOffset = kGradScoreOffset + kScoreTileElements;
  static constexpr int kRowDataOffset = kRingOffset + kStages * 2 * kQueryTileElements;
  static constexpr int kSharedBytes = kRowDataOffset * 2 + kStages * 2 * kQueries * 4;

  static_assert(kDim % kMmaDepth == 0 && kQueries % kMmaDepth == 0, "whole 16-wide mma steps");
  static_assert(2 * kQueries <= kThreads, "one thread for each row's LSE and each row's D");
  static_assert(kKeys % kWarpKeys == 0 && kWarps % kKeyStrips == 0, "whole key strips");
  static_assert(kWarpQueries % (2 * kMmaCols) == 0 && kWarpGradDims % (2 * kMmaCols) == 0, "whole pairs of tiles");
  static_assert(kDqDims % (2 * kMmaCols) == 0, "dQ splits evenly among the warps");
  static_assert(kDim % kGradDims == 0, "the dim parts cover the bucket");
  static_assert(kAccumulatorRowMultiple % kQueries == 0, "whole query tiles in each head's workspace rows");

  // Where dQ's element (row, column) of a query tile lies in the tile's FP32 workspace. The warps'
  // 32-row × kDqDims blocks lie one after another (block p·kWarps + w: warp w's, of dim part p); in a
  // block, each 16 × 8 accumulator tile [i][n] of the warp is 128 floats side by side (tile
  // i·kDqTiles + n), in the order its atomics write them (add_tile): a warp's atomic covers whole
  // 128-byte lines of L2 instead of 32 bytes of each of 8 rows.
  static constexpr int kDqTiles = kDqDims / kMmaCols;
  static constexpr int kDqBlockElements = kDqWarpQueries * kDqDims;
  static constexpr int kTileElements = kMmaRows * kMmaCols;
  __device__ __forceinline__ static int accumulator_offset(int row, int column) {
    const int part = column / kGradDims;
    const int block_column = column % kGradDims % kDqDims;
    const int warp = column % kGradDims / kDqDims * kDqQueryStrips + row / kDqWarpQueries;
    const int block_row = row % kDqWarpQueries;
    const int tile = block_row / kMmaRows * kDqTiles + block_column / kMmaCols;
    const int lane = block_row % 8 * 4 + block_column % kMmaCols / 2;
    const int element = block_row % kMmaRows / 8 * 2 + column % 2;  // of the lane's four in the tile
    return (part * kWarps + warp) * kDqBlockElements + tile * kTileElements + tile_offset(lane, element);
  }
  // The place of the lane's element e (0-3) in its tile's 128 floats: lane by lane on sm_90, whose
  // atomic adds four at once; element by element before it, one float a lane an atomic.
  __device__ __forceinline__ static int tile_offset(int lane, int element) {
#if __CUDA_ARCH__ >= 900
    return lane * 4 + element;
#else
    return element * kWarpSize + lane;
#endif
  }
};

// The Q, dO, K and V tiles, swizzled as in stage 08 (fa/kernel/tile_copy.cuh copies them in).
template <int kDim>
using SwizzledTile = kernel::SwizzledRows<kDim / kChunkElements>;

// One FP32 number of a row (its LSE or D) into shared memory, 0 where `inside` is false: by a
// 4-byte cp.async that joins the step's group of copies (kAsync), else by a plain load.
template <bool kAsync>
__device__ __forceinline__ void copy_row_value(float* destination, const float* source, bool inside) {
  if constexpr (kAsync) {
    const auto shared_destination = static_cast<unsigned>(__cvta_generic_to_shared(destination));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_destination), "l"(source),
                 "r"(inside ? 4 : 0)
                 : "memory");
  } else {
    *destination = inside ? *source : 0.0f;
  }
}

// Where an operand of warp_multiply lies in shared memory. lane_address(row, chunk): the shared
// address of the lane's element in the operand's first 16 × 16 block (row < 16, chunk 0 or 1);
// offset(address, rows, columns): the same `rows` rows down (a multiple of 16) and `columns`
// columns right (a multiple of 16). A block of a swizzled tile, from row first_row (a multiple of
// 8, so that row % 8 is the lane's own) and column first_column (a multiple of the operand's
// width, at most 64 and a power of two, or of 64): within a group of 8 chunks a column offset
// flips chunk bits the lane's own chunk leaves clear (an XOR; stage 08 does the same), and whole
// groups and rows add constants, which ldmatrix takes as immediates.
template <typename Element, int kDim>
struct SwizzledOperand {
  const Element* tile;
  int first_row;
  int first_column;
  __device__ __forceinline__ unsigned lane_address(int row, int chunk) const {
    const int index = (first_row + row) * kDim + ((first_column / kChunkElements + chunk) ^ row % 8) * kChunkElements;
    return static_cast<unsigned>(__cvta_generic_to_shared(tile + index));
  }
  __device__ __forceinline__ static unsigned offset(unsigned address, int rows, int columns) {
    return swizzled_step_address<8>(address, columns / kMmaDepth) + rows * kDim * static_cast<int>(sizeof(Element));
  }
};
// ... or of a padded tile (P^T and dS^T, rows of kStride elements), from element `origin`.
template <typename Element, int kStride>
struct PaddedOperand {
  const Element* origin;
  __device__ __forceinline__ unsigned lane_address(int row, int chunk) const {
    return static_cast<unsigned>(__cvta_generic_to_shared(origin + row * kStride + chunk * kChunkElements));
  }
  __device__ __forceinline__ static unsigned offset(unsigned address, int rows, int columns) {
    return address + (rows * kStride + columns) * static_cast<int>(sizeof(Element));
  }
};

// How an operand of warp_multiply is stored: by_row, row r of the operand is a row of
// the tile (A as Q in Q·Kᵀ; B given as Bᵀ, as K there); by_depth, the tile holds the operand's
// transpose, one row per step of the depth (A as dS read from dS^T; B as V in P·V).
enum class Stored { by_row, by_depth };

// acc += A·B for one warp: A is kRowTiles·16 rows × kDepth, B kDepth × kColTiles·8 columns, acc the
// kRowTiles × kColTiles FP32 accumulator tiles of mma.m16n8k16; `a` and `b` say where the operands
// lie (above). Per 16-deep step each A fragment is loaded once and serves every column tile, each
// pair of B tiles once and serves every row tile: the larger the warp's share, the fewer bytes
// read per product. Lane patterns (stage 08's README, "The fragments"): "A rows", lane l reads row
// l % 16, 8-column chunk l / 16; "B rows", row (l / 16)·8 + l % 8, chunk (l / 8) % 2. A by_row and
// B by_depth use "A rows", the others "B rows"; by_depth operands are transposed on load.
template <typename Element, Stored kA, Stored kB, int kRowTiles, int kColTiles, int kDepth, typename OperandA,
          typename OperandB>
__device__ __forceinline__ void warp_multiply(float (&acc)[kRowTiles][kColTiles][4], const OperandA& a,
                                              const OperandB& b) {
  static_assert(kColTiles % 2 == 0 && kDepth % kMmaDepth == 0, "whole pairs of tiles, whole 16-deep steps");
  const int lane = threadIdx.x % kWarpSize;
  const int a_row = lane % 16;
  const int a_chunk = lane / 16;
  const int b_row = lane / 16 * 8 + lane % 8;
  const int b_chunk = lane / 8 % 2;
  const unsigned a_lane = kA == Stored::by_row ? a.lane_address(a_row, a_chunk) : a.lane_address(b_row, b_chunk);
  const unsigned b_lane = kB == Stored::by_row ? b.lane_address(b_row, b_chunk) : b.lane_address(a_row, a_chunk);
  const auto load_a = [&](unsigned(&fragments)[kRowTiles][4], int depth) {
#pragma unroll
    for (int i = 0; i < kRowTiles; ++i) {
      if constexpr (kA == Stored::by_row) {
        load_matrices(fragments[i], OperandA::offset(a_lane, i * kMmaRows, depth));
      } else {
        load_matrices_transposed(fragments[i], OperandA::offset(a_lane, depth, i * kMmaRows));
      }
    }
  };
  const auto load_b = [&](unsigned(&fragments)[4], int pair, int depth) {
    if constexpr (kB == Stored::by_row) {
      load_matrices(fragments, OperandB::offset(b_lane, pair * 2 * kMmaCols, depth));
    } else {
      load_matrices_transposed(fragments, OperandB::offset(b_lane, depth, pair * 2 * kMmaCols));
    }
  };
  const auto multiply_pair = [&](const unsigned(&a_fragments)[kRowTiles][4], const unsigned(&b_fragments)[4],
                                 int pair) {
#pragma unroll
    for (int i = 0; i < kRowTiles; ++i) {
      mma_16x8x16<Element>(acc[i][2 * pair], a_fragments[i], b_fragments[0], b_fragments[1]);
      mma_16x8x16<Element>(acc[i][2 * pair + 1], a_fragments[i], b_fragments[2], b_fragments[3]);
    }
  };
  // Pipelined, step d + 1's fragments are loaded before step d's products, so that the loads are
  // in flight while the tensor cores work: where a step's fragments take at most 16 registers, and
  // on sm_90, whose register allocation has room for the second set (sm_80's spills at D = 128).
#if __CUDA_ARCH__ >= 900
  constexpr bool kPipelined = kRowTiles * 4 + kColTiles * 2 <= 16;
#else
  constexpr bool kPipelined = false;
#endif
  constexpr int kSteps = kDepth / kMmaDepth;
  if constexpr (kPipelined) {
    unsigned a_fragments[2][kRowTiles][4];
    unsigned b_fragments[2][kColTiles / 2][4];
    load_a(a_fragments[0], 0);
#pragma unroll
    for (int pair = 0; pair < kColTiles / 2; ++pair) load_b(b_fragments[0][pair], pair, 0);
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      const int next = (step + 1) % 2;
      if (step + 1 < kSteps) {
        load_a(a_fragments[next], (step + 1) * kMmaDepth);
#pragma unroll
        for (int pair = 0; pair < kColTiles / 2; ++pair) load_b(b_fragments[next][pair], pair, (step + 1) * kMmaDepth);
      }
#pragma unroll
      for (int pair = 0; pair < kColTiles / 2; ++pair)
        multiply_pair(a_fragments[step % 2], b_fragments[step % 2][pair], pair);
    }
  } else {
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      unsigned a_fragments[kRowTiles][4];
      load_a(a_fragments, step * kMmaDepth);
#pragma unroll
      for (int pair = 0; pair < kColTiles / 2; ++pair) {
        unsigned b_fragments[4];
        load_b(b_fragments, pair, step * kMmaDepth);
        multiply_pair(a_fragments, b_fragments, pair);
      }
    }
  }
}

// Two 16 × 8 FP32 accumulator tiles side by side, rounded to 16-bit pairs, into shared memory with
// sm_90's stmatrix.x4 (ldmatrix's mirror: the four 8 × 8 blocks are rows 0-7 and 8-15 of the first
// tile, then of the second; lane l gives the address of row l % 8 of block l / 8).
template <typename Element>
__device__ __forceinline__ void store_tile_pair(unsigned lane_address, const float (&first)[4],
                                                const float (&second)[4]) {
#if __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(lane_address),
               "r"(pack_pair<Element>(first[0], first[1])), "r"(pack_pair<Element>(first[2], first[3])),
               "r"(pack_pair<Element>(second[0], second[1])), "r"(pack_pair<Element>(second[2], second[3])));
#else
  __trap();  // sm_90 and newer: the kernels use it only there (kStoreByMatrix)
#endif
}

#if FA_STAGE11_DEVICE_CODE
// Adds one FP32 accumulator tile of a warp (the lane's four values) to its 128 floats of the dQ
// workspace, in L2 (Tiling::tile_offset): on sm_90 one 16-byte atomic a lane
// (red.global.add.v4.f32), the warp's 512 contiguous bytes, four L2 requests; before sm_90, which
// has no vector atomic, four 4-byte atomics a lane, each the warp's 128 contiguous bytes, one request.
template <typename T>
__device__ __forceinline__ void add_tile(float* tile, int lane, const float (&values)[4]) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(tile + T::tile_offset(lane, 0)),
            make_float4(values[0], values[1], values[2], values[3]));
#else
#pragma unroll
  for (int e = 0; e < 4; ++e) atomicAdd(tile + T::tile_offset(lane, e), values[e]);
#endif
}
#endif

// Preprocessing: D_i = rowsum(dO ∘ O) in FP32, one warp per query row.
template <typename Element>
__global__ void row_delta_kernel(const Element* __restrict__ out, const Element* __restrict__ grad_out,
                                 float* __restrict__ row_delta, int64_t rows, int dim) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  float sum = 0.0f;
  for (int d = lane; d < dim; d += kWarpSize) {
    sum += static_cast<float>(out[row * dim + d]) * static_cast<float>(grad_out[row * dim + d]);
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullWarp, sum, offset);
  if (lane == 0) row_delta[row] = sum;
}

// The last step: dQ = scale · (the FP32 sum of every key tile's dS K), rounded to the element type,
// one warp per row of dQ, reading the workspace where the main kernel's atomics left it.
template <typename Element, int kDim, int kWarpCount>
__global__ void scale_grad_query_kernel(const float* __restrict__ accumulated, Element* __restrict__ grad_q,
                                        int64_t rows, int q_seq, int accumulator_head_rows, int dim, float scale) {
  using T = Tiling<kDim, kWarpCount>;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  if (row >= rows) return;
  const int64_t head = row / q_seq;
  const int row_in_head = static_cast<int>(row % q_seq);
  const float* tile =
      accumulated + (head * accumulator_head_rows + row_in_head / T::kQueries * T::kQueries) * int64_t{kDim};
  for (int d = threadIdx.x % kWarpSize; d < dim; d += kWarpSize) {
    grad_q[row * dim + d] = to_element<Element>(tile[T::accumulator_offset(row_in_head % T::kQueries, d)] * scale);
  }
}

// One block: keys [key_base, key_base + Bc) of one K/V head, against every query row of its group.
// Q, O, dO, dQ are (B, Hq, Nq, D), K, V, dK, dV (B, Hkv, Nk, D), LSE and D (B, Hq, Nq).
// kAtomicGradQuery: the block adds its share of dQ with atomics (else the dQ pass below makes dQ).
template <typename Element, int kDim, int kWarpCount, bool kAsync, bool kAtomicGradQuery>
__global__ void __launch_bounds__(Tiling<kDim, kWarpCount>::kThreads, Tiling<kDim, kWarpCount>::kBlocksPerSm)
    backward_kernel(const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                    const Element* __restrict__ grad_out, const float* __restrict__ lse,
                    const float* __restrict__ row_delta, float* __restrict__ grad_q_accumulator,
                    Element* __restrict__ grad_k, Element* __restrict__ grad_v, int q_seq, int kv_seq, int dim,
                    int accumulator_head_rows, int key_tiles, int q_heads, int kv_heads, bool causal, float scale,
                    float scale_log2) {
#if FA_STAGE11_DEVICE_CODE
  using T = Tiling<kDim, kWarpCount>;
  constexpr int kKeyTiles = T::kWarpKeys / kMmaRows;         // 16-key row tiles of a warp's S^T, dK, dV
  constexpr int kScoreTiles = T::kWarpQueries / kMmaCols;    // 8-query column tiles of its S^T
  constexpr int kGradTiles = T::kWarpGradDims / kMmaCols;    // 8-dim column tiles of its dK, dV
  constexpr int kDqRowTiles = T::kDqWarpQueries / kMmaRows;  // 16-query row tiles of its dQ
  constexpr int kDqTiles = T::kDqTiles;                      // 8-dim column tiles of its dQ
  // P^T and dS^T go to shared memory by stmatrix where a warp's strip is 64 queries wide (D = 64,
  // eight warps) on sm_90: a quarter of the store instructions of 4-byte stores, where those were
  // 64 a step beside 320 mma. With 32-query strips (D = 128) they are half as many, and stmatrix
  // measured no faster there (the README's A/B).
#if __CUDA_ARCH__ >= 900
  constexpr bool kStoreByMatrix = kScoreTiles >= 8;
#else
  constexpr bool kStoreByMatrix = false;
#endif
  constexpr Stored kByRow = Stored::by_row;
  constexpr Stored kByDepth = Stored::by_depth;
  using Swizzled = SwizzledOperand<Element, kDim>;
  using Scores = PaddedOperand<Element, T::kScoreStride>;

  extern __shared__ __align__(128) unsigned char shared[];
  Element* const tiles = reinterpret_cast<Element*>(shared);
  Element* const key_tile = tiles;
  Element* const value_tile = tiles + T::kKvTileElements;
  Element* const prob_tile = tiles + T::kProbOffset;                            // P^T, [key][query]
  Element* const grad_score_tile = tiles + T::kGradScoreOffset;                 // dS^T, [key][query]
  float* const row_data = reinterpret_cast<float*>(tiles + T::kRowDataOffset);  // per slot: LSE, D

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group = lane / 4;  // accumulator rows group, group + 8
  const int quad = lane % 4;   // accumulator columns 2·quad, 2·quad + 1

  // Which keys: the key tile is the fast index, so the blocks in flight share a K/V head and read
  // the same Q and dO tiles, from L2 after the first. Under the causal mask the low key tiles see
  // the most query rows, and they come first.
  const int key_tile_index = static_cast<int>(blockIdx.x % static_cast<unsigned>(key_tiles));
  const int64_t kv_head = blockIdx.x / static_cast<unsigned>(key_tiles);  // b·Hkv + g
  const int group_size = q_heads / kv_heads;
  const int64_t first_query_head = kv_head / kv_heads * q_heads + kv_head % kv_heads * group_size;
  const int key_base = key_tile_index * T::kKeys;
  const int valid_keys = min(T::kKeys, kv_seq - key_base);
  const int grad_dim_base = static_cast<int>(blockIdx.y) * T::kGradDims;  // the block's dims of dK, dV, dQ
  const int64_t kv_offset = (kv_head * kv_seq + key_base) * dim;

  // The query rows that see any key of this tile: all, or under the causal mask (bottom-right
  // aligned) rows from key_base + Nq − Nk on; the query tiles above them are never loaded.
  const int first_query_tile = causal ? max(0, key_base + q_seq - kv_seq) / T::kQueries : 0;
  const int query_tiles = (q_seq + T::kQueries - 1) / T::kQueries - first_query_tile;
  const int steps = group_size * query_tiles;  // (query head of the group, query tile) pairs

  // Where a step's query rows are: query head first_query_head + s / query_tiles, query tile
  // first_query_tile + s % query_tiles. Carried from step to step rather than divided out: a
  // division by a runtime number is ~30 instructions, on the path from a step's barrier to its
  // first product.
  struct StepRows {
    int base;       // the step's first row within its query head
    int head;       // the query head, among all B·Hq
    int64_t first;  // the step's first row among all B·Hq·Nq rows
  };
  const int first_base = first_query_tile * T::kQueries;
  const auto rows_after = [&](StepRows rows) {  // the head's next query tile, or the next head's first
    return rows.base + T::kQueries < q_seq
               ? StepRows{rows.base + T::kQueries, rows.head, rows.first + T::kQueries}
               : StepRows{first_base, rows.head + 1, rows.first - rows.base + q_seq + first_base};
  };
  // A ring slot receives Q, dO, the LSE and D of a step, all by cp.async. Rows past Nq get zeros
  // in all four: their S is 0 and P = 2^0 = 1, but dO = 0 and D = 0 make their dP and dS 0, so
  // they add nothing to dV, dK or dQ (and their dQ rows are never written).
  const auto issue_step = [&](int slot, StepRows rows) {
    Element* query_slot = tiles + T::kRingOffset + slot * 2 * T::kQueryTileElements;
    const int valid_rows = q_seq - rows.base;
    copy_tile<kAsync, SwizzledTile<kDim>, kDim, T::kQueries, T::kThreads>(query_slot, q + rows.first * dim, valid_rows,
                                                                          dim);
    copy_tile<kAsync, SwizzledTile<kDim>, kDim, T::kQueries, T::kThreads>(query_slot + T::kQueryTileElements,
                                                                          grad_out + rows.first * dim, valid_rows, dim);
    if (threadIdx.x < 2 * T::kQueries) {  // thread r < Br: the LSE of row r; thread Br + r: its D
      const int row = static_cast<int>(threadIdx.x) % T::kQueries;
      const float* values = static_cast<int>(threadIdx.x) < T::kQueries ? lse : row_delta;
      const bool inside = row < valid_rows;
      copy_row_value<kAsync>(row_data + slot * 2 * T::kQueries + threadIdx.x,
                             inside ? values + rows.first + row : values, inside);
    }
  };

  // K and V of the block join the first group of copies, with step 0.
  copy_tile<kAsync, SwizzledTile<kDim>, kDim, T::kKeys, T::kThreads>(key_tile, k + kv_offset, valid_keys, dim);
  copy_tile<kAsync, SwizzledTile<kDim>, kDim, T::kKeys, T::kThreads>(value_tile, v + kv_offset, valid_keys, dim);
  StepRows rows{first_base, static_cast<int>(first_query_head), first_query_head * q_seq + first_base};  // step 0's
  issue_step(0, rows);  // every key sees at least the last query tile: steps >= 1
  commit_copies();

  // The warp's shares (FlashAttention-2's layouts; 8 warps, D = 128 shown):
  //
  //   S^T, dP^T (Bc × Br)       dK, dV (Bc × D)           dQ (Br × D)
  //   keys ↓  queries →         keys ↓  dims →            queries ↓  dims →
  //   ┌────┬────┐               ┌────┬────┐               ┌──┬──┬──┬──┐
  //   │ w0 │ w1 │  32 keys      │ w0 │ w1 │  32 keys      │w0│w2│w4│w6│  32 queries
  //   ├────┼────┤               ├────┼────┤               ├──┼──┼──┼──┤
  //   │ w2 │ w3 │               │ w2 │ w3 │               │w1│w3│w5│w7│
  //   ├────┼────┤  32 queries   ├────┼────┤  64 dims      └──┴──┴──┴──┘
  //   │ .. │ .. │  each         │ .. │ .. │  each          32 dims each
  //
  // A warp's S^T and dK, dV cover the same 32 keys. Reading an operand tile from shared memory
  // once per 32 rows of output, not once per 16, is what this layout buys over one 16-key strip a
  // warp; the price is that P^T and dS^T go through shared memory for dV and dK, as dS^T already
  // did for dQ.
  const int warp_key = warp / T::kStripWarps * T::kWarpKeys;           // the warp's first key in the tile
  const int warp_query = warp % T::kStripWarps * T::kWarpQueries;      // its first query of S^T, dP^T
  const int warp_grad_dim = warp % T::kStripWarps * T::kWarpGradDims;  // its first dim of dK, dV
  const int dq_query = warp % T::kDqQueryStrips * T::kDqWarpQueries;   // its first query of dQ
  const int dq_dim = warp / T::kDqQueryStrips * T::kDqDims;            // its first dim of dQ

  float key_grad[kKeyTiles][kGradTiles][4] = {};    // dK for the warp's 32 keys and dims, unscaled
  float value_grad[kKeyTiles][kGradTiles][4] = {};  // dV

#pragma unroll 1
  for (int step = 0; step < steps; ++step) {
    wait_copies<0>();  // this thread's copies of step `step` have landed
    // Every thread's copies are visible, and every warp is done with step - 1: its ring slot and
    // the P^T and dS^T tiles may be overwritten.
    __syncthreads();
    const int slot = step % T::kStages;
    const Element* query_slot = tiles + T::kRingOffset + slot * 2 * T::kQueryTileElements;
    const Element* grad_out_slot = query_slot + T::kQueryTileElements;
    const float* slot_lse = row_data + slot * 2 * T::kQueries;
    const float* slot_delta = slot_lse + T::kQueries;
    const int query_base = rows.base;

    // The first half of a step (S^T through the P^T and dS^T stores), compiled twice: without the
    // mask, for the steps whose keys every row sees, and with it, for the key tiles on the causal
    // diagonal or past Nk. One branch a step, instead of one in each tile of S^T, leaves the
    // unmasked half one straight run of code, in which the compiler can schedule P^T's
    // exponentials among dP^T's products.
    const bool needs_mask =
        key_base + T::kKeys > kv_seq || (causal && key_base + T::kKeys > causal_key_end(query_base, q_seq, kv_seq));
    const auto first_half = [&](auto masked) {
      // S^T = K Q^T for the warp's 32 keys and kWarpQueries queries, over all the dims.
      float scores[kKeyTiles][kScoreTiles][4] = {};
      warp_multiply<Element, kByRow, kByRow, kKeyTiles, kScoreTiles, kDim>(scores, Swizzled{key_tile, warp_key, 0},
                                                                           Swizzled{query_slot, warp_query, 0});

      // EXERCISE BEGIN: P^T from the S^T accumulators and the LSE, masked
      // P^T = 2^(s · scale · log2 e − LSE · log2 e): exact probabilities, no max and no sum to redo.
      // Element e of tile (i, n) is key key_base + warp_key + 16i + group + 8·(e / 2) and query
      // query_base + warp_query + 8n + 2·quad + e % 2. A key the row may not see (causal, or past
      // Nk) weighs 0.
#pragma unroll
      for (int i = 0; i < kKeyTiles; ++i) {
#pragma unroll
        for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key_base + warp_key + i * kMmaRows + group + 8 * (e / 2);
            const int query = warp_query + n * kMmaCols + 2 * quad + e % 2;
            const bool visible = !masked || key < visible_key_end(query_base + query, q_seq, kv_seq, causal);
            scores[i][n][e] = visible ? fast_exp2(fmaf(scores[i][n][e], scale_log2, -slot_lse[query] * kLog2e)) : 0.0f;
          }
        }
      }
      // EXERCISE END

      // dP^T = V dO^T, like S^T.
      float grad_probs[kKeyTiles][kScoreTiles][4] = {};
      warp_multiply<Element, kByRow, kByRow, kKeyTiles, kScoreTiles, kDim>(
          grad_probs, Swizzled{value_tile, warp_key, 0}, Swizzled{grad_out_slot, warp_query, 0});

      // EXERCISE BEGIN: dS^T = P^T ∘ (dP^T − D), in place of dP^T
#pragma unroll
      for (int i = 0; i < kKeyTiles; ++i) {
#pragma unroll
        for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            grad_probs[i][n][e] =
                scores[i][n][e] * (grad_probs[i][n][e] - slot_delta[warp_query + n * kMmaCols + 2 * quad + e % 2]);
          }
        }
      }
      // EXERCISE END

      // P^T and dS^T to shared memory, rounded to 16-bit pairs: the products below read them by
      // whole 32-key strips (dV, dK) and transposed (dQ).
      if constexpr (kStoreByMatrix) {
        // stmatrix.x4 stores four 8 × 8 blocks, lane l naming a row of block l / 8: here rows
        // group and group + 8 of tiles n and n + 1, so that lane l names key 16i + l % 16, query
        // 8n + 8·(l / 16). The lane index is read in the step (%laneid), not derived from
        // threadIdx before the loop: the compiler would keep that address in a register through
        // every product of the step, and at this register count that spilled.
        unsigned lane_id;
        asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane_id));
        const auto lane_address = static_cast<unsigned>(__cvta_generic_to_shared(
            prob_tile + (warp_key + lane_id % 16) * T::kScoreStride + warp_query + lane_id / 16 * kMmaCols));
        constexpr int kGradScoreBytes = (T::kGradScoreOffset - T::kProbOffset) * static_cast<int>(sizeof(Element));
#pragma unroll
        for (int i = 0; i < kKeyTiles; ++i) {
#pragma unroll
          for (int n = 0; n < kScoreTiles; n += 2) {
            const int offset = (i * kMmaRows * T::kScoreStride + n * kMmaCols) * static_cast<int>(sizeof(Element));
            store_tile_pair<Element>(lane_address + offset, scores[i][n], scores[i][n + 1]);
            store_tile_pair<Element>(lane_address + kGradScoreBytes + offset, grad_probs[i][n], grad_probs[i][n + 1]);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < kKeyTiles; ++i) {
#pragma unroll
          for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int offset =
                  (warp_key + i * kMmaRows + group + 8 * half) * T::kScoreStride + warp_query + n * kMmaCols + 2 * quad;
              *reinterpret_cast<unsigned*>(prob_tile + offset) =
                  pack_pair<Element>(scores[i][n][2 * half], scores[i][n][2 * half + 1]);
              *reinterpret_cast<unsigned*>(grad_score_tile + offset) =
                  pack_pair<Element>(grad_probs[i][n][2 * half], grad_probs[i][n][2 * half + 1]);
            }
          }
        }
      }
    };
    if (needs_mask) {
      first_half(std::true_type{});
    } else {
      first_half(std::false_type{});
    }
    // Step + 1's copies, into the slot step − 1 used (free since the barrier at the top): issued
    // here, where the warps are about to wait anyway, not at the top, where they would queue in
    // front of S^T's shared-memory loads and hold their address registers there.
    if (step + 1 < steps) issue_step((step + 1) % T::kStages, rows_after(rows));
    commit_copies();
    __syncthreads();  // P^T and dS^T are whole

    // dV += P^T dO and dK += dS^T Q for the warp's 32 keys and kWarpGradDims dims, over the step's
    // queries: P^T and dS^T by row, dO and Q by depth (their rows are queries).
    warp_multiply<Element, kByRow, kByDepth, kKeyTiles, kGradTiles, T::kQueries>(
        value_grad, Scores{prob_tile + warp_key * T::kScoreStride},
        Swizzled{grad_out_slot, 0, grad_dim_base + warp_grad_dim});
    warp_multiply<Element, kByRow, kByDepth, kKeyTiles, kGradTiles, T::kQueries>(
        key_grad, Scores{grad_score_tile + warp_key * T::kScoreStride},
        Swizzled{query_slot, 0, grad_dim_base + warp_grad_dim});

    // dQ += dS K for the warp's kDqWarpQueries queries and kDqDims dims, over the tile's keys: dS
    // read from dS^T transposed (by depth), K by depth (its rows are keys).
    if constexpr (kAtomicGradQuery) {
      float query_grad[kDqRowTiles][kDqTiles][4] = {};
      warp_multiply<Element, kByDepth, kByDepth, kDqRowTiles, kDqTiles, T::kKeys>(
          query_grad, Scores{grad_score_tile + dq_query}, Swizzled{key_tile, 0, grad_dim_base + dq_dim});
      // Other key tiles add to the same rows: FP32 atomic adds, unscaled (the last kernel scales),
      // tile by tile in the workspace's layout (Tiling::accumulator_offset).
      float* const warp_grad_q = grad_q_accumulator +
                                 (static_cast<int64_t>(rows.head) * accumulator_head_rows + rows.base) * kDim +
                                 (static_cast<int>(blockIdx.y) * T::kWarps + warp) * T::kDqBlockElements;
#pragma unroll
      for (int i = 0; i < kDqRowTiles; ++i) {
#pragma unroll
        for (int n = 0; n < kDqTiles; ++n) {
          add_tile<T>(warp_grad_q + (i * kDqTiles + n) * T::kTileElements, lane, query_grad[i][n]);
        }
      }
    }
    rows = rows_after(rows);
  }

  // dK = scale · Σ dS^T Q and dV, once, for the warp's 32 keys: lane holds keys 16i + group and
  // 16i + group + 8, dims grad_dim_base + warp_grad_dim + 8n + 2·quad and the next.
#pragma unroll
  for (int i = 0; i < kKeyTiles; ++i) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = warp_key + i * kMmaRows + group + 8 * half;
      if (key >= valid_keys) continue;
      Element* key_destination = grad_k + kv_offset + static_cast<int64_t>(key) * dim;
      Element* value_destination = grad_v + kv_offset + static_cast<int64_t>(key) * dim;
#pragma unroll
      for (int n = 0; n < kGradTiles; ++n) {
        const int column = grad_dim_base + warp_grad_dim + n * kMmaCols + 2 * quad;
        const float* key_pair = &key_grad[i][n][2 * half];
        const float* value_pair = &value_grad[i][n][2 * half];
        if constexpr (kAsync) {  // dim % 8 == 0 and aligned rows: a pair is one 4-byte store
          if (column < dim) {
            *reinterpret_cast<unsigned*>(key_destination + column) =
                pack_pair<Element>(key_pair[0] * scale, key_pair[1] * scale);
            *reinterpret_cast<unsigned*>(value_destination + column) = pack_pair<Element>(value_pair[0], value_pair[1]);
          }
        } else {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (column + e < dim) {
              key_destination[column + e] = to_element<Element>(key_pair[e] * scale);
              value_destination[column + e] = to_element<Element>(value_pair[e]);
            }
          }
        }
      }
    }
  }
#else
  __trap();  // never launched: the runner refuses GPUs older than sm_80 (the descriptor's architecture)
#endif
}

// The dQ pass: one block owns 64 query rows of one query head (16 a warp) and walks the key tiles
// of its K/V head in order, as the forward does, rebuilding P and dS there as the main kernel
// does and summing dQ = dS K in registers. Each dQ element has one owner and one order of
// additions: dQ is bitwise the same from run to run. The price: S and dP are computed a second
// time (seven products in all, not five), in exchange for no atomics and no dS^T round trip.
//
//   S  = Q Kᵀ            Q as A ("A rows"), K as Bᵀ ("B rows")              stage 08's QKᵀ
//   P  = 2^(S·scale·log2 e − LSE·log2 e), masked
//   dP = dO Vᵀ           dO as A, V as Bᵀ, like S
//   dS = P ∘ (dP − D)
//   dQ += dS K           dS from the accumulators as A (the P trick), K as B transposed on load
template <int kDim>
struct GradQueryTiling {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kQueries = kWarps * kMmaRows;  // Br: each warp owns 16 query rows
  static constexpr int kKeys = kDim > 128 ? 32 : 64;  // Bc (D = 256: a 163 KB block fits an A100)
  static constexpr int kStages = 2;                   // K/V tiles in the cp.async ring
  // The dims of dQ a block owns, as in the main kernel: at D = 256 two blocks per query tile.
  static constexpr int kGradDims = kDim < kMaxGradDims ? kDim : kMaxGradDims;
  static constexpr int kDimParts = kDim / kGradDims;
  static constexpr int kRowStride = kDim;  // swizzled rows
  static constexpr int kQueryTileElements = kQueries * kRowStride;
  static constexpr int kKvTileElements = kKeys * kRowStride;
  // Shared memory, in elements: Q, dO, then per ring slot K and V.
  static constexpr int kRingOffset = 2 * kQueryTileElements;
  static constexpr int kSharedBytes = (kRingOffset + kStages * 2 * kKvTileElements) * 2;
};

template <typename Element, int kDim, bool kAsync>
__global__ void __launch_bounds__(GradQueryTiling<kDim>::kThreads)
    grad_query_kernel(const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                      const Element* __restrict__ grad_out, const float* __restrict__ lse,
                      const float* __restrict__ row_delta, Element* __restrict__ grad_q, int q_seq, int kv_seq, int dim,
                      int query_tiles, int q_heads, int kv_heads, bool causal, float scale, float scale_log2) {
#if FA_STAGE11_DEVICE_CODE
  using T = GradQueryTiling<kDim>;
  constexpr int kKeySteps = T::kKeys / kMmaDepth;       // 16-key steps (and pairs of tiles)
  constexpr int kScoreTiles = T::kKeys / kMmaCols;      // 8-key accumulator tiles of S
  constexpr int kGradSteps = T::kGradDims / kMmaDepth;  // 16-dim pairs of dQ tiles
  constexpr int kGradTiles = T::kGradDims / kMmaCols;   // 8-dim accumulator tiles of dQ

  extern __shared__ __align__(128) unsigned char shared[];
  Element* const tiles = reinterpret_cast<Element*>(shared);
  Element* const query_tile = tiles;
  Element* const grad_out_tile = tiles + T::kQueryTileElements;

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group = lane / 4;
  const int quad = lane % 4;

  const int query_tile_index = static_cast<int>(blockIdx.x % static_cast<unsigned>(query_tiles));
  const int64_t query_head = blockIdx.x / static_cast<unsigned>(query_tiles);  // b·Hq + h
  const int group_size = q_heads / kv_heads;
  const int64_t kv_head = query_head / q_heads * kv_heads + query_head % q_heads / group_size;
  const int query_base = query_tile_index * T::kQueries;
  const int valid_rows = min(T::kQueries, q_seq - query_base);
  const int64_t first_row = query_head * q_seq + query_base;
  const int64_t kv_offset = kv_head * kv_seq * dim;
  const int grad_dim_base = static_cast<int>(blockIdx.y) * T::kGradDims;  // the block's dims of dQ
  // The keys the tile's last row sees bound the walk: under the mask the tiles past it are never loaded.
  const int key_end = static_cast<int>(visible_key_end(query_base + valid_rows - 1, q_seq, kv_seq, causal));
  const int key_tiles = (key_end + T::kKeys - 1) / T::kKeys;
  // Below this key every row of the block sees every key: tiles under it need no mask.
  const int unmasked_end = static_cast<int>(visible_key_end(query_base, q_seq, kv_seq, causal));

  const auto issue_tile = [&](int tile) {
    Element* key_slot = tiles + T::kRingOffset + tile % T::kStages * 2 * T::kKvTileElements;
    const int64_t offset = kv_offset + static_cast<int64_t>(tile) * T::kKeys * dim;
    const int valid_keys = kv_seq - tile * T::kKeys;
    copy_tile<kAsync, SwizzledTile<kDim>, kDim, T::kKeys, T::kThreads>(key_slot, k + offset, valid_keys, dim);
    copy_tile<kAsync, SwizzledTile<kDim>, kDim, T::kKeys, T::kThreads>(key_slot + T::kKvTileElements, v + offset,
                                                                       valid_keys, dim);
  };
  copy_tile<kAsync, SwizzledTile<kDim>, kDim, T::kQueries, T::kThreads>(query_tile, q + first_row * dim, valid_rows,
                                                                        dim);
  copy_tile<kAsync, SwizzledTile<kDim>, kDim, T::kQueries, T::kThreads>(grad_out_tile, grad_out + first_row * dim,
                                                                        valid_rows, dim);
  if (key_tiles > 0) issue_tile(0);
  commit_copies();

  // "A rows" lanes (warp_multiply) for K by depth in dQ += dS K.
  const int a_row = lane % 16;
  const int a_chunk = lane / 16;
  using Swizzled = SwizzledOperand<Element, kDim>;
  const int warp_row = warp * kMmaRows;  // the warp's first row in the tile

  // Per lane, rows group and group + 8 of the warp's strip: the LSE (log2 units) and D. A row past
  // Nq gets LSE = +inf, so P = 0: it adds nothing and is not written.
  float row_lse[2];
  float row_d[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp_row + group + 8 * half;
    const bool inside = row < valid_rows;
    row_lse[half] = inside ? lse[first_row + row] * kLog2e : INFINITY;
    row_d[half] = inside ? row_delta[first_row + row] : 0.0f;
  }

  float query_grad[kGradTiles][4] = {};  // dQ for the warp's 16 rows and the block's dims, unscaled

#pragma unroll 1
  for (int tile = 0; tile < key_tiles; ++tile) {
    wait_copies<0>();
    __syncthreads();  // tile `tile` has landed for every thread; every warp is done with tile - 1
    if (tile + 1 < key_tiles) issue_tile(tile + 1);
    commit_copies();
    const Element* key_slot = tiles + T::kRingOffset + tile % T::kStages * 2 * T::kKvTileElements;
    const Element* value_slot = key_slot + T::kKvTileElements;
    const unsigned key_lane = Swizzled{key_slot, 0, grad_dim_base}.lane_address(a_row, a_chunk);
    const int key_base = tile * T::kKeys;

    // S = Q Kᵀ for the warp's 16 rows and the tile's keys.
    float scores[1][kScoreTiles][4] = {};
    warp_multiply<Element, Stored::by_row, Stored::by_row, 1, kScoreTiles, kDim>(
        scores, Swizzled{query_tile, warp_row, 0}, Swizzled{key_slot, 0, 0});

    // P = 2^(s · scale · log2 e − LSE · log2 e), 0 where the row may not see the key (by
    // selection: a row that sees no key has LSE = -inf).
    const bool needs_mask = key_base + T::kKeys > min(unmasked_end, kv_seq);
#pragma unroll
    for (int n = 0; n < kScoreTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key_base + n * kMmaCols + 2 * quad + e % 2;
        const int row = query_base + warp_row + group + 8 * (e / 2);
        const bool visible = !needs_mask || key < visible_key_end(row, q_seq, kv_seq, causal);
        scores[0][n][e] = visible ? fast_exp2(fmaf(scores[0][n][e], scale_log2, -row_lse[e / 2])) : 0.0f;
      }
    }

    // dP = dO Vᵀ, like S.
    float grad_probs[1][kScoreTiles][4] = {};
    warp_multiply<Element, Stored::by_row, Stored::by_row, 1, kScoreTiles, kDim>(
        grad_probs, Swizzled{grad_out_tile, warp_row, 0}, Swizzled{value_slot, 0, 0});

    // dQ += dS K with dS = P ∘ (dP − D): tiles 2j and 2j + 1 of dS, rounded to 16-bit pairs, are
    // the A fragment of keys 16j .. 16j + 15; K as B, transposed on load.
#pragma unroll
    for (int j = 0; j < kKeySteps; ++j) {
      float grad_scores[2][4];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          grad_scores[t][e] = scores[0][2 * j + t][e] * (grad_probs[0][2 * j + t][e] - row_d[e / 2]);
        }
      }
      const unsigned fragment[4] = {pack_pair<Element>(grad_scores[0][0], grad_scores[0][1]),
                                    pack_pair<Element>(grad_scores[0][2], grad_scores[0][3]),
                                    pack_pair<Element>(grad_scores[1][0], grad_scores[1][1]),
                                    pack_pair<Element>(grad_scores[1][2], grad_scores[1][3])};
#pragma unroll
      for (int pair = 0; pair < kGradSteps; ++pair) {
        unsigned keys[4];
        load_matrices_transposed(keys, Swizzled::offset(key_lane, j * kMmaDepth, pair * kMmaDepth));
        mma_16x8x16<Element>(query_grad[2 * pair], fragment, keys[0], keys[1]);
        mma_16x8x16<Element>(query_grad[2 * pair + 1], fragment, keys[2], keys[3]);
      }
    }
  }

  // dQ = scale · Σ dS K, once: lane holds rows group and group + 8, dims grad_dim_base + 8n + 2·quad
  // and the next.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp_row + group + 8 * half;
    if (row >= valid_rows) continue;
    Element* destination = grad_q + (first_row + row) * dim;
#pragma unroll
    for (int n = 0; n < kGradTiles; ++n) {
      const int column = grad_dim_base + n * kMmaCols + 2 * quad;
      if constexpr (kAsync) {
        if (column < dim) {
          *reinterpret_cast<unsigned*>(destination + column) =
              pack_pair<Element>(query_grad[n][2 * half] * scale, query_grad[n][2 * half + 1] * scale);
        }
      } else {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (column + e < dim) destination[column + e] = to_element<Element>(query_grad[n][2 * half + e] * scale);
        }
      }
    }
  }
#else
  __trap();  // never launched: the runner refuses GPUs older than sm_80 (the descriptor's architecture)
#endif
}

// The head-dim buckets: a problem runs in the first that holds its D.
template <typename Launch>
Status dispatch_bucket(int64_t dim, Launch&& launch) {
  return dispatch_head_dim<64, kMaxGradDims, kMaxDim>(dim, launch);
}

// The rows of each query head in the FP32 dQ workspace: Nq rounded up to whole tiles of any Br.
int64_t accumulator_head_rows(const Problem& problem) {
  return (problem.q_seq + kAccumulatorRowMultiple - 1) / kAccumulatorRowMultiple * kAccumulatorRowMultiple;
}

// The FP32 dQ workspace, in floats: each query head's rows, each the bucket's D wide.
int64_t accumulator_elements(const Problem& problem) {
  int64_t bucket = 0;
  const Status status = dispatch_bucket(problem.dim, [&](auto dims) {
    bucket = decltype(dims)::value;
    return Status();
  });
  return status.ok() ? problem.q_heads_total() * accumulator_head_rows(problem) * bucket : 0;
}

// The workspace: dQ in FP32 (the atomics' target), then D, one float per query row.
int64_t workspace_bytes(const Problem& problem, Pass pass) {
  if (pass != Pass::backward) return 0;
  return (accumulator_elements(problem) + problem.q_rows()) * static_cast<int64_t>(sizeof(float));
}

template <typename Element, int kDim, int kWarpCount, bool kAsync, bool kAtomicGradQuery>
Status launch(const BackwardArgs& args) {
  using T = Tiling<kDim, kWarpCount>;
  const Problem& problem = args.problem;
  const auto kernel = &backward_kernel<Element, kDim, kWarpCount, kAsync, kAtomicGradQuery>;
  FA_STATUS_TRY(opt_in_shared_memory(kernel, T::kSharedBytes));
  const int64_t key_tiles = (problem.kv_seq + T::kKeys - 1) / T::kKeys;
  const int64_t blocks = key_tiles * problem.kv_heads_total();
  FA_STATUS_TRY(check_grid(blocks));
  const float scale = softmax_scale(problem);
  float* grad_q_accumulator = static_cast<float*>(args.workspace);
  float* row_delta = grad_q_accumulator + accumulator_elements(problem);
  const auto* grad_out = static_cast<const Element*>(args.grad_o);

  // 1. D_i = rowsum(dO ∘ O), and the FP32 dQ cleared for the atomics.
  constexpr int kRowsPerBlock = 8;
  const int64_t rows = problem.q_rows();
  row_delta_kernel<Element>
      <<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kRowsPerBlock * kWarpSize, 0,
         args.stream>>>(static_cast<const Element*>(args.o), grad_out, row_delta, rows, static_cast<int>(problem.dim));
  FA_LAUNCH_TRY();
  if constexpr (kAtomicGradQuery) {
    FA_CUDA_TRY(cudaMemsetAsync(grad_q_accumulator, 0,
                                static_cast<std::size_t>(accumulator_elements(problem)) * sizeof(float), args.stream));
  }

  // 2. One block per (K/V head, key tile) and part of the dims: dK and dV, and dQ's shares.
  const dim3 grid(static_cast<unsigned>(blocks), T::kDimParts);
  kernel<<<grid, T::kThreads, T::kSharedBytes, args.stream>>>(
      static_cast<const Element*>(args.q), static_cast<const Element*>(args.k), static_cast<const Element*>(args.v),
      grad_out, args.lse, row_delta, grad_q_accumulator, static_cast<Element*>(args.grad_k),
      static_cast<Element*>(args.grad_v), static_cast<int>(problem.q_seq), static_cast<int>(problem.kv_seq),
      static_cast<int>(problem.dim), static_cast<int>(accumulator_head_rows(problem)), static_cast<int>(key_tiles),
      static_cast<int>(problem.q_heads), static_cast<int>(problem.kv_heads), problem.causal, scale, scale * kLog2e);
  FA_LAUNCH_TRY();

  if constexpr (!kAtomicGradQuery) {
    // 3. dQ by its own pass: one block per (query head, 64-row query tile) and part of the dims.
    using G = GradQueryTiling<kDim>;
    const auto grad_query = &grad_query_kernel<Element, kDim, kAsync>;
    FA_STATUS_TRY(opt_in_shared_memory(grad_query, G::kSharedBytes));
    const int64_t query_tiles = (problem.q_seq + G::kQueries - 1) / G::kQueries;
    const int64_t query_blocks = query_tiles * problem.q_heads_total();
    FA_STATUS_TRY(check_grid(query_blocks));
    grad_query<<<dim3(static_cast<unsigned>(query_blocks), G::kDimParts), G::kThreads, G::kSharedBytes, args.stream>>>(
        static_cast<const Element*>(args.q), static_cast<const Element*>(args.k), static_cast<const Element*>(args.v),
        grad_out, args.lse, row_delta, static_cast<Element*>(args.grad_q), static_cast<int>(problem.q_seq),
        static_cast<int>(problem.kv_seq), static_cast<int>(problem.dim), static_cast<int>(query_tiles),
        static_cast<int>(problem.q_heads), static_cast<int>(problem.kv_heads), problem.causal, scale, scale * kLog2e);
    FA_LAUNCH_TRY();
    return Status();
  }

  // 3. dQ = scale · the sum, rounded to the element type.
  scale_grad_query_kernel<Element, kDim, kWarpCount>
      <<<static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), kRowsPerBlock * kWarpSize, 0,
         args.stream>>>(grad_q_accumulator, static_cast<Element*>(args.grad_q), rows, static_cast<int>(problem.q_seq),
                        static_cast<int>(accumulator_head_rows(problem)), static_cast<int>(problem.dim), scale);
  FA_LAUNCH_TRY();
  return Status();
}

// The warp count of a bucket: eight where their block fits this GPU's shared memory, else four.
template <typename Element, int kDim, bool kAsync>
Status launch_bucket(const BackwardArgs& args, bool atomics) {
  const auto with_warps = [&](auto warps) {
    constexpr int kWarpCount = decltype(warps)::value;
    return atomics ? launch<Element, kDim, kWarpCount, kAsync, true>(args)
                   : launch<Element, kDim, kWarpCount, kAsync, false>(args);
  };
  if constexpr (kDim > kMaxGradDims) {
    return with_warps(std::integral_constant<int, 4>{});
  } else {
    int device = 0;
    int shared_limit = 0;
    FA_CUDA_TRY(cudaGetDevice(&device));
    FA_CUDA_TRY(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (Tiling<kDim, 8>::kSharedBytes <= shared_limit) return with_warps(std::integral_constant<int, 8>{});
    return with_warps(std::integral_constant<int, 4>{});
  }
}

// The runner has checked the problem (sizes, head dim, features) and the GPU (sm_80 or newer)
// against the descriptor before this runs.
template <typename Element>
Status backward(const BackwardArgs& args) {
  if (args.q == nullptr || args.k == nullptr || args.v == nullptr || args.o == nullptr || args.grad_o == nullptr ||
      args.lse == nullptr || args.grad_q == nullptr || args.grad_k == nullptr || args.grad_v == nullptr ||
      args.workspace == nullptr) {
    return Status::unsupported("the backward pass needs Q, K, V, O, dO, LSE, dQ, dK, dV and its workspace");
  }
  // cp.async and the paired dK/dV stores need rows of whole, aligned 16-byte chunks.
  const bool async_copies = args.problem.dim % kChunkElements == 0 &&
                            all_aligned16({args.q, args.k, args.v, args.grad_o, args.grad_k, args.grad_v});
  // The deterministic mode (fa/deterministic.hpp): dQ by the dQ pass, bitwise the same from run
  // to run (README: what it costs); otherwise by atomics.
  const bool atomics = !deterministic_backward();
  return dispatch_bucket(args.problem.dim, [&](auto bucket) {
    constexpr int kBucket = decltype(bucket)::value;
    return async_copies ? launch_bucket<Element, kBucket, true>(args, atomics)
                        : launch_bucket<Element, kBucket, false>(args, atomics);
  });
}

StageDescriptor describe(Precision precision, ForwardFn forward_function, BackwardFn backward_function,
                         const char* title) {
  StageDescriptor stage;
  stage.id = "11_backward";
  stage.title = title;
  stage.backend = Backend::cuda;
  stage.precision = precision;
  stage.forward = forward_function;
  stage.backward = backward_function;
  stage.workspace_bytes = &workspace_bytes;
  stage.max_dim = kMaxDim;
  stage.architecture = {80, false};  // BF16 mma.m16n8k16 and cp.async
  stage.features = {/*causal=*/true, /*grouped=*/true, /*rectangular=*/true, /*lse=*/true, /*backward=*/true};
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace

StageDescriptor backward_fp16() {
  return describe(
      Precision::fp16, mma_registers_fp16().forward, &backward<__half>,
      "the backward pass on mma.sync: P rebuilt from the LSE, dK and dV in registers, dQ by atomics (FP16)");
}

StageDescriptor backward_bf16() {
  return describe(
      Precision::bf16, mma_registers_bf16().forward, &backward<__nv_bfloat16>,
      "the backward pass on mma.sync: P rebuilt from the LSE, dK and dV in registers, dQ by atomics (BF16)");
}

}  // namespace fa::stages
