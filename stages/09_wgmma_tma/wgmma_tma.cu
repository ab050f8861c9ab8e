// Stage 09: Hopper's way. Tiles arrive through the tensor memory accelerator (TMA), both matrix
// products run as wgmma on warpgroups, and the block is split by role: one producer warp issues
// the copies, two consumer warpgroups (three at D = 64) compute.
//
// Stage 08 ran the FlashAttention-2 algorithm on mma.sync: every warp loaded its operands from
// shared memory into registers with ldmatrix (its own copies of every K and V fragment), issued
// 16x8x16 products one at a time, and all 128 threads shared the work of copying tiles in with
// cp.async. On Hopper three things change, and this kernel uses all three:
//
//   - TMA: one thread describes a whole tile copy with one instruction (a tensor map built on
//     the host says where the tensor is and how the tile lands in shared memory: here the 128-byte
//     swizzle that the tensor cores read). The copy completes on an mbarrier, a shared-memory
//     barrier that counts the bytes still to arrive. Rows past N and columns past D come back as
//     zeros: the hardware does the bounds checks.
//   - wgmma: a warpgroup (4 warps, 128 threads) multiplies a 64 x 16 tile by a 16 x N tile in one
//     asynchronous instruction, reading B (and for S = Q·Kᵀ also A) straight from shared memory
//     through a 64-bit matrix descriptor. No ldmatrix, no per-warp copies of K and V in registers.
//     The FP32 accumulators come back in the mma.m16n8 layout of stage 08, so the online softmax
//     runs on them exactly as there, and P, rounded to 16-bit pairs, is the register A operand of
//     O += P·V: S and P never touch shared memory.
//   - Warp specialization: the producer needs almost no registers, the consumers all they can get;
//     setmaxnreg moves registers from one to the other at run time.
//
// The general shapes of stage 08 carry over: causal masking aligned bottom-right (tiles past the
// diagonal skipped, masks only where a tile crosses it), grouped-query heads (a query head reads
// its group's K/V head: a TMA coordinate), Nq != Nk, any N >= 1, and the log-sum-exp. Head dims
// 1 .. 256 in three buckets (64, 128, 256); a head dim that is not a multiple of 8 cannot be
// described to TMA (a row's byte stride must be a multiple of 16), so those inputs are first copied
// into a padded workspace (README, "Causal masking, partial tiles, head dims, general shapes").
//
// The device helpers this stage teaches live in fa/kernel/: tma.cuh (tensor maps and bulk tensor
// copies), mbarrier.cuh (the barrier with a transaction count) and wgmma.cuh (wgmma, its matrix
// descriptors, setmaxnreg); convert.cuh (stage 07), exp2.cuh (stage 06) and launch_order.cuh
// (stage 03) are reused.
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
#include "fa/kernel/convert.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/launch_order.cuh"
#include "fa/kernel/mbarrier.cuh"
#include "fa/kernel/tma.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/kernel/wgmma.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"

// wgmma and setmaxnreg exist only in the sm_90a target (the 'a' is for "architecture-specific":
// code built for it runs on compute capability 9.0 and nothing else). CMake builds this stage for
// sm_90a alone; the guard keeps any other device pass (a PTX check for another target, say) to a
// trap. The runner never launches the stage on another GPU (its descriptor says exactly sm_90a).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_STAGE09_DEVICE_CODE 1
#else
#define FA_STAGE09_DEVICE_CODE 0
#endif

