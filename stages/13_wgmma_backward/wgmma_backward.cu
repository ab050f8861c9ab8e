// Stage 13: the FlashAttention backward pass on Hopper — stage 11's algorithm on stage 09's
// machinery: TMA copies into an mbarrier ring, the five products as wgmma, one producer warp and
// two consumer warpgroups.
//
// A block owns one tile of 128 keys of one K/V head and keeps that tile's dK and dV in FP32
// wgmma accumulators while it walks every query tile of every query head of its group (stage 11's
// K/V-stationary loop; the group's dK and dV are summed in registers, written once). Each consumer
// warpgroup owns 64 of the keys, the M of a wgmma, so every product is the warpgroup's own:
//
//   product          M × N × K (per warpgroup)      A from             B from
//   Sᵀ  = K Qᵀ       64 keys × Br × D               shared (K, rows)   shared (Q, K-major)
//   dPᵀ = V dOᵀ      64 keys × Br × D               shared (V, rows)   shared (dO, K-major)
//   dV += Pᵀ dO      64 keys × D × Br               registers (Pᵀ)     shared (dO, MN-major)
//   dK += dSᵀ Q      64 keys × D × Br               registers (dSᵀ)    shared (Q, MN-major)
//   dQ  = dS K       64 queries × 64 dims × 128     shared (dSᵀ, MN)   shared (K, MN-major)
//
// Pᵀ and dSᵀ come out of the first two products in the accumulator layout, which is the register
// A layout of the next two (stage 09's P·V trick, now with keys as the rows). dQ needs dS with the
// queries as rows and all 128 keys of the block as the depth, so dSᵀ goes through shared memory
// once; each warpgroup then multiplies half of dQ (64 of its dims at D = 128, 64 of its queries at
// D = 64) and adds it to an FP32 workspace in global memory by 16-byte atomic adds straight from its
// accumulators (the add done in L2). A last kernel scales that sum and rounds it to the element
// type; a first one computes D_i = rowsum(dO ∘ O) and clears the sum. In the deterministic mode
// (fa/deterministic.hpp) the parts are added key tile after key tile (turns).
//
// A step, for each consumer: Sᵀ and dPᵀ issued; exponentials while dPᵀ runs; dV issued; dSᵀ while dV
// runs, stored for dQ; the consumers meet (barrier 1); dQ and dK issued; dQ's atomics while dK runs.
// After the last step dK and dV take K's and V's places in shared memory and the copy engine stores
// them (TMA), as it loaded K and V.
//
// Head dims in three buckets (64: Br = 128 queries a step; 128: Br = 64; 256: 64 keys a block, dK
// and dV split by dims between the consumers, two blocks a cluster that swap dSᵀ so that each adds
// dQ once for 128 keys, wide_backward_kernel below), D a multiple of 8 (TMA's row rule) and 16-byte
// aligned tensors; anything else goes to stage 11's mma.sync backward, which takes every shape
// (README: "What goes to stage 11").
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fa/cuda_check.hpp"
#include "fa/deterministic.hpp"
#include "fa/device.hpp"
#include "fa/kernel/accumulator_softmax.cuh"
#include "fa/kernel/convert.cuh"
#include "fa/kernel/dependent_launch.cuh"
#include "fa/kernel/exp2.cuh"
#include "fa/kernel/launch_order.cuh"
#include "fa/kernel/mbarrier.cuh"
#include "fa/kernel/tma.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/kernel/wgmma.cuh"
#include "fa/kernel/wgmma_epilogue.cuh"
#include "fa/kernel/wgmma_walk.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"
#include "last_wave.hpp"

// wgmma and setmaxnreg exist only in sm_90a (stage 09); CMake builds this file for it alone.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_STAGE13_DEVICE_CODE 1
#else
#define FA_STAGE13_DEVICE_CODE 0
#endif

namespace fa::stages {

// The forward pass is stage 10's (it writes the LSE this pass rebuilds P from); shapes this stage
// does not take go to stage 11's backward.
StageDescriptor overlap_fp16();
StageDescriptor overlap_bf16();
StageDescriptor backward_fp16();
StageDescriptor backward_bf16();

namespace {

// The tile geometry is the kit's (wgmma_walk.cuh); here the M of a wgmma is one warpgroup's keys
// (or queries, for dQ).
using kernel::kMmaColumns;
using kernel::kMmaDepth;
using kernel::kMmaRows;
using kernel::kPanelColumns;
using kernel::kPanelRowBytes;
using kernel::kSwizzleBytes;
using kernel::kSwizzleRows;
using kernel::kWarpgroupThreads;
using kernel::kWarpSize;
using kernel::launch_dependents;
using kernel::pack_pair;
using kernel::wait_for_prerequisite;
using wgmma_backward::kMaxSplitTiles;
using wgmma_backward::LastWave;
using wgmma_backward::split_last_wave;
using wgmma_backward::SplitTiles;

constexpr int kKeys = 128;     // Bc: the keys of a block, two consumer warpgroups of 64 (D <= 128)
constexpr int kConsumers = 2;  // consumer warpgroups
constexpr int kThreads = (1 + kConsumers) * kWarpgroupThreads;
constexpr int kMaxDim = 256;         // this stage's own kernels take D a multiple of 8 up to here
constexpr int kAlignElements = 8;    // TMA: a row's byte stride is a multiple of 16
constexpr int kWorkspaceRows = 128;  // each query head's rows in the workspaces: a multiple of every Br
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
// Named barriers (0 is __syncthreads): dSᵀ of both consumers is in shared memory; the deterministic
// mode's turn of consumer c has come (2 + c), within that consumer.
constexpr int kScoresReadyBarrier = 1;
constexpr int kTurnBarrier = 2;

// Br, the queries of a step, by head-dim bucket (the Tilings below say why).
constexpr int step_queries(int dim) { return dim <= 64 ? 128 : 64; }

// Everything that sizes the kernel of one head-dim bucket (64 or 128).
template <int kDim>
struct Tiling {
  // Br, the queries of a step. The registers decide: a consumer thread holds dK and dV (kDim
  // floats), Sᵀ and dPᵀ (Br floats) and their 16-bit copies; at D = 128 Br = 64 fills 240
  // registers, at D = 64 Br = 128 does.
  static constexpr int kQueries = step_queries(kDim);
  static constexpr int kBlockKeys = kKeys;
  static constexpr int kClusterBlocks = 1;                       // a block alone (D = 256 runs two a cluster)
  static constexpr int kWorkKeys = kClusterBlocks * kBlockKeys;  // the keys a block owns
  static constexpr int kStages = 2;                              // query tiles in the ring
  static constexpr int kPanels = kDim / kPanelColumns;
  static constexpr int kKvPanelBytes = kKeys * kPanelRowBytes;
  static constexpr int kKvTileBytes = kPanels * kKvPanelBytes;
  static constexpr int kQueryPanelBytes = kQueries * kPanelRowBytes;
  static constexpr int kQueryTileBytes = kPanels * kQueryPanelBytes;
  // dSᵀ: rows are the block's 128 keys, each Br queries long, in panels of 64 queries (128-byte
  // swizzled rows, like a TMA tile), two buffers (steps alternate).
  static constexpr int kScorePanels = kQueries / kPanelColumns;
  static constexpr int kScorePanelBytes = kKeys * kPanelRowBytes;
  static constexpr int kScoreTileBytes = kScorePanels * kScorePanelBytes;
  // dQ's split between the consumers: 64 dims each at D = 128, 64 queries each at D = 64.
  static_assert(kScorePanels * kPanels == kConsumers, "each consumer multiplies one 64 x 64 part of dQ");
  static constexpr int kRowBytes = kQueries * 4;  // the FP32 LSE (or D) of a step's rows
  static constexpr int kBarriers = 1 + 2 * kStages;
  static constexpr int kSharedBytes = kSwizzleBytes + 2 * kKvTileBytes + kStages * 2 * kQueryTileBytes +
                                      2 * kScoreTileBytes + kStages * 2 * kRowBytes + kBarriers * 8;
  static_assert(kWorkspaceRows % kQueries == 0, "whole query tiles in each head's workspace rows");
  static_assert(kWarpgroupThreads * (kProducerRegisters + kConsumers * kConsumerRegisters) <= 65536,
                "setmaxnreg moves only the registers the block was launched with");
  static_assert(kSharedBytes <= 227 * 1024, "one block's shared memory on an H100/H200");
};

// D = 256 (the bucket of D 136 .. 256): a consumer cannot hold dK and dV of 64 keys (256 registers
// a thread), so a block owns 64 keys and each consumer keeps dK and dV of all of them for half of
// the dims (128 registers). Sᵀ and dPᵀ are split by queries instead, 32 of a step's 64 each, and go
// through shared memory (Pᵀ and dSᵀ, 64 keys x 64 queries, two buffers), where both consumers read
// them as the A of dV, dK and dQ. dQ's FP32 additions per FLOP would be twice D = 128's (64 keys a
// block, 256 dims), so two blocks of neighbouring key tiles run as a cluster and swap dSᵀ through
// distributed shared memory: block r adds dQ's dims 128r .. 128r + 127 over both blocks' 128 keys,
// which takes the partner's K for those dims too. K, V (32 KB each), the partner's K half (16 KB),
// two ring slots of Q and one of dO (32 KB each), two buffers each of Pᵀ, dSᵀ and the partner's dSᵀ
// (8 KB each) fill 226 KB.
struct WideTiling {
  static constexpr int kDim = 256;
  static constexpr int kBlockKeys = 64;
  static constexpr int kClusterBlocks = 2;
  static constexpr int kWorkKeys = kClusterBlocks * kBlockKeys;  // the keys whose dS one dQ addition sums
  static constexpr int kQueries = step_queries(kDim);
  static constexpr int kConsumerQueries = kQueries / kConsumers;  // the N of Sᵀ and dPᵀ
  static constexpr int kConsumerDims = kDim / kConsumers;         // dK and dV of a consumer
  static constexpr int kBlockDims = kDim / kClusterBlocks;        // dQ of a block (one panel a consumer)
  static constexpr int kStages = 2;                               // Q's ring; dO has one slot
  static constexpr int kPanels = kDim / kPanelColumns;
  static constexpr int kKvPanelBytes = kBlockKeys * kPanelRowBytes;
  static constexpr int kKvTileBytes = kPanels * kKvPanelBytes;
  static constexpr int kPartnerKeyBytes = kBlockDims / kPanelColumns * kKvPanelBytes;
  static constexpr int kQueryPanelBytes = kQueries * kPanelRowBytes;
  static constexpr int kQueryTileBytes = kPanels * kQueryPanelBytes;
  static constexpr int kScoreTileBytes = kBlockKeys * kPanelRowBytes;  // rows: keys; 64 queries of 2 bytes
  static constexpr int kRowBytes = kQueries * 4;
  // K and V landed; Q slot full, free; dO full, free; the partner's dSᵀ landed (two buffers).
  static constexpr int kBarriers = 1 + 2 * kStages + 2 + 2;
  static constexpr int kSharedBytes = kSwizzleBytes + 2 * kKvTileBytes + kPartnerKeyBytes +
                                      (kStages + 1) * kQueryTileBytes + 3 * 2 * kScoreTileBytes +
                                      kStages * 2 * kRowBytes + kBarriers * 8;
  static_assert(kQueries == kPanelColumns && kBlockKeys == kMmaRows, "one 64 x 64 panel of Pᵀ and of dSᵀ");
  static_assert(kBlockDims / kPanelColumns == kConsumers, "each consumer adds one 64 x 64 part of dQ");
  static_assert(kSharedBytes <= 227 * 1024, "one block's shared memory on an H100/H200");
};

// dQ's FP32 workspace holds each query tile (Br × kDim) as 64 x 64 consumer parts (64 queries each
// at D = 64, else 64 dims each: two at D = 128, four at D = 256), each in the order its consumer
// stages it, which is the accumulator layout: the warpgroup's 128 threads' registers 4e .. 4e + 3
// side by side for e = 0 .. 7 (one 16-byte store or atomic a thread, a warp's 512 bytes contiguous).
// Float4 number e · 128 + t of a part is thread t's accumulators 4e .. 4e + 3: rows r and r + 8,
// columns c and c + 1 of the part, with r = 16 · (t / 32) + (t % 32) / 4 and c = 8e + 2 · (t % 4).
struct AccumulatorPlace {
  int row;
  int column;
};
// Where accumulators 4e .. 4e + 3 of a warpgroup's thread t sit in its 64-row tile: rows r and
// r + 8, columns c and c + 1.
__host__ __device__ __forceinline__ AccumulatorPlace accumulator_place(int e, int t) {
  return {t / kWarpSize * 16 + t % kWarpSize / 4, e * kMmaColumns + t % 4 * 2};
}
// The place of float4 `float4_in_tile` of a dQ tile's sum: row of the query tile, column of the head dim.
template <int kDim>
__device__ __forceinline__ AccumulatorPlace part_place(int float4_in_tile) {
  constexpr int kScorePanels = step_queries(kDim) / kPanelColumns;
  constexpr int kPartFloat4s = kMmaRows * kPanelColumns / 4;
  const int part = float4_in_tile / kPartFloat4s;
  const AccumulatorPlace place =
      accumulator_place(float4_in_tile % kPartFloat4s / kWarpgroupThreads, float4_in_tile % kWarpgroupThreads);
  return kScorePanels == 2 ? AccumulatorPlace{part * kMmaRows + place.row, place.column}
                           : AccumulatorPlace{place.row, part * kPanelColumns + place.column};
}

// 1D bulk copy global -> shared (no tensor map), completing on `barrier`: the LSE and D of a step.
__device__ __forceinline__ void copy_bytes_to_shared(unsigned destination, const void* source, unsigned bytes,
                                                     unsigned barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(destination),
      "l"(source), "r"(bytes), "r"(barrier)
      : "memory");
}

// dQ's product: A = dS read from dSᵀ (MN-major: imm-trans-a = 1), B = K read MN-major (its rows are
// keys, the depth), 64 x 64 x 16. `accumulate` false overwrites the accumulators.
template <typename Element>
__device__ __forceinline__ void wgmma_transposed(float (&d)[32], uint64_t a_descriptor, uint64_t b_descriptor,
                                                 bool accumulate) {
#define FA_STAGE13_WGMMA(type)                                                                                         \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." type "." type   \
               " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "     \
               "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 1, 1;\n}\n"                 \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),       \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),            \
                 "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),            \
                 "+f"(d[30]), "+f"(d[31])                                                                              \
               : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(accumulate)));
  if constexpr (std::is_same_v<Element, __half>) {
    FA_STAGE13_WGMMA("f16")
  } else {
    FA_STAGE13_WGMMA("bf16")
  }
