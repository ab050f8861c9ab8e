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

namespace {

// One query row's view of the backward pass: its log-sum-exp, D_i = rowsum(dO ∘ O), and E_i, the
// largest D_i moves when O carries one rounding of each of its terms (see gradient bounds below).
struct RowStatistics {
  double lse = 0.0;
  double delta = 0.0;
  double delta_sensitivity = 0.0;
};

double dot(const float* a, const float* b, int64_t dim) {
  double sum = 0.0;
  for (int64_t d = 0; d < dim; ++d) sum += static_cast<double>(a[d]) * static_cast<double>(b[d]);
  return sum;
}

double abs_dot(const float* a, const float* b, int64_t dim) {
  double sum = 0.0;
  for (int64_t d = 0; d < dim; ++d) sum += std::fabs(static_cast<double>(a[d]) * static_cast<double>(b[d]));
  return sum;
}

// The gradient bounds are first-order error bounds of a kernel that rounds P and dS to its 16-bit
// type before they enter a matrix product, rounds each gradient once on the way out, and takes D_i
// from its own 16-bit O. Per (row i, key j), with W_ij = Σ_d |dO_id|·|v_jd| (>= |dP_ij|):
//   dS_ij moves by at most u·P_ij·(W_ij + |D_i|) (its own rounding) plus P_ij·|δD_i|, and
//   |δD_i| <= Σ_d |dO_id|·|δO_id| <= 2u·Σ_j P_ij·W_ij = 2u·E_i (O's two roundings, stage 08).
// So dS_err_ij = P_ij·(W_ij + |D_i| + 2·E_i), and in units of u:
//   dQ_id: scale·Σ_j dS_err_ij·|k_jd| + |dQ_id|,  dK_jd: scale·Σ_i dS_err_ij·|q_id| + |dK_jd|,
//   dV_jd: Σ_i P_ij·|dO_id| + |dV_jd|.
double score_error_weight(double p, double w, const RowStatistics& row) {
  return p * (w + std::fabs(row.delta) + 2.0 * row.delta_sensitivity);
}

}  // namespace

