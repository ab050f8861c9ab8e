// Stage 01: the FlashAttention algorithm in plain C++.
//
// Standard attention computes a whole row of scores S = q K^T / sqrt(D), its softmax P, then
// O = P V: N scores per row held at once, N^2 per head. FlashAttention never holds more than a
// Br × Bc tile of scores. It walks over the keys tile by tile and keeps, for each query row,
//   m  the largest score seen so far,
//   l  the sum of exp(s - m) over the keys seen so far,
//   acc the sum of exp(s - m) · v over the keys seen so far.
// When a tile raises the max from m to m', everything accumulated so far was scaled by
// exp(-m) and must be scaled by exp(-m') instead: multiply l and acc by exp(m - m').
// After the last tile, O = acc / l is exactly softmax(S) V: no approximation anywhere, and
// m + log(l) is the row's log-sum-exp, which the backward pass (stage 11) rebuilds P from.
#include "flash_attention_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "fa_source_hash.h"

namespace fa::cpu {
namespace {

// The state of one query tile: Br rows of m, l and the unnormalized output acc.
struct TileState {
  std::vector<float> m, l, acc;
  TileState(int64_t rows, int64_t dim)
      : m(static_cast<std::size_t>(rows), -std::numeric_limits<float>::infinity()),
        l(static_cast<std::size_t>(rows), 0.0f),
        acc(static_cast<std::size_t>(rows * dim), 0.0f) {}
};

void record(TileTrace& trace, const TileState& state, int64_t tile_index, int64_t first_row, int64_t rows,
            int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const std::size_t row = static_cast<std::size_t>(r);
    trace.m_at(tile_index, first_row + r) = state.m[row];
    trace.l_at(tile_index, first_row + r) = state.l[row];
    for (int64_t d = 0; d < dim; ++d) {
      const float acc = state.acc[row * static_cast<std::size_t>(dim) + d];
      trace.o_at(tile_index, first_row + r, d) = state.l[row] > 0.0f ? acc / state.l[row] : 0.0f;
    }
  }
}

// One query tile (rows [i0, i0 + rows) of one query head) against every K/V tile of the
// key/value head it reads.
void query_tile_attention(const Problem& problem, const float* q, const float* k, const float* v, float* o, float* lse,
                          int64_t i0, int64_t rows, int64_t key_tile, TileTrace* trace, int64_t trace_row) {
  const int64_t dim = problem.dim;
  const float scale = softmax_scale(problem);
  TileState state(rows, dim);
  std::vector<float> scores(static_cast<std::size_t>(key_tile));

  // With causal masking query i sees keys 0..i only (0..i + Nk - Nq when Nq != Nk: causal.hpp),
  // so K/V tiles past the keys of the query tile's last row are skipped outright: about half the
  // work.
  const auto key_end_of = [&](int64_t row) {
    return visible_key_end(row, problem.q_seq, problem.kv_seq, problem.causal);
  };
  const int64_t key_end = key_end_of(i0 + rows - 1);
  int64_t tile_index = 0;
  for (int64_t j0 = 0; j0 < key_end; j0 += key_tile, ++tile_index) {
    for (int64_t r = 0; r < rows; ++r) {
      // The last tile may be partial; on the diagonal a causal row sees only the keys up to itself.
      const int64_t keys = std::min(key_tile, key_end_of(i0 + r) - j0);
      if (keys <= 0) continue;  // this row's keys all lie in earlier tiles
      const float* query = q + (i0 + r) * dim;
      float* acc = &state.acc[static_cast<std::size_t>(r * dim)];
      float& m = state.m[static_cast<std::size_t>(r)];
      float& l = state.l[static_cast<std::size_t>(r)];

      // EXERCISE BEGIN: scores, new running max m_new, rescale l and acc by exp(m - m_new), add the tile
      // Scores of this row against the tile's keys, and the tile's largest score.
      float tile_max = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < keys; ++j) {
        float dot = 0.0f;
        for (int64_t d = 0; d < dim; ++d) dot += query[d] * k[(j0 + j) * dim + d];
        scores[static_cast<std::size_t>(j)] = dot * scale;
        tile_max = std::max(tile_max, scores[static_cast<std::size_t>(j)]);
      }
      // The online softmax update. On the first tile m = -inf, so the correction is exp(-inf) = 0
      // and the (empty) history vanishes; afterwards it shrinks what came before whenever the
      // max grows, so no exp ever sees a positive argument and nothing overflows.
      const float m_new = std::max(m, tile_max);
      const float correction = std::exp(m - m_new);
      l *= correction;
      for (int64_t d = 0; d < dim; ++d) acc[d] *= correction;
      for (int64_t j = 0; j < keys; ++j) {
        const float p = std::exp(scores[static_cast<std::size_t>(j)] - m_new);
        l += p;
        for (int64_t d = 0; d < dim; ++d) acc[d] += p * v[(j0 + j) * dim + d];
      }
      m = m_new;
      // EXERCISE END
    }
    if (trace != nullptr) record(*trace, state, tile_index, trace_row, rows, dim);
  }
  // Tiles skipped by causal masking change nothing: the trace repeats the final state.
  for (; trace != nullptr && tile_index < trace->tiles; ++tile_index)
    record(*trace, state, tile_index, trace_row, rows, dim);

