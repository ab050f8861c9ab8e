// The 8-bit pieces of Hopper's wgmma that the kit (common/include/fa/kernel/wgmma.cuh) has only in
// 16 bits: e4m3 x e4m3 products with FP32 accumulators (k = 32 a step), their shared-memory
// descriptors for rows of 64 or 128 bytes, and P packed as the 8-bit register A operand. sm_90a
// only, as the kit. (Stage 14 teaches them; they can move into the kit once a second stage uses
// them.)
//
// The operand rule that shapes the whole stage: for 8-bit types wgmma takes both shared-memory
// operands K-major only (there is no transpose bit for them). S = Q·Kᵀ is K-major on both sides
// already (Q's and K's rows hold the head dim). O += P·V contracts over keys, so V's rows must hold
// keys: V is stored transposed, (Dpad, keys), which the quantization pass writes (quantize.cu).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "fa/kernel/wgmma.cuh"

namespace fa::fp8 {

constexpr int kE4m3Step = 32;  // the K of an 8-bit wgmma: 32 elements, 32 bytes of a row

// A K-major e4m3 tile in shared memory, as TMA writes it: rows of kRowBytes (64 or 128: one
// swizzle atom, whose width is also the swizzle mode), 8 rows a swizzle period, and a head dim
// wider than one atom in panels of kRows rows each. The descriptor's swizzle field (bits 62-63):
// 1 = 128-byte, 2 = 64-byte; the stride byte offset is one period (8 rows).
template <int kRowBytes>
__device__ __forceinline__ uint64_t e4m3_descriptor(unsigned tile) {
  static_assert(kRowBytes == 64 || kRowBytes == 128, "a row is one 64- or 128-byte swizzle atom");
  constexpr unsigned kPeriodBytes = 8 * kRowBytes;
  constexpr uint64_t kMode = kRowBytes == 128 ? 1 : 2;
  return static_cast<uint64_t>((tile & 0x3FFFF) >> 4) | uint64_t{1} << 16 |
         static_cast<uint64_t>(kPeriodBytes >> 4) << 32 | kMode << 62;
}

// Step s (32 elements) of a K-major walk: 32 bytes further along the row, a new panel (of
// kPanelBytes) when the row's kRowBytes are used up. Inside a swizzled atom the start address moves
// by the unswizzled offset; the hardware applies the swizzle to the addresses it forms.
template <int kRowBytes, int kPanelBytes>
__device__ __forceinline__ unsigned e4m3_step_offset(int step) {
  constexpr int kStepsPerRow = kRowBytes / kE4m3Step;
  return static_cast<unsigned>(step / kStepsPerRow * kPanelBytes + step % kStepsPerRow * kE4m3Step);
}

// ---- wgmma.mma_async, e4m3 x e4m3 -> f32 ----------------------------------------------------
// The same accumulator layout as the 16-bit products (the kit's wgmma.cuh): 64 rows x N, N/2
// registers a thread, named by the kit's operand lists (N = 64, 128, 192, 256).

// Both operands in shared memory (Q and K for S = Q·Kᵀ). `scale` is the operand that says whether
// D is accumulated into (1) or overwritten (0). No transpose immediates: 8-bit operands are K-major.
#define FA_FP8_SHARED(shape, registers, operands, a, b, scale)                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " scale ", 0;\nwgmma.mma_async.sync.aligned." shape \
               ".f32.e4m3.e4m3 " registers ", " a ", " b ", p, 1, 1;\n}\n"                           \
               : operands                                                                            \
               : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(kAccumulate)));

