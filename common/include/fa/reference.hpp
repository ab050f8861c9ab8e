// The reference: attention computed in double, straight from the definition.
#pragma once

#include <cstdint>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/stage.hpp"

namespace fa {

// O for the chosen rows (indices (b·H + h)·N + i), as rows.size() × D doubles. With
// shape.causal, query i attends to keys 0..i only.
std::vector<double> reference_rows(const Inputs& inputs, const std::vector<int64_t>& rows);

// Every row.
std::vector<double> reference_attention(const Inputs& inputs);

// The scores S = Q K^T / sqrt(D) of one head, N × N (for the walkthrough and the tests).
std::vector<double> reference_scores(const Inputs& inputs, int64_t head);

// The exact online-softmax state after each K/V tile: after tiles 0..t, m and l are the max
// and the sum of exp(s - m) over the keys seen so far, and o is their softmax-weighted average
// of V. That is attention restricted to the first (t + 1)·tile keys, whatever the algorithm.
TileTrace reference_trace(const Inputs& inputs, int64_t tile);

// Rows to check: all when `limit` covers them, else the first and last row of every head
// plus seeded random rows, `limit` in all.
std::vector<int64_t> rows_to_check(const Shape& shape, int64_t limit, uint64_t seed);

}  // namespace fa
