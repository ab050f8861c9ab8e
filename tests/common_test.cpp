// The harness: inputs, metrics, reporting, the runner's refusals and its NaN poison.
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "fa/deterministic.hpp"
#include "fa/device.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/report.hpp"
#include "fa/runner.hpp"
#include "fa/stages.hpp"

namespace {

// A CPU "stage" that writes only the first `written` outputs, to prove the poison catches it.
int64_t g_written = 0;
fa::Status partial_forward(const fa::ForwardArgs& args) {
  const auto* values = static_cast<const float*>(args.v);
  auto* out = static_cast<float*>(args.o);
  for (int64_t i = 0; i < std::min(g_written, args.problem.q_elements()); ++i) out[i] = values[i];
  return fa::Status();
}

// A CPU "stage" that declines every problem with a reason of its own.
fa::Status declining_forward(const fa::ForwardArgs&) { return fa::Status::unsupported("not today"); }

fa::StageDescriptor partial_stage() {
  fa::StageDescriptor stage;
  stage.id = "test_partial";
  stage.backend = fa::Backend::cpu;
  stage.forward = &partial_forward;
  stage.max_dim = 64;
  return stage;
}

std::string run_command(const std::string& command) {
  std::array<char, 256> buffer{};
  std::string output;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  REQUIRE(pipe != nullptr);
  while (fgets(buffer.data(), static_cast<int>(buffer.size()), pipe.get()) != nullptr) output += buffer.data();
  return output;
}

}  // namespace

TEST_CASE("common: inputs are deterministic per seed and uniform between -1 and 1") {
  const fa::Problem shape{2, 6, 3, 5, 4, 7, false};
  const fa::Inputs a = fa::random_inputs(shape, 42);
  const fa::Inputs b = fa::random_inputs(shape, 42);
  const fa::Inputs c = fa::random_inputs(shape, 43);
  CHECK(a.q == b.q);
  CHECK(a.v == b.v);
  CHECK(a.q != c.q);
  REQUIRE(a.q.size() == static_cast<std::size_t>(shape.q_elements()));
  REQUIRE(a.k.size() == static_cast<std::size_t>(shape.kv_elements()));  // K and V are (B, Hkv, Nk, D)
  REQUIRE(a.v.size() == a.k.size());
  double sum = 0.0;
  for (float value : a.k) {
    CHECK(value >= -1.0f);
    CHECK(value < 1.0f);
    sum += value;
  }
  CHECK(std::fabs(sum / static_cast<double>(a.k.size())) < 0.2);
}

TEST_CASE("common: 16-bit encoding round-trips rounded values exactly") {
  fa::Inputs inputs = fa::random_inputs(fa::Problem::square(1, 1, 16, 8), 1);
  for (fa::Precision precision : {fa::Precision::fp32, fa::Precision::fp16, fa::Precision::bf16}) {
    fa::Inputs rounded = inputs;
    fa::round_to_precision(rounded, precision);
    CHECK(fa::decode(fa::encode(rounded.q, precision), precision) == rounded.q);
    CHECK(fa::encode(rounded.q, precision).size() ==
          rounded.q.size() * static_cast<std::size_t>(fa::precision_bytes(precision)));
  }
  fa::Inputs half = inputs;
  fa::round_to_precision(half, fa::Precision::fp16);
  CHECK(half.q != inputs.q);  // rounding really happened
}

TEST_CASE("common: a non-finite output fails even when every other element is exact") {
  const std::vector<double> expected = {1.0, 2.0, 3.0};
  CHECK(fa::compare({1.0f, 2.0f, 3.0f}, expected, 1e-6).passed());
  const fa::ErrorReport nan = fa::compare({1.0f, NAN, 3.0f}, expected, 1e-6);
  CHECK_FALSE(nan.passed());
  CHECK(nan.non_finite == 1);
  CHECK(nan.first_non_finite == 1);
  CHECK_FALSE(fa::compare({INFINITY, 2.0f, 3.0f}, expected, 1e-6).passed());
  const fa::ErrorReport off = fa::compare({1.0f, 2.5f, 3.0f}, expected, 1e-6);
  CHECK_FALSE(off.passed());
  CHECK(off.max_abs_err == Approx(0.5));
  CHECK(off.max_abs_index == 1);
  CHECK_FALSE(fa::compare({1.0f, 2.0f}, expected, 1e-6).passed());  // a short output
}

