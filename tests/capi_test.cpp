// The C ABI (api/fa_capi.h) from C++. Most cases run the CPU stage or are refused before any
// GPU is touched, so they run without a GPU: general problems (GQA, Nq != Nk, bottom-right causal)
// and the log-sum-exp reach the stage; version 1 still works; the size prefixes follow the
// header's rule; every stage's features come through, and what a stage leaves out is refused
// with one line that names it; bad calls come back as a status and a message, never a crash.
// The last cases run CUDA stages through the ABI and report skipped without a GPU.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "catch_compat.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa_capi.h"
#include "gpu_contract.hpp"

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string last_error() { return fa_last_error(); }

fa_problem make_problem(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t q_seq, int64_t kv_seq, int64_t dim,
                        bool causal) {
  fa_problem problem;
  fa_init_problem(&problem);
  problem.batch = batch;
  problem.q_heads = q_heads;
  problem.kv_heads = kv_heads;
  problem.q_seq = q_seq;
  problem.kv_seq = kv_seq;
  problem.dim = dim;
  problem.causal = causal ? 1 : 0;
  return problem;
}

fa::Problem to_problem(const fa_problem& p) {
  fa::Problem problem;
  problem.batch = p.batch;
  problem.q_heads = p.q_heads;
  problem.kv_heads = p.kv_heads;
  problem.q_seq = p.q_seq;
  problem.kv_seq = p.kv_seq;
  problem.dim = p.dim;
  problem.causal = p.causal != 0;
  return problem;
}

// Host buffers for one forward call on the CPU stage, O and LSE poisoned with NaN so an unwritten
// element fails.
struct HostCall {
  fa::Inputs inputs;
  std::vector<float> o;
  std::vector<float> lse;
  fa_forward_args args;

  HostCall(const fa_problem& problem, uint64_t seed) : inputs(fa::random_inputs(to_problem(problem), seed)) {
    o.assign(inputs.q.size(), NAN);
    lse.assign(static_cast<std::size_t>(inputs.problem.q_rows()), NAN);
    fa_init_forward_args(&args);
    args.problem = &problem;
    args.q = inputs.q.data();
    args.k = inputs.k.data();
    args.v = inputs.v.data();
    args.o = o.data();
    args.lse = lse.data();
  }

  // The backward call on this forward's inputs, O and LSE.
  fa_backward_args backward_args(const float* grad_o, float* grad_q, float* grad_k, float* grad_v,
                                 void* workspace) const {
    fa_backward_args backward;
    fa_init_backward_args(&backward);
    backward.problem = args.problem;
    backward.q = inputs.q.data();
    backward.k = inputs.k.data();
    backward.v = inputs.v.data();
    backward.o = o.data();
    backward.grad_o = grad_o;
    backward.lse = lse.data();
    backward.grad_q = grad_q;
    backward.grad_k = grad_k;
    backward.grad_v = grad_v;
    backward.workspace = workspace;
    return backward;
  }
};

// LSE against the reference: -inf exactly where a row sees no key, else within `tolerance`.
void check_lse(const std::vector<float>& actual, const std::vector<double>& expected, double tolerance) {
  REQUIRE(actual.size() == expected.size());
  int64_t wrong = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const bool expected_empty = std::isinf(expected[i]) && expected[i] < 0.0;
    const bool ok = expected_empty ? (std::isinf(actual[i]) && actual[i] < 0.0f)
                                   : (std::isfinite(actual[i]) &&
                                      std::fabs(static_cast<double>(actual[i]) - expected[i]) <= tolerance);
    if (!ok && wrong++ == 0) {
      INFO("first wrong LSE row " << i << ": " << actual[i] << ", expected " << expected[i]);
      CHECK(ok);
    }
  }
  CHECK(wrong == 0);
}

// Zero everything (padding included) and set every field of a fa_forward_args.
fa_forward_args forward_args(const fa_problem* problem, const void* q, const void* k, const void* v, void* o,
                             float* lse = nullptr) {
  fa_forward_args args;
  fa_init_forward_args(&args);
  args.problem = problem;
  args.q = q;
  args.k = k;
  args.v = v;
  args.o = o;
  args.lse = lse;
  return args;
}

