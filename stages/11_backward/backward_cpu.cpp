// Stage 11: the backward pass by recomputation (FlashAttention-2's algorithm), in plain C++.
//
// The forward pass kept no N × N matrix, so the backward pass has none to read: it rebuilds each
// tile of P = softmax(S) from Q, K and the one number per row the forward saved, the log-sum-exp
// LSE_i = m_i + log(l_i): P_ij = exp(s_ij − LSE_i), exact, with no max or sum to redo. With P in
// hand, the chain rule through O = P V and P = softmax(S) gives, for the loss gradient dO:
//   dV = Pᵀ dO                       (O is linear in V)
//   dP = dO Vᵀ                       (and in P)
//   dS_ij = P_ij (dP_ij − D_i)       (softmax's Jacobian), where D_i = Σ_j P_ij dP_ij = dO_i · O_i
//   dQ = dS K · scale,  dK = dSᵀ Q · scale   (S = Q Kᵀ · scale)
// D_i = rowsum(dO ∘ O) needs only O, which the forward wrote: one pass over the rows first.
//
// The work split is the forward's turned around. dK_j and dV_j sum over query rows, so the
// parallel unit owns a tile of keys and keeps their dK and dV while it walks every query tile
// that sees them; each pair of tiles adds its share to dQ, which several key tiles write, so those
// additions are atomic. The GPU kernel in backward_mma.cu is this loop nest, block for key tile.
#include "backward_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "fa/causal.hpp"
#include "fa_source_hash.h"
#include "flash_attention_cpu.hpp"

namespace fa::cpu {
namespace {

// One key tile (rows [j0, j0 + keys) of one K/V head) against every query row that reads it:
// the `group` query heads of its group, each Nq rows. Writes the tile's dK and dV, adds to dQ.
void key_tile_backward(const Problem& problem, const float* q, const float* k, const float* v, const float* grad_o,
                       const float* lse, const float* row_delta, float* grad_q, float* grad_k, float* grad_v,
                       int64_t j0, int64_t keys, int64_t query_tile) {
  const int64_t dim = problem.dim;
  const int64_t q_seq = problem.q_seq;
  const float scale = softmax_scale(problem);
  std::vector<float> key_grad(static_cast<std::size_t>(keys * dim), 0.0f);
  std::vector<float> value_grad(static_cast<std::size_t>(keys * dim), 0.0f);
  std::vector<float> query_grad(static_cast<std::size_t>(dim));  // one row's dQ share from this tile

  // Under the causal mask query i sees keys below i + 1 + Nk − Nq, so the first row that sees key
  // j0 is j0 + Nq − Nk: the query tiles above it are skipped outright, as in the forward.
  const int64_t first_row = problem.causal ? std::max<int64_t>(0, j0 + q_seq - problem.kv_seq) : 0;
  for (int64_t head = 0; head < problem.group_size(); ++head) {
    const int64_t head_offset = head * q_seq;
    for (int64_t i0 = first_row / query_tile * query_tile; i0 < q_seq; i0 += query_tile) {
      for (int64_t i = i0; i < std::min(q_seq, i0 + query_tile); ++i) {
        // The keys of this tile row i sees: none for a row the mask leaves blind (LSE = -inf).
        const int64_t visible = std::min(keys, visible_key_end(i, q_seq, problem.kv_seq, problem.causal) - j0);
        if (visible <= 0) continue;
        const float* query = q + (head_offset + i) * dim;
        const float* out_grad = grad_o + (head_offset + i) * dim;
        const float row_lse = lse[head_offset + i];
        const float delta = row_delta[head_offset + i];
        std::fill(query_grad.begin(), query_grad.end(), 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          // EXERCISE BEGIN: p from the LSE; dV += p·dO; dp = dO·v; ds = p·(dp − D_i)·scale; dK += ds·q; dQ += ds·k
          const float* key = k + (j0 + j) * dim;
          const float* value = v + (j0 + j) * dim;
          float score = 0.0f;
          for (int64_t d = 0; d < dim; ++d) score += query[d] * key[d];
          const float p = std::exp(score * scale - row_lse);  // P_ij, exact: no max, no sum
          float grad_p = 0.0f;
          for (int64_t d = 0; d < dim; ++d) {
            value_grad[static_cast<std::size_t>(j * dim + d)] += p * out_grad[d];
            grad_p += out_grad[d] * value[d];
          }
          const float grad_score = p * (grad_p - delta) * scale;  // dS_ij, with S's scale folded in
          for (int64_t d = 0; d < dim; ++d) {
            key_grad[static_cast<std::size_t>(j * dim + d)] += grad_score * query[d];
            query_grad[static_cast<std::size_t>(d)] += grad_score * key[d];
          }
          // EXERCISE END
        }
        // This key tile's share of dQ_i. Other key tiles add theirs to the same row at the same time:
        // atomically, once per row and tile (the GPU kernel does the same with its FP32 atomics).
        float* row_grad = grad_q + (head_offset + i) * dim;
        for (int64_t d = 0; d < dim; ++d) {
#pragma omp atomic
          row_grad[d] += query_grad[static_cast<std::size_t>(d)];
        }
      }
    }
  }
  std::copy(key_grad.begin(), key_grad.end(), grad_k + j0 * dim);
  std::copy(value_grad.begin(), value_grad.end(), grad_v + j0 * dim);
}

}  // namespace

void attention_backward(const Problem& problem, const float* q, const float* k, const float* v, const float* o,
                        const float* grad_o, const float* lse, float* grad_q, float* grad_k, float* grad_v,
                        float* row_delta, int64_t query_tile, int64_t key_tile) {
  const int64_t dim = problem.dim;
  // Preprocessing: D_i = rowsum(dO ∘ O) for every query row, and dQ cleared for the atomics.
  const int64_t rows = problem.q_rows();
#pragma omp parallel for
  for (int64_t row = 0; row < rows; ++row) {
    float delta = 0.0f;
    for (int64_t d = 0; d < dim; ++d) delta += grad_o[row * dim + d] * o[row * dim + d];
    row_delta[row] = delta;
  }
  std::fill(grad_q, grad_q + problem.q_elements(), 0.0f);

  // Every (K/V head, key tile) pair owns its rows of dK and dV: the parallel loop, as it will be
  // the thread blocks of the GPU kernel. The query heads of a K/V head's group are consecutive.
  const int64_t key_tiles = (problem.kv_seq + key_tile - 1) / key_tile;
  const int64_t work = problem.kv_heads_total() * key_tiles;
#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < work; ++item) {
    const int64_t kv_head = item / key_tiles;
    const int64_t j0 = (item % key_tiles) * key_tile;
    const int64_t first_query_head =
        kv_head / problem.kv_heads * problem.q_heads + kv_head % problem.kv_heads * problem.group_size();
    const int64_t q_offset = first_query_head * problem.q_seq;  // in rows
    const int64_t kv_offset = kv_head * problem.kv_seq * dim;
    key_tile_backward(problem, q + q_offset * dim, k + kv_offset, v + kv_offset, grad_o + q_offset * dim,
                      lse + q_offset, row_delta + q_offset, grad_q + q_offset * dim, grad_k + kv_offset,
                      grad_v + kv_offset, j0, std::min(key_tile, problem.kv_seq - j0), query_tile);
  }
}

}  // namespace fa::cpu