TEST_CASE("common: tolerances follow the rounding unit of each precision") {
  CHECK(fa::tolerance(fa::Precision::fp16, 1.0) == Approx(4.0 / 2048.0));
  CHECK(fa::tolerance(fa::Precision::bf16, 2.0) == Approx(2.0 * 4.0 / 256.0));
  CHECK(fa::tolerance(fa::Precision::fp32, 1.0) < fa::tolerance(fa::Precision::fp16, 1.0));
}

TEST_CASE("common: FLOP and byte counts") {
  const fa::Problem shape = fa::Problem::square(4, 16, 4096, 128);
  CHECK(fa::attention_flops(shape) == Approx(4.0 * 64 * 4096.0 * 4096.0 * 128));
  CHECK(fa::attention_flops(shape, fa::Pass::backward) == Approx(2.5 * fa::attention_flops(shape)));
  fa::Problem causal = shape;
  causal.causal = true;
  CHECK(fa::attention_flops(causal) == Approx(fa::attention_flops(shape) / 2));
  CHECK(fa::minimum_bytes(shape, 2) == 4 * int64_t{64} * 4096 * 128 * 2);
  CHECK(fa::minimum_bytes(shape, 2, fa::Pass::forward, true) == 4 * int64_t{64} * 4096 * 128 * 2 + 64 * 4096 * 4);
  // Read Q, K, V, O, dO and LSE; write dQ, dK, dV: eight tensors and the LSE.
  CHECK(fa::minimum_bytes(shape, 2, fa::Pass::backward) == 8 * int64_t{64} * 4096 * 128 * 2 + 64 * 4096 * 4);

  // Grouped-query decoding: K and V are read once per key/value head, not per query head.
  const fa::Problem decode{1, 32, 8, 4, 65536, 128, false};
  CHECK(fa::minimum_bytes(decode, 2) == 2 * (32 * 4 * 128 * 2) + 2 * (int64_t{8} * 65536 * 128 * 2));
  CHECK(fa::attention_flops(decode) == Approx(4.0 * 32 * 4 * 65536 * 128));
}

TEST_CASE("common: the causal rule is aligned bottom-right, and pairs count what it leaves") {
  // Nq = Nk: query i sees keys 0..i.
  CHECK(fa::causal_key_end(0, 5, 5) == 1);
  CHECK(fa::causal_key_end(4, 5, 5) == 5);
  // Nq < Nk: the last query sees every key.
  CHECK(fa::causal_key_end(2, 3, 5) == 5);
  CHECK(fa::causal_key_end(0, 3, 5) == 3);
  // Nq > Nk: the first Nq - Nk rows see nothing.
  CHECK(fa::causal_key_end(0, 5, 3) == 0);
  CHECK(fa::causal_key_end(1, 5, 3) == 0);
  CHECK(fa::causal_key_end(2, 5, 3) == 1);
  CHECK(fa::causal_key_end(4, 5, 3) == 3);
  // The FLOP count of a rectangular causal problem counts exactly the unmasked pairs.
  for (const auto& [q_seq, kv_seq] : {std::pair<int64_t, int64_t>{3, 5}, {5, 3}, {1, 1000}, {1000, 1}, {100, 333}}) {
    double pairs = 0.0;
    for (int64_t row = 0; row < q_seq; ++row) pairs += static_cast<double>(fa::causal_key_end(row, q_seq, kv_seq));
    const fa::Problem problem{1, 1, 1, q_seq, kv_seq, 8, true};
    CHECK(fa::attention_pairs(problem) == Approx(pairs));
  }
}

TEST_CASE("common: a problem's query head reads key/value head h / (Hq / Hkv)") {
  const fa::Problem gqa{2, 8, 2, 4, 4, 8, false};
  CHECK(gqa.group_size() == 4);
  CHECK(gqa.kv_head_of(0) == 0);
  CHECK(gqa.kv_head_of(3) == 0);
  CHECK(gqa.kv_head_of(4) == 1);
  CHECK(gqa.kv_head_of(7) == 1);
  CHECK(gqa.kv_head_of(8) == 2);  // batch 1, head 0
  CHECK(gqa.kv_head_of(15) == 3);
  const fa::Problem mqa{3, 5, 1, 4, 4, 8, false};
  for (int64_t head = 0; head < mqa.q_heads_total(); ++head) CHECK(mqa.kv_head_of(head) == head / 5);
}

