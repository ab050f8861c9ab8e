// Hopper's warpgroup matrix instructions in PTX: wgmma.mma_async, its shared-memory matrix
// descriptors, and the register hand-over of warp specialization, setmaxnreg (taught in stage 09's
// README: "The wgmma accumulator layout, and why it is also the A layout of P·V", "The matrix
// descriptor", "Why the producer needs so few registers: setmaxnreg"). sm_90a only: wgmma and
// setmaxnreg exist on no other target, so a stage that includes this compiles for sm_90a alone
// (CUDA_ARCHITECTURES 90a) and guards its device code with __CUDA_ARCH_FEAT_SM90_ALL.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace fa::kernel {

constexpr int kWarpgroupThreads = 128;  // four consecutive warps, the first at a warp index divisible by 4

// ---- Warp specialization -------------------------------------------------------------------

// This thread's warpgroup, read from lane 0: the compiler then knows that a warp holds one value, and
// what derives from it (a consumer's matrix descriptors) stays in uniform registers, where wgmma
// reads them; from threadIdx.x alone every descriptor is moved over (R2UR) before each wgmma
// (stage 13's README, "Tried and dropped", measures what it buys).
__device__ __forceinline__ int uniform_warpgroup() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / kWarpgroupThreads), 0);
}

// setmaxnreg: the warpgroup gives registers back to the SM's pool (decrease) or takes them from it
// (increase, waiting until the pool has them). Every thread of the warpgroup executes the same one.
// It takes effect only in a kernel with a register cap at entry (__launch_bounds__(threads, 1)),
// and kRegisters must be a multiple of 8 in 24 .. 256.
template <int kRegisters>
__device__ __forceinline__ void release_registers() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24 .. 256, by 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void claim_registers() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24 .. 256, by 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// A barrier for `threads` threads only (named barrier `id`, 1 .. 15; 0 is __syncthreads): lets
// one warpgroup wait for its own warps while the others run on.
__device__ __forceinline__ void sync_threads(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The other half of a named barrier (taught in stage 10's README, "The schedule"): counts this warp's
// threads toward barrier `id` and runs on without waiting. A barrier of `threads` opens when the
// threads that wait at it (sync_threads) and those that only arrive add up to `threads`.
__device__ __forceinline__ void arrive_threads(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A named barrier that also reduces a predicate (taught in stage 10's README, "The last round"):
// like sync_threads, and each of the `threads` learns whether any of them passed true.
__device__ __forceinline__ bool any_threads(int id, int threads, bool predicate) {
  int any;
  asm volatile(
      "{\n"
      ".reg .pred mine, all;\n"
      "setp.ne.b32 mine, %1, 0;\n"
      "bar.red.or.pred all, %2, %3, mine;\n"
      "selp.b32 %0, 1, 0, all;\n"
      "}\n"
      : "=r"(any)
      : "r"(static_cast<int>(predicate)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// ---- The shared-memory matrix descriptor -----------------------------------------------------

// A 64-bit description of an operand tile in shared memory, for tiles written with the 128-byte
// swizzle (the layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B). Fields, each a byte count / 16:
//   bits  0-13  start address (the tile must start 1024-byte aligned, or inside such a tile at a
//               16-byte step along the contiguous direction: then the base offset stays 0)
//   bits 16-29  leading-dimension byte offset: K-major swizzled, unused (1); MN-major, the step
//               from one 64-element (128-byte) block of the contiguous direction to the next
//   bits 32-45  stride-dimension byte offset: from one group of 8 rows to the next (1024 when rows
//               are 128 bytes)
//   bits 49-51  base offset (0: every tile here starts on a 1024-byte boundary)
//   bits 62-63  swizzle mode: 1 = 128-byte swizzle
__device__ __forceinline__ uint64_t matrix_descriptor(unsigned shared_address, unsigned leading_bytes,
                                                      unsigned stride_bytes) {
  constexpr uint64_t kSwizzle128 = uint64_t{1} << 62;
  return static_cast<uint64_t>((shared_address & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((leading_bytes & 0x3FFFF) >> 4) << 16 |
         static_cast<uint64_t>((stride_bytes & 0x3FFFF) >> 4) << 32 | kSwizzle128;
}

// The same descriptor `bytes` further on (a multiple of 16, and no carry out of the 14-bit
// address: shared memory ends below 256 KB): a constant added to the low word.
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t descriptor, unsigned bytes) {
  return descriptor + (bytes >> 4);
}

// ---- Ordering --------------------------------------------------------------------------------

// Before the first wgmma of a batch: the registers it reads (accumulators, the A fragments) were
// written by ordinary instructions, and must be complete first.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the batch of wgmma issued since the last commit into one group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The compiler sees a wgmma as an ordinary instruction that writes its accumulators at once. This
// empty statement, placed after wgmma_wait, "rewrites" every register, so no read of them can be
// scheduled above the wait (where the tensor cores may still be writing them).
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&registers)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(registers[i])::"memory");
}

// The same for 32-bit operands: the P fragments that an in-flight wgmma reads (stage 10). Placed
// after the wait, it keeps them live until then, so the compiler cannot give their registers to
// other values while the tensor cores still read them.
template <int kRows, int kCount>
__device__ __forceinline__ void fence_registers(unsigned (&registers)[kRows][kCount]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kCount; ++j) asm volatile("" : "+r"(registers[i][j])::"memory");
  }
}

// ---- wgmma.mma_async -------------------------------------------------------------------------
//
// One instruction: a warpgroup multiplies a 64 x 16 A by a 16 x N B into a 64 x N FP32
// accumulator, N/2 registers a thread (warp w of the group owns rows 16w .. 16w+15, in the
// mma.m16n8 layout of stage 08, one 8-column tile after another). The accumulator's operand lists
// are built once below from runs of 32 (FA_WGMMA_LIST_*) and 8 (FA_WGMMA_OPERANDS_8):
// FA_WGMMA_REGISTERS_n, the PTX list {%0, ..., %n-1}, and FA_WGMMA_OPERANDS_n(c, d), which binds
// d[0 .. n-1] to it with constraint c (FA_WGMMA_READ_WRITE, "+f", to accumulate; FA_WGMMA_WRITE,
// "=f", to overwrite). The 16-bit products here use N = 64, 96, 128, 192, 256 (32 to 128
// registers); stage 14's 8-bit ones have the same accumulator layout, so these lists stay defined
// past this header, for fp8_wgmma.cuh.

// clang-format off
#define FA_WGMMA_LIST_0_31 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FA_WGMMA_LIST_32_63 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FA_WGMMA_LIST_64_95 \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define FA_WGMMA_LIST_96_127 \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define FA_WGMMA_LIST_32_47 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define FA_WGMMA_REGISTERS_32 "{" FA_WGMMA_LIST_0_31 "}"
#define FA_WGMMA_REGISTERS_48 "{" FA_WGMMA_LIST_0_31 ", " FA_WGMMA_LIST_32_47 "}"
#define FA_WGMMA_REGISTERS_64 "{" FA_WGMMA_LIST_0_31 ", " FA_WGMMA_LIST_32_63 "}"
#define FA_WGMMA_REGISTERS_96 "{" FA_WGMMA_LIST_0_31 ", " FA_WGMMA_LIST_32_63 ", " FA_WGMMA_LIST_64_95 "}"
#define FA_WGMMA_REGISTERS_128 \
  "{" FA_WGMMA_LIST_0_31 ", " FA_WGMMA_LIST_32_63 ", " FA_WGMMA_LIST_64_95 ", " FA_WGMMA_LIST_96_127 "}"
#define FA_WGMMA_OPERANDS_8(c, d, i) \
  c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3]), c(d[i + 4]), c(d[i + 5]), c(d[i + 6]), c(d[i + 7])
#define FA_WGMMA_OPERANDS_32(c, d) \
  FA_WGMMA_OPERANDS_8(c, d, 0), FA_WGMMA_OPERANDS_8(c, d, 8), FA_WGMMA_OPERANDS_8(c, d, 16), \
  FA_WGMMA_OPERANDS_8(c, d, 24)
#define FA_WGMMA_OPERANDS_48(c, d) \
  FA_WGMMA_OPERANDS_32(c, d), FA_WGMMA_OPERANDS_8(c, d, 32), FA_WGMMA_OPERANDS_8(c, d, 40)
#define FA_WGMMA_OPERANDS_64(c, d) \
  FA_WGMMA_OPERANDS_32(c, d), FA_WGMMA_OPERANDS_8(c, d, 32), FA_WGMMA_OPERANDS_8(c, d, 40), \
  FA_WGMMA_OPERANDS_8(c, d, 48), FA_WGMMA_OPERANDS_8(c, d, 56)
#define FA_WGMMA_OPERANDS_96(c, d) \
  FA_WGMMA_OPERANDS_64(c, d), FA_WGMMA_OPERANDS_8(c, d, 64), FA_WGMMA_OPERANDS_8(c, d, 72), \
  FA_WGMMA_OPERANDS_8(c, d, 80), FA_WGMMA_OPERANDS_8(c, d, 88)
#define FA_WGMMA_OPERANDS_128(c, d) \
  FA_WGMMA_OPERANDS_96(c, d), FA_WGMMA_OPERANDS_8(c, d, 96), FA_WGMMA_OPERANDS_8(c, d, 104), \
  FA_WGMMA_OPERANDS_8(c, d, 112), FA_WGMMA_OPERANDS_8(c, d, 120)
// clang-format on

#define FA_WGMMA_READ_WRITE(x) "+f"(x)
#define FA_WGMMA_WRITE(x) "=f"(x)

// Both operands in shared memory, both K-major (imm-trans-a = imm-trans-b = 0): S = Q·Kᵀ, Q's rows
// and K's rows each holding their head-dim values contiguously. `scale` is the operand that says
// whether D is accumulated into (1) or overwritten (0).
#define FA_WGMMA_SHARED(shape, registers, operands, a, b, scale)                                       \
  if constexpr (std::is_same_v<Element, __half>) {                                                     \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " scale ", 0;\nwgmma.mma_async.sync.aligned." shape \
                 ".f32.f16.f16 " registers ", " a ", " b ", p, 1, 1, 0, 0;\n}\n"                       \
                 : operands                                                                            \
                 : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(kAccumulate)));          \
  } else {                                                                                             \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " scale ", 0;\nwgmma.mma_async.sync.aligned." shape \
                 ".f32.bf16.bf16 " registers ", " a ", " b ", p, 1, 1, 0, 0;\n}\n"                     \
                 : operands                                                                            \
                 : "l"(a_descriptor), "l"(b_descriptor), "r"(static_cast<int>(kAccumulate)));          \
  }

