// One GPU smoke test: the device query and a kernel round trip. Without a CUDA device it is
// reported Skipped (exit 77), and with FA_REQUIRE_GPU=1 it fails instead: this test proves
// both paths of the GPU test helpers.
#include <vector>

#include "catch_compat.hpp"
#include "fa/device.hpp"
#include "fa/device_buffer.hpp"
#include "fa/runner.hpp"
#include "gpu_contract.hpp"

namespace {

__global__ void add_one(float* values, int count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) values[i] += 1.0f;
}

// A GPU "stage" that writes nothing: the runner's NaN poison must catch it on the device too,
// in O and in the log-sum-exp.
fa::Status silent_forward(const fa::ForwardArgs&) { return fa::Status(); }

}  // namespace

TEST_CASE("common: GPU smoke test (device query and a kernel round trip)") {
  fa::test::require_cuda_device();
  const fa::DeviceInfo device = fa::query_device();
  CHECK(device.present);
  CHECK(device.compute_capability >= 50);
  CHECK(device.multiprocessors > 0);

  std::vector<float> host(1000);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  fa::DeviceBuffer buffer = fa::DeviceBuffer::from(host);
  add_one<<<4, 256>>>(buffer.as<float>(), static_cast<int>(host.size()));
  FA_CUDA_CHECK(cudaGetLastError());
  const std::vector<float> back = buffer.to_vector<float>();
  for (std::size_t i = 0; i < back.size(); ++i) CHECK(back[i] == static_cast<float>(i) + 1.0f);
}

TEST_CASE("common: the NaN poison catches a GPU stage that writes nothing") {
  fa::test::require_cuda_device();
  fa::StageDescriptor stage;
  stage.id = "test_silent";
  stage.forward = &silent_forward;
  stage.features.lse = true;
  fa::RunOptions options;
  options.problem = fa::Problem::square(1, 1, 8, 4);
  options.time = false;
  options.lse = true;
  const fa::RunOutcome outcome = fa::run_stage(stage, options);
  CHECK(outcome.row.status == "error");
  CHECK(outcome.errors.non_finite == options.problem.q_elements());
  CHECK(outcome.lse_errors.non_finite == options.problem.q_rows());
}
