// Stage 06: tensor cores through WMMA (FP16 in and out, FP32 accumulation).
//
// Structural test (registered in CMake with fa_add_structural_test, SOURCE
// stages/06_wmma/wmma_attention.cu, ARCH 75 and ARCH 90): the PTX must hold both tensor-core
// products, which a CUDA-core rewrite of the exercise would lose:
//   S = Q K^T (Q row-major, K^T column-major):  wmma\.mma\.sync\.aligned\.row\.col\.m16n16k16\.f32\.f32
//   O += P V  (both row-major):                 wmma\.mma\.sync\.aligned\.row\.row\.m16n16k16\.f32\.f32
// (In SASS these are HMMA.16816.F32 on sm_80 and newer, HMMA.1688.F32 on sm_75.)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "catch_compat.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

FA_GPU_STAGE_CONTRACT("stage06", fa::stages::wmma_tensor_cores)

TEST_CASE("stage06: head dims that are not multiples of 16 are padded") {
  const fa::StageDescriptor stage = fa::stages::wmma_tensor_cores();
  fa::test::require_stage_runnable(stage);
  // 197 keys: three 64-key tiles and a partial one (twelve 16-key tiles and a partial one for
  // the D = 256 bucket); B·H = 4. Buckets: 1 and 2 -> 16, 17 -> 32, 100 -> 128, 129 and 200 -> 256;
  // all but 200 (a multiple of 8) take the element-by-element kernel.
  uint64_t seed = 600;
  for (const int64_t dim : {1, 2, 17, 100, 129, 200}) {
    fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(2, 2, 197, dim), seed++));
  }
}

TEST_CASE("stage06: every bucket, with 16-byte loads into padded columns") {
  const fa::StageDescriptor stage = fa::stages::wmma_tensor_cores();
  fa::test::require_stage_runnable(stage);
  // D % 8 == 0 takes the vector path; 8, 24, 40, 72 and 136 also leave padding columns in their
  // bucket. N = 130: three query tiles of 64, the last with 2 rows.
  uint64_t seed = 610;
  for (const int64_t dim : {8, 16, 24, 32, 40, 64, 72, 128, 136, 256}) {
    fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(1, 3, 130, dim), seed++));
  }
}

TEST_CASE("stage06: causal masking in every bucket, on both load paths") {
  const fa::StageDescriptor stage = fa::stages::wmma_tensor_cores();
  fa::test::require_stage_runnable(stage);
  CHECK(stage.features.causal);
  // N = 1 and 40 (inside the first query tile and the first K/V tile), 64 (exactly one tile),
  // 130 and 333 (several query tiles, the diagonal crossing partial tiles). D = 256 has 16-key
  // tiles, four on each diagonal: the block's first warps skip the later ones. 17 and 100 take
  // the element-by-element kernel.
  uint64_t seed = 630;
  for (const int64_t seq : {1, 40, 64, 130, 333}) {
    for (const int64_t dim : {16, 17, 64, 100, 128, 256}) {
      fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(2, 2, seq, dim, true), seed++));
    }
  }
}

TEST_CASE("stage06: pointers off a 16-byte boundary take the scalar path") {
  const fa::StageDescriptor stage = fa::stages::wmma_tensor_cores();
  fa::test::require_stage_runnable(stage);
  fa::Inputs inputs = fa::random_inputs(fa::Problem::square(1, 2, 150, 64), 620);
  fa::round_to_precision(inputs, fa::Precision::fp16);
  // One extra element in front of every tensor puts each pointer 2 bytes past a 16-byte boundary.
  const auto shifted = [](const std::vector<float>& values) {
    std::vector<float> padded(1, 0.0f);
    padded.insert(padded.end(), values.begin(), values.end());
    return fa::DeviceBuffer::from(fa::encode(padded, fa::Precision::fp16));
  };
  const fa::DeviceBuffer q = shifted(inputs.q);
  const fa::DeviceBuffer k = shifted(inputs.k);
  const fa::DeviceBuffer v = shifted(inputs.v);
  const fa::DeviceBuffer o = shifted(std::vector<float>(inputs.q.size(), NAN));
  const auto past_first = [](const fa::DeviceBuffer& buffer) { return buffer.as<unsigned char>() + 2; };
  fa::ForwardArgs args;
  args.problem = inputs.problem;
  args.q = past_first(q);
  args.k = past_first(k);
  args.v = past_first(v);
  args.o = past_first(o);
  const fa::Status status = stage.forward(args);
  INFO(status.reason());
  REQUIRE(status.ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<unsigned char> bytes = o.to_vector<unsigned char>();
  bytes.erase(bytes.begin(), bytes.begin() + 2);
  const std::vector<float> out = fa::decode(bytes, fa::Precision::fp16);
  float max_abs_v = 0.0f;
  for (const float value : inputs.v) max_abs_v = std::max(max_abs_v, std::fabs(value));
  const fa::ErrorReport errors = fa::compare(
      out, fa::reference_attention(inputs),
      fa::tolerance(fa::Precision::fp16, max_abs_v, fa::logit_bound(inputs.q, inputs.k, inputs.problem.dim)));
  INFO(errors.summary());
  CHECK(errors.passed());
}

TEST_CASE("stage06: refuses shapes it cannot run before touching the GPU") {
  // forward validates first, so this needs no device: null pointers are never dereferenced.
  const fa::StageDescriptor stage = fa::stages::wmma_tensor_cores();
  CHECK(stage.max_dim == 256);
  CHECK(stage.precision == fa::Precision::fp16);
  for (const fa::Problem& problem :
       {fa::Problem::square(1, 1, 64, 257), fa::Problem::square(1, 1, 0, 64), fa::Problem::square(1, 1, 64, 0)}) {
    fa::ForwardArgs args;
    args.problem = problem;
    const fa::Status status = stage.forward(args);
    INFO(fa::describe(problem) << ": " << status.reason());
    CHECK(status.code() == fa::Status::Code::unsupported);
  }
}