// D (+)= A·B, A (64 x 16) and B (16 x N) both described by 128-byte-swizzled K-major descriptors.
// With kAccumulate = false D is overwritten (the accumulators need no zeroing, and the compiler
// knows their old values are dead).
template <typename Element, int N, bool kAccumulate>
__device__ __forceinline__ void wgmma_shared(float (&d)[N / 2], uint64_t a_descriptor, uint64_t b_descriptor) {
  static_assert(N == 64 || N == 96 || N == 128, "S = Q·Kᵀ uses 64, 96 or 128 keys a tile");
  if constexpr (N == 64 && kAccumulate) {
    FA_WGMMA_SHARED("m64n64k16", FA_WGMMA_REGISTERS_32, FA_WGMMA_OPERANDS_32(FA_WGMMA_READ_WRITE, d), "%32", "%33",
                    "%34")
  } else if constexpr (N == 64) {
    FA_WGMMA_SHARED("m64n64k16", FA_WGMMA_REGISTERS_32, FA_WGMMA_OPERANDS_32(FA_WGMMA_WRITE, d), "%32", "%33", "%34")
  } else if constexpr (N == 96 && kAccumulate) {
    FA_WGMMA_SHARED("m64n96k16", FA_WGMMA_REGISTERS_48, FA_WGMMA_OPERANDS_48(FA_WGMMA_READ_WRITE, d), "%48", "%49",
                    "%50")
  } else if constexpr (N == 96) {
    FA_WGMMA_SHARED("m64n96k16", FA_WGMMA_REGISTERS_48, FA_WGMMA_OPERANDS_48(FA_WGMMA_WRITE, d), "%48", "%49", "%50")
  } else if constexpr (kAccumulate) {
    FA_WGMMA_SHARED("m64n128k16", FA_WGMMA_REGISTERS_64, FA_WGMMA_OPERANDS_64(FA_WGMMA_READ_WRITE, d), "%64", "%65",
                    "%66")
  } else {
    FA_WGMMA_SHARED("m64n128k16", FA_WGMMA_REGISTERS_64, FA_WGMMA_OPERANDS_64(FA_WGMMA_WRITE, d), "%64", "%65", "%66")
  }
}

