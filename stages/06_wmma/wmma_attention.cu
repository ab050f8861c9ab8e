// Stage 06: FlashAttention on tensor cores, through the WMMA API.
//
// A tensor core multiplies small matrix tiles in one warp-wide instruction. CUDA's WMMA API
// (nvcuda::wmma) exposes it as 16x16x16 "fragments": the 32 threads of a warp together hold a
// 16x16 FP16 tile of A, a 16x16 FP16 tile of B and a 16x16 FP32 accumulator C, and one
// mma_sync computes C += A·B (4096 multiply-adds). Which thread holds which element of a
// fragment is unspecified, so everything that is not a matrix product (the softmax) reads the
// scores from shared memory, where every element has a known address.
//
// The work split is FlashAttention-2's: a block of 4 warps owns 64 query rows, and each warp
// owns 16 of them outright. A warp computes its own scores, runs the online softmax of its own
// rows and accumulates its own slice of O; warps share only the K/V tiles, so the only
// block-wide barriers are the two around each K/V tile load.
//
// Inputs and output are FP16; every product is accumulated in FP32. Head dims are compiled in
// buckets of 16, 32, 64, 128 and 256 (a fragment is 16 wide); any other D is padded with zeros
// up to the next bucket inside the kernel, which changes no dot product.
//
// Causal masking (query i sees keys 0..i; the rule is written once, in common/include/fa/causal.hpp,
// and in 32 bits as visible_key_limit): a block stops at the K/V tile that holds its last
// row's key, so tiles wholly above the diagonal are never loaded; only tiles that cross the
// diagonal are masked key by key; the blocks with the most tiles are launched first
// (kernel::block_work).
//
// Device helpers that later stages reuse live in common/include/fa/kernel/: from this stage,
// fast_exp2 (exp2.cuh; what it does is said below, where this file takes it in).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
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

namespace wmma = nvcuda::wmma;

using kernel::kFullWarp;
using kernel::kWarpSize;
constexpr int kFragment = 16;  // the WMMA shape is 16x16x16
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kQueryRows = kWarps * kFragment;  // Br: query rows per block, 16 per warp
constexpr int kMaxDim = 256;
constexpr int kChunkHalves = 8;  // one 16-byte vector load

// 2^x on the special-function unit: the instruction ex2.approx.ftz.f32, which flushes results
// below 2^-126 to zero (far below anything FP16 can hold); exp2f would wrap the same instruction
// in a fix-up for those tiny results. The softmax works in log2 units, with log2(e) folded into
// the scale (kLog2e), so every exponential is one fast_exp2. Written in
// common/include/fa/kernel/exp2.cuh, which stage 07 includes as well.
using kernel::fast_exp2;
using kernel::kLog2e;

// A: 16 query rows x 16 head dims of Q, or 16 rows x 16 keys of P. B: K^T (K stored row-major
// is K^T stored column-major) or V. The accumulator holds S or O in FP32.
using QueryOrProbs = wmma::fragment<wmma::matrix_a, kFragment, kFragment, kFragment, __half, wmma::row_major>;
using KeysTransposed = wmma::fragment<wmma::matrix_b, kFragment, kFragment, kFragment, __half, wmma::col_major>;
using Values = wmma::fragment<wmma::matrix_b, kFragment, kFragment, kFragment, __half, wmma::row_major>;
using Accumulator = wmma::fragment<wmma::accumulator, kFragment, kFragment, kFragment, float>;

constexpr int max_of(int a, int b) { return a > b ? a : b; }

