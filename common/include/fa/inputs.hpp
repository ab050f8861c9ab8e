// Deterministic inputs, conversion to the stage precisions, and the fixtures of DESIGN.md.
#pragma once

#include <cstdint>
#include <vector>

#include "fa/problem.hpp"
#include "fa/stage.hpp"

namespace fa {

// Q is (B, Hq, Nq, D), K and V are (B, Hkv, Nk, D) (problem.hpp).
struct Inputs {
  Problem problem;
  std::vector<float> q, k, v;  // FP32 values; for FP16/BF16 stages already rounded to that type
};

// Uniform in [-1, 1), the same on every platform for a given seed.
Inputs random_inputs(const Problem& problem, uint64_t seed);

// Rounds every value to what `precision` can hold, so the reference sees what the kernel sees.
void round_to_precision(Inputs& inputs, Precision precision);
void round_to_precision(std::vector<float>& values, Precision precision);

// The output gradient dO of the backward pass (the shape of O): uniform in [-1, 1), drawn from
// its own stream of `seed`, so it differs from Q, K and V of the same seed.
std::vector<float> random_output_gradient(const Problem& problem, uint64_t seed);

// Host-side conversion to and from the bytes a stage of `precision` takes and returns.
std::vector<unsigned char> encode(const std::vector<float>& values, Precision precision);
std::vector<float> decode(const std::vector<unsigned char>& bytes, Precision precision);

// The N=4, D=2 walkthrough of DESIGN.md (tile size kWalkthroughTile).
constexpr int64_t kWalkthroughTile = 2;
Inputs walkthrough_inputs();

// Every K/V tile of kWalkthroughTile rows carries a clearly visible share of every row's
// weight, so a kernel that drops or double-counts a tile fails visibly.
Inputs well_conditioned_inputs();

// Logits of magnitude ~1e3: exp without the max subtraction overflows.
Inputs large_logit_inputs(const Problem& problem, uint64_t seed);

}  // namespace fa