namespace fa::stages {
namespace {

using kernel::kLn2;
using kernel::kWarpgroupThreads;
using kernel::kWarpSize;
using kernel::pack_pair;

constexpr int kMmaRows = 64;         // the M of every wgmma: the query rows of one consumer warpgroup
constexpr int kMmaDepth = 16;        // the K of a 16-bit wgmma: 16 dims for QKᵀ, 16 keys for PV
constexpr int kMmaColumns = 8;       // columns per accumulator tile (the mma.m16n8 layout of stage 08)
constexpr int kPanelColumns = 64;    // one 128-byte swizzled row: a TMA box's width
constexpr int kPanelRowBytes = 128;  // ... in bytes
constexpr int kSwizzleRows = 8;      // the 128-byte swizzle repeats every 8 rows
// 1024 bytes: the swizzle's period; every tile starts on such a boundary.
constexpr int kSwizzleBytes = kSwizzleRows * kPanelRowBytes;
constexpr int kAlignElements = 8;  // TMA: a row's byte stride is a multiple of 16
constexpr int kMaxDim = 256;
constexpr int kSharedBytesPerBlock = 227 * 1024;  // H100/H200: the opt-in limit of one block

// Everything that sizes the kernel of one head-dim bucket (64, 128 or 256). Change a constant and
// the rest follows; the static_asserts say when a choice cannot work.
template <int kDim>
struct Tiling {
  // Consumer warpgroups of 64 query rows each (Br = 64 per consumer) and one producer warpgroup, of
  // which one thread issues every copy. Keys per K/V tile (Bc) and tiles in the ring: at D = 128 two
  // consumers (Br = 128), 128-key tiles, two stages (160 KB of shared memory); at D = 64, where a
  // tile has half the FLOPs per score and the softmax weighs twice as much, three consumers
  // (Br = 192) and three stages (120 KB); at D = 256 the O accumulators take 128 registers a thread,
  // so S gets 64 keys (32 registers), and two stages of 64-key tiles beside the 64 KB Q tile fill
  // 192 KB.
  static constexpr int kConsumers = kDim <= 64 ? 3 : 2;
  static constexpr int kKeys = kDim <= 128 ? 128 : 64;
  static constexpr int kStages = kDim <= 64 ? 3 : 2;
  // setmaxnreg: the producer warpgroup gives back all but 24 registers a thread, the consumers take
  // the rest. At launch the block has 65536 / threads a thread (rounded down to a multiple of 8):
  // 168 with two consumers, 128 with three; the consumers then grow to 240 (O, S and P of D = 256
  // take ~190) or 160 (D = 64: ~130).
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;

  static constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
  static constexpr int kQueryRows = kConsumers * kMmaRows;  // Br
  static constexpr int kPanels = kDim / kPanelColumns;      // 64-column panels of a tile
  static constexpr int kQueryPanelBytes = kQueryRows * kPanelRowBytes;
  static constexpr int kKvPanelBytes = kKeys * kPanelRowBytes;
  static constexpr int kQueryTileBytes = kPanels * kQueryPanelBytes;
  static constexpr int kKvTileBytes = kPanels * kKvPanelBytes;
  // The barriers: Q has landed; per ring slot, K has landed, V has landed, the slot is free again.
  static constexpr int kBarriers = 1 + 3 * kStages;
  // Q tile, the ring (kStages x (K tile, V tile)), the barriers, and room to align the start to
  // 1024 bytes (the 128-byte swizzle's period; dynamic shared memory only promises 16).
  static constexpr int kSharedBytes = kSwizzleBytes + kQueryTileBytes + kStages * 2 * kKvTileBytes + kBarriers * 8;

  static constexpr int kRegistersAtLaunch = 65536 / kThreads / 8 * 8;
  static_assert(kDim % kPanelColumns == 0, "a tile is whole 64-column panels");
  static_assert(kKeys % kMmaDepth == 0 && kKeys <= 256, "a K/V tile is whole 16-key steps; a TMA box has <= 256 rows");
  static_assert(kStages >= 2, "a pipeline needs a tile in flight while another is computed");
  static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <=
                    kThreads * kRegistersAtLaunch,
                "setmaxnreg can only move registers the block was launched with");
  static_assert(kSharedBytes <= kSharedBytesPerBlock, "the tiles do not fit in one block's shared memory");
};

// Rows whose D is not a multiple of 8 cannot be described to TMA: copy them into rows of
// `padded_dim` (the next multiple of 8), zero-filled. Used only for such head dims.
template <typename Element>
__global__ void pad_rows_kernel(const Element* __restrict__ source, Element* __restrict__ destination, int64_t rows,
                                int dim, int padded_dim) {
  const int64_t total = rows * padded_dim;
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = index / padded_dim;
    const int column = static_cast<int>(index % padded_dim);
    destination[index] = column < dim ? source[row * dim + column] : kernel::to_element<Element>(0.0f);
  }
}

