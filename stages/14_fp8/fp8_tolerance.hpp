// Stage 14's accuracy contract for a GPU run: how far the FP8 forward's O (and LSE) may lie from the
// double reference, and from the CPU FP8 model. One copy, shared by the stage's tests
// (tests/stage14_test.cpp) and its command line (fp8_main.cpp), so that `bin/14_fp8` passes exactly
// what the tests pass. The harness's tolerance (metrics.hpp) is per 16-bit precision, 2^-11 or 2^-8;
// e4m3's unit roundoff is 2^-4, so stage 14 cannot use it.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/stage.hpp"

namespace fa::fp8 {

constexpr double kE4m3Unit = 1.0 / 16;  // e4m3's unit roundoff u: 3 mantissa bits, 2^-4

// Q, K, V and P each rounded once to e4m3: P's weights carry up to 2u, V's values u, O's 16-bit
// rounding far less; the rotation and block scales keep Q·K's error to about u of the typical score.
// So 2u·max|V| for any element of O against the reference on the unquantized inputs...
inline double reference_tolerance(double max_abs_v) { return 2 * kE4m3Unit * max_abs_v; }
// ... 2u for the L2 norm of the error relative to that of P·|V| (the softmax weights applied to |V|),
// not to O's: each term p_j·v_j of O carries its own rounding error, up to about 2u of |p_j·v_j|, so
// the error's bound scales with Σ_j p_j·|v_j|, while O = Σ_j p_j·v_j cancels toward zero when V has
// mean zero (the tests' uniform inputs). Relative to |O| the CPU FP8 model reads 0.029 to 0.042 on
// the tests' shapes and on N = 2048 and 4096, and one element at D = 1, Nq = 1, Nk = 130 read 0.135
// on an H200 (0.0012 absolute, a hundredth of its element tolerance): a bound on |O| cannot be
// derived, one on P·|V| can.
constexpr double kReferenceRelL2 = 2 * kE4m3Unit;

// The inputs with V made |V|: the reference run on them gives P·|V|, the scale of O's error.
inline Inputs with_absolute_values(Inputs inputs) {
  for (float& value : inputs.v) value = std::fabs(value);
  return inputs;
}

// ||out - reference|| / ||magnitude|| (magnitude: the reference on with_absolute_values).
inline double error_relative_to(const std::vector<float>& out, const std::vector<double>& reference,
                                const std::vector<double>& magnitude) {
  double error_squares = 0.0;
  double magnitude_squares = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double error = static_cast<double>(out[i]) - reference[i];
    error_squares += error * error;
    magnitude_squares += magnitude[i] * magnitude[i];
  }
  return magnitude_squares > 0.0 ? std::sqrt(error_squares / magnitude_squares) : std::sqrt(error_squares);
}

// ... and u for the log-sum-exp (natural log units).
constexpr double kLseTolerance = kE4m3Unit;

// O against the reference as the tests judge it: every element within reference_tolerance, nothing
// non-finite, and the error's L2 norm relative to P·|V| (error_relative_to) within kReferenceRelL2.
inline bool passes_reference(const ErrorReport& report, double error_relative_to_magnitude) {
  return report.passed() && error_relative_to_magnitude <= kReferenceRelL2;
}

// The kernel against the CPU model with the kernel's own choices (fp8_numerics.hpp): they differ only
// by FP32 summation order, the fast exp2 and a rare e4m3 rounding of P that lands the other way, u/8
// of max|V|, plus O's rounding to `precision` (FP16 or BF16) twice over.
inline double model_tolerance(Precision precision, double max_abs_v) {
  const double unit16 = precision == Precision::fp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  return (kE4m3Unit / 8 + 2 * unit16) * max_abs_v;
}

}  // namespace fa::fp8
