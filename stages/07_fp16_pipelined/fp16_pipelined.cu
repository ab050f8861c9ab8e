// Stage 07: a cp.async pipeline that streams the next K/V tiles in while the current one is computed.
//
// In stage 06 every K/V tile went global -> registers -> shared, between two barriers, and no
// warp could start on the tile until the slowest load had landed: each tile paid the full
// latency of global memory while the tensor cores waited. Ampere (sm_80) added cp.async, a copy
// from global straight into shared memory that does not wait for its data: a thread issues it,
// goes on computing, and later waits only for the groups of copies it needs.
//
// So the block reads K and V as one stream of tiles, K0, V0, K1, V1, ..., through a ring of
// kSlots shared-memory buffers: item i of the stream lands in slot i % kSlots. Before the loop
// the block issues the copies of the first kSlots - 1 items; before it uses item i it waits for
// item i alone, issues item i + kSlots - 1 into the slot item i - 1 has just released, and
// computes on item i while the later items are in flight. K and V are separate items because
// they are used at different times: V_j streams in while S = Q K_j^T is computed, K_(j+1) while
// O += P V_j is, and a slot is reused as soon as its one tile is done with, so three 64-key slots
// at D = 128 (51 KB) keep a copy in flight all the time and still leave room for three blocks on
// an SM, as in stage 06. Everything else is stage 06: WMMA tensor cores, four warps of 16 query
// rows each (the FlashAttention-2 split), scores and probabilities in each warp's shared scratch,
// O in accumulator fragments.
//
// The kernel is a template on the element type: FP16 (__half) or BF16 (__nv_bfloat16), both
// accumulated in FP32; P is rounded to the input type for the P·V product (to_element and
// pack_pair, from common/include/fa/kernel/convert.cuh). cp.async and BF16 WMMA need sm_80: the
// descriptor says so, and the runner refuses older GPUs before anything is launched.
//
// Causal masking (query i sees keys 0..i; the rule is written once, in common/include/fa/causal.hpp,
// and in 32 bits as visible_key_limit): a block stops at the K/V tile that holds its last
// row's key, so tiles wholly above the diagonal are never copied; only tiles that cross the
// diagonal are masked key by key; the blocks with the most tiles are launched first
// (kernel::block_work).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fa/cuda_check.hpp"
#include "fa/kernel/convert.cuh"
#include "fa/kernel/cp_async.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/launch_order.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"

// The device code of this file uses sm_80 instructions. It still compiles for older targets (the
// host code must), where the kernel body is a trap that the runner never lets run.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define FA_STAGE07_DEVICE_CODE 1
#else
#define FA_STAGE07_DEVICE_CODE 0
#endif

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
constexpr int kChunkElements = 8;  // one 16-byte copy of 16-bit elements

// The asynchronous copies, Ampere's three PTX instructions, wrapped in
// common/include/fa/kernel/cp_async.cuh (stage 08 uses them too; read that file beside this one):
//   copy_async_16(shared, global, bytes)  cp.async.cg.shared.global [shared], [global], 16, bytes
//       copies 16 bytes global -> shared without waiting for them; `.cg` caches them in L2 only
//       (K and V are reused by other blocks through L2, never by this SM through L1); with
//       bytes = 0 it reads nothing and writes 16 zero bytes, which is how rows past N and
//       padding columns are cleared without a branch around the copy.
//   commit_copies()                       cp.async.commit_group
//       closes the group of copies this thread has issued since its last commit.
//   wait_copies<N>()                      cp.async.wait_group N
//       waits until at most N of this thread's committed groups are still in flight. It covers
//       this thread's copies only: a __syncthreads after it makes every thread's copies visible.
using kernel::commit_copies;
using kernel::copy_async_16;
using kernel::wait_copies;

// 2^x on the special-function unit, as in stage 06 (common/include/fa/kernel/exp2.cuh), and
// FP32 -> the element type, one value or a rounded pair (common/include/fa/kernel/convert.cuh).
using kernel::fast_exp2;
using kernel::kLog2e;
using kernel::pack_pair;
using kernel::to_element;