TEST_CASE("common: problem validation names what is wrong") {
  CHECK(fa::validate_problem(fa::Problem{1, 6, 4, 4, 4, 8, false}, 128).find("multiple") != std::string::npos);
  CHECK(fa::validate_problem(fa::Problem{1, 4, 0, 4, 4, 8, false}, 128).find("heads") != std::string::npos);
  CHECK(fa::validate_problem(fa::Problem{1, 4, 2, 4, 0, 8, false}, 128).find("sequence") != std::string::npos);
  CHECK(fa::validate_problem(fa::Problem{1, 4, 2, 1, 9, 8, true}, 128).empty());
  CHECK(fa::validate_problem(fa::Problem::square(1, 1, 4, 2), 128).empty());
  CHECK(fa::validate_problem(fa::Problem::square(1, 1, 0, 2), 128).find("sequence length") != std::string::npos);
  CHECK(fa::validate_problem(fa::Problem::square(1, 1, 4, 0), 128).find("head dim") != std::string::npos);
  CHECK(fa::validate_problem(fa::Problem::square(1, 1, 4, 129), 128).find("largest") != std::string::npos);
  CHECK(fa::validate_problem(fa::Problem::square(-1, 1, 4, 2), 128).find("batch") != std::string::npos);
  CHECK_FALSE(fa::validate_problem(fa::Problem::square(1 << 20, 1 << 10, 1 << 20, 128), 256).empty());
}

TEST_CASE("common: the runner's NaN poison catches an unwritten output") {
  const fa::StageDescriptor stage = partial_stage();
  fa::RunOptions options;
  options.problem = fa::Problem::square(1, 2, 6, 4);
  options.time = false;
  g_written = options.problem.q_elements() - 1;  // all but the last element
  const fa::RunOutcome outcome = fa::run_stage(stage, options);
  CHECK(outcome.row.status == "error");
  CHECK(outcome.exit_code == fa::kExitWrong);
  CHECK(outcome.errors.non_finite == 1);
}

TEST_CASE("common: the runner refuses a head dim beyond the stage's largest") {
  fa::RunOptions options;
  options.problem = fa::Problem::square(1, 1, 8, 65);
  const fa::RunOutcome outcome = fa::run_stage(partial_stage(), options);
  CHECK(outcome.row.status == "unsupported");
  CHECK(outcome.exit_code == fa::kExitBadInput);
  CHECK(outcome.row.note.find("65") != std::string::npos);
}

TEST_CASE("common: the runner refuses what a stage's features leave out, in one line") {
  fa::StageDescriptor stage = partial_stage();  // square problems only, no causal mask, no LSE
  const std::vector<std::pair<fa::Problem, std::string>> cases = {
      {fa::Problem{1, 4, 2, 8, 8, 16, false}, "Hkv"},
      {fa::Problem{1, 2, 2, 8, 16, 16, false}, "Nk"},
      {fa::Problem::square(1, 2, 8, 16, true), "causal"},
  };
  for (const auto& [problem, word] : cases) {
    fa::RunOptions options;
    options.problem = problem;
    const fa::RunOutcome outcome = fa::run_stage(stage, options);
    INFO(outcome.row.note);
    CHECK(outcome.row.status == "unsupported");
    CHECK(outcome.exit_code == fa::kExitBadInput);
    CHECK(outcome.row.note.find("test_partial") != std::string::npos);
    CHECK(outcome.row.note.find(word) != std::string::npos);
  }
  fa::RunOptions with_lse;
  with_lse.problem = fa::Problem::square(1, 1, 8, 16);
  with_lse.lse = true;
  const fa::RunOutcome lse = fa::run_stage(stage, with_lse);
  CHECK(lse.row.status == "unsupported");
  CHECK(lse.row.note.find("log-sum-exp") != std::string::npos);
}

TEST_CASE("common: a stage that declines a problem is reported unsupported, not as a CUDA error") {
  fa::StageDescriptor stage = partial_stage();
  stage.forward = &declining_forward;
  fa::RunOptions options;
  options.problem = fa::Problem::square(1, 1, 8, 16);
  const fa::RunOutcome outcome = fa::run_stage(stage, options);
  CHECK(outcome.row.status == "unsupported");
  CHECK(outcome.exit_code == fa::kExitBadInput);
  CHECK(outcome.row.note.find("not today") != std::string::npos);
}