namespace fa::stages {
namespace {

constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 64;
constexpr int64_t kMaxDim = 256;

// The forward is stage 01's, which writes the LSE this pass rebuilds P from.
Status forward(const ForwardArgs& args) {
  cpu::flash_attention(args.problem, static_cast<const float*>(args.q), static_cast<const float*>(args.k),
                       static_cast<const float*>(args.v), static_cast<float*>(args.o), args.lse, kQueryTile, kKeyTile);
  return Status();
}

Status backward(const BackwardArgs& args) {
  cpu::attention_backward(args.problem, static_cast<const float*>(args.q), static_cast<const float*>(args.k),
                          static_cast<const float*>(args.v), static_cast<const float*>(args.o),
                          static_cast<const float*>(args.grad_o), args.lse, static_cast<float*>(args.grad_q),
                          static_cast<float*>(args.grad_k), static_cast<float*>(args.grad_v),
                          static_cast<float*>(args.workspace), kQueryTile, kKeyTile);
  return Status();
}

// The backward pass keeps D_i, one float per query row.
int64_t workspace_bytes(const Problem& problem, Pass pass) {
  return pass == Pass::backward ? problem.q_rows() * static_cast<int64_t>(sizeof(float)) : 0;
}

}  // namespace

StageDescriptor backward_cpu() {
  StageDescriptor stage;
  stage.id = "11_backward";
  stage.title = "The backward pass in plain C++: P rebuilt from the LSE, dK and dV per key tile (OpenMP)";
  stage.backend = Backend::cpu;
  stage.precision = Precision::fp32;
  stage.forward = &forward;
  stage.backward = &backward;
  stage.workspace_bytes = &workspace_bytes;
  stage.max_dim = kMaxDim;
  stage.features = {/*causal=*/true, /*grouped=*/true, /*rectangular=*/true, /*lse=*/true, /*backward=*/true};
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace fa::stages
