// Stage 14's quantization pass on the GPU: FP16/BF16 Q, K, V (B, H, N, D) in, e4m3 codes and their
// descales out, as the contract at the top of fp8_numerics.hpp says, bit for bit (the rotation
// included: the same butterfly in the same pairs). The layouts the attention kernel reads:
//
//   Q_q  (B·Hq,  Nq,   Dpad)     e4m3, rows of Dpad bytes; descale per (head, 128 query rows)
//   K_q  (B·Hkv, Nk,   Dpad)     e4m3; descale per (head, 64 keys)
//   V_qᵀ (B·Hkv, Dpad, Nk_pad)   e4m3, transposed: a row per channel d, holding keys (8-bit wgmma
//                                reads its B operand K-major only); descale per (head, channel d);
//                                Nk_pad = Nk rounded up to 16 (TMA: rows of a multiple of 16 bytes),
//                                the keys past Nk zero, and the keys of every group of 16 permuted
//                                (kernel_key_position) so that P needs no shuffle in the kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa/problem.hpp"
#include "fa/stage.hpp"

namespace fa::fp8 {

// Key j of a group of 16 is stored at this position of V_qᵀ's row. The attention kernel hands the
// FP32 accumulator of S to the P·V product as it stands: a thread's register i of P (4 e4m3 values)
// then holds keys 2·quad, 2·quad + 1, 8 + 2·quad, 9 + 2·quad (accumulator layout), where the 8-bit A
// operand expects keys 4·quad .. 4·quad + 3. Storing V's key 8h + 2q + e at 4q + 2h + e makes them
// the same (fp8_attention.cu, "P in registers").
__host__ __device__ constexpr int kernel_key_position(int key) {
  const int group = key & ~15;
  const int j = key & 15;
  return group + 4 * ((j & 7) >> 1) + 2 * (j >> 3) + (j & 1);
}

constexpr int kVKeyAlign = 16;

// Where each tensor lives in one workspace, and its sizes.
struct QuantizedLayout {
  int64_t dim_padded = 0;                            // Dpad: 64, 128 or 256
  int64_t kv_seq_padded = 0;                         // Nk_pad
  int64_t q_blocks = 0;                              // ceil(Nq / 128): Q descales per head
  int64_t k_blocks = 0;                              // ceil(Nk / 64)
  int64_t q_offset = 0, k_offset = 0, v_offset = 0;  // bytes into the workspace, each 256-aligned
  int64_t q_descale_offset = 0, k_descale_offset = 0, v_descale_offset = 0;
  int64_t v_amax_offset = 0;  // scratch of the V pass: per-channel amax
  int64_t bytes = 0;          // the whole workspace
};
QuantizedLayout quantized_layout(const Problem& problem);

// Device pointers to quantized inputs: made by quantize_inputs, or by the caller (already-quantized
// tensors in the layouts above) for fp8_forward_quantized.
struct QuantizedInputs {
  const uint8_t* q = nullptr;
  const uint8_t* k = nullptr;
  const uint8_t* v_transposed = nullptr;
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
};

// Where quantize_into writes: the tensors and descales in the layouts above, each in a buffer of
// its own (a caller's, e.g. the C ABI's fa_fp8_quantize), and V's per-channel amax in `v_amax`, a
// scratch of quantize_scratch_bytes (it cannot share the descales: every key tile reads a channel's
// amax while the first writes its descale).
struct QuantizedOutputs {
  uint8_t* q = nullptr;
  uint8_t* k = nullptr;
  uint8_t* v_transposed = nullptr;
  float* q_descale = nullptr;
  float* k_descale = nullptr;
  float* v_descale = nullptr;
  void* v_amax = nullptr;
};
int64_t quantize_scratch_bytes(const Problem& problem);
Status quantize_into(const Problem& problem, Precision precision, const void* q, const void* k, const void* v,
                     bool rotate, const QuantizedOutputs& out, cudaStream_t stream);

// e4m3 tensors quantized by the caller (the C ABI's fa_fp8_forward), in row layouts. Q and K hold
// rows of `qk_dim` codes: D, or Dpad (what quantize_into writes, and the only choice for rotated
// rows, whose padding is not zero). V is either (B·Hkv, Nk, D) rows with descales (B·Hkv, D), which
// arrange_e4m3 transposes into the kernel's Vᵀ, or already Vᵀ with descales (B·Hkv, Dpad)
// (`v_transposed`, as quantize_into writes it). The Q and K descales are always the layouts above.
struct E4m3Rows {
  const uint8_t* q = nullptr;
  const uint8_t* k = nullptr;
  int64_t qk_dim = 0;
  const uint8_t* v = nullptr;
  bool v_transposed = false;
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
};
// The kernel's inputs from `rows`: Q and K padded to Dpad (when qk_dim is D < Dpad) and V transposed
// (when in rows) into `workspace` (quantized_layout(problem).bytes, 256-byte aligned; unused, and
// may be null, when nothing needs either); the rest passed as they are. Launches on `stream`.
Status arrange_e4m3(const Problem& problem, const E4m3Rows& rows, void* workspace, QuantizedInputs* out,
                    cudaStream_t stream);

// Quantizes FP16 or BF16 (`precision`) Q, K, V into `workspace` (quantized_layout(problem).bytes,
// 256-byte aligned), the rotation of Q and K when `rotate`; fills `out` with the pointers. Launches
// on `stream`, asynchronous.
Status quantize_inputs(const Problem& problem, Precision precision, const void* q, const void* k, const void* v,
                       bool rotate, void* workspace, QuantizedInputs* out, cudaStream_t stream);

}  // namespace fa::fp8
