// What a newcomer meets first, in the harness: the walkthrough's verdict (from the run with tiles of
// 2 keys, so a mistake between tiles shows), its backward pass (dQ, dK, dV beside the exact ones),
// the walkthrough of a GPU stage that cannot run here, the host memory refusal, the CPU time
// estimate, the table's units and the command line's words. Every case runs without a GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "fa/cli.hpp"
#include "fa/device.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa/report.hpp"
#include "fa/runner.hpp"
#include "fa/walkthrough.hpp"

namespace {

// The online softmax of stage 01 for one head at a time, with K/V tiles of `tile` keys; with
// `forget_l_rescale` it makes the classic mistake: l is not multiplied by exp(m - m_new) when the
// max grows. On one tile that changes nothing (l starts at 0); from the second tile on it does.
void online_softmax(const fa::Problem& problem, const float* q, const float* k, const float* v, float* o, int64_t tile,
                    bool forget_l_rescale, fa::TileTrace* trace) {
  const int64_t seq = problem.q_seq;
  const int64_t dim = problem.dim;
  const float scale = fa::softmax_scale(problem);
  const int64_t tiles = (problem.kv_seq + tile - 1) / tile;
  if (trace != nullptr) {
    trace->tile = tile;
    trace->tiles = tiles;
    trace->rows = problem.q_rows();
    trace->dim = dim;
    trace->m.assign(static_cast<std::size_t>(tiles * trace->rows), 0.0);
    trace->l.assign(trace->m.size(), 0.0);
    trace->o.assign(trace->m.size() * static_cast<std::size_t>(dim), 0.0);
  }
  for (int64_t row = 0; row < problem.q_rows(); ++row) {
    const int64_t head = row / seq;
    const float* query = q + row * dim;
    const float* keys = k + head * problem.kv_seq * dim;
    const float* values = v + head * problem.kv_seq * dim;
    float m = -std::numeric_limits<float>::infinity();
    float l = 0.0f;
    std::vector<float> acc(static_cast<std::size_t>(dim), 0.0f);
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t first = t * tile;
      const int64_t last = std::min(first + tile, problem.kv_seq);
      std::vector<float> scores;
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = first; j < last; ++j) {
        float dot = 0.0f;
        for (int64_t d = 0; d < dim; ++d) dot += query[d] * keys[j * dim + d];
        scores.push_back(dot * scale);
        tile_max = std::max(tile_max, scores.back());
      }
      const float m_new = std::max(m, tile_max);
      const float correction = std::exp(m - m_new);
      if (!forget_l_rescale) l *= correction;
      for (float& value : acc) value *= correction;
      for (int64_t j = first; j < last; ++j) {
        const float p = std::exp(scores[static_cast<std::size_t>(j - first)] - m_new);
        l += p;
        for (int64_t d = 0; d < dim; ++d) acc[static_cast<std::size_t>(d)] += p * values[j * dim + d];
      }
      m = m_new;
      if (trace != nullptr) {
        trace->m_at(t, row) = m;
        trace->l_at(t, row) = l;
        for (int64_t d = 0; d < dim; ++d) trace->o_at(t, row, d) = acc[static_cast<std::size_t>(d)] / l;
      }
    }
    for (int64_t d = 0; d < dim; ++d) o[row * dim + d] = acc[static_cast<std::size_t>(d)] / l;
  }
}

constexpr int64_t kOwnTile = 64;  // the stage's usual tiles: N = 4 fits in one

template <bool kForget>
fa::Status tiled_forward(const fa::ForwardArgs& args) {
  online_softmax(args.problem, static_cast<const float*>(args.q), static_cast<const float*>(args.k),
                 static_cast<const float*>(args.v), static_cast<float*>(args.o), kOwnTile, kForget, nullptr);
  return fa::Status();
}

template <bool kForget>
fa::Status tiled_trace(const fa::Problem& problem, const float* q, const float* k, const float* v, int64_t tile,
                       fa::TileTrace& trace) {
  std::vector<float> o(static_cast<std::size_t>(problem.q_elements()));
  online_softmax(problem, q, k, v, o.data(), tile, kForget, &trace);
  return fa::Status();
}