std::vector<std::string> stage_ids() {
  std::vector<std::string> ids;
  for (int i = 0; i < fa_stage_count(); ++i) ids.emplace_back(fa_stage_id(i));
  return ids;
}

// "04_online_softmax", a stage of the first part (square problems and causal masking only); in a
// build without it (FA_ONLY_STAGES), another stage that takes neither GQA, Nq != Nk nor the LSE;
// "" when the build has none.
std::string square_only_stage() {
  if (fa_stage_features("04_online_softmax") >= 0) return "04_online_softmax";
  for (const std::string& id : stage_ids()) {
    if ((fa_stage_features(id.c_str()) & (FA_FEATURE_GROUPED | FA_FEATURE_RECTANGULAR | FA_FEATURE_LSE)) == 0)
      return id;
  }
  return "";
}

// The stage folder of an id ("07_fp16_pipelined" for "07_fp16_pipelined/bf16"): what messages name.
std::string folder_of(const std::string& id) { return id.substr(0, id.find('/')); }

std::string text(const char* value) { return value != nullptr ? value : "(null)"; }

// A struct of a newer header: ours, then fields this library does not know.
template <typename Struct>
struct Newer {
  Struct known;
  uint64_t later[3];
};

}  // namespace

TEST_CASE("capi: the ABI version is 4 and the layouts are the header's") {
  CHECK(fa_abi_version() == 4);
  CHECK(sizeof(fa_problem) == FA_PROBLEM_SIZE_V2);
  CHECK(sizeof(fa_forward_args) == FA_FORWARD_ARGS_SIZE_V2);
  CHECK(sizeof(fa_backward_args) == FA_BACKWARD_ARGS_SIZE_V4);
  CHECK(sizeof(fa_fp8_quantize_args) == FA_FP8_QUANTIZE_ARGS_SIZE_V3);
  CHECK(sizeof(fa_fp8_forward_args) == FA_FP8_FORWARD_ARGS_SIZE_V3);
  fa_backward_args args;
  std::memset(&args, 0xff, sizeof(args));
  fa_init_backward_args(&args);
  CHECK(args.size == sizeof(args));
  CHECK(args.grad_v == nullptr);
  CHECK(args.stream == nullptr);
}

TEST_CASE("capi: v2 forward on GQA, Nq != Nk, causal problems matches the reference, LSE included") {
  // Nq < Nk: every row sees keys. Nq > Nk (MQA): the first Nq - Nk rows see none, so O = 0 and
  // LSE = -inf there. Non-causal too, so the mask is not the only thing checked.
  const std::vector<fa_problem> problems = {
      make_problem(2, 4, 2, 19, 37, 24, true),
      make_problem(1, 3, 1, 37, 19, 16, true),
      make_problem(2, 4, 2, 19, 37, 24, false),
  };
  for (const fa_problem& problem : problems) {
    const fa::Problem general = to_problem(problem);
    INFO(fa::describe(general));
    CHECK(fa_workspace_bytes_v2("01_cpu", &problem, FA_PASS_FORWARD) == 0);
    HostCall call(problem, 11);
    const int status = fa_forward_v2("01_cpu", &call.args);
    INFO(last_error());
    REQUIRE(status == FA_OK);
    CHECK(last_error().empty());

    std::vector<double> expected_lse;
    const std::vector<double> expected = fa::reference_attention(call.inputs, &expected_lse);
    const fa::ErrorReport errors = fa::compare(call.o, expected, 1e-5);
    INFO(errors.summary());
    CHECK(errors.passed());
    check_lse(call.lse, expected_lse, 1e-5);

    // Without an LSE pointer O is the same and nothing else is written.
    std::vector<float> o(call.o.size(), NAN);
    const fa_forward_args no_lse =
        forward_args(&problem, call.inputs.q.data(), call.inputs.k.data(), call.inputs.v.data(), o.data());
    REQUIRE(fa_forward_v2("01_cpu", &no_lse) == FA_OK);
    CHECK(fa::compare(o, expected, 1e-5).passed());
  }
}