#undef FA_STAGE13_WGMMA
}

// The products of D = 256 (WideTiling), both operands in shared memory: Sᵀ and dPᵀ of a consumer's
// 32 queries (m64n32k16, both K-major), and dV += Pᵀ dO, dK += dSᵀ Q over 128 dims (m64n128k16, A
// K-major: Pᵀ's rows are keys with the queries along them; B MN-major, as V in P·V). `accumulate`
// false overwrites the accumulators.
template <typename Element>
__device__ __forceinline__ void wgmma_narrow(float (&d)[16], uint64_t a_descriptor, uint64_t b_descriptor,
                                             bool accumulate) {
#define FA_STAGE13_NARROW(type)                                                                                \
  asm volatile(                                                                                                \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32." type "." type    \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n" \
      : FA_WGMMA_OPERANDS_8(FA_WGMMA_READ_WRITE, d, 0), FA_WGMMA_OPERANDS_8(FA_WGMMA_READ_WRITE, d, 8)         \
      : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(accumulate)));
  if constexpr (std::is_same_v<Element, __half>) {
    FA_STAGE13_NARROW("f16")
  } else {
    FA_STAGE13_NARROW("bf16")
  }
#undef FA_STAGE13_NARROW
}

template <typename Element>
__device__ __forceinline__ void wgmma_half_dims(float (&d)[64], uint64_t a_descriptor, uint64_t b_descriptor) {
#define FA_STAGE13_HALF_DIMS(type)                                                                    \
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." type "." type " " FA_WGMMA_REGISTERS_64 \
               ", %64, %65, 1, 1, 1, 0, 1;\n"                                                         \
               : FA_WGMMA_OPERANDS_64(FA_WGMMA_READ_WRITE, d)                                         \
               : "l"(a_descriptor), "l"(b_descriptor));
  if constexpr (std::is_same_v<Element, __half>) {
    FA_STAGE13_HALF_DIMS("f16")
  } else {
    FA_STAGE13_HALF_DIMS("bf16")
  }
#undef FA_STAGE13_HALF_DIMS
}

// The two 16-bit elements of a 32-bit word as FP32, the low half first (pack_pair's inverse).
template <typename Element>
__device__ __forceinline__ float2 unpack_pair(unsigned word) {
  if constexpr (std::is_same_v<Element, __half>) {
    return __half22float2(*reinterpret_cast<const __half2*>(&word));
  } else {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&word));
  }
}

