// The frame of a warp-specialized TMA forward kernel, around its schedule: the pieces a block
// computes, its producer loop, a consumer warpgroup's running state, its softmax step and its
// epilogue (taught in stage 09's README, "The block" and "Causal masking, partial tiles, head dims,
// general shapes"); the queue and the second Q tile of persistent blocks (stage 10's README,
// "Persistent blocks"), the merge of a piece split in parts by its key tiles (stage 10's README,
// "The last round"), and the consumers' turns of ping-pong (stage 10's README, "The schedule").
// Stages 09 and 10 compose these around their own schedules; stage 14 the piece, the starting state
// and the turns (its 8-bit tiles and descales take a producer and an epilogue of their own). The
// scalars that are a kernel's parameters (the problem's sizes, `causal`, the scale) are taken by
// reference, so each is read from the parameter space where it is used, as in the kernels that
// wrote these pieces out: the machine code the measured rows were taken with stays the same.
// sm_90a only (wgmma_walk.cuh).
#pragma once

#include <cmath>
#include <cstdint>

#include "fa/causal.hpp"
#include "fa/kernel/accumulator_softmax.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/launch_order.cuh"
#include "fa/kernel/tma_ring.cuh"
#include "fa/kernel/wgmma_epilogue.cuh"
#include "fa/kernel/wgmma_walk.cuh"

namespace fa::kernel {

// A piece of work: Br = kQueryRows query rows of one (batch, query head), heaviest first under the causal
// mask (launch_order.cuh), the K/V head of its group, and the K/V tiles it sees (stage 08): all of
// them, or with the causal mask those its last valid row sees; tiles past that are never loaded.
// Keys below `unmasked_keys` are visible to every row of the piece, so only tiles reaching past it
// need the mask. The producer and the consumers compute the same pieces and counts: every tile the
// producer loads is consumed. A piece's K/V tiles are first_tile .. tiles - 1: all from 0, or one part
// of them where a piece is split (stage 10's README, "The last round").
struct Piece {
  int query_head;
  int kv_head;
  int first_row;
  int unmasked_keys;
  int first_tile;
  int tiles;
};

template <int kQueryRows, int kKeys>
__device__ __forceinline__ Piece piece_at(int64_t index, const int& query_tiles, const int& heads_total,
                                          const int& q_heads, const int& kv_heads, const int& q_seq, const int& kv_seq,
                                          const bool& causal) {
  const BlockWork work = block_work(index, query_tiles, heads_total, causal);
  Piece piece;
  piece.query_head = static_cast<int>(work.query_head);
  piece.kv_head = static_cast<int>(kv_head_of(work.query_head, q_heads, kv_heads));
  piece.first_row = work.query_tile * kQueryRows;
  const int last_row = min(q_seq, piece.first_row + kQueryRows) - 1;
  const int key_end = causal ? static_cast<int>(causal_key_end(last_row, q_seq, kv_seq)) : kv_seq;
  piece.unmasked_keys = causal ? static_cast<int>(causal_key_end(piece.first_row, q_seq, kv_seq)) : kv_seq;
  piece.first_tile = 0;
  piece.tiles = (key_end + kKeys - 1) / kKeys;
  return piece;
}

// A consumer thread's running state at the start of a piece: O and its share of l at 0, the running
// max m at -inf, except for a row that sees no key at all (causal, Nq > Nk): it starts at m = 0
// (stage 08), so that its exponentials come out 0 rather than NaN. Rows `group` and `group + 8` of
// the warp whose first query row is `warp_first_row`.
template <int kDim>
__device__ __forceinline__ void start_rows(float (&out)[kDim / 2], float (&row_max)[2], float (&row_sum)[2],
                                           int warp_first_row, int group, const int& q_seq, const int& kv_seq,
                                           const bool& causal) {
#pragma unroll
  for (int i = 0; i < kDim / 2; ++i) out[i] = 0.0f;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp_first_row + group + 8 * half;
    row_max[half] = causal && causal_key_end(row, q_seq, kv_seq) == 0 ? 0.0f : -INFINITY;
    row_sum[half] = 0.0f;
  }
}