// Sizes of one head-dim bucket. Every shared-memory row is padded by 8 elements (16 bytes of
// FP16, 32 bytes of FP32), so the 8 rows a fragment load or store touches at once start in
// different banks instead of all in the same one.
template <int kDim>
struct Tiling {
  // Bc: keys per K/V tile. 64 keys keep the two tensor-core loops long; at D = 256 a 64-key
  // tile would not fit a T4's 64 KB of shared memory, so those tiles hold 16 keys.
  static constexpr int kKeys = kDim <= 128 ? 64 : 16;
  // Up to D = 128 a warp keeps its D/16 Q fragments in registers for the whole loop (8 at
  // D = 128, loaded once). At D = 256 those plus the 16 O accumulators would not fit in 255
  // registers, so Q stays in the warp's shared-memory slice and is reloaded for every tile.
  static constexpr bool kQueryInRegisters = kDim <= 128;
  // Blocks that must fit on one SM at once (a register cap for the compiler): while one block
  // waits at a barrier for its K/V tile, the others keep the tensor cores busy.
  static constexpr int kMinBlocksPerSm = kDim <= 128 ? 3 : 2;

  static constexpr int kTileStride = kDim + 8;         // halves per row of Q, K and V
  static constexpr int kScoreStride = kKeys + 8;       // floats per row of S
  static constexpr int kProbStride = kKeys + 8;        // halves per row of P
  static constexpr int kFactorStride = kFragment + 8;  // floats per row of a 16x16 FP32 tile

  static constexpr int kKvTileBytes = kKeys * kTileStride * 2;
  static constexpr int kQuerySliceBytes = kFragment * kTileStride * 2;
  static constexpr int kScoreBytes = kFragment * kScoreStride * 4;
  static constexpr int kProbBytes = kFragment * kProbStride * 2;
  static constexpr int kFactorBytes = kFragment * kFactorStride * 4;
  // A warp's scratch holds its scores; once every lane has its scores in registers it holds
  // the probabilities and the rescale factors instead; at the end, one output tile at a time.
  static constexpr int kScratchBytes = max_of(kScoreBytes, kProbBytes + kFactorBytes);
  // Q in registers: the Q slice is only needed before the loop, so it shares the scratch.
  static constexpr int kWarpBytes =
      kQueryInRegisters ? max_of(kQuerySliceBytes, kScratchBytes) : kQuerySliceBytes + kScratchBytes;
  static constexpr int kSharedBytes = 2 * kKvTileBytes + kWarps * kWarpBytes;

  // Fragment loads need 256-bit aligned addresses: every region must start at a multiple of 32.
  static_assert(kKvTileBytes % 32 == 0 && kQuerySliceBytes % 32 == 0 && kProbBytes % 32 == 0 && kWarpBytes % 32 == 0,
                "shared-memory regions must stay 32-byte aligned");
  static_assert(kDim % kFragment == 0 && kKeys % kFragment == 0, "buckets and tiles are whole fragments");
};

// Copies `rows` rows of a (rows x dim) FP16 matrix from global memory into a shared tile of
// kDim columns, writing zeros in the padding columns (dim..kDim) and in the rows past
// `valid_rows` (keys or queries past N), so that padding never adds anything to a product.
// kThreadCount threads share the copy; `thread` is this one's index among them.
template <int kDim, int kRows, int kThreadCount, bool kVectorIo>
__device__ void load_tile(__half* tile, int stride, const __half* source, int valid_rows, int dim, int thread) {
  if constexpr (kVectorIo) {
    // dim % 8 == 0 and 16-byte aligned pointers: whole 16-byte chunks. A thread copies the same
    // chunk column of every kRowsPerPass-th row, and issues all its loads before its first
    // store so that their latencies overlap.
    constexpr int kChunksPerRow = kDim / kChunkHalves;
    constexpr int kRowsPerPass = kThreadCount / kChunksPerRow;
    constexpr int kPasses = kRows / kRowsPerPass;
    static_assert(kThreadCount % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
    const int first_row = thread / kChunksPerRow;
    const int column = thread % kChunksPerRow * kChunkHalves;
    const uint4* from = reinterpret_cast<const uint4*>(source + first_row * dim + column);
    const int step = kRowsPerPass * dim / kChunkHalves;  // in chunks
    uint4 chunk[kPasses];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      chunk[pass] = make_uint4(0, 0, 0, 0);
      if (first_row + pass * kRowsPerPass < valid_rows && column < dim) chunk[pass] = from[pass * step];
    }
    uint4* to = reinterpret_cast<uint4*>(tile + first_row * stride + column);
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) to[pass * kRowsPerPass * stride / kChunkHalves] = chunk[pass];
  } else {
    for (int index = thread; index < kRows * kDim; index += kThreadCount) {
      const int row = index / kDim;
      const int column = index % kDim;
      tile[row * stride + column] = row < valid_rows && column < dim ? source[row * dim + column] : __float2half(0.0f);
    }
  }
}

