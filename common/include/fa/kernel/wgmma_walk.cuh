// Attention's two products on wgmma, over tiles in 128-byte-swizzled 64-column panels (taught in
// stage 09's README: "The matrix descriptor", "The wgmma accumulator layout, and why it is also the
// A layout of P·V", "The 128-byte swizzle, beside stage 08's XOR swizzle"): the tile geometry, the
// descriptor walk of S = Q·Kᵀ and of O += P·V (P packed as its register A operand:
// accumulator_softmax.cuh). Stages 10 and 12 (and every later Hopper stage) compose these; stage 09
// writes P·V out once, as its lesson.
// sm_90a only (wgmma.cuh).
#pragma once

#include <cstdint>

#include "fa/kernel/mbarrier.cuh"
#include "fa/kernel/swizzle.cuh"
#include "fa/kernel/wgmma.cuh"

namespace fa::kernel {

constexpr int kMmaRows = 64;         // the M of every wgmma: the query rows of one warpgroup
constexpr int kMmaDepth = 16;        // the K of a 16-bit wgmma: 16 dims for QKᵀ, 16 keys for PV
constexpr int kMmaColumns = 8;       // columns per accumulator tile (the mma.m16n8 layout of stage 08)
constexpr int kPanelColumns = 64;    // one 128-byte swizzled row: a TMA box's width
constexpr int kPanelRowBytes = 128;  // ... in bytes
// 1024 bytes: the 128-byte swizzle's period (it permutes the 16-byte chunks of every kSwizzleRows
// rows, as stage 08's swizzle does); every tile starts on such a boundary.
constexpr int kSwizzleBytes = kSwizzleRows * kPanelRowBytes;

// The descriptor walk of a K-major operand (Q or K, whose rows hold their head-dim values
// contiguously): a 16-dim step is 32 bytes further along the 128-byte row, and a new panel (of
// `panel_bytes`) every four steps.
__device__ __forceinline__ unsigned dim_step_offset(int step, int panel_bytes) {
  constexpr int kStepsPerPanel = kPanelColumns / kMmaDepth;  // 4: a panel row is 4 steps of 32 bytes
  return static_cast<unsigned>(step / kStepsPerPanel * panel_bytes + step % kStepsPerPanel * 2 * kMmaDepth);
}

// The descriptor of a K-major tile at shared-memory address `tile`: the stride byte offset is one
// swizzle period (8 rows of 128 bytes), the leading byte offset unused (16).
__device__ __forceinline__ uint64_t k_major_descriptor(unsigned tile) {
  return matrix_descriptor(tile, 16, kSwizzleBytes);
}

// V's descriptor: read MN-major (its rows are keys, contiguous along the head dim, the N of P·V), so
// the leading byte offset is the step from one 64-column panel (of kPanelBytes) to the next.
template <int kPanelBytes>
__device__ __forceinline__ uint64_t mn_major_descriptor(unsigned tile) {
  return matrix_descriptor(tile, kPanelBytes, kSwizzleBytes);
}

// S = Q·Kᵀ for one warpgroup: kDim / 16 wgmma of 64 rows x kKeys keys x 16 dims, both operands in
// shared memory, the first overwriting the accumulators; issued as one group (not waited for).
template <typename Element, int kDim, int kKeys, int kQueryPanelBytes, int kKeyPanelBytes>
__device__ __forceinline__ void issue_scores(float (&scores)[kKeys / 2], uint64_t query_descriptor,
                                             uint64_t key_descriptor) {
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kDim / kMmaDepth; ++step) {
    const uint64_t a = advance_descriptor(query_descriptor, dim_step_offset(step, kQueryPanelBytes));
    const uint64_t b = advance_descriptor(key_descriptor, dim_step_offset(step, kKeyPanelBytes));
    if (step == 0) {
      wgmma_shared<Element, kKeys, false>(scores, a, b);
    } else {
      wgmma_shared<Element, kKeys, true>(scores, a, b);
    }
  }
  wgmma_commit();
}

// O += P·V: one wgmma per 16 keys, 64 rows x kDim dims, P's fragments from registers, V through its
// MN-major descriptor (a 16-key step starts 16 rows, 2048 bytes, further); issued as one group.
template <typename Element, int kDim, int kKeySteps>
__device__ __forceinline__ void issue_values(float (&out)[kDim / 2], const unsigned (&probs)[kKeySteps][4],
                                             uint64_t value_descriptor) {
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < kKeySteps; ++j) {
    wgmma_registers<Element, kDim>(out, probs[j], advance_descriptor(value_descriptor, j * kMmaDepth * kPanelRowBytes));
  }
  wgmma_commit();
}

}  // namespace fa::kernel
