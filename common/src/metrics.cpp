#include "fa/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace fa {

ErrorReport compare(const std::vector<float>& actual, const std::vector<double>& expected, double tolerance) {
  ErrorReport report;
  report.tolerance = tolerance;
  double error_squares = 0.0;
  double expected_squares = 0.0;
  for (std::size_t i = 0; i < actual.size() && i < expected.size(); ++i) {
    const double value = static_cast<double>(actual[i]);
    if (!std::isfinite(value)) {
      if (report.non_finite++ == 0) report.first_non_finite = static_cast<int64_t>(i);
      continue;
    }
    const double error = std::fabs(value - expected[i]);
    if (error > report.max_abs_err || report.max_abs_index < 0) {
      report.max_abs_err = error;
      report.max_abs_index = static_cast<int64_t>(i);
    }
    error_squares += error * error;
    expected_squares += expected[i] * expected[i];
  }
  if (actual.size() != expected.size()) {
    // A short output is as wrong as an unwritten one.
    report.non_finite += static_cast<int64_t>(expected.size() > actual.size() ? expected.size() - actual.size()
                                                                              : actual.size() - expected.size());
  }
  report.rel_l2_err = expected_squares > 0.0 ? std::sqrt(error_squares / expected_squares) : std::sqrt(error_squares);
  if (report.non_finite > 0) {
    report.max_abs_err = INFINITY;
    report.rel_l2_err = INFINITY;
  }
  return report;
}

ErrorReport compare_lse(const std::vector<float>& actual, const std::vector<double>& expected, double tolerance) {
  // Rows that see no key compare as 0 against 0 when both are -inf, and as non-finite otherwise.
  std::vector<float> finite_actual(actual);
  std::vector<double> finite_expected(expected);
  int64_t mismatched_empty_rows = 0;
  int64_t first_mismatch = -1;
  for (std::size_t i = 0; i < finite_actual.size() && i < finite_expected.size(); ++i) {
    const bool expected_empty = std::isinf(finite_expected[i]) && finite_expected[i] < 0.0;
    const bool actual_empty = std::isinf(finite_actual[i]) && finite_actual[i] < 0.0f;
    if (expected_empty || actual_empty) {
      if (expected_empty != actual_empty && mismatched_empty_rows++ == 0) first_mismatch = static_cast<int64_t>(i);
      finite_actual[i] = 0.0f;
      finite_expected[i] = 0.0;
    }
  }
  ErrorReport report = compare(finite_actual, finite_expected, tolerance);
  if (mismatched_empty_rows > 0) {
    if (report.non_finite == 0) report.first_non_finite = first_mismatch;
    report.non_finite += mismatched_empty_rows;
    report.max_abs_err = INFINITY;
    report.rel_l2_err = INFINITY;
  }
  return report;
}

double lse_tolerance(double logit_bound) { return 1e-4 + 8.0 * std::ldexp(1.0, -24) * logit_bound; }

std::string ErrorReport::summary() const {
  std::ostringstream text;
  if (non_finite > 0) {
    text << non_finite << " non-finite outputs (first at element " << first_non_finite << ")";
  } else if (beyond_tolerance > 0) {
    text << beyond_tolerance << " elements beyond their tolerance; max abs error " << max_abs_err << " at element "
         << max_abs_index << ", relative L2 error " << rel_l2_err;
  } else {
    text << "max abs error " << max_abs_err << " at element " << max_abs_index << " (tolerance " << tolerance
         << "), relative L2 error " << rel_l2_err;
  }
  return text.str();
}

double tolerance(Precision precision, double max_abs_v, double logit_bound) {
  const double scale = max_abs_v > 0.0 ? max_abs_v : 1.0;
  const double score_rounding = 8.0 * std::ldexp(1.0, -24) * logit_bound * scale;
  switch (precision) {
    case Precision::fp32:
      return 1e-4 * scale + score_rounding;
    case Precision::fp16:
      return 4.0 * std::ldexp(1.0, -11) * scale + score_rounding;
    case Precision::bf16:
      return 4.0 * std::ldexp(1.0, -8) * scale + score_rounding;
  }
  return 0.0;
}

double gradient_tolerance_unit(Precision precision, double logit_bound) {
  const double score_rounding = 16.0 * std::ldexp(1.0, -24) * logit_bound;
  switch (precision) {
    case Precision::fp32:
      return 4.0 * (1e-5 + score_rounding);
    case Precision::fp16:
      return 4.0 * (std::ldexp(1.0, -11) + score_rounding);
    case Precision::bf16:
      return 4.0 * (std::ldexp(1.0, -8) + score_rounding);
  }
  return 0.0;
}

ErrorReport compare_gradient(const std::vector<float>& actual, const std::vector<double>& expected,
                             const std::vector<double>& bound, double unit) {
  ErrorReport report = compare(actual, expected, 0.0);
  const double largest_bound = bound.empty() ? 0.0 : *std::max_element(bound.begin(), bound.end());
  const double floor = std::ldexp(1.0, -24) * largest_bound;
  double largest_tolerance = 0.0;
  for (std::size_t i = 0; i < actual.size() && i < expected.size() && i < bound.size(); ++i) {
    const double element_tolerance = unit * bound[i] + floor;
    largest_tolerance = std::max(largest_tolerance, element_tolerance);
    const double value = static_cast<double>(actual[i]);
    if (std::isfinite(value) && std::fabs(value - expected[i]) > element_tolerance) ++report.beyond_tolerance;
  }
  report.tolerance = report.non_finite > 0 ? 0.0 : largest_tolerance;
  return report;
}

double logit_bound(const std::vector<float>& q, const std::vector<float>& k, int64_t dim) {
  float max_q = 0.0f;
  float max_k = 0.0f;
  for (float value : q) max_q = std::max(max_q, std::fabs(value));
  for (float value : k) max_k = std::max(max_k, std::fabs(value));
  return static_cast<double>(max_q) * static_cast<double>(max_k) * std::sqrt(static_cast<double>(dim));
}

}  // namespace fa
