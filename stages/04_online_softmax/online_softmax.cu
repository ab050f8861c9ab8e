// Stage 04: FlashAttention's online softmax, one pass over the keys.
//
// Stage 03 swept the keys three times because a softmax weight exp(s - max) / sum needs the row's
// max and sum before any output can be accumulated. FlashAttention needs neither in advance. Each
// query row carries, over the keys seen so far,
//   m  the largest score,
//   l  the sum of exp(s - m),
//   o  the sum of exp(s - m) · v   (unnormalized).
// When a new tile raises the max from m to m_new, what was accumulated so far is weighted by
// exp(s - m) where it should be exp(s - m_new): multiplying l and o by exp(m - m_new) corrects it
// exactly. After the last tile O = o / l. Q K^T and P V are each computed once: half the arithmetic
// of stage 03, and nothing N × N is ever stored.
//
// The work layout is stage 03's, unchanged: a block owns kBlockRows query rows of one head;
// kThreadsPerRow threads share a row, each holding kDimsPerThread of its head dims (d = slice,
// slice + kThreadsPerRow, ...) of q and of the output in registers; keys and values stream through
// shared memory kBlockKeys rows at a time.
//
// Causal masking (query i sees keys 0..i; the rule is written once, in common/include/fa/causal.hpp):
// a block stops at the last K/V tile its last row can see, so tiles wholly above the diagonal are
// never loaded; only the tiles that cross the diagonal are masked key by key; the blocks with the
// most tiles are launched first (common/include/fa/kernel/launch_order.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fa/causal.hpp"
#include "fa/cuda_check.hpp"
#include "fa/device_buffer.hpp"
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

// Where the per-tile state goes when it is recorded (the walkthrough); null pointers record nothing.
// m and l are [tile][row], o is [tile][row][dim], with rows numbered head · N + i.
struct TraceBuffers {
  float* m = nullptr;
  float* l = nullptr;
  float* o = nullptr;
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
// scores, bit for bit (each pairwise sum is commutative), and they all agree on m and l. The
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

// Which query tile of which head work item `work` is, as in stage 03 (kernel::work_item, in
// common/include/fa/kernel/launch_order.cuh): without masking the query tiles of one head, then
// the next, so that blocks resident together share a head's K and V in L2; with causal masking
// heaviest first (the last query tile of every head, then the one before, ...), so that the short
// blocks fill the SMs as the long ones finish.
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

// The state of one row after the tile numbered `tile`: m, l, and the output so far divided by l.
template <int kHeadDim>
__device__ void record_trace(const TraceBuffers& trace, const Attention& attention, int64_t tile, int64_t head,
                             int64_t query, int slice, float m, float l, const float (&o)[kDimsPerThread]) {
  const int64_t entry = tile * attention.heads_total * attention.seq + head * attention.seq + query;
  if (slice == 0) {
    trace.m[entry] = m;
    trace.l[entry] = l;
  }
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) {
    const int d = slice + i * kThreadsPerRow<kHeadDim>;
    if (d < attention.dim) trace.o[entry * attention.dim + d] = o[i] / l;
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
    online_softmax_attention(const Attention attention, const TraceBuffers trace) {
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

    float m = -INFINITY;           // the largest score so far
    float l = 0.0f;                // the sum of exp(s - m) so far
    float o[kDimsPerThread] = {};  // the sum of exp(s - m) · v so far, this thread's dims

    // Tiles at or past key_end hold no key any row of the block sees: never loaded. The trace
    // records the state after every tile, so it runs them all: wholly masked, they change nothing.
    const int64_t key_end = trace.m != nullptr ? attention.seq : block.key_end;
    for (int64_t first_key = 0; first_key < key_end; first_key += kBlockKeys) {
      load_tile<kBlockKeys, kHeadDim, kThreads>(k_tile, attention.k + head_offset, first_key, attention.seq,
                                                attention.dim);
      load_tile<kBlockKeys, kHeadDim, kThreads>(v_tile, attention.v + head_offset, first_key, attention.seq,
                                                attention.dim);
      __syncthreads();  // both tiles are complete

      float scores[kBlockKeys];
      visible_scores<kBlockKeys, kHeadDim>(q, k_tile, slice, kLanes, block, first_key, row_key_end, scores);

      // EXERCISE BEGIN: m_new = max(m, tile max); rescale l and o by exp(m - m_new); add exp(s - m_new) and its · v
      float tile_max = -INFINITY;
#pragma unroll
      for (int key = 0; key < kBlockKeys; ++key) tile_max = fmaxf(tile_max, scores[key]);
      // Every row sees key 0, so after the first tile m is finite; on that tile m = -inf and the
      // correction is exp(-inf) = 0: the empty history vanishes. A later tile can be all -inf for
      // a row (on the diagonal, keys all after the row): then m_new = m, the correction is 1 and
      // every p is 0. No exponent is ever positive.
      const float m_new = fmaxf(m, tile_max);
      const float correction = __expf(m - m_new);
      l *= correction;
#pragma unroll
      for (int i = 0; i < kDimsPerThread; ++i) o[i] *= correction;
#pragma unroll
      for (int key = 0; key < kBlockKeys; ++key) {
        const float p = __expf(scores[key] - m_new);
        l += p;
#pragma unroll
        for (int i = 0; i < kDimsPerThread; ++i)
          o[i] += p * v_tile[key * kHeadDim + slice + i * kThreadsPerRow<kHeadDim>];
      }
      m = m_new;
      // EXERCISE END

      if (trace.m != nullptr && query < attention.seq) {
        record_trace<kHeadDim>(trace, attention, first_key / kBlockKeys, head, query, slice, m, l, o);
      }
      __syncthreads();  // every thread is done with the tiles before the next ones overwrite them
    }
    // O = o / l, once, at the end.
    const float inverse_l = 1.0f / l;
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) o[i] *= inverse_l;
    store_output_slice<kHeadDim>(attention, head, query, slice, o);
  }
}

