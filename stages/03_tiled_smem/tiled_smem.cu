// Stage 03: one fused kernel with shared-memory tiles; the softmax by recomputation.
//
// Stage 02 wrote the N × N scores to global memory and read them back twice. Here nothing N × N
// exists: a block keeps its query rows' q in registers and streams the head's keys and values
// through shared memory, a tile at a time, so every K and V element loaded from global memory is
// reused by all the block's rows. The price is the softmax. A weight exp(s - max) / sum needs the
// row's max and sum over all N keys before any output can be accumulated, and only a tile of
// scores exists at a time, so the kernel sweeps the keys three times, recomputing the scores each
// time:
//   1. the row max;
//   2. the row sum of exp(s - max);
//   3. the output, sum over keys of exp(s - max) / sum · v.
// Q K^T is computed three times and P V once: twice the arithmetic of two matrix products.
// Stage 04 needs one sweep.
//
// The work layout: a block owns kBlockRows query rows of one head; kThreadsPerRow threads share
// a row, each holding kDimsPerThread of its head dims (d = slice, slice + kThreadsPerRow, ...) of
// q and of the output in registers; keys and values stream through shared memory kBlockKeys rows
// at a time.
//
// Causal masking (query i sees keys 0..i; the rule is written once, in common/include/fa/causal.hpp):
// every sweep stops at the last K/V tile the block's last row can see, so tiles wholly above the
// diagonal are never loaded; only the tiles that cross the diagonal are masked key by key; the
// blocks with the most tiles are launched first (common/include/fa/kernel/launch_order.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "fa/causal.hpp"
#include "fa/cuda_check.hpp"
#include "fa/kernel/launch_order.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"

namespace fa::stages {
namespace {

constexpr int64_t kMaxDim = 256;
constexpr int kKeysPerTile = 32;       // Bc: keys (and values) per shared-memory tile
constexpr int kDimsPerThread = 16;     // head dims of q and of the output each thread keeps in registers
constexpr int kThreadsPerBlock = 256;  // for the timed runs, whatever the head dim

template <int kHeadDim>
constexpr int kThreadsPerRow = kHeadDim / kDimsPerThread;

// Query rows per block in the timed runs: more rows when each row needs fewer threads.
template <int kHeadDim>
constexpr int kBlockRowsFor = kThreadsPerBlock / kThreadsPerRow<kHeadDim>;

// One problem as every thread sees it. Q, K, V and O are (B·H, N, D) with D fastest.
struct Attention {
  const float* q;
  const float* k;
  const float* v;
  float* o;
  int64_t heads_total;
  int64_t seq;
  int dim;
  float scale;
  bool causal;  // query i sees keys 0..i only
};

// This thread's share of its query row, pre-multiplied by the softmax scale (once per element, not
// once per score). Zero past the real D, and for rows past the sequence end: those threads still
// help load tiles and keep the shuffles below complete, but store nothing.
template <int kHeadDim>
__device__ void load_query_slice(const Attention& attention, int64_t head, int64_t query, int slice,
                                 float (&q)[kDimsPerThread]) {
  const bool has_query = query < attention.seq;
  const int64_t row_start = (head * attention.seq + query) * attention.dim;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) {
    const int d = slice + i * kThreadsPerRow<kHeadDim>;
    q[i] = has_query && d < attention.dim ? attention.q[row_start + d] * attention.scale : 0.0f;
  }
}

// Copies rows [first_key, first_key + kBlockKeys) of one head's K or V into a shared tile
// [kBlockKeys][kHeadDim]; consecutive threads copy consecutive floats, so the reads are coalesced.
// Rows past the sequence end and dims past the real D are zero: their scores are masked to -inf
// below, and a zero value row keeps a masked key's weight of 0 at 0 (0 · NaN from stale shared
// memory would not be).
template <int kBlockKeys, int kHeadDim, int kThreads>
__device__ void load_tile(float* tile, const float* head_rows, int64_t first_key, int64_t seq, int dim) {
  const float* tile_rows = head_rows + first_key * dim;
  const int64_t remaining = seq - first_key;
  const int keys = remaining < kBlockKeys ? static_cast<int>(remaining) : kBlockKeys;
  for (int index = threadIdx.x; index < kBlockKeys * kHeadDim; index += kThreads) {
    const int key = index / kHeadDim;
    const int d = index % kHeadDim;
    tile[index] = key < keys && d < dim ? tile_rows[key * dim + d] : 0.0f;
  }
}

// This row's scores against every key of the tile. Each of the row's threads dots its own dims;
// a butterfly of shuffles then sums the partial dots, so every thread of the row ends with the same
// scores, bit for bit (each pairwise sum is commutative), and they all agree on max and sum. The
// threads of a row read neighbouring floats of a key (their dims interleave), so the reads hit
// different banks, and all rows read the same key at once: a broadcast.
template <int kBlockKeys, int kHeadDim>
__device__ void tile_scores(const float (&q)[kDimsPerThread], const float* k_tile, int slice, unsigned lanes,
                            float (&scores)[kBlockKeys]) {
#pragma unroll
  for (int key = 0; key < kBlockKeys; ++key) {
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i)
      dot += q[i] * k_tile[key * kHeadDim + slice + i * kThreadsPerRow<kHeadDim>];
#pragma unroll
    for (int offset = kThreadsPerRow<kHeadDim> / 2; offset > 0; offset /= 2) {
      dot += __shfl_xor_sync(lanes, dot, offset);
    }
    scores[key] = dot;
  }
}