// Two floats rounded to FP16, as the 32 bits that hold them (low half first in memory).
__device__ __forceinline__ unsigned pack_halves(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const unsigned*>(&pair);
}

// One block: 64 query rows (one query tile) of one (batch, head).
template <int kDim, bool kVectorIo>
__global__ void __launch_bounds__(kThreads, Tiling<kDim>::kMinBlocksPerSm)
    wmma_attention_kernel(const __half* __restrict__ q, const __half* __restrict__ k, const __half* __restrict__ v,
                          __half* __restrict__ o, int seq, int dim, int query_tiles, int heads_total, bool causal,
                          float scale_log2) {
  using T = Tiling<kDim>;
  constexpr int kDimFragments = kDim / kFragment;
  constexpr int kKeyFragments = T::kKeys / kFragment;
  constexpr int kScoresPerLane = T::kKeys / 2;  // two lanes share each of the warp's 16 rows

  extern __shared__ __align__(128) unsigned char shared[];
  __half* key_tile = reinterpret_cast<__half*>(shared);
  __half* value_tile = reinterpret_cast<__half*>(shared + T::kKvTileBytes);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  unsigned char* warp_slice = shared + 2 * T::kKvTileBytes + warp * T::kWarpBytes;
  __half* query_slice = reinterpret_cast<__half*>(warp_slice);
  unsigned char* scratch = warp_slice + (T::kQueryInRegisters ? 0 : T::kQuerySliceBytes);
  float* scores = reinterpret_cast<float*>(scratch);
  __half* probs = reinterpret_cast<__half*>(scratch);
  float* factors = reinterpret_cast<float*>(scratch + T::kProbBytes);
  float* output_tile = reinterpret_cast<float*>(scratch);

  // Which query tile of which head (kernel::block_work). Without masking every block has the same
  // work, and a head's query tiles are numbered together: blocks resident at once read the same
  // K/V, shared in L2. With causal masking query tile t reads t + 1 tiles' worth of K/V, so the
  // query tile is the slow index and runs backwards: the longest blocks start first and the short
  // ones fill in the tail as they finish (longest-processing-time-first), instead of a late long
  // block running on alone.
  const kernel::BlockWork work = kernel::block_work(blockIdx.x, query_tiles, heads_total, causal);
  const int64_t head_offset = work.query_head * seq * dim;
  const int block_first_row = work.query_tile * kQueryRows;
  const int warp_first_row = block_first_row + warp * kFragment;
  // Causal: no row of the block sees a key past what its last row sees, so the loop stops there;
  // no row of the warp sees a key past what the warp's last row sees.
  const int key_end = visible_key_limit(block_first_row + kQueryRows - 1, seq, seq, causal);
  const int warp_key_end = visible_key_limit(warp_first_row + kFragment - 1, seq, seq, causal);

  // For the softmax, lanes 2r and 2r+1 own row r of the warp's 16; each takes every other
  // group of 4 columns (the interleaving keeps the score reads free of bank conflicts).
  const int my_row = lane / 2;
  const int my_half = lane % 2;

  // The warp's own 16 query rows: only this warp reads them, so __syncwarp is the barrier.
  load_tile<kDim, kFragment, kWarpSize, kVectorIo>(query_slice, T::kTileStride,
                                                   q + head_offset + static_cast<int64_t>(warp_first_row) * dim,
                                                   seq - warp_first_row, dim, lane);
  __syncwarp();
  QueryOrProbs query[T::kQueryInRegisters ? kDimFragments : 1];
  if constexpr (T::kQueryInRegisters) {
#pragma unroll
    for (int d = 0; d < kDimFragments; ++d)
      wmma::load_matrix_sync(query[d], query_slice + d * kFragment, T::kTileStride);
    __syncwarp();  // the slice becomes scratch
  }

  // O for the warp's 16 rows: D/16 accumulators in registers, never normalized until the end
  // (FlashAttention-2). m is kept in log2 units: m = max_j(s_j) · scale · log2(e).
  Accumulator out[kDimFragments];
#pragma unroll
  for (int d = 0; d < kDimFragments; ++d) wmma::fill_fragment(out[d], 0.0f);
  float row_max = -INFINITY;
  float row_sum = 0.0f;

  for (int key_base = 0; key_base < key_end; key_base += T::kKeys) {
    const int valid_keys = min(T::kKeys, seq - key_base);
    __syncthreads();  // every warp is done with the previous K/V tile
    load_tile<kDim, T::kKeys, kThreads, kVectorIo>(
        key_tile, T::kTileStride, k + head_offset + static_cast<int64_t>(key_base) * dim, valid_keys, dim, threadIdx.x);
    load_tile<kDim, T::kKeys, kThreads, kVectorIo>(value_tile, T::kTileStride,
                                                   v + head_offset + static_cast<int64_t>(key_base) * dim, valid_keys,
                                                   dim, threadIdx.x);
    __syncthreads();  // the tile is complete
    // Causal: a tile that starts past every key the warp's last row sees is all masked for its 16
    // rows (it happens with the 16-key tiles of D = 256, for the block's first warps on the
    // diagonal). The warp only had to share the load; it skips the products.
    if (key_base >= warp_key_end) continue;

    // S = Q K^T for the warp's 16 rows, into its score slice. Two 16-key accumulators at a
    // time: their chains of dependent products interleave, so the tensor core has work while
    // each product waits for the previous one on the same accumulator. (Not unrolled: fully
    // unrolled, the compiler would keep the address of every K fragment of the tile in a
    // register of its own, and the kernel would spill.)
    constexpr int kGroup = kKeyFragments >= 2 ? 2 : 1;
#pragma unroll 1
    for (int j0 = 0; j0 < kKeyFragments; j0 += kGroup) {
      Accumulator score[kGroup];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) wmma::fill_fragment(score[g], 0.0f);
#pragma unroll
      for (int d = 0; d < kDimFragments; ++d) {
        if constexpr (!T::kQueryInRegisters) {
          wmma::load_matrix_sync(query[0], query_slice + d * kFragment, T::kTileStride);
        }
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          KeysTransposed keys;
          wmma::load_matrix_sync(keys, key_tile + (j0 + g) * kFragment * T::kTileStride + d * kFragment,
                                 T::kTileStride);
          wmma::mma_sync(score[g], query[T::kQueryInRegisters ? d : 0], keys, score[g]);
        }
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        wmma::store_matrix_sync(scores + (j0 + g) * kFragment, score[g], T::kScoreStride, wmma::mem_row_major);
      }
    }
    __syncwarp();  // the score slice is complete

    // EXERCISE BEGIN: online softmax of the warp's 16 rows on its score slice: max, rescale factor, P, sum
    // Each lane reads its half of its row into registers.
    float s[kScoresPerLane];
