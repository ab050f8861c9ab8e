// The N=4 walkthrough's backward pass (DESIGN.md, "Fixtures"): a fixed output gradient dO for the
// fixture of inputs.hpp and every exact value of the backward pass on it, computed in double from
// the reference (reference.hpp), never typed in. `--walkthrough` of a stage with a backward pass
// prints them beside the stage's gradients (runner.hpp, run_walkthrough); the tests check them.
#pragma once

#include <vector>

#include "fa/inputs.hpp"
#include "fa/reference.hpp"
#include "fa/stage.hpp"

namespace fa {

// dO of the walkthrough, N × D = 4 × 2, row-major: [[1, 0], [0, 1], [1, 1], [-1, 2]].
std::vector<float> walkthrough_output_gradient();

// The walkthrough's backward pass in double, for its Q, K, V and dO as a stage of `precision`
// sees them (rounded to that type first). N × N matrices are row-major, row i a query, column j a
// key; the scale is 1 / sqrt(D).
struct WalkthroughBackward {
  Inputs inputs;                // Q, K, V, rounded
  std::vector<float> grad_o;    // dO, rounded
  std::vector<double> o;        // the forward's O, N × D
  std::vector<double> lse;      // the forward's log-sum-exp per row, N
  std::vector<double> delta;    // D_i = rowsum(dO ∘ O), N
  std::vector<double> p;        // P = exp(S − LSE_i), rebuilt as the backward does, N × N
  std::vector<double> grad_p;   // dP = dO Vᵀ, N × N
  std::vector<double> grad_s;   // dS = P ∘ (dP − D_i), N × N: dQ = dS K·scale, dK = dSᵀ Q·scale
  GradientReference gradients;  // dQ, dK, dV (= Pᵀ dO) from reference_backward, with their bounds
};
WalkthroughBackward walkthrough_backward(Precision precision);

}  // namespace fa