// Preprocessing, kDim / 8 lanes per row of the workspaces (each head's rows padded to
// kWorkspaceRows), so that every lane of a warp loads 16 bytes of O and of dO (two rows a warp at
// D = 128, four at D = 64): D_i = rowsum(dO ∘ O) and the LSE in log2 units. Rows past Nq, and rows
// that see no key (LSE = -inf), get LSE = +inf: their P = 2^(s − inf) = 0, so they add nothing. Each
// row's lanes also clear its kDim floats of dQ's sum (a row's share of the workspace, whatever its
// order inside a tile), 32 bytes a lane.
template <typename Element, int kDim>
__global__ void row_prepare_kernel(const Element* __restrict__ out, const Element* __restrict__ grad_out,
                                   const float* __restrict__ lse, float* __restrict__ lse_log2,
                                   float* __restrict__ row_delta, float* __restrict__ grad_q_sum,
                                   int64_t workspace_rows, int q_seq, int workspace_head_rows, int dim) {
  // The backward kernel may be launched now (programmatic dependent launch): its blocks take SMs as
  // these blocks leave and load K and V; they wait for this grid's writes before reading any.
  launch_dependents();
  constexpr int kVector = 8;  // 16-bit elements in 16 bytes
  constexpr int kLanesPerRow = kDim / kVector;
  constexpr int kRowsPerWarp = kWarpSize / kLanesPerRow;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int sublane = lane % kLanesPerRow;
  const int64_t index = warp * kRowsPerWarp + lane / kLanesPerRow;
  const bool live = index < workspace_rows;
  const int64_t head = index / workspace_head_rows;
  const int row = static_cast<int>(index % workspace_head_rows);
  float sum = 0.0f;
  if (live && row < q_seq && kVector * sublane < dim) {
    const int64_t first = (head * q_seq + row) * dim + kVector * sublane;
    const uint4 o = *reinterpret_cast<const uint4*>(out + first);
    const uint4 grad = *reinterpret_cast<const uint4*>(grad_out + first);
    const unsigned o_words[4] = {o.x, o.y, o.z, o.w};
    const unsigned grad_words[4] = {grad.x, grad.y, grad.z, grad.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 a = unpack_pair<Element>(o_words[w]);
      const float2 b = unpack_pair<Element>(grad_words[w]);
      sum += a.x * b.x + a.y * b.y;
    }
  }
  if (live) {
    float4* clear = reinterpret_cast<float4*>(grad_q_sum + index * kDim) + 2 * sublane;
    clear[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    clear[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  // The row's lanes are side by side: the sum over kLanesPerRow of them.
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (live && sublane == 0) {
    float log2_lse = INFINITY;
    if (row < q_seq) {
      const float value = lse[head * q_seq + row];
      if (value != -INFINITY) log2_lse = value * kernel::kLog2e;
    }
    row_delta[index] = sum;
    lse_log2[index] = log2_lse;
  }
}

// Four threads of a row quad (lanes 4g .. 4g + 3) each hold words[d] bound for lane 4g + d; each
// gets back the four words bound for it, in the order of the lanes they came from (two exchanges:
// with the lane one over, then with the lane two over).
__device__ __forceinline__ uint4 transpose_quad(const unsigned (&words)[4], int quad) {
  const bool odd = quad & 1;
  const unsigned low = __shfl_xor_sync(kernel::kFullWarp, odd ? words[0] : words[1], 1);
  const unsigned high = __shfl_xor_sync(kernel::kFullWarp, odd ? words[2] : words[3], 1);
  // Bound for lane quad % 2 (from the even lane of the pair, then the odd one), then for 2 + quad % 2.
  const unsigned mine[4] = {odd ? low : words[0], odd ? words[1] : low, odd ? high : words[2], odd ? words[3] : high};
  const bool upper = quad & 2;
  const unsigned first = __shfl_xor_sync(kernel::kFullWarp, upper ? mine[0] : mine[2], 2);
  const unsigned second = __shfl_xor_sync(kernel::kFullWarp, upper ? mine[1] : mine[3], 2);
  return upper ? make_uint4(first, second, mine[2], mine[3]) : make_uint4(mine[0], mine[1], first, second);
}

// The last step: dQ = scale · (the FP32 sum every key tile added), rounded to the element type.
// A thread takes accumulators 4e .. 4e + 3 of a part's thread t for e = 2p and 2p + 1 (part_place):
// two float4s, a warp's loads 512 contiguous bytes each; rows r and r + 8, columns 16p + 2·(t % 4)
// and the next, and 8 columns on. The four threads of a row quad swap their pairs
// (transpose_quad), so that each holds 8 columns of one row: 16-byte stores, a row's 32 bytes
// by two neighbours. A thread's pairs of float4s are all loaded before its first store.
constexpr int kConvertPairs = 2;
template <typename Element, int kDim>
__global__ void scale_grad_query_kernel(const float4* __restrict__ accumulated, Element* __restrict__ grad_q,
                                        int64_t pairs, int q_seq, int workspace_head_rows, int dim, float scale) {
  constexpr int kQueries = step_queries(kDim);
  constexpr int kTileFloat4s = kQueries * kDim / 4;
  wait_for_prerequisite();  // launched early (programmatic dependent launch): dQ's sum is whole now
  const int t = threadIdx.x % kWarpgroupThreads;
  const int quad = t % 4;
  const int64_t first_pair = static_cast<int64_t>(blockIdx.x) * blockDim.x * kConvertPairs + threadIdx.x;
  float4 sums[kConvertPairs][2];
#pragma unroll
  for (int k = 0; k < kConvertPairs; ++k) {
    // Pair i = 4 · 128 · part + 128 · p + t is float4s 2i − t (e = 2p) and 128 after it (2p + 1).
    const int64_t first = 2 * (first_pair + k * blockDim.x) - t;
    const bool live = first_pair + k * blockDim.x < pairs;  // the same for a whole warp
    sums[k][0] = live ? accumulated[first] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    sums[k][1] = live ? accumulated[first + kWarpgroupThreads] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const int tiles_per_head = workspace_head_rows / kQueries;
#pragma unroll
  for (int k = 0; k < kConvertPairs; ++k) {
    if (first_pair + k * blockDim.x >= pairs) break;
    const int64_t first = 2 * (first_pair + k * blockDim.x) - t;
    const float4 even = sums[k][0];
    const float4 odd = sums[k][1];
    // Bound for lane quad 0: row r, the first 8 columns; 1: row r, the next 8; 2, 3: row r + 8.
    const unsigned words[4] = {
        pack_pair<Element>(even.x * scale, even.y * scale), pack_pair<Element>(odd.x * scale, odd.y * scale),
        pack_pair<Element>(even.z * scale, even.w * scale), pack_pair<Element>(odd.z * scale, odd.w * scale)};
    const uint4 chunk = transpose_quad(words, quad);
    const int64_t tile = first / kTileFloat4s;  // (query head, query tile), tile-major
    const int64_t head = tile / tiles_per_head;
    const AccumulatorPlace place = part_place<kDim>(static_cast<int>(first % kTileFloat4s));
    const int row = static_cast<int>(tile % tiles_per_head) * kQueries + place.row + 8 * (quad / 2);
    const int column = place.column - 2 * quad + 8 * (quad % 2);
    // dim is a multiple of 8: a chunk's 8 columns are all in or all out.
    if (row < q_seq && column < dim) {
      *reinterpret_cast<uint4*>(grad_q + (head * q_seq + row) * dim + column) = chunk;
    }
  }
}

// The keys a block (at D = 256 a cluster) owns and the steps it walks, `work_index` in the launch
// order: heaviest first under the causal mask (key tile 0 sees every query tile), by
// launch_order.cuh's wide bands (many tiles of few heads); K/V head slow otherwise. A step is a
// (query head of the group, query tile) pair; under the causal mask (bottom-right) only the query
// rows from key_base + Nq − Nk on see a key of the tile, and the query tiles above them are never
// loaded. The kernel's parameters are taken by reference: each is
// read from the parameter space where it is used.
struct KeyTileWork {
  int key_tile_index;
  int kv_head;  // b·Hkv + g
  int key_base;
  int first_query_head;
  int first_query_tile;
  int query_tiles;
  int steps;
};

template <int kBlockKeys, int kQueries>
__host__ __device__ __forceinline__ KeyTileWork key_tile_work(unsigned work_index, const int& key_tiles,
                                                              const int& kv_heads_total, const int& q_heads,
                                                              const int& kv_heads, const int& q_seq, const int& kv_seq,
                                                              const bool& causal) {
  using namespace kernel;
  const Work<unsigned> work = ordered_work_wide_bands<unsigned>(work_index, static_cast<unsigned>(key_tiles),
                                                                static_cast<unsigned>(kv_heads_total), causal);
  KeyTileWork tile;
  tile.key_tile_index = causal ? key_tiles - 1 - static_cast<int>(work.query_tile) : static_cast<int>(work.query_tile);
  tile.kv_head = static_cast<int>(work.query_head);
  tile.key_base = tile.key_tile_index * kBlockKeys;
  const int group_size = q_heads / kv_heads;
  tile.first_query_head = tile.kv_head / kv_heads * q_heads + tile.kv_head % kv_heads * group_size;
  tile.first_query_tile = causal ? max(0, tile.key_base + q_seq - kv_seq) / kQueries : 0;
  tile.query_tiles = (q_seq + kQueries - 1) / kQueries - tile.first_query_tile;
  tile.steps = group_size * tile.query_tiles;
  return tile;
}

// Which key tile a block at D <= 128 owns and which of its steps it walks: all of them, or, for a
// key tile of the last wave, part `part` (last_wave.hpp: the host's plan, the kernel's table).
struct BlockPart {
  unsigned work_index;  // the key tile's place in the launch order (key_tile_work)
  int split_tile;       // which split tile, or −1 for a block that owns its key tile whole
  int part;
};
__device__ __forceinline__ BlockPart block_part(unsigned block, const SplitTiles& split) {
  const int index = static_cast<int>(block) - split.whole_tiles;
  if (index < 0) return {block, -1, 0};
  // The split tile whose blocks hold this one: the last with first_block <= index.
  int low = 0;
  int high = split.split_tiles - 1;
  while (low < high) {
    const int middle = (low + high + 1) / 2;
    if (split.first_block[middle] <= index) {
      low = middle;
    } else {
      high = middle - 1;
    }
  }
  return {static_cast<unsigned>(split.whole_tiles + low), low, index - split.first_block[low]};
}

// The ring's barriers, by thread 0 (the caller then syncs the block): K and V have landed; per slot,
// its Q, dO, LSE and D have landed, and every consumer thread is done with them.
template <int kStages>
__device__ __forceinline__ void init_ring_barriers(uint64_t* kv_full, uint64_t* slot_full, uint64_t* slot_free) {
  kernel::barrier_init(kv_full, 1);
  for (int slot = 0; slot < kStages; ++slot) {
    kernel::barrier_init(&slot_full[slot], 1);
    kernel::barrier_init(&slot_free[slot], kConsumers * kWarpgroupThreads);
  }
  kernel::fence_barrier_init();
}

// The deterministic mode's turns: key tile t adds its part of a dQ tile after tiles 0 .. t − 1
// (every lower tile sees the query tile too), so the FP32 sum is the same every run.
__device__ __forceinline__ void wait_for_turn(const int* turn, int key_tile_index, int thread, int consumer) {
  if (thread == 0) {
    int done = 0;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(done) : "l"(turn) : "memory");
    } while (done < key_tile_index);
  }
  kernel::sync_threads(kTurnBarrier + consumer, kWarpgroupThreads);
}
__device__ __forceinline__ void pass_turn(int* turn, int thread, int consumer) {
  __threadfence();
  kernel::sync_threads(kTurnBarrier + consumer, kWarpgroupThreads);
  if (thread == 0) atomicAdd(turn, 1);
}

// dK = scale · Σ dSᵀ Q and dV of a thread's two keys, rounded, in place of K and V in shared memory:
// rows first_row + group and + 8 of the tiles (first_row a multiple of 8), columns 8n + 2·quad and
// the next from the tiles' first panel, in the 128-byte swizzle TMA reads (chunk n % 8 of a panel's
// row at chunk (n % 8) ^ group).
template <typename Element, int kColumns, int kPanelBytes>
__device__ __forceinline__ void stage_key_grads(const float (&key_grad)[kColumns / 2],
                                                const float (&value_grad)[kColumns / 2], unsigned char* key_tile,
                                                unsigned char* value_tile, int first_row, int group, int quad,
                                                float scale) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int n = 0; n < kColumns / kMmaColumns; ++n) {
      const int offset =
          n / 8 * kPanelBytes + (first_row + group + 8 * half) * kPanelRowBytes + (n % 8 ^ group) * 16 + quad * 4;
      const int e = 4 * n + 2 * half;
      *reinterpret_cast<unsigned*>(key_tile + offset) =
          pack_pair<Element>(key_grad[e] * scale, key_grad[e + 1] * scale);
      *reinterpret_cast<unsigned*>(value_tile + offset) = pack_pair<Element>(value_grad[e], value_grad[e + 1]);
    }
  }
}

// One 64 x 64 part of dQ into the FP32 workspace, unscaled, in the accumulator order (part_place):
// 16-byte atomic adds (RED.E.ADD.F32x4, the add done in L2), eight a thread at constant offsets from
// `lane_part` (immediates of the atomic), a warp's 512 bytes side by side; the caller goes on at once.
__device__ __forceinline__ void add_query_grad_part(float4* lane_part, const float (&part)[32]) {
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    atomicAdd(lane_part + t * kWarpgroupThreads,
              make_float4(part[4 * t], part[4 * t + 1], part[4 * t + 2], part[4 * t + 3]));
  }
}

// A split key tile's FP32 sums of dK (unscaled) and dV: per split tile, dK then dV, each the two
// consumers' 64 keys in the accumulator order (float4 n · 128 + t is thread t's accumulators
// 4n .. 4n + 3: keys group and group + 8 of warp t / 32, columns 8n + 2·quad and the next).
constexpr int consumer_float4s(int dim) { return kMmaRows * dim / 4; }
template <int kDim>
__device__ __forceinline__ void add_split_key_grads(float4* split_grads, const float (&key_grad)[kDim / 2],
                                                    const float (&value_grad)[kDim / 2], int split_tile, int consumer,
                                                    int thread) {
  float4* keys =
      split_grads + (static_cast<int64_t>(split_tile) * 2 * kConsumers + consumer) * consumer_float4s(kDim) + thread;
  float4* values = keys + kConsumers * consumer_float4s(kDim);
#pragma unroll
  for (int n = 0; n < kDim / 8; ++n) {
    atomicAdd(keys + n * kWarpgroupThreads,
              make_float4(key_grad[4 * n], key_grad[4 * n + 1], key_grad[4 * n + 2], key_grad[4 * n + 3]));
    atomicAdd(values + n * kWarpgroupThreads,
              make_float4(value_grad[4 * n], value_grad[4 * n + 1], value_grad[4 * n + 2], value_grad[4 * n + 3]));
  }
}

// The next step: the next query tile of the head, or the first one of the group's next query head.
__device__ __forceinline__ void next_step(int& query_base, int& head, int first_query_base, int last_query_base,
                                          int queries) {
  if (query_base == last_query_base) {
    query_base = first_query_base;
    ++head;
  } else {
    query_base += queries;
  }
}

// The producer, thread 0 of warpgroup 0: K and V of the block's keys once, then Q, dO, the LSE and D
// of its steps first_step .. end_step − 1 into the ring. Step s is query tile s % query_tiles of the
// group's query head s / query_tiles (key_tile_work).
template <typename T>
__device__ __forceinline__ void produce_steps(const CUtensorMap* query_map, const CUtensorMap* grad_out_map,
                                              const CUtensorMap* key_map, const CUtensorMap* value_map,
                                              unsigned char* key_tile, unsigned char* value_tile, unsigned char* ring,
                                              float* row_data, uint64_t* kv_full, uint64_t* slot_full,
                                              uint64_t* slot_free, const float* lse_log2, const float* row_delta,
                                              const KeyTileWork& tile, int first_step, int end_step,
                                              int workspace_head_rows) {
  using namespace kernel;
  prefetch_tensor_map(query_map);
  prefetch_tensor_map(grad_out_map);
  prefetch_tensor_map(key_map);
  prefetch_tensor_map(value_map);
  barrier_arrive_expect_bytes(kv_full, 2 * T::kKvTileBytes);
  for (int panel = 0; panel < T::kPanels; ++panel) {
    copy_box_to_shared(shared_address(key_tile + panel * T::kKvPanelBytes), key_map, shared_address(kv_full),
                       panel * kPanelColumns, tile.key_base, tile.kv_head);
    copy_box_to_shared(shared_address(value_tile + panel * T::kKvPanelBytes), value_map, shared_address(kv_full),
                       panel * kPanelColumns, tile.key_base, tile.kv_head);
  }
  // K and V are inputs; the LSE and D are the preprocessing's, which may still be running.
  wait_for_prerequisite();
  for (int step = first_step; step < end_step; ++step) {
    const int filled = step - first_step;  // the slots this block filled before this one
    const int slot = filled % T::kStages;
    // Pass n of the ring reuses the slot once the consumers have freed it from pass n − 1.
    if (filled >= T::kStages) barrier_wait(&slot_free[slot], (filled / T::kStages - 1) & 1);
    const int head = tile.first_query_head + step / tile.query_tiles;
    const int row = (tile.first_query_tile + step % tile.query_tiles) * T::kQueries;
    unsigned char* query_slot = ring + slot * 2 * T::kQueryTileBytes;
    const unsigned full = shared_address(&slot_full[slot]);
    barrier_arrive_expect_bytes(&slot_full[slot], 2 * T::kQueryTileBytes + 2 * T::kRowBytes);
    for (int panel = 0; panel < T::kPanels; ++panel) {
      copy_box_to_shared(shared_address(query_slot + panel * T::kQueryPanelBytes), query_map, full,
                         panel * kPanelColumns, row, head);
      copy_box_to_shared(shared_address(query_slot + T::kQueryTileBytes + panel * T::kQueryPanelBytes), grad_out_map,
                         full, panel * kPanelColumns, row, head);
    }
    const int64_t first = static_cast<int64_t>(head) * workspace_head_rows + row;
    float* slot_rows = row_data + slot * 2 * T::kQueries;
    copy_bytes_to_shared(shared_address(slot_rows), lse_log2 + first, T::kRowBytes, full);
    copy_bytes_to_shared(shared_address(slot_rows + T::kQueries), row_delta + first, T::kRowBytes, full);
  }
}