#pragma unroll
    for (int c = 0; c < kScoresPerLane / 4; ++c) {
      const float4 group = *reinterpret_cast<const float4*>(scores + my_row * T::kScoreStride + 8 * c + 4 * my_half);
      s[4 * c + 0] = group.x;
      s[4 * c + 1] = group.y;
      s[4 * c + 2] = group.z;
      s[4 * c + 3] = group.w;
    }
    // Keys past N weigh nothing (the last tile), and with causal masking neither do keys past the
    // row's own position (tiles that cross the diagonal: some key of the tile lies past what the
    // warp's first row sees). Every other tile skips the test, one comparison for the whole warp.
    if (key_base + T::kKeys > visible_key_limit(warp_first_row, seq, seq, causal)) {
      const int visible_keys = visible_key_limit(warp_first_row + my_row, seq, seq, causal) - key_base;
#pragma unroll
      for (int i = 0; i < kScoresPerLane; ++i) {
        if (8 * (i / 4) + 4 * my_half + i % 4 >= visible_keys) s[i] = -INFINITY;
      }
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kScoresPerLane; ++i) tile_max = fmaxf(tile_max, s[i]);
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 1));
    // new_max is finite, so no exponent below is -inf - (-inf). The first tile holds key 0, which
    // every row sees (key 0 < N, and causal row i sees keys 0..i), so after it row_max is finite;
    // on it row_max is -inf and the rescale factor is 2^-inf = 0. A later tile whose keys are
    // all masked for a row (none is, in fact: tiles and warps both start at multiples of 16, so
    // a tile the warp computes starts at or before each of its rows) would give tile_max = -inf,
    // new_max = row_max, rescale 1 and p = 2^-inf = 0: it would change nothing.
    const float new_max = fmaxf(row_max, tile_max * scale_log2);
    const float rescale = fast_exp2(row_max - new_max);
    row_max = new_max;
    __syncwarp();  // all scores are in registers: the slice now takes P and the factors

    float tile_sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kScoresPerLane / 4; ++c) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) p[e] = fast_exp2(fmaf(s[4 * c + e], scale_log2, -new_max));
      tile_sum += (p[0] + p[1]) + (p[2] + p[3]);
      *reinterpret_cast<uint2*>(probs + my_row * T::kProbStride + 8 * c + 4 * my_half) =
          make_uint2(pack_halves(p[0], p[1]), pack_halves(p[2], p[3]));
    }
    tile_sum += __shfl_xor_sync(kFullWarp, tile_sum, 1);
    row_sum = row_sum * rescale + tile_sum;

    // O's rows must be multiplied by their factors, but which row an accumulator element
    // belongs to is unspecified. So the factors are written as a 16x16 matrix (row r all
    // rescale_r) and loaded as an accumulator: element i of that fragment sits at the same
    // (row, column) as element i of every O fragment, whatever the layout is.
    const float4 broadcast = make_float4(rescale, rescale, rescale, rescale);
    float* factor_row = factors + my_row * T::kFactorStride + 4 * my_half;  // interleaved, as the scores
    *reinterpret_cast<float4*>(factor_row) = broadcast;
    *reinterpret_cast<float4*>(factor_row + 8) = broadcast;
    __syncwarp();  // P and the factors are complete
    Accumulator factor;
    wmma::load_matrix_sync(factor, factors, T::kFactorStride, wmma::mem_row_major);
