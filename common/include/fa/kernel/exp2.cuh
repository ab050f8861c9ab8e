// 2^x on the special-function unit (taught in stage 06's README, "What changed from stage 05").
#pragma once

namespace fa::kernel {

// Flushes results below 2^-126 to zero (far below anything a 16-bit type can hold); exp2f would
// wrap the same instruction in a fix-up for those results. Callers fold log2(e) into the scale.
__device__ __forceinline__ float fast_exp2(float x) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}

constexpr float kLog2e = 1.4426950408889634f;
// The log-sum-exp leaves log2 units: ln x = log2 x · ln 2 (taught in stage 08's README,
// "The rest of the kernel").
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace fa::kernel
