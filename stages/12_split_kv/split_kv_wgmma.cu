// Stage 12 on Hopper (sm_90a): the split kernel of a tile of more than one strip, on wgmma.
//
// A group of Hq/Hkv = 4 query heads at Nq = 16 packs 64 rows: exactly the M of one wgmma. On the
// mma.sync kernel (split_kv.cu) those rows are four strips, one a warp, each warp fetching every K
// and V fragment from shared memory with ldmatrix and issuing 128 small mma a tile; on an H200 that
// kernel keeps the tensor pipe busy only a third of the time and reads K and V at three quarters of
// the read ceiling (README, "What limits it"). Here one warpgroup (the same four warps) multiplies
// the whole tile: S = Q·Kᵀ as kDim/16 wgmma with Q and K read from shared memory through matrix
// descriptors, then O += P·V as 4 wgmma with P from registers (stage 09's two products), in stage
// 10's order: a tile's S issued with the previous tile's P·V (ptxas places the wait for that P·V
// before the softmax, as in stage 10: README, "On Hopper: the 64 rows are one wgmma"). The split, the masks, the
// online softmax and the partial outputs are split_kv.cu's (split_kv_device.cuh); the tile layout
// changes, to the 128-byte-swizzled 64-column panels that wgmma's descriptors read, and the ring's
// copies stay cp.async, so no tensor map is built per call (README, "On Hopper: the 64 rows are one
// wgmma").
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "fa/causal.hpp"
#include "fa/kernel/cp_async.cuh"
#include "fa/kernel/tile_copy.cuh"
#include "fa/kernel/tma.cuh"  // fence_shared_for_async_proxy
#include "fa/kernel/wgmma.cuh"
#include "fa/kernel/wgmma_walk.cuh"
#include "split_kv.hpp"
#include "split_kv_device.cuh"

// wgmma exists on sm_90a alone; this file builds for it alone (CMakeLists.txt), and the host calls
// it only on a GPU of compute capability 9.0 (split_kv::block_kernel).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_STAGE12_WGMMA_CODE 1
#else
#define FA_STAGE12_WGMMA_CODE 0
#endif

namespace fa::stages::split_kv {

namespace {

using kernel::commit_copies;
using kernel::copy_tile;
using kernel::fence_registers;
using kernel::fence_shared_for_async_proxy;
using kernel::kMmaDepth;
using kernel::kPanelColumns;
using kernel::kPanelRowBytes;
using kernel::kSwizzleBytes;
using kernel::matrix_descriptor;
using kernel::mn_major_descriptor;
using kernel::shared_address;
using kernel::SwizzledPanels;
using kernel::wait_copies;
using kernel::wgmma_wait;

// One head-dim bucket (64 or 128): one warpgroup on a 64-row tile, a ring of kStages 64-key stages.
// At D = 128, 16 KB of Q and 32 KB a stage.
template <int kDim>
struct WgmmaTiling {
  static constexpr int kThreads = kernel::kWarpgroupThreads;
  static constexpr int kRows = static_cast<int>(kTileRows);
  static constexpr int kKeys = 64;
  static constexpr int kStages = static_cast<int>(kWgmmaStages);
  static constexpr int kPanels = kDim / kPanelColumns;
  static constexpr int kQueryTileBytes = kPanels * kRows * kPanelRowBytes;
  static constexpr int kKvPanelBytes = kKeys * kPanelRowBytes;
  static constexpr int kKvTileBytes = kPanels * kKvPanelBytes;
  // Room to move the start to a 1024-byte boundary: dynamic shared memory promises 16 bytes.
  static constexpr int kSharedBytes = kSwizzleBytes + kQueryTileBytes + kStages * 2 * kKvTileBytes;

