// The reference backward pass is what stage 11 is judged by, so it is checked against the
// definition of a gradient: central finite differences of the forward reference. With the loss
// L = Σ dO ∘ O, dL/dX is what the backward pass returns for each of X = Q, K, V.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa/walkthrough.hpp"

namespace {

double loss(const fa::Inputs& inputs, const std::vector<float>& grad_o) {
  const std::vector<double> out = fa::reference_attention(inputs);
  double sum = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) sum += static_cast<double>(grad_o[i]) * out[i];
  return sum;
}

// dL/dx for every element x of one input tensor, by central differences. The step is taken in
// float (the inputs are float), so the denominator is the step the floats really took.
std::vector<double> finite_differences(fa::Inputs inputs, std::vector<float> fa::Inputs::*tensor,
                                       const std::vector<float>& grad_o) {
  constexpr float kStep = 1e-3f;
  std::vector<float>& values = inputs.*tensor;
  std::vector<double> gradient(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float original = values[i];
    const float up = original + kStep;
    const float down = original - kStep;
    values[i] = up;
    const double loss_up = loss(inputs, grad_o);
    values[i] = down;
    const double loss_down = loss(inputs, grad_o);
    values[i] = original;
    gradient[i] = (loss_up - loss_down) / (static_cast<double>(up) - static_cast<double>(down));
  }
  return gradient;
}

std::vector<int64_t> every_kv_head(const fa::Problem& problem) {
  std::vector<int64_t> heads;
  for (int64_t head = 0; head < problem.kv_heads_total(); ++head) heads.push_back(head);
  return heads;
}

// The reference's dQ lists the query heads group by group; with every group in order that is
// the layout of Q itself. Its dK and dV are those of K and V.
void check_against_finite_differences(const fa::Problem& problem, uint64_t seed) {
  const fa::Inputs inputs = fa::random_inputs(problem, seed);
  const std::vector<float> grad_o = fa::random_output_gradient(problem, seed);
  const fa::GradientReference gradients = fa::reference_backward(inputs, grad_o, every_kv_head(problem));
  const struct {
    const char* name;
    std::vector<float> fa::Inputs::*tensor;
    const std::vector<double>& analytic;
  } checks[] = {
      {"dQ", &fa::Inputs::q, gradients.dq}, {"dK", &fa::Inputs::k, gradients.dk}, {"dV", &fa::Inputs::v, gradients.dv}};
  for (const auto& check : checks) {
    const std::vector<double> numeric = finite_differences(inputs, check.tensor, grad_o);
    REQUIRE(numeric.size() == check.analytic.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < numeric.size(); ++i) worst = std::max(worst, std::fabs(numeric[i] - check.analytic[i]));
    INFO(fa::describe(problem) << (problem.causal ? " causal" : "") << ": " << check.name
                               << " differs from central differences by " << worst);
    CHECK(worst < 1e-5);
  }
}

}  // namespace

TEST_CASE("common: reference backward equals central differences of the forward") {
  uint64_t seed = 1100;
  for (const bool causal : {false, true}) {
    check_against_finite_differences(fa::Problem::square(1, 2, 5, 3, causal), seed++);
    check_against_finite_differences(fa::Problem{1, 1, 1, 3, 6, 4, causal}, seed++);  // Nq < Nk
    check_against_finite_differences(fa::Problem{1, 1, 1, 6, 3, 4, causal}, seed++);  // Nq > Nk: blind rows
    check_against_finite_differences(fa::Problem{2, 4, 2, 4, 5, 3, causal}, seed++);  // grouped-query
    check_against_finite_differences(fa::Problem{1, 3, 1, 3, 3, 2, causal}, seed++);  // multi-query
  }
}