template <int N, bool kAccumulate>
__device__ __forceinline__ void wgmma_e4m3_shared(float (&d)[N / 2], uint64_t a_descriptor, uint64_t b_descriptor) {
  static_assert(N == 64 || N == 128 || N == 192, "S = Q·Kᵀ uses 64, 128 or 192 keys a tile");
  if constexpr (N == 64 && kAccumulate) {
    FA_FP8_SHARED("m64n64k32", FA_WGMMA_REGISTERS_32, FA_WGMMA_OPERANDS_32(FA_WGMMA_READ_WRITE, d), "%32", "%33", "%34")
  } else if constexpr (N == 64) {
    FA_FP8_SHARED("m64n64k32", FA_WGMMA_REGISTERS_32, FA_WGMMA_OPERANDS_32(FA_WGMMA_WRITE, d), "%32", "%33", "%34")
  } else if constexpr (N == 128 && kAccumulate) {
    FA_FP8_SHARED("m64n128k32", FA_WGMMA_REGISTERS_64, FA_WGMMA_OPERANDS_64(FA_WGMMA_READ_WRITE, d), "%64", "%65",
                  "%66")
  } else if constexpr (N == 128) {
    FA_FP8_SHARED("m64n128k32", FA_WGMMA_REGISTERS_64, FA_WGMMA_OPERANDS_64(FA_WGMMA_WRITE, d), "%64", "%65", "%66")
  } else if constexpr (kAccumulate) {
    FA_FP8_SHARED("m64n192k32", FA_WGMMA_REGISTERS_96, FA_WGMMA_OPERANDS_96(FA_WGMMA_READ_WRITE, d), "%96", "%97",
                  "%98")
  } else {
    FA_FP8_SHARED("m64n192k32", FA_WGMMA_REGISTERS_96, FA_WGMMA_OPERANDS_96(FA_WGMMA_WRITE, d), "%96", "%97", "%98")
  }
}

// A from registers (P: four registers of four e4m3 values a thread, the layout below), B in shared
// memory K-major (Vᵀ: its rows are head-dim channels, each holding keys). Always accumulates.
#define FA_FP8_REGISTER_A(shape, registers, operands, a0, a1, a2, a3, b)                                          \
  asm volatile("wgmma.mma_async.sync.aligned." shape ".f32.e4m3.e4m3 " registers ", {" a0 ", " a1 ", " a2 ", " a3 \
               "}, " b ", 1, 1, 1;\n"                                                                             \
               : operands                                                                                         \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor));

template <int N>
__device__ __forceinline__ void wgmma_e4m3_registers(float (&d)[N / 2], const unsigned (&a)[4], uint64_t b_descriptor) {
  static_assert(N == 64 || N == 128 || N == 256, "O += P·V covers a head-dim bucket: 64, 128 or 256");
  if constexpr (N == 64) {
    FA_FP8_REGISTER_A("m64n64k32", FA_WGMMA_REGISTERS_32, FA_WGMMA_OPERANDS_32(FA_WGMMA_READ_WRITE, d), "%32", "%33",
                      "%34", "%35", "%36")
  } else if constexpr (N == 128) {
    FA_FP8_REGISTER_A("m64n128k32", FA_WGMMA_REGISTERS_64, FA_WGMMA_OPERANDS_64(FA_WGMMA_READ_WRITE, d), "%64", "%65",
                      "%66", "%67", "%68")
  } else {
    FA_FP8_REGISTER_A("m64n256k32", FA_WGMMA_REGISTERS_128, FA_WGMMA_OPERANDS_128(FA_WGMMA_READ_WRITE, d), "%128",
                      "%129", "%130", "%131", "%132")
  }
}

#undef FA_FP8_SHARED
#undef FA_FP8_REGISTER_A

// ---- e4m3 in registers -----------------------------------------------------------------------

// Four FP32 values as four e4m3 bytes, v0 in the lowest: round to nearest even, saturating at
// ±448 (cvt.rn.satfinite; of each pair the first source operand goes to the high byte).
__device__ __forceinline__ unsigned pack_e4m3x4(float v0, float v1, float v2, float v3) {
  unsigned packed;
  asm("{\n.reg .b16 low, high;\n"
      "cvt.rn.satfinite.e4m3x2.f32 low, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 high, %4, %3;\n"
      "mov.b32 %0, {low, high};\n}\n"
      : "=r"(packed)
      : "f"(v0), "f"(v1), "f"(v2), "f"(v3));
  return packed;
}

// The sum of the four e4m3 values of a register (exact conversions: e4m3 -> f16x2 -> f32).
__device__ __forceinline__ float e4m3x4_sum(unsigned packed) {
  unsigned low_pair;
  unsigned high_pair;
  asm("{\n.reg .b16 low, high;\n"
      "mov.b32 {low, high}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, low;\n"
      "cvt.rn.f16x2.e4m3x2 %1, high;\n}\n"
      : "=r"(low_pair), "=r"(high_pair)
      : "r"(packed));
  const float2 low = __half22float2(*reinterpret_cast<const __half2*>(&low_pair));
  const float2 high = __half22float2(*reinterpret_cast<const __half2*>(&high_pair));
  return (low.x + low.y) + (high.x + high.y);
}

}  // namespace fa::fp8
