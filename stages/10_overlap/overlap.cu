// Stage 10: FlashAttention-3's schedule. The data movement is stage 09's (TMA copies into a ring of
// K/V slots, one producer warp, consumer warpgroups that run both products as wgmma, a loop over
// pieces); what changes is when each consumer warpgroup issues its products. In stage 09 a
// warpgroup's tensor-core work runs out while it computes its softmax; two changes fill that gap:
//
//   - Overlap inside a warpgroup: S of the next tile is issued together with O += P·V of the
//     current one, and the warpgroup waits for S alone (wgmma.wait_group 1) before it computes that
//     tile's softmax, while P·V is still on the tensor cores (from D = 128: Tiling::kOverlap).
//   - Ping-pong between warpgroups: the consumer warpgroups take turns to issue their products
//     (named barriers), so that one warpgroup's products run while the other computes its softmax.
//
// Around the schedule, stage 09's loop over pieces runs in persistent blocks, one per SM, up to
// D = 128 (the next piece's Q lands while this one is computed), and the last round's pieces may be
// split by their key tiles (split_pieces.cuh; README, "Persistent blocks" and "The last round"). One
// head-dim bucket more than stage 09: D = 192, which stage 09 pads to 256.
//
// The general shapes of stage 08 carry over: causal masking aligned bottom-right (tiles past the
// diagonal skipped, masks only where a tile crosses it), grouped-query heads (a query head reads
// its group's K/V head: a TMA coordinate), Nq != Nk, any N >= 1, and the log-sum-exp. Head dims
// 1 .. 256 in the buckets of Tiling; a head dim that is not a multiple of 8 cannot be described to
// TMA (a row's byte stride must be a multiple of 16), so those inputs are first copied into a
// padded workspace (stage 09's README, "Causal masking, partial tiles, head dims, general shapes").
//
// The device helpers stage 09 teaches live in fa/kernel/: tma.cuh (tensor maps and bulk tensor
// copies), mbarrier.cuh (the barrier with a transaction count), wgmma.cuh (wgmma, its matrix
// descriptors, setmaxnreg), and the frame every Hopper stage composes: tma_ring.cuh (the ring),
// wgmma_walk.cuh (the descriptor walk), tma_forward.cuh (the producer loop, the softmax step, the
// epilogue); convert.cuh (stage 07), exp2.cuh (stage 06) and launch_order.cuh (stage 03) are reused.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "fa/causal.hpp"
#include "fa/cuda_check.hpp"
#include "fa/kernel/accumulator_softmax.cuh"
#include "fa/kernel/forward_layout.cuh"
#include "fa/kernel/launch_order.cuh"
#include "fa/kernel/tma_forward.cuh"
#include "fa/kernel/tma_ring.cuh"
#include "fa/kernel/tma_stage.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/kernel/wgmma_epilogue.cuh"
#include "fa/kernel/wgmma_walk.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"
#include "piece_order.cuh"

// wgmma and setmaxnreg exist only in the sm_90a target (the 'a' is for "architecture-specific":
// code built for it runs on compute capability 9.0 and nothing else). CMake builds this stage for
// sm_90a alone; the guard keeps any other device pass (a PTX check for another target, say) to a
// trap. The runner never launches the stage on another GPU (its descriptor says exactly sm_90a).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_SM90A_DEVICE_CODE 1
#else
#define FA_SM90A_DEVICE_CODE 0
#endif