template <int kBlockRows, int kBlockKeys, int kHeadDim>
Status launch(const Attention& attention, const TraceBuffers& trace, cudaStream_t stream) {
  constexpr int kThreads = kBlockRows * kThreadsPerRow<kHeadDim>;
  constexpr int kSharedBytes = 2 * kBlockKeys * kHeadDim * static_cast<int>(sizeof(float));
  const auto kernel = online_softmax_attention<kBlockRows, kBlockKeys, kHeadDim>;
  // Beyond 48 KB of dynamic shared memory a kernel must opt in (fa/launch.hpp). D = 256 needs
  // 64 KB: still within what every GPU from sm_75 on allows one block.
  FA_STATUS_TRY(opt_in_shared_memory(kernel, kSharedBytes, Carveout::driver_default));
  // Blocks past 2^31 - 1 would be covered by the grid-stride loop (the harness's size limits keep
  // the work items below that).
  const int64_t work_items = (attention.seq + kBlockRows - 1) / kBlockRows * attention.heads_total;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(work_items, INT_MAX));
  kernel<<<blocks, kThreads, kSharedBytes, stream>>>(attention, trace);
  FA_LAUNCH_TRY();
  return Status();
}

Attention make_attention(const Problem& problem, const void* q, const void* k, const void* v, void* o) {
  const int64_t seq = problem.q_seq;  // this stage takes Nq = Nk only (its descriptor says so)
  return Attention{static_cast<const float*>(q),  static_cast<const float*>(k), static_cast<const float*>(v),
                   static_cast<float*>(o),        problem.q_heads_total(),      seq,
                   static_cast<int>(problem.dim), softmax_scale(problem),       problem.causal};
}

// The walkthrough's tiles: Br = Bc = kWalkthroughTile = 2, so every K/V tile leaves a state to compare.
constexpr int kTraceTile = 2;