// The online softmax on S of the K/V tile whose first key is `key_base` (accumulator_softmax.cuh):
// the mask only where the tile reaches past the keys every row sees (the diagonal, the partial last
// tile: its zero-filled keys must weigh nothing, so -inf, never 0), the new running max, the factor
// O must be rescaled by, P = exp2(S - m) in place, and the running sums (the max lazy by kSlackLog2).
template <int kKeys, int kSlackLog2 = 0, typename KeyLimit>
__device__ __forceinline__ void softmax_step(float (&scores)[kKeys / 2], int key_base, int unmasked_keys, int quad,
                                             KeyLimit key_limit, float (&row_max)[2], float (&row_sum)[2],
                                             float (&rescale)[2], const float& scale_log2) {
  if (key_base + kKeys > unmasked_keys) mask_scores<kKeys / kMmaColumns>(scores, key_base, quad, key_limit);
  online_softmax<kKeys / kMmaColumns, kSlackLog2>(scores, row_max, row_sum, rescale, scale_log2);
}

// The producer thread of a block that loops over pieces: blockIdx.x, blockIdx.x + gridDim.x, ...
// (their count `pieces`, each from piece_at(index)), or, with a queue (`piece_counter`, zeroed by the
// launch), its first piece blockIdx.x and every later one the next that no block has taken yet:
// gridDim.x + the counter's old value. Under the causal mask the pieces come heaviest first, so a
// block that drew heavy pieces takes fewer of them.
// Q has kQueryBuffers tiles in `query_tiles`, used in turn: the block's piece n lands in tile
// b = n % kQueryBuffers on query_full[b] once the consumers have released that tile's last piece on
// query_free[b] (rows past Nq arrive as zeros); with two, the next piece's Q lands while this one's
// tiles are still computed. The piece's index goes to piece_slots[b] before query_full[b]
// completes (the arrival releases it to the consumers, whose wait acquires it; the slot is a word
// that threads signal through, so it is written and read only atomically); after the last
// piece, `pieces`, with an arrival of its own: there is no more work. Ring tile r, counted over
// all the block's pieces, goes to slot r % kStages (K tile, then V tile, of kPanels panels of
// kKvPanelBytes each); K and V have barriers of their own both ways: QKᵀ can start while V is still
// on its way, and the next K can land while the consumers still multiply by this slot's V. From the
// second pass on each waits for its release, the phase of parity (r / kStages - 1) % 2
// (tma_ring.cuh).
template <int kStages, int kKeys, int kPanels, int kQueryPanelBytes, int kKvPanelBytes, int kQueryBuffers,
          typename PieceAt>
__device__ __forceinline__ void produce_pieces(const PieceAt& piece_at, const int& pieces, unsigned char* query_tiles,
                                               unsigned char* ring, const CUtensorMap* query_map,
                                               const CUtensorMap* key_map, const CUtensorMap* value_map,
                                               uint64_t* query_full, uint64_t* query_free, uint64_t* key_full,
                                               uint64_t* value_full, uint64_t* key_free, uint64_t* value_free,
                                               int* piece_counter, int* piece_slots) {
  constexpr int kQueryTileBytes = kPanels * kQueryPanelBytes;
  constexpr int kKvTileBytes = kPanels * kKvPanelBytes;
  int ring_tile = 0;
  int round = 0;
  // Waits until Q tile `buffer` is free: from its second use on, the consumers' release of its last.
  const auto wait_query_free = [&](int buffer) {
    if (round >= kQueryBuffers) barrier_wait(&query_free[buffer], (round / kQueryBuffers - 1) & 1);
  };
  for (int64_t index = blockIdx.x; index < pieces; ++round) {
    const Piece piece = piece_at(index);
    const int buffer = round % kQueryBuffers;
    wait_query_free(buffer);
    atomicExch(&piece_slots[buffer], static_cast<int>(index));
    barrier_arrive_expect_bytes(&query_full[buffer], kQueryTileBytes);
    copy_tile_to_shared<kPanels, kQueryPanelBytes>(query_tiles + buffer * kQueryTileBytes, query_map,
                                                   &query_full[buffer], piece.first_row, piece.query_head);
    for (int tile = piece.first_tile; tile < piece.tiles; ++tile, ++ring_tile) {
      const int slot = ring_tile % kStages;
      const int pass = ring_tile / kStages;
      const int key_base = tile * kKeys;
      if (pass > 0) barrier_wait(&key_free[slot], (pass - 1) & 1);
      barrier_arrive_expect_bytes(&key_full[slot], kKvTileBytes);
      for (int panel = 0; panel < kPanels; ++panel) {
        copy_box_to_shared(shared_address(ring + 2 * slot * kKvTileBytes + panel * kKvPanelBytes), key_map,
                           shared_address(&key_full[slot]), panel * kPanelColumns, key_base, piece.kv_head);
      }
      if (pass > 0) barrier_wait(&value_free[slot], (pass - 1) & 1);
      barrier_arrive_expect_bytes(&value_full[slot], kKvTileBytes);
      for (int panel = 0; panel < kPanels; ++panel) {
        copy_box_to_shared(shared_address(ring + (2 * slot + 1) * kKvTileBytes + panel * kKvPanelBytes), value_map,
                           shared_address(&value_full[slot]), panel * kPanelColumns, key_base, piece.kv_head);
      }
    }
    // Taken once this piece's copies are issued: the atomic's round trip runs while the consumers
    // work through the tiles still in the ring.
    index = piece_counter == nullptr ? index + gridDim.x : gridDim.x + atomicAdd(piece_counter, 1);
  }
  if (piece_counter != nullptr) {
    const int buffer = round % kQueryBuffers;
    wait_query_free(buffer);
    atomicExch(&piece_slots[buffer], pieces);
    barrier_arrive(&query_full[buffer]);
  }
}

