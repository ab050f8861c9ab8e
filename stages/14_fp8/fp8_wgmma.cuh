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
// registers a thread. The operand lists of the sizes used (N = 64, 128, 192, 256) are written out once.
// clang-format off
#define FA_FP8_REGISTERS_32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FA_FP8_OPERANDS_32(c, d) \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), \
  c(d[8]), c(d[9]), c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), \
  c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), \
  c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), c(d[29]), c(d[30]), c(d[31])
#define FA_FP8_REGISTERS_64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"\
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"\
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FA_FP8_OPERANDS_64(c, d) \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), \
  c(d[8]), c(d[9]), c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), \
  c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), \
  c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), c(d[29]), c(d[30]), c(d[31]), \
  c(d[32]), c(d[33]), c(d[34]), c(d[35]), c(d[36]), c(d[37]), c(d[38]), c(d[39]), \
  c(d[40]), c(d[41]), c(d[42]), c(d[43]), c(d[44]), c(d[45]), c(d[46]), c(d[47]), \
  c(d[48]), c(d[49]), c(d[50]), c(d[51]), c(d[52]), c(d[53]), c(d[54]), c(d[55]), \
  c(d[56]), c(d[57]), c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]), c(d[63])
#define FA_FP8_REGISTERS_96 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"\
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"\
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"\
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"\
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define FA_FP8_OPERANDS_96(c, d) \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), \
  c(d[8]), c(d[9]), c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), \
  c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), \
  c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), c(d[29]), c(d[30]), c(d[31]), \
  c(d[32]), c(d[33]), c(d[34]), c(d[35]), c(d[36]), c(d[37]), c(d[38]), c(d[39]), \
  c(d[40]), c(d[41]), c(d[42]), c(d[43]), c(d[44]), c(d[45]), c(d[46]), c(d[47]), \
  c(d[48]), c(d[49]), c(d[50]), c(d[51]), c(d[52]), c(d[53]), c(d[54]), c(d[55]), \
  c(d[56]), c(d[57]), c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]), c(d[63]), \
  c(d[64]), c(d[65]), c(d[66]), c(d[67]), c(d[68]), c(d[69]), c(d[70]), c(d[71]), \
  c(d[72]), c(d[73]), c(d[74]), c(d[75]), c(d[76]), c(d[77]), c(d[78]), c(d[79]), \
  c(d[80]), c(d[81]), c(d[82]), c(d[83]), c(d[84]), c(d[85]), c(d[86]), c(d[87]), \
  c(d[88]), c(d[89]), c(d[90]), c(d[91]), c(d[92]), c(d[93]), c(d[94]), c(d[95])
#define FA_FP8_REGISTERS_128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"\
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"\
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"\
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"\
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"\
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"\
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define FA_FP8_OPERANDS_128(c, d) \
  c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), \
  c(d[8]), c(d[9]), c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), \
  c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), \
  c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), c(d[29]), c(d[30]), c(d[31]), \
  c(d[32]), c(d[33]), c(d[34]), c(d[35]), c(d[36]), c(d[37]), c(d[38]), c(d[39]), \
  c(d[40]), c(d[41]), c(d[42]), c(d[43]), c(d[44]), c(d[45]), c(d[46]), c(d[47]), \
  c(d[48]), c(d[49]), c(d[50]), c(d[51]), c(d[52]), c(d[53]), c(d[54]), c(d[55]), \
  c(d[56]), c(d[57]), c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]), c(d[63]), \
  c(d[64]), c(d[65]), c(d[66]), c(d[67]), c(d[68]), c(d[69]), c(d[70]), c(d[71]), \
  c(d[72]), c(d[73]), c(d[74]), c(d[75]), c(d[76]), c(d[77]), c(d[78]), c(d[79]), \
  c(d[80]), c(d[81]), c(d[82]), c(d[83]), c(d[84]), c(d[85]), c(d[86]), c(d[87]), \
  c(d[88]), c(d[89]), c(d[90]), c(d[91]), c(d[92]), c(d[93]), c(d[94]), c(d[95]), \
  c(d[96]), c(d[97]), c(d[98]), c(d[99]), c(d[100]), c(d[101]), c(d[102]), c(d[103]), \
  c(d[104]), c(d[105]), c(d[106]), c(d[107]), c(d[108]), c(d[109]), c(d[110]), c(d[111]), \
  c(d[112]), c(d[113]), c(d[114]), c(d[115]), c(d[116]), c(d[117]), c(d[118]), c(d[119]), \
  c(d[120]), c(d[121]), c(d[122]), c(d[123]), c(d[124]), c(d[125]), c(d[126]), c(d[127])
// clang-format on

#define FA_FP8_READ_WRITE(x) "+f"(x)
#define FA_FP8_WRITE(x) "=f"(x)

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
    FA_FP8_SHARED("m64n64k32", FA_FP8_REGISTERS_32, FA_FP8_OPERANDS_32(FA_FP8_READ_WRITE, d), "%32", "%33", "%34")
  } else if constexpr (N == 64) {
    FA_FP8_SHARED("m64n64k32", FA_FP8_REGISTERS_32, FA_FP8_OPERANDS_32(FA_FP8_WRITE, d), "%32", "%33", "%34")
  } else if constexpr (N == 128 && kAccumulate) {
    FA_FP8_SHARED("m64n128k32", FA_FP8_REGISTERS_64, FA_FP8_OPERANDS_64(FA_FP8_READ_WRITE, d), "%64", "%65", "%66")
  } else if constexpr (N == 128) {
    FA_FP8_SHARED("m64n128k32", FA_FP8_REGISTERS_64, FA_FP8_OPERANDS_64(FA_FP8_WRITE, d), "%64", "%65", "%66")
  } else if constexpr (kAccumulate) {
    FA_FP8_SHARED("m64n192k32", FA_FP8_REGISTERS_96, FA_FP8_OPERANDS_96(FA_FP8_READ_WRITE, d), "%96", "%97", "%98")
  } else {
    FA_FP8_SHARED("m64n192k32", FA_FP8_REGISTERS_96, FA_FP8_OPERANDS_96(FA_FP8_WRITE, d), "%96", "%97", "%98")
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
    FA_FP8_REGISTER_A("m64n64k32", FA_FP8_REGISTERS_32, FA_FP8_OPERANDS_32(FA_FP8_READ_WRITE, d), "%32", "%33", "%34",
                      "%35", "%36")
  } else if constexpr (N == 128) {
    FA_FP8_REGISTER_A("m64n128k32", FA_FP8_REGISTERS_64, FA_FP8_OPERANDS_64(FA_FP8_READ_WRITE, d), "%64", "%65", "%66",
                      "%67", "%68")
  } else {
    FA_FP8_REGISTER_A("m64n256k32", FA_FP8_REGISTERS_128, FA_FP8_OPERANDS_128(FA_FP8_READ_WRITE, d), "%128", "%129",
                      "%130", "%131", "%132")
  }
}

#undef FA_FP8_SHARED
#undef FA_FP8_REGISTER_A
#undef FA_FP8_READ_WRITE
#undef FA_FP8_WRITE
#undef FA_FP8_REGISTERS_32
#undef FA_FP8_REGISTERS_64
#undef FA_FP8_REGISTERS_96
#undef FA_FP8_REGISTERS_128
#undef FA_FP8_OPERANDS_32
#undef FA_FP8_OPERANDS_64
#undef FA_FP8_OPERANDS_96
#undef FA_FP8_OPERANDS_128

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