namespace fa::stages {
namespace {

using kernel::kMmaColumns;
using kernel::kMmaDepth;
using kernel::kMmaRows;
using kernel::kPanelColumns;
using kernel::kPanelRowBytes;
using kernel::kSwizzleBytes;
using kernel::kWarpgroupThreads;
using kernel::kWarpSize;

// Everything that sizes the kernel of one head-dim bucket (64, 128, 192 or 256). Change a constant and
// the rest follows; the static_asserts say when a choice cannot work.
template <int kDim>
struct Tiling {
  // Whether a warpgroup overlaps its softmax with its own P·V: S, O, P and the next P are live at
  // once; at D = 64 three consumers without it keep the tensor cores busier (README, "What the compiler made of it").
  static constexpr bool kOverlap = kDim > 64;
  // Consumer warpgroups of 64 query rows each (Br = 64 per consumer) and one producer warpgroup, of
  // which one thread issues every copy. Keys per K/V tile (Bc) and tiles in the ring: at D = 128 two
  // consumers (Br = 128), 128-key tiles, two stages (160 KB of shared memory); at D = 64, where a
  // tile has half the FLOPs per score and the softmax weighs twice as much, three consumers
  // (Br = 192) and three stages; at D = 256 the O accumulators take 128 registers a thread,
  // so S gets 64 keys (32 registers), and two stages of 64-key tiles beside the 64 KB Q tile fill
  // 192 KB; at D = 192, O's 96 leave S 96 keys (48), the same 192 KB.
  static constexpr int kConsumers = kOverlap ? 2 : 3;
  static constexpr int kKeys = kDim <= 128 ? 128 : kDim <= 192 ? 96 : 64;
  static constexpr int kStages = kDim <= 64 ? 3 : 2;
  // setmaxnreg: the producer warpgroup gives back all but 24 registers a thread, the consumers take
  // the rest. At launch the block has 65536 / threads a thread (rounded down to a multiple of 8):
  // 168 with two consumers, 128 with three; the consumers then grow to 240 (O, S and P of D = 256
  // take ~190) or 160 (D = 64: ~130).
  static constexpr int kProducerRegisters = 24;
  // Ping-pong (false: each consumer issues whenever it is ready, as in stage 09: README's ablation).
  static constexpr bool kPingPong = true;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  // The lazy rescale (README, "The lazy rescale"): m moves only when a tile's max passes it by more than
  // 2^8 (P stays at or below 256); a warp whose rows all kept their max skips O's rescale. Not at D = 64.
  static constexpr int kSlackLog2 = kOverlap ? 8 : 0;

  static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
  static constexpr int kQueryRows = kConsumers * kMmaRows;  // Br
  // The shared memory (kernel/forward_layout.cuh): where they fit (D = 64 and 128), an O tile for O's
  // TMA store (the Q tile is free once the piece's last S has completed) and a second Q tile (the next
  // piece's Q lands meanwhile: README, "Persistent blocks"); at D = 192 and 256 stage 09's one Q tile.
  using Layout = kernel::ForwardLayout<kDim, kQueryRows, kKeys, kStages, true>;
  // The pieces of a launch's last, partial round (of persistent blocks at D = 64, of blocks one per
  // piece at D = 192 and 256) may be split by their key tiles into parts (README, "The last round").
  // At D = 128 a whole last round gained nothing.
  static constexpr bool kSplitLastRound = kOverlap ? !Layout::kOutTile : Layout::kOutTile;