// D <= 128. One block: keys [key_base, key_base + 128) of one K/V head, against every query row of
// its group.
// Threads 0-127 are the producer warpgroup (thread 0 issues every copy), then two consumer
// warpgroups of 64 keys each. Q and dO are described as (B·Hq) x Nq x D, K and V as (B·Hkv) x Nk x
// D; lse_log2 and row_delta are (B·Hq) x workspace_head_rows, as is grad_q_sum (x kDim floats).
// kDeterministic: each part of a dQ tile takes the key tiles' additions in key order (turns).
// The key tiles of the last wave may be split (`split`, block_part); their parts add their dK and dV
// to `split_grads` (add_split_key_grads).
template <typename Element, int kDim, bool kDeterministic>
__global__ void __launch_bounds__(kThreads, 1)
    backward_kernel(const __grid_constant__ CUtensorMap query_map, const __grid_constant__ CUtensorMap grad_out_map,
                    const __grid_constant__ CUtensorMap key_map, const __grid_constant__ CUtensorMap value_map,
                    const __grid_constant__ CUtensorMap grad_key_map,
                    const __grid_constant__ CUtensorMap grad_value_map, const float* __restrict__ lse_log2,
                    const float* __restrict__ row_delta, float* __restrict__ grad_q_sum, int* __restrict__ turns,
                    float4* __restrict__ split_grads, int q_seq, int kv_seq, int workspace_head_rows, int key_tiles,
                    int q_heads, int kv_heads, int kv_heads_total, const __grid_constant__ SplitTiles split,
                    bool causal, float scale, float scale_log2) {
#if FA_STAGE13_DEVICE_CODE
  using T = Tiling<kDim>;
  using namespace kernel;
  constexpr int kQuerySteps = T::kQueries / kMmaDepth;  // 16-query steps of dV and dK
  constexpr int kKeySteps = kKeys / kMmaDepth;          // 16-key steps of dQ

  // Shared memory, aligned to the swizzle's 1024-byte period: K, V (kPanels panels of 128 rows
  // each), the ring (slot s: Q, dO), dSᵀ twice, the ring's rows (slot s: LSE, D), the barriers.
  extern __shared__ unsigned char shared_memory[];
  unsigned char* shared =
      shared_memory + ((kSwizzleBytes - shared_address(shared_memory) % kSwizzleBytes) % kSwizzleBytes);
  unsigned char* key_tile = shared;
  unsigned char* value_tile = key_tile + T::kKvTileBytes;
  unsigned char* ring = value_tile + T::kKvTileBytes;
  unsigned char* score_tiles = ring + T::kStages * 2 * T::kQueryTileBytes;
  float* row_data = reinterpret_cast<float*>(score_tiles + 2 * T::kScoreTileBytes);
  uint64_t* barriers = reinterpret_cast<uint64_t*>(row_data + T::kStages * 2 * T::kQueries);
  uint64_t* kv_full = barriers;                     // K and V have landed
  uint64_t* slot_full = barriers + 1;               // [kStages]: Q, dO, LSE, D of a step have landed
  uint64_t* slot_free = barriers + 1 + T::kStages;  // [kStages]: every consumer thread is done with them

  // Which keys, the steps over the query tiles that see them, and which of those steps are this
  // block's.
  const BlockPart block = block_part(blockIdx.x, split);
  const KeyTileWork tile = key_tile_work<T::kWorkKeys, T::kQueries>(block.work_index, key_tiles, kv_heads_total,
                                                                    q_heads, kv_heads, q_seq, kv_seq, causal);
  const int first_step = block.split_tile < 0 ? 0 : block.part * split.part_steps;
  const int end_step = block.split_tile < 0 ? tile.steps : min(tile.steps, first_step + split.part_steps);

  if (threadIdx.x == 0) init_ring_barriers<T::kStages>(kv_full, slot_full, slot_free);
  __syncthreads();

  // The last kernel (dQ's conversion) may be launched once every block has started; it waits for
  // this grid to finish before it reads anything.
  launch_dependents();
  const int warpgroup = uniform_warpgroup();  // kernel/wgmma.cuh: the descriptors stay uniform
  if (warpgroup == 0) {
    // ---- The producer: K and V once, then Q, dO, LSE and D of every step into the ring ----------
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) {
      produce_steps<T>(&query_map, &grad_out_map, &key_map, &value_map, key_tile, value_tile, ring, row_data, kv_full,
                       slot_full, slot_free, lse_log2, row_delta, tile, first_step, end_step, workspace_head_rows);
    }
  } else {
    // ---- The consumers: 64 keys each -----------------------------------------------------------
    claim_registers<kConsumerRegisters>();
    if (threadIdx.x == kWarpgroupThreads) {  // the thread that stores dK and dV
      prefetch_tensor_map(&grad_key_map);
      prefetch_tensor_map(&grad_value_map);
    }
    wait_for_prerequisite();  // dQ's sum is cleared before this block's first addition
    const int consumer = warpgroup - 1;
    const int thread = threadIdx.x % kWarpgroupThreads;
    const int warp = thread / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    const int group = lane / 4;                            // accumulator rows group, group + 8 of the warp's 16
    const int quad = lane % 4;                             // accumulator columns 2·quad, 2·quad + 1 of each 8
    const int warp_key = consumer * kMmaRows + warp * 16;  // the warp's first key in the tile

    // Matrix descriptors (stage 09's README, "The matrix descriptor"). K and V as A of Sᵀ and dPᵀ
    // are K-major (a row is one key's dims): this consumer's 64 rows. Q and dO as B there are
    // K-major too; as B of dV and dK they are read MN-major (a 16-query step is 16 rows on; the
    // leading byte offset steps between dim panels), as V is in stage 09's P·V.
    const uint64_t key_descriptor = k_major_descriptor(shared_address(key_tile) + consumer * kMmaRows * kPanelRowBytes);
    const uint64_t value_descriptor =
        k_major_descriptor(shared_address(value_tile) + consumer * kMmaRows * kPanelRowBytes);
    // dQ's part: 64 queries (panel `query_panel` of dSᵀ) by 64 dims (panel `dim_panel` of K).
    const int query_panel = T::kScorePanels == 2 ? consumer : 0;
    const int dim_panel = T::kPanels == 2 ? consumer : 0;
    const uint64_t grad_key_descriptor =
        matrix_descriptor(shared_address(key_tile) + dim_panel * T::kKvPanelBytes, T::kKvPanelBytes, kSwizzleBytes);
    // Where this thread's dSᵀ pairs go: row warp_key + group (+ 8), column 8j + 2·quad of the
    // step's queries, in the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)).
    const int score_row_bytes = (warp_key + group) * kPanelRowBytes + quad * 4;

    float key_grad[kDim / 2] = {};    // dK for the consumer's 64 keys, unscaled
    float value_grad[kDim / 2] = {};  // dV

    // Sᵀ = K Qᵀ of a step, once its slot has landed, and dPᵀ = V dOᵀ: the kit's walk of S = Q·Kᵀ
    // with the keys as A and the step's queries as B, committed as two groups, so that Pᵀ's
    // exponentials run while dPᵀ is still on the tensor cores.
    float scores[T::kQueries / 2];
    float grad_probs[T::kQueries / 2];
    const auto slot_tile = [&](int step) { return ring + step % T::kStages * 2 * T::kQueryTileBytes; };
    const auto issue_products_of_keys = [&](float(&products)[T::kQueries / 2], uint64_t keys, unsigned queries) {
      issue_scores<Element, kDim, T::kQueries, T::kKvPanelBytes, T::kQueryPanelBytes>(products, keys,
                                                                                      k_major_descriptor(queries));
    };

    barrier_wait(kv_full, 0);

    // The step's query head and first query row, stepped along (the producer's division would cost
    // a reciprocal and some twenty instructions a step).
    int head = tile.first_query_head + first_step / tile.query_tiles;
    int query_base = (tile.first_query_tile + first_step % tile.query_tiles) * T::kQueries;
    const int last_query_base = (tile.first_query_tile + tile.query_tiles - 1) * T::kQueries;
    const int steps = end_step - first_step;
#pragma unroll 1
    for (int step = 0; step < steps; ++step) {
      const int slot = step % T::kStages;
      unsigned char* query_slot = slot_tile(step);
      unsigned char* grad_out_slot = query_slot + T::kQueryTileBytes;
      const float* slot_lse = row_data + slot * 2 * T::kQueries;
      const float* slot_delta = slot_lse + T::kQueries;

      // This step's dPᵀ behind its Sᵀ; then Sᵀ is done (dPᵀ may still run).
      barrier_wait(&slot_full[slot], (step / T::kStages) & 1);
      issue_products_of_keys(scores, key_descriptor, shared_address(query_slot));
      issue_products_of_keys(grad_probs, value_descriptor, shared_address(grad_out_slot));
      wgmma_wait<1>();
      fence_registers(scores);

      // EXERCISE BEGIN: Pᵀ from the Sᵀ accumulators and the LSE, masked
      // Pᵀ = 2^(s · scale · log2 e − LSE · log2 e): the exact probabilities, no max and no sum to
      // redo. scores[4j + e] is key key_base + warp_key + group + 8·(e / 2) and query
      // query_base + 8j + 2·quad + e % 2. Under the causal mask (bottom-right) a key past
      // query + Nk − Nq weighs 0; only steps whose tile crosses that diagonal test it. Keys past Nk
      // and queries past Nq need no test: TMA filled K, V, Q and dO there with zeros, and the
      // workspace's LSE of a row past Nq is +inf, so they add nothing to what is kept.
      // The loop is written twice, with and without the test, so that a step the diagonal does not
      // cross runs no compare and no select.
      const auto probabilities = [&](auto with_mask) {
#pragma unroll
        for (int j = 0; j < T::kQueries / kMmaColumns; ++j) {
          const float2 lse = *reinterpret_cast<const float2*>(slot_lse + j * kMmaColumns + 2 * quad);  // both queries
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int query = j * kMmaColumns + 2 * quad + e % 2;
            const int key = tile.key_base + warp_key + group + 8 * (e / 2);
            const bool visible = !decltype(with_mask)::value || key - (query_base + query) <= kv_seq - q_seq;
            const float row_lse = e % 2 == 0 ? lse.x : lse.y;
            scores[4 * j + e] = visible ? fast_exp2(fmaf(scores[4 * j + e], scale_log2, -row_lse)) : 0.0f;
          }
        }
      };
      if (causal && tile.key_base + kKeys - 1 - query_base > kv_seq - q_seq) {
        probabilities(std::true_type{});
      } else {
        probabilities(std::false_type{});
      }
      // EXERCISE END

      // Pᵀ as 16-bit A fragments: accumulator tiles 2j and 2j + 1 are queries 16j .. 16j + 15, the
      // depth of one wgmma of dV (stage 09's P·V trick, the kit's packing and walk). dV += Pᵀ dO goes
      // to the tensor cores at once, B = dO read MN-major from the ring slot, behind dPᵀ.
      unsigned probs[kQuerySteps][4];
      pack_probabilities<Element>(scores, probs);
      issue_values<Element, kDim>(value_grad, probs,
                                  mn_major_descriptor<T::kQueryPanelBytes>(shared_address(grad_out_slot)));

      // dSᵀ = Pᵀ ∘ (dPᵀ − D) once dPᵀ is done (dV still runs), as A fragments of dK += dSᵀ Q.
      wgmma_wait<1>();
      fence_registers(grad_probs);
      unsigned grad_scores[kQuerySteps][4];
#pragma unroll
      for (int j = 0; j < kQuerySteps; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = 8 * j + 2 * i;
          const float2 delta = *reinterpret_cast<const float2*>(slot_delta + e / 4 * kMmaColumns + 2 * quad);
          grad_scores[j][i] =
              pack_pair<Element>(scores[e] * (grad_probs[e] - delta.x), scores[e + 1] * (grad_probs[e + 1] - delta.y));
        }
      }

      // dSᵀ into shared memory for dQ while dV runs: rows group and group + 8, query pair
      // 8·(2j + i / 2) + 2·quad. Steps alternate between two buffers, so this one was last read by
      // the dQ of two steps ago, which both consumers waited for before they met at the last step.
      unsigned char* score_tile = score_tiles + step % 2 * T::kScoreTileBytes;