TEST_CASE("capi: the version-1 calls still work") {
  const fa::Problem square = fa::Problem::square(2, 1, 37, 16, true);
  const fa::Inputs inputs = fa::random_inputs(square, 5);
  std::vector<float> out(inputs.q.size(), NAN);
  REQUIRE(fa_workspace_bytes("01_cpu", 2, 1, 37, 16, 1) == 0);
  const int status = fa_forward("01_cpu", 2, 1, 37, 16, 1, inputs.q.data(), inputs.k.data(), inputs.v.data(),
                                out.data(), nullptr, nullptr);
  INFO(last_error());
  REQUIRE(status == FA_OK);
  const fa::ErrorReport masked = fa::compare(out, fa::reference_attention(inputs), 1e-5);
  INFO(masked.summary());
  CHECK(masked.passed());
  // The unmasked answer differs: the flag was not dropped on the way.
  fa::Inputs unmasked = inputs;
  unmasked.problem.causal = false;
  CHECK_FALSE(fa::compare(out, fa::reference_attention(unmasked), 1e-5).passed());

  // Their refusals keep their status codes.
  std::vector<float> buffer(64, 0.0f);
  float* p = buffer.data();
  CHECK(fa_forward("no_such_stage", 1, 1, 4, 4, 0, p, p, p, p, nullptr, nullptr) == FA_UNKNOWN_STAGE);
  CHECK(contains(last_error(), "no_such_stage"));
  CHECK(fa_forward("01_cpu", 1, 1, 0, 4, 0, p, p, p, p, nullptr, nullptr) == FA_INVALID_SHAPE);
  CHECK(fa_forward("01_cpu", 1, 1, 4, 4, 1, p, p, nullptr, p, nullptr, nullptr) == FA_INVALID_ARGUMENT);
  CHECK(fa_workspace_bytes("01_cpu", 1, 1, 4, 257, 0) == -1);
  CHECK(contains(last_error(), "257"));
}

TEST_CASE("capi: size prefixes follow the header's rule") {
  const fa_problem problem = make_problem(1, 2, 1, 5, 9, 8, true);
  HostCall call(problem, 3);

  SECTION("a size below version 2 is an invalid argument") {
    for (const uint32_t size : {0u, 8u, FA_FORWARD_ARGS_SIZE_V2 - 8u}) {
      fa_forward_args small = call.args;
      small.size = size;
      CHECK(fa_forward_v2("01_cpu", &small) == FA_INVALID_ARGUMENT);
      CHECK(contains(last_error(), "args->size is " + std::to_string(size)));
    }
    fa_problem small_problem = problem;
    small_problem.size = 60;  // covers causal, but not the whole version-2 struct
    fa_forward_args args = call.args;
    args.problem = &small_problem;
    CHECK(fa_forward_v2("01_cpu", &args) == FA_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "problem->size is 60"));
    CHECK(fa_workspace_bytes_v2("01_cpu", &small_problem, FA_PASS_FORWARD) == -1);
    CHECK(contains(last_error(), "problem->size"));
  }

  SECTION("an implausible size (never set) is an invalid argument, and is not read") {
    fa_forward_args args = call.args;
    args.size = 0xdeadbeef;
    CHECK(fa_forward_v2("01_cpu", &args) == FA_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "was size set?"));
  }

  SECTION("a newer caller's larger structs work when the fields we do not know are zero") {
    Newer<fa_problem> newer_problem;
    std::memset(&newer_problem, 0, sizeof(newer_problem));
    newer_problem.known = problem;
    newer_problem.known.size = sizeof(newer_problem);
    Newer<fa_forward_args> newer_args;
    std::memset(&newer_args, 0, sizeof(newer_args));
    newer_args.known = call.args;
    newer_args.known.size = sizeof(newer_args);
    newer_args.known.problem = &newer_problem.known;
    CHECK(fa_workspace_bytes_v2("01_cpu", &newer_problem.known, FA_PASS_FORWARD) == 0);
    const int status = fa_forward_v2("01_cpu", &newer_args.known);
    INFO(last_error());
    REQUIRE(status == FA_OK);
    std::vector<double> expected_lse;
    CHECK(fa::compare(call.o, fa::reference_attention(call.inputs, &expected_lse), 1e-5).passed());
    check_lse(call.lse, expected_lse, 1e-5);

    SECTION("and are refused when one of those fields is set") {
      newer_args.later[1] = 1;
      CHECK(fa_forward_v2("01_cpu", &newer_args.known) == FA_UNSUPPORTED);
      CHECK(contains(last_error(), "newer than this library"));
      newer_args.later[1] = 0;
      newer_problem.later[0] = 7;
      CHECK(fa_forward_v2("01_cpu", &newer_args.known) == FA_UNSUPPORTED);
      CHECK(contains(last_error(), "problem sets byte 64"));
      CHECK(fa_workspace_bytes_v2("01_cpu", &newer_problem.known, FA_PASS_FORWARD) == -1);
    }
  }

  SECTION("the padding of fa_problem is never read") {
    fa_problem padded = problem;
    std::memset(reinterpret_cast<unsigned char*>(&padded) + 60, 0xff, 4);
    fa_forward_args args = call.args;
    args.problem = &padded;
    CHECK(fa_forward_v2("01_cpu", &args) == FA_OK);
  }
}

