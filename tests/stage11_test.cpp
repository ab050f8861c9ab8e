// Stage 11: the backward pass. The plain C++ version (no GPU needed) and the mma.sync kernel (FP16
// and BF16, sm_80 and newer) both against the double reference's gradients (reference.hpp,
// reference_backward), every (batch, K/V head) group checked, with per-element tolerances derived
// from 16-bit rounding (metrics.hpp, gradient_tolerance_unit). The runner poisons dQ, dK and dV
// with NaN before the backward pass, so an unwritten element fails.
//
// Structural tests (tests/structural_tests.cmake, SOURCE stages/11_backward/backward_mma.cu, ARCH
// 80 and 90): the PTX must use mma.sync in both precisions, ldmatrix plain and transposing,
// cp.async, and FP32 atomic adds for dQ (red.global.add.f32 or atom.global.add.f32); ptxas must
// report no spills (dK and dV live in registers: a spill would put them in local memory).
// On a machine without a GPU (or with one older than sm_80) the GPU cases report skipped.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "backward_contract.hpp"
#include "backward_cpu.hpp"
#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/problem.hpp"
#include "fa/reference.hpp"
#include "fa/runner.hpp"
#include "fa/stage.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

// The forward is stage 08's: the shared contract holds for it here too.
FA_GPU_STAGE_CONTRACT("stage11", fa::stages::backward_fp16, fa::stages::backward_bf16)

namespace {

const std::initializer_list<fa::StageDescriptor (*)()> kGpuStages = {fa::stages::backward_fp16,
                                                                     fa::stages::backward_bf16};

using fa::test::check_backward;
using fa::test::general_problems;

// fa_course beside this test program, in bin/ of the same build folder (build-exercise/ for
// scripts/check_exercises.sh 11): its --walkthrough shows the C++ backward's gradients.
std::string course_program() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string("bin/fa_course") : (self.parent_path() / "fa_course").string();
}

std::string last_line(const std::string& text) {
  std::string trimmed = text;
  while (!trimmed.empty() && trimmed.back() == '\n') trimmed.pop_back();
  return trimmed.substr(trimmed.rfind('\n') + 1);
}

}  // namespace

TEST_CASE("stage11: the C++ backward gives the N=4 walkthrough's exact dQ, dK and dV") {
  // The walkthrough's verdict (runner.hpp, run_walkthrough) on the fixture and its fixed dO
  // (walkthrough.hpp): the line names the gradient, row and column that differ.
  std::ostringstream out;
  const int code = fa::run_walkthrough(fa::stages::backward_cpu(), out);
  // The command on a line of its own: Catch2 wraps longer lines, and would break it.
  INFO(last_line(out.str()) << "\nEvery gradient beside its exact value, with D_i, P and dS to check by hand:\n"
                            << course_program() << " --walkthrough");
  CHECK(code == fa::kExitOk);
}

TEST_CASE("stage11: the C++ backward matches the reference gradients on the shape table") {
  const fa::StageDescriptor stage = fa::stages::backward_cpu();
  uint64_t seed = 1100;
  for (const int64_t seq : {1, 2, 17, 64, 65, 130}) {
    for (const int64_t dim : {1, 3, 16, 64, 80}) {
      check_backward(stage, fa::Problem::square(2, 2, seq, dim), seed++);
      check_backward(stage, fa::Problem::square(1, 2, seq, dim, true), seed++);
    }
  }
}

TEST_CASE("stage11: the C++ backward takes grouped-query heads, Nq != Nk and the bottom-right causal mask") {
  uint64_t seed = 1150;
  for (const fa::Problem& problem : general_problems(24)) check_backward(fa::stages::backward_cpu(), problem, seed++);
}

