// The harness: inputs, metrics, reporting, the runner's refusals and its NaN poison.
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/report.hpp"
#include "fa/runner.hpp"
#include "fa/stages.hpp"

namespace {

// A CPU "stage" that writes only the first `written` outputs, to prove the poison catches it.
int64_t g_written = 0;
cudaError_t partial_forward(const fa::Shape& shape, const void*, const void*, const void* v, void* o, void*,
                            cudaStream_t) {
  const auto* values = static_cast<const float*>(v);
  auto* out = static_cast<float*>(o);
  for (int64_t i = 0; i < std::min(g_written, shape.elements()); ++i) out[i] = values[i];
  return cudaSuccess;
}

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
  const fa::Shape shape{2, 3, 5, 7};
  const fa::Inputs a = fa::random_inputs(shape, 42);
  const fa::Inputs b = fa::random_inputs(shape, 42);
  const fa::Inputs c = fa::random_inputs(shape, 43);
  CHECK(a.q == b.q);
  CHECK(a.v == b.v);
  CHECK(a.q != c.q);
  REQUIRE(a.q.size() == static_cast<std::size_t>(shape.elements()));
  double sum = 0.0;
  for (float value : a.k) {
    CHECK(value >= -1.0f);
    CHECK(value < 1.0f);
    sum += value;
  }
  CHECK(std::fabs(sum / static_cast<double>(a.k.size())) < 0.2);
}

TEST_CASE("common: 16-bit encoding round-trips rounded values exactly") {
  fa::Inputs inputs = fa::random_inputs(fa::Shape{1, 1, 16, 8}, 1);
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
  const fa::Shape shape{4, 16, 4096, 128};
  CHECK(fa::attention_flops(shape) == Approx(4.0 * 64 * 4096.0 * 4096.0 * 128));
  fa::Shape causal = shape;
  causal.causal = true;
  CHECK(fa::attention_flops(causal) == Approx(fa::attention_flops(shape) / 2));
  CHECK(fa::minimum_bytes(shape, 2) == 4 * int64_t{64} * 4096 * 128 * 2);
}

TEST_CASE("common: shape validation names what is wrong") {
  CHECK(fa::validate_shape(fa::Shape{1, 1, 4, 2}, 128).empty());
  CHECK(fa::validate_shape(fa::Shape{1, 1, 0, 2}, 128).find("sequence length") != std::string::npos);
  CHECK(fa::validate_shape(fa::Shape{1, 1, 4, 0}, 128).find("head dim") != std::string::npos);
  CHECK(fa::validate_shape(fa::Shape{1, 1, 4, 129}, 128).find("largest") != std::string::npos);
  CHECK(fa::validate_shape(fa::Shape{-1, 1, 4, 2}, 128).find("batch") != std::string::npos);
  CHECK_FALSE(fa::validate_shape(fa::Shape{1 << 20, 1 << 10, 1 << 20, 128}, 256).empty());
}

TEST_CASE("common: the runner's NaN poison catches an unwritten output") {
  const fa::StageDescriptor stage = partial_stage();
  fa::RunOptions options;
  options.shape = fa::Shape{1, 2, 6, 4};
  options.time = false;
  g_written = options.shape.elements() - 1;  // all but the last element
  const fa::RunOutcome outcome = fa::run_stage(stage, options);
  CHECK(outcome.row.status == "error");
  CHECK(outcome.exit_code == fa::kExitWrong);
  CHECK(outcome.errors.non_finite == 1);
}

TEST_CASE("common: the runner refuses a head dim beyond the stage's largest") {
  fa::RunOptions options;
  options.shape = fa::Shape{1, 1, 8, 65};
  const fa::RunOutcome outcome = fa::run_stage(partial_stage(), options);
  CHECK(outcome.row.status == "unsupported");
  CHECK(outcome.exit_code == fa::kExitBadInput);
  CHECK(outcome.row.note.find("65") != std::string::npos);
}

TEST_CASE("common: CSV rows follow design.md's header") {
  fa::ResultRow row;
  row.stage = "04_online_softmax";
  row.gpu = "NVIDIA H100 80GB HBM3";
  row.shape = fa::Shape{4, 16, 4096, 128};
  row.dtype = "fp32";
  row.note = "needs 1 GiB, 2 free";
  const std::string line = fa::csv_line(row);
  CHECK(line.rfind("04_online_softmax,NVIDIA H100 80GB HBM3,4,16,4096,128,fp32,0,", 0) == 0);
  CHECK(line.find("\"needs 1 GiB, 2 free\"") != std::string::npos);
  CHECK(fa::csv_header().size() == 18);
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
  CHECK(first.rfind("stage,gpu,B,H,N,D,dtype,causal,ms_median,", 0) == 0);
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

TEST_CASE("common: the source hash in each binary equals design.md's shell command") {
  for (const fa::StageDescriptor& stage : fa::stages::all()) {
    const std::string command = std::string("cd '") + FA_SOURCE_DIR + "' && find stages/" + stage.id +
                                " common -type f \\( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.hpp'"
                                " -o -name '*.h' -o -name CMakeLists.txt \\) | LC_ALL=C sort | xargs sha256sum |"
                                " sha256sum | cut -c1-16";
    std::string hash = run_command(command);
    while (!hash.empty() && (hash.back() == '\n' || hash.back() == ' ')) hash.pop_back();
    INFO(stage.id << ": built from " << stage.source_hash << ", tree now " << hash << " (rebuild if you edited)");
    CHECK(hash == stage.source_hash);
  }
}
