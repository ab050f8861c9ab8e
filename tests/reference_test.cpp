// The reference is what every stage is judged by, so it is tested against properties of
// attention that hold whatever the implementation.
#include "fa/reference.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"

namespace {

fa::Inputs small_inputs(uint64_t seed = 3) { return fa::random_inputs(fa::Problem::square(2, 2, 9, 5), seed); }

// softmax of one row of scores, computed here from exp directly (no max subtraction needed at
// these magnitudes): an independent check of the reference's weights.
std::vector<double> softmax(const std::vector<double>& scores, std::size_t begin, std::size_t count) {
  std::vector<double> p(count);
  double sum = 0.0;
  for (std::size_t j = 0; j < count; ++j) sum += p[j] = std::exp(scores[begin + j]);
  for (double& value : p) value /= sum;
  return p;
}

}  // namespace

TEST_CASE("common: reference softmax rows sum to 1 and reproduce O") {
  const fa::Inputs inputs = small_inputs();
  const fa::Problem& shape = inputs.problem;
  const std::vector<double> out = fa::reference_attention(inputs);
  for (int64_t head = 0; head < shape.q_heads_total(); ++head) {
    const std::vector<double> scores = fa::reference_scores(inputs, head);
    for (int64_t i = 0; i < shape.q_seq; ++i) {
      const std::vector<double> p =
          softmax(scores, static_cast<std::size_t>(i * shape.q_seq), static_cast<std::size_t>(shape.q_seq));
      CHECK(std::accumulate(p.begin(), p.end(), 0.0) == Approx(1.0).epsilon(1e-12));
      for (int64_t d = 0; d < shape.dim; ++d) {
        double expected = 0.0;
        for (int64_t j = 0; j < shape.q_seq; ++j) {
          expected += p[static_cast<std::size_t>(j)] *
                      inputs.v[static_cast<std::size_t>((head * shape.q_seq + j) * shape.dim + d)];
        }
        CHECK(out[static_cast<std::size_t>((head * shape.q_seq + i) * shape.dim + d)] ==
              Approx(expected).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("common: reference gives v when every V row is v") {
  fa::Inputs inputs = small_inputs();
  const int64_t dim = inputs.problem.dim;
  for (std::size_t i = 0; i < inputs.v.size(); ++i)
    inputs.v[i] = 0.25f * static_cast<float>(i % static_cast<std::size_t>(dim)) - 0.5f;
  const std::vector<double> out = fa::reference_attention(inputs);
  for (std::size_t i = 0; i < out.size(); ++i) {
    CHECK(out[i] == Approx(0.25 * static_cast<double>(i % static_cast<std::size_t>(dim)) - 0.5).margin(1e-12));
  }
}

TEST_CASE("common: reference is unchanged when keys are permuted with their values") {
  const fa::Inputs inputs = small_inputs();
  fa::Inputs permuted = inputs;
  const fa::Problem& shape = inputs.problem;
  std::vector<int64_t> order(static_cast<std::size_t>(shape.q_seq));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::reverse(order.begin(), order.end());
  std::rotate(order.begin(), order.begin() + 3, order.end());
  for (int64_t head = 0; head < shape.q_heads_total(); ++head) {
    for (int64_t j = 0; j < shape.q_seq; ++j) {
      for (int64_t d = 0; d < shape.dim; ++d) {
        const auto to = static_cast<std::size_t>((head * shape.q_seq + j) * shape.dim + d);
        const auto from =
            static_cast<std::size_t>((head * shape.q_seq + order[static_cast<std::size_t>(j)]) * shape.dim + d);
        permuted.k[to] = inputs.k[from];
        permuted.v[to] = inputs.v[from];
      }
    }
  }
  const std::vector<double> a = fa::reference_attention(inputs);
  const std::vector<double> b = fa::reference_attention(permuted);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(b[i] == Approx(a[i]).margin(1e-12));
}

TEST_CASE("common: reference stays finite and correct with logits of magnitude 1e3") {
  // Q·K/sqrt(D) up to ~1e3: exp would overflow without the max subtraction. With one key
  // far ahead of the others the answer is that key's value row.
  fa::Inputs inputs = fa::large_logit_inputs(fa::Problem::square(1, 1, 6, 4), 5);
  const std::vector<double> out = fa::reference_attention(inputs);
  const std::vector<double> scores = fa::reference_scores(inputs, 0);
  for (int64_t i = 0; i < 6; ++i) {
    const auto row = scores.begin() + i * 6;
    const auto best = std::max_element(row, row + 6);
    std::vector<double> sorted(row, row + 6);
    std::sort(sorted.rbegin(), sorted.rend());
    CHECK(sorted[0] > 50.0);
    for (int64_t d = 0; d < 4; ++d) {
      const double value = out[static_cast<std::size_t>(i * 4 + d)];
      CHECK(std::isfinite(value));
      if (sorted[0] - sorted[1] > 40.0) {  // the runner-up weighs less than e^-40
        CHECK(value == Approx(inputs.v[static_cast<std::size_t>((best - row) * 4 + d)]).margin(1e-12));
      }
    }
  }
}

TEST_CASE("common: reference agrees with the brute-force formula at tiny sizes") {
  // N = 2, D = 1: O = (e^{s0} v0 + e^{s1} v1) / (e^{s0} + e^{s1}), written out by hand.
  fa::Inputs inputs;
  inputs.problem = fa::Problem::square(1, 1, 2, 1);
  inputs.q = {0.5f, -1.5f};
  inputs.k = {2.0f, -0.75f};
  inputs.v = {3.0f, -4.0f};
  const std::vector<double> out = fa::reference_attention(inputs);
  for (int i = 0; i < 2; ++i) {
    const double s0 = inputs.q[i] * 2.0;
    const double s1 = inputs.q[i] * -0.75;
    const double expected = (std::exp(s0) * 3.0 + std::exp(s1) * -4.0) / (std::exp(s0) + std::exp(s1));
    CHECK(out[static_cast<std::size_t>(i)] == Approx(expected).epsilon(1e-14));
  }
  // N = 1: the only key gets all the weight, whatever the score.
  fa::Inputs single = fa::random_inputs(fa::Problem::square(1, 1, 1, 3), 9);
  const std::vector<double> one = fa::reference_attention(single);
  for (std::size_t d = 0; d < 3; ++d) CHECK(one[d] == Approx(single.v[d]).margin(1e-15));
}

TEST_CASE("common: reference row subset equals the same rows of the full output") {
  const fa::Inputs inputs = small_inputs(8);
  const std::vector<double> all = fa::reference_attention(inputs);
  const std::vector<int64_t> rows = fa::rows_to_check(inputs.problem, 7, 1);
  REQUIRE(rows.size() == 7);
  CHECK(std::find(rows.begin(), rows.end(), 0) != rows.end());
  CHECK(std::find(rows.begin(), rows.end(), inputs.problem.q_rows() - 1) != rows.end());
  const std::vector<double> some = fa::reference_rows(inputs, rows);
  const int64_t dim = inputs.problem.dim;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (int64_t d = 0; d < dim; ++d) {
      CHECK(some[r * static_cast<std::size_t>(dim) + static_cast<std::size_t>(d)] ==
            all[static_cast<std::size_t>(rows[r] * dim + d)]);
    }
  }
}

TEST_CASE("common: the walkthrough trace is computed and not typed in") {
  // Spot-check the exact trace against the definition worked here by hand in double: after
  // the first tile, row 0 has seen keys 0 and 1 only.
  const fa::Inputs inputs = fa::walkthrough_inputs();
  const fa::TileTrace trace = fa::reference_trace(inputs, fa::kWalkthroughTile);
  REQUIRE(trace.tiles == 2);
  const double s00 = (1.0 * 0.5 + 2.0 * 1.5) / std::sqrt(2.0);
  const double s01 = (1.0 * 2.5 + 2.0 * 3.5) / std::sqrt(2.0);
  CHECK(trace.m_at(0, 0) == Approx(s01).epsilon(1e-14));
  const double l = std::exp(s00 - s01) + 1.0;
  CHECK(trace.l_at(0, 0) == Approx(l).epsilon(1e-14));
  const double v0 = static_cast<double>(0.1f), v1 = static_cast<double>(0.3f);
  CHECK(trace.o_at(0, 0, 0) == Approx((std::exp(s00 - s01) * v0 + v1) / l).epsilon(1e-14));
  // The final tile's state is the full attention.
  const std::vector<double> out = fa::reference_attention(inputs);
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t d = 0; d < 2; ++d)
      CHECK(trace.o_at(1, r, d) == Approx(out[static_cast<std::size_t>(r * 2 + d)]).epsilon(1e-14));
  }
}

TEST_CASE("common: every K/V tile of the well-conditioned fixture carries visible weight") {
  const fa::Inputs inputs = fa::well_conditioned_inputs();
  const fa::Problem& shape = inputs.problem;
  for (int64_t head = 0; head < shape.q_heads_total(); ++head) {
    const std::vector<double> scores = fa::reference_scores(inputs, head);
    for (int64_t i = 0; i < shape.q_seq; ++i) {
      const std::vector<double> p =
          softmax(scores, static_cast<std::size_t>(i * shape.q_seq), static_cast<std::size_t>(shape.q_seq));
      for (int64_t j0 = 0; j0 < shape.q_seq; j0 += fa::kWalkthroughTile) {
        double share = 0.0;
        for (int64_t j = j0; j < std::min(shape.q_seq, j0 + fa::kWalkthroughTile); ++j)
          share += p[static_cast<std::size_t>(j)];
        CHECK(share > 0.1);  // even the one-key partial tile
      }
    }
  }
}
