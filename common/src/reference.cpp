#include "fa/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

namespace fa {
namespace {

struct HeadView {
  const float* q;
  const float* k;
  const float* v;
};

HeadView head_of(const Inputs& inputs, int64_t head) {
  const int64_t offset = head * inputs.shape.seq * inputs.shape.dim;
  return {inputs.q.data() + offset, inputs.k.data() + offset, inputs.v.data() + offset};
}

// Of the first `keys` keys, how many query i sees: all of them, or with causal masking only
// keys 0..i (query i sees itself and the past).
int64_t visible_keys(const Shape& shape, int64_t i, int64_t keys) {
  return shape.causal ? std::min(keys, i + 1) : keys;
}

// Scores of query `i` against keys [0, keys), written to `scores`.
void row_scores(const Shape& shape, const HeadView& head, int64_t i, int64_t keys, std::vector<double>& scores) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(shape.dim));
  scores.assign(static_cast<std::size_t>(keys), 0.0);
  for (int64_t j = 0; j < keys; ++j) {
    double dot = 0.0;
    for (int64_t d = 0; d < shape.dim; ++d) {
      dot += static_cast<double>(head.q[i * shape.dim + d]) * static_cast<double>(head.k[j * shape.dim + d]);
    }
    scores[static_cast<std::size_t>(j)] = dot * scale;
  }
}

// Softmax over the first `keys` keys of row i: max m, sum l, and O = Σ p_j v_j / l.
void softmax_row(const Shape& shape, const HeadView& head, int64_t i, int64_t keys, double& m, double& l, double* out) {
  std::vector<double> scores;
  row_scores(shape, head, i, keys, scores);
  m = *std::max_element(scores.begin(), scores.end());
  l = 0.0;
  std::fill(out, out + shape.dim, 0.0);
  for (int64_t j = 0; j < keys; ++j) {
    const double p = std::exp(scores[static_cast<std::size_t>(j)] - m);
    l += p;
    for (int64_t d = 0; d < shape.dim; ++d) out[d] += p * static_cast<double>(head.v[j * shape.dim + d]);
  }
  for (int64_t d = 0; d < shape.dim; ++d) out[d] /= l;
}

}  // namespace

std::vector<double> reference_rows(const Inputs& inputs, const std::vector<int64_t>& rows) {
  const Shape& shape = inputs.shape;
  std::vector<double> out(rows.size() * static_cast<std::size_t>(shape.dim));
  const int64_t count = static_cast<int64_t>(rows.size());
#pragma omp parallel for schedule(dynamic)
  for (int64_t r = 0; r < count; ++r) {
    const int64_t row = rows[static_cast<std::size_t>(r)];
    double m = 0.0;
    double l = 0.0;
    const int64_t i = row % shape.seq;
    softmax_row(shape, head_of(inputs, row / shape.seq), i, visible_keys(shape, i, shape.seq), m, l,
                out.data() + r * shape.dim);
  }
  return out;
}

std::vector<double> reference_attention(const Inputs& inputs) {
  std::vector<int64_t> rows(static_cast<std::size_t>(inputs.shape.rows()));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  return reference_rows(inputs, rows);
}

std::vector<double> reference_scores(const Inputs& inputs, int64_t head) {
  const Shape& shape = inputs.shape;
  std::vector<double> scores;
  std::vector<double> all;
  for (int64_t i = 0; i < shape.seq; ++i) {
    row_scores(shape, head_of(inputs, head), i, shape.seq, scores);
    all.insert(all.end(), scores.begin(), scores.end());
  }
  return all;
}

TileTrace reference_trace(const Inputs& inputs, int64_t tile) {
  const Shape& shape = inputs.shape;
  TileTrace trace;
  trace.tile = tile;
  trace.tiles = (shape.seq + tile - 1) / tile;
  trace.rows = shape.rows();
  trace.dim = shape.dim;
  trace.m.resize(static_cast<std::size_t>(trace.tiles * trace.rows));
  trace.l.resize(trace.m.size());
  trace.o.resize(trace.m.size() * static_cast<std::size_t>(shape.dim));
  for (int64_t t = 0; t < trace.tiles; ++t) {
    const int64_t keys = std::min(shape.seq, (t + 1) * tile);
    for (int64_t row = 0; row < trace.rows; ++row) {
      const int64_t i = row % shape.seq;
      softmax_row(shape, head_of(inputs, row / shape.seq), i, visible_keys(shape, i, keys), trace.m_at(t, row),
                  trace.l_at(t, row), &trace.o_at(t, row, 0));
    }
  }
  return trace;
}

std::vector<int64_t> rows_to_check(const Shape& shape, int64_t limit, uint64_t seed) {
  const int64_t total = shape.rows();
  std::vector<int64_t> rows;
  if (total <= limit) {
    rows.resize(static_cast<std::size_t>(total));
    std::iota(rows.begin(), rows.end(), int64_t{0});
    return rows;
  }
  std::set<int64_t> chosen = {0, shape.seq - 1, total - shape.seq, total - 1};
  uint64_t state = seed ^ 0xA0761D6478BD642Full;
  while (static_cast<int64_t>(chosen.size()) < limit) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;  // an LCG is plenty for sampling
    chosen.insert(static_cast<int64_t>((state >> 17) % static_cast<uint64_t>(total)));
  }
  return {chosen.begin(), chosen.end()};
}

}  // namespace fa
