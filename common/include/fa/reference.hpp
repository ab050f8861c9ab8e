// The reference: attention computed in double, straight from the definition.
#pragma once

#include <cstdint>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/stage.hpp"

namespace fa {

// O for the chosen query rows (indices (b·Hq + h)·Nq + i), as rows.size() × D doubles, and when
// `lse` is given the log-sum-exp of each row (natural log of Σ_j exp(s_j), s = q·k / sqrt(D)).
// Query head h reads key/value head h / (Hq / Hkv); with causal, row i sees the keys of
// causal.hpp, and a row that sees none has O = 0 and LSE = -inf.
std::vector<double> reference_rows(const Inputs& inputs, const std::vector<int64_t>& rows,
                                   std::vector<double>* lse = nullptr);

// Every row.
std::vector<double> reference_attention(const Inputs& inputs, std::vector<double>* lse = nullptr);

// The scores S = Q K^T / sqrt(D) of one query head, Nq × Nk (for the walkthrough and the tests).
std::vector<double> reference_scores(const Inputs& inputs, int64_t query_head);

// The exact online-softmax state after each K/V tile: after tiles 0..t, m and l are the max
// and the sum of exp(s - m) over the keys seen so far, and o is their softmax-weighted average
// of V. That is attention restricted to the first (t + 1)·tile keys, whatever the algorithm.
TileTrace reference_trace(const Inputs& inputs, int64_t tile);

// The gradients of attention for an output gradient dO (shape of O), in double, for whole
// (batch, key/value head) groups: `kv_heads` lists flattened K/V heads b·Hkv + g. For each, in
// that order: dQ of the Hq/Hkv query heads that read it (b·Hq + g·Hq/Hkv onwards, each Nq × D),
// then its dK and dV (Nk × D), summed over those query heads. P is rebuilt from the reference's
// own log-sum-exp; D_i = rowsum(dO ∘ O), dS = P ∘ (dP − D_i) with dP = dO Vᵀ, dQ = dS K·scale,
// dK = dSᵀ Q·scale, dV = Pᵀ dO. A row that sees no key contributes nothing.
//
// Beside each gradient element, `*_bound` holds the sum of the magnitudes of the terms a 16-bit
// kernel rounds on its way to it (metrics.hpp, gradient_tolerance): its error is at most a few
// unit roundoffs times that.
struct GradientReference {
  std::vector<double> dq, dk, dv;
  std::vector<double> dq_bound, dk_bound, dv_bound;
};
GradientReference reference_backward(const Inputs& inputs, const std::vector<float>& grad_o,
                                     const std::vector<int64_t>& kv_heads);

// Every (batch, key/value head) group when there are at most `limit`, else the first and last
// and seeded random ones, `limit` in all (a full double backward of a large problem takes long).
std::vector<int64_t> kv_heads_to_check(const Problem& problem, int64_t limit, uint64_t seed);

// Query rows to check: all when `limit` covers them, else the first and last row of the first and
// last head plus seeded random rows, `limit` in all.
std::vector<int64_t> rows_to_check(const Problem& problem, int64_t limit, uint64_t seed);

}  // namespace fa
