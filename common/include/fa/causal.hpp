// The causal rule, written once for host and device code (DESIGN.md, "General shapes").
//
// With Nq query rows and Nk keys the mask is aligned to the bottom-right corner: the last query
// row sees every key, and query row i sees keys 0 .. i + (Nk - Nq). With Nq = Nk that is the
// familiar "query i sees keys 0..i". With Nq > Nk the first Nq - Nk rows see no key at all: their
// output is zero and their log-sum-exp is -inf (FlashAttention-2's convention, and PyTorch's
// causal_lower_right).
//
//        keys 0 .. Nk-1                 Nq = 3, Nk = 5:   x x x . .
//   q 0  x x . . .   (Nq = Nk)                            x x x x .
//   q 1  x x x . .                                        x x x x x
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA_HOST_DEVICE inline
#endif

namespace fa {

// How many keys query row `row` sees: the keys [0, causal_key_end) (0 when it sees none).
FA_HOST_DEVICE int64_t causal_key_end(int64_t row, int64_t q_seq, int64_t kv_seq) {
  const int64_t end = row + 1 + (kv_seq - q_seq);
  return end < 0 ? 0 : (end > kv_seq ? kv_seq : end);
}

// The keys a row sees with or without the mask.
FA_HOST_DEVICE int64_t visible_key_end(int64_t row, int64_t q_seq, int64_t kv_seq, bool causal) {
  return causal ? causal_key_end(row, q_seq, kv_seq) : kv_seq;
}

// The same rule in 32-bit arithmetic, for kernels that number rows and keys with ints and have no
// register to spare (stages 02 and 05-07, where 64-bit bounds cost registers in the hot loop): row
// `row` sees the keys below the returned limit. It equals causal_key_end(row, q_seq, kv_seq) where
// that is positive, and is 0 or less for a row that sees no key (no clamp at 0: the kernels
// compare `key < limit`, which needs none). Without the mask every row sees all kv_seq keys.
FA_HOST_DEVICE int visible_key_limit(int row, int q_seq, int kv_seq, bool causal) {
  const int end = row + 1 + (kv_seq - q_seq);
  return causal && end < kv_seq ? end : kv_seq;
}

}  // namespace fa
