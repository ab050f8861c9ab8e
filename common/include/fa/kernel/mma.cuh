// The warp-level tensor-core instructions in PTX (taught in stage 08's README, "The fragments").
// sm_80 and newer (BF16 needs sm_80): a stage that includes this guards its device code with
// __CUDA_ARCH__ >= 800.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace fa::kernel {

// ldmatrix .x4: lanes 8i .. 8i+7 give the shared addresses of the 8 rows (16 bytes each) of
// matrix i; afterwards register i of lane l holds elements (l/4, 2·(l%4)) and (l/4, 2·(l%4)+1)
// of matrix i. volatile: the compiler must not move a shared-memory read across the barriers
// around it.
__device__ __forceinline__ void load_matrices(unsigned (&fragment)[4], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(shared_address));
}

// The same with `.trans`: each lane gets the transpose, elements (2·(l%4), l/4) and
// (2·(l%4)+1, l/4).
__device__ __forceinline__ void load_matrices_transposed(unsigned (&fragment)[4], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(shared_address));
}

// D += A·B for a 16x16 A (4 registers of 16-bit pairs), a 16x8 B (2 registers) and a 16x8 FP32
// accumulator (4 registers), the warp's 32 lanes together. In the accumulator lane l holds rows
// l/4 and l/4 + 8, columns 2·(l%4) and 2·(l%4) + 1.
template <typename Element>
__device__ __forceinline__ void mma_16x8x16(float (&accumulator)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<Element, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

}  // namespace fa::kernel