#pragma unroll
      for (int j = 0; j < kQuerySteps; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int column_tile = 2 * j + i / 2;  // 8-query chunk of the step
          const int row_offset = i % 2 * 8 * kPanelRowBytes;
          const int chunk = column_tile % 8 ^ group;  // (warp_key + group + 8·(i % 2)) % 8 == group
          *reinterpret_cast<unsigned*>(score_tile + column_tile / 8 * T::kScorePanelBytes + score_row_bytes +
                                       row_offset + chunk * 16) = grad_scores[j][i];
        }
      }
      // The tensor cores read it through the async proxy: fence, then meet the other consumer, whose
      // half of the keys dQ needs as well.
      fence_shared_for_async_proxy();
      sync_threads(kScoresReadyBarrier, kConsumers * kWarpgroupThreads);

      // dQ = dS K over the block's 128 keys, then dK += dSᵀ Q behind it, so that the tensor cores run
      // dK while this consumer adds dQ's part to the workspace.
      const uint64_t score_descriptor =
          mn_major_descriptor<T::kScorePanelBytes>(shared_address(score_tile) + query_panel * T::kScorePanelBytes);
      float query_grad[32];
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kKeySteps; ++k) {
        wgmma_transposed<Element>(query_grad, advance_descriptor(score_descriptor, k * kMmaDepth * kPanelRowBytes),
                                  advance_descriptor(grad_key_descriptor, k * kMmaDepth * kPanelRowBytes), k > 0);
      }
      wgmma_commit();
      issue_values<Element, kDim>(key_grad, grad_scores,
                                  mn_major_descriptor<T::kQueryPanelBytes>(shared_address(query_slot)));
      wgmma_wait<1>();  // dV and dQ are done; dK runs
      fence_registers(probs);
      fence_registers(query_grad);

      // dQ's part into the FP32 workspace (add_query_grad_part), one address a thread.
      float4* lane_part = reinterpret_cast<float4*>(
                              grad_q_sum + (static_cast<int64_t>(head) * workspace_head_rows + query_base) * kDim +
                              consumer * kMmaRows * kPanelColumns) +
                          thread;
      if constexpr (!kDeterministic) {
        add_query_grad_part(lane_part, query_grad);
      } else {
        int* turn = turns +
                    ((static_cast<int64_t>(head) * workspace_head_rows + query_base) / T::kQueries) * kConsumers +
                    consumer;
        wait_for_turn(turn, tile.key_tile_index, thread, consumer);
        add_query_grad_part(lane_part, query_grad);
        pass_turn(turn, thread, consumer);
      }

      // Once dK is done (nothing stays in flight across the loop's back edge, which ptxas would
      // answer by serializing every wgmma), the slot's Q, dO, LSE and D are no longer read, so every
      // consumer thread arrives (an arrival by one lane per warp after __syncwarp is enough for the
      // hardware, but compute-sanitizer's racecheck then reports the next bulk copy of the LSE as
      // racing with the other lanes' reads).
      wgmma_wait<0>();
      fence_registers(grad_scores);
      barrier_arrive(&slot_free[slot]);
      next_step(query_base, head, tile.first_query_tile * T::kQueries, last_query_base, T::kQueries);
    }
    // Nothing runs on the tensor cores any more (said again for ptxas, which cannot tell that the
    // loop ran).
    wgmma_wait<0>();

    // dK = scale · Σ dSᵀ Q and dV, once, by the copy engine: both consumers' last products have read
    // K and V (they meet first), so dK takes K's place in shared memory and dV V's, and one thread
    // stores both tiles (rows past Nk and columns past D are not written); it waits until the copy
    // engine has read them before the block may leave. A part of a split key tile adds its sums to
    // the tile's, which the last kernel writes.
    if (block.split_tile < 0) {
      sync_threads(kScoresReadyBarrier, kConsumers * kWarpgroupThreads);
      stage_key_grads<Element, kDim, T::kKvPanelBytes>(key_grad, value_grad, key_tile, value_tile, warp_key, group,
                                                       quad, scale);
      fence_shared_for_async_proxy();
      sync_threads(kScoresReadyBarrier, kConsumers * kWarpgroupThreads);
      if (threadIdx.x == kWarpgroupThreads) {
        store_staged_rows<T::kPanels, T::kKvPanelBytes>(&grad_key_map, key_tile, 0, tile.key_base, tile.kv_head);
        store_staged_rows<T::kPanels, T::kKvPanelBytes>(&grad_value_map, value_tile, 0, tile.key_base, tile.kv_head);
        wait_stores_read();
      }
    } else {
      add_split_key_grads<kDim>(split_grads, key_grad, value_grad, block.split_tile, consumer, thread);
    }
  }
#else
  __trap();  // never launched: the runner refuses every GPU but sm_90 (the descriptor's architecture)
#endif
}

// The split key tiles' dK = scale · (the sum of their parts) and dV, rounded to the element type:
// one float4 of the sums (two pairs, keys k and k + 8) a thread (add_split_key_grads's order).
template <typename Element, int kDim>
__global__ void write_split_key_grads_kernel(const float4* __restrict__ sums, Element* __restrict__ grad_k,
                                             Element* __restrict__ grad_v, int64_t float4s, int whole_tiles,
                                             int key_tiles, int q_heads, int kv_heads, int kv_heads_total, int q_seq,
                                             int kv_seq, int dim, bool causal, float scale) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= float4s) return;
  constexpr int kTileFloat4s = 2 * kConsumers * consumer_float4s(kDim);
  const int split_tile = static_cast<int>(index / kTileFloat4s);
  const int in_tile = static_cast<int>(index % kTileFloat4s);
  const bool keys = in_tile < kConsumers * consumer_float4s(kDim);  // dK, then dV
  const int consumer = in_tile / consumer_float4s(kDim) % kConsumers;
  const int n = in_tile % consumer_float4s(kDim) / kWarpgroupThreads;
  const int thread = in_tile % kWarpgroupThreads;
  const KeyTileWork tile =
      key_tile_work<kKeys, step_queries(kDim)>(static_cast<unsigned>(whole_tiles + split_tile), key_tiles,
                                               kv_heads_total, q_heads, kv_heads, q_seq, kv_seq, causal);
  const AccumulatorPlace place = accumulator_place(n, thread);
  const int key = tile.key_base + consumer * kMmaRows + place.row;
  const int column = place.column;
  if (column >= dim) return;
  const float4 sum = sums[index];
  const float factor = keys ? scale : 1.0f;
  Element* first = (keys ? grad_k : grad_v) + (static_cast<int64_t>(tile.kv_head) * kv_seq + key) * dim + column;
  if (key < kv_seq) *reinterpret_cast<unsigned*>(first) = pack_pair<Element>(sum.x * factor, sum.y * factor);
  if (key + 8 < kv_seq) {
    *reinterpret_cast<unsigned*>(first + 8 * dim) = pack_pair<Element>(sum.z * factor, sum.w * factor);
  }
}

// A cluster of two blocks (D = 256): blocks 2i and 2i + 1 of the grid, rank 0 and 1. The copy
// engine moves a tile from this block's shared memory into the partner's (a cluster address, from
// `mapa`) and completes its bytes on the partner's barrier, as a TMA load does on this block's.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
__device__ __forceinline__ unsigned partner_shared_address(const void* local, unsigned partner) {
  unsigned address;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(address)
               : "r"(kernel::shared_address(local)), "r"(partner));
  return address;
}
__device__ __forceinline__ void copy_shared_to_partner(unsigned destination, const void* source, unsigned bytes,
                                                       unsigned barrier) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   destination),
               "r"(kernel::shared_address(source)), "r"(bytes), "r"(barrier)
               : "memory");
}
// Every thread of both blocks: the barriers are initialized before the first remote arrival, and
// no block leaves while its partner may still write to it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The producer of D = 256, thread 0 of warpgroup 0: K and V of the block's keys and the partner's K
// for this block's dQ dims, once; then Q, the LSE and D of every step into the ring, and dO into its
// one slot (freed once both consumers' dV of the step before is done).
__device__ __forceinline__ void produce_wide_steps(const CUtensorMap* query_map, const CUtensorMap* grad_out_map,
                                                   const CUtensorMap* key_map, const CUtensorMap* value_map,
                                                   unsigned char* key_tile, unsigned char* value_tile,
                                                   unsigned char* partner_key_tile, unsigned char* query_ring,
                                                   unsigned char* grad_out_tile, float* row_data, uint64_t* kv_full,
                                                   uint64_t* query_full, uint64_t* query_free, uint64_t* grad_out_full,
                                                   uint64_t* grad_out_free, const float* lse_log2,
                                                   const float* row_delta, const KeyTileWork& pair, int key_base,
                                                   int partner_key_base, int rank, int workspace_head_rows) {
  using namespace kernel;
  using T = WideTiling;
  prefetch_tensor_map(query_map);
  prefetch_tensor_map(grad_out_map);
  prefetch_tensor_map(key_map);
  prefetch_tensor_map(value_map);
  const unsigned kv = shared_address(kv_full);
  barrier_arrive_expect_bytes(kv_full, 2 * T::kKvTileBytes + T::kPartnerKeyBytes);
  for (int panel = 0; panel < T::kPanels; ++panel) {
    copy_box_to_shared(shared_address(key_tile + panel * T::kKvPanelBytes), key_map, kv, panel * kPanelColumns,
                       key_base, pair.kv_head);
    copy_box_to_shared(shared_address(value_tile + panel * T::kKvPanelBytes), value_map, kv, panel * kPanelColumns,
                       key_base, pair.kv_head);
  }
  for (int panel = 0; panel < T::kBlockDims / kPanelColumns; ++panel) {
    copy_box_to_shared(shared_address(partner_key_tile + panel * T::kKvPanelBytes), key_map, kv,
                       rank * T::kBlockDims + panel * kPanelColumns, partner_key_base, pair.kv_head);
  }
  wait_for_prerequisite();
  for (int step = 0; step < pair.steps; ++step) {
    const int slot = step % T::kStages;
    const int head = pair.first_query_head + step / pair.query_tiles;
    const int row = (pair.first_query_tile + step % pair.query_tiles) * T::kQueries;
    if (step >= T::kStages) barrier_wait(&query_free[slot], (step / T::kStages - 1) & 1);
    unsigned char* query_slot = query_ring + slot * T::kQueryTileBytes;
    const unsigned full = shared_address(&query_full[slot]);
    barrier_arrive_expect_bytes(&query_full[slot], T::kQueryTileBytes + 2 * T::kRowBytes);
    for (int panel = 0; panel < T::kPanels; ++panel) {
      copy_box_to_shared(shared_address(query_slot + panel * T::kQueryPanelBytes), query_map, full,
                         panel * kPanelColumns, row, head);
    }
    const int64_t first = static_cast<int64_t>(head) * workspace_head_rows + row;
    float* slot_rows = row_data + slot * 2 * T::kQueries;
    copy_bytes_to_shared(shared_address(slot_rows), lse_log2 + first, T::kRowBytes, full);
    copy_bytes_to_shared(shared_address(slot_rows + T::kQueries), row_delta + first, T::kRowBytes, full);

    if (step >= 1) barrier_wait(grad_out_free, (step - 1) & 1);
    const unsigned grad_out_full_address = shared_address(grad_out_full);
    barrier_arrive_expect_bytes(grad_out_full, T::kQueryTileBytes);
    for (int panel = 0; panel < T::kPanels; ++panel) {
      copy_box_to_shared(shared_address(grad_out_tile + panel * T::kQueryPanelBytes), grad_out_map,
                         grad_out_full_address, panel * kPanelColumns, row, head);
    }
  }
}

