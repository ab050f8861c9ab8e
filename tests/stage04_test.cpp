// Stage 04: the shared GPU contract; the per-tile online-softmax state (m, l and O after every K/V
// tile) against the exact one, with and without causal masking; many heads.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/reference.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

FA_GPU_STAGE_CONTRACT("stage04", fa::stages::online_softmax)

namespace {

// FP32 bounds: m and l to 1e-5 relative (absolute below magnitude 1), O / l to 1e-5 absolute.
constexpr double kStateTolerance = 1e-5;
constexpr double kOutputTolerance = 1e-5;

double state_error(double actual, double expected) {
  return std::abs(actual - expected) / std::max(1.0, std::abs(expected));
}

// Runs the stage's Br = Bc = 2 trace on `inputs` and compares it, tile by tile and row by row,
// with the exact trace of the reference.
void check_trace(const fa::Inputs& inputs) {
  const fa::StageDescriptor stage = fa::stages::online_softmax();
  fa::test::require_stage_runnable(stage);
  REQUIRE(stage.trace != nullptr);

  fa::TileTrace expected = fa::reference_trace(inputs, fa::kWalkthroughTile);
  fa::TileTrace traced;
  const fa::Status status =
      stage.trace(inputs.problem, inputs.q.data(), inputs.k.data(), inputs.v.data(), fa::kWalkthroughTile, traced);
  INFO(status.reason());
  REQUIRE(status.ok());
  REQUIRE(traced.tile == expected.tile);
  REQUIRE(traced.tiles == expected.tiles);
  REQUIRE(traced.rows == expected.rows);
  REQUIRE(traced.dim == expected.dim);
  REQUIRE(traced.m.size() == expected.m.size());
  REQUIRE(traced.l.size() == expected.l.size());
  REQUIRE(traced.o.size() == expected.o.size());

  for (int64_t t = 0; t < expected.tiles; ++t) {
    for (int64_t r = 0; r < expected.rows; ++r) {
      INFO("after K/V tile " << t << ", row " << r << ": m " << traced.m_at(t, r) << " (exact " << expected.m_at(t, r)
                             << "), l " << traced.l_at(t, r) << " (exact " << expected.l_at(t, r) << ")");
      CHECK(state_error(traced.m_at(t, r), expected.m_at(t, r)) <= kStateTolerance);
      CHECK(state_error(traced.l_at(t, r), expected.l_at(t, r)) <= kStateTolerance);
      for (int64_t d = 0; d < expected.dim; ++d) {
        INFO("O/l at d = " << d << ": " << traced.o_at(t, r, d) << " (exact " << expected.o_at(t, r, d) << ")");
        CHECK(std::abs(traced.o_at(t, r, d) - expected.o_at(t, r, d)) <= kOutputTolerance);
      }
    }
  }
}

}  // namespace

TEST_CASE("stage04: trace reproduces the walkthrough's per-tile m, l and O") { check_trace(fa::walkthrough_inputs()); }

// The walkthrough's weights are nearly one-hot, so it barely sees a wrong rescaling; here every
// tile carries a visible share of each row's weight.
TEST_CASE("stage04: trace matches the exact per-tile state on the well-conditioned fixture") {
  check_trace(fa::well_conditioned_inputs());
}

// A partial last K/V tile (N odd), D off every bucket, several heads.
TEST_CASE("stage04: trace matches the exact per-tile state with a partial last tile and B*H > 1") {
  check_trace(fa::random_inputs(fa::Problem::square(2, 3, 7, 5), 11));
}

// With causal masking the trace kernel runs every tile (the skipped ones wholly masked), so the
// state after a tile above a row's diagonal must be that row's final state.
TEST_CASE("stage04: trace matches the exact per-tile state with causal masking") {
  fa::Inputs walkthrough = fa::walkthrough_inputs();
  walkthrough.problem.causal = true;
  check_trace(walkthrough);
  check_trace(fa::random_inputs(fa::Problem::square(2, 3, 7, 5, true), 12));
}

// No GPU needed: the trace is compiled for the walkthrough's tiles only.
TEST_CASE("stage04: trace refuses tile sizes other than the walkthrough's") {
  const fa::StageDescriptor stage = fa::stages::online_softmax();
  REQUIRE(stage.trace != nullptr);
  const fa::Inputs inputs = fa::walkthrough_inputs();
  for (const int64_t tile : {int64_t{1}, int64_t{3}, int64_t{64}}) {
    fa::TileTrace traced;
    const fa::Status status =
        stage.trace(inputs.problem, inputs.q.data(), inputs.k.data(), inputs.v.data(), tile, traced);
    CHECK(status.code() == fa::Status::Code::unsupported);
    CHECK_FALSE(status.reason().empty());
  }
}

// No GPU needed: the trace is its own entry point (the runner's checks do not stand before it), so
// it refuses sizes out of range and problems other than square ones before touching anything.
TEST_CASE("stage04: trace refuses problems the stage does not take") {
  const fa::StageDescriptor stage = fa::stages::online_softmax();
  REQUIRE(stage.trace != nullptr);
  const fa::Inputs inputs = fa::walkthrough_inputs();
  fa::Problem rectangular = inputs.problem;
  rectangular.kv_seq = 2;
  fa::Problem grouped = fa::Problem::square(1, 2, 4, 2);
  grouped.kv_heads = 1;
  for (const fa::Problem& problem :
       {fa::Problem::square(1, 1, 4, 257), fa::Problem::square(1, 1, 0, 2), rectangular, grouped}) {
    fa::TileTrace traced;
    const fa::Status status =
        stage.trace(problem, inputs.q.data(), inputs.k.data(), inputs.v.data(), fa::kWalkthroughTile, traced);
    INFO(fa::describe(problem));
    CHECK(status.code() == fa::Status::Code::unsupported);
  }
}

// B·H = 65792 heads: the work items (query tile, head) are numbered in one grid dimension, with the
// head the fast index under causal masking and the slow one without.
TEST_CASE("stage04: B*H = 65792 heads, causal and not") {
  const fa::StageDescriptor stage = fa::stages::online_softmax();
  fa::test::require_stage_runnable(stage);
  for (const bool causal : {false, true}) {
    fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(257, 256, 3, 5, causal), 3));
  }
}