// One block: Br = 64 · kConsumers query rows of one (batch, query head). Threads 0-127 are the
// producer warpgroup (thread 0 issues every copy, the rest have nothing to do), the next
// 128 · kConsumers threads the consumer warpgroups, 64 rows each. The tensor maps describe Q and O
// as (B·Hq) x Nq x D and K, V as (B·Hkv) x Nk x D (D padded to a multiple of 8 when it is not
// one); `o` and `dim` are for the element-by-element output path. `lse` (B, Hq, Nq) may be null.
template <typename Element, int kDim>
__global__ void __launch_bounds__(Tiling<kDim>::kThreads, 1)
    wgmma_attention_kernel(const __grid_constant__ CUtensorMap query_map, const __grid_constant__ CUtensorMap key_map,
                           const __grid_constant__ CUtensorMap value_map, const __grid_constant__ CUtensorMap out_map,
                           Element* __restrict__ o, float* __restrict__ lse, int q_seq, int kv_seq, int dim,
                           int query_tiles, int q_heads, int kv_heads, int heads_total, bool causal,
                           bool store_by_copy_engine, float scale_log2) {
#if FA_STAGE09_DEVICE_CODE
  using T = Tiling<kDim>;
  using namespace kernel;
  constexpr int kDimSteps = kDim / kMmaDepth;                // 16-dim steps of QKᵀ
  constexpr int kKeySteps = T::kKeys / kMmaDepth;            // 16-key steps of P·V
  constexpr int kScoreTiles = T::kKeys / kMmaColumns;        // 8-key accumulator tiles of S
  constexpr int kOutTiles = kDim / kMmaColumns;              // 8-dim accumulator tiles of O
  constexpr int kStepsPerPanel = kPanelColumns / kMmaDepth;  // 4: a panel row is 4 steps of 32 bytes

  // Shared memory, aligned to the swizzle's 1024-byte period: Q (kPanels panels of Br rows x 128
  // bytes), then ring slot s = (K tile, V tile), each kPanels panels of Bc rows x 128 bytes, then
  // the barriers.
  extern __shared__ unsigned char shared_memory[];
  unsigned char* shared =
      shared_memory + ((kSwizzleBytes - shared_address(shared_memory) % kSwizzleBytes) % kSwizzleBytes);
  unsigned char* query_tile = shared;
  unsigned char* ring = shared + T::kQueryTileBytes;
  uint64_t* barriers = reinterpret_cast<uint64_t*>(ring + T::kStages * 2 * T::kKvTileBytes);
  uint64_t* query_full = barriers;
  uint64_t* key_full = barriers + 1;                    // [kStages]
  uint64_t* value_full = barriers + 1 + T::kStages;     // [kStages]
  uint64_t* slot_free = barriers + 1 + 2 * T::kStages;  // [kStages]
  const auto key_slot = [&](int slot) { return ring + 2 * slot * T::kKvTileBytes; };
  const auto value_slot = [&](int slot) { return ring + (2 * slot + 1) * T::kKvTileBytes; };

  // Which (query tile, query head) this block computes, heaviest first under the causal mask
  // (kernel/launch_order.cuh), and the K/V head of its group.
  const BlockWork work = block_work(blockIdx.x, query_tiles, heads_total, causal);
  const int query_head = static_cast<int>(work.query_head);
  const int kv_head = static_cast<int>(kv_head_of(work.query_head, q_heads, kv_heads));
  const int block_first_row = work.query_tile * T::kQueryRows;

  // Keys the block must see (stage 08): all of them, or with the causal mask those its last valid
  // row sees; tiles past that are never loaded. Keys below `unmasked_keys` are visible to every row
  // of the block, so only tiles reaching past it need the mask. The producer and the consumers
  // compute the same count: every tile the producer loads is consumed.
  const int last_row = min(q_seq, block_first_row + T::kQueryRows) - 1;
  const int key_end = causal ? static_cast<int>(causal_key_end(last_row, q_seq, kv_seq)) : kv_seq;
  const int unmasked_keys = causal ? static_cast<int>(causal_key_end(block_first_row, q_seq, kv_seq)) : kv_seq;
  const int tiles = (key_end + T::kKeys - 1) / T::kKeys;

  // One thread sets up the barriers. A "full" barrier expects one arrival (the producer's, which
  // also announces the bytes to come); "slot free" expects one arrival from each consumer warp.
  if (threadIdx.x == 0) {
    barrier_init(query_full, 1);
    for (int slot = 0; slot < T::kStages; ++slot) {
      barrier_init(&key_full[slot], 1);
      barrier_init(&value_full[slot], 1);
      barrier_init(&slot_free[slot], T::kConsumers * kWarpgroupThreads / kWarpSize);
    }
    fence_barrier_init();
  }
  __syncthreads();  // the last block-wide barrier: from here on the roles go their own ways

  const int warpgroup = threadIdx.x / kWarpgroupThreads;
  if (warpgroup == 0) {
    // ---- The producer ------------------------------------------------------------------------
    // It computes addresses and waits on barriers: 24 registers a thread are plenty. The registers
    // it gives back let the consumers grow (to 240 a thread; 160 with three consumers).
    release_registers<T::kProducerRegisters>();
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&query_map);
      prefetch_tensor_map(&key_map);
      prefetch_tensor_map(&value_map);
      // Q: one box of Br rows x 64 columns per panel, all completing on query_full. Rows past Nq
      // (the last query tile) arrive as zeros.
      barrier_arrive_expect_bytes(query_full, T::kQueryTileBytes);
      for (int panel = 0; panel < T::kPanels; ++panel) {
        copy_box_to_shared(shared_address(query_tile + panel * T::kQueryPanelBytes), &query_map,
                           shared_address(query_full), panel * kPanelColumns, block_first_row, query_head);
      }
      // The ring: tile t goes to slot t % kStages. Before reusing a slot (from the second pass on)
      // wait until all consumer warps have released it: the phase that completed on their
      // (t / kStages)-th release, parity (t / kStages - 1) % 2. K and V have barriers of their own,
      // so QKᵀ can start while V is still on its way.
      for (int tile = 0; tile < tiles; ++tile) {
        const int slot = tile % T::kStages;
        const int pass = tile / T::kStages;
        if (pass > 0) barrier_wait(&slot_free[slot], (pass - 1) & 1);
        const int key_base = tile * T::kKeys;
        barrier_arrive_expect_bytes(&key_full[slot], T::kKvTileBytes);
        for (int panel = 0; panel < T::kPanels; ++panel) {
          copy_box_to_shared(shared_address(key_slot(slot) + panel * T::kKvPanelBytes), &key_map,
                             shared_address(&key_full[slot]), panel * kPanelColumns, key_base, kv_head);
        }
        barrier_arrive_expect_bytes(&value_full[slot], T::kKvTileBytes);
        for (int panel = 0; panel < T::kPanels; ++panel) {
          copy_box_to_shared(shared_address(value_slot(slot) + panel * T::kKvPanelBytes), &value_map,
                             shared_address(&value_full[slot]), panel * kPanelColumns, key_base, kv_head);
        }
      }
    }
  } else {
    // ---- The consumers -----------------------------------------------------------------------
    claim_registers<T::kConsumerRegisters>();
    const int consumer = warpgroup - 1;  // which 64 rows of the block
    const int thread = threadIdx.x % kWarpgroupThreads;
    const int warp = thread / kWarpSize;  // within the warpgroup: rows 16·warp .. 16·warp + 15
    const int lane = threadIdx.x % kWarpSize;
    // In every accumulator tile this thread holds rows `group` and `group + 8` of its warp's 16,
    // columns 2·quad and 2·quad + 1 (the layout of stage 08's mma.m16n8k16).
    const int group = lane / 4;
    const int quad = lane % 4;
    const int consumer_first_row = block_first_row + consumer * kMmaRows;
    const int warp_first_row = consumer_first_row + warp * 16;

    // The keys row `group + 8·half` of this warp sees end below this limit (causal_key_end's rule
    // in 32 bits, without its clamp at 0, which changes no comparison with a key index).
    const int diagonal = 1 + kv_seq - q_seq;
    const auto key_limit = [&](int half) {
      return causal ? min(kv_seq, warp_first_row + group + 8 * half + diagonal) : kv_seq;
    };

    // The matrix descriptors (README, "The matrix descriptor"). In a 128-byte-swizzled panel, row r
    // of a tile is 128 bytes at r·128, and 8 rows (1024 bytes) are one swizzle period: the stride
    // byte offset. A 16-dim step of a K-major operand (Q or K) is 32 bytes further along the row,
    // and a new panel every four steps. V is read MN-major (its rows are keys, contiguous along the
    // head dim, the N of P·V): a 16-key step is 16 rows further, and the leading byte offset is the
    // step from one 64-column panel to the next.
    const uint64_t query_descriptor =
        matrix_descriptor(shared_address(query_tile) + consumer * kMmaRows * kPanelRowBytes, 16, kSwizzleBytes);
    const auto dim_step_offset = [](int step, int panel_bytes) {
      return static_cast<unsigned>(step / kStepsPerPanel * panel_bytes + step % kStepsPerPanel * 2 * kMmaDepth);
    };

    // O for the warpgroup's 64 rows in FP32 accumulators (D/2 registers a thread), normalized only
    // at the end. Per thread and row (top: `group`, bottom: `group + 8`) the running max m in log2
    // units (m = max_j s_j · scale · log2 e) and this thread's share of the running sum l. A row
    // that sees no key at all (causal, Nq > Nk) starts at m = 0, not -inf (stage 08).
    float out[kDim / 2] = {};
    float row_max[2];
    float row_sum[2] = {};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_first_row + group + 8 * half;
      row_max[half] = causal && causal_key_end(row, q_seq, kv_seq) == 0 ? 0.0f : -INFINITY;
    }

    barrier_wait(query_full, 0);