// A: 16 query rows x 16 head dims of Q, or 16 rows x 16 keys of P. B: K^T (K stored row-major
// is K^T stored column-major) or V. The accumulator holds S or O in FP32.
template <typename Element>
using QueryOrProbs = wmma::fragment<wmma::matrix_a, kFragment, kFragment, kFragment, Element, wmma::row_major>;
template <typename Element>
using KeysTransposed = wmma::fragment<wmma::matrix_b, kFragment, kFragment, kFragment, Element, wmma::col_major>;
template <typename Element>
using Values = wmma::fragment<wmma::matrix_b, kFragment, kFragment, kFragment, Element, wmma::row_major>;
using Accumulator = wmma::fragment<wmma::accumulator, kFragment, kFragment, kFragment, float>;

constexpr int max_of(int a, int b) { return a > b ? a : b; }

// Sizes of one bucket: head dim kDim, Bc = kKeys keys per K/V tile, kSlots tiles in the ring (each
// a K tile or a V tile; kSlots - 1 in flight while one is computed on), and the blocks per SM its
// shared memory leaves room for on an H100/H200 (228 KB), a register cap for the compiler. Every
// shared-memory row is padded by 8 elements (16 bytes of a 16-bit type, 32 bytes of FP32), so
// the 8 rows a fragment load or store touches at once start in different banks instead of all in
// the same one.
template <int kDimBucket>
struct Tiling {
  static constexpr int kDim = kDimBucket;
  // The ring multiplies the K/V shared memory, so the tiles shrink where it would cost
  // occupancy. Up to D = 128, 64-key tiles and three blocks per SM: six slots at D = 64 (55 KB),
  // three at D = 128 (51 KB; a fourth would leave room for two blocks only). At D = 256 the
  // 16-key tiles of stage 06, four slots, two blocks.
  static constexpr int kKeys = kDim <= 128 ? 64 : 16;
  static constexpr int kSlots = kDim <= 64 ? 6 : kDim <= 128 ? 3 : 4;
  static constexpr int kMinBlocksPerSm = kDim <= 128 ? 3 : 2;
  // Up to D = 128 a warp keeps its D/16 Q fragments in registers for the whole loop (8 at
  // D = 128, loaded once). At D = 256 those plus the 16 O accumulators would not fit in 255
  // registers, so Q stays in the warp's shared-memory slice and is reloaded for every tile.
  static constexpr bool kQueryInRegisters = kDim <= 128;

  static constexpr int kTileStride = kDim + 8;         // elements per row of Q, K and V
  static constexpr int kScoreStride = kKeys + 8;       // floats per row of S
  static constexpr int kProbStride = kKeys + 8;        // elements per row of P
  static constexpr int kFactorStride = kFragment + 8;  // floats per row of a 16x16 FP32 tile

  static constexpr int kTileElements = kKeys * kTileStride;
  static constexpr int kKvTileBytes = kTileElements * 2;
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
  // The ring's slots, then the warps' slices.
  static constexpr int kRingBytes = kSlots * kKvTileBytes;
  static constexpr int kSharedBytes = kRingBytes + kWarps * kWarpBytes;

  // Fragment loads need 256-bit aligned addresses: every region must start at a multiple of 32
  // (which also keeps every 16-byte cp.async destination aligned).
  static_assert(kKvTileBytes % 32 == 0 && kQuerySliceBytes % 32 == 0 && kProbBytes % 32 == 0 && kWarpBytes % 32 == 0,
                "shared-memory regions must stay 32-byte aligned");
  static_assert(kDim % kFragment == 0 && kKeys % kFragment == 0, "buckets and tiles are whole fragments");
  static_assert(kSlots >= 2, "a pipeline needs a tile in flight while another is computed");
};