GradientReference reference_backward(const Inputs& inputs, const std::vector<float>& grad_o,
                                     const std::vector<int64_t>& kv_heads) {
  const Problem& problem = inputs.problem;
  const int64_t dim = problem.dim;
  const int64_t group = problem.group_size();
  const int64_t q_seq = problem.q_seq;
  const int64_t kv_seq = problem.kv_seq;
  const int64_t group_rows = group * q_seq;  // query rows that read one K/V head
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const std::size_t heads = kv_heads.size();
  GradientReference result;
  result.dq.assign(heads * static_cast<std::size_t>(group_rows * dim), 0.0);
  result.dq_bound.assign(result.dq.size(), 0.0);
  result.dk.assign(heads * static_cast<std::size_t>(kv_seq * dim), 0.0);
  result.dk_bound.assign(result.dk.size(), 0.0);
  result.dv.assign(result.dk.size(), 0.0);
  result.dv_bound.assign(result.dk.size(), 0.0);
  std::vector<RowStatistics> rows(static_cast<std::size_t>(group_rows));

  for (std::size_t h = 0; h < heads; ++h) {
    const int64_t kv_head = kv_heads[h];
    const int64_t first_query_head = kv_head / problem.kv_heads * problem.q_heads + kv_head % problem.kv_heads * group;
    const float* k = inputs.k.data() + kv_head * kv_seq * dim;
    const float* v = inputs.v.data() + kv_head * kv_seq * dim;
    // Query row r of the group: head first_query_head + r / Nq, row r % Nq.
    const auto query_of = [&](int64_t r) { return inputs.q.data() + (first_query_head * q_seq + r) * dim; };
    const auto grad_out_of = [&](int64_t r) { return grad_o.data() + (first_query_head * q_seq + r) * dim; };

    // Pass 1, row by row: LSE, O, D_i, E_i, then dQ.
#pragma omp parallel for schedule(dynamic)
    for (int64_t r = 0; r < group_rows; ++r) {
      const int64_t keys = visible_keys(problem, r % q_seq, kv_seq);
      RowStatistics& row = rows[static_cast<std::size_t>(r)];
      row = RowStatistics{};
      if (keys == 0) continue;  // sees no key: no gradient flows through it
      const float* q = query_of(r);
      const float* grad_out = grad_out_of(r);
      std::vector<double> p(static_cast<std::size_t>(keys));
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < keys; ++j) {
        p[static_cast<std::size_t>(j)] = dot(q, k + j * dim, dim) * scale;
        max_score = std::max(max_score, p[static_cast<std::size_t>(j)]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < keys; ++j) sum += std::exp(p[static_cast<std::size_t>(j)] - max_score);
      row.lse = max_score + std::log(sum);
      std::vector<double> out(static_cast<std::size_t>(dim), 0.0);
      for (int64_t j = 0; j < keys; ++j) {
        double& pj = p[static_cast<std::size_t>(j)];
        pj = std::exp(pj - row.lse);
        for (int64_t d = 0; d < dim; ++d) out[static_cast<std::size_t>(d)] += pj * static_cast<double>(v[j * dim + d]);
        row.delta_sensitivity += pj * abs_dot(grad_out, v + j * dim, dim);
      }
      for (int64_t d = 0; d < dim; ++d)
        row.delta += static_cast<double>(grad_out[d]) * out[static_cast<std::size_t>(d)];
      double* dq = result.dq.data() + (static_cast<int64_t>(h) * group_rows + r) * dim;
      double* dq_bound = result.dq_bound.data() + (static_cast<int64_t>(h) * group_rows + r) * dim;
      for (int64_t j = 0; j < keys; ++j) {
        const double pj = p[static_cast<std::size_t>(j)];
        const double grad_score = pj * (dot(grad_out, v + j * dim, dim) - row.delta);
        const double error_weight = score_error_weight(pj, abs_dot(grad_out, v + j * dim, dim), row);
        for (int64_t d = 0; d < dim; ++d) {
          dq[d] += scale * grad_score * static_cast<double>(k[j * dim + d]);
          dq_bound[d] += scale * error_weight * std::fabs(static_cast<double>(k[j * dim + d]));
        }
      }
      for (int64_t d = 0; d < dim; ++d) dq_bound[d] += std::fabs(dq[d]);
    }

    // Pass 2, key by key (no two threads add to one key): dK and dV over every row that sees it.
#pragma omp parallel for schedule(dynamic)
    for (int64_t j = 0; j < kv_seq; ++j) {
      double* dk = result.dk.data() + (static_cast<int64_t>(h) * kv_seq + j) * dim;
      double* dk_bound = result.dk_bound.data() + (static_cast<int64_t>(h) * kv_seq + j) * dim;
      double* dv = result.dv.data() + (static_cast<int64_t>(h) * kv_seq + j) * dim;
      double* dv_bound = result.dv_bound.data() + (static_cast<int64_t>(h) * kv_seq + j) * dim;
      for (int64_t r = 0; r < group_rows; ++r) {
        if (j >= visible_keys(problem, r % q_seq, kv_seq)) continue;
        const RowStatistics& row = rows[static_cast<std::size_t>(r)];
        const float* q = query_of(r);
        const float* grad_out = grad_out_of(r);
        const double p = std::exp(dot(q, k + j * dim, dim) * scale - row.lse);
        const double grad_score = p * (dot(grad_out, v + j * dim, dim) - row.delta);
        const double error_weight = score_error_weight(p, abs_dot(grad_out, v + j * dim, dim), row);
        for (int64_t d = 0; d < dim; ++d) {
          const double query = static_cast<double>(q[d]);
          const double grad = static_cast<double>(grad_out[d]);
          dk[d] += scale * grad_score * query;
          dk_bound[d] += scale * error_weight * std::fabs(query);
          dv[d] += p * grad;
          dv_bound[d] += p * std::fabs(grad);
        }
      }
      for (int64_t d = 0; d < dim; ++d) {
        dk_bound[d] += std::fabs(dk[d]);
        dv_bound[d] += std::fabs(dv[d]);
      }
    }
  }
  return result;
}

std::vector<int64_t> kv_heads_to_check(const Problem& problem, int64_t limit, uint64_t seed) {
  const int64_t total = problem.kv_heads_total();
  std::vector<int64_t> heads;
  if (total <= std::max<int64_t>(limit, 2)) {
    heads.resize(static_cast<std::size_t>(total));
    std::iota(heads.begin(), heads.end(), int64_t{0});
    return heads;
  }
  std::set<int64_t> chosen = {0, total - 1};
  uint64_t state = seed ^ 0x9E3779B97F4A7C15ull;
  while (static_cast<int64_t>(chosen.size()) < limit) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    chosen.insert(static_cast<int64_t>((state >> 17) % static_cast<uint64_t>(total)));
  }
  return {chosen.begin(), chosen.end()};
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