TEST_CASE("stage11: the C++ backward's tiles do not change its gradients (N=4 walkthrough, well-conditioned)") {
  // Tiles of 1, 2 (the walkthrough's) and 3 rows (not dividing N), against the reference.
  for (const fa::Inputs& inputs : {fa::walkthrough_inputs(), fa::well_conditioned_inputs()}) {
    const fa::Problem& problem = inputs.problem;
    const std::vector<float> grad_o = fa::random_output_gradient(problem, 1170);
    std::vector<double> expected_lse;
    const std::vector<double> out_double = fa::reference_attention(inputs, &expected_lse);
    const std::vector<float> out(out_double.begin(), out_double.end());
    const std::vector<float> lse(expected_lse.begin(), expected_lse.end());
    std::vector<int64_t> heads(static_cast<std::size_t>(problem.kv_heads_total()));
    for (std::size_t h = 0; h < heads.size(); ++h) heads[h] = static_cast<int64_t>(h);
    const fa::GradientReference expected = fa::reference_backward(inputs, grad_o, heads);
    const double unit =
        fa::gradient_tolerance_unit(fa::Precision::fp32, fa::logit_bound(inputs.q, inputs.k, problem.dim));
    for (const int64_t tile : {1, 2, 3}) {
      std::vector<float> grad_q(inputs.q.size(), NAN), grad_k(inputs.k.size(), NAN), grad_v(inputs.v.size(), NAN);
      std::vector<float> row_delta(static_cast<std::size_t>(problem.q_rows()));
      fa::cpu::attention_backward(problem, inputs.q.data(), inputs.k.data(), inputs.v.data(), out.data(), grad_o.data(),
                                  lse.data(), grad_q.data(), grad_k.data(), grad_v.data(), row_delta.data(), tile,
                                  tile);
      const fa::ErrorReport dq = fa::compare_gradient(grad_q, expected.dq, expected.dq_bound, unit);
      const fa::ErrorReport dk = fa::compare_gradient(grad_k, expected.dk, expected.dk_bound, unit);
      const fa::ErrorReport dv = fa::compare_gradient(grad_v, expected.dv, expected.dv_bound, unit);
      INFO(fa::describe(problem) << " tiles of " << tile << ": dQ " << dq.summary() << "; dK " << dk.summary()
                                 << "; dV " << dv.summary());
      CHECK((dq.passed() && dk.passed() && dv.passed()));  // one check: a failure prints the message once
    }
  }
}

TEST_CASE("stage11: the runner's backward pass reports a bwd row with the backward's FLOPs") {
  // The CPU stage through run_stage (random inputs from the seed): timed, checked, pass = bwd.
  fa::RunOptions options;
  options.problem = fa::Problem{1, 4, 2, 100, 90, 32, true};
  options.pass = fa::Pass::backward;
  options.warmup = 0;
  options.reps = 1;
  const fa::RunOutcome outcome = fa::run_stage(fa::stages::backward_cpu(), options);
  INFO(outcome.row.note);
  CHECK(outcome.exit_code == fa::kExitOk);
  CHECK(outcome.row.pass == "bwd");
  CHECK(outcome.row.ms_median > 0.0);
  CHECK(outcome.row.tflops ==
        Approx(fa::attention_flops(options.problem, fa::Pass::backward) / (outcome.row.ms_median * 1e-3) / 1e12));
  CHECK(outcome.row.peak_bytes >= fa::minimum_bytes(options.problem, 4, fa::Pass::backward));
  // A stage without a backward pass (stage 01) is refused with one line, before anything runs.
  const fa::RunOutcome refused = fa::run_stage(fa::stages::cpu_tiled(), options);
  CHECK(refused.exit_code == fa::kExitBadInput);
  CHECK(refused.row.status == "unsupported");
  CHECK(refused.row.note.find("has no backward pass") != std::string::npos);
}