// The query tile of one head that a work item covers, and the keys its rows may see.
struct BlockRows {
  int64_t head;
  int64_t first_query;
  int64_t key_end;       // no row of the block sees a key at or past it: later tiles are skipped
  int64_t unmasked_end;  // every row sees every key before it: tiles ending there need no mask
};

// Which query tile of which head work item `work` is (kernel::work_item, in
// common/include/fa/kernel/launch_order.cuh). Without masking every query tile costs the same, and
// work items run through the query tiles of one head, then the next: blocks resident together read
// the same head's K and V, shared in L2. With causal masking query tile t needs the keys up to its
// last row only, so its cost grows with t, and the items go heaviest first: the last query tile of
// every head, then the one before, and so on. Blocks start roughly in the order of blockIdx.x, so
// the long blocks start at once and the short ones fill the SMs as the long ones finish
// (longest-processing-time-first scheduling): no long block, started last, keeps the kernel
// running on a few SMs.
template <int kBlockRows>
__device__ BlockRows block_rows(const Attention& attention, int64_t query_tiles, int64_t work) {
  const kernel::WorkItem item = kernel::work_item(work, query_tiles, attention.heads_total, attention.causal);
  BlockRows block;
  block.head = item.query_head;
  block.first_query = item.query_tile * kBlockRows;
  // Row i sees keys 0..i (causal.hpp): the block's last row first_query + kBlockRows - 1 sees the
  // most, its first row the fewest. Without the mask every row sees all N.
  block.key_end = visible_key_end(block.first_query + kBlockRows - 1, attention.seq, attention.seq, attention.causal);
  block.unmasked_end = visible_key_end(block.first_query, attention.seq, attention.seq, attention.causal);
  return block;
}

// The tile's scores for a row that sees the keys before row_key_end: the others (past the sequence
// end, and with causal masking after the row's own position) score -inf. They never raise the max,
// and their weight is exp(-inf) = 0. Only a tile that crosses the diagonal or the sequence end
// needs the key-by-key test; for the others it is one comparison per tile, the same for the whole
// block.
template <int kBlockKeys, int kHeadDim>
__device__ void visible_scores(const float (&q)[kDimsPerThread], const float* k_tile, int slice, unsigned lanes,
                               const BlockRows& block, int64_t first_key, int64_t row_key_end,
                               float (&scores)[kBlockKeys]) {
  tile_scores<kBlockKeys, kHeadDim>(q, k_tile, slice, lanes, scores);
  if (first_key + kBlockKeys <= block.unmasked_end) return;
#pragma unroll
  for (int key = 0; key < kBlockKeys; ++key) {
    if (first_key + key >= row_key_end) scores[key] = -INFINITY;
  }
}