// D = 256 (WideTiling): a cluster of two blocks owns 128 keys of one K/V head, 64 a block; block r's
// consumer c computes Sᵀ and dPᵀ of queries 32c .. 32c + 31 of each step, dK and dV of dims
// 128c .. 128c + 127, and dQ of dims 128r + 64c .. 128r + 64c + 63 over the cluster's 128 keys:
//
//   product          M × N × K (consumer c)                 A from                 B from
//   Sᵀ  = K Qᵀ       64 keys × 32 queries × 256 dims         shared (K, K-major)    shared (Q rows 32c .., K-major)
//   dPᵀ = V dOᵀ      64 keys × 32 queries × 256 dims         shared (V, K-major)    shared (dO rows 32c .., K-major)
//   dV += Pᵀ dO      64 keys × 128 dims × 64 queries         shared (Pᵀ, K-major)   shared (dO, MN-major)
//   dK += dSᵀ Q      64 keys × 128 dims × 64 queries         shared (dSᵀ, K-major)  shared (Q, MN-major)
//   dQ  = dS K       64 queries × 64 dims × 128 keys         shared (both dSᵀ, MN)  shared (both K, MN-major)
//
// A step, for each consumer: Sᵀ and dPᵀ issued; Pᵀ while dPᵀ runs, stored; the consumers meet; dV
// issued; dSᵀ while dV runs, stored here and in the partner; the consumers meet; dK issued; once dV
// is done, dO's slot is freed; once the partner's dSᵀ has landed, dQ issued; once dK is done, Q's
// slot is freed; dQ's atomics.
template <typename Element, int kDim, bool kDeterministic>
__global__ void __launch_bounds__(kThreads, 1)
    wide_backward_kernel(const __grid_constant__ CUtensorMap query_map,
                         const __grid_constant__ CUtensorMap grad_out_map, const __grid_constant__ CUtensorMap key_map,
                         const __grid_constant__ CUtensorMap value_map,
                         const __grid_constant__ CUtensorMap grad_key_map,
                         const __grid_constant__ CUtensorMap grad_value_map, const float* __restrict__ lse_log2,
                         const float* __restrict__ row_delta, float* __restrict__ grad_q_sum, int* __restrict__ turns,
                         int q_seq, int kv_seq, int workspace_head_rows, int key_pairs, int q_heads, int kv_heads,
                         int kv_heads_total, bool causal, float scale, float scale_log2) {
#if FA_STAGE13_DEVICE_CODE
  using T = WideTiling;
  static_assert(kDim == T::kDim, "the D = 256 bucket");
  using namespace kernel;
  constexpr int kQuerySteps = T::kQueries / kMmaDepth;  // 16-query steps of dV and dK
  constexpr int kKeySteps = T::kBlockKeys / kMmaDepth;  // 16-key steps of dQ, per block of the pair

  // Shared memory: K, V, the partner's K (this block's dQ dims), the ring (slot s: Q), dO, two
  // buffers each of Pᵀ, dSᵀ and the partner's dSᵀ, the ring's rows, the barriers.
  extern __shared__ unsigned char shared_memory[];
  unsigned char* shared =
      shared_memory + ((kSwizzleBytes - shared_address(shared_memory) % kSwizzleBytes) % kSwizzleBytes);
  unsigned char* key_tile = shared;
  unsigned char* value_tile = key_tile + T::kKvTileBytes;
  unsigned char* partner_key_tile = value_tile + T::kKvTileBytes;
  unsigned char* query_ring = partner_key_tile + T::kPartnerKeyBytes;
  unsigned char* grad_out_tile = query_ring + T::kStages * T::kQueryTileBytes;
  unsigned char* prob_tiles = grad_out_tile + T::kQueryTileBytes;
  unsigned char* grad_score_tiles = prob_tiles + 2 * T::kScoreTileBytes;
  unsigned char* partner_score_tiles = grad_score_tiles + 2 * T::kScoreTileBytes;
  float* row_data = reinterpret_cast<float*>(partner_score_tiles + 2 * T::kScoreTileBytes);
  uint64_t* barriers = reinterpret_cast<uint64_t*>(row_data + T::kStages * 2 * T::kQueries);
  uint64_t* kv_full = barriers;
  uint64_t* query_full = barriers + 1;             // [kStages]
  uint64_t* query_free = query_full + T::kStages;  // [kStages]
  uint64_t* grad_out_full = query_free + T::kStages;
  uint64_t* grad_out_free = grad_out_full + 1;
  uint64_t* partner_scores_full = grad_out_free + 1;  // [2]: the partner's dSᵀ of a step has landed

  // Which 128 keys the cluster owns, and the steps over the query tiles that see them (the lower
  // block's, so that both blocks walk the same steps); this block's 64 of them.
  const int rank = static_cast<int>(cluster_rank());
  const int partner = 1 - rank;
  const KeyTileWork pair = key_tile_work<T::kWorkKeys, T::kQueries>(
      blockIdx.x / T::kClusterBlocks, key_pairs, kv_heads_total, q_heads, kv_heads, q_seq, kv_seq, causal);
  const int key_base = pair.key_base + rank * T::kBlockKeys;
  const int partner_key_base = pair.key_base + partner * T::kBlockKeys;

  if (threadIdx.x == 0) {
    init_ring_barriers<T::kStages>(kv_full, query_full, query_free);
    barrier_init(grad_out_full, 1);
    barrier_init(grad_out_free, kConsumers * kWarpgroupThreads);
    barrier_init(&partner_scores_full[0], 1);
    barrier_init(&partner_scores_full[1], 1);
    fence_barrier_init();
  }
  cluster_sync();
  launch_dependents();
  const int warpgroup = uniform_warpgroup();
  if (warpgroup == 0) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) {
      produce_wide_steps(&query_map, &grad_out_map, &key_map, &value_map, key_tile, value_tile, partner_key_tile,
                         query_ring, grad_out_tile, row_data, kv_full, query_full, query_free, grad_out_full,
                         grad_out_free, lse_log2, row_delta, pair, key_base, partner_key_base, rank,
                         workspace_head_rows);
    }
  } else {
    claim_registers<kConsumerRegisters>();
    if (threadIdx.x == kWarpgroupThreads) {  // the thread that stores dK and dV
      prefetch_tensor_map(&grad_key_map);
      prefetch_tensor_map(&grad_value_map);
    }
    wait_for_prerequisite();
    const int consumer = warpgroup - 1;
    const int thread = threadIdx.x % kWarpgroupThreads;
    const int warp = thread / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    const int group = lane / 4;
    const int quad = lane % 4;
    const int warp_key = warp * 16;                                     // the warp's first key of the block's 64
    const int consumer_query = consumer * T::kConsumerQueries;          // the consumer's first query of a step
    const int dim_panel = consumer * T::kConsumerDims / kPanelColumns;  // its first 64-dim panel of dK, dV
    const int grad_query_panel = rank * kConsumers + consumer;          // its 64 dims of dQ

    const uint64_t key_descriptor = k_major_descriptor(shared_address(key_tile));
    const uint64_t value_descriptor = k_major_descriptor(shared_address(value_tile));
    // This thread's score pairs in a 64 x 64 tile of Pᵀ or dSᵀ: row warp_key + group (+ 8), query
    // pair 32c + 8j + 2·quad, in the 128-byte swizzle (16-byte chunk k of row r at chunk k ^ (r % 8)).
    const int score_row_bytes = (warp_key + group) * kPanelRowBytes + quad * 4;
    // The partner's copy of this block's dSᵀ, and the barriers that say it has landed there.
    const unsigned partner_scores = partner_shared_address(partner_score_tiles, partner);
    const unsigned partner_scores_barriers = partner_shared_address(partner_scores_full, partner);
    const bool sender = consumer == 0 && thread == 0;  // issues the copy of dSᵀ, expects the partner's

    float key_grad[T::kConsumerDims / 2] = {};
    float value_grad[T::kConsumerDims / 2] = {};
    float scores[T::kConsumerQueries / 2];
    float grad_probs[T::kConsumerQueries / 2];

    // Sᵀ or dPᵀ of the consumer's queries: the keys (A) against the slot's rows (B), 16 dims a step.
    const auto issue_products_of_keys = [&](float(&products)[T::kConsumerQueries / 2], uint64_t keys, unsigned rows) {
      const uint64_t row_descriptor = k_major_descriptor(rows + consumer_query * kPanelRowBytes);
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kDim / kMmaDepth; ++step) {
        wgmma_narrow<Element>(products, advance_descriptor(keys, dim_step_offset(step, T::kKvPanelBytes)),
                              advance_descriptor(row_descriptor, dim_step_offset(step, T::kQueryPanelBytes)), step > 0);
      }
      wgmma_commit();
    };
    // dV += Pᵀ dO or dK += dSᵀ Q over the consumer's dims: A the score tile, 16 queries a step.
    const auto issue_key_grads = [&](float(&grads)[T::kConsumerDims / 2], unsigned score_tile, unsigned rows) {
      const uint64_t score_descriptor = k_major_descriptor(score_tile);
      const uint64_t row_descriptor = mn_major_descriptor<T::kQueryPanelBytes>(rows + dim_panel * T::kQueryPanelBytes);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kQuerySteps; ++k) {
        wgmma_half_dims<Element>(grads, advance_descriptor(score_descriptor, dim_step_offset(k, T::kScoreTileBytes)),
                                 advance_descriptor(row_descriptor, k * kMmaDepth * kPanelRowBytes));
      }
      wgmma_commit();
    };
    // The consumer's part of dQ = dS K: its 64 dims over this block's keys (its dSᵀ, its K's panel)
    // and the partner's (the partner's dSᵀ, the partner's K), 16 keys a step.
    const auto issue_query_grad = [&](float(&part)[32], unsigned score_tile, unsigned partner_score_tile) {
      const uint64_t sources[2][2] = {{mn_major_descriptor<T::kScoreTileBytes>(score_tile),
                                       matrix_descriptor(shared_address(key_tile) + grad_query_panel * T::kKvPanelBytes,
                                                         T::kKvPanelBytes, kSwizzleBytes)},
                                      {mn_major_descriptor<T::kScoreTileBytes>(partner_score_tile),
                                       matrix_descriptor(shared_address(partner_key_tile) + consumer * T::kKvPanelBytes,
                                                         T::kKvPanelBytes, kSwizzleBytes)}};
      wgmma_fence();
#pragma unroll
      for (int block = 0; block < T::kClusterBlocks; ++block) {
#pragma unroll
        for (int k = 0; k < kKeySteps; ++k) {
          wgmma_transposed<Element>(part, advance_descriptor(sources[block][0], k * kMmaDepth * kPanelRowBytes),
                                    advance_descriptor(sources[block][1], k * kMmaDepth * kPanelRowBytes),
                                    block > 0 || k > 0);
        }
      }
      wgmma_commit();
    };
    // The consumer's score pairs into a tile: pair i of 8-query chunk j, rows group and group + 8.
    const auto store_pairs = [&](unsigned char* tile, const unsigned(&pairs)[T::kConsumerQueries / 8][2]) {
#pragma unroll
      for (int j = 0; j < T::kConsumerQueries / kMmaColumns; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int chunk = (consumer_query / kMmaColumns + j) ^ group;
          *reinterpret_cast<unsigned*>(tile + score_row_bytes + half * 8 * kPanelRowBytes + chunk * 16) =
              pairs[j][half];
        }
      }
    };

    barrier_wait(kv_full, 0);

    int head = pair.first_query_head;
    int query_base = pair.first_query_tile * T::kQueries;
    const int last_query_base = (pair.first_query_tile + pair.query_tiles - 1) * T::kQueries;