TEST_CASE("capi: stage facts include the features and the architecture") {
  const int cpu = fa_stage_features("01_cpu");
  CHECK((cpu & FA_FEATURE_CAUSAL) != 0);
  CHECK((cpu & FA_FEATURE_GROUPED) != 0);
  CHECK((cpu & FA_FEATURE_RECTANGULAR) != 0);
  CHECK((cpu & FA_FEATURE_LSE) != 0);
  CHECK(text(fa_stage_architecture("01_cpu")) == "cpu");
  CHECK(fa_stage_min_compute_capability("01_cpu") == 0);
  CHECK(text(fa_stage_backend("01_cpu")) == "cpu");

  // A stage of the first part: square problems, causal masking, nothing more.
  if (fa_stage_features("04_online_softmax") >= 0) {
    CHECK(fa_stage_features("04_online_softmax") == FA_FEATURE_CAUSAL);
    const int capability = fa_stage_min_compute_capability("04_online_softmax");
    CHECK(capability >= 75);
    CHECK(text(fa_stage_architecture("04_online_softmax")) == "sm_" + std::to_string(capability) + "+");
    CHECK(fa_stage_kv_passes("04_online_softmax") == 1.0);
  }

  CHECK(fa_stage_features("no_such_stage") == -1);
  CHECK(fa_stage_features(nullptr) == -1);
  CHECK(fa_stage_architecture("no_such_stage") == nullptr);
  CHECK(fa_stage_kv_passes("no_such_stage") == -1.0);
  CHECK(fa_stage_min_compute_capability("no_such_stage") == -1);

  // Every id the library lists answers every fact call.
  REQUIRE(fa_stage_count() >= 1);
  CHECK(fa_stage_id(-1) == nullptr);
  CHECK(fa_stage_id(fa_stage_count()) == nullptr);
  for (const std::string& id : stage_ids()) {
    INFO(id);
    CHECK(fa_stage_features(id.c_str()) >= 0);
    CHECK(fa_stage_architecture(id.c_str()) != nullptr);
    CHECK(fa_stage_kv_passes(id.c_str()) >= 1.0);
    CHECK(fa_stage_title(id.c_str()) != nullptr);
    CHECK(fa_stage_max_dim(id.c_str()) >= 128);
  }
}