// Copies `rows` rows of a (rows x dim) matrix from global memory into a shared tile of kDim
// columns with ordinary loads and stores, writing zeros in the padding columns (dim..kDim) and in
// the rows past `valid_rows`. Used for the warp's Q rows (read once, nothing to overlap) and, on
// the fallback path (D % 8 != 0 or pointers off a 16-byte boundary, where 16-byte copies are
// impossible), for K and V too: there the ring still works, but every copy is synchronous.
template <typename Element, int kDim, int kRows, int kThreadCount>
__device__ void load_tile_sync(Element* tile, int stride, const Element* source, int valid_rows, int dim, int thread) {
  for (int index = thread; index < kRows * kDim; index += kThreadCount) {
    const int row = index / kDim;
    const int column = index % kDim;
    tile[row * stride + column] =
        row < valid_rows && column < dim ? source[row * dim + column] : to_element<Element>(0.0f);
  }
}

#if FA_STAGE07_DEVICE_CODE
// A Q, K, P or V fragment from shared memory. For FP16, wmma::load_matrix_sync becomes PTX's
// wmma.load...shared, which ptxas turns into ldmatrix (LDSM: each lane reads a 16-byte row of an
// 8x8 tile). For BF16 the same call comes out as a generic wmma.load (CUDA 13.0 does not carry
// the shared state space through its BF16 builtins), which ptxas can only lower to one 4-byte
// generic load (LD) per register, plus register transposes (MOVM) for K^T: about 4x the load
// instructions, on the slower generic path. So BF16 names the state space itself, in the same
// PTX instruction the builtin would emit: the four 32-bit registers are the fragment's storage,
// written in the order load_matrix_sync writes them.
template <typename Use, typename Layout, typename Element>
__device__ __forceinline__ void load_fragment(
    wmma::fragment<Use, kFragment, kFragment, kFragment, Element, Layout>& fragment, const Element* shared_pointer,
    unsigned stride) {
  if constexpr (std::is_same_v<Element, __half>) {
    wmma::load_matrix_sync(fragment, shared_pointer, stride);
  } else {
    static_assert(sizeof(fragment.x) == 4 * sizeof(unsigned), "a 16x16x16 BF16 fragment is four registers");
    unsigned* r = reinterpret_cast<unsigned*>(fragment.x);
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared_pointer));
    if constexpr (std::is_same_v<Use, wmma::matrix_a> && std::is_same_v<Layout, wmma::row_major>) {
      asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(address), "r"(stride)
                   : "memory");
    } else if constexpr (std::is_same_v<Use, wmma::matrix_b> && std::is_same_v<Layout, wmma::col_major>) {
      asm volatile("wmma.load.b.sync.aligned.col.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(address), "r"(stride)
                   : "memory");
    } else {
      static_assert(std::is_same_v<Use, wmma::matrix_b> && std::is_same_v<Layout, wmma::row_major>,
                    "the kernel loads Q and P (A, row-major), K^T (B, column-major) and V (B, row-major)");
      asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.shared.bf16 {%0, %1, %2, %3}, [%4], %5;\n"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(address), "r"(stride)
                   : "memory");
    }
  }
}

// Issues the copies of a tile (kRows rows of kDim columns: a K or V tile by the block, a warp's Q
// rows by the warp) into shared memory, without waiting for them: one copy_async_16 per 16-byte
// chunk, zero-filled past valid_rows and past dim. Each of the kThreadCount threads copies the
// same 16-byte column of every kRowsPerPass-th row.
template <typename Element, int kDim, int kRows, int kThreadCount>
__device__ void issue_tile_async(Element* tile, int stride, const Element* source, int valid_rows, int dim,
                                 int thread) {
  constexpr int kChunksPerRow = kDim / kChunkElements;
  constexpr int kRowsPerPass = kThreadCount / kChunksPerRow;
  constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kThreadCount % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "whole rows per pass");
  const int first_row = thread / kChunksPerRow;
  const int column = thread % kChunksPerRow * kChunkElements;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = first_row + pass * kRowsPerPass;
    const bool inside = row < valid_rows && column < dim;
    copy_async_16(tile + row * stride + column, inside ? source + static_cast<int64_t>(row) * dim + column : source,
                  inside ? 16 : 0);
  }
}
#endif