  // Normalize once at the end: O = acc / l. A row that saw no key (Nq > Nk, causal) has l = 0:
  // its output is zero and its log-sum-exp -inf.
  for (int64_t r = 0; r < rows; ++r) {
    const float l = state.l[static_cast<std::size_t>(r)];
    for (int64_t d = 0; d < dim; ++d) {
      o[(i0 + r) * dim + d] = l > 0.0f ? state.acc[static_cast<std::size_t>(r * dim + d)] / l : 0.0f;
    }
    if (lse != nullptr) {
      lse[i0 + r] =
          l > 0.0f ? state.m[static_cast<std::size_t>(r)] + std::log(l) : -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace

void flash_attention(const Problem& problem, const float* q, const float* k, const float* v, float* o, float* lse,
                     int64_t query_tile, int64_t key_tile, TileTrace* trace) {
  const int64_t q_seq = problem.q_seq;
  const int64_t query_tiles = (q_seq + query_tile - 1) / query_tile;
  if (trace != nullptr) {
    trace->tile = key_tile;
    trace->tiles = (problem.kv_seq + key_tile - 1) / key_tile;
    trace->rows = problem.q_rows();
    trace->dim = problem.dim;
    trace->m.assign(static_cast<std::size_t>(trace->tiles * trace->rows), 0.0);
    trace->l.assign(trace->m.size(), 0.0);
    trace->o.assign(trace->m.size() * static_cast<std::size_t>(problem.dim), 0.0);
  }
  // Every (query head, query tile) pair is independent: the outer loops are the parallel ones,
  // as they will be the thread blocks of the GPU stages. The query heads of one group read the
  // same key/value head: K and V are never copied per query head.
  const int64_t work = problem.q_heads_total() * query_tiles;
#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < work; ++item) {
    const int64_t head = item / query_tiles;
    const int64_t i0 = (item % query_tiles) * query_tile;
    const int64_t q_offset = head * q_seq * problem.dim;
    const int64_t kv_offset = problem.kv_head_of(head) * problem.kv_seq * problem.dim;
    query_tile_attention(problem, q + q_offset, k + kv_offset, v + kv_offset, o + q_offset,
                         lse != nullptr ? lse + head * q_seq : nullptr, i0, std::min(query_tile, q_seq - i0), key_tile,
                         trace, head * q_seq + i0);
  }
}

}  // namespace fa::cpu

namespace fa::stages {
namespace {

constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 64;
constexpr int64_t kMaxDim = 256;

Status forward(const ForwardArgs& args) {
  cpu::flash_attention(args.problem, static_cast<const float*>(args.q), static_cast<const float*>(args.k),
                       static_cast<const float*>(args.v), static_cast<float*>(args.o), args.lse, kQueryTile, kKeyTile);
  return Status();
}

Status trace(const Problem& problem, const float* q, const float* k, const float* v, int64_t tile, TileTrace& out) {
  if (tile < 1) return Status::unsupported("a trace needs tiles of at least one key");
  std::vector<float> o(static_cast<std::size_t>(problem.q_elements()));
  cpu::flash_attention(problem, q, k, v, o.data(), nullptr, tile, tile, &out);
  return Status();
}

}  // namespace

StageDescriptor cpu_tiled() {
  StageDescriptor stage;
  stage.id = "01_cpu";
  stage.title = "FlashAttention in plain C++: tiles, running max and running sum (OpenMP)";
  stage.backend = Backend::cpu;
  stage.precision = Precision::fp32;
  stage.forward = &forward;
  stage.max_dim = kMaxDim;
  stage.trace = &trace;
  stage.features = {/*causal=*/true, /*grouped=*/true, /*rectangular=*/true, /*lse=*/true, /*backward=*/false};
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace fa::stages