TEST_CASE("common: reference backward of a row that sees no key is zero") {
  // 6 queries over 3 keys, causal: rows 0..2 see nothing, so their dQ is exactly 0; and a key
  // that only blind rows would see does not exist (the last row sees every key).
  const fa::Problem problem{1, 1, 1, 6, 3, 4, true};
  const fa::Inputs inputs = fa::random_inputs(problem, 1110);
  const fa::GradientReference gradients =
      fa::reference_backward(inputs, fa::random_output_gradient(problem, 1110), {0});
  for (int64_t element = 0; element < 3 * problem.dim; ++element) {
    CHECK(gradients.dq[static_cast<std::size_t>(element)] == 0.0);
  }
  CHECK(std::any_of(gradients.dq.begin() + 3 * problem.dim, gradients.dq.end(), [](double x) { return x != 0.0; }));
}

TEST_CASE("common: reference backward of chosen groups equals the same groups of the whole") {
  const fa::Problem problem{3, 4, 2, 7, 9, 5, true};
  const fa::Inputs inputs = fa::random_inputs(problem, 1120);
  const std::vector<float> grad_o = fa::random_output_gradient(problem, 1120);
  const fa::GradientReference whole = fa::reference_backward(inputs, grad_o, every_kv_head(problem));
  const std::vector<int64_t> chosen = {1, 4};
  const fa::GradientReference part = fa::reference_backward(inputs, grad_o, chosen);
  const int64_t q_block = problem.group_size() * problem.q_seq * problem.dim;
  const int64_t kv_block = problem.kv_seq * problem.dim;
  for (std::size_t h = 0; h < chosen.size(); ++h) {
    for (int64_t i = 0; i < q_block; ++i) {
      CHECK(part.dq[h * q_block + i] == whole.dq[chosen[h] * q_block + i]);
      CHECK(part.dq_bound[h * q_block + i] == whole.dq_bound[chosen[h] * q_block + i]);
    }
    for (int64_t i = 0; i < kv_block; ++i) {
      CHECK(part.dk[h * kv_block + i] == whole.dk[chosen[h] * kv_block + i]);
      CHECK(part.dv[h * kv_block + i] == whole.dv[chosen[h] * kv_block + i]);
    }
  }
  const std::vector<int64_t> sampled = fa::kv_heads_to_check(fa::Problem{4, 16, 8, 4, 4, 4, false}, 3, 7);
  CHECK(sampled.size() == 3);
  CHECK(sampled.front() == 0);
  CHECK(sampled.back() == 31);
  CHECK(fa::kv_heads_to_check(problem, 6, 7) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(fa::kv_heads_to_check(problem, 2, 7) == std::vector<int64_t>{0, 5});
}

TEST_CASE("common: gradient bounds cover the values, and compare_gradient judges each element") {
  const fa::Problem problem{1, 2, 1, 8, 8, 4, false};
  const fa::Inputs inputs = fa::random_inputs(problem, 1130);
  const fa::GradientReference gradients =
      fa::reference_backward(inputs, fa::random_output_gradient(problem, 1130), {0});
  for (std::size_t i = 0; i < gradients.dk.size(); ++i) {
    CHECK(gradients.dk_bound[i] >= std::fabs(gradients.dk[i]));
    CHECK(gradients.dv_bound[i] >= std::fabs(gradients.dv[i]));
  }
  const double unit = fa::gradient_tolerance_unit(fa::Precision::fp16);
  CHECK(unit == Approx(4.0 * std::ldexp(1.0, -11)));
  CHECK(fa::gradient_tolerance_unit(fa::Precision::bf16) > unit);
  // The exact values pass; one element moved by twice its tolerance fails, alone; a NaN fails.
  std::vector<float> actual(gradients.dv.begin(), gradients.dv.end());
  CHECK(fa::compare_gradient(actual, gradients.dv, gradients.dv_bound, unit).passed());
  actual[5] += static_cast<float>(2.5 * unit * gradients.dv_bound[5]);
  const fa::ErrorReport moved = fa::compare_gradient(actual, gradients.dv, gradients.dv_bound, unit);
  CHECK_FALSE(moved.passed());
  CHECK(moved.beyond_tolerance == 1);
  CHECK(moved.summary().find("beyond their tolerance") != std::string::npos);
  actual[5] = std::nanf("");
  CHECK(fa::compare_gradient(actual, gradients.dv, gradients.dv_bound, unit).non_finite == 1);
}

TEST_CASE("common: the walkthrough's gradients are the reference's, and central differences of the forward agree") {
  // walkthrough.hpp: dO fixed, everything else computed in double. Checked here three ways: the
  // gradients against central differences of the forward (the definition), the printed
  // intermediates against the gradients they lead to, and dO's rows against what makes every row
  // of dS non-zero.
  const fa::WalkthroughBackward exact = fa::walkthrough_backward(fa::Precision::fp32);
  const fa::Inputs& inputs = exact.inputs;
  const int64_t seq = inputs.problem.q_seq;
  const int64_t dim = inputs.problem.dim;
  CHECK(exact.grad_o == std::vector<float>{1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 1.0f, -1.0f, 2.0f});
  CHECK(fa::walkthrough_backward(fa::Precision::fp16).grad_o == exact.grad_o);  // small integers: exact in 16 bits

  // The intermediates lead to the gradients: P's rows sum to 1, D_i = Σ_j P_ij dP_ij (which is
  // dO_i · O_i because O = P V), dQ = dS K·scale, dK = dSᵀ Q·scale, dV = Pᵀ dO; and no row of dS is 0.
  // The reference sums in its own order, and dP_ij − D_i of a nearly one-hot row is a difference
  // of numbers near 1: they agree to a few double units of 1 (the margin), not of the result.
  const auto at = [](int64_t row, int64_t column, int64_t columns) {
    return static_cast<std::size_t>(row * columns + column);
  };
  for (int64_t i = 0; i < seq; ++i) {
    double p_sum = 0.0;
    double delta = 0.0;
    double ds_sum = 0.0;
    for (int64_t j = 0; j < seq; ++j) {
      p_sum += exact.p[at(i, j, seq)];
      delta += exact.p[at(i, j, seq)] * exact.grad_p[at(i, j, seq)];
      ds_sum += std::fabs(exact.grad_s[at(i, j, seq)]);
    }
    INFO("row " << i);
    CHECK(p_sum == Approx(1.0).epsilon(1e-12));
    CHECK(delta == Approx(exact.delta[static_cast<std::size_t>(i)]).epsilon(1e-12));
    CHECK(ds_sum > 0.0);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (int64_t r = 0; r < seq; ++r) {
    for (int64_t d = 0; d < dim; ++d) {
      double dq = 0.0;
      double dk = 0.0;
      double dv = 0.0;
      for (int64_t j = 0; j < seq; ++j) {
        dq += exact.grad_s[at(r, j, seq)] * static_cast<double>(inputs.k[at(j, d, dim)]) * scale;
        dk += exact.grad_s[at(j, r, seq)] * static_cast<double>(inputs.q[at(j, d, dim)]) * scale;
        dv += exact.p[at(j, r, seq)] * static_cast<double>(exact.grad_o[at(j, d, dim)]);
      }
      INFO("row " << r << ", column " << d);
      CHECK(dq == Approx(exact.gradients.dq[at(r, d, dim)]).epsilon(1e-9).margin(1e-13));
      CHECK(dk == Approx(exact.gradients.dk[at(r, d, dim)]).epsilon(1e-9).margin(1e-13));
      CHECK(dv == Approx(exact.gradients.dv[at(r, d, dim)]).epsilon(1e-9).margin(1e-13));
    }
  }

  const struct {
    const char* name;
    std::vector<float> fa::Inputs::*tensor;
    const std::vector<double>& analytic;
  } checks[] = {{"dQ", &fa::Inputs::q, exact.gradients.dq},
                {"dK", &fa::Inputs::k, exact.gradients.dk},
                {"dV", &fa::Inputs::v, exact.gradients.dv}};
  for (const auto& check : checks) {
    const std::vector<double> numeric = finite_differences(inputs, check.tensor, exact.grad_o);
    REQUIRE(numeric.size() == check.analytic.size());
    for (std::size_t i = 0; i < numeric.size(); ++i) {
      INFO(check.name << " element " << i << ": " << check.analytic[i] << ", central differences " << numeric[i]);
      CHECK(std::fabs(numeric[i] - check.analytic[i]) < 1e-5);
    }
  }
}