// One block: 64 query rows (one query tile) of one (batch, head).
template <typename Element, int kDim, bool kAsyncCopies>
__global__ void __launch_bounds__(kThreads, Tiling<kDim>::kMinBlocksPerSm)
    pipelined_attention_kernel(const Element* __restrict__ q, const Element* __restrict__ k,
                               const Element* __restrict__ v, Element* __restrict__ o, int seq, int dim,
                               int query_tiles, int heads_total, bool causal, float scale_log2) {
#if FA_STAGE07_DEVICE_CODE
  using T = Tiling<kDim>;
  constexpr int kDimFragments = kDim / kFragment;
  constexpr int kKeyFragments = T::kKeys / kFragment;
  constexpr int kScoresPerLane = T::kKeys / 2;  // two lanes share each of the warp's 16 rows

  extern __shared__ __align__(128) unsigned char shared[];
  // Slot s of the ring starts at ring + s · kTileElements.
  Element* ring = reinterpret_cast<Element*>(shared);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  unsigned char* warp_slice = shared + T::kRingBytes + warp * T::kWarpBytes;
  Element* query_slice = reinterpret_cast<Element*>(warp_slice);
  unsigned char* scratch = warp_slice + (T::kQueryInRegisters ? 0 : T::kQuerySliceBytes);
  float* scores = reinterpret_cast<float*>(scratch);
  Element* probs = reinterpret_cast<Element*>(scratch);
  float* factors = reinterpret_cast<float*>(scratch + T::kProbBytes);
  float* output_tile = reinterpret_cast<float*>(scratch);

  // Which query tile of which head, as in stage 06 (kernel::block_work): head-major without the
  // mask, so that blocks resident at once share a head's K/V in L2; heaviest first with it
  // (longest-processing-time-first), so that no long block starts last and runs on alone.
  const kernel::BlockWork work = kernel::block_work(blockIdx.x, query_tiles, heads_total, causal);
  const int64_t head_offset = work.query_head * seq * dim;
  const int block_first_row = work.query_tile * kQueryRows;
  const int warp_first_row = block_first_row + warp * kFragment;
  // Causal: no row of the block sees a key past what its last row sees, so the stream stops at
  // the tile that holds that key; the prologue and the refills count only these tiles, so no copy
  // of a tile above the diagonal is ever issued.
  const int key_end = visible_key_limit(block_first_row + kQueryRows - 1, seq, seq, causal);
  const int tiles = (key_end + T::kKeys - 1) / T::kKeys;
  const int items = 2 * tiles;  // the stream K0, V0, K1, V1, ...

  // For the softmax, lanes 2r and 2r+1 own row r of the warp's 16; each takes every other
  // group of 4 columns (the interleaving keeps the score reads free of bank conflicts).
  const int my_row = lane / 2;
  const int my_half = lane % 2;

  // The warp's own 16 query rows (only this warp reads them): on the cp.async path the first group
  // of copies, in flight with the first K/V tiles; on the fallback path, loaded through registers
  // (the group is then empty).
  const Element* query_source = q + head_offset + static_cast<int64_t>(warp_first_row) * dim;
  if constexpr (kAsyncCopies) {
    issue_tile_async<Element, kDim, kFragment, kWarpSize>(query_slice, T::kTileStride, query_source,
                                                          seq - warp_first_row, dim, lane);
  } else {
    load_tile_sync<Element, kDim, kFragment, kWarpSize>(query_slice, T::kTileStride, query_source, seq - warp_first_row,
                                                        dim, lane);
  }
  commit_copies();

  // EXERCISE BEGIN: issue the copies of stream item `item` into its slot (cp.async, zero-filled past N); no waiting
  // Item 2t is K tile t, item 2t + 1 is V tile t; item i goes to slot i % kSlots. On the fallback
  // path the same call copies synchronously.
  const auto issue_item = [&](int item) {
    Element* slot = ring + (item % T::kSlots) * T::kTileElements;
    const int key_base = item / 2 * T::kKeys;
    const int valid_keys = min(T::kKeys, seq - key_base);
    const Element* source = (item % 2 == 0 ? k : v) + head_offset + static_cast<int64_t>(key_base) * dim;
    if constexpr (kAsyncCopies) {
      issue_tile_async<Element, kDim, T::kKeys, kThreads>(slot, T::kTileStride, source, valid_keys, dim, threadIdx.x);
    } else {
      load_tile_sync<Element, kDim, T::kKeys, kThreads>(slot, T::kTileStride, source, valid_keys, dim, threadIdx.x);
    }
  };

  // The prologue fills all but one slot. Every step commits a group, empty or not, so that
  // "item i has landed" is always "at most kSlots - 2 groups are still in flight".
#pragma unroll
  for (int item = 0; item < T::kSlots - 1; ++item) {
    if (item < items) issue_item(item);
    commit_copies();
  }
  // EXERCISE END

  // Q's group has landed once no more than the prologue's kSlots - 1 groups are in flight; only
  // this warp reads the rows, so __syncwarp is the barrier.
  wait_copies<T::kSlots - 1>();
  __syncwarp();
  QueryOrProbs<Element> query[T::kQueryInRegisters ? kDimFragments : 1];
  if constexpr (T::kQueryInRegisters) {
#pragma unroll
    for (int d = 0; d < kDimFragments; ++d) load_fragment(query[d], query_slice + d * kFragment, T::kTileStride);
    __syncwarp();  // the slice becomes scratch
  }

  // O for the warp's 16 rows: D/16 accumulators in registers, never normalized until the end
  // (FlashAttention-2). m is kept in log2 units: m = max_j(s_j) · scale · log2(e).
  Accumulator out[kDimFragments];
#pragma unroll
  for (int d = 0; d < kDimFragments; ++d) wmma::fill_fragment(out[d], 0.0f);
  float row_max = -INFINITY;
  float row_sum = 0.0f;

  // Waits for stream item `item`, refills the slot the previous item has released and returns
  // the item's slot. Called by every thread of the block, for every item, in order.
  const auto next_item = [&](int item) {
    // EXERCISE BEGIN: wait for item `item` only, then refill the slot item - 1 released with item + kSlots - 1
    wait_copies<T::kSlots - 2>();  // this thread's copies of the item have landed
    // Every thread's copies of the item are visible, and every warp is done with item - 1, whose
    // slot the next copies overwrite.
    __syncthreads();
    if (item + T::kSlots - 1 < items) issue_item(item + T::kSlots - 1);
    commit_copies();
    // EXERCISE END
    return static_cast<const Element*>(ring + (item % T::kSlots) * T::kTileElements);
  };

#pragma unroll 1
  for (int tile = 0; tile < tiles; ++tile) {
    const Element* key_tile = next_item(2 * tile);
    const int key_base = tile * T::kKeys;
    const int valid_keys = min(T::kKeys, seq - key_base);

    // S = Q K^T for the warp's 16 rows, into its score slice. Two 16-key accumulators at a
    // time: their chains of dependent products interleave. (Not unrolled: fully unrolled, the
    // compiler would keep the address of every K fragment of the tile in a register of its own.)
    constexpr int kGroup = kKeyFragments >= 2 ? 2 : 1;
#pragma unroll 1
    for (int j0 = 0; j0 < kKeyFragments; j0 += kGroup) {
      Accumulator score[kGroup];
#pragma unroll
      for (int g = 0; g < kGroup; ++g) wmma::fill_fragment(score[g], 0.0f);
#pragma unroll
      for (int d = 0; d < kDimFragments; ++d) {
        if constexpr (!T::kQueryInRegisters) {
          load_fragment(query[0], query_slice + d * kFragment, T::kTileStride);
        }
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          KeysTransposed<Element> keys;
          load_fragment(keys, key_tile + (j0 + g) * kFragment * T::kTileStride + d * kFragment, T::kTileStride);
          wmma::mma_sync(score[g], query[T::kQueryInRegisters ? d : 0], keys, score[g]);
        }
      }
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        wmma::store_matrix_sync(scores + (j0 + g) * kFragment, score[g], T::kScoreStride, wmma::mem_row_major);
      }
    }
    __syncwarp();  // the score slice is complete

    // Online softmax of the warp's 16 rows, as in stage 06. Each lane reads its half of its row.
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
      const int limit = visible_keys - 4 * my_half;