template <int kHeadDim>
__device__ void store_output_slice(const Attention& attention, int64_t head, int64_t query, int slice,
                                   const float (&o)[kDimsPerThread]) {
  if (query >= attention.seq) return;
  float* output_row = attention.o + (head * attention.seq + query) * attention.dim;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) {
    const int d = slice + i * kThreadsPerRow<kHeadDim>;
    if (d < attention.dim) output_row[d] = o[i];
  }
}

// One work item per query tile of one head, numbered as block_rows says; a grid-stride loop over
// them, so any B·H·N fits in the grid.
template <int kBlockRows, int kBlockKeys, int kHeadDim>
__global__ void __launch_bounds__(kBlockRows* kThreadsPerRow<kHeadDim>)
    three_pass_attention(const Attention attention) {
  constexpr int kThreads = kBlockRows * kThreadsPerRow<kHeadDim>;
  static_assert(kThreads % 32 == 0 || kThreads < 32, "a row's threads must share a warp");
  // The lanes that take part in shuffles: the whole warp, or the whole block when it is smaller.
  constexpr unsigned kLanes = kThreads >= 32 ? 0xffffffffu : (1u << kThreads) - 1u;

  extern __shared__ float shared[];
  float* k_tile = shared;                          // [kBlockKeys][kHeadDim]
  float* v_tile = shared + kBlockKeys * kHeadDim;  // [kBlockKeys][kHeadDim]

  const int slice = threadIdx.x % kThreadsPerRow<kHeadDim>;
  const int64_t query_tiles = (attention.seq + kBlockRows - 1) / kBlockRows;
  const int64_t work_items = query_tiles * attention.heads_total;

  for (int64_t work = blockIdx.x; work < work_items; work += gridDim.x) {
    const BlockRows block = block_rows<kBlockRows>(attention, query_tiles, work);
    const int64_t head = block.head;
    const int64_t query = block.first_query + threadIdx.x / kThreadsPerRow<kHeadDim>;
    const int64_t head_offset = head * attention.seq * attention.dim;
    float q[kDimsPerThread];
    load_query_slice<kHeadDim>(attention, head, query, slice, q);
    // This row sees the keys before row_key_end (rows past N get N: they store nothing).
    const int64_t row_key_end = visible_key_end(query, attention.seq, attention.seq, attention.causal);

    float o[kDimsPerThread] = {};  // the output, this thread's dims

    // EXERCISE BEGIN: three sweeps over the key tiles: the row max; the sum of exp(s - max); exp(s - max) / sum · v
    // Sweep 1: the row max, so that no exponential below can overflow. The sweeps stop at
    // block.key_end; every row sees key 0, so its max is finite, and the keys it does not see
    // score -inf: they weigh exp(-inf) = 0 below.
    float row_max = -INFINITY;
    for (int64_t first_key = 0; first_key < block.key_end; first_key += kBlockKeys) {
      load_tile<kBlockKeys, kHeadDim, kThreads>(k_tile, attention.k + head_offset, first_key, attention.seq,
                                                attention.dim);
      __syncthreads();  // the tile is complete

      float scores[kBlockKeys];
      visible_scores<kBlockKeys, kHeadDim>(q, k_tile, slice, kLanes, block, first_key, row_key_end, scores);
#pragma unroll
      for (int key = 0; key < kBlockKeys; ++key) row_max = fmaxf(row_max, scores[key]);
      __syncthreads();  // every thread is done with the tile before the next one overwrites it
    }

    // Sweep 2: the softmax denominator. The scores of sweep 1 are gone: compute them again.
    float row_sum = 0.0f;
    for (int64_t first_key = 0; first_key < block.key_end; first_key += kBlockKeys) {
      load_tile<kBlockKeys, kHeadDim, kThreads>(k_tile, attention.k + head_offset, first_key, attention.seq,
                                                attention.dim);
      __syncthreads();

      float scores[kBlockKeys];
      visible_scores<kBlockKeys, kHeadDim>(q, k_tile, slice, kLanes, block, first_key, row_key_end, scores);
#pragma unroll
      for (int key = 0; key < kBlockKeys; ++key) row_sum += __expf(scores[key] - row_max);
      __syncthreads();
    }

    // Sweep 3: the scores a third time; now each weight is final, and the values can be added up.
    const float inverse_sum = 1.0f / row_sum;
    for (int64_t first_key = 0; first_key < block.key_end; first_key += kBlockKeys) {
      load_tile<kBlockKeys, kHeadDim, kThreads>(k_tile, attention.k + head_offset, first_key, attention.seq,
                                                attention.dim);
      load_tile<kBlockKeys, kHeadDim, kThreads>(v_tile, attention.v + head_offset, first_key, attention.seq,
                                                attention.dim);
      __syncthreads();

      float scores[kBlockKeys];
      visible_scores<kBlockKeys, kHeadDim>(q, k_tile, slice, kLanes, block, first_key, row_key_end, scores);
#pragma unroll
      for (int key = 0; key < kBlockKeys; ++key) {
        const float p = __expf(scores[key] - row_max) * inverse_sum;
#pragma unroll
        for (int i = 0; i < kDimsPerThread; ++i)
          o[i] += p * v_tile[key * kHeadDim + slice + i * kThreadsPerRow<kHeadDim>];
      }
      __syncthreads();
    }
    // EXERCISE END

    store_output_slice<kHeadDim>(attention, head, query, slice, o);
  }
}

