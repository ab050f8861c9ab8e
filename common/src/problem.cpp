#include "fa/problem.hpp"

#include <sstream>

namespace fa {

double attention_flops(const Shape& shape) {
  const double n = static_cast<double>(shape.seq);
  const double full = 4.0 * static_cast<double>(shape.heads_total()) * n * n * static_cast<double>(shape.dim);
  return shape.causal ? full / 2.0 : full;
}

int64_t minimum_bytes(const Shape& shape, int element_bytes) { return 4 * shape.elements() * element_bytes; }

std::string validate_shape(const Shape& shape, int64_t max_dim) {
  std::ostringstream why;
  if (shape.batch < 1 || shape.heads < 1) {
    why << "batch and heads must be at least 1 (got batch " << shape.batch << ", heads " << shape.heads << ")";
  } else if (shape.seq < 1) {
    why << "sequence length must be at least 1 (got " << shape.seq << ")";
  } else if (shape.dim < 1) {
    why << "head dim must be at least 1 (got " << shape.dim << ")";
  } else if (shape.dim > max_dim) {
    why << "head dim " << shape.dim << " is beyond this stage's largest, " << max_dim;
  } else if (shape.batch > kMaxBatchHeads || shape.heads > kMaxBatchHeads || shape.heads_total() > kMaxBatchHeads) {
    why << "batch·heads " << shape.batch << "·" << shape.heads << " is beyond the limit " << kMaxBatchHeads;
  } else if (shape.seq > kMaxSeq) {
    why << "sequence length " << shape.seq << " is beyond the limit " << kMaxSeq;
  } else if (shape.elements() > kMaxElements) {
    why << "B·H·N·D = " << shape.elements() << " elements is beyond the limit " << kMaxElements;
  }
  return why.str();
}

std::string describe(const Shape& shape) {
  std::ostringstream text;
  text << "B=" << shape.batch << " H=" << shape.heads << " N=" << shape.seq << " D=" << shape.dim
       << (shape.causal ? " causal" : "");
  return text.str();
}

}  // namespace fa