#pragma unroll
      for (int i = 0; i < kScoresPerLane; ++i) {
        if (8 * (i / 4) + i % 4 >= limit) s[i] = -INFINITY;
      }
    }
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kScoresPerLane; ++i) tile_max = fmaxf(tile_max, s[i]);
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullWarp, tile_max, 1));
    // new_max is finite, so no exponent below is -inf - (-inf). The first tile holds key 0, which
    // every row sees (key 0 < N, and causal row i sees keys 0..i), so after it row_max is finite;
    // on it row_max is -inf and the rescale factor is 2^-inf = 0. A later tile whose keys are
    // all masked for a row gives tile_max = -inf, new_max = row_max, rescale 1 and p = 2^-inf = 0:
    // it changes nothing. With 64-key tiles no warp meets one (a block's last tile starts at its
    // first row); at D = 256 the 16-key tiles of the diagonal are all masked for the block's
    // first warps, which compute them anyway: skipping them would save little and the warps
    // must still take part in every barrier of the stream.
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
          make_uint2(pack_pair<Element>(p[0], p[1]), pack_pair<Element>(p[2], p[3]));
    }
    tile_sum += __shfl_xor_sync(kFullWarp, tile_sum, 1);
    row_sum = row_sum * rescale + tile_sum;

    // The rescale factors as a 16x16 matrix (row r all rescale_r), loaded as an accumulator:
    // element i of that fragment sits at the same (row, column) as element i of every O fragment.
    const float4 broadcast = make_float4(rescale, rescale, rescale, rescale);
    float* factor_row = factors + my_row * T::kFactorStride + 4 * my_half;
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

    // Every warp is done with K tile `tile`: its slot takes the next copies while V arrives.
    const Element* value_tile = next_item(2 * tile + 1);

    // O += P V: 16 keys of P at a time against the matching 16 rows of V, every 16 columns.