// The compiled head dims are 32, 64, 128 and 256: a smaller D runs in the next one up with its
// extra dims zero, which changes no dot product. The timed tiles depend on the head dim; the
// trace's do not.
template <bool kTraced>
Status launch_bucket(const Attention& attention, const TraceBuffers& trace, cudaStream_t stream) {
  return dispatch_head_dim<32, 64, 128, 256>(attention.dim, [&](auto bucket) {
    constexpr int kHeadDim = decltype(bucket)::value;
    constexpr int kBlockRows = kTraced ? kTraceTile : kBlockRowsFor<kHeadDim>;
    constexpr int kBlockKeys = kTraced ? kTraceTile : kKeysPerTile;
    return launch<kBlockRows, kBlockKeys, kHeadDim>(attention, trace, stream);
  });
}

// The runner has checked the problem against the descriptor (sizes, head dim, features) before
// this runs.
Status forward(const ForwardArgs& args) {
  const Attention attention = make_attention(args.problem, args.q, args.k, args.v, args.o);
  return launch_bucket<false>(attention, TraceBuffers{}, args.stream);
}

// Runs the Br = Bc = 2 kernel on host inputs and returns its state after every K/V tile. The trace
// is its own entry point (the walkthrough and the tests call it, not the runner's forward pass),
// so it checks what it is given.
Status trace(const Problem& problem, const float* q, const float* k, const float* v, int64_t tile, TileTrace& out) {
  if (tile != kTraceTile) return Status::unsupported("the stage 04 trace runs with tiles of 2 rows only");
  if (const std::string why = validate_problem(problem, kMaxDim); !why.empty()) return Status::unsupported(why);
  if (!problem.is_square()) return Status::unsupported("the stage 04 trace takes square problems only");
  const int64_t tiles = (problem.kv_seq + tile - 1) / tile;
  const int64_t states = tiles * problem.q_rows();
  const std::size_t tensor_bytes = static_cast<std::size_t>(problem.q_elements()) * sizeof(float);
  try {
    DeviceBuffer q_device(tensor_bytes), k_device(tensor_bytes), v_device(tensor_bytes), o_device(tensor_bytes);
    q_device.upload(q, tensor_bytes);
    k_device.upload(k, tensor_bytes);
    v_device.upload(v, tensor_bytes);
    DeviceBuffer m_trace(static_cast<std::size_t>(states) * sizeof(float));
    DeviceBuffer l_trace(static_cast<std::size_t>(states) * sizeof(float));
    DeviceBuffer o_trace(static_cast<std::size_t>(states * problem.dim) * sizeof(float));

    const Attention attention = make_attention(problem, q_device.get(), k_device.get(), v_device.get(), o_device.get());
    FA_STATUS_TRY(launch_bucket<true>(
        attention, TraceBuffers{m_trace.as<float>(), l_trace.as<float>(), o_trace.as<float>()}, nullptr));
    FA_CUDA_TRY(cudaDeviceSynchronize());

    const std::vector<float> m = m_trace.to_vector<float>();
    const std::vector<float> l = l_trace.to_vector<float>();
    const std::vector<float> o_over_l = o_trace.to_vector<float>();
    out.tile = tile;
    out.tiles = tiles;
    out.rows = problem.q_rows();
    out.dim = problem.dim;
    out.m.assign(m.begin(), m.end());
    out.l.assign(l.begin(), l.end());
    out.o.assign(o_over_l.begin(), o_over_l.end());
  } catch (const CudaError& error) {
    return Status::cuda(error.code());
  }
  return Status();
}

}  // namespace

StageDescriptor online_softmax() {
  StageDescriptor stage;
  stage.id = "04_online_softmax";
  stage.title = "FlashAttention: running max and sum rescale the output, one pass over K/V (FP32)";
  stage.backend = Backend::cuda;
  stage.precision = Precision::fp32;
  stage.forward = &forward;
  stage.workspace_bytes = nullptr;
  stage.max_dim = kMaxDim;
  stage.architecture = {75, false};
  stage.features.causal = true;  // and nothing else: square problems (Hq = Hkv, Nq = Nk), no LSE
  stage.trace = &trace;
  stage.kv_passes = 1.0;  // in K+V reads per query tile: one pass over K and V
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace fa::stages