#pragma unroll
    for (int d = 0; d < kDimFragments; ++d) {
#pragma unroll
      for (int i = 0; i < factor.num_elements; ++i) out[d].x[i] *= factor.x[i];
    }
    // EXERCISE END

    // O += P V: 16 keys of P at a time against the matching 16 rows of V, every 16 columns; the
    // D/16 accumulators are independent chains. (Not unrolled, for the same reason as above.)
#pragma unroll 1
    for (int j = 0; j < kKeyFragments; ++j) {
      QueryOrProbs p;
      wmma::load_matrix_sync(p, probs + j * kFragment, T::kProbStride);
#pragma unroll
      for (int d = 0; d < kDimFragments; ++d) {
        Values values;
        wmma::load_matrix_sync(values, value_tile + j * kFragment * T::kTileStride + d * kFragment, T::kTileStride);
        wmma::mma_sync(out[d], p, values, out[d]);
      }
    }
  }

  // O / l, rounded to FP16, 16 columns at a time through the scratch (the accumulator layout is
  // unspecified, so a lane cannot tell which output elements its registers hold).
  const int64_t my_query = warp_first_row + my_row;
  const float inverse_sum = 1.0f / row_sum;
  __half* out_row = o + head_offset + my_query * dim;
  __syncwarp();  // the last P is consumed
