#include "fa/problem.hpp"

#include <algorithm>
#include <sstream>

namespace fa {

const char* pass_name(Pass pass) { return pass == Pass::forward ? "fwd" : "bwd"; }

double attention_pairs(const Problem& problem) {
  const double q_seq = static_cast<double>(problem.q_seq);
  const double kv_seq = static_cast<double>(problem.kv_seq);
  if (!problem.causal) return q_seq * kv_seq;
  if (!problem.rectangular()) return q_seq * kv_seq / 2.0;
  // Rows i < Nq - Nk see nothing; from there row i sees i + 1 + Nk - Nq keys, up to Nk.
  double pairs = 0.0;
  for (int64_t row = 0; row < problem.q_seq; ++row) {
    pairs += static_cast<double>(causal_key_end(row, problem.q_seq, problem.kv_seq));
  }
  return pairs;
}

double attention_flops(const Problem& problem, Pass pass) {
  const double forward =
      4.0 * static_cast<double>(problem.q_heads_total()) * attention_pairs(problem) * static_cast<double>(problem.dim);
  return pass == Pass::forward ? forward : 2.5 * forward;
}

int64_t minimum_bytes(const Problem& problem, int element_bytes, Pass pass, bool with_lse) {
  const int64_t q_bytes = problem.q_elements() * element_bytes;    // Q, O, dO, dQ each
  const int64_t kv_bytes = problem.kv_elements() * element_bytes;  // K, V, dK, dV each
  const int64_t lse_bytes = problem.q_rows() * static_cast<int64_t>(sizeof(float));
  if (pass == Pass::forward) return 2 * q_bytes + 2 * kv_bytes + (with_lse ? lse_bytes : 0);
  return 3 * q_bytes + 2 * kv_bytes + lse_bytes + q_bytes + 2 * kv_bytes;  // reads, then writes
}

std::string validate_problem(const Problem& problem, int64_t max_dim) {
  std::ostringstream why;
  if (problem.batch < 1 || problem.q_heads < 1 || problem.kv_heads < 1) {
    why << "batch and heads must be at least 1 (got batch " << problem.batch << ", query heads " << problem.q_heads
        << ", key/value heads " << problem.kv_heads << ")";
  } else if (problem.q_heads % problem.kv_heads != 0) {
    why << "query heads " << problem.q_heads << " are not a multiple of key/value heads " << problem.kv_heads;
  } else if (problem.q_seq < 1 || problem.kv_seq < 1) {
    why << "sequence lengths must be at least 1 (got " << problem.q_seq << " queries, " << problem.kv_seq << " keys)";
  } else if (problem.dim < 1) {
    why << "head dim must be at least 1 (got " << problem.dim << ")";
  } else if (problem.dim > max_dim) {
    why << "head dim " << problem.dim << " is beyond this stage's largest, " << max_dim;
  } else if (problem.batch > kMaxBatchHeads || problem.q_heads > kMaxBatchHeads ||
             problem.q_heads_total() > kMaxBatchHeads) {
    why << "batch·heads " << problem.batch << "·" << problem.q_heads << " is beyond the limit " << kMaxBatchHeads;
  } else if (problem.q_seq > kMaxSeq || problem.kv_seq > kMaxSeq) {
    why << "sequence length " << std::max(problem.q_seq, problem.kv_seq) << " is beyond the limit " << kMaxSeq;
  } else if (problem.q_elements() > kMaxElements || problem.kv_elements() > kMaxElements) {
    why << "B·H·N·D = " << std::max(problem.q_elements(), problem.kv_elements()) << " elements is beyond the limit "
        << kMaxElements;
  }
  return why.str();
}

std::string describe(const Problem& problem) {
  std::ostringstream text;
  text << "B=" << problem.batch;
  if (problem.grouped()) {
    text << " Hq=" << problem.q_heads << " Hkv=" << problem.kv_heads;
  } else {
    text << " H=" << problem.q_heads;
  }
  if (problem.rectangular()) {
    text << " Nq=" << problem.q_seq << " Nk=" << problem.kv_seq;
  } else {
    text << " N=" << problem.q_seq;
  }
  text << " D=" << problem.dim << (problem.causal ? " causal" : "");
  return text.str();
}

}  // namespace fa