  static_assert(kStages >= 3, "a slot is refilled two tiles after it was read (the P·V overlap)");
  static_assert(kDim % kPanelColumns == 0, "a tile is whole 64-column panels");
  static_assert(kChunkAlign % kKeys == 0, "a chunk is whole K/V tiles");
  static_assert(kSharedBytes <= 227 * 1024, "a block fits in an H100's or H200's shared memory");
};

// One block: up to 64 packed query rows of one K/V head's group against one chunk of its keys, the
// same work as split_kv_kernel's (split_kv.cu), with the same parameters and the same outputs.
template <typename Element, int kDim>
__global__ void __launch_bounds__(WgmmaTiling<kDim>::kThreads)
    wgmma_split_kernel(const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,
                       Element* __restrict__ o, float* __restrict__ lse, float* __restrict__ partial_out,
                       float* __restrict__ partial_lse, int q_seq, int kv_seq, int dim, int packed_rows, int row_tiles,
                       int splits, int chunk_keys, int64_t q_rows, bool causal, float scale_log2) {
#if FA_STAGE12_WGMMA_CODE
  using T = WgmmaTiling<kDim>;
  constexpr int kKeySteps = T::kKeys / kMmaDepth;  // wgmma of O += P·V
  constexpr int kScoreTiles = T::kKeys / kAccumulatorColumns;

  extern __shared__ unsigned char shared_memory[];
  unsigned char* query_tile =
      shared_memory + (kSwizzleBytes - shared_address(shared_memory) % kSwizzleBytes) % kSwizzleBytes;
  unsigned char* ring = query_tile + T::kQueryTileBytes;  // slot s: K tile, then V tile
  const auto key_slot = [&](int slot) { return ring + 2 * slot * T::kKvTileBytes; };

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group = lane / 4;  // accumulator rows `group` and `group + 8` of the warp's 16
  const int quad = lane % 4;   // accumulator columns 2·quad and 2·quad + 1 of every 8

  const SplitBlock work = split_block(blockIdx.x, splits, row_tiles, packed_rows, T::kRows);
  const BlockKeys keys = block_keys(work, packed_rows, T::kRows, T::kKeys, q_seq, kv_seq, causal, chunk_keys);
  // wgmma's accumulators give warp w rows 16w .. 16w + 15 of the tile.
  const int warp_first_row = work.tile_first_row + warp * static_cast<int>(kStripRows);
  // The keys packed row `row` sees end below this limit (at most Nk; 0 or less for none).
  const auto key_limit = [&](int row) { return visible_key_limit(row % q_seq, q_seq, kv_seq, causal); };

  const int64_t kv_offset = work.kv_head * kv_seq * dim;
  const auto issue_kv_tile = [&](int tile) {
    unsigned char* slot = key_slot(tile % T::kStages);
    const int key_base = keys.begin + tile * T::kKeys;
    const int valid_keys = min(T::kKeys, kv_seq - key_base);
    const int64_t offset = kv_offset + static_cast<int64_t>(key_base) * dim;
    copy_tile<true, SwizzledPanels<T::kKeys>, kDim, T::kKeys, T::kThreads>(slot, k + offset, valid_keys, dim);
    copy_tile<true, SwizzledPanels<T::kKeys>, kDim, T::kKeys, T::kThreads>(slot + T::kKvTileBytes, v + offset,
                                                                           valid_keys, dim);
  };

  // The prologue: Q joins the first group of copies, then all but two slots fill (the P·V of a
  // tile is issued after the next tile has landed, so its slot is refilled one tile later).
  copy_tile<true, SwizzledPanels<T::kRows>, kDim, T::kRows, T::kThreads>(
      query_tile, q + (work.head_first_row + work.tile_first_row) * dim, packed_rows - work.tile_first_row, dim);
#pragma unroll
  for (int tile = 0; tile < T::kStages - 2; ++tile) {
    if (tile < keys.tiles) issue_kv_tile(tile);
    commit_copies();
  }

  // The matrix descriptors (stage 09's README, "The matrix descriptor"): row r of a panel is 128
  // bytes at r·128, 8 rows (1024 bytes) one swizzle period, the stride byte offset. A 16-dim step
  // of Q or K (K-major) is 32 bytes along the row, and a new panel every four steps. V is read
  // MN-major: a 16-key step is 16 rows on, and the leading byte offset steps between its panels.
  const uint64_t query_descriptor = matrix_descriptor(shared_address(query_tile), 16, kSwizzleBytes);

  // O unnormalized in FP32 accumulators (kDim / 2 a thread), the running max m (log2 units) and this
  // thread's share of the sum l of rows `group` and `group + 8`, started as split_kv.cu starts them.
  float out[kDim / 2] = {};
  float row_max[2];
  float row_sum[2] = {};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_max[half] = key_limit(warp_first_row + group + 8 * half) <= keys.begin ? 0.0f : -INFINITY;
  }