#pragma unroll 1
    for (int tile = 0; tile < tiles; ++tile) {
      const int slot = tile % T::kStages;
      const unsigned parity = (tile / T::kStages) & 1;  // pass n of the ring waits for phase n
      const int key_base = tile * T::kKeys;

      // S = Q Kᵀ: kDim / 16 wgmma, each 64 rows x Bc keys x 16 dims, both operands in shared
      // memory. The first overwrites the accumulators, the others add to them. They run
      // asynchronously: commit them as one group and wait for it.
      barrier_wait(&key_full[slot], parity);
      const uint64_t key_descriptor = matrix_descriptor(shared_address(key_slot(slot)), 16, kSwizzleBytes);
      float scores[T::kKeys / 2];
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kDimSteps; ++step) {
        const uint64_t a = advance_descriptor(query_descriptor, dim_step_offset(step, T::kQueryPanelBytes));
        const uint64_t b = advance_descriptor(key_descriptor, dim_step_offset(step, T::kKvPanelBytes));
        if (step == 0) {
          wgmma_shared<Element, T::kKeys, false>(scores, a, b);
        } else {
          wgmma_shared<Element, T::kKeys, true>(scores, a, b);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(scores);

      // The online softmax on the accumulators, as in stage 08: scores[4j + e] is key
      // key_base + 8j + 2·quad + e % 2 of the top row (e < 2) or the bottom row (e >= 2). Mask
      // only tiles that reach past the keys every row sees (the diagonal, the partial last tile:
      // its zero-filled keys must weigh nothing, so -inf, never 0).
      if (key_base + T::kKeys > unmasked_keys) {
#pragma unroll
        for (int j = 0; j < kScoreTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (key_base + j * kMmaColumns + 2 * quad + e % 2 >= key_limit(e / 2)) scores[4 * j + e] = -INFINITY;
          }
        }
      }
      float rescale[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kScoreTiles; ++j) {
          tile_max = fmaxf(tile_max, fmaxf(scores[4 * j + 2 * half], scores[4 * j + 2 * half + 1]));
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[half], tile_max * scale_log2);
        rescale[half] = fast_exp2(row_max[half] - new_max);
        row_max[half] = new_max;
        row_sum[half] *= rescale[half];
      }