  static constexpr int kRegistersAtLaunch = 65536 / kThreads / 8 * 8;
  static_assert(kDim % kPanelColumns == 0, "a tile is whole 64-column panels");
  static_assert(kKeys % kMmaDepth == 0 && kKeys <= 256, "a K/V tile is whole 16-key steps; a TMA box has <= 256 rows");
  static_assert(kStages >= 2, "a pipeline needs a tile in flight while another is computed");
  static_assert(kConsumers <= kernel::kMaxConsumers, "a named barrier per consumer (kernel/tma_forward.cuh)");
  static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <=
                    kThreads * kRegistersAtLaunch,
                "setmaxnreg can only move registers the block was launched with");
};

// A block computes pieces blockIdx.x, blockIdx.x + gridDim.x, ... (`pieces` in all): the launch
// starts one block per SM, or, under the causal mask, they take their pieces from a queue (`order`:
// piece_order.cuh; README, "Persistent blocks").
// One piece: Br = 64 · kConsumers query rows of one (batch, query head). Threads 0-127 are the
// producer warpgroup (thread 0 issues every copy, the rest have nothing to do), the next
// 128 · kConsumers threads the consumer warpgroups, 64 rows each. The tensor maps describe Q and O
// as (B·Hq) x Nq x D and K, V as (B·Hkv) x Nk x D (D padded to a multiple of 8 when it is not
// one); `o` and `dim` are for the element-by-element output path. `lse` (B, Hq, Nq) may be null.
template <typename Element, int kDim>
__global__ void __launch_bounds__(Tiling<kDim>::kThreads, 1)
    wgmma_attention_kernel(const __grid_constant__ CUtensorMap query_map, const __grid_constant__ CUtensorMap key_map,
                           const __grid_constant__ CUtensorMap value_map, const __grid_constant__ CUtensorMap out_map,
                           Element* __restrict__ o, float* __restrict__ lse, int q_seq, int kv_seq, int dim,
                           int query_tiles, int q_heads, int kv_heads, int heads_total, const overlap::PieceOrder order,
                           bool causal, bool store_by_copy_engine, float scale_log2) {
#if FA_SM90A_DEVICE_CODE
  using T = Tiling<kDim>;
  using Layout = typename T::Layout;
  using namespace kernel;
  constexpr int kKeySteps = T::kKeys / kMmaDepth;  // 16-key steps of P·V

  // Shared memory (kernel/forward_layout.cuh): the Q tiles, the O tile (the Q tile where there is
  // none), the ring, the barriers and the piece slots.
  extern __shared__ unsigned char shared_memory[];
  const ForwardShared<Layout> smem(shared_memory);
  // The queue only where the blocks are persistent (piece_order.cuh); elsewhere its code is not built.
  int* queue = Layout::kOutTile ? order.queue : nullptr;
  const int pieces = order.pieces;

  // The pieces (kernel/tma_forward.cuh), and the parts of the last round's (split_pieces.cuh).
  const overlap::SplitPieces<T::kSplitLastRound, T::kConsumers> split{order.split_from, order.parts};
  const auto whole_piece_at = [&](int64_t index) {
    return kernel::piece_at<T::kQueryRows, T::kKeys>(index, query_tiles, heads_total, q_heads, kv_heads, q_seq, kv_seq,
                                                     causal);
  };
  const auto piece_at = [&](int64_t index) { return split.at(index, whole_piece_at); };

  // One thread sets up the barriers. A "full" barrier expects one arrival (the producer's, which
  // also announces the bytes to come); "free" expects one arrival from each consumer warp.
  constexpr int kConsumerWarps = T::kConsumers * kWarpgroupThreads / kWarpSize;
  if (threadIdx.x == 0) {
    for (int buffer = 0; buffer < Layout::kQueryBuffers; ++buffer) {
      barrier_init(&smem.query_full[buffer], 1);
      barrier_init(&smem.query_free[buffer], kConsumerWarps);
    }
    for (int slot = 0; slot < T::kStages; ++slot) {
      barrier_init(&smem.key_full[slot], 1);
      barrier_init(&smem.value_full[slot], 1);
      barrier_init(&smem.key_free[slot], kConsumerWarps);
      barrier_init(&smem.value_free[slot], kConsumerWarps);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on the roles go their own ways

  const int warpgroup = uniform_warpgroup();  // kernel/wgmma.cuh: the descriptors stay uniform
  if (warpgroup == 0) {
    // ---- The producer ------------------------------------------------------------------------
    // It computes addresses and waits on barriers: 24 registers a thread are plenty. The registers
    // it gives back let the consumers grow (to 240 a thread; 160 with three consumers). It loads
    // each piece's Q, then its K/V tiles into the ring, each slot once the consumers have freed it
    // (kernel/tma_forward.cuh; stage 09's README, "The block").
    release_registers<T::kProducerRegisters>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&query_map);
      prefetch_tensor_map(&key_map);
      prefetch_tensor_map(&value_map);
      produce_pieces<T::kStages, T::kKeys, Layout::kPanels, Layout::kQueryPanelBytes, Layout::kKvPanelBytes,
                     Layout::kQueryBuffers>(piece_at, pieces, smem.query_buffers, smem.ring, &query_map, &key_map,
                                            &value_map, smem.query_full, smem.query_free, smem.key_full,
                                            smem.value_full, smem.key_free, smem.value_free, queue, smem.piece_slots);
    }
  } else {
    // ---- The consumers -----------------------------------------------------------------------
    claim_registers<T::kConsumerRegisters>();
    const int consumer = warpgroup - 1;  // which 64 rows of the piece
    const int thread = threadIdx.x % kWarpgroupThreads;
    const int warp = thread / kWarpSize;  // within the warpgroup: rows 16·warp .. 16·warp + 15
    const int lane = threadIdx.x % kWarpSize;
    // In every accumulator tile this thread holds rows `group` and `group + 8` of its warp's 16,
    // columns 2·quad and 2·quad + 1 (the layout of stage 08's mma.m16n8k16).
    const int group = lane / 4;
    const int quad = lane % 4;
    const int diagonal = 1 + kv_seq - q_seq;

    // The matrix descriptors (stage 09's README, "The matrix descriptor"). In a 128-byte-swizzled panel, row r
    // of a tile is 128 bytes at r·128, and 8 rows (1024 bytes) are one swizzle period: the stride
    // byte offset. A 16-dim step of a K-major operand (Q or K) is 32 bytes further along the row,
    // and a new panel every four steps. V is read MN-major (its rows are keys, contiguous along the
    // head dim, the N of P·V): a 16-key step is 16 rows further, and the leading byte offset is the
    // step from one 64-column panel to the next.
    const uint64_t query_descriptor =
        k_major_descriptor(shared_address(smem.query_buffers) + consumer * kMmaRows * kPanelRowBytes);

    // O for the warpgroup's 64 rows in FP32 accumulators (D/2 registers a thread), normalized only
    // at the end. Per thread and row (top: `group`, bottom: `group + 8`) the running max m in log2
    // units (m = max_j s_j · scale · log2 e) and this thread's share of the running sum l.
    float out[kDim / 2];
    float row_max[2];
    float row_sum[2];
    float scores[T::kKeys / 2];
    unsigned probs[kKeySteps][4];
    // The next P, packed with its two halves swapped while P·V still reads `probs`; after the wait a
    // byte permute puts it into `probs` (an instruction, so ptxas cannot give both the same registers).
    unsigned next_probs[kKeySteps][4];

    // What one tile takes. Ring tile r (the block's r-th K/V tile, over all its pieces) sits in slot
    // r % kStages.
    // S = Q·Kᵀ of ring tile r: kDim / 16 wgmma, both operands in shared memory, the first
    // overwriting the accumulators.
    // Q from the tile of the block's piece n, n % kQueryBuffers.
    const auto issue_scores_of = [&](int r, int n) {
      wait_slot_full<T::kStages>(smem.key_full, r);
      issue_scores<Element, kDim, T::kKeys, Layout::kQueryPanelBytes, Layout::kKvPanelBytes>(
          scores, advance_descriptor(query_descriptor, n % Layout::kQueryBuffers * Layout::kQueryTileBytes),
          k_major_descriptor(shared_address(smem.key_slot(r % T::kStages))));
    };
    // O += P·V of ring tile r, P in registers as the A operand, V through its matrix descriptor.
    const auto issue_values_of = [&](int r) {
      wait_slot_full<T::kStages>(smem.value_full, r);
      issue_values<Element, kDim>(
          out, probs, mn_major_descriptor<Layout::kKvPanelBytes>(shared_address(smem.value_slot(r % T::kStages))));
    };
    const auto release = [&](uint64_t* free_barrier) { release_to_producer(free_barrier, lane); };

    // Ping-pong (README, "The schedule"): the consumer warpgroups take turns to issue their products
    // (kernel/tma_forward.cuh).
    const kernel::Turns<T::kConsumers, T::kPingPong> turn{consumer};
    turn.open();

    int ring_tile = 0;  // the ring tile of the piece's first K/V tile
    int round = 0;
#pragma unroll 1
    for (int64_t index = blockIdx.x; index < pieces; ++round) {
      const Piece piece = piece_at(index);
      const int consumer_first_row = piece.first_row + consumer * kMmaRows;
      const int warp_first_row = consumer_first_row + warp * 16;
      // The keys row `group + 8·half` of this warp sees end below this limit (causal_key_end's rule
      // in 32 bits, without its clamp at 0, which changes no comparison with a key index).
      const auto key_limit = [&](int half) {
        return causal ? min(kv_seq, warp_first_row + group + 8 * half + diagonal) : kv_seq;
      };
      start_rows<kDim>(out, row_max, row_sum, warp_first_row, group, q_seq, kv_seq, causal);
      // The online softmax on the accumulators, as in stage 08, on S of the piece's tile `tile`:
      // scores[4j + e] is key 8j + 2·quad + e % 2 of the tile, of the top row (e < 2) or the bottom
      // row (e >= 2); the mask only where the tile reaches past the keys every row sees
      // (kernel/tma_forward.cuh).
      const auto softmax = [&](int tile, float(&rescale)[2]) {
        softmax_step<T::kKeys, T::kSlackLog2>(scores, (piece.first_tile + tile) * T::kKeys, piece.unmasked_keys, quad,
                                              key_limit, row_max, row_sum, rescale, scale_log2);
      };

      barrier_wait(&smem.query_full[round % Layout::kQueryBuffers], (round / Layout::kQueryBuffers) & 1);

      // The schedule (README, "The schedule"). Stage 09 waited for O += P·V of a tile
      // before it started the next tile's S = Q·Kᵀ. Here round t (issue_round) issues S of tile t,
      // rescales O by the factor of tile t - 1 (so that nothing reads O after the wait) and issues
      // P·V of tile t - 1; it waits for S alone (wait_group 1: P·V may still run) and computes tile
      // t's softmax, its P packed aside (next_probs) while P·V still reads `probs`. The wait for that
      // P·V and the new P's move into `probs` (complete_round) open the next loop body: ptxas 13.0
      // hoisted a wait for P·V that shared the softmax's basic block above the exponentials (README,
      // "What the compiler made of it"). A piece whose rows see no key takes no turn at all.
      const int tiles = piece.tiles - piece.first_tile;
      float rescale[2];
      // One turn: S of ring tile r, then O rescaled by the factor of the tile before and its P·V.
      const auto issue_products = [&](int r) {
        turn.take();
        issue_scores_of(r, round);
        rescale_output<T::kSlackLog2>(out, rescale);
        issue_values_of(r - 1);
        turn.pass();
      };
      const auto issue_round = [&](int tile) {
        issue_products(ring_tile + tile);
        // EXERCISE BEGIN: the softmax while P·V runs: wait for S alone, the softmax, the next P packed aside
        wgmma_wait<1>();  // S of this tile has landed; P·V of the last one may still run
        fence_registers(scores);
        softmax(tile, rescale);
#pragma unroll
        for (int j = 0; j < kKeySteps; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            next_probs[j][i] = pack_pair<Element>(scores[8 * j + 2 * i + 1], scores[8 * j + 2 * i]);
          }
        }
        // EXERCISE END
      };
      const auto complete_round = [&](int tile) {
        const int r = ring_tile + tile;
        wgmma_wait<0>();  // P·V of the last tile is done: O is whole, and P is free
        fence_registers(out);
        fence_registers(probs);
#pragma unroll
        for (int j = 0; j < kKeySteps; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i) probs[j][i] = __byte_perm(next_probs[j][i], 0, 0x1032);
        }
        release(&smem.key_free[r % T::kStages]);
        release(&smem.value_free[(r - 1) % T::kStages]);
      };
      if (tiles > 0) {
        turn.take();
        issue_scores_of(ring_tile, round);
        turn.pass();
        wgmma_wait<0>();
        fence_registers(scores);
        softmax(0, rescale);  // O is still zero: nothing to rescale
        pack_probabilities<Element>(scores, probs);
        release(&smem.key_free[ring_tile % T::kStages]);
      }
      // Without the overlap (D = 64): a round issues S of tile t and P·V of tile t - 1 as above, then
      // waits for both before the softmax of tile t, which writes P in place.
      const auto plain_round = [&](int tile) {
        const int r = ring_tile + tile;
        issue_products(r);
        wgmma_wait<0>();
        fence_registers(scores);
        fence_registers(out);
        fence_registers(probs);
        softmax(tile, rescale);
        pack_probabilities<Element>(scores, probs);
        release(&smem.key_free[r % T::kStages]);
        release(&smem.value_free[(r - 1) % T::kStages]);
      };
      if constexpr (T::kOverlap) {
        if (tiles > 1) {
          issue_round(1);
#pragma unroll 1
          for (int tile = 2; tile < tiles; ++tile) {
            complete_round(tile - 1);
            issue_round(tile);
          }
          complete_round(tiles - 1);
        }
      } else {
#pragma unroll 1
        for (int tile = 1; tile < tiles; ++tile) plain_round(tile);
      }
      // Every S = Q·Kᵀ of the piece has completed. With an O tile of its own the Q tile is free
      // now: the producer loads the next piece's Q while this one's last P·V and epilogue run.
      if (Layout::kOutTile) release(&smem.query_free[round % Layout::kQueryBuffers]);
      if (tiles > 0) {
        turn.take();
        rescale_output<T::kSlackLog2>(out, rescale);
        issue_values_of(ring_tile + tiles - 1);
        turn.pass();
        wgmma_wait<0>();
        fence_registers(out);
        release(&smem.value_free[(ring_tile + tiles - 1) % T::kStages]);
      }
      ring_tile += tiles;

      // ---- The epilogue ----------------------------------------------------------------------
      // The parts of a split piece merge (split_pieces.cuh); only the last to arrive writes the rows.
      const bool writes =
          split.merge(index, out, row_max, row_sum, order.part_states, order.part_arrivals, consumer, thread);
      const int first_row_to_write = writes ? consumer_first_row : q_seq;  // from q_seq: none
      // O / l staged in this warpgroup's own 64 rows of the O tile, or of the Q tile where there is
      // none (no longer read by anyone: its last wgmma has completed), then written out
      // (kernel/tma_forward.cuh).
      write_piece_output<Element, kDim, Layout::kPanels, Layout::kQueryPanelBytes, !Layout::kOutTile>(
          out, row_max, row_sum, smem.out_tile, consumer, thread, warp, lane, group, quad, first_row_to_write, q_seq,
          dim, lse, piece.query_head, &out_map, o, store_by_copy_engine, smem.query_free);
      index = next_piece<Layout::kQueryBuffers>(index, round, queue, smem.query_full, smem.piece_slots);
    }
    turn.close();
    // The block's shared memory must outlive the copy engine's reads of the last staged O.
    if (store_by_copy_engine && thread == 0) wait_stores_read();
  }