TEST_CASE("capi: a square-only stage refuses GQA, Nq != Nk and the LSE before touching a GPU") {
  // Host pointers, and on a machine without a GPU no device: had the ABI looked at either first,
  // the answer would be FA_INVALID_ARGUMENT or FA_CUDA_ERROR, not FA_UNSUPPORTED.
  const std::string id = square_only_stage();
  if (id.empty()) fa::test::skip("this build (FA_ONLY_STAGES) has no square-only stage");
  const char* stage = id.c_str();
  std::vector<float> buffer(4096, 0.0f);
  float* p = buffer.data();

  const fa_problem grouped = make_problem(1, 4, 2, 16, 16, 32, false);
  fa_forward_args args = forward_args(&grouped, p, p, p, p);
  CHECK(fa_forward_v2(stage, &args) == FA_UNSUPPORTED);
  CHECK(contains(last_error(), "stage " + folder_of(id)));
  CHECK(contains(last_error(), "Hkv"));
  CHECK(last_error().find('\n') == std::string::npos);
  CHECK(fa_workspace_bytes_v2(stage, &grouped, FA_PASS_FORWARD) == -1);
  CHECK(contains(last_error(), "stage " + folder_of(id)));

  const fa_problem rectangular = make_problem(1, 2, 2, 4, 16, 32, false);
  args = forward_args(&rectangular, nullptr, nullptr, nullptr, nullptr);  // refused before the pointers too
  CHECK(fa_forward_v2(stage, &args) == FA_UNSUPPORTED);
  CHECK(contains(last_error(), "stage " + folder_of(id)));
  CHECK(contains(last_error(), "Nq"));

  const fa_problem square = make_problem(1, 2, 2, 16, 16, 32, false);
  args = forward_args(&square, p, p, p, p, p);
  CHECK(fa_forward_v2(stage, &args) == FA_UNSUPPORTED);
  CHECK(contains(last_error(), "stage " + folder_of(id)));
  CHECK(contains(last_error(), "log-sum-exp"));

  // A size problem is a shape error, whatever the features.
  const fa_problem too_wide = make_problem(1, 4, 2, 16, 16, 4096, false);
  args = forward_args(&too_wide, p, p, p, p);
  CHECK(fa_forward_v2(stage, &args) == FA_INVALID_SHAPE);
  CHECK(contains(last_error(), "4096"));
}

TEST_CASE("capi: every stage refuses what its features leave out, without a GPU") {
  std::vector<float> buffer(4096, 0.0f);
  float* p = buffer.data();
  const fa_problem grouped = make_problem(1, 4, 1, 8, 8, 16, false);
  const fa_problem rectangular = make_problem(1, 2, 2, 3, 8, 16, false);
  const fa_problem causal = make_problem(1, 2, 2, 8, 8, 16, true);
  const fa_problem square = make_problem(1, 2, 2, 8, 8, 16, false);
  for (const std::string& id : stage_ids()) {
    INFO(id);
    const int features = fa_stage_features(id.c_str());
    const auto refused = [&](const fa_problem& problem, float* lse) {
      const fa_forward_args args = forward_args(&problem, p, p, p, p, lse);
      const int status = fa_forward_v2(id.c_str(), &args);
      INFO(last_error());
      CHECK(status == FA_UNSUPPORTED);
      CHECK(contains(last_error(), "stage " + folder_of(id)));
    };
    if ((features & FA_FEATURE_GROUPED) == 0) refused(grouped, nullptr);
    if ((features & FA_FEATURE_RECTANGULAR) == 0) refused(rectangular, nullptr);
    if ((features & FA_FEATURE_CAUSAL) == 0) refused(causal, nullptr);
    if ((features & FA_FEATURE_LSE) == 0) refused(square, p);
    if ((features & FA_FEATURE_BACKWARD) == 0) {
      CHECK(fa_workspace_bytes_v2(id.c_str(), &square, FA_PASS_BACKWARD) == -1);
      CHECK(contains(last_error(), "has no backward pass"));
    }
  }
}

TEST_CASE("capi: the backward pass is refused by a stage without one") {
  REQUIRE((fa_stage_features("01_cpu") & FA_FEATURE_BACKWARD) == 0);  // when 01 gains one, use another stage
  const fa_problem problem = make_problem(1, 2, 1, 8, 8, 16, true);
  std::vector<float> buffer(4096, 0.0f);
  float* p = buffer.data();
  fa_backward_args args;
  fa_init_backward_args(&args);
  args.problem = &problem;
  args.q = args.k = args.v = args.o = args.grad_o = p;
  args.lse = p;
  args.grad_q = args.grad_k = args.grad_v = p;
  CHECK(fa_backward_v2("01_cpu", &args) == FA_UNSUPPORTED);
  CHECK(last_error() == "stage 01_cpu has no backward pass");
  CHECK(fa_backward_v2("no_such_stage", &args) == FA_UNKNOWN_STAGE);
  CHECK(fa_backward_v2("01_cpu", nullptr) == FA_INVALID_ARGUMENT);
  args.size = 16;
  CHECK(fa_backward_v2("01_cpu", &args) == FA_INVALID_ARGUMENT);
}