#pragma unroll
      for (int i = 0; i < T::kKeys / 2; ++i) {
        scores[i] = fast_exp2(fmaf(scores[i], scale_log2, -row_max[i % 4 / 2]));
        row_sum[i % 4 / 2] += scores[i];
      }
#pragma unroll
      for (int i = 0; i < kDim / 2; ++i) out[i] *= rescale[i % 4 / 2];

      barrier_wait(&value_full[slot], parity);
      // EXERCISE BEGIN: P as the register A operand of P·V, then O += P·V with V through its matrix descriptor
      // Score tiles 2j and 2j + 1 hold keys 16j .. 16j + 15 of this thread's two rows, exactly where
      // wgmma's register A fragment wants them (the layout of stage 08's mma.m16n8k16 A, per warp):
      // {top row keys 2·quad, +1}, {bottom row, same keys}, {top row, 8 keys on}, {bottom row, 8 on}.
      unsigned probs[kKeySteps][4];
#pragma unroll
      for (int j = 0; j < kKeySteps; ++j) {
        probs[j][0] = pack_pair<Element>(scores[8 * j + 0], scores[8 * j + 1]);
        probs[j][1] = pack_pair<Element>(scores[8 * j + 2], scores[8 * j + 3]);
        probs[j][2] = pack_pair<Element>(scores[8 * j + 4], scores[8 * j + 5]);
        probs[j][3] = pack_pair<Element>(scores[8 * j + 6], scores[8 * j + 7]);
      }
      // O += P V: one wgmma per 16 keys, 64 rows x kDim dims, B = V read MN-major (transposed):
      // a 16-key step starts 16 rows (2048 bytes) further; the leading byte offset steps from one
      // 64-dim panel of V to the next.
      const uint64_t value_descriptor =
          matrix_descriptor(shared_address(value_slot(slot)), T::kKvPanelBytes, kSwizzleBytes);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < kKeySteps; ++j) {
        wgmma_registers<Element, kDim>(out, probs[j],
                                       advance_descriptor(value_descriptor, j * kMmaDepth * kPanelRowBytes));
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(out);
      // EXERCISE END

      // This warp is done reading the slot: one arrival per consumer warp frees it for the producer.
      __syncwarp();
      if (lane == 0) barrier_arrive(&slot_free[slot]);
    }

    // ---- The epilogue ------------------------------------------------------------------------
    // l from the four threads of each row; O / l rounded to the element type and staged in this
    // warpgroup's own 64 rows of the Q tile (no longer read by anyone: its last wgmma has
    // completed), swizzled like the tiles TMA writes; then written out.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      // l = 0 only for a row that sees no key (its O is 0 too): it writes zeros, not 0/0.
      const float inverse_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int row = warp * 16 + group + 8 * half;  // within the warpgroup's 64
      const int query_row = consumer_first_row + row;
      // LSE = (m + log2 l) · ln 2 (m holds the scale and log2 e); -inf for a row that sees no key.
      if (lse != nullptr && quad == 0 && query_row < q_seq) {
        lse[static_cast<int64_t>(query_head) * q_seq + query_row] =
            sum > 0.0f ? (row_max[half] + log2f(sum)) * kLn2 : -INFINITY;
      }
