// The shared test contract every GPU stage runs (DESIGN.md), and the helpers GPU tests use.
//
// In a stage's test file:
//   #include "gpu_contract.hpp"
//   FA_GPU_STAGE_CONTRACT("stage08", fa::stages::mma_registers_fp16, fa::stages::mma_registers_bf16)
// defines the contract's test cases, all named "stage08: ...", each run for every descriptor
// listed (one per precision). Which cases check and which check refusals follows the stage's
// features: causal masking, grouped-query heads, Nq != Nk and the log-sum-exp are checked against
// the reference where the stage declares them, and must be refused with one clear line where it
// does not.
#pragma once

#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/runner.hpp"
#include "fa/stage.hpp"

namespace fa::test {

// ctest reports a test that exits with this code as Skipped (SKIP_RETURN_CODE).
constexpr int kSkipExitCode = 77;

// Prints "SKIPPED: why" and ends the test process with kSkipExitCode: every skip of the suite.
[[noreturn]] void skip(const std::string& why);

// Like require_stage_runnable, for tests of the harness itself.
void require_cuda_device(int min_compute_capability = 0);

// Ends the test process with exit code 77 (ctest reports it Skipped) when the stage cannot run
// here (no CUDA device, or a GPU it cannot run on), after printing why. With FA_REQUIRE_GPU=1 in
// the environment that is a test failure instead, so a GPU run cannot skip by accident.
void require_stage_runnable(const StageDescriptor& stage);

// Runs `stage` on `inputs` (rounded to its precision), compares `check_rows` rows (every row when
// 0; else the first and last of each head plus seeded random ones) with the double reference, and
// records the result with Catch2 (CHECK on the errors, with a readable message). With `lse` the
// stage also writes the log-sum-exp, checked the same way.
RunOutcome check_stage_on(const StageDescriptor& stage, const Inputs& inputs, int64_t check_rows = 0, bool lse = false);

// Square shapes for the contract: N and D not multiples of any tile, at least three K/V tiles
// plus a partial one, N smaller than a tile, B·H > 1; D capped at the stage's max_dim.
std::vector<Problem> contract_shapes(const StageDescriptor& stage);

// General shapes: GQA, MQA, Nq < Nk, Nq > Nk, Nq = 1, Nq = Nk = 1 (the caller adds causal).
std::vector<Problem> general_shapes(const StageDescriptor& stage);

using Factories = std::vector<StageDescriptor (*)()>;

void contract_shape_table(const Factories& stages);
void contract_walkthrough(const Factories& stages);
void contract_well_conditioned(const Factories& stages);
void contract_large_logits(const Factories& stages);
void contract_poison(const Factories& stages);
void contract_causal(const Factories& stages);
void contract_general_shapes(const Factories& stages);  // checked, or refused with one line
void contract_lse(const Factories& stages);             // checked, or refused with one line

}  // namespace fa::test

#define FA_GPU_STAGE_CONTRACT(prefix, ...)                                                                          \
  TEST_CASE(prefix ": matches the reference on the shape table") { fa::test::contract_shape_table({__VA_ARGS__}); } \
  TEST_CASE(prefix ": reproduces the N=4 walkthrough") { fa::test::contract_walkthrough({__VA_ARGS__}); }           \
  TEST_CASE(prefix ": every K/V tile counts (well-conditioned fixture)") {                                          \
    fa::test::contract_well_conditioned({__VA_ARGS__});                                                             \
  }                                                                                                                 \
  TEST_CASE(prefix ": logits of magnitude 1e3 stay finite and correct") {                                           \
    fa::test::contract_large_logits({__VA_ARGS__});                                                                 \
  }                                                                                                                 \
  TEST_CASE(prefix ": writes every output element (NaN poison)") { fa::test::contract_poison({__VA_ARGS__}); }      \
  TEST_CASE(prefix ": causal masking matches the reference") { fa::test::contract_causal({__VA_ARGS__}); }          \
  TEST_CASE(prefix ": general shapes (GQA, MQA, Nq != Nk) match the reference or are refused") {                    \
    fa::test::contract_general_shapes({__VA_ARGS__});                                                               \
  }                                                                                                                 \
  TEST_CASE(prefix ": the log-sum-exp matches the reference or is refused") { fa::test::contract_lse({__VA_ARGS__}); }