TEST_CASE("capi: the backward pass takes `deterministic` 0 or 1, and a version-2 struct without it") {
  // On stage 11's CPU descriptor, whose backward is the same in either mode: the field is read,
  // checked and passed on (fa/deterministic.hpp); the GPU tests check what each stage does with it.
  const char* id = "11_backward/fp32";
  if (fa_stage_features(id) < 0) fa::test::skip("stage 11 is not part of this build (FA_ONLY_STAGES)");
  const fa_problem problem = make_problem(1, 2, 1, 9, 13, 8, false);
  HostCall call(problem, 2024);
  REQUIRE(fa_forward_v2(id, &call.args) == FA_OK);
  const std::vector<float> grad_o = fa::random_output_gradient(to_problem(problem), 2024);
  const int64_t workspace_bytes = fa_workspace_bytes_v2(id, &problem, FA_PASS_BACKWARD);
  REQUIRE(workspace_bytes >= 0);
  std::vector<float> workspace(static_cast<std::size_t>(workspace_bytes) / sizeof(float) + 1);
  const auto gradients = [&](uint32_t size, int32_t deterministic, int expected_status) {
    std::vector<float> grads(call.inputs.q.size() + 2 * call.inputs.k.size(), NAN);
    float* grad_k = grads.data() + call.inputs.q.size();
    fa_backward_args args =
        call.backward_args(grad_o.data(), grads.data(), grad_k, grad_k + call.inputs.k.size(), workspace.data());
    args.size = size;
    args.deterministic = deterministic;
    INFO("size " << size << ", deterministic " << deterministic);
    CHECK(fa_backward_v2(id, &args) == expected_status);
    return grads;
  };
  const std::vector<float> fastest = gradients(FA_BACKWARD_ARGS_SIZE_V4, 0, FA_OK);
  const std::vector<float> deterministic = gradients(FA_BACKWARD_ARGS_SIZE_V4, 1, FA_OK);
  CHECK(std::memcmp(fastest.data(), deterministic.data(), fastest.size() * sizeof(float)) == 0);
  gradients(FA_BACKWARD_ARGS_SIZE_V4, 2, FA_INVALID_ARGUMENT);
  CHECK(last_error() == "fa_backward_v2: args->deterministic is 2; it must be 0 or 1");
  // A version-2 caller's struct ends before the field: whatever lies there is not read.
  const std::vector<float> version2 = gradients(FA_BACKWARD_ARGS_SIZE_V2, 2, FA_OK);
  CHECK(std::memcmp(fastest.data(), version2.data(), fastest.size() * sizeof(float)) == 0);
}

TEST_CASE("capi: bad calls return a status and a message") {
  std::vector<float> buffer(4096, 0.0f);
  float* p = buffer.data();
  const fa_problem problem = make_problem(1, 2, 1, 4, 6, 8, true);
  const fa_forward_args good = forward_args(&problem, p, p, p, p);

  CHECK(fa_forward_v2(nullptr, &good) == FA_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "stage_id is NULL"));
  CHECK(fa_forward_v2("no_such_stage", &good) == FA_UNKNOWN_STAGE);
  CHECK(contains(last_error(), "'no_such_stage'"));
  CHECK(fa_forward_v2("01_cpu", nullptr) == FA_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "args is NULL"));

  fa_forward_args args = good;
  args.problem = nullptr;
  CHECK(fa_forward_v2("01_cpu", &args) == FA_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "problem is NULL"));

  args = good;
  args.k = nullptr;
  CHECK(fa_forward_v2("01_cpu", &args) == FA_INVALID_ARGUMENT);
  CHECK(last_error() == "stage 01_cpu: k is NULL");

  fa_problem bad = problem;
  args = good;
  args.problem = &bad;
  bad.causal = 2;
  CHECK(fa_forward_v2("01_cpu", &args) == FA_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "causal is 2"));
  bad = problem;
  bad.q_heads = 3;  // not a multiple of kv_heads = 2
  bad.kv_heads = 2;
  CHECK(fa_forward_v2("01_cpu", &args) == FA_INVALID_SHAPE);
  CHECK(contains(last_error(), "multiple"));
  bad = problem;
  bad.kv_seq = 0;
  CHECK(fa_forward_v2("01_cpu", &args) == FA_INVALID_SHAPE);
  bad = problem;
  bad.dim = fa_stage_max_dim("01_cpu") + 1;
  CHECK(fa_forward_v2("01_cpu", &args) == FA_INVALID_SHAPE);
  CHECK(fa_workspace_bytes_v2("01_cpu", &bad, FA_PASS_FORWARD) == -1);

  CHECK(fa_workspace_bytes_v2("01_cpu", &problem, 7) == -1);
  CHECK(contains(last_error(), "pass is 7"));
  CHECK(fa_workspace_bytes_v2("01_cpu", nullptr, FA_PASS_FORWARD) == -1);
  CHECK(fa_workspace_bytes_v2(nullptr, &problem, FA_PASS_FORWARD) == -1);

  // A success clears the message.
  CHECK(fa_workspace_bytes_v2("01_cpu", &problem, FA_PASS_FORWARD) == 0);
  CHECK(last_error().empty());
}

