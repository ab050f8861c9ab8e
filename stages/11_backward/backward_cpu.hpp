// Stage 11, first half: the FlashAttention-2 backward pass in plain C++, before any CUDA.
#pragma once

#include <cstdint>

#include "fa/stage.hpp"

namespace fa::cpu {

// dQ, dK, dV of O = softmax(Q Kᵀ / sqrt(D)) V for the output gradient dO, from the forward's O and
// log-sum-exp, tile by tile: each (K/V head, key tile of `key_tile` rows) owns its dK and dV and
// walks the query tiles (`query_tile` rows) of every query head that reads it, rebuilding P from
// Q, K and the LSE; dQ is shared by every key tile and accumulated atomically. No N × N matrix
// exists anywhere. Takes the general problem (grouped-query heads, Nq != Nk, the bottom-right
// causal mask). `row_delta` is scratch of B·Hq·Nq floats for D_i = rowsum(dO ∘ O).
void attention_backward(const Problem& problem, const float* q, const float* k, const float* v, const float* o,
                        const float* grad_o, const float* lse, float* grad_q, float* grad_k, float* grad_v,
                        float* row_delta, int64_t query_tile, int64_t key_tile);

}  // namespace fa::cpu
