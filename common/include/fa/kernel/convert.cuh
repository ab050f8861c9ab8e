// FP32 to the 16-bit element types and back (taught in stage 07's README, "FP16 and BF16").
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace fa::kernel {

template <typename Element>
__device__ __forceinline__ Element to_element(float value) {
  if constexpr (std::is_same_v<Element, __half>) {
    return __float2half_rn(value);
  } else {
    return __float2bfloat16_rn(value);
  }
}

template <typename Element>
__device__ __forceinline__ float to_float(Element value) {
  if constexpr (std::is_same_v<Element, __half>) {
    return __half2float(value);
  } else {
    return __bfloat162float(value);
  }
}

// Two FP32 values as the 32 bits of a rounded pair, `low` in the low half: one register of an
// mma.sync A fragment, or two neighbouring elements in memory.
template <typename Element>
__device__ __forceinline__ unsigned pack_pair(float low, float high) {
  if constexpr (std::is_same_v<Element, __half>) {
    const __half2 pair = __floats2half2_rn(low, high);
    return *reinterpret_cast<const unsigned*>(&pair);
  } else {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const unsigned*>(&pair);
  }
}

}  // namespace fa::kernel
