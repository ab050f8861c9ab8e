#include "gpu_contract.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "fa/device.hpp"
#include "fa/reference.hpp"

namespace fa::test {
namespace {

bool gpu_required() {
  const char* value = std::getenv("FA_REQUIRE_GPU");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

void skip_or_fail(const std::string& why) {
  if (why.empty()) return;
  if (gpu_required()) FAIL(why + " -- and FA_REQUIRE_GPU=1, so this is a failure, not a skip");
  skip(why);
}

}  // namespace

void skip(const std::string& why) {
  std::cout << "SKIPPED: " << why << std::endl;
  std::exit(kSkipExitCode);
}

void require_cuda_device(int min_compute_capability) {
  const DeviceInfo device = query_device();
  if (!device.present) {
    skip_or_fail("no CUDA device: " + device.reason);
  } else if (device.compute_capability < min_compute_capability) {
    skip_or_fail("GPU too old: " + device.name + " is sm_" + std::to_string(device.compute_capability) +
                 ", this test needs sm_" + std::to_string(min_compute_capability));
  }
}

void require_stage_runnable(const StageDescriptor& stage) {
  skip_or_fail(stage_unavailable_reason(stage, query_device()));
}

RunOutcome check_stage_on(const StageDescriptor& stage, const Inputs& inputs, int64_t check_rows, bool lse) {
  RunOptions options;
  options.problem = inputs.problem;
  options.time = false;
  options.lse = lse;
  options.check_rows = check_rows > 0 ? check_rows : inputs.problem.q_rows();
  RunOutcome outcome = run_stage_on(stage, inputs, options);
  INFO(stage.id << " (" << precision_name(stage.precision) << ") at " << describe(inputs.problem)
                << (lse ? " with LSE" : "") << ": " << outcome.row.status << " " << outcome.row.note);
  CHECK(outcome.row.status == "ok");
  CHECK(outcome.checked);
  CHECK(outcome.errors.non_finite == 0);
  CHECK(outcome.errors.max_abs_err <= outcome.errors.tolerance);
  if (lse) {
    INFO("log-sum-exp: " << outcome.lse_errors.summary());
    CHECK(outcome.lse_errors.passed());
  }
  return outcome;
}

namespace {

// A stage must refuse what its features leave out, before running anything, with one line that
// names the stage.
void check_refused(const StageDescriptor& stage, const Problem& problem, bool lse) {
  RunOptions options;
  options.problem = problem;
  options.time = false;
  options.lse = lse;
  const RunOutcome outcome = run_stage_on(stage, random_inputs(problem, 3), options);
  INFO(stage.id << " at " << describe(problem) << (lse ? " with LSE" : "") << ": " << outcome.row.status << " "
                << outcome.row.note);
  CHECK(outcome.row.status == "unsupported");
  CHECK(outcome.exit_code == kExitBadInput);
  CHECK(outcome.row.note.find(stage.id) != std::string::npos);
  CHECK(outcome.row.note.find('\n') == std::string::npos);
  CHECK_FALSE(outcome.checked);
}

// The listed stages, each of which must be able to run here (require_stage_runnable skips or fails
// the test where one cannot).
std::vector<StageDescriptor> runnable_stages(const Factories& stages) {
  std::vector<StageDescriptor> descriptors;
  for (const auto factory : stages) {
    descriptors.push_back(factory());
    require_stage_runnable(descriptors.back());
  }
  return descriptors;
}

bool takes(const StageDescriptor& stage, const Problem& problem) { return unsupported_reason(stage, problem).empty(); }

}  // namespace

std::vector<Problem> contract_shapes(const StageDescriptor& stage) {
  // N: 1, below any tile, odd, and 517 = 4·128 + 5 / 8·64 + 5 / 16·32 + 5 (three or more
  // full tiles plus a partial one for every tile size up to 128). D: odd, small, and the
  // largest the stage takes.
  const std::vector<Problem> candidates = {
      Problem::square(1, 1, 1, 1),     Problem::square(2, 3, 3, 2),    Problem::square(1, 2, 17, 3),
      Problem::square(2, 1, 100, 16),  Problem::square(1, 2, 517, 64), Problem::square(2, 2, 257, 80),
      Problem::square(1, 1, 517, 128), Problem::square(3, 1, 65, 100), Problem::square(1, 2, 200, 256),
      Problem::square(1, 1, 130, 129),
  };
  std::vector<Problem> problems;
  for (Problem problem : candidates) {
    problem.dim = std::min(problem.dim, stage.max_dim);
    problems.push_back(problem);
  }
  return problems;
}

std::vector<Problem> general_shapes(const StageDescriptor& stage) {
  const int64_t dim = std::min<int64_t>(64, stage.max_dim);
  const int64_t wide = std::min<int64_t>(128, stage.max_dim);
  // {B, Hq, Hkv, Nq, Nk, D}: grouped-query (a group of 4), multi-query, fewer queries than keys
  // (a chunk of a longer sequence), more queries than keys (under the mask the first Nq - Nk rows
  // see nothing), one query row (decoding), and a single key.
  return {
      Problem{2, 8, 2, 150, 150, dim, false}, Problem{1, 6, 1, 97, 97, wide, false},
      Problem{1, 2, 2, 100, 333, dim, false}, Problem{2, 2, 1, 333, 100, wide, false},
      Problem{1, 4, 2, 1, 1000, wide, false}, Problem{3, 2, 2, 70, 1, dim, false},
      Problem{1, 4, 4, 1, 1, dim, false},
  };
}

void contract_shape_table(const Factories& stages) {
  for (const StageDescriptor& stage : runnable_stages(stages)) {
    uint64_t seed = 1;
    for (const Problem& problem : contract_shapes(stage)) check_stage_on(stage, random_inputs(problem, seed++));
  }
}

void contract_walkthrough(const Factories& stages) {
  for (const StageDescriptor& stage : runnable_stages(stages)) {
    check_stage_on(stage, walkthrough_inputs());
  }
}

void contract_well_conditioned(const Factories& stages) {
  for (const StageDescriptor& stage : runnable_stages(stages)) {
    check_stage_on(stage, well_conditioned_inputs());
  }
}

void contract_large_logits(const Factories& stages) {
  for (const StageDescriptor& stage : runnable_stages(stages)) {
    check_stage_on(stage, large_logit_inputs(Problem::square(2, 1, 300, std::min<int64_t>(64, stage.max_dim)), 7));
  }
}

void contract_poison(const Factories& stages) {
  for (const StageDescriptor& stage : runnable_stages(stages)) {
    // The runner fills O (and the LSE) with NaN before the run; a stage that skipped any element
    // would leave a NaN, which counts as a failure on its own. Every row is checked here.
    const RunOutcome outcome =
        check_stage_on(stage, random_inputs(Problem::square(2, 2, 131, 40), 11), 0, stage.features.lse);
    CHECK(outcome.errors.non_finite == 0);
  }
}

void contract_causal(const Factories& stages) {
  for (const auto factory : stages) {
    const StageDescriptor stage = factory();
    if (!stage.features.causal) {
      check_refused(stage, Problem::square(1, 1, 64, std::min<int64_t>(64, stage.max_dim), true), false);
      continue;
    }
    require_stage_runnable(stage);
    // Every shape of the table, masked: N = 1 (the one row sees only itself), N below any tile,
    // and N = 517, 257, 130 whose diagonal crosses partial tiles. Row 0 of every problem sees key
    // 0 alone, so its output must be V's row 0 (the reference checks every row).
    uint64_t seed = 100;
    for (Problem problem : contract_shapes(stage)) {
      problem.causal = true;
      check_stage_on(stage, random_inputs(problem, seed++));
    }
    // Logits of magnitude 1e3: a masked key with a large score that leaked into the row maximum
    // would underflow every visible exponential to 0 and leave 0/0.
    const int64_t dim = std::min<int64_t>(64, stage.max_dim);
    check_stage_on(stage, large_logit_inputs(Problem::square(2, 1, 300, dim, true), 13));
    // Many query tiles on the diagonal and B·H > 1, with every output element poisoned first.
    check_stage_on(stage, random_inputs(Problem::square(2, 3, 1000, std::min<int64_t>(128, stage.max_dim), true), 17));
  }
}

void contract_general_shapes(const Factories& stages) {
  for (const auto factory : stages) {
    const StageDescriptor stage = factory();
    uint64_t seed = 200;
    for (Problem problem : general_shapes(stage)) {
      for (const bool causal : {false, true}) {
        problem.causal = causal;
        if (causal && !stage.features.causal) continue;  // contract_causal checks that refusal
        if (!takes(stage, problem)) {
          // Refused in one place by the runner, on any machine: no GPU is needed to say no.
          check_refused(stage, problem, false);
          continue;
        }
        require_stage_runnable(stage);
        check_stage_on(stage, random_inputs(problem, seed++), 0, stage.features.lse);
      }
    }
  }
}

void contract_lse(const Factories& stages) {
  for (const auto factory : stages) {
    const StageDescriptor stage = factory();
    const Problem problem = Problem::square(2, 2, 257, std::min<int64_t>(64, stage.max_dim));
    if (!stage.features.lse) {
      check_refused(stage, problem, true);
      continue;
    }
    require_stage_runnable(stage);
    check_stage_on(stage, random_inputs(problem, 300), 0, true);
    // Large logits: LSE = m + log(l) must not overflow either.
    check_stage_on(stage, large_logit_inputs(problem, 301), 0, true);
    if (stage.features.causal) {
      Problem masked = problem;
      masked.causal = true;
      check_stage_on(stage, random_inputs(masked, 302), 0, true);
    }
  }
}

}  // namespace fa::test