#pragma unroll 1
    for (int j = 0; j < kKeyFragments; ++j) {
      QueryOrProbs<Element> p;
      load_fragment(p, probs + j * kFragment, T::kProbStride);
#pragma unroll
      for (int d = 0; d < kDimFragments; ++d) {
        Values<Element> values;
        load_fragment(values, value_tile + j * kFragment * T::kTileStride + d * kFragment, T::kTileStride);
        wmma::mma_sync(out[d], p, values, out[d]);
      }
    }
  }

  // O / l, rounded to the element type, 16 columns at a time through the scratch.
  const int64_t my_query = warp_first_row + my_row;
  const float inverse_sum = 1.0f / row_sum;
  Element* out_row = o + head_offset + my_query * dim;
  __syncwarp();  // the last P is consumed
#pragma unroll
  for (int d = 0; d < kDimFragments; ++d) {
    wmma::store_matrix_sync(output_tile, out[d], T::kFactorStride, wmma::mem_row_major);
    __syncwarp();
    const float* staged = output_tile + my_row * T::kFactorStride + 8 * my_half;
    const int column = d * kFragment + 8 * my_half;
    if (my_query < seq) {
      if constexpr (kAsyncCopies) {
        if (column < dim) {
          *reinterpret_cast<uint4*>(out_row + column) =
              make_uint4(pack_pair<Element>(staged[0] * inverse_sum, staged[1] * inverse_sum),
                         pack_pair<Element>(staged[2] * inverse_sum, staged[3] * inverse_sum),
                         pack_pair<Element>(staged[4] * inverse_sum, staged[5] * inverse_sum),
                         pack_pair<Element>(staged[6] * inverse_sum, staged[7] * inverse_sum));
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (column + e < dim) out_row[column + e] = to_element<Element>(staged[e] * inverse_sum);
        }
      }
    }
    __syncwarp();  // the staging tile is read before the next one overwrites it
  }
