// Stage 14's numerics in plain C++: the e4m3 format, the quantization schemes exactly as the GPU
// kernels do them, and a CPU model of the FP8 forward pass (and of the FP16 one beside it) for the
// accuracy study (README, "Accuracy").
//
// THE CONTRACT (the GPU quantizer must match these functions bit for bit; keep it stable):
//
// 1. e4m3 is OCP FP8 E4M3 "fn": sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities;
//    S.1111.111 is NaN; the largest finite value is 448 = 1.75·2^8; subnormals 0.000.xxx are
//    xxx·2^-9. encode_e4m3 rounds to nearest, ties to even, and saturates to ±448 (infinities too):
//    the semantics of `cvt.rn.satfinite.e4m3x2.f32`. -0 stays -0; NaN gives a NaN (0x7f here).
// 2. A block's scale: amax = max |x| over the block (NaN ignored, as fmaxf does);
//    descale = amax / 448.0f and inv = 448.0f / amax, each one IEEE float division. When amax is 0
//    or so small that 448.0f / amax is not finite (amax < 448/FLT_MAX, about 2.5e-36),
//    descale = inv = 1.0f. A value x is stored as encode_e4m3(x * inv) (the float product rounded
//    first, no fused operation) and read back as descale * decode_e4m3(code).
// 3. Head dims: D (1..256) is padded with zeros to its bucket Dpad = 64, 128 or 256 (pad_dim). Q, K
//    and V are quantized as rows of Dpad values; the padding is part of every block.
// 4. The rotation (optional, Q and K only): each padded row x of Q and of K becomes H·x/sqrt(Dpad),
//    H the Sylvester-ordered Walsh-Hadamard matrix, computed in float by the butterfly of
//    hadamard_rotate: for len = 1, 2, 4, ..., Dpad/2, for every i with (i & len) == 0:
//    (x[i], x[i+len]) <- (x[i] + x[i+len], x[i] - x[i+len]); then every x[i] <- x[i] * r with
//    r = hadamard_scale(Dpad) = 1.0f / sqrtf(float(Dpad)) (float; exact for 64 and 256). Only adds,
//    subtracts and one final multiply: a GPU doing the same stages in the same pairs matches it
//    bitwise. The block's amax is taken after the rotation.
// 5. Blocks (descale arrays, in this order):
//    Q per block:  one per (b, h, query block of 128 rows): index (b·Hq + h)·ceil(Nq/128) + i/128;
//    K per block:  one per (b, g, key block of 64 keys):    index (b·Hkv + g)·ceil(Nk/64) + j/64;
//    per tensor:   one for the whole of Q (or K): index 0;
//    V per tensor: index 0; per head: index b·Hkv + g; per channel: index (b·Hkv + g)·Dpad + d
//    (over all Nk keys of the head; the kernel multiplies O's column d by it in the epilogue).
// 6. P: the kernel computes p = exp2(t - m) in FP32 (t = S·softmax_scale·log2(e), m the running max
//    of t), stores e4m3(p · 2^p_shift) (p_shift fixed: 0 or 8; p <= 1 so no scale is needed to stay
//    below 448) and divides O by 2^p_shift in the epilogue, together with 1/l. O accumulates
//    P_q·V_q in FP32 per key tile of 128.
//
// The choices the accuracy study made (README, "Accuracy"; the numbers are there), Fp8Options'
// defaults: Q and K per block with the rotation, V per channel, P with p_shift = 8, and l summed
// from the FP32 P.
#pragma once

#include <cstdint>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/problem.hpp"

