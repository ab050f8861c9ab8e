// Stage 01: the tiled algorithm against the double reference, the fixtures and the trace.
#include <algorithm>
#include <cmath>
#include <vector>

#include "catch_compat.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa/runner.hpp"
#include "fa/stages.hpp"
#include "flash_attention_cpu.hpp"

namespace {

// O and the log-sum-exp of the tiled algorithm against the double reference.
void check_tiled(const fa::Inputs& inputs, int64_t query_tile, int64_t key_tile) {
  std::vector<float> out(inputs.q.size(), NAN);
  std::vector<float> lse(static_cast<std::size_t>(inputs.problem.q_rows()), NAN);
  fa::cpu::flash_attention(inputs.problem, inputs.q.data(), inputs.k.data(), inputs.v.data(), out.data(), lse.data(),
                           query_tile, key_tile);
  const double bound = fa::logit_bound(inputs.q, inputs.k, inputs.problem.dim);
  std::vector<double> expected_lse;
  const std::vector<double> expected = fa::reference_attention(inputs, &expected_lse);
  const fa::ErrorReport errors = fa::compare(out, expected, fa::tolerance(fa::Precision::fp32, 1.0, bound));
  const fa::ErrorReport lse_errors = fa::compare_lse(lse, expected_lse, fa::lse_tolerance(bound));
  INFO(fa::describe(inputs.problem) << " Br=" << query_tile << " Bc=" << key_tile << ": O " << errors.summary()
                                    << "; LSE " << lse_errors.summary());
  CHECK((errors.passed() && lse_errors.passed()));  // one check: a failure prints the message once
}

}  // namespace

TEST_CASE("stage01: tiled algorithm matches the reference on the shape table") {
  const int64_t n = GENERATE(1, 2, 3, 4, 17, 100, 257, 1000);
  const int64_t d = GENERATE(1, 2, 3, 16, 64, 80, 128);
  // B·H > 1 always; smaller heads counts at the largest N keep the test quick.
  const fa::Problem shape = n >= 257 ? fa::Problem::square(2, 1, n, d) : fa::Problem::square(2, 3, n, d);
  // Tiles that do not divide N (and, for small N, tiles larger than N).
  check_tiled(fa::random_inputs(shape, static_cast<uint64_t>(n * 1000 + d)), 7, 5);
}

TEST_CASE("stage01: causal masking matches the reference") {
  // N not a multiple of the tiles, N smaller than a tile, and row 0 whose only key is itself.
  for (const fa::Problem base :
       {fa::Problem::square(2, 2, 37, 16), fa::Problem::square(1, 3, 5, 8), fa::Problem::square(1, 1, 1, 4)}) {
    fa::Problem shape = base;
    shape.causal = true;
    const int64_t tile = GENERATE(1, 4, 16);
    check_tiled(fa::random_inputs(shape, static_cast<uint64_t>(shape.q_seq)), tile, tile + 3);
  }
}

TEST_CASE("stage01: general shapes: grouped-query heads, Nq != Nk, the bottom-right causal mask") {
  // {B, Hq, Hkv, Nq, Nk, D}: GQA, MQA, a chunk of queries at the end of a longer sequence, more
  // queries than keys (the first Nq - Nk causal rows see nothing: O = 0, LSE = -inf), one query
  // (decoding), one key.
  const std::vector<fa::Problem> problems = {
      {2, 8, 2, 37, 37, 16, false}, {1, 6, 1, 29, 29, 8, false}, {1, 2, 2, 13, 50, 8, false},
      {2, 2, 1, 50, 13, 8, false},  {1, 4, 2, 1, 77, 16, false}, {3, 2, 2, 20, 1, 4, false},
  };
  uint64_t seed = 50;
  for (fa::Problem problem : problems) {
    for (const bool causal : {false, true}) {
      problem.causal = causal;
      const int64_t tile = GENERATE(1, 4, 16);
      check_tiled(fa::random_inputs(problem, seed++), tile, tile + 3);
    }
  }
}

TEST_CASE("stage01: under the mask a row past Nk keys' reach outputs zeros and LSE = -inf") {
  const fa::Inputs inputs = fa::random_inputs(fa::Problem{1, 1, 1, 5, 3, 4, true}, 8);
  std::vector<float> out(inputs.q.size(), NAN);
  std::vector<float> lse(5, NAN);
  fa::cpu::flash_attention(inputs.problem, inputs.q.data(), inputs.k.data(), inputs.v.data(), out.data(), lse.data(), 2,
                           2);
  for (int64_t row = 0; row < 2; ++row) {  // rows 0 and 1 see no key
    CHECK(std::isinf(lse[static_cast<std::size_t>(row)]));
    CHECK(lse[static_cast<std::size_t>(row)] < 0.0f);
    for (int64_t d = 0; d < 4; ++d) CHECK(out[static_cast<std::size_t>(row * 4 + d)] == 0.0f);
  }
  // Row 2 sees key 0 alone: its output is V's row 0, and its LSE the one score.
  for (int64_t d = 0; d < 4; ++d) CHECK(out[static_cast<std::size_t>(2 * 4 + d)] == Approx(inputs.v[d]));
  double score = 0.0;
  for (int64_t d = 0; d < 4; ++d) score += static_cast<double>(inputs.q[static_cast<std::size_t>(8 + d)]) * inputs.k[d];
  CHECK(lse[2] == Approx(score / 2.0).margin(1e-6));
}