#else
  __trap();  // never launched: the runner refuses GPUs older than sm_80 (the descriptor's architecture)
#endif
}

template <typename Element, int kDim, bool kAsyncCopies>
Status launch(const ForwardArgs& args) {
  using T = Tiling<kDim>;
  const Problem& problem = args.problem;
  const int64_t seq = problem.q_seq;  // this stage takes Nq = Nk only (its descriptor says so)
  const auto kernel = &pipelined_attention_kernel<Element, kDim, kAsyncCopies>;
  // Beyond 48 KB of dynamic shared memory, and with the largest carveout, as in stage 06.
  FA_STATUS_TRY(opt_in_shared_memory(kernel, T::kSharedBytes));

  const int64_t query_tiles = (seq + kQueryRows - 1) / kQueryRows;
  const int64_t blocks = query_tiles * problem.q_heads_total();
  FA_STATUS_TRY(check_grid(blocks));
  const float scale_log2 = softmax_scale(problem) * kLog2e;
  kernel<<<static_cast<unsigned>(blocks), kThreads, T::kSharedBytes, args.stream>>>(
      static_cast<const Element*>(args.q), static_cast<const Element*>(args.k), static_cast<const Element*>(args.v),
      static_cast<Element*>(args.o), static_cast<int>(seq), static_cast<int>(problem.dim),
      static_cast<int>(query_tiles), static_cast<int>(problem.q_heads_total()), problem.causal, scale_log2);
  FA_LAUNCH_TRY();
  return Status();
}

// The runner has checked the problem and the GPU (sm_80 or newer) against the descriptor before
// this runs; a direct call (the stage's tests make some) has its sizes and pointers checked here
// too, before anything touches the GPU.
template <typename Element>
Status forward(const ForwardArgs& args) {
  FA_STATUS_TRY(check_forward_args(args, kMaxDim));
  const Problem& problem = args.problem;
  // 16-byte copies need every row to start on a 16-byte boundary. The cp.async path and the
  // synchronous fallback are separate kernels, so neither carries the other's registers.
  const bool async_copies = problem.dim % kChunkElements == 0 && all_aligned16({args.q, args.k, args.v, args.o});
  return dispatch_head_dim<16, 32, 64, 128, 256>(problem.dim, [&](auto bucket) {
    constexpr int kDim = decltype(bucket)::value;
    return async_copies ? launch<Element, kDim, true>(args) : launch<Element, kDim, false>(args);
  });
}

StageDescriptor describe(Precision precision, ForwardFn forward_function, const char* title) {
  StageDescriptor stage;
  stage.id = "07_fp16_pipelined";
  stage.title = title;
  stage.backend = Backend::cuda;
  stage.precision = precision;
  stage.forward = forward_function;
  stage.workspace_bytes = nullptr;
  stage.max_dim = kMaxDim;
  stage.architecture = {80, false};  // cp.async and BF16 WMMA
  stage.features.causal = true;      // and nothing else: square problems (Hq = Hkv, Nq = Nk), no LSE
  stage.trace = nullptr;
  stage.kv_passes = 1.0;  // in K+V reads per query tile: one pass over K and V
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace

StageDescriptor pipelined_fp16() {
  return describe(Precision::fp16, &forward<__half>,
                  "cp.async pipeline: the next K/V tiles stream in while WMMA computes the current one (FP16)");
}

StageDescriptor pipelined_bf16() {
  return describe(Precision::bf16, &forward<__nv_bfloat16>,
                  "cp.async pipeline: the next K/V tiles stream in while WMMA computes the current one (BF16)");
}

}  // namespace fa::stages