// Consumer: the block's next piece after piece `index`, the round-th it computed: the next in turn,
// or, given the queue, the index produce_pieces wrote beside the next Q (`pieces` when there is none).
template <int kQueryBuffers>
__device__ __forceinline__ int64_t next_piece(int64_t index, int round, const int* queue, uint64_t* query_full,
                                              int* piece_slots) {
  if (queue == nullptr) return index + gridDim.x;
  barrier_wait(&query_full[(round + 1) % kQueryBuffers], ((round + 1) / kQueryBuffers) & 1);
  return atomicAdd(&piece_slots[(round + 1) % kQueryBuffers], 0);
}

// Named barriers of a forward block (0 is __syncthreads): kEpilogueBarrier + c, consumer c's epilogue
// (write_piece_output); kTurnBarrier + c, its turn to issue its products (Turns).
constexpr int kEpilogueBarrier = 1;
constexpr int kTurnBarrier = 4;
constexpr int kMaxConsumers = 3;
static_assert(kEpilogueBarrier + kMaxConsumers <= kTurnBarrier && kTurnBarrier + kMaxConsumers <= 16,
              "named barriers are 1 .. 15");

// Ping-pong (stage 10's README, "The schedule"): the consumer warpgroups take turns to issue their
// products, so that one warpgroup's products run on the tensor cores while the others compute their
// softmax. Warpgroup c takes its turn at named barrier kTurnBarrier + c and passes it on by arriving
// at the next one's. open(): the last warpgroup hands the first turn to warpgroup 0 before anything
// starts; close(): warpgroup 0 takes the turn handed to it after the last piece, so that no arrival is
// left at a barrier when the block exits. Every piece has the same number of turns for all its
// warpgroups, so they stay in step. With kTakeTurns false each issues whenever it is ready.
template <int kConsumers, bool kTakeTurns = true>
struct Turns {
  static_assert(kConsumers <= kMaxConsumers, "a named barrier per consumer and turn");
  int consumer;

  __device__ __forceinline__ void take() const {
    if (kTakeTurns) sync_threads(kTurnBarrier + consumer, 2 * kWarpgroupThreads);
  }
  __device__ __forceinline__ void pass() const {
    if (kTakeTurns) arrive_threads(kTurnBarrier + (consumer + 1) % kConsumers, 2 * kWarpgroupThreads);
  }
  __device__ __forceinline__ void open() const {
    if (consumer == kConsumers - 1) pass();
  }
  __device__ __forceinline__ void close() const {
    if (consumer == 0) take();
  }
};

// The epilogue of a consumer warpgroup of a block that loops over pieces: O / l staged in its 64 rows of
// `out_tile` (stage_output_rows; named barrier kEpilogueBarrier + consumer), then stored by TMA or
// element by element. First the staging must be free: the last piece's TMA store has read it (thread 0
// issued that store) and every thread of the warpgroup is done with it. The staged rows were written by
// ordinary stores; TMA reads them (or, staged in the Q tile, overwrites them with the next Q)
// through the async proxy: each writing thread fences. O staged in the Q tile (kInQueryTile) frees
// the Q tile on `query_free` once the store has read it. The caller waits for the last piece's
// store to have read the staging before the block exits.
template <typename Element, int kDim, int kPanels, int kPanelBytes, bool kInQueryTile>
__device__ __forceinline__ void write_piece_output(const float (&out)[kDim / 2], const float (&row_max)[2],
                                                   const float (&row_sum)[2], unsigned char* out_tile, int consumer,
                                                   int thread, int warp, int lane, int group, int quad, int first_row,
                                                   const int& q_seq, const int& dim, float* lse, int query_head,
                                                   const CUtensorMap* out_map, Element* o,
                                                   const bool& store_by_copy_engine, uint64_t* query_free) {
  if (store_by_copy_engine && thread == 0) wait_stores_read();
  sync_threads(kEpilogueBarrier + consumer, kWarpgroupThreads);
  stage_output_rows<Element, kDim, kPanelBytes>(out, row_max, row_sum, out_tile, consumer * kMmaRows, warp, group, quad,
                                                first_row, q_seq, lse, query_head);
  fence_shared_for_async_proxy();
  if (store_by_copy_engine) {
    sync_threads(kEpilogueBarrier + consumer, kWarpgroupThreads);
    if (thread == 0 && first_row < q_seq) {
      store_staged_rows<kPanels, kPanelBytes>(out_map, out_tile, consumer * kMmaRows, first_row, query_head);
    }
  } else {
    sync_threads(kEpilogueBarrier + consumer, kWarpgroupThreads);
    copy_staged_rows<Element, kPanelBytes>(o, out_tile, consumer * kMmaRows, thread, first_row, q_seq, dim, query_head);
  }
  if (kInQueryTile) {
    if (store_by_copy_engine && thread == 0) wait_stores_read();
    sync_threads(kEpilogueBarrier + consumer, kWarpgroupThreads);
    release_to_producer(query_free, lane);
  }
}

