// The shared test contract every GPU stage runs (design.md), and the helpers GPU tests use.
//
// In a stage's test file:
//   #include "gpu_contract.hpp"
//   FA_GPU_STAGE_CONTRACT("stage04", fa::stages::online_softmax)
// defines the contract's test cases, all named "stage04: ...".
#pragma once

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/runner.hpp"
#include "fa/stage.hpp"

namespace fa::test {

// ctest reports a test that exits with this code as Skipped (SKIP_RETURN_CODE).
constexpr int kSkipExitCode = 77;

// Like require_stage_runnable, for tests of the harness itself.
void require_cuda_device(int min_compute_capability = 0);

// Ends the test process with exit code 77 (ctest reports it Skipped) when the stage cannot run
// here (no CUDA device, or a GPU too old for it), after printing why. With FA_REQUIRE_GPU=1 in
// the environment that is a test failure instead, so a GPU run cannot skip by accident.
void require_stage_runnable(const StageDescriptor& stage);

// Runs `stage` on `inputs` (rounded to its precision), compares `check_rows` rows (every row when
// 0; else the first and last of each head plus seeded random ones) with the double reference, and
// records the result with Catch2 (CHECK on the errors, with a readable message).
RunOutcome check_stage_on(const StageDescriptor& stage, const Inputs& inputs, int64_t check_rows = 0);

// Shapes (B, H, N, D) for the contract: N and D not multiples of any tile, at least three K/V
// tiles plus a partial one, N smaller than a tile, B·H > 1; D capped at the stage's max_dim.
std::vector<Shape> contract_shapes(const StageDescriptor& stage);

void contract_shape_table(const StageDescriptor& stage);
void contract_walkthrough(const StageDescriptor& stage);
void contract_well_conditioned(const StageDescriptor& stage);
void contract_large_logits(const StageDescriptor& stage);
void contract_poison(const StageDescriptor& stage);
void contract_causal(const StageDescriptor& stage);

}  // namespace fa::test

#define FA_GPU_STAGE_CONTRACT(prefix, factory)                                                                  \
  TEST_CASE(prefix ": matches the reference on the shape table") { fa::test::contract_shape_table(factory()); } \
  TEST_CASE(prefix ": reproduces the N=4 walkthrough") { fa::test::contract_walkthrough(factory()); }           \
  TEST_CASE(prefix ": every K/V tile counts (well-conditioned fixture)") {                                      \
    fa::test::contract_well_conditioned(factory());                                                             \
  }                                                                                                             \
  TEST_CASE(prefix ": logits of magnitude 1e3 stay finite and correct") {                                       \
    fa::test::contract_large_logits(factory());                                                                 \
  }                                                                                                             \
  TEST_CASE(prefix ": writes every output element (NaN poison)") { fa::test::contract_poison(factory()); }      \
  TEST_CASE(prefix ": causal masking matches the reference") { fa::test::contract_causal(factory()); }
