#include "fa/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

namespace fa {
namespace {

struct HeadView {
  const float* q;  // the query head's Nq rows
  const float* k;  // the Nk rows of the key/value head it reads
  const float* v;
};

HeadView head_of(const Inputs& inputs, int64_t query_head) {
  const Problem& problem = inputs.problem;
  const int64_t q_offset = query_head * problem.q_seq * problem.dim;
  const int64_t kv_offset = problem.kv_head_of(query_head) * problem.kv_seq * problem.dim;
  return {inputs.q.data() + q_offset, inputs.k.data() + kv_offset, inputs.v.data() + kv_offset};
}

// Of the first `keys` keys, how many query row i sees (causal.hpp's rule when masked).
int64_t visible_keys(const Problem& problem, int64_t i, int64_t keys) {
  return std::min(keys, visible_key_end(i, problem.q_seq, problem.kv_seq, problem.causal));
}

// Scores of query `i` against keys [0, keys), written to `scores`.
void row_scores(const Problem& problem, const HeadView& head, int64_t i, int64_t keys, std::vector<double>& scores) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(problem.dim));
  scores.assign(static_cast<std::size_t>(keys), 0.0);
  for (int64_t j = 0; j < keys; ++j) {
    double dot = 0.0;
    for (int64_t d = 0; d < problem.dim; ++d) {
      dot += static_cast<double>(head.q[i * problem.dim + d]) * static_cast<double>(head.k[j * problem.dim + d]);
    }
    scores[static_cast<std::size_t>(j)] = dot * scale;
  }
}

// Softmax over the first `keys` keys of row i: max m, sum l, and O = Σ p_j v_j / l. A row that
// sees no key has m = -inf, l = 0 and O = 0.
void softmax_row(const Problem& problem, const HeadView& head, int64_t i, int64_t keys, double& m, double& l,
                 double* out) {
  std::fill(out, out + problem.dim, 0.0);
  l = 0.0;
  m = -std::numeric_limits<double>::infinity();
  if (keys == 0) return;
  std::vector<double> scores;
  row_scores(problem, head, i, keys, scores);
  m = *std::max_element(scores.begin(), scores.end());
  for (int64_t j = 0; j < keys; ++j) {
    const double p = std::exp(scores[static_cast<std::size_t>(j)] - m);
    l += p;
    for (int64_t d = 0; d < problem.dim; ++d) out[d] += p * static_cast<double>(head.v[j * problem.dim + d]);
  }
  for (int64_t d = 0; d < problem.dim; ++d) out[d] /= l;
}

}  // namespace

std::vector<double> reference_rows(const Inputs& inputs, const std::vector<int64_t>& rows, std::vector<double>* lse) {
  const Problem& problem = inputs.problem;
  std::vector<double> out(rows.size() * static_cast<std::size_t>(problem.dim));
  if (lse != nullptr) lse->assign(rows.size(), 0.0);
  const int64_t count = static_cast<int64_t>(rows.size());
#pragma omp parallel for schedule(dynamic)
  for (int64_t r = 0; r < count; ++r) {
    const int64_t row = rows[static_cast<std::size_t>(r)];
    double m = 0.0;
    double l = 0.0;
    const int64_t i = row % problem.q_seq;
    softmax_row(problem, head_of(inputs, row / problem.q_seq), i, visible_keys(problem, i, problem.kv_seq), m, l,
                out.data() + r * problem.dim);
    if (lse != nullptr) (*lse)[static_cast<std::size_t>(r)] = m + std::log(l);  // -inf + log 0 = -inf
  }
  return out;
}

std::vector<double> reference_attention(const Inputs& inputs, std::vector<double>* lse) {
  std::vector<int64_t> rows(static_cast<std::size_t>(inputs.problem.q_rows()));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  return reference_rows(inputs, rows, lse);
}

std::vector<double> reference_scores(const Inputs& inputs, int64_t query_head) {
  const Problem& problem = inputs.problem;
  std::vector<double> scores;
  std::vector<double> all;
  for (int64_t i = 0; i < problem.q_seq; ++i) {
    row_scores(problem, head_of(inputs, query_head), i, problem.kv_seq, scores);
    all.insert(all.end(), scores.begin(), scores.end());
  }
  return all;
}

TileTrace reference_trace(const Inputs& inputs, int64_t tile) {
  const Problem& problem = inputs.problem;
  TileTrace trace;
  trace.tile = tile;
  trace.tiles = (problem.kv_seq + tile - 1) / tile;
  trace.rows = problem.q_rows();
  trace.dim = problem.dim;
  trace.m.resize(static_cast<std::size_t>(trace.tiles * trace.rows));
  trace.l.resize(trace.m.size());
  trace.o.resize(trace.m.size() * static_cast<std::size_t>(problem.dim));
  for (int64_t t = 0; t < trace.tiles; ++t) {
    const int64_t keys = std::min(problem.kv_seq, (t + 1) * tile);
    for (int64_t row = 0; row < trace.rows; ++row) {
      const int64_t i = row % problem.q_seq;
      softmax_row(problem, head_of(inputs, row / problem.q_seq), i, visible_keys(problem, i, keys), trace.m_at(t, row),
                  trace.l_at(t, row), &trace.o_at(t, row, 0));
    }
  }
  return trace;
}

std::vector<int64_t> rows_to_check(const Problem& problem, int64_t limit, uint64_t seed) {
  const int64_t total = problem.q_rows();
  std::vector<int64_t> rows;
  if (total <= limit) {
    rows.resize(static_cast<std::size_t>(total));
    std::iota(rows.begin(), rows.end(), int64_t{0});
    return rows;
  }
  std::set<int64_t> chosen = {0, problem.q_seq - 1, total - problem.q_seq, total - 1};
  uint64_t state = seed ^ 0xA0761D6478BD642Full;
  while (static_cast<int64_t>(chosen.size()) < limit) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;  // an LCG is plenty for sampling
    chosen.insert(static_cast<int64_t>((state >> 17) % static_cast<uint64_t>(total)));
  }
  return {chosen.begin(), chosen.end()};
}

}  // namespace fa
