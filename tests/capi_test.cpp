// The C ABI (stages/fa_capi.h) from C++, on the CPU stage so it runs without a GPU: causal masking
// reaches the stage, and bad calls come back as status codes with a message, never a crash.
#include <cstdint>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa_capi.h"

namespace {

std::vector<float> run_cpu_stage(const fa::Inputs& inputs) {
  const fa::Shape& s = inputs.shape;
  std::vector<float> out(inputs.q.size(), 0.0f);
  REQUIRE(fa_workspace_bytes("01_cpu", s.batch, s.heads, s.seq, s.dim, s.causal) == 0);
  const int status = fa_forward("01_cpu", s.batch, s.heads, s.seq, s.dim, s.causal, inputs.q.data(), inputs.k.data(),
                                inputs.v.data(), out.data(), nullptr, nullptr);
  INFO(fa_last_error());
  REQUIRE(status == FA_OK);
  return out;
}

}  // namespace

TEST_CASE("capi: causal masking reaches the stage") {
  fa::Shape shape{2, 1, 37, 16};
  shape.causal = true;
  const fa::Inputs inputs = fa::random_inputs(shape, 5);
  const std::vector<float> out = run_cpu_stage(inputs);
  const fa::ErrorReport masked = fa::compare(out, fa::reference_attention(inputs), 1e-5);
  INFO(masked.summary());
  CHECK(masked.passed());
  // The unmasked answer differs: the flag was not dropped on the way.
  fa::Inputs unmasked_inputs = inputs;
  unmasked_inputs.shape.causal = false;
  CHECK_FALSE(fa::compare(out, fa::reference_attention(unmasked_inputs), 1e-5).passed());
}

TEST_CASE("capi: bad calls return a status and a message") {
  std::vector<float> buffer(64, 0.0f);
  float* p = buffer.data();
  CHECK(fa_forward("no_such_stage", 1, 1, 4, 4, 0, p, p, p, p, nullptr, nullptr) == FA_UNKNOWN_STAGE);
  CHECK(std::string(fa_last_error()).find("no_such_stage") != std::string::npos);
  CHECK(fa_forward("01_cpu", 1, 1, 0, 4, 0, p, p, p, p, nullptr, nullptr) == FA_INVALID_SHAPE);
  CHECK(fa_forward("01_cpu", 1, 1, 4, 4, 1, p, p, nullptr, p, nullptr, nullptr) == FA_INVALID_ARGUMENT);
  CHECK(fa_workspace_bytes("01_cpu", 1, 1, 4, 257, 0) == -1);
}
