// Comparing an output with the reference. Any non-finite output fails on its own: a NaN must
// never vanish inside a max.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fa/stage.hpp"

namespace fa {

struct ErrorReport {
  double max_abs_err = 0.0;
  int64_t max_abs_index = -1;  // element index into the compared values
  double rel_l2_err = 0.0;
  int64_t non_finite = 0;  // outputs that are NaN or infinite
  int64_t first_non_finite = -1;
  double tolerance = 0.0;
  int64_t beyond_tolerance = 0;  // elements past their own tolerance (compare_gradient)
  bool passed() const { return non_finite == 0 && beyond_tolerance == 0 && max_abs_err <= tolerance; }
  std::string summary() const;
};

// `actual` and `expected` hold the same elements in the same order.
ErrorReport compare(const std::vector<float>& actual, const std::vector<double>& expected, double tolerance);

// The log-sum-exp of each row against the reference's: a row whose reference is -inf (it sees no
// key) must be -inf exactly; every other row must be finite and within `tolerance`.
ErrorReport compare_lse(const std::vector<float>& actual, const std::vector<double>& expected, double tolerance);

// The largest LSE error a correct stage may show: FP32 sums of the exponentials and the fast
// exponential move log(l) by far less than 1e-4; the scores' own FP32 rounding (see below) moves
// LSE by at most 8·u32·logit_bound.
double lse_tolerance(double logit_bound);

// The largest error a correct stage of `precision` may show when max|V| is `max_abs_v` and the
// scores are bounded by `logit_bound` (see logit_bound()).
// FP32: accumulation-order rounding, far below 1e-4. FP16/BF16: P is rounded to the 16-bit
// type before the PV product (relative error u = 2^-11 or 2^-8, so at most u·max|V| in O) and
// O is rounded once more on the way out (another u·max|O| <= u·max|V|): 2u·max|V|, doubled for
// safety against FP32 accumulation and fast exp.
// Every stage computes scores in FP32, so a score s carries an error of a few FP32 units of
// |s| (u32 = 2^-24), which moves each weight by that much relatively: 8·u32·max|s|·max|V| on
// top. It matters only for large logits (1e3 gives 5e-4; ordinary inputs, 1e-6).
double tolerance(Precision precision, double max_abs_v, double logit_bound = 0.0);

// The unit in which a gradient element may be wrong, per unit of its reference bound
// (reference.hpp, GradientReference): the 16-bit unit roundoff u (2^-11 for FP16, 2^-8 for
// BF16; 1e-5 for FP32 stages, whose error is accumulation order) plus the relative error of P
// that the FP32 scores carry (8·u32·logit_bound in the forward's LSE and again in the backward's
// rebuilt scores), times 4 for safety, as the forward's tolerance doubles its 2u.
double gradient_tolerance_unit(Precision precision, double logit_bound = 0.0);

// Every element against its own tolerance, unit · bound[i] (plus 2^-24 of the largest bound, for
// FP32 accumulation noise where a bound is near zero). max_abs_err is the largest error anywhere,
// `tolerance` the largest element tolerance, and `beyond_tolerance` counts the elements past their
// own (passed() needs none).
ErrorReport compare_gradient(const std::vector<float>& actual, const std::vector<double>& expected,
                             const std::vector<double>& bound, double unit);

// A bound on |Q·K / sqrt(D)|: max|Q|·max|K|·sqrt(D).
double logit_bound(const std::vector<float>& q, const std::vector<float>& k, int64_t dim);

}  // namespace fa