template <int kBlockRows, int kBlockKeys, int kHeadDim>
Status launch(const Attention& attention, cudaStream_t stream) {
  constexpr int kThreads = kBlockRows * kThreadsPerRow<kHeadDim>;
  constexpr int kSharedBytes = 2 * kBlockKeys * kHeadDim * static_cast<int>(sizeof(float));
  const auto kernel = three_pass_attention<kBlockRows, kBlockKeys, kHeadDim>;
  // Beyond 48 KB of dynamic shared memory a kernel must opt in (fa/launch.hpp). D = 256 needs
  // 64 KB: still within what every GPU from sm_75 on allows one block.
  FA_STATUS_TRY(opt_in_shared_memory(kernel, kSharedBytes, Carveout::driver_default));
  // Blocks past 2^31 - 1 would be covered by the grid-stride loop (the harness's size limits keep
  // the work items below that).
  const int64_t work_items = (attention.seq + kBlockRows - 1) / kBlockRows * attention.heads_total;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(work_items, INT_MAX));
  kernel<<<blocks, kThreads, kSharedBytes, stream>>>(attention);
  FA_LAUNCH_TRY();
  return Status();
}

Attention make_attention(const ForwardArgs& args) {
  const Problem& problem = args.problem;
  const int64_t seq = problem.q_seq;  // this stage takes Nq = Nk only (its descriptor says so)
  return Attention{static_cast<const float*>(args.q),
                   static_cast<const float*>(args.k),
                   static_cast<const float*>(args.v),
                   static_cast<float*>(args.o),
                   problem.q_heads_total(),
                   seq,
                   static_cast<int>(problem.dim),
                   softmax_scale(problem),
                   problem.causal};
}

// The runner has checked the problem against the descriptor (sizes, head dim, features) before
// this runs. The compiled head dims are 32, 64, 128 and 256: a smaller D runs in the next one up
// with its extra dims zero, which changes no dot product.
Status forward(const ForwardArgs& args) {
  const Attention attention = make_attention(args);
  return dispatch_head_dim<32, 64, 128, 256>(args.problem.dim, [&](auto bucket) {
    constexpr int kHeadDim = decltype(bucket)::value;
    return launch<kBlockRowsFor<kHeadDim>, kKeysPerTile, kHeadDim>(attention, args.stream);
  });
}

}  // namespace

StageDescriptor tiled_smem() {
  StageDescriptor stage;
  stage.id = "03_tiled_smem";
  stage.title = "One fused kernel: K/V tiles in shared memory, softmax by recomputation (three sweeps over K)";
  stage.backend = Backend::cuda;
  stage.precision = Precision::fp32;
  stage.forward = &forward;
  stage.workspace_bytes = nullptr;
  stage.max_dim = kMaxDim;
  stage.architecture = {75, false};
  stage.features.causal = true;  // and nothing else: square problems (Hq = Hkv, Nq = Nk), no LSE
  stage.trace = nullptr;
  // In K+V reads per query tile: the three sweeps read K three times and V once, 4 tile reads,
  // so 2 (stages that read K and V once each have 1).
  stage.kv_passes = 2.0;
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace fa::stages