// ---- On a GPU (skipped without one) ------------------------------------------------------------

namespace {

fa::Precision precision_of(const std::string& id) {
  const std::string name = fa_stage_precision(id.c_str());
  return name == "fp16" ? fa::Precision::fp16 : name == "bf16" ? fa::Precision::bf16 : fa::Precision::fp32;
}

// Runs CUDA stage `id` through fa_forward_v2 on device copies of `inputs` and checks O (and the LSE
// when `with_lse`) against the reference.
void check_cuda_stage(const std::string& id, const fa_problem& problem, bool with_lse) {
  const fa::Precision precision = precision_of(id);
  fa::Inputs inputs = fa::random_inputs(to_problem(problem), 21);
  fa::round_to_precision(inputs, precision);
  INFO(id << " at " << fa::describe(inputs.problem) << (with_lse ? " with LSE" : ""));
  const fa::DeviceBuffer q = fa::DeviceBuffer::from(fa::encode(inputs.q, precision));
  const fa::DeviceBuffer k = fa::DeviceBuffer::from(fa::encode(inputs.k, precision));
  const fa::DeviceBuffer v = fa::DeviceBuffer::from(fa::encode(inputs.v, precision));
  const fa::DeviceBuffer o = fa::DeviceBuffer::from(fa::encode(std::vector<float>(inputs.q.size(), NAN), precision));
  const fa::DeviceBuffer lse = fa::DeviceBuffer::from(std::vector<float>(inputs.problem.q_rows(), NAN));
  const int64_t workspace_bytes = fa_workspace_bytes_v2(id.c_str(), &problem, FA_PASS_FORWARD);
  INFO(last_error());
  REQUIRE(workspace_bytes >= 0);
  const fa::DeviceBuffer workspace(static_cast<std::size_t>(workspace_bytes));

  fa_forward_args args =
      forward_args(&problem, q.get(), k.get(), v.get(), o.get(), with_lse ? lse.as<float>() : nullptr);
  args.workspace = workspace.get();
  const int status = fa_forward_v2(id.c_str(), &args);
  INFO(last_error());
  if (status == FA_UNSUPPORTED && contains(last_error(), " needs sm_")) return;  // not this GPU's architecture
  REQUIRE(status == FA_OK);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

  std::vector<double> expected_lse;
  const std::vector<double> expected = fa::reference_attention(inputs, &expected_lse);
  const double max_abs_v = 1.0;  // random_inputs is uniform in [-1, 1)
  const fa::ErrorReport errors =
      fa::compare(fa::decode(o.to_vector<unsigned char>(), precision), expected, fa::tolerance(precision, max_abs_v));
  INFO(errors.summary());
  CHECK(errors.passed());
  if (with_lse) check_lse(lse.to_vector<float>(), expected_lse, 1e-3);
}

}  // namespace

TEST_CASE("capi: CUDA stages through v2 on the GPU, general problems where they take them") {
  fa::test::require_cuda_device();
  for (const std::string& id : stage_ids()) {
    if (text(fa_stage_backend(id.c_str())) != "cuda") continue;
    const int features = fa_stage_features(id.c_str());
    check_cuda_stage(id, make_problem(2, 3, 3, 70, 70, 40, false), false);
    if ((features & FA_FEATURE_CAUSAL) != 0) check_cuda_stage(id, make_problem(2, 3, 3, 70, 70, 40, true), false);
    const bool general = (features & FA_FEATURE_GROUPED) != 0 && (features & FA_FEATURE_RECTANGULAR) != 0;
    if (general) {
      const bool lse = (features & FA_FEATURE_LSE) != 0;
      check_cuda_stage(id, make_problem(1, 8, 2, 33, 150, 64, true), lse);
      check_cuda_stage(id, make_problem(2, 4, 1, 150, 33, 64, true), lse);
    }
  }
}

