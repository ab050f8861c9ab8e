// Stage 05: float4 loads and register micro-tiles. Besides the shared contract, the scalar
// fallback of the hybrid loader: head dims that are not multiples of 4, and tensors that are not
// 16-byte aligned, must give the same answer as the float4 path, with and without causal masking
// (a separate instantiation of the kernel).
//
// The structural tests (tests/CMakeLists.txt) check that the kernel really moves 128 bits at a
// time: the PTX of stages/05_float4/float4_tiles.cu, for sm_90 and sm_75, must match
//   ld\.global(\.nc)?\.v4\.f32     (global -> registers, float4)
//   ld\.shared\.v4\.f32            (shared -> registers, float4: the micro-tile loads)
//   st\.shared\.v4\.f32            (registers -> shared, float4)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fa/cuda_check.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/problem.hpp"
#include "fa/reference.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

FA_GPU_STAGE_CONTRACT("stage05", fa::stages::float4_tiles)

namespace {

// 150 keys: two full 64-key tiles and a partial one (four and a partial for the 32-key
// configurations of smaller GPUs); B·H = 4. With causal masking the diagonal crosses a partial
// query tile and a partial key tile.
fa::Problem problem_with_dim(int64_t dim, bool causal = false) { return fa::Problem::square(2, 2, 150, dim, causal); }

// Offsets, in floats, of each tensor from the start of its (256-byte aligned) allocation.
struct Offsets {
  int q, k, v, o;
};

// Calls the stage's forward directly on device pointers `offsets` floats into their buffers, then
// compares O with the reference and checks that nothing around O was written.
void check_with_offsets(const fa::StageDescriptor& stage, const fa::Inputs& inputs, const Offsets& offsets) {
  const std::size_t elements = inputs.q.size();
  const std::size_t slack = 4;  // floats of room on each side of every tensor
  const std::size_t buffer_floats = elements + 2 * slack;
  auto upload = [&](const std::vector<float>& host, int offset) {
    fa::DeviceBuffer buffer(buffer_floats * sizeof(float));
    FA_CUDA_CHECK(
        cudaMemcpy(buffer.as<float>() + offset, host.data(), elements * sizeof(float), cudaMemcpyHostToDevice));
    return buffer;
  };
  const fa::DeviceBuffer q = upload(inputs.q, offsets.q);
  const fa::DeviceBuffer k = upload(inputs.k, offsets.k);
  const fa::DeviceBuffer v = upload(inputs.v, offsets.v);
  fa::DeviceBuffer o(buffer_floats * sizeof(float));
  FA_CUDA_CHECK(cudaMemset(o.get(), 0xff, o.bytes()));  // all-ones bits: NaN

  fa::ForwardArgs args;
  args.problem = inputs.problem;
  args.q = q.as<float>() + offsets.q;
  args.k = k.as<float>() + offsets.k;
  args.v = v.as<float>() + offsets.v;
  args.o = o.as<float>() + offsets.o;
  const fa::Status status = stage.forward(args);
  INFO(status.reason());
  REQUIRE(status.ok());
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> whole = o.to_vector<float>();

  const std::vector<float> actual(whole.begin() + offsets.o, whole.begin() + offsets.o + elements);
  double max_abs_v = 0.0;
  for (const float value : inputs.v) max_abs_v = std::max(max_abs_v, static_cast<double>(std::fabs(value)));
  const double tolerance =
      fa::tolerance(fa::Precision::fp32, max_abs_v, fa::logit_bound(inputs.q, inputs.k, inputs.problem.dim));
  const fa::ErrorReport errors = fa::compare(actual, fa::reference_attention(inputs), tolerance);
  INFO(fa::describe(inputs.problem) << " offsets q " << offsets.q << " k " << offsets.k << " v " << offsets.v << " o "
                                    << offsets.o << ": " << errors.summary());
  CHECK(errors.passed());

  int64_t written_outside = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    if (i >= static_cast<std::size_t>(offsets.o) && i < offsets.o + elements) continue;
    uint32_t bits = 0;
    std::memcpy(&bits, &whole[i], sizeof(bits));
    if (bits != 0xffffffffu) ++written_outside;
  }
  CHECK(written_outside == 0);
}

}  // namespace

