// Stage 01: the tiled algorithm against the double reference, the fixtures and the trace.
#include <algorithm>
#include <cmath>

#include "catch_compat.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa/runner.hpp"
#include "fa/stages.hpp"
#include "flash_attention_cpu.hpp"

namespace {

void check_tiled(const fa::Inputs& inputs, int64_t query_tile, int64_t key_tile) {
  std::vector<float> out(inputs.q.size(), NAN);
  fa::cpu::flash_attention(inputs.shape, inputs.q.data(), inputs.k.data(), inputs.v.data(), out.data(), query_tile,
                           key_tile);
  const double tolerance =
      fa::tolerance(fa::Precision::fp32, 1.0, fa::logit_bound(inputs.q, inputs.k, inputs.shape.dim));
  const fa::ErrorReport errors = fa::compare(out, fa::reference_attention(inputs), tolerance);
  INFO(fa::describe(inputs.shape) << " Br=" << query_tile << " Bc=" << key_tile << ": " << errors.summary());
  CHECK(errors.passed());
}

}  // namespace

TEST_CASE("stage01: tiled algorithm matches the reference on the shape table") {
  const int64_t n = GENERATE(1, 2, 3, 4, 17, 100, 257, 1000);
  const int64_t d = GENERATE(1, 2, 3, 16, 64, 80, 128);
  // B·H > 1 always; smaller heads counts at the largest N keep the test quick.
  const fa::Shape shape = n >= 257 ? fa::Shape{2, 1, n, d} : fa::Shape{2, 3, n, d};
  // Tiles that do not divide N (and, for small N, tiles larger than N).
  check_tiled(fa::random_inputs(shape, static_cast<uint64_t>(n * 1000 + d)), 7, 5);
}

TEST_CASE("stage01: causal masking matches the reference") {
  // N not a multiple of the tiles, N smaller than a tile, and row 0 whose only key is itself.
  for (const fa::Shape base : {fa::Shape{2, 2, 37, 16}, fa::Shape{1, 3, 5, 8}, fa::Shape{1, 1, 1, 4}}) {
    fa::Shape shape = base;
    shape.causal = true;
    const int64_t tile = GENERATE(1, 4, 16);
    check_tiled(fa::random_inputs(shape, static_cast<uint64_t>(shape.seq)), tile, tile + 3);
  }
}

TEST_CASE("stage01: causal per-tile trace matches the exact trace") {
  fa::Inputs inputs = fa::well_conditioned_inputs();
  inputs.shape.causal = true;
  const fa::TileTrace exact = fa::reference_trace(inputs, fa::kWalkthroughTile);
  fa::TileTrace actual;
  REQUIRE(fa::stages::cpu_tiled().trace(inputs.shape, inputs.q.data(), inputs.k.data(), inputs.v.data(),
                                        fa::kWalkthroughTile, actual) == cudaSuccess);
  REQUIRE(actual.m.size() == exact.m.size());
  for (std::size_t i = 0; i < exact.m.size(); ++i) {
    CHECK(actual.m[i] == Approx(exact.m[i]).epsilon(1e-6).margin(1e-6));
    CHECK(actual.l[i] == Approx(exact.l[i]).epsilon(1e-6));
  }
}

TEST_CASE("stage01: any tile sizes give the same answer") {
  const fa::Inputs inputs = fa::random_inputs(fa::Shape{1, 2, 50, 24}, 4);
  const int64_t br = GENERATE(1, 3, 16, 64);
  const int64_t bc = GENERATE(1, 2, 13, 50, 64);
  check_tiled(inputs, br, bc);
}

TEST_CASE("stage01: stage descriptor passes the runner's check") {
  fa::RunOptions options;
  options.shape = fa::Shape{2, 2, 130, 48};
  options.time = false;
  options.check_rows = options.shape.rows();
  const fa::RunOutcome outcome = fa::run_stage(fa::stages::cpu_tiled(), options);
  INFO(outcome.row.note);
  CHECK(outcome.row.status == "ok");
  CHECK(outcome.checked);
  CHECK(outcome.errors.passed());
}

TEST_CASE("stage01: logits of magnitude 1e3 stay finite and correct") {
  check_tiled(fa::large_logit_inputs(fa::Shape{2, 1, 300, 64}, 7), 16, 16);
}

TEST_CASE("stage01: reproduces the walkthrough and the well-conditioned fixture") {
  check_tiled(fa::walkthrough_inputs(), fa::kWalkthroughTile, fa::kWalkthroughTile);
  check_tiled(fa::well_conditioned_inputs(), fa::kWalkthroughTile, fa::kWalkthroughTile);
}

TEST_CASE("stage01: per-tile m and l and O match the exact walkthrough trace") {
  for (const fa::Inputs& inputs : {fa::walkthrough_inputs(), fa::well_conditioned_inputs()}) {
    const fa::TileTrace exact = fa::reference_trace(inputs, fa::kWalkthroughTile);
    fa::TileTrace actual;
    REQUIRE(fa::stages::cpu_tiled().trace(inputs.shape, inputs.q.data(), inputs.k.data(), inputs.v.data(),
                                          fa::kWalkthroughTile, actual) == cudaSuccess);
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