  // Tile `tile` lands: each thread waits for its copies and fences them, ordinary (generic-proxy)
  // writes to shared memory that wgmma reads through the async proxy (stage 09's README,
  // "setmaxnreg and the fence.proxy.async rule"); then the barrier, past which every thread has waited for the P·V of
  // tile - 2, so its slot may take tile + kStages - 2.
  const auto tile_landed = [&]() {
    wait_copies<T::kStages - 3>();
    fence_shared_for_async_proxy();
    __syncthreads();
  };
  // The refill of that slot, issued once the tile's wgmma are: the address arithmetic of a tile's
  // copies is a few hundred instructions, and the one warp on each scheduler would otherwise run them
  // before the tensor cores get their work.
  const auto refill = [&](int tile) {
    if (tile + T::kStages - 2 < keys.tiles) issue_kv_tile(tile + T::kStages - 2);
    commit_copies();
  };
  // S = Q Kᵀ of tile `tile`: kDim / 16 wgmma of 64 rows × 64 keys × 16 dims, one group (the descriptor
  // walk of fa/kernel/wgmma_walk.cuh).
  float scores[T::kKeys / 2];
  const auto issue_scores = [&](int tile) {
    kernel::issue_scores<Element, kDim, T::kKeys, T::kRows * kPanelRowBytes, T::kKvPanelBytes>(
        scores, query_descriptor, matrix_descriptor(shared_address(key_slot(tile % T::kStages)), 16, kSwizzleBytes));
  };
  // O += P V of tile `tile`: P's fragments from registers, one wgmma per 16 keys, one group.
  unsigned probs[kKeySteps][4];
  const auto issue_values = [&](int tile) {
    kernel::issue_values<Element, kDim>(
        out, probs,
        mn_major_descriptor<T::kKvPanelBytes>(shared_address(key_slot(tile % T::kStages) + T::kKvTileBytes)));
  };
  // The online softmax on the accumulators (split_kv_device.cuh): scores[4j + e] is key
  // key_base + 8j + 2·quad + e % 2 of the top row (e < 2) or the bottom row (e >= 2). Then P packed
  // as wgmma's register A: score tiles 2j and 2j + 1 are keys 16j .. 16j + 15.
  const auto softmax = [&](int tile, float(&rescale)[2]) {
    const int key_base = keys.begin + tile * T::kKeys;
    if (key_base + T::kKeys > keys.unmasked) {
      mask_scores<kScoreTiles>(scores, key_base + 2 * quad, key_limit(warp_first_row + group),
                               key_limit(warp_first_row + group + 8));
    }
    online_softmax<kScoreTiles>(scores, row_max, row_sum, rescale, scale_log2);
  };

  // Stage 10's order within one warpgroup: S of a tile and P·V of the one before go to the tensor
  // cores together, then the refill's copies, then the softmax of the tile, written to run while
  // P·V still does; only then does the warpgroup wait for P·V, rescale O by the new max and pack P.
  // (ptxas 13.0 hoists that wait above the softmax's exponentials: the copies are what overlaps
  // the tensor cores. README, "On Hopper: the 64 rows are one wgmma".)
  if (keys.tiles > 0) {
    float rescale[2];
    tile_landed();
    issue_scores(0);
    refill(0);
    wgmma_wait<0>();
    fence_registers(scores);
    softmax(0, rescale);  // O is still zero: nothing to rescale
    kernel::pack_probabilities<Element>(scores, probs);
  }
#pragma unroll 1
  for (int tile = 1; tile < keys.tiles; ++tile) {
    float rescale[2];
    tile_landed();
    issue_scores(tile);
    issue_values(tile - 1);
    refill(tile);
    wgmma_wait<1>();  // S of this tile has landed; P·V of the last one may still run
    fence_registers(scores);
    softmax(tile, rescale);
    wgmma_wait<0>();  // P·V of the last tile is done: O is whole, and P is free
    fence_registers(out);
    fence_registers(probs);
    kernel::rescale_output<0>(out, rescale);
    kernel::pack_probabilities<Element>(scores, probs);
  }
  if (keys.tiles > 0) {
    issue_values(keys.tiles - 1);
    wgmma_wait<0>();
    fence_registers(out);
  }
  wait_copies<0>();  // no copy may still be writing shared memory when the block exits

  add_row_sums(row_sum);
  write_rows<Element, kDim>(out, row_max, row_sum, warp_first_row, group, quad, packed_rows, work.head_first_row, dim,
                            work.split, q_rows, o, lse, partial_out, partial_lse);
  launch_dependents();  // this block's rows are written: the merge kernel may launch
#else
  __trap();  // never launched: the host runs this kernel on sm_90 alone (block_kernel)
#endif
}

}  // namespace

template <typename Element, int kDim>
Status launch_wgmma_split(const ForwardArgs& args, const KeySplit& split, float* partial_out, float* partial_lse) {
  using T = WgmmaTiling<kDim>;
  return launch_split_kernel<Element>(&wgmma_split_kernel<Element, kDim>, T::kThreads, T::kSharedBytes, args, split,
                                      partial_out, partial_lse);
}

template Status launch_wgmma_split<__half, 64>(const ForwardArgs&, const KeySplit&, float*, float*);
template Status launch_wgmma_split<__half, 128>(const ForwardArgs&, const KeySplit&, float*, float*);
template Status launch_wgmma_split<__nv_bfloat16, 64>(const ForwardArgs&, const KeySplit&, float*, float*);
template Status launch_wgmma_split<__nv_bfloat16, 128>(const ForwardArgs&, const KeySplit&, float*, float*);

}  // namespace fa::stages::split_kv