TEST_CASE("stage05: scalar fallback matches the reference when D % 4 != 0") {
  const fa::StageDescriptor stage = fa::stages::float4_tiles();
  fa::test::require_stage_runnable(stage);
  const int64_t dim = GENERATE(1, 2, 3, 5, 127);
  fa::test::check_stage_on(stage, fa::random_inputs(problem_with_dim(dim), static_cast<uint64_t>(500 + dim)));
}

TEST_CASE("stage05: causal masking on the scalar fallback, D % 4 != 0") {
  const fa::StageDescriptor stage = fa::stages::float4_tiles();
  fa::test::require_stage_runnable(stage);
  const int64_t dim = GENERATE(1, 5, 127);
  fa::test::check_stage_on(stage, fa::random_inputs(problem_with_dim(dim, true), static_cast<uint64_t>(550 + dim)));
}

TEST_CASE("stage05: float4 path matches the reference at D = 4, 64, 100, 128, 256") {
  const fa::StageDescriptor stage = fa::stages::float4_tiles();
  fa::test::require_stage_runnable(stage);
  const int64_t dim = GENERATE(4, 64, 100, 128, 256);
  fa::test::check_stage_on(stage, fa::random_inputs(problem_with_dim(dim), static_cast<uint64_t>(600 + dim)));
}

TEST_CASE("stage05: causal masking on the float4 path, every head-dim bucket") {
  const fa::StageDescriptor stage = fa::stages::float4_tiles();
  fa::test::require_stage_runnable(stage);
  const int64_t dim = GENERATE(4, 64, 128, 256);
  fa::test::check_stage_on(stage, fa::random_inputs(problem_with_dim(dim, true), static_cast<uint64_t>(650 + dim)));
}

TEST_CASE("stage05: scalar fallback for pointers that are not 16-byte aligned") {
  const fa::StageDescriptor stage = fa::stages::float4_tiles();
  fa::test::require_stage_runnable(stage);
  // D = 64 and 128 would take the float4 path if the pointers were aligned.
  const int64_t dim = GENERATE(64, 128);
  const bool causal = GENERATE(false, true);
  const fa::Inputs inputs = fa::random_inputs(problem_with_dim(dim, causal), static_cast<uint64_t>(700 + dim));
  check_with_offsets(stage, inputs, Offsets{0, 0, 0, 0});  // aligned: the float4 path
  check_with_offsets(stage, inputs, Offsets{1, 1, 1, 1});  // every tensor one float off
  check_with_offsets(stage, inputs, Offsets{0, 2, 0, 0});  // one input 8 bytes off
  check_with_offsets(stage, inputs, Offsets{0, 0, 0, 3});  // only the output off
}

// B·H = 65539 heads: the work items (query tile, head) are numbered in one grid dimension, with the
// head the fast index under causal masking and the slow one without.
TEST_CASE("stage05: many heads (B·H = 65539), causal and not") {
  const fa::StageDescriptor stage = fa::stages::float4_tiles();
  fa::test::require_stage_runnable(stage);
  const bool causal = GENERATE(false, true);
  fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(65539, 1, 3, 4, causal), 800));
}

TEST_CASE("stage05: rejects D above 256 and null tensors without launching") {
  const fa::StageDescriptor stage = fa::stages::float4_tiles();
  float unused = 0.0f;
  fa::ForwardArgs too_wide;
  too_wide.problem = fa::Problem::square(1, 1, 8, 257);
  too_wide.q = too_wide.k = too_wide.v = too_wide.o = &unused;
  const fa::Status wide = stage.forward(too_wide);
  CHECK(wide.code() == fa::Status::Code::unsupported);
  CHECK_FALSE(wide.reason().empty());
  fa::ForwardArgs null_tensors;
  null_tensors.problem = fa::Problem::square(1, 1, 8, 64);
  const fa::Status null = stage.forward(null_tensors);
  CHECK(null.code() == fa::Status::Code::unsupported);
  CHECK_FALSE(null.reason().empty());
}