#pragma unroll
  for (int d = 0; d < kDimFragments; ++d) {
    wmma::store_matrix_sync(output_tile, out[d], T::kFactorStride, wmma::mem_row_major);
    __syncwarp();
    const float* staged = output_tile + my_row * T::kFactorStride + 8 * my_half;
    const int column = d * kFragment + 8 * my_half;
    if (my_query < seq) {
      if constexpr (kVectorIo) {
        if (column < dim) {
          *reinterpret_cast<uint4*>(out_row + column) =
              make_uint4(pack_halves(staged[0] * inverse_sum, staged[1] * inverse_sum),
                         pack_halves(staged[2] * inverse_sum, staged[3] * inverse_sum),
                         pack_halves(staged[4] * inverse_sum, staged[5] * inverse_sum),
                         pack_halves(staged[6] * inverse_sum, staged[7] * inverse_sum));
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (column + e < dim) out_row[column + e] = __float2half_rn(staged[e] * inverse_sum);
        }
      }
    }
    __syncwarp();  // the staging tile is read before the next one overwrites it
  }
}

template <int kDim, bool kVectorIo>
Status launch(const ForwardArgs& args) {
  using T = Tiling<kDim>;
  const Problem& problem = args.problem;
  const int64_t seq = problem.q_seq;  // this stage takes Nq = Nk only (its descriptor says so)
  const auto kernel = &wmma_attention_kernel<kDim, kVectorIo>;
  // Above 48 KB a kernel must opt in to dynamic shared memory; opt_in_shared_memory (fa/launch.hpp)
  // checks the device's limit and asks for the largest carveout, so several blocks fit on one SM.
  FA_STATUS_TRY(opt_in_shared_memory(kernel, T::kSharedBytes));

  const int64_t query_tiles = (seq + kQueryRows - 1) / kQueryRows;
  const int64_t blocks = query_tiles * problem.q_heads_total();
  FA_STATUS_TRY(check_grid(blocks));
  const float scale_log2 = softmax_scale(problem) * kLog2e;
  kernel<<<static_cast<unsigned>(blocks), kThreads, T::kSharedBytes, args.stream>>>(
      static_cast<const __half*>(args.q), static_cast<const __half*>(args.k), static_cast<const __half*>(args.v),
      static_cast<__half*>(args.o), static_cast<int>(seq), static_cast<int>(problem.dim), static_cast<int>(query_tiles),
      static_cast<int>(problem.q_heads_total()), problem.causal, scale_log2);
  FA_LAUNCH_TRY();
  return Status();
}

// The runner has checked the problem against the descriptor before this runs; a direct call (the
// stage's tests make some) is checked here too, before anything touches the GPU.
Status forward(const ForwardArgs& args) {
  FA_STATUS_TRY(check_forward_args(args, kMaxDim));
  const Problem& problem = args.problem;
  // 16-byte loads and stores need every row to start on a 16-byte boundary. The 16-byte path and
  // the element-by-element fallback are separate kernels, so neither carries the other's
  // registers.
  const bool vector_io = problem.dim % kChunkHalves == 0 && all_aligned16({args.q, args.k, args.v, args.o});
  return dispatch_head_dim<16, 32, 64, 128, 256>(problem.dim, [&](auto bucket) {
    constexpr int kDim = decltype(bucket)::value;
    return vector_io ? launch<kDim, true>(args) : launch<kDim, false>(args);
  });
}

}  // namespace

StageDescriptor wmma_tensor_cores() {
  StageDescriptor stage;
  stage.id = "06_wmma";
  stage.title = "tensor cores through WMMA (FP16 in, FP32 accumulate); each warp owns 16 query rows";
  stage.backend = Backend::cuda;
  stage.precision = Precision::fp16;
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