TEST_CASE("stage01: causal per-tile trace matches the exact trace") {
  fa::Inputs inputs = fa::well_conditioned_inputs();
  inputs.problem.causal = true;
  const fa::TileTrace exact = fa::reference_trace(inputs, fa::kWalkthroughTile);
  fa::TileTrace actual;
  REQUIRE(fa::stages::cpu_tiled()
              .trace(inputs.problem, inputs.q.data(), inputs.k.data(), inputs.v.data(), fa::kWalkthroughTile, actual)
              .ok());
  REQUIRE(actual.m.size() == exact.m.size());
  for (std::size_t i = 0; i < exact.m.size(); ++i) {
    CHECK(actual.m[i] == Approx(exact.m[i]).epsilon(1e-6).margin(1e-6));
    CHECK(actual.l[i] == Approx(exact.l[i]).epsilon(1e-6));
  }
}

TEST_CASE("stage01: any tile sizes give the same answer") {
  const fa::Inputs inputs = fa::random_inputs(fa::Problem::square(1, 2, 50, 24), 4);
  const int64_t br = GENERATE(1, 3, 16, 64);
  const int64_t bc = GENERATE(1, 2, 13, 50, 64);
  check_tiled(inputs, br, bc);
}

TEST_CASE("stage01: stage descriptor passes the runner's check") {
  fa::RunOptions options;
  options.problem = fa::Problem::square(2, 2, 130, 48);
  options.time = false;
  options.check_rows = options.problem.q_rows();
  const fa::RunOutcome outcome = fa::run_stage(fa::stages::cpu_tiled(), options);
  INFO(outcome.row.note);
  CHECK(outcome.row.status == "ok");
  CHECK(outcome.checked);
  CHECK(outcome.errors.passed());
}

TEST_CASE("stage01: logits of magnitude 1e3 stay finite and correct") {
  check_tiled(fa::large_logit_inputs(fa::Problem::square(2, 1, 300, 64), 7), 16, 16);
}

TEST_CASE("stage01: reproduces the walkthrough and the well-conditioned fixture") {
  check_tiled(fa::walkthrough_inputs(), fa::kWalkthroughTile, fa::kWalkthroughTile);
  check_tiled(fa::well_conditioned_inputs(), fa::kWalkthroughTile, fa::kWalkthroughTile);
}

TEST_CASE("stage01: per-tile m and l and O match the exact walkthrough trace") {
  for (const fa::Inputs& inputs : {fa::walkthrough_inputs(), fa::well_conditioned_inputs()}) {
    const fa::TileTrace exact = fa::reference_trace(inputs, fa::kWalkthroughTile);
    fa::TileTrace actual;
    REQUIRE(fa::stages::cpu_tiled()
                .trace(inputs.problem, inputs.q.data(), inputs.k.data(), inputs.v.data(), fa::kWalkthroughTile, actual)
                .ok());
    REQUIRE(actual.tiles == exact.tiles);
    REQUIRE(actual.rows == exact.rows);
    for (int64_t t = 0; t < exact.tiles; ++t) {
      for (int64_t r = 0; r < exact.rows; ++r) {
        INFO("tile " << t << " row " << r);
        CHECK(actual.m_at(t, r) == Approx(exact.m_at(t, r)).epsilon(1e-6).margin(1e-6));
        CHECK(actual.l_at(t, r) == Approx(exact.l_at(t, r)).epsilon(1e-6));
        for (int64_t d = 0; d < exact.dim; ++d) CHECK(actual.o_at(t, r, d) == Approx(exact.o_at(t, r, d)).margin(1e-6));
      }
    }
  }
}

TEST_CASE("stage01: a dropped K/V tile is caught by the well-conditioned fixture") {
  // The trace after the next-to-last tile is attention without the last tile: it must differ
  // from the final answer by far more than the tolerance, or the fixture could not catch it.
  const fa::Inputs inputs = fa::well_conditioned_inputs();
  const fa::TileTrace exact = fa::reference_trace(inputs, fa::kWalkthroughTile);
  double largest_change = 0.0;
  for (int64_t r = 0; r < exact.rows; ++r) {
    for (int64_t d = 0; d < exact.dim; ++d) {
      largest_change =
          std::max(largest_change, std::fabs(exact.o_at(exact.tiles - 1, r, d) - exact.o_at(exact.tiles - 2, r, d)));
    }
  }
  CHECK(largest_change > 10 * fa::tolerance(fa::Precision::fp16, 1.0));
}
