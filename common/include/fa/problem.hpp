// The attention problem: shapes, FLOP and byte counts, and the limits every stage shares.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace fa {

// Q, K, V and O all have shape (batch, heads, seq, dim), row-major with dim fastest.
struct Shape {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t seq = 1;
  int64_t dim = 1;
  bool causal = false;

  int64_t heads_total() const { return batch * heads; }
  int64_t rows() const { return batch * heads * seq; }
  int64_t elements() const { return rows() * dim; }  // of one tensor
};

// 4·B·H·N²·D: two matrix products of 2·N²·D each (halved for causal).
double attention_flops(const Shape& shape);

// The fewest bytes any implementation must move: read Q, K, V once, write O once.
int64_t minimum_bytes(const Shape& shape, int element_bytes);

inline float softmax_scale(const Shape& shape) { return 1.0f / std::sqrt(static_cast<float>(shape.dim)); }

// Limits beyond which a size is rejected as absurd rather than attempted.
constexpr int64_t kMaxBatchHeads = int64_t{1} << 20;
constexpr int64_t kMaxSeq = int64_t{1} << 24;
constexpr int64_t kMaxElements = int64_t{1} << 36;

// Empty when the shape is valid for a stage whose largest head dim is max_dim, else one line
// that says what is wrong.
std::string validate_shape(const Shape& shape, int64_t max_dim);

std::string describe(const Shape& shape);

}  // namespace fa