fa::StageDescriptor cpu_stage(bool forget_l_rescale, bool with_trace) {
  fa::StageDescriptor stage;
  stage.id = forget_l_rescale ? "test_forgets_l" : "test_right";
  stage.title = "a test stage";
  stage.backend = fa::Backend::cpu;
  stage.forward = forget_l_rescale ? &tiled_forward<true> : &tiled_forward<false>;
  stage.trace = !with_trace ? nullptr : forget_l_rescale ? &tiled_trace<true> : &tiled_trace<false>;
  stage.max_dim = 64;
  return stage;
}

fa::Status never_called(const fa::ForwardArgs&) {
  FAIL("a stage that cannot run here was run");
  return fa::Status();
}

// A GPU stage for a GPU that does not exist (exactly sm_99.9): it cannot run on any machine.
fa::StageDescriptor unrunnable_gpu_stage() {
  fa::StageDescriptor stage;
  stage.id = "test_gpu";
  stage.title = "a GPU stage that cannot run here";
  stage.backend = fa::Backend::cuda;
  stage.forward = &never_called;
  stage.architecture = {999, true};
  stage.max_dim = 64;
  return stage;
}

// A CPU stage with a backward pass, made of the double reference (so that no stage's code is under
// test here); with `forget_dq` its dQ stays 0, as when a first attempt never accumulates it.
fa::Inputs host_inputs(const fa::Problem& problem, const void* q, const void* k, const void* v) {
  fa::Inputs inputs;
  inputs.problem = problem;
  inputs.q.assign(static_cast<const float*>(q), static_cast<const float*>(q) + problem.q_elements());
  inputs.k.assign(static_cast<const float*>(k), static_cast<const float*>(k) + problem.kv_elements());
  inputs.v.assign(static_cast<const float*>(v), static_cast<const float*>(v) + problem.kv_elements());
  return inputs;
}

fa::Status reference_forward(const fa::ForwardArgs& args) {
  std::vector<double> lse;
  const std::vector<double> out = fa::reference_attention(host_inputs(args.problem, args.q, args.k, args.v), &lse);
  std::copy(out.begin(), out.end(), static_cast<float*>(args.o));
  if (args.lse != nullptr) std::copy(lse.begin(), lse.end(), args.lse);
  return fa::Status();
}

template <bool kForgetDq>
fa::Status reference_backward_pass(const fa::BackwardArgs& args) {
  const fa::Problem& problem = args.problem;
  const float* grad_o = static_cast<const float*>(args.grad_o);
  std::vector<int64_t> heads(static_cast<std::size_t>(problem.kv_heads_total()));
  std::iota(heads.begin(), heads.end(), 0);  // every group in order: dQ in the layout of Q
  const fa::GradientReference gradients = fa::reference_backward(
      host_inputs(problem, args.q, args.k, args.v), std::vector<float>(grad_o, grad_o + problem.q_elements()), heads);
  float* grad_q = static_cast<float*>(args.grad_q);
  if (kForgetDq) {
    std::fill(grad_q, grad_q + problem.q_elements(), 0.0f);
  } else {
    std::copy(gradients.dq.begin(), gradients.dq.end(), grad_q);
  }
  std::copy(gradients.dk.begin(), gradients.dk.end(), static_cast<float*>(args.grad_k));
  std::copy(gradients.dv.begin(), gradients.dv.end(), static_cast<float*>(args.grad_v));
  return fa::Status();
}

fa::StageDescriptor backward_stage(bool forget_dq) {
  fa::StageDescriptor stage;
  stage.id = forget_dq ? "test_no_dq" : "test_backward";
  stage.title = "a test stage with a backward pass";
  stage.backend = fa::Backend::cpu;
  stage.forward = &reference_forward;
  stage.backward = forget_dq ? &reference_backward_pass<true> : &reference_backward_pass<false>;
  stage.max_dim = 64;
  stage.features.lse = true;
  stage.features.backward = true;
  return stage;
}

