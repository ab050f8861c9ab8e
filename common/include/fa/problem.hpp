// The attention problem: shapes, FLOP and byte counts, and the limits every stage shares.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "fa/causal.hpp"

namespace fa {

// Q and O have shape (batch, q_heads, q_seq, dim); K and V (batch, kv_heads, kv_seq, dim); all
// row-major with dim fastest. Query head h reads key/value head h / (q_heads / kv_heads):
// kv_heads = q_heads is ordinary multi-head attention, a divisor of it grouped-query attention,
// 1 multi-query attention. With `causal`, row i sees keys 0 .. i + kv_seq - q_seq (causal.hpp).
struct Problem {
  int64_t batch = 1;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;
  int64_t q_seq = 1;
  int64_t kv_seq = 1;
  int64_t dim = 1;
  bool causal = false;

  // The (B, H, N, D) problem of the first part of the course: every head its own K and V, N = N.
  static Problem square(int64_t batch, int64_t heads, int64_t seq, int64_t dim, bool causal = false) {
    return {batch, heads, heads, seq, seq, dim, causal};
  }

  int64_t group_size() const { return q_heads / kv_heads; }  // query heads per key/value head
  int64_t q_heads_total() const { return batch * q_heads; }
  int64_t kv_heads_total() const { return batch * kv_heads; }
  int64_t q_rows() const { return batch * q_heads * q_seq; }  // also the rows of O and LSE
  int64_t kv_rows() const { return batch * kv_heads * kv_seq; }
  int64_t q_elements() const { return q_rows() * dim; }    // of Q (and of O)
  int64_t kv_elements() const { return kv_rows() * dim; }  // of K (and of V)
  bool grouped() const { return q_heads != kv_heads; }
  bool rectangular() const { return q_seq != kv_seq; }
  bool is_square() const { return !grouped() && !rectangular(); }
  // The key/value head that (flattened) query head `query_head` = b·Hq + h reads.
  int64_t kv_head_of(int64_t query_head) const {
    return query_head / q_heads * kv_heads + query_head % q_heads / group_size();
  }
};

enum class Pass { forward, backward };
const char* pass_name(Pass pass);  // "fwd", "bwd"

// (query, key) pairs that count: Nq·Nk, or under the causal mask Nq·Nk/2 for a square problem
// (the convention every published TFLOP/s uses) and the exact number of unmasked pairs otherwise.
double attention_pairs(const Problem& problem);

// Forward: 4·B·Hq·pairs·D (two matrix products of 2·pairs·D each). Backward: 2.5 times that
// (five matrix products).
double attention_flops(const Problem& problem, Pass pass = Pass::forward);

// The fewest bytes any implementation must move. Forward: read Q, K, V once, write O once (and
// the FP32 LSE when asked). Backward: read Q, K, V, O, dO and LSE, write dQ, dK and dV.
int64_t minimum_bytes(const Problem& problem, int element_bytes, Pass pass = Pass::forward, bool with_lse = false);

inline float softmax_scale(const Problem& problem) { return 1.0f / std::sqrt(static_cast<float>(problem.dim)); }

// Limits beyond which a size is rejected as absurd rather than attempted.
constexpr int64_t kMaxBatchHeads = int64_t{1} << 20;
constexpr int64_t kMaxSeq = int64_t{1} << 24;
constexpr int64_t kMaxElements = int64_t{1} << 36;

// Empty when the problem is well formed and within the limits for a stage whose largest head dim
// is max_dim, else one line that says what is wrong.
std::string validate_problem(const Problem& problem, int64_t max_dim);

// "B=4 H=16 N=4096 D=128" for a square problem; "B=1 Hq=32 Hkv=8 Nq=4 Nk=65536 D=128" otherwise.
std::string describe(const Problem& problem);

}  // namespace fa
