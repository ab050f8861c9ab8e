#include "fa/inputs.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>

namespace fa {
namespace {

// SplitMix64: a tiny generator whose output is the same on every platform and compiler,
// which std::uniform_real_distribution does not promise.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1), on a 2^-23 grid so every value is exact in FP32.
  float uniform() { return static_cast<float>(static_cast<int64_t>(next() >> 40) - (int64_t{1} << 23)) / 8388608.0f; }

 private:
  uint64_t state_;
};

std::vector<float> uniform_values(int64_t count, SplitMix64& random) {
  std::vector<float> values(static_cast<std::size_t>(count));
  for (float& value : values) value = random.uniform();
  return values;
}

float round_one(float value, Precision precision) {
  switch (precision) {
    case Precision::fp16:
      return __half2float(__float2half_rn(value));
    case Precision::bf16:
      return __bfloat162float(__float2bfloat16_rn(value));
    case Precision::fp32:
      break;
  }
  return value;
}

}  // namespace

Inputs random_inputs(const Problem& problem, uint64_t seed) {
  SplitMix64 random(seed);
  Inputs inputs;
  inputs.problem = problem;
  inputs.q = uniform_values(problem.q_elements(), random);
  inputs.k = uniform_values(problem.kv_elements(), random);
  inputs.v = uniform_values(problem.kv_elements(), random);
  return inputs;
}

void round_to_precision(Inputs& inputs, Precision precision) {
  for (std::vector<float>* tensor : {&inputs.q, &inputs.k, &inputs.v}) round_to_precision(*tensor, precision);
}

void round_to_precision(std::vector<float>& values, Precision precision) {
  for (float& value : values) value = round_one(value, precision);
}

std::vector<float> random_output_gradient(const Problem& problem, uint64_t seed) {
  SplitMix64 random(seed ^ 0xD0D0D0D0DEADBEEFull);
  return uniform_values(problem.q_elements(), random);
}

std::vector<unsigned char> encode(const std::vector<float>& values, Precision precision) {
  const std::size_t width = static_cast<std::size_t>(precision_bytes(precision));
  std::vector<unsigned char> bytes(values.size() * width);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (precision == Precision::fp32) {
      std::memcpy(&bytes[i * width], &values[i], width);
    } else if (precision == Precision::fp16) {
      const __half half = __float2half_rn(values[i]);
      std::memcpy(&bytes[i * width], &half, width);
    } else {
      const __nv_bfloat16 brain = __float2bfloat16_rn(values[i]);
      std::memcpy(&bytes[i * width], &brain, width);
    }
  }
  return bytes;
}

std::vector<float> decode(const std::vector<unsigned char>& bytes, Precision precision) {
  const std::size_t width = static_cast<std::size_t>(precision_bytes(precision));
  std::vector<float> values(bytes.size() / width);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (precision == Precision::fp32) {
      std::memcpy(&values[i], &bytes[i * width], width);
    } else if (precision == Precision::fp16) {
      __half half;
      std::memcpy(&half, &bytes[i * width], width);
      values[i] = __half2float(half);
    } else {
      __nv_bfloat16 brain;
      std::memcpy(&brain, &bytes[i * width], width);
      values[i] = __bfloat162float(brain);
    }
  }
  return values;
}

Inputs walkthrough_inputs() {
  Inputs inputs;
  inputs.problem = Problem::square(1, 1, 4, 2);
  inputs.q = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f};
  inputs.k = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f};
  inputs.v = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
  return inputs;
}

Inputs well_conditioned_inputs() {
  // Two heads of 7 keys (three tiles of 2 and a partial one), D = 3. Scores stay within
  // ±0.2, so every key gets between 1/9 and 1/5 of each row's weight, and each tile's
  // values differ, so dropping or repeating any tile moves every output visibly.
  Inputs inputs;
  inputs.problem = Problem::square(1, 2, 7, 3);
  const int64_t count = inputs.problem.q_elements();
  for (int64_t index = 0; index < count; ++index) {
    const double x = static_cast<double>(index);
    inputs.q.push_back(static_cast<float>(0.25 * std::sin(1.0 + x)));
    inputs.k.push_back(static_cast<float>(0.25 * std::cos(2.0 + 0.7 * x)));
    const int64_t key = (index / inputs.problem.dim) % inputs.problem.kv_seq;
    inputs.v.push_back(static_cast<float>(0.1 * static_cast<double>(key + 1) + 0.05 * static_cast<double>(index % 3)));
  }
  return inputs;
}

Inputs large_logit_inputs(const Problem& problem, uint64_t seed) {
  // Q in [-1000, 1000), K in [-1, 1): scores of a few hundred to ~1e3, whose exp overflows
  // FP32 (limit ~88) unless the row max is subtracted first.
  Inputs inputs = random_inputs(problem, seed);
  for (float& value : inputs.q) value *= 1000.0f;
  return inputs;
}

}  // namespace fa