namespace fa::fp8 {

// ---- The e4m3 format ----
constexpr float kE4m3Max = 448.0f;
constexpr uint8_t kE4m3NaN = 0x7f;  // and 0xff, with the sign
uint8_t encode_e4m3(float x);
float decode_e4m3(uint8_t code);

// ---- Scales ----
struct BlockScale {
  float descale = 1.0f;  // dequantize: descale · decode(code)
  float inv = 1.0f;      // quantize:   encode(x · inv)
};
BlockScale block_scale(float amax);                                // contract, point 2
float amax_of(const float* x, int64_t count, int64_t stride = 1);  // NaN ignored
inline uint8_t quantize(float x, const BlockScale& s) { return encode_e4m3(x * s.inv); }
inline float dequantize(uint8_t code, const BlockScale& s) { return s.descale * decode_e4m3(code); }

// ---- Head dims and the rotation ----
constexpr int64_t kQueryBlock = 128;  // query rows per Q scale block
constexpr int64_t kKeyBlock = 64;     // keys per K scale block: a kernel tile holds whole blocks
int64_t pad_dim(int64_t dim);         // 64, 128 or 256
// Keys per tile of the kernel's online softmax, by head-dim bucket: 192 up to Dpad = 128 (three K
// blocks: fewer tiles, so less of the per-tile work of rescaling O, the turns and the barriers), 64
// at Dpad = 256, where O alone takes 128 registers a thread.
constexpr int64_t kernel_tile_keys(int64_t dim_padded) {
  return dim_padded == 128 ? 192 : (dim_padded < 128 ? 128 : 64);
}
float hadamard_scale(int64_t dim_padded);
void hadamard_rotate(float* row, int64_t dim_padded);  // in place, contract point 4

// ---- Quantized tensors ----
enum class QkScaling { per_tensor, per_block };
enum class VScaling { per_tensor, per_head, per_channel };

// A (heads, seq, dim) tensor as e4m3 rows of dim_padded codes and the descales of its blocks
// (contract, point 5): a block is `block_rows` consecutive rows of one head (0: the whole tensor),
// or with `per_channel` one column d of one head.
struct Quantized {
  int64_t heads = 0, seq = 0, dim_padded = 0;
  int64_t block_rows = 0;
  bool per_channel = false;
  std::vector<uint8_t> codes;   // heads · seq · dim_padded
  std::vector<float> descales;  // in the order of point 5
  float descale(int64_t head, int64_t row, int64_t d) const;
  uint8_t code(int64_t head, int64_t row, int64_t d) const { return codes[((head * seq) + row) * dim_padded + d]; }
  float value(int64_t head, int64_t row, int64_t d) const {
    return descale(head, row, d) * decode_e4m3(code(head, row, d));
  }
};

// Q or K: `values` is (heads, seq, dim) row-major, heads = B·H; per block, blocks of kQueryBlock
// (Q) or kKeyBlock (K) rows: `block_rows`.
Quantized quantize_qk(const std::vector<float>& values, int64_t heads, int64_t seq, int64_t dim, int64_t block_rows,
                      QkScaling scaling, bool rotate);
// V, never rotated, its scale as `scaling` says.
Quantized quantize_v(const std::vector<float>& values, int64_t heads, int64_t seq, int64_t dim, VScaling scaling);

// ---- The forward models ----
struct Fp8Options {
  QkScaling qk = QkScaling::per_block;
  bool rotate = true;
  VScaling v = VScaling::per_channel;
  int p_shift = 8;                  // P stored as e4m3(p · 2^p_shift)
  bool l_from_quantized_p = false;  // the row sum from the e4m3 P (else from the FP32 P)
  int64_t tile_keys = 0;            // keys per tile of the online softmax; 0: the kernel's
};

// O (B, Hq, Nq, D) as the FP8 kernel computes it: Q, K, V quantized as `options` says; per key
// tile (kernel_tile_keys unless options.tile_keys), S = descale_q·descale_k·(Q_q·K_qᵀ) (a float sum over the padded
// dim), the online softmax in FP32, P quantized, O += P_q·V_q in FP32 (V's per-channel descale applied at the end); O =
// O / l / 2^p_shift. The causal mask of causal.hpp; a row that sees no key gives zeros.
std::vector<float> fp8_attention(const Inputs& inputs, const Fp8Options& options);

// O as the FP16 stages compute it (stage 10): Q, K, V rounded to FP16, S in FP32, the online
// softmax in FP32 with l from the FP32 P, P rounded to FP16, O in FP32, rounded to FP16 at the end.
std::vector<float> fp16_attention(const Inputs& inputs);

// ---- Inputs and errors for the study ----
// Gaussian N(0, 1) inputs; with `outliers`, FlashAttention-3's: a fraction 1e-3 of the entries of
// each of Q, K and V drawn from N(0, 100) (standard deviation 10) instead.
Inputs gaussian_inputs(const Problem& problem, uint64_t seed, bool outliers);

struct Error {
  double rmse = 0.0;     // root mean square of O - O_ref over all elements
  double max_abs = 0.0;  // largest |O - O_ref|
};
Error error_against(const std::vector<float>& actual, const std::vector<double>& reference);

}  // namespace fa::fp8