#pragma unroll
      for (int n = 0; n < kOutTiles; ++n) {
        // Columns 8n + 2·quad, +1: panel n / 8, 16-byte chunk n % 8, stored at chunk (n % 8) ^ (row % 8).
        const int offset = n / 8 * T::kQueryPanelBytes + (consumer * kMmaRows + row) * kPanelRowBytes +
                           (n % 8 ^ row % kSwizzleRows) * 16 + quad * 4;
        *reinterpret_cast<unsigned*>(query_tile + offset) =
            pack_pair<Element>(out[4 * n + 2 * half] * inverse_sum, out[4 * n + 2 * half + 1] * inverse_sum);
      }
    }
    if (store_by_copy_engine) {
      // The staged rows were written by ordinary stores; TMA reads them through the async proxy.
      // Each writing thread fences, the warpgroup meets at its own barrier, then one thread stores
      // every panel as one box of 64 rows (rows past Nq and columns past D are not written) and
      // waits until the copy engine has read the staging before the block may exit.
      fence_shared_for_async_proxy();
      sync_threads(1 + consumer, kWarpgroupThreads);
      if (thread == 0 && consumer_first_row < q_seq) {
        for (int panel = 0; panel < T::kPanels; ++panel) {
          copy_box_to_global(
              &out_map, shared_address(query_tile + panel * T::kQueryPanelBytes + consumer * kMmaRows * kPanelRowBytes),
              panel * kPanelColumns, consumer_first_row, query_head);
        }
        commit_stores();
        wait_stores_read();
      }
    } else {
      // The fallback (D not a multiple of 8, or O off a 16-byte boundary): element by element.
      sync_threads(1 + consumer, kWarpgroupThreads);
      for (int index = thread; index < kMmaRows * dim; index += kWarpgroupThreads) {
        const int row = index / dim;
        const int column = index % dim;
        if (consumer_first_row + row >= q_seq) break;
        const int offset = column / kPanelColumns * T::kQueryPanelBytes + (consumer * kMmaRows + row) * kPanelRowBytes +
                           ((column % kPanelColumns / 8) ^ (row % kSwizzleRows)) * 16 + column % 8 * 2;
        o[(static_cast<int64_t>(query_head) * q_seq + consumer_first_row + row) * dim + column] =
            *reinterpret_cast<const Element*>(query_tile + offset);
      }
    }
  }