TEST_CASE("common: architectures are a minimum, or one exact target") {
  fa::StageDescriptor stage = partial_stage();
  stage.backend = fa::Backend::cuda;
  stage.architecture = {80, false};
  CHECK(fa::architecture_name(stage) == "sm_80+");
  fa::DeviceInfo hopper;
  hopper.present = true;
  hopper.name = "H100";
  hopper.compute_capability = 90;
  fa::DeviceInfo ampere = hopper;
  ampere.compute_capability = 80;
  fa::DeviceInfo turing = hopper;
  turing.compute_capability = 75;
  CHECK(fa::stage_unavailable_reason(stage, hopper).empty());
  CHECK(fa::stage_unavailable_reason(stage, ampere).empty());
  CHECK(fa::stage_unavailable_reason(stage, turing).find("8.0 or newer") != std::string::npos);
  stage.architecture = {90, true};
  CHECK(fa::architecture_name(stage) == "sm_90a");
  CHECK(fa::stage_unavailable_reason(stage, hopper).empty());
  CHECK(fa::stage_unavailable_reason(stage, ampere).find("exactly") != std::string::npos);
  fa::DeviceInfo blackwell = hopper;
  blackwell.compute_capability = 100;
  CHECK_FALSE(fa::stage_unavailable_reason(stage, blackwell).empty());
}

TEST_CASE("common: CSV rows follow DESIGN.md's header") {
  fa::ResultRow row;
  row.stage = "04_online_softmax";
  row.gpu = "NVIDIA H100 80GB HBM3";
  row.problem = fa::Problem::square(4, 16, 4096, 128);
  row.dtype = "fp32";
  row.note = "needs 1 GiB, 2 free";
  const std::string line = fa::csv_line(row);
  CHECK(line.rfind("04_online_softmax,NVIDIA H100 80GB HBM3,4,16,16,4096,4096,128,fp32,0,fwd,", 0) == 0);
  CHECK(line.find("\"needs 1 GiB, 2 free\"") != std::string::npos);
  CHECK(fa::csv_header().size() == 21);
  CHECK(fa::csv_header().front() == "stage");
  CHECK(fa::csv_header().back() == "note");

  const std::string path = "common_test_rows.csv";
  std::remove(path.c_str());
  fa::append_csv(path, {row});
  fa::append_csv(path, {row});
  std::ifstream in(path);
  std::string first, second, third, fourth;
  std::getline(in, first);
  std::getline(in, second);
  std::getline(in, third);
  CHECK(first.rfind("stage,gpu,B,Hq,Hkv,Nq,Nk,D,dtype,causal,pass,ms_median,", 0) == 0);
  CHECK(second == line);
  CHECK(third == line);
  CHECK_FALSE(std::getline(in, fourth));  // one header only
  std::remove(path.c_str());
}

TEST_CASE("common: the stages are registered in course order and carry their source hash") {
  const std::vector<fa::StageDescriptor> stages = fa::stages::all();
  REQUIRE_FALSE(stages.empty());
  CHECK(std::string(stages.front().id) == "01_cpu");
  for (std::size_t i = 1; i < stages.size(); ++i) CHECK(std::string(stages[i - 1].id) <= std::string(stages[i].id));
  for (const fa::StageDescriptor& stage : stages) CHECK(std::string(stage.source_hash).size() == 16);
}

TEST_CASE("common: the source hash in each binary equals scripts/source_hash.py's") {
  for (const fa::StageDescriptor& stage : fa::stages::all()) {
    const std::string command = std::string("'") + FA_PYTHON + "' '" + FA_SOURCE_DIR +
                                "/scripts/source_hash.py' --root '" + FA_SOURCE_DIR + "' " + stage.id;
    std::string hash = run_command(command);
    while (!hash.empty() && (hash.back() == '\n' || hash.back() == ' ')) hash.pop_back();
    INFO(stage.id << ": built from " << stage.source_hash << ", tree now " << hash << " (rebuild if you edited)");
    CHECK(hash == stage.source_hash);
  }
}

TEST_CASE("common: the deterministic backward is the calling thread's setting, for the scope that asks") {
  // What the C ABI does around each backward call (fa/deterministic.hpp): another thread, or the
  // same one after the call, keeps its own setting.
  CHECK_FALSE(fa::deterministic_backward());
  {
    const fa::DeterministicBackward call(true);
    CHECK(fa::deterministic_backward());
    bool other_thread = true;
    std::thread([&other_thread] { other_thread = fa::deterministic_backward(); }).join();
    CHECK_FALSE(other_thread);
    {
      const fa::DeterministicBackward nested(false);
      CHECK_FALSE(fa::deterministic_backward());
    }
    CHECK(fa::deterministic_backward());
  }
  CHECK_FALSE(fa::deterministic_backward());
}