TEST_CASE("capi: host memory for a CUDA stage and device memory for the CPU stage are refused") {
  fa::test::require_cuda_device();
  const fa_problem problem = make_problem(1, 2, 2, 16, 16, 32, false);
  std::vector<float> host(1024, 0.0f);
  const fa::DeviceBuffer device(host.size() * sizeof(float));
  float* h = host.data();
  void* d = device.get();

  fa_forward_args host_to_gpu = forward_args(&problem, d, h, d, d);
  host_to_gpu.workspace = d;  // refused at k, before the stage could use it
  int runnable = 0;
  for (const std::string& id : stage_ids()) {
    if (text(fa_stage_backend(id.c_str())) != "cuda") continue;
    const int status = fa_forward_v2(id.c_str(), &host_to_gpu);
    if (status == FA_UNSUPPORTED && contains(last_error(), " needs sm_")) continue;  // not this GPU's architecture
    ++runnable;
    INFO(id << ": " << last_error());
    CHECK(status == FA_INVALID_ARGUMENT);
    CHECK(contains(last_error(), "k is host memory"));
  }
  CHECK(runnable > 0);

  const fa_forward_args device_to_cpu = forward_args(&problem, h, h, h, d);
  CHECK(fa_forward_v2("01_cpu", &device_to_cpu) == FA_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "o must be host memory"));
}

TEST_CASE("capi: v2 backward through the C++ backward of stage 11 matches the reference gradients") {
  // "11_backward/fp32" is stage 11's third descriptor, on the CPU: its forward writes O and the LSE,
  // its backward dQ, dK and dV (poisoned first) from dO, in host memory. GQA, Nq != Nk, causal.
  const char* id = "11_backward/fp32";
  if (fa_stage_features(id) < 0) fa::test::skip("stage 11 is not part of this build (FA_ONLY_STAGES)");
  REQUIRE((fa_stage_features(id) & FA_FEATURE_BACKWARD) != 0);
  const fa_problem problem = make_problem(2, 4, 2, 23, 41, 24, true);
  HostCall call(problem, 1190);
  REQUIRE(fa_forward_v2(id, &call.args) == FA_OK);
  const fa::Problem general = to_problem(problem);
  const std::vector<float> grad_o = fa::random_output_gradient(general, 1190);
  std::vector<float> grad_q(call.inputs.q.size(), NAN), grad_k(call.inputs.k.size(), NAN),
      grad_v(call.inputs.v.size(), NAN);
  const int64_t workspace_bytes = fa_workspace_bytes_v2(id, &problem, FA_PASS_BACKWARD);
  REQUIRE(workspace_bytes == general.q_rows() * static_cast<int64_t>(sizeof(float)));
  std::vector<float> workspace(static_cast<std::size_t>(general.q_rows()));
  const fa_backward_args args =
      call.backward_args(grad_o.data(), grad_q.data(), grad_k.data(), grad_v.data(), workspace.data());
  const int status = fa_backward_v2(id, &args);
  INFO(last_error());
  REQUIRE(status == FA_OK);
  const fa::GradientReference expected = fa::reference_backward(call.inputs, grad_o, {0, 1, 2, 3});
  const double unit = fa::gradient_tolerance_unit(fa::Precision::fp32);
  for (const auto& [actual, values, bound] :
       {std::tuple<const std::vector<float>*, const std::vector<double>*, const std::vector<double>*>{
            &grad_q, &expected.dq, &expected.dq_bound},
        {&grad_k, &expected.dk, &expected.dk_bound},
        {&grad_v, &expected.dv, &expected.dv_bound}}) {
    const fa::ErrorReport errors = fa::compare_gradient(*actual, *values, *bound, unit);
    INFO(errors.summary());
    CHECK(errors.passed());
  }
}
