// What the backward stages' tests share (stages 11 and 13): one backward call through the runner
// checked against the double reference's gradients, the general shapes, and the deterministic
// mode (fa/deterministic.hpp) for one test case.
#pragma once

#include <cstdint>
#include <vector>

#include "catch_compat.hpp"
#include "fa/deterministic.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/problem.hpp"
#include "fa/runner.hpp"
#include "fa/stage.hpp"

namespace fa::test {

// The stage's forward then its backward through the runner, every group compared with the reference.
inline void check_backward(const StageDescriptor& stage, const Inputs& inputs, uint64_t seed) {
  RunOptions options;
  options.problem = inputs.problem;
  options.pass = Pass::backward;
  options.seed = seed;
  options.time = false;
  options.check_kv_heads = inputs.problem.kv_heads_total();
  const RunOutcome outcome = run_stage_on(stage, inputs, options);
  // A checked run's note only repeats the summaries of the gradients that are wrong: the three
  // summaries say it once. A run that was not checked has nothing but its note.
  INFO(stage.id << " (" << precision_name(stage.precision) << ") " << describe(inputs.problem)
                << (inputs.problem.causal ? " causal" : "") << ": "
                << (outcome.checked ? "dQ " + outcome.grad_q_errors.summary() + "; dK " +
                                          outcome.grad_k_errors.summary() + "; dV " + outcome.grad_v_errors.summary()
                                    : "status " + outcome.row.status + ", " + outcome.row.note));
  // One check, so that a wrong gradient prints its message once (and the shape loop stops at the first).
  REQUIRE((outcome.exit_code == kExitOk && outcome.checked && outcome.row.pass == "bwd"));
}

inline void check_backward(const StageDescriptor& stage, const Problem& problem, uint64_t seed) {
  check_backward(stage, random_inputs(problem, seed), seed);
}

// The general shapes, each causal and not: GQA, MQA, Nq < Nk, Nq > Nk (blind causal rows), one
// query, one key.
inline std::vector<Problem> general_problems(int64_t dim) {
  std::vector<Problem> problems;
  for (const bool causal : {false, true}) {
    for (const Problem base : {Problem{2, 8, 2, 70, 70, dim, false}, Problem{1, 6, 1, 45, 45, dim, false},
                               Problem{1, 2, 2, 37, 150, dim, false}, Problem{2, 2, 1, 150, 37, dim, false},
                               Problem{1, 4, 2, 1, 77, dim, false}, Problem{3, 2, 2, 20, 1, dim, false}}) {
      Problem problem = base;
      problem.causal = causal;
      problems.push_back(problem);
    }
  }
  return problems;
}

// The deterministic mode for the life of the object: the backward stages order dQ's additions.
struct DeterministicMode : DeterministicBackward {
  DeterministicMode() : DeterministicBackward(true) {}
};

}  // namespace fa::test