#pragma unroll 1
    for (int step = 0; step < pair.steps; ++step) {
      const int slot = step % T::kStages;
      unsigned char* query_slot = query_ring + slot * T::kQueryTileBytes;
      const float* slot_lse = row_data + slot * 2 * T::kQueries;
      const float* slot_delta = slot_lse + T::kQueries;
      // Steps alternate between two buffers of Pᵀ, dSᵀ and the partner's dSᵀ: this one was last read
      // by the products of two steps ago, which both consumers waited for before they met in the
      // last step (and the partner before it sent the last step's dSᵀ).
      const int buffer = step % 2;
      unsigned char* prob_tile = prob_tiles + buffer * T::kScoreTileBytes;
      unsigned char* grad_score_tile = grad_score_tiles + buffer * T::kScoreTileBytes;

      barrier_wait(&query_full[slot], (step / T::kStages) & 1);
      barrier_wait(grad_out_full, step & 1);
      issue_products_of_keys(scores, key_descriptor, shared_address(query_slot));
      issue_products_of_keys(grad_probs, value_descriptor, shared_address(grad_out_tile));
      wgmma_wait<1>();
      fence_registers(scores);

      // Pᵀ = 2^(s · scale · log2 e − LSE · log2 e): scores[4j + e] is key key_base + warp_key + group
      // + 8·(e / 2) and query query_base + consumer_query + 8j + 2·quad + e % 2.
      const auto probabilities = [&](auto with_mask) {
#pragma unroll
        for (int j = 0; j < T::kConsumerQueries / kMmaColumns; ++j) {
          const float2 lse = *reinterpret_cast<const float2*>(slot_lse + consumer_query + j * kMmaColumns + 2 * quad);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int query = consumer_query + j * kMmaColumns + 2 * quad + e % 2;
            const int key = key_base + warp_key + group + 8 * (e / 2);
            const bool visible = !decltype(with_mask)::value || key - (query_base + query) <= kv_seq - q_seq;
            const float row_lse = e % 2 == 0 ? lse.x : lse.y;
            scores[4 * j + e] = visible ? fast_exp2(fmaf(scores[4 * j + e], scale_log2, -row_lse)) : 0.0f;
          }
        }
      };
      if (causal && key_base + T::kBlockKeys - 1 - query_base > kv_seq - q_seq) {
        probabilities(std::true_type{});
      } else {
        probabilities(std::false_type{});
      }
      unsigned pairs[T::kConsumerQueries / 8][2];
#pragma unroll
      for (int j = 0; j < T::kConsumerQueries / kMmaColumns; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          pairs[j][half] = pack_pair<Element>(scores[4 * j + 2 * half], scores[4 * j + 2 * half + 1]);
        }
      }
      store_pairs(prob_tile, pairs);
      fence_shared_for_async_proxy();
      sync_threads(kScoresReadyBarrier, kConsumers * kWarpgroupThreads);
      issue_key_grads(value_grad, shared_address(prob_tile), shared_address(grad_out_tile));

      // dSᵀ = Pᵀ ∘ (dPᵀ − D) once dPᵀ is done (dV runs).
      wgmma_wait<1>();
      fence_registers(grad_probs);
#pragma unroll
      for (int j = 0; j < T::kConsumerQueries / kMmaColumns; ++j) {
        const float2 delta = *reinterpret_cast<const float2*>(slot_delta + consumer_query + j * kMmaColumns + 2 * quad);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int e = 4 * j + 2 * half;
          pairs[j][half] =
              pack_pair<Element>(scores[e] * (grad_probs[e] - delta.x), scores[e + 1] * (grad_probs[e + 1] - delta.y));
        }
      }
      store_pairs(grad_score_tile, pairs);
      fence_shared_for_async_proxy();
      sync_threads(kScoresReadyBarrier, kConsumers * kWarpgroupThreads);
      // The whole dSᵀ to the partner's buffer (which it read two steps ago, before it sent its dSᵀ of
      // the last step, which this block has waited for); this block will wait for the partner's.
      if (sender) {
        copy_shared_to_partner(partner_scores + buffer * T::kScoreTileBytes, grad_score_tile, T::kScoreTileBytes,
                               partner_scores_barriers + buffer * 8);
        barrier_arrive_expect_bytes(&partner_scores_full[buffer], T::kScoreTileBytes);
      }

      // dK behind dV; dO's slot is free once dV is done; dQ once the partner's dSᵀ has landed; Q's
      // slot is free once dK is done; dQ's atomics.
      issue_key_grads(key_grad, shared_address(grad_score_tile), shared_address(query_slot));
      wgmma_wait<1>();
      fence_registers(value_grad);
      barrier_arrive(grad_out_free);
      barrier_wait(&partner_scores_full[buffer], (step / 2) & 1);
      float query_grad[32];
      issue_query_grad(query_grad, shared_address(grad_score_tile),
                       shared_address(partner_score_tiles + buffer * T::kScoreTileBytes));
      wgmma_wait<1>();
      fence_registers(key_grad);
      barrier_arrive(&query_free[slot]);
      wgmma_wait<0>();
      fence_registers(query_grad);
      float4* lane_part = reinterpret_cast<float4*>(
                              grad_q_sum + (static_cast<int64_t>(head) * workspace_head_rows + query_base) * kDim +
                              grad_query_panel * kMmaRows * kPanelColumns) +
                          thread;
      if constexpr (!kDeterministic) {
        add_query_grad_part(lane_part, query_grad);
      } else {
        int* turn = turns +
                    ((static_cast<int64_t>(head) * workspace_head_rows + query_base) / T::kQueries) * T::kPanels +
                    grad_query_panel;
        wait_for_turn(turn, pair.key_tile_index, thread, consumer);
        add_query_grad_part(lane_part, query_grad);
        pass_turn(turn, thread, consumer);
      }
      next_step(query_base, head, pair.first_query_tile * T::kQueries, last_query_base, T::kQueries);
    }
    wgmma_wait<0>();

    // dK = scale · Σ dSᵀ Q and dV for the consumer's dims, by the copy engine as at D <= 128: staged in
    // K's and V's places once both consumers' last products are done (the partner block loaded its
    // own copy of the K it reads), one thread stores both tiles.
    sync_threads(kScoresReadyBarrier, kConsumers * kWarpgroupThreads);
    constexpr int kConsumerPanels = T::kConsumerDims / kPanelColumns;
    stage_key_grads<Element, T::kConsumerDims, T::kKvPanelBytes>(
        key_grad, value_grad, key_tile + consumer * kConsumerPanels * T::kKvPanelBytes,
        value_tile + consumer * kConsumerPanels * T::kKvPanelBytes, warp_key, group, quad, scale);
    fence_shared_for_async_proxy();
    sync_threads(kScoresReadyBarrier, kConsumers * kWarpgroupThreads);
    if (threadIdx.x == kWarpgroupThreads) {
      store_staged_rows<T::kPanels, T::kKvPanelBytes>(&grad_key_map, key_tile, 0, key_base, pair.kv_head);
      store_staged_rows<T::kPanels, T::kKvPanelBytes>(&grad_value_map, value_tile, 0, key_base, pair.kv_head);
      wait_stores_read();
    }
  }
  cluster_sync();
#else
  __trap();
#endif
}

// The rows of each query head in the workspaces: Nq rounded up to whole tiles of any Br.
int64_t workspace_head_rows(const Problem& problem) {
  return (problem.q_seq + kWorkspaceRows - 1) / kWorkspaceRows * kWorkspaceRows;
}

int bucket_of(int64_t dim) { return dim <= 64 ? 64 : dim <= 128 ? 128 : 256; }

// This stage's own kernels take D a multiple of 8; stage 11 takes the rest.
bool own_kernels_take(const Problem& problem) { return problem.dim <= kMaxDim && problem.dim % kAlignElements == 0; }

// How many key tiles of a problem may be split in the last wave (split_last_wave): none at D = 256 or
// where a tile has too few steps to split; under the mask only where there are fewer tiles than SMs
// (launch); else up to kMaxSplitTiles.
int64_t most_split_tiles(const Problem& problem) {
  const int queries = step_queries(static_cast<int>(problem.dim));
  const int64_t steps = problem.group_size() * ((problem.q_seq + queries - 1) / queries);
  if (bucket_of(problem.dim) > 128 || steps / 2 < wgmma_backward::kMinPartSteps) return 0;
  const int64_t tiles = (problem.kv_seq + kKeys - 1) / kKeys * problem.kv_heads_total();
  if (problem.causal) return tiles < kMaxSplitTiles ? tiles : 0;
  return std::min<int64_t>(kMaxSplitTiles, tiles);
}

// The workspace: dQ's FP32 sum, the split key tiles' FP32 dK and dV, the LSE in log2 units, D, and
// the turn counters of the deterministic mode (one per 64 x 64 part of dQ's sum: per consumer of
// each query tile at D <= 128, per dims panel at D = 256).
struct Workspace {
  int64_t grad_q_floats;
  int64_t split_floats;
  int64_t row_floats;
  int64_t turn_count;
  int64_t bytes() const { return (grad_q_floats + split_floats + 2 * row_floats + turn_count) * 4; }
};

Workspace workspace_layout(const Problem& problem) {
  const int64_t rows = problem.q_heads_total() * workspace_head_rows(problem);
  const int bucket = bucket_of(problem.dim);
  return {rows * bucket, most_split_tiles(problem) * 2 * kKeys * bucket, rows,
          rows / kMmaRows * (bucket > 128 ? WideTiling::kPanels : kConsumers)};
}

template <typename Element>
StageDescriptor fallback_stage() {
  return std::is_same_v<Element, __half> ? backward_fp16() : backward_bf16();
}

int64_t workspace_bytes(const Problem& problem, Pass pass) {
  if (pass != Pass::backward) return overlap_fp16().workspace_bytes(problem, pass);  // stage 10's forward
  const int64_t fallback = backward_fp16().workspace_bytes(problem, pass);
  return own_kernels_take(problem) ? std::max(workspace_layout(problem).bytes(), fallback) : fallback;
}

// A launch that may start while the kernel before it in the stream still runs (programmatic
// dependent launch): the kernel calls wait_for_prerequisite() before it reads what that one
// writes, and the one before calls launch_dependents() to let it start (kernel/dependent_launch.cuh).
// `cluster_blocks` > 1 launches the blocks in clusters of that many (neighbours in the grid).
struct EarlyLaunch {
  EarlyLaunch(unsigned blocks, int threads, int shared_bytes, cudaStream_t stream, unsigned cluster_blocks = 1) {
    attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[0].val.programmaticStreamSerializationAllowed = 1;
    attributes[1].id = cudaLaunchAttributeClusterDimension;
    attributes[1].val.clusterDim.x = cluster_blocks;
    attributes[1].val.clusterDim.y = 1;
    attributes[1].val.clusterDim.z = 1;
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = static_cast<std::size_t>(shared_bytes);
    config.stream = stream;
    config.attrs = attributes;
    config.numAttrs = cluster_blocks > 1 ? 2 : 1;
  }
  EarlyLaunch(const EarlyLaunch&) = delete;  // config points at attributes
  EarlyLaunch& operator=(const EarlyLaunch&) = delete;
  cudaLaunchAttribute attributes[2]{};
  cudaLaunchConfig_t config{};
};