#else
  __trap();  // never launched: the runner refuses every GPU but sm_90 (the descriptor's architecture)
#endif
}

template <typename Element, int kDim>
Status launch(const ForwardArgs& args, const void* q, const void* k, const void* v, int64_t columns,
              bool store_by_copy_engine) {
  using T = Tiling<kDim>;
  const Problem& problem = args.problem;
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  // The tensor maps: Q and O are (B·Hq) x Nq x D, K and V (B·Hkv) x Nk x D, with `columns` the
  // (possibly padded) row length. A grouped query head finds its K/V head by coordinate.
  CUtensorMap query_map{};
  CUtensorMap key_map{};
  CUtensorMap value_map{};
  CUtensorMap out_map{};
  FA_STATUS_TRY(kernel::encode_matrix_stack(query_map, kBf16, q, columns, problem.q_seq, problem.q_heads_total(),
                                            kPanelColumns, T::kQueryRows));
  FA_STATUS_TRY(kernel::encode_matrix_stack(key_map, kBf16, k, columns, problem.kv_seq, problem.kv_heads_total(),
                                            kPanelColumns, T::kKeys));
  FA_STATUS_TRY(kernel::encode_matrix_stack(value_map, kBf16, v, columns, problem.kv_seq, problem.kv_heads_total(),
                                            kPanelColumns, T::kKeys));
  if (store_by_copy_engine) {
    FA_STATUS_TRY(kernel::encode_matrix_stack(out_map, kBf16, args.o, problem.dim, problem.q_seq,
                                              problem.q_heads_total(), kPanelColumns, kMmaRows));
  }
  const auto kernel = &wgmma_attention_kernel<Element, kDim>;
  FA_STATUS_TRY(opt_in_shared_memory(kernel, T::kSharedBytes));
  const int64_t query_tiles = (problem.q_seq + T::kQueryRows - 1) / T::kQueryRows;
  const int64_t blocks = query_tiles * problem.q_heads_total();
  FA_STATUS_TRY(check_grid(blocks));
  const float scale_log2 = softmax_scale(problem) * kernel::kLog2e;
  // Every count below fits an int: the runner has checked the problem against validate_problem's
  // limits (B·Hq <= 2^20, N <= 2^24) and the grid against 2^31 - 1.
  kernel<<<static_cast<unsigned>(blocks), T::kThreads, T::kSharedBytes, args.stream>>>(
      query_map, key_map, value_map, out_map, static_cast<Element*>(args.o), args.lse, static_cast<int>(problem.q_seq),
      static_cast<int>(problem.kv_seq), static_cast<int>(problem.dim), static_cast<int>(query_tiles),
      static_cast<int>(problem.q_heads), static_cast<int>(problem.kv_heads), static_cast<int>(problem.q_heads_total()),
      problem.causal, store_by_copy_engine, scale_log2);
  FA_LAUNCH_TRY();
  return Status();
}