std::string last_line(const std::string& text) {
  std::string trimmed = text;
  while (!trimmed.empty() && trimmed.back() == '\n') trimmed.pop_back();
  return trimmed.substr(trimmed.rfind('\n') + 1);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("common: the walkthrough's verdict comes from tiles of 2 keys, where a missing rescale of l shows") {
  // The mistake is invisible to the stage's own forward pass (N = 4 is one of its tiles) and must
  // still be the verdict, with the numbers of the run that shows it.
  std::ostringstream out;
  const int code = fa::run_walkthrough(cpu_stage(true, true), out);
  const std::string text = out.str();
  INFO(text);
  CHECK(code == fa::kExitWrong);
  const std::string verdict = last_line(text);
  CHECK(contains(verdict, "the stage DISAGREES with the exact values: first at K/V tile 1"));
  CHECK(contains(verdict, "with tiles of 2 keys its final O is off by up to"));
  CHECK(contains(text, "<-- differs"));
  CHECK(contains(text, "Its own forward pass matches only because N = 4 fits in one of its K/V tiles"));
  // The error the verdict quotes is the tile-2 run's, above the tolerance it names.
  const std::size_t at = verdict.find("off by up to ");
  REQUIRE(at != std::string::npos);
  const double error = std::stod(verdict.substr(at + 13));
  const std::size_t tolerance_at = verdict.find("(tolerance ");
  REQUIRE(tolerance_at != std::string::npos);
  CHECK(error > std::stod(verdict.substr(tolerance_at + 11)));
}

TEST_CASE("common: the walkthrough agrees with a right stage at every tile") {
  std::ostringstream out;
  CHECK(fa::run_walkthrough(cpu_stage(false, true), out) == fa::kExitOk);
  INFO(out.str());
  CHECK(contains(last_line(out.str()), "the stage agrees with the exact values at every K/V tile of 2 keys"));
  CHECK_FALSE(contains(out.str(), "differs"));
}

TEST_CASE("common: without a per-tile trace the walkthrough says what the final O can and cannot catch") {
  std::ostringstream right;
  CHECK(fa::run_walkthrough(cpu_stage(false, false), right) == fa::kExitOk);
  INFO(right.str());
  CHECK(contains(right.str(), "only its final O is checked"));
  CHECK(contains(right.str(), "It cannot catch a mistake that shows only across K/V tiles"));
  CHECK(contains(last_line(right.str()), "agrees with the exact values in the final O"));
  // The mistake between tiles is invisible here, and the output said so beforehand.
  std::ostringstream wrong;
  CHECK(fa::run_walkthrough(cpu_stage(true, false), wrong) == fa::kExitOk);
}

TEST_CASE("common: the walkthrough of a GPU stage that cannot run here prints every exact value, exit code 4") {
  std::ostringstream out;
  const int code = fa::run_walkthrough(unrunnable_gpu_stage(), out);
  const std::string text = out.str();
  INFO(text);
  CHECK(code == fa::kExitNoDevice);
  CHECK(contains(text, "S = Q K^T / sqrt(2), exact:"));
  CHECK(contains(text, "2.4748737"));  // S[0][0] = (1·0.5 + 2·1.5)/√2, computed, not typed in
  CHECK(contains(text, "tile 1 row 3  m"));
  CHECK(contains(text, "Exact final O:"));
  CHECK(contains(last_line(text), "test_gpu itself runs on a CUDA GPU"));
  CHECK_FALSE(contains(text, "driver version is insufficient"));
  CHECK_FALSE(contains(text, "failed"));
}

TEST_CASE("common: fa_course's walkthrough gives one verdict line per stage") {
  std::ostringstream out;
  const int code =
      fa::run_walkthrough_all({cpu_stage(false, true), cpu_stage(true, true), unrunnable_gpu_stage()}, out);
  const std::string text = out.str();
  INFO(text);
  CHECK(code == fa::kExitWrong);
  CHECK(contains(text, "test_right              the stage agrees"));
  CHECK(contains(text, "test_forgets_l          the stage DISAGREES"));
  CHECK(contains(text, "test_gpu                "));
}

TEST_CASE("common: the walkthrough of a stage with a backward pass shows D_i, P, dS and its dQ, dK, dV beside them") {
  std::ostringstream out;
  const int code = fa::run_walkthrough(backward_stage(false), out);
  const std::string text = out.str();
  INFO(text);
  CHECK(code == fa::kExitOk);
  for (const char* part :
       {"dO:\n  row 0  [             1,              0]", "D_i = rowsum(dO * O)", "P = exp(S - LSE_i)", "dP = dO V^T",
        "dS = P * (dP - D_i)", "Gradients, the stage's beside the exact values",
        "dQ:\n  row 0  [   0.004183515,    0.004183515]  exact [  0.0041835149,   0.0041835149]"}) {
    CHECK(contains(text, part));
  }
  CHECK_FALSE(contains(text, "<-- differs"));
  CHECK(contains(last_line(text), "in the final O"));
  CHECK(contains(last_line(text), "; and in dQ, dK and dV (max abs error "));
}

TEST_CASE("common: the walkthrough names the gradient a backward pass gets wrong: a dQ left at 0") {
  std::ostringstream out;
  const int code = fa::run_walkthrough(backward_stage(true), out);
  const std::string text = out.str();
  INFO(text);
  CHECK(code == fa::kExitWrong);
  CHECK(last_line(text).find("the stage DISAGREES with the exact gradients: dQ row 0, column ") == 0);
  CHECK(contains(last_line(text), "(its forward pass agrees)"));
  CHECK_FALSE(contains(last_line(text), "dK"));
  CHECK_FALSE(contains(last_line(text), "dV"));
  CHECK(contains(text, "row 0  [             0,              0]  exact [  0.0041835149,   0.0041835149]"));
  CHECK(contains(text, "<-- differs"));
  // The runner's tolerance, with its allowance for this fixture's large logits, would pass that dQ:
  // why the walkthrough holds gradients to the unit without it.
  const fa::WalkthroughBackward exact = fa::walkthrough_backward(fa::Precision::fp32);
  const double runner_unit = fa::gradient_tolerance_unit(
      fa::Precision::fp32, fa::logit_bound(exact.inputs.q, exact.inputs.k, exact.inputs.problem.dim));
  const std::vector<float> zeros(exact.gradients.dq.size(), 0.0f);
  CHECK(fa::compare_gradient(zeros, exact.gradients.dq, exact.gradients.dq_bound, runner_unit).passed());
  CHECK_FALSE(fa::compare_gradient(zeros, exact.gradients.dq, exact.gradients.dq_bound,
                                   fa::gradient_tolerance_unit(fa::Precision::fp32))
                  .passed());
}

TEST_CASE("common: fa_course's walkthrough shows a CPU stage's backward pass in detail") {
  std::ostringstream out;
  const int code = fa::run_walkthrough_all({backward_stage(false), backward_stage(true)}, out);
  const std::string text = out.str();
  INFO(text);
  CHECK(code == fa::kExitWrong);
  CHECK(contains(text, "test_backward           the stage agrees with the exact values in the final O"));
  CHECK(contains(text, "test_no_dq              the stage DISAGREES with the exact gradients: dQ row 0"));
  CHECK(contains(text, "test_backward, the backward pass in C++ (no GPU needed), in detail:"));
  CHECK(contains(text, "test_backward agrees with the exact values in dQ, dK and dV (max abs error "));
  CHECK(contains(text, "test_no_dq DISAGREES with the exact gradients: dQ row 0"));
}

TEST_CASE("common: a problem larger than host memory is refused as out of memory before allocating") {
  const fa::StageDescriptor stage = cpu_stage(false, false);
  fa::RunOptions options;
  options.problem = fa::Problem::square(1, int64_t{1} << 20, 1024, 64);  // 2 TiB of inputs and outputs
  const int64_t needed = fa::host_bytes_needed(stage, options.problem);
  CHECK(needed > int64_t{1} << 40);
  const int64_t available = fa::available_host_bytes();
  CHECK(available > 0);
  REQUIRE(needed > available);
  const fa::RunOutcome outcome = fa::run_stage(stage, options);
  CHECK(outcome.exit_code == fa::kExitOom);
  CHECK(outcome.row.status == "oom");
  CHECK(outcome.row.peak_bytes == needed);
  CHECK(contains(outcome.row.note, "of host memory"));
}

TEST_CASE("common: the CPU time estimate refuses hours and passes the course's problem") {
  fa::RunOptions huge;
  huge.problem = fa::Problem::square(1, 1, int64_t{1} << 24, 64);
  CHECK(fa::estimated_cpu_run_seconds(huge) > fa::kCpuRefuseSeconds);
  fa::RunOptions course;
  course.problem = fa::Problem::square(1, 1, 2048, 128);
  course.warmup = 1;
  course.reps = 3;
  // At the slowest speed stage 01 shows (2 GFLOP/s per thread, 1 thread here), still under a minute.
  CHECK(fa::estimated_cpu_run_seconds(course, 2e9) < 60.0);
  CHECK(fa::format_duration(30.0) == "30 s");
  CHECK(fa::format_duration(90.0) == "1.5 min");
  CHECK(fa::format_duration(7200.0) == "2 h");
  CHECK(fa::format_duration(10 * 86400.0) == "10 days");
}

TEST_CASE("common: the table shows GFLOP/s where TFLOP/s would round to zero, and no time for --reps 0") {
  fa::ResultRow cpu;
  cpu.stage = "01_cpu";
  cpu.dtype = "fp32";
  cpu.ms_median = 428.0;
  cpu.tflops = 0.00502;
  cpu.gbps = 0.0098;
  fa::ResultRow gpu = cpu;
  gpu.stage = "08_mma_registers";
  gpu.ms_median = 0.36;
  gpu.tflops = 383.84;
  gpu.gbps = 1200.0;
  fa::ResultRow unt = cpu;
  unt.stage = "04_online_softmax";
  unt.ms_median = 0.0;
  unt.tflops = 0.0;
  std::ostringstream out;
  fa::print_table(out, {cpu, gpu, unt}, true);
  const std::string text = out.str();
  INFO(text);
  CHECK(contains(text, "5.02 G"));
  CHECK(contains(text, "383.8 T"));
  CHECK_FALSE(contains(text, "0.00 "));
  CHECK(contains(text, "ok (not timed: --reps 0)"));
}

TEST_CASE("common: the command line says a word is not a number, and tells the course from a stage") {
  const fa::ParseResult word = fa::parse_command_line("01_cpu", 256, {"--seq", "abc"});
  CHECK_FALSE(word.ok);
  CHECK(word.exit_code == fa::kExitBadInput);
  CHECK(contains(word.message, "'abc' is not a whole number (N goes from 1 to 16777216)"));
  const fa::ParseResult big = fa::parse_command_line("01_cpu", 256, {"--seq", "16777217"});
  CHECK(contains(big.message, "16777217 is out of range: N goes from 1 to 16777216"));
  const fa::ParseResult zero = fa::parse_command_line("01_cpu", 256, {"--reps", "0"});
  REQUIRE(zero.ok);
  CHECK_FALSE(zero.command_line.run.time);
  CHECK_FALSE(zero.command_line.shape_given);
  CHECK(fa::parse_command_line("01_cpu", 256, {"--dim", "32"}).command_line.shape_given);
  const fa::ParseResult course = fa::parse_command_line("fa_course", 256, {"--help"}, fa::CommandLine{},
                                                        "The course: every stage.", "Default shape: here.");
  CHECK(course.exit_code == fa::kExitOk);
  CHECK(contains(course.message, "The course: every stage."));
  CHECK(contains(course.message, "Default shape: here."));
  CHECK_FALSE(contains(course.message, "Runs one stage"));
}

TEST_CASE("common: a machine without a GPU is described without blaming its driver") {
  const fa::DeviceInfo device = fa::query_device();
  if (device.present) {
    CHECK(fa::describe_missing_gpu(device).empty());
  } else {
    const std::string why = fa::describe_missing_gpu(device);
    INFO(why << " (the runtime said: " << device.reason << ")");
    CHECK_FALSE(why.empty());
    CHECK_FALSE(contains(why, "driver version is insufficient"));
  }
}
