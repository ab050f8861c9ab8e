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
// After the last tile, O = acc / l is exactly softmax(S) V: no approximation anywhere.
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
      trace.o_at(tile_index, first_row + r, d) = state.acc[row * static_cast<std::size_t>(dim) + d] / state.l[row];
    }
  }
}

// One query tile (rows [i0, i0 + rows) of one head) against every K/V tile.
void query_tile_attention(const Shape& shape, const float* q, const float* k, const float* v, float* o, int64_t i0,
                          int64_t rows, int64_t key_tile, TileTrace* trace, int64_t trace_row) {
  const int64_t dim = shape.dim;
  const float scale = softmax_scale(shape);
  TileState state(rows, dim);
  std::vector<float> scores(static_cast<std::size_t>(key_tile));

  // With causal masking query i sees keys 0..i only, so K/V tiles that start after the query
  // tile's last row are skipped outright: about half the work.
  const int64_t key_end = shape.causal ? std::min(shape.seq, i0 + rows) : shape.seq;
  int64_t tile_index = 0;
  for (int64_t j0 = 0; j0 < key_end; j0 += key_tile, ++tile_index) {
    for (int64_t r = 0; r < rows; ++r) {
      // The last tile may be partial; on the diagonal a causal row sees only the keys up to itself.
      const int64_t tile_keys = std::min(key_tile, shape.seq - j0);
      const int64_t keys = shape.causal ? std::min(tile_keys, i0 + r - j0 + 1) : tile_keys;
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

  // Normalize once at the end: O = acc / l.
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < dim; ++d) {
      o[(i0 + r) * dim + d] = state.acc[static_cast<std::size_t>(r * dim + d)] / state.l[static_cast<std::size_t>(r)];
    }
  }
}

}  // namespace

void flash_attention(const Shape& shape, const float* q, const float* k, const float* v, float* o, int64_t query_tile,
                     int64_t key_tile, TileTrace* trace) {
  const int64_t query_tiles = (shape.seq + query_tile - 1) / query_tile;
  if (trace != nullptr) {
    trace->tile = key_tile;
    trace->tiles = (shape.seq + key_tile - 1) / key_tile;
    trace->rows = shape.rows();
    trace->dim = shape.dim;
    trace->m.assign(static_cast<std::size_t>(trace->tiles * trace->rows), 0.0);
    trace->l.assign(trace->m.size(), 0.0);
    trace->o.assign(trace->m.size() * static_cast<std::size_t>(shape.dim), 0.0);
  }
  // Every (head, query tile) pair is independent: the outer loops are the parallel ones, as
  // they will be the thread blocks of the GPU stages.
  const int64_t work = shape.heads_total() * query_tiles;
#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < work; ++item) {
    const int64_t head = item / query_tiles;
    const int64_t i0 = (item % query_tiles) * query_tile;
    const int64_t offset = head * shape.seq * shape.dim;
    query_tile_attention(shape, q + offset, k + offset, v + offset, o + offset, i0,
                         std::min(query_tile, shape.seq - i0), key_tile, trace, head * shape.seq + i0);
  }
}

}  // namespace fa::cpu

namespace fa::stages {
namespace {

constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 64;
constexpr int64_t kMaxDim = 256;

cudaError_t forward(const Shape& shape, const void* q, const void* k, const void* v, void* o, void*, cudaStream_t) {
  if (!validate_shape(shape, kMaxDim).empty()) return cudaErrorInvalidValue;
  cpu::flash_attention(shape, static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
                       static_cast<float*>(o), kQueryTile, kKeyTile);
  return cudaSuccess;
}

cudaError_t trace(const Shape& shape, const float* q, const float* k, const float* v, int64_t tile, TileTrace& out) {
  if (!validate_shape(shape, kMaxDim).empty() || tile < 1) return cudaErrorInvalidValue;
  std::vector<float> o(static_cast<std::size_t>(shape.elements()));
  cpu::flash_attention(shape, q, k, v, o.data(), tile, tile, &out);
  return cudaSuccess;
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
  stage.supports_causal = true;
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace fa::stages