TEST_CASE("stage11: describes what it takes") {
  // Needs no device.
  for (const auto factory : kGpuStages) {
    const fa::StageDescriptor stage = factory();
    CHECK(stage.max_dim == 256);
    CHECK(stage.architecture.compute_capability == 80);
    CHECK(stage.features.backward);
    CHECK(stage.features.lse);
    CHECK(stage.features.causal);
    CHECK(stage.features.grouped);
    CHECK(stage.features.rectangular);
    REQUIRE(stage.backward != nullptr);
    const fa::Problem problem = fa::Problem::square(2, 3, 100, 64);
    CHECK(fa::workspace_bytes(stage, problem, fa::Pass::forward) == 0);
    // The workspace: the FP32 dQ, each query head's 100 rows rounded up to 128 (whole query tiles
    // of any tiling), in rows of the head-dim bucket (64 here, 128 at D = 72), then D.
    CHECK(fa::workspace_bytes(stage, problem, fa::Pass::backward) ==
          4 * (problem.q_heads_total() * 128 * 64 + problem.q_rows()));
    const fa::Problem wider = fa::Problem::square(2, 3, 100, 72);
    CHECK(fa::workspace_bytes(stage, wider, fa::Pass::backward) ==
          4 * (wider.q_heads_total() * 128 * 128 + wider.q_rows()));
    CHECK_FALSE(fa::unsupported_reason(stage, fa::Problem::square(1, 1, 64, 257), true, fa::Pass::backward).empty());
    CHECK(fa::unsupported_reason(stage, fa::Problem{2, 8, 2, 70, 35, 100, true}, true, fa::Pass::backward).empty());
  }
  const fa::StageDescriptor cpu = fa::stages::backward_cpu();
  CHECK(cpu.backend == fa::Backend::cpu);
  CHECK(cpu.features.backward);
  CHECK(cpu.max_dim == 256);
}

TEST_CASE("stage11: the mma.sync backward matches the reference gradients in both buckets") {
  // D % 8 == 0 takes cp.async, others the synchronous copies; 8 .. 64 use the 64 bucket, 72 .. 128
  // the 128 bucket (Br = 64 and 32), 136 .. 256 the 256 bucket (two blocks per key tile, each half
  // the dims). N = 1, 31 (less than a tile), 64 (exactly one), 65, 130, 197 (several query and key
  // tiles, partial last ones).
  for (const auto factory : kGpuStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1200;
    for (const int64_t seq : {1, 31, 64, 65, 130, 197}) {
      for (const int64_t dim : {1, 8, 17, 40, 64, 72, 100, 128, 130, 136, 200, 256}) {
        check_backward(stage, fa::Problem::square(2, 2, seq, dim), seed++);
      }
    }
  }
}

TEST_CASE("stage11: the mma.sync backward under the causal mask") {
  // Diagonal tiles whole (64, 128) or partial (65, 100, 333); query tiles skipped above the diagonal.
  for (const auto factory : kGpuStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1300;
    for (const int64_t seq : {1, 5, 63, 64, 65, 100, 128, 333}) {
      for (const int64_t dim : {40, 64, 100, 128, 256}) {
        check_backward(stage, fa::Problem::square(2, 1, seq, dim, true), seed++);
      }
    }
  }
}

TEST_CASE("stage11: the mma.sync backward takes grouped-query heads and Nq != Nk") {
  // dK and dV summed over a group's query heads; the causal mask bottom-right, with blind rows.
  for (const auto factory : kGpuStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1400;
    for (const int64_t dim : {64, 128, 72, 100, 192}) {
      for (const fa::Problem& problem : general_problems(dim)) check_backward(stage, problem, seed++);
    }
  }
}

TEST_CASE("stage11: in the deterministic mode the mma.sync backward's dQ pass matches the reference") {
  // dQ from grad_query_kernel (query tiles own it) instead of atomics: every bucket, odd dims,
  // causal with blind rows, grouped-query heads.
  const fa::test::DeterministicMode deterministic;
  for (const auto factory : kGpuStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1600;
    for (const int64_t dim : {17, 64, 100, 128, 256}) {
      check_backward(stage, fa::Problem::square(2, 2, 130, dim), seed++);
      check_backward(stage, fa::Problem::square(2, 1, 197, dim, true), seed++);
      check_backward(stage, fa::Problem{2, 8, 2, 150, 70, dim, true}, seed++);
    }
  }
}

TEST_CASE("stage11: the mma.sync backward stays correct with logits of magnitude 1e3") {
  for (const auto factory : kGpuStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    for (const bool causal : {false, true}) {
      check_backward(stage, fa::large_logit_inputs(fa::Problem::square(2, 1, 200, 64, causal), 1500), 1500);
      check_backward(stage, fa::large_logit_inputs(fa::Problem::square(1, 2, 150, 128, causal), 1501), 1501);
    }
  }
}