template <typename Element, int kDim, bool kDeterministic>
Status launch(const BackwardArgs& args) {
  constexpr bool kWide = kDim > 128;
  using T = std::conditional_t<kWide, WideTiling, Tiling<kDim>>;
  const Problem& problem = args.problem;
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  const Workspace layout = workspace_layout(problem);
  float* grad_q_sum = static_cast<float*>(args.workspace);
  float* split_sums = grad_q_sum + layout.grad_q_floats;
  float* lse_log2 = split_sums + layout.split_floats;
  float* row_delta = lse_log2 + layout.row_floats;
  int* turns = reinterpret_cast<int*>(row_delta + layout.row_floats);
  const int head_rows = static_cast<int>(workspace_head_rows(problem));

  // Tiles of Br query rows (Q, dO) and of a block's keys (K, V, and dK, dV, which the copy engine
  // stores as it loads K and V).
  const auto encode_query_tiles = [&](CUtensorMap& map, const void* base) {
    return kernel::encode_matrix_stack(map, kBf16, base, problem.dim, problem.q_seq, problem.q_heads_total(),
                                       kPanelColumns, T::kQueries);
  };
  const auto encode_key_tiles = [&](CUtensorMap& map, const void* base) {
    return kernel::encode_matrix_stack(map, kBf16, base, problem.dim, problem.kv_seq, problem.kv_heads_total(),
                                       kPanelColumns, T::kBlockKeys);
  };
  CUtensorMap query_map{};
  CUtensorMap grad_out_map{};
  CUtensorMap key_map{};
  CUtensorMap value_map{};
  CUtensorMap grad_key_map{};
  CUtensorMap grad_value_map{};
  FA_STATUS_TRY(encode_query_tiles(query_map, args.q));
  FA_STATUS_TRY(encode_query_tiles(grad_out_map, args.grad_o));
  FA_STATUS_TRY(encode_key_tiles(key_map, args.k));
  FA_STATUS_TRY(encode_key_tiles(value_map, args.v));
  FA_STATUS_TRY(encode_key_tiles(grad_key_map, args.grad_k));
  FA_STATUS_TRY(encode_key_tiles(grad_value_map, args.grad_v));

  // A block per (key tile, K/V head); at D = 256 a cluster per (pair of key tiles, K/V head). At
  // D <= 128 the last wave's key tiles may be split (not in the deterministic mode, whose turns go
  // by whole key tiles).
  const int64_t key_tiles = (problem.kv_seq + T::kWorkKeys - 1) / T::kWorkKeys;
  const int64_t tiles = key_tiles * problem.kv_heads_total();
  LastWave wave{};
  wave.split.whole_tiles = static_cast<int>(tiles);
  if constexpr (!kWide && !kDeterministic) {
    int device = 0;
    int sms = 0;
    FA_CUDA_TRY(cudaGetDevice(&device));
    FA_STATUS_TRY(multiprocessor_count(device, &sms));
    // Under the mask a launch of more tiles than SMs ends on its lightest tiles (the launch order);
    // with fewer, all are split, each in parts as long as the plan's (its heaviest tiles in more).
    if (layout.split_floats > 0 && (!problem.causal || tiles < sms)) {
      const int q_seq = static_cast<int>(problem.q_seq);
      const int kv_seq = static_cast<int>(problem.kv_seq);
      const int q_heads = static_cast<int>(problem.q_heads);
      const int kv_heads = static_cast<int>(problem.kv_heads);
      const int kv_heads_total = static_cast<int>(problem.kv_heads_total());
      const int tiles_per_head = static_cast<int>(key_tiles);
      const bool causal = problem.causal;
      wave = split_last_wave(tiles, sms, [&](int64_t index) {
        return key_tile_work<kKeys, T::kQueries>(static_cast<unsigned>(index), tiles_per_head, kv_heads_total, q_heads,
                                                 kv_heads, q_seq, kv_seq, causal)
            .steps;
      });
    }
  }
  const int64_t blocks = wave.blocks() * T::kClusterBlocks;
  FA_STATUS_TRY(check_grid(blocks));

  // 1. D_i = rowsum(dO ∘ O) and the LSE in log2 units; dQ's sum cleared (and the turns or the split
  // tiles' sums, first, so that the preprocessing is the kernel just before the backward's: it may
  // launch early).
  if constexpr (kDeterministic) {
    FA_CUDA_TRY(cudaMemsetAsync(turns, 0, static_cast<std::size_t>(layout.turn_count) * 4, args.stream));
  }
  const int64_t split_float4s = int64_t{wave.split.split_tiles} * 2 * kKeys * kDim / 4;
  if (split_float4s > 0) {
    FA_CUDA_TRY(cudaMemsetAsync(split_sums, 0, static_cast<std::size_t>(split_float4s) * 16, args.stream));
  }
  constexpr int kPrepareWarps = 8;
  constexpr int kRowsPerWarp = kWarpSize / (kDim / 8);
  const int64_t workspace_rows = layout.row_floats;
  const int64_t prepare_warps = (workspace_rows + kRowsPerWarp - 1) / kRowsPerWarp;
  row_prepare_kernel<Element, kDim><<<static_cast<unsigned>((prepare_warps + kPrepareWarps - 1) / kPrepareWarps),
                                      kPrepareWarps * kWarpSize, 0, args.stream>>>(
      static_cast<const Element*>(args.o), static_cast<const Element*>(args.grad_o), args.lse, lse_log2, row_delta,
      grad_q_sum, workspace_rows, static_cast<int>(problem.q_seq), head_rows, static_cast<int>(problem.dim));
  FA_LAUNCH_TRY();

  // 2. dK, dV, and dQ's shares.
  const float scale = softmax_scale(problem);
  const EarlyLaunch backward_launch(static_cast<unsigned>(blocks), kThreads, T::kSharedBytes, args.stream,
                                    T::kClusterBlocks);
  if constexpr (kWide) {
    const auto kernel = &wide_backward_kernel<Element, kDim, kDeterministic>;
    FA_STATUS_TRY(opt_in_shared_memory(kernel, T::kSharedBytes));
    FA_CUDA_TRY(cudaLaunchKernelEx(
        &backward_launch.config, kernel, query_map, grad_out_map, key_map, value_map, grad_key_map, grad_value_map,
        lse_log2, row_delta, grad_q_sum, turns, static_cast<int>(problem.q_seq), static_cast<int>(problem.kv_seq),
        head_rows, static_cast<int>(key_tiles), static_cast<int>(problem.q_heads), static_cast<int>(problem.kv_heads),
        static_cast<int>(problem.kv_heads_total()), problem.causal, scale, scale * kernel::kLog2e));
  } else {
    const auto kernel = &backward_kernel<Element, kDim, kDeterministic>;
    FA_STATUS_TRY(opt_in_shared_memory(kernel, T::kSharedBytes));
    FA_CUDA_TRY(cudaLaunchKernelEx(
        &backward_launch.config, kernel, query_map, grad_out_map, key_map, value_map, grad_key_map, grad_value_map,
        lse_log2, row_delta, grad_q_sum, turns, reinterpret_cast<float4*>(split_sums), static_cast<int>(problem.q_seq),
        static_cast<int>(problem.kv_seq), head_rows, static_cast<int>(key_tiles), static_cast<int>(problem.q_heads),
        static_cast<int>(problem.kv_heads), static_cast<int>(problem.kv_heads_total()), wave.split, problem.causal,
        scale, scale * kernel::kLog2e));
  }

  // 3. dQ = scale · the sum, rounded to the element type.
  constexpr int kConvertThreads = 256;
  const int64_t pairs = layout.grad_q_floats / 8;
  constexpr int kConvertBlockPairs = kConvertThreads * kConvertPairs;
  const EarlyLaunch convert_launch(static_cast<unsigned>((pairs + kConvertBlockPairs - 1) / kConvertBlockPairs),
                                   kConvertThreads, 0, args.stream);
  FA_CUDA_TRY(cudaLaunchKernelEx(&convert_launch.config, &scale_grad_query_kernel<Element, kDim>,
                                 reinterpret_cast<const float4*>(grad_q_sum), static_cast<Element*>(args.grad_q), pairs,
                                 static_cast<int>(problem.q_seq), head_rows, static_cast<int>(problem.dim), scale));
  // 4. dK and dV of the split key tiles.
  if (split_float4s > 0) {
    write_split_key_grads_kernel<Element, kDim>
        <<<static_cast<unsigned>((split_float4s + kConvertThreads - 1) / kConvertThreads), kConvertThreads, 0,
           args.stream>>>(reinterpret_cast<const float4*>(split_sums), static_cast<Element*>(args.grad_k),
                          static_cast<Element*>(args.grad_v), split_float4s, wave.split.whole_tiles,
                          static_cast<int>(key_tiles), static_cast<int>(problem.q_heads),
                          static_cast<int>(problem.kv_heads), static_cast<int>(problem.kv_heads_total()),
                          static_cast<int>(problem.q_seq), static_cast<int>(problem.kv_seq),
                          static_cast<int>(problem.dim), problem.causal, scale);
    FA_LAUNCH_TRY();
  }
  return Status();
}

// The runner has checked the problem and the GPU (exactly sm_90) against the descriptor.
template <typename Element>
Status backward(const BackwardArgs& args) {
  if (args.q == nullptr || args.k == nullptr || args.v == nullptr || args.o == nullptr || args.grad_o == nullptr ||
      args.lse == nullptr || args.grad_q == nullptr || args.grad_k == nullptr || args.grad_v == nullptr ||
      args.workspace == nullptr) {
    return Status::unsupported("the backward pass needs Q, K, V, O, dO, LSE, dQ, dK, dV and its workspace");
  }
  // TMA reads rows of whole 16-byte chunks from 16-byte aligned tensors, D is read 16 bytes at a
  // time, and dQ, dK, dV are stored in
  // pairs: anything else is stage 11's.
  if (!own_kernels_take(args.problem) || !all_aligned16({args.q, args.k, args.v, args.o, args.grad_o, args.grad_q,
                                                         args.grad_k, args.grad_v, args.workspace})) {
    return fallback_stage<Element>().backward(args);
  }
  // The deterministic mode (fa/deterministic.hpp): dQ's additions in key order (README: what it
  // costs).
  const bool deterministic = deterministic_backward();
  const auto with_bucket = [&](auto bucket) {
    constexpr int kDim = decltype(bucket)::value;
    return deterministic ? launch<Element, kDim, true>(args) : launch<Element, kDim, false>(args);
  };
  return dispatch_head_dim<64, 128, 256>(args.problem.dim, with_bucket);
}

StageDescriptor describe(Precision precision, ForwardFn forward_function, BackwardFn backward_function,
                         const char* title) {
  StageDescriptor stage;
  stage.id = "13_wgmma_backward";
  stage.title = title;
  stage.backend = Backend::cuda;
  stage.precision = precision;
  stage.forward = forward_function;
  stage.backward = backward_function;
  stage.workspace_bytes = &workspace_bytes;
  stage.max_dim = kMaxDim;
  stage.architecture = {90, true};  // sm_90a: wgmma and setmaxnreg
  stage.features = {/*causal=*/true, /*grouped=*/true, /*rectangular=*/true, /*lse=*/true, /*backward=*/true};
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace

StageDescriptor wgmma_backward_fp16() {
  return describe(
      Precision::fp16, overlap_fp16().forward, &backward<__half>,
      "the backward pass on wgmma: TMA ring, dK and dV in accumulators, dQ by 16-byte atomics (FP16, sm_90a)");
}

StageDescriptor wgmma_backward_bf16() {
  return describe(
      Precision::bf16, overlap_bf16().forward, &backward<__nv_bfloat16>,
      "the backward pass on wgmma: TMA ring, dK and dV in accumulators, dQ by 16-byte atomics (BF16, sm_90a)");
}

}  // namespace fa::stages