// A from registers (four 16-bit pairs a thread, the mma.m16n8k16 A layout per warp: stage 08's
// README), B in shared memory MN-major (imm-trans-b = 1): O += P·V, V's rows (keys) holding their
// head-dim values contiguously, i.e. contiguous along N. Always accumulates.
#define FA_WGMMA_REGISTER_A(shape, registers, operands, a0, a1, a2, a3, b)                                          \
  if constexpr (std::is_same_v<Element, __half>) {                                                                  \
    asm volatile("wgmma.mma_async.sync.aligned." shape ".f32.f16.f16 " registers ", {" a0 ", " a1 ", " a2 ", " a3   \
                 "}, " b ", 1, 1, 1, 1;\n"                                                                          \
                 : operands                                                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor));                                  \
  } else {                                                                                                          \
    asm volatile("wgmma.mma_async.sync.aligned." shape ".f32.bf16.bf16 " registers ", {" a0 ", " a1 ", " a2 ", " a3 \
                 "}, " b ", 1, 1, 1, 1;\n"                                                                          \
                 : operands                                                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_descriptor));                                  \
  }

template <typename Element, int N>
__device__ __forceinline__ void wgmma_registers(float (&d)[N / 2], const unsigned (&a)[4], uint64_t b_descriptor) {
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "O += P·V covers a head-dim bucket: 64, 128, 192 or 256");
  if constexpr (N == 64) {
    FA_WGMMA_REGISTER_A("m64n64k16", FA_WGMMA_REGISTERS_32, FA_WGMMA_OPERANDS_32(FA_WGMMA_READ_WRITE, d), "%32", "%33",
                        "%34", "%35", "%36")
  } else if constexpr (N == 128) {
    FA_WGMMA_REGISTER_A("m64n128k16", FA_WGMMA_REGISTERS_64, FA_WGMMA_OPERANDS_64(FA_WGMMA_READ_WRITE, d), "%64", "%65",
                        "%66", "%67", "%68")
  } else if constexpr (N == 192) {
    FA_WGMMA_REGISTER_A("m64n192k16", FA_WGMMA_REGISTERS_96, FA_WGMMA_OPERANDS_96(FA_WGMMA_READ_WRITE, d), "%96", "%97",
                        "%98", "%99", "%100")
  } else {
    FA_WGMMA_REGISTER_A("m64n256k16", FA_WGMMA_REGISTERS_128, FA_WGMMA_OPERANDS_128(FA_WGMMA_READ_WRITE, d), "%128",
                        "%129", "%130", "%131", "%132")
  }
}

#undef FA_WGMMA_SHARED
#undef FA_WGMMA_REGISTER_A

}  // namespace fa::kernel