#else
  __trap();  // never launched: the runner refuses every GPU but sm_90 (the descriptor's architecture)
#endif
}

template <typename Element, int kDim>
Status launch(const ForwardArgs& args, const kernel::TmaInputs& inputs) {
  using T = Tiling<kDim>;
  const Problem& problem = args.problem;
  kernel::AttentionMaps maps;
  FA_STATUS_TRY(kernel::encode_attention_maps<Element>(args, inputs, T::kQueryRows, T::kKeys, &maps));
  const auto kernel = &wgmma_attention_kernel<Element, kDim>;
  FA_STATUS_TRY(opt_in_shared_memory(kernel, T::Layout::kBytes));
  const int64_t query_tiles = (problem.q_seq + T::kQueryRows - 1) / T::kQueryRows;
  const int64_t pieces = query_tiles * problem.q_heads_total();
  FA_STATUS_TRY(check_grid(pieces));
  overlap::PieceOrder order;
  int64_t blocks = 0;
  FA_STATUS_TRY((overlap::plan_pieces<Tiling, kDim>(problem, pieces, args.workspace, args.stream, &order, &blocks)));
  const float scale_log2 = softmax_scale(problem) * kernel::kLog2e;
  // Every count below fits an int: the runner has checked the problem against validate_problem's
  // limits (B·Hq <= 2^20, N <= 2^24) and the pieces against 2^31 - 1.
  kernel<<<static_cast<unsigned>(blocks), T::kThreads, T::Layout::kBytes, args.stream>>>(
      maps.query, maps.key, maps.value, maps.out, static_cast<Element*>(args.o), args.lse,
      static_cast<int>(problem.q_seq), static_cast<int>(problem.kv_seq), static_cast<int>(problem.dim),
      static_cast<int>(query_tiles), static_cast<int>(problem.q_heads), static_cast<int>(problem.kv_heads),
      static_cast<int>(problem.q_heads_total()), order, problem.causal, inputs.store_by_copy_engine, scale_log2);
  FA_LAUNCH_TRY();
  return Status();
}

