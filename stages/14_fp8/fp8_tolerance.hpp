// Stage 14's accuracy contract for a GPU run: how far the FP8 forward's O (and LSE) may lie from the
// double reference, and from the CPU FP8 model. One copy, shared by the stage's tests
// (tests/stage14_test.cpp) and its command line (fp8_main.cpp), so that `bin/14_fp8` passes exactly
// what the tests pass. The harness's tolerance (metrics.hpp) is per 16-bit precision, 2^-11 or 2^-8;
// e4m3's unit roundoff is 2^-4, so stage 14 cannot use it.
#pragma once

#include <cmath>

#include "fa/metrics.hpp"
#include "fa/stage.hpp"

namespace fa::fp8 {

constexpr double kE4m3Unit = 1.0 / 16;  // e4m3's unit roundoff u: 3 mantissa bits, 2^-4

// Q, K, V and P each rounded once to e4m3: P's weights carry up to 2u, V's values u, O's 16-bit
// rounding far less; the rotation and block scales keep Q·K's error to about u of the typical score.
// So 2u·max|V| for any element of O against the reference on the unquantized inputs...
inline double reference_tolerance(double max_abs_v) { return 2 * kE4m3Unit * max_abs_v; }
// ... 2u for the L2 norm of the error relative to O's (not u/2, as first written: on the tests'
// uniform inputs V has mean zero, so O is a sum of terms that cancel while their rounding errors do
// not, and the relative error stays near the e4m3 rounding error of each term; the CPU FP8 model
// gives 0.029 to 0.042 on the tests' shapes and on N = 2048 and 4096, 0.065 at D = 1; u/2 = 0.031
// failed all but one)...
constexpr double kReferenceRelL2 = 2 * kE4m3Unit;
// ... and u for the log-sum-exp (natural log units).
constexpr double kLseTolerance = kE4m3Unit;

// O against the reference as the tests judge it: every element within reference_tolerance, nothing
// non-finite, and the relative L2 error within kReferenceRelL2.
inline bool passes_reference(const ErrorReport& report) {
  return report.passed() && report.rel_l2_err <= kReferenceRelL2;
}

// The kernel against the CPU model with the kernel's own choices (fp8_numerics.hpp): they differ only
// by FP32 summation order, the fast exp2 and a rare e4m3 rounding of P that lands the other way, u/8
// of max|V|, plus O's rounding to `precision` (FP16 or BF16) twice over.
inline double model_tolerance(Precision precision, double max_abs_v) {
  const double unit16 = precision == Precision::fp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  return (kE4m3Unit / 8 + 2 * unit16) * max_abs_v;
}

}  // namespace fa::fp8