// The parts of a split piece (taught in stage 10's README, "The last round"): a piece of a launch's
// last, partial round may be split by its key tiles into parts, a block each. Each consumer
// warpgroup of a part leaves its state in `states`, its (split piece, consumer)'s slots of the
// workspace: O unnormalized, the running max m and its share of l, kPartStateFloats a thread; float
// i of thread t of part p at (p · kPartStateFloats + i) · 128 + t, so that a warpgroup's stores and
// loads are coalesced. Then it counts itself on `arrivals` (zeroed by the launch). The last of the
// `parts` to arrive folds the others into its own state (each part's O and l scaled by
// 2^(m_part - m), m the largest of them, as stage 12 merges its splits) and returns true: it writes
// the rows. The others return false. Named barrier kEpilogueBarrier + consumer, as the epilogue's.
template <int kDim>
constexpr int kPartStateFloats = kDim / 2 + 4;

template <int kDim>
__device__ __forceinline__ bool merge_parts(float (&out)[kDim / 2], float (&row_max)[2], float (&row_sum)[2],
                                            float* states, int* arrivals, int parts, int part, int consumer,
                                            int thread) {
  constexpr int kMax = kDim / 2;
  constexpr int kSum = kDim / 2 + 2;
  // A part's floats for this thread, 128 apart: one address a part, each float at a constant offset.
  const auto state_of = [&](int of_part) {
    return states + static_cast<int64_t>(of_part) * kPartStateFloats<kDim> * kWarpgroupThreads + thread;
  };
  float* own = state_of(part);
#pragma unroll
  for (int i = 0; i < kDim / 2; ++i) own[i * kWarpgroupThreads] = out[i];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    own[(kMax + half) * kWarpgroupThreads] = row_max[half];
    own[(kSum + half) * kWarpgroupThreads] = row_sum[half];
  }
  // Thread 0 counts the warpgroup once all its states are stored (the barrier), fenced on both sides:
  // this part's state is visible to the whole GPU before its arrival, and the last part reads the
  // others' only after it has seen their arrivals (from L2: __ldcg).
  sync_threads(kEpilogueBarrier + consumer, kWarpgroupThreads);
  bool last = false;
  if (thread == 0) {
    __threadfence();
    last = atomicAdd(arrivals, 1) == parts - 1;
    __threadfence();
  }
  if (!any_threads(kEpilogueBarrier + consumer, kWarpgroupThreads, last)) return false;
  for (int other = 0; other < parts; ++other) {
    if (other == part) continue;
    const float* theirs_state = state_of(other);
    float mine[2];
    float theirs[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float their_max = __ldcg(theirs_state + (kMax + half) * kWarpgroupThreads);
      const float merged_max = fmaxf(row_max[half], their_max);
      // A row that saw no key in either part keeps m = -inf, its O and l zero (never inf - inf).
      const float shift = merged_max == -INFINITY ? 0.0f : merged_max;
      mine[half] = fast_exp2(row_max[half] - shift);
      theirs[half] = fast_exp2(their_max - shift);
      row_sum[half] =
          row_sum[half] * mine[half] + __ldcg(theirs_state + (kSum + half) * kWarpgroupThreads) * theirs[half];
      row_max[half] = merged_max;
    }
#pragma unroll
    for (int i = 0; i < kDim / 2; ++i) {
      out[i] = out[i] * mine[i % 4 / 2] + __ldcg(theirs_state + i * kWarpgroupThreads) * theirs[i % 4 / 2];
    }
  }
  return true;
}

}  // namespace fa::kernel