int64_t padded_dim(int64_t dim) { return (dim + kAlignElements - 1) / kAlignElements * kAlignElements; }

// Bytes of the padded copies of Q, K and V; none when D is a multiple of 8 (TMA reads the inputs).
int64_t workspace(const Problem& problem, Pass /*pass*/) {
  if (problem.dim % kAlignElements == 0) return 0;
  return (problem.q_rows() + 2 * problem.kv_rows()) * padded_dim(problem.dim) * 2;
}

template <typename Element>
Status pad_rows(const void* source, Element* destination, int64_t rows, const Problem& problem, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t total = rows * padded_dim(problem.dim);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65536));
  pad_rows_kernel<Element><<<blocks, kThreads, 0, stream>>>(static_cast<const Element*>(source), destination, rows,
                                                            static_cast<int>(problem.dim),
                                                            static_cast<int>(padded_dim(problem.dim)));
  FA_LAUNCH_TRY();
  return Status();
}

// The runner has checked the problem (sizes, head dim, features) and the GPU (exactly sm_90)
// against the descriptor before this runs.
template <typename Element>
Status forward(const ForwardArgs& args) {
  const Problem& problem = args.problem;
  const void* q = args.q;
  const void* k = args.k;
  const void* v = args.v;
  int64_t columns = problem.dim;
  const bool padded = problem.dim % kAlignElements != 0;
  if (padded) {
    // TMA cannot describe rows of D elements: copy Q, K and V into rows of the next multiple of 8,
    // zero-filled, and read those. The kernel still scales by 1/sqrt(D) of the real D and writes
    // only D columns of O.
    if (args.workspace == nullptr || !aligned16(args.workspace)) {
      return Status::unsupported("09_wgmma_tma: head dim " + std::to_string(problem.dim) +
                                 " needs the declared workspace (16-byte aligned) for padded copies of Q, K and V");
    }
    columns = padded_dim(problem.dim);
    Element* q_copy = static_cast<Element*>(args.workspace);
    Element* k_copy = q_copy + problem.q_rows() * columns;
    Element* v_copy = k_copy + problem.kv_rows() * columns;
    FA_STATUS_TRY(pad_rows<Element>(args.q, q_copy, problem.q_rows(), problem, args.stream));
    FA_STATUS_TRY(pad_rows<Element>(args.k, k_copy, problem.kv_rows(), problem, args.stream));
    FA_STATUS_TRY(pad_rows<Element>(args.v, v_copy, problem.kv_rows(), problem, args.stream));
    q = q_copy;
    k = k_copy;
    v = v_copy;
  } else if (!all_aligned16({args.q, args.k, args.v})) {
    return Status::unsupported("09_wgmma_tma: TMA reads Q, K and V only from 16-byte aligned addresses");
  }
  // O goes out by TMA too when it can be described to it; else element by element.
  const bool store_by_copy_engine = !padded && aligned16(args.o);
  return dispatch_head_dim<64, 128, kMaxDim>(problem.dim, [&](auto bucket) {
    return launch<Element, decltype(bucket)::value>(args, q, k, v, columns, store_by_copy_engine);
  });
}

StageDescriptor describe(Precision precision, ForwardFn forward_function, const char* title) {
  StageDescriptor stage;
  stage.id = "09_wgmma_tma";
  stage.title = title;
  stage.backend = Backend::cuda;
  stage.precision = precision;
  stage.forward = forward_function;
  stage.workspace_bytes = &workspace;
  stage.max_dim = kMaxDim;
  stage.architecture = {90, true};  // sm_90a: wgmma and setmaxnreg (TMA and mbarrier's byte count: sm_90)
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

StageDescriptor wgmma_tma_fp16() {
  return describe(Precision::fp16, &forward<__half>,
                  "TMA copies + wgmma on warpgroups, one producer warp, setmaxnreg (FP16, sm_90a)");
}

StageDescriptor wgmma_tma_bf16() {
  return describe(Precision::bf16, &forward<__nv_bfloat16>,
                  "TMA copies + wgmma on warpgroups, one producer warp, setmaxnreg (BF16, sm_90a)");
}

}  // namespace fa::stages