// The runner has checked the problem (sizes, head dim, features) and the GPU (exactly sm_90)
// against the descriptor before this runs. Q, K and V are padded first where D is not a multiple of
// 8 (kernel/tma_stage.cuh).
template <typename Element>
Status forward(const ForwardArgs& args) {
  kernel::TmaInputs inputs;
  FA_STATUS_TRY(kernel::tma_inputs<Element>(args, "10_overlap", &inputs));
  return dispatch_head_dim<64, 128, 192, kernel::kTmaMaxDim>(
      args.problem.dim, [&](auto bucket) { return launch<Element, decltype(bucket)::value>(args, inputs); });
}

StageDescriptor describe(Precision precision, ForwardFn forward_function, const char* title) {
  return kernel::describe_tma_stage("10_overlap", precision, forward_function, title, FA_SOURCE_HASH,
                                    &overlap::workspace_bytes<Tiling>);
}

}  // namespace

StageDescriptor overlap_fp16() {
  return describe(Precision::fp16, &forward<__half>,
                  "stage 09 + ping-pong warpgroups and the softmax under P·V (FP16, sm_90a)");
}

StageDescriptor overlap_bf16() {
  return describe(Precision::bf16, &forward<__nv_bfloat16>,
                  "stage 09 + ping-pong warpgroups and the softmax under P·V (BF16, sm_90a)");
}

}  // namespace fa::stages
