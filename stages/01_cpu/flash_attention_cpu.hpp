// Stage 01: the FlashAttention algorithm in plain C++, before any CUDA.
#pragma once

#include "fa/stage.hpp"

namespace fa::cpu {

// O = softmax(Q K^T / sqrt(D)) V, computed tile by tile: query tiles of `query_tile` rows (Br)
// meet key/value tiles of `key_tile` rows (Bc) and never more; the softmax is made exact by a
// running max m and running sum l per row. With `trace`, records m, l and O / l after every
// K/V tile (the walkthrough fixture). Takes the general problem (grouped-query heads, Nq != Nk,
// the bottom-right causal mask) and, when `lse` is not null, writes each row's log-sum-exp.
void flash_attention(const Problem& problem, const float* q, const float* k, const float* v, float* o, float* lse,
                     int64_t query_tile, int64_t key_tile, TileTrace* trace = nullptr);

}  // namespace fa::cpu
