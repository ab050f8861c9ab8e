// Stage 14's numerics, on the CPU (no GPU needed): the e4m3 codec against the format's definition,
// the scale contract, the Hadamard rotation, the FP8 model within a bound derived from e4m3's
// rounding (and above the FP16 model's error), and block scales with the rotation beating
// per-tensor scales on FlashAttention-3's outlier inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "catch_compat.hpp"
#include "fa/causal.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fp8_numerics.hpp"

namespace {

namespace fp8 = fa::fp8;

constexpr double kU = 1.0 / 16;  // e4m3's unit roundoff: 3 mantissa bits, 2^-(3+1)
constexpr double kU32 = 1.0 / 16777216;

// The value of a code straight from the format's definition: sign, exponent field e (bias 7), and
// mantissa m; e = 0 is subnormal (m/8 · 2^-6); S.1111.111 is NaN.
double e4m3_value(int code) {
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  const double magnitude = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}
bool is_nan_code(int code) { return (code & 0x7f) == 0x7f; }

// The non-negative finite values, ascending (code c holds the c-th: the encoding is monotonic).
std::vector<double> positive_values() {
  std::vector<double> values;
  for (int code = 0; code < 0x7f; ++code) values.push_back(e4m3_value(code));
  return values;
}

// The code nearest to x >= 0 by search, ties to the even code (the one whose mantissa ends in 0).
int nearest_code(double x, const std::vector<double>& values) {
  if (x >= values.back()) return 0x7e;  // saturation
  const auto above = std::lower_bound(values.begin(), values.end(), x);
  const int hi = static_cast<int>(above - values.begin());
  if (values[hi] == x || hi == 0) return hi;
  const int lo = hi - 1;
  const double below_gap = x - values[lo], above_gap = values[hi] - x;
  if (below_gap != above_gap) return below_gap < above_gap ? lo : hi;
  return lo % 2 == 0 ? lo : hi;
}

// The largest error the FP8 model may show, element by element, derived from e4m3's unit roundoff
// u = 2^-4 and the magnitudes of the inputs (the reference is exact; u32 = 2^-24 is FP32's).
//
// Quantization. A value x stored with descale c is read back as x(1 + η) + ζ: |η| <= u where the
// scaled value is normal, and where it is subnormal (below 2^-6 after scaling) an absolute error of
// at most half the quantum, |ζ| <= c·2^-10; c <= amax/448, and amax <= the largest row norm for
// Q and K (the rotation keeps norms), max|V| for V. So |x̂ - x| <= u|x| + ε with ε = amax·2^-10/448.
// Scores. With q̃, k̃ the rows the model quantizes (padded, rotated when asked),
//   |ŝ - s| <= scale·Σ_d [(|q̃_d|(1+u) + ε_q)(|k̃_d|(1+u) + ε_k) - |q̃_d||k̃_d|]   (quantization)
//            + scale·(Dpad + 2)·u32·Σ_d |q̂_d||k̂_d| + 8·u32·|ŝ|                (FP32 sums, scale, exp2)
//            + scale·20·u32·|q|·|k|                                              (the float rotation)
// = Δ_ij; Δ = max over the row's keys. Each weight w_j = e^{s_j}/Σ e^{s_k} then moves by a factor
// within [e^{-2Δ}, e^{2Δ}].
// P. Quantized with relative error u where p·2^shift is normal: with l from either P the model's
// weights ŵ_j satisfy ŵ_j/w_j in [1/R, R], R = e^{2Δ}(1+u)/(1-u)(1 + 8u32), so
// |Σ(ŵ_j - w_j)v̂_j| <= (R - 1)·Σ w_j|v̂_j|. Where p·2^shift is subnormal (p < 2^(-6-shift); the
// model's p is at most e^{2Δ} times p*_j = e^{s_j - s_max}) the error is absolute, at most
// min(p, 2^(-10-shift)) in units where the row's largest p is 1 (rescaling by later maxima only
// shrinks it); their sum Z moves O by at most 2Z·max|v̂| (numerator and l, which is >= 1 since the
// key at the row's maximum has p = 1 exactly).
// V. Σ w_j|v̂_j - v_j| <= u·Σ w_j|v_j| + ε_v.
// FP32 accumulation of O over n keys and the rescales: (n + 8)·u32·R·Σ w_j|v̂_j|.
std::vector<double> fp8_error_bound(const fa::Inputs& in, const fp8::Fp8Options& options) {
  const fa::Problem& p = in.problem;
  const int64_t width = fp8::pad_dim(p.dim);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.dim));
  // The rows as the model quantizes them, and the largest row norm.
  const auto prepared = [&](const std::vector<float>& x, int64_t rows, double& max_norm) {
    std::vector<float> out(static_cast<size_t>(rows * width), 0.0f);
    max_norm = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = &out[static_cast<size_t>(r * width)];
      std::copy_n(&x[static_cast<size_t>(r * p.dim)], p.dim, row);
      double norm = 0.0;
      for (int64_t d = 0; d < p.dim; ++d) norm += double{row[d]} * row[d];
      max_norm = std::max(max_norm, std::sqrt(norm));
      if (options.rotate) fp8::hadamard_rotate(row, width);
    }
    return out;
  };
  double q_norm = 0.0, k_norm = 0.0;
  const std::vector<float> q = prepared(in.q, p.q_rows(), q_norm);
  const std::vector<float> k = prepared(in.k, p.kv_rows(), k_norm);
  const double half_quantum = std::pow(2.0, -10) / 448.0 * 1.001;  // 1.001: float rounding of amax
  const double eps_q = q_norm * half_quantum, eps_k = k_norm * half_quantum;
  double v_max = 0.0;
  for (const float x : in.v) v_max = std::max(v_max, std::fabs(double{x}));
  const double eps_v = v_max * half_quantum;
  const double p_unit = std::ldexp(1.0, options.p_shift);

  std::vector<double> bound(static_cast<size_t>(p.q_elements()), 0.0);
  std::vector<double> s, delta_row, w;
  for (int64_t qh = 0; qh < p.q_heads_total(); ++qh) {
    const int64_t kvh = p.kv_head_of(qh);
    for (int64_t i = 0; i < p.q_seq; ++i) {
      const int64_t n = fa::visible_key_end(i, p.q_seq, p.kv_seq, p.causal);
      if (n == 0) continue;  // zeros, exactly
      const float* qt = &q[static_cast<size_t>((qh * p.q_seq + i) * width)];
      const float* q_in = &in.q[static_cast<size_t>((qh * p.q_seq + i) * p.dim)];
      s.assign(static_cast<size_t>(n), 0.0);
      double delta = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        const float* kt = &k[static_cast<size_t>((kvh * p.kv_seq + j) * width)];
        const float* k_in = &in.k[static_cast<size_t>((kvh * p.kv_seq + j) * p.dim)];
        double exact = 0.0, nq = 0.0, nk = 0.0, quantized = 0.0, magnitude = 0.0;
        for (int64_t d = 0; d < p.dim; ++d) {
          exact += double{q_in[d]} * k_in[d];
          nq += double{q_in[d]} * q_in[d];
          nk += double{k_in[d]} * k_in[d];
        }
        for (int64_t d = 0; d < width; ++d) {
          const double a = std::fabs(double{qt[d]}) * (1 + kU) + eps_q, b = std::fabs(double{kt[d]}) * (1 + kU) + eps_k;
          quantized += a * b - std::fabs(double{qt[d]}) * std::fabs(double{kt[d]});
          magnitude += a * b;
        }
        s[static_cast<size_t>(j)] = scale * exact;
        delta = std::max(delta, scale * (quantized + (width + 2) * kU32 * magnitude + 20 * kU32 * std::sqrt(nq * nk)) +
                                    8 * kU32 * scale * magnitude);
      }
      const double s_max = *std::max_element(s.begin(), s.end());
      double sum = 0.0, z = 0.0;
      w.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const double star = std::exp(s[static_cast<size_t>(j)] - s_max);
        w[static_cast<size_t>(j)] = star;
        sum += star;
        if (star * std::exp(-2 * delta) < 0.015625 / p_unit)
          z += std::min(star * std::exp(2 * delta), 1.0 / (1024 * p_unit));
      }
      const double r = std::exp(2 * delta) * (1 + kU) / (1 - kU) * (1 + 8 * kU32);
      for (int64_t d = 0; d < p.dim; ++d) {
        double a = 0.0, v_top = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const double v = std::fabs(double{in.v[static_cast<size_t>((kvh * p.kv_seq + j) * p.dim + d)]});
          a += w[static_cast<size_t>(j)] / sum * v;
          v_top = std::max(v_top, v);
        }
        const double a_hat = a * (1 + kU) + eps_v;
        bound[static_cast<size_t>((qh * p.q_seq + i) * p.dim + d)] =
            (r - 1) * a_hat + (kU * a + eps_v) + 2 * z * (v_top * (1 + kU) + eps_v) + (n + 8) * kU32 * r * a_hat;
      }
    }
  }
  return bound;
}

double rmse(const std::vector<float>& actual, const std::vector<double>& reference) {
  return fp8::error_against(actual, reference).rmse;
}

}  // namespace

TEST_CASE("stage14: e4m3 decodes every code to the value its bits define") {
  int nans = 0;
  for (int code = 0; code < 256; ++code) {
    const float value = fp8::decode_e4m3(static_cast<uint8_t>(code));
    INFO("code " << code);
    if (is_nan_code(code)) {
      ++nans;
      CHECK(std::isnan(value));
    } else {
      CHECK(static_cast<double>(value) == e4m3_value(code));
      CHECK(std::signbit(value) == ((code & 0x80) != 0));
    }
  }
  CHECK(nans == 2);  // no infinities: only S.1111.111
  CHECK(e4m3_value(0x7e) == 448.0);
  CHECK(e4m3_value(0x01) == std::pow(2.0, -9));
}

TEST_CASE("stage14: every e4m3 code round-trips") {
  for (int code = 0; code < 256; ++code) {
    if (is_nan_code(code)) continue;
    INFO("code " << code);
    CHECK(fp8::encode_e4m3(fp8::decode_e4m3(static_cast<uint8_t>(code))) == code);
  }
  CHECK(std::isnan(fp8::decode_e4m3(fp8::encode_e4m3(NAN))));
}

TEST_CASE("stage14: e4m3 encoding rounds to nearest, ties to even, and saturates at 448") {
  const std::vector<double> values = positive_values();
  // Between every pair of neighbours: the midpoint goes to the even code, a float step either side
  // of it to the nearer neighbour. Midpoints of e4m3 neighbours are exact in float.
  for (int lo = 0; lo + 1 < static_cast<int>(values.size()); ++lo) {
    const float mid = static_cast<float>((values[lo] + values[lo + 1]) / 2);
    INFO("between codes " << lo << " and " << lo + 1 << ", midpoint " << mid);
    REQUIRE(static_cast<double>(mid) == (values[lo] + values[lo + 1]) / 2);
    CHECK(fp8::encode_e4m3(mid) == (lo % 2 == 0 ? lo : lo + 1));
    CHECK(fp8::encode_e4m3(std::nextafter(mid, 0.0f)) == lo);
    CHECK(fp8::encode_e4m3(std::nextafter(mid, 1000.0f)) == lo + 1);
    CHECK(fp8::encode_e4m3(-mid) == ((lo % 2 == 0 ? lo : lo + 1) | 0x80));  // the sign is separate
  }
  for (const float big : {448.0f, 449.0f, 463.9f, 464.0f, 479.9f, 480.0f, 1e6f, 3e38f, INFINITY}) {
    INFO(big);
    CHECK(fp8::encode_e4m3(big) == 0x7e);
    CHECK(fp8::encode_e4m3(-big) == 0xfe);
  }
  CHECK(fp8::encode_e4m3(-0.0f) == 0x80);
  CHECK(fp8::encode_e4m3(1e-30f) == 0x00);
  // A sweep of floats from 0 to past 448 (every 2^11-th bit pattern, about 540 000 values,
  // subnormal floats included) against the nearest code by search.
  int wrong = 0;
  for (uint32_t bits = 0; bits < 0x43f00000u; bits += 2048) {
    float x = 0.0f;
    std::memcpy(&x, &bits, sizeof x);
    if (fp8::encode_e4m3(x) != nearest_code(x, values)) ++wrong;
  }
  CHECK(wrong == 0);
}

TEST_CASE("stage14: a block's scale maps its amax to 448 and zero to scale 1") {
  const fp8::BlockScale zero = fp8::block_scale(0.0f);
  CHECK((zero.descale == 1.0f && zero.inv == 1.0f));
  const fp8::BlockScale tiny = fp8::block_scale(1e-37f);  // 448 / 1e-37 overflows float
  CHECK((tiny.descale == 1.0f && tiny.inv == 1.0f));
  for (const float amax : {1.0f, 3.0f, 0.01f, 448.0f, 1e4f}) {
    const fp8::BlockScale s = fp8::block_scale(amax);
    INFO("amax " << amax);
    CHECK(s.descale == amax / 448.0f);
    CHECK(s.inv == 448.0f / amax);
    CHECK(fp8::quantize(amax, s) == 0x7e);  // amax · inv may round past 448: it saturates there
    CHECK(fp8::quantize(-amax, s) == 0xfe);
    CHECK(std::fabs(fp8::dequantize(0x7e, s) - amax) <= 1e-6 * amax);
  }
  std::vector<float> x = {1.0f, -5.0f, NAN, 2.0f};
  CHECK(fp8::amax_of(x.data(), 4) == 5.0f);  // NaN ignored
  CHECK(fp8::amax_of(x.data(), 2, 2) == 1.0f);
}

TEST_CASE("stage14: Q, K and V blocks: which rows and columns share a descale, and the codes") {
  // 2 heads of 300 rows, D = 40 (padded to 64): Q blocks of 128 rows are rows 0-127, 128-255,
  // 256-299 of each head. Each block gets its own amax from a marked element.
  const int64_t heads = 2, seq = 300, dim = 40, width = 64;
  std::vector<float> x(static_cast<size_t>(heads * seq * dim));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t b = 0; b < 3; ++b)
      x[static_cast<size_t>(((h * seq) + b * 128 + 5) * dim + 7)] = 10.0f * (h * 3 + b + 1);
  }
  const fp8::Quantized blocks =
      fp8::quantize_qk(x, heads, seq, dim, fp8::kQueryBlock, fp8::QkScaling::per_block, false);
  REQUIRE(blocks.descales.size() == 6);
  REQUIRE(blocks.dim_padded == width);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t row = 0; row < seq; ++row) {
      const float amax = 10.0f * static_cast<float>(h * 3 + row / 128 + 1);
      const fp8::BlockScale s = fp8::block_scale(amax);
      CHECK(blocks.descale(h, row, 0) == s.descale);
      for (int64_t d = 0; d < width; ++d) {
        const float value = d < dim ? x[static_cast<size_t>((h * seq + row) * dim + d)] : 0.0f;
        if (blocks.code(h, row, d) != fp8::encode_e4m3(value * s.inv))
          FAIL("code of " << h << ", " << row << ", " << d);
      }
    }
  }
  CHECK(blocks.descales[4] == fp8::block_scale(50.0f).descale);  // contract: (h·3 + block) order

  const fp8::Quantized tensor = fp8::quantize_qk(x, heads, seq, dim, fp8::kKeyBlock, fp8::QkScaling::per_tensor, false);
  CHECK(tensor.descales == std::vector<float>{fp8::block_scale(60.0f).descale});

  // V per channel: column 7 of head 1 holds 40, 50, 60; the padded columns hold zeros (scale 1).
  const fp8::Quantized channel = fp8::quantize_v(x, heads, seq, dim, fp8::VScaling::per_channel);
  REQUIRE(channel.descales.size() == static_cast<size_t>(heads * width));
  CHECK(channel.descales[static_cast<size_t>(width + 7)] == fp8::block_scale(60.0f).descale);
  CHECK(channel.descale(1, 17, 7) == fp8::block_scale(60.0f).descale);
  CHECK(channel.descale(0, 0, 50) == 1.0f);
  const fp8::Quantized head = fp8::quantize_v(x, heads, seq, dim, fp8::VScaling::per_head);
  CHECK(head.descales == std::vector<float>{fp8::block_scale(30.0f).descale, fp8::block_scale(60.0f).descale});

  // With the rotation the amax is that of the rotated rows, which the codes then hold.
  const fp8::Quantized rotated =
      fp8::quantize_qk(x, heads, seq, dim, fp8::kQueryBlock, fp8::QkScaling::per_block, true);
  std::vector<float> rows(static_cast<size_t>(128 * width), 0.0f);
  for (int64_t r = 0; r < 128; ++r) {
    std::copy_n(&x[static_cast<size_t>(r * dim)], dim, &rows[static_cast<size_t>(r * width)]);
    fp8::hadamard_rotate(&rows[static_cast<size_t>(r * width)], width);
  }
  const fp8::BlockScale s = fp8::block_scale(fp8::amax_of(rows.data(), 128 * width));
  CHECK(rotated.descales[0] == s.descale);
  CHECK(rotated.code(0, 5, 9) == fp8::encode_e4m3(rows[static_cast<size_t>(5 * width + 9)] * s.inv));
}

TEST_CASE("stage14: the rotation is the orthogonal Walsh-Hadamard matrix and leaves QK^T unchanged") {
  for (const int64_t width : {64, 128, 256}) {
    INFO("Dpad " << width);
    // Column j of the rotation is the rotated unit vector e_j; Sylvester's matrix has entry
    // (-1)^popcount(i & j) / sqrt(Dpad): the butterfly's order is the natural (Sylvester) order.
    std::vector<std::vector<float>> columns;
    int wrong_entries = 0;
    for (int64_t j = 0; j < width; ++j) {
      std::vector<float> e(static_cast<size_t>(width), 0.0f);
      e[static_cast<size_t>(j)] = 1.0f;
      fp8::hadamard_rotate(e.data(), width);
      for (int64_t i = 0; i < width; ++i) {
        int ones = 0;
        for (int64_t bits = i & j; bits; bits &= bits - 1) ++ones;
        const double expected = (ones % 2 ? -1.0 : 1.0) / std::sqrt(static_cast<double>(width));
        if (std::fabs(e[static_cast<size_t>(i)] - expected) > 1e-7) ++wrong_entries;
      }
      columns.push_back(e);
    }
    CHECK(wrong_entries == 0);
    double worst = 0.0;  // |H^T H - I|
    for (int64_t a = 0; a < width; ++a) {
      for (int64_t b = 0; b < width; ++b) {
        double dot = 0.0;
        for (int64_t i = 0; i < width; ++i) dot += double{columns[a][i]} * columns[b][i];
        worst = std::max(worst, std::fabs(dot - (a == b ? 1.0 : 0.0)));
      }
    }
    CHECK(worst < 1e-6);

    // q·k before and after: equal up to the float rounding of the butterfly (log2(Dpad) adds and
    // one multiply per element), far below 1e-5 of |q|·|k|.
    const fa::Inputs in = fp8::gaussian_inputs(fa::Problem::square(1, 1, 16, width - 7), 3, true);
    for (int64_t r = 0; r < 16; ++r) {
      std::vector<float> q(static_cast<size_t>(width), 0.0f), k(static_cast<size_t>(width), 0.0f);
      std::copy_n(&in.q[static_cast<size_t>(r * (width - 7))], width - 7, q.begin());
      std::copy_n(&in.k[static_cast<size_t>(r * (width - 7))], width - 7, k.begin());
      double before = 0.0, nq = 0.0, nk = 0.0;
      for (int64_t i = 0; i < width; ++i) {
        before += double{q[i]} * k[i];
        nq += double{q[i]} * q[i];
        nk += double{k[i]} * k[i];
      }
      const double norms = std::sqrt(nq * nk);
      fp8::hadamard_rotate(q.data(), width);
      fp8::hadamard_rotate(k.data(), width);
      double after = 0.0;
      for (int64_t i = 0; i < width; ++i) after += double{q[i]} * k[i];
      CHECK(std::fabs(after - before) <= 1e-5 * norms);
    }
  }
}

TEST_CASE("stage14: the FP8 model stays within the bound e4m3's rounding gives, above the FP16 model's error") {
  const std::vector<fa::Problem> shapes = {
      {1, 2, 1, 200, 200, 40, false},  // grouped-query, D padded from 40 to 64, a partial key tile
      {1, 1, 1, 160, 160, 128, true},  // causal
      {1, 2, 2, 70, 300, 96, true},    // Nq < Nk, bottom-right causal, D padded to 128
      {1, 1, 1, 40, 150, 256, false},  // the largest bucket
  };
  const std::vector<fp8::Fp8Options> schemes = {
      {},  // the chosen one
      {fp8::QkScaling::per_tensor, false, fp8::VScaling::per_tensor, 8, false},
      {fp8::QkScaling::per_block, false, fp8::VScaling::per_head, 0, true},
      {fp8::QkScaling::per_block, true, fp8::VScaling::per_channel, 0, false},
  };
  for (const fa::Problem& shape : shapes) {
    for (const bool gaussian : {false, true}) {
      const fa::Inputs in = gaussian ? fp8::gaussian_inputs(shape, 41, false) : fa::random_inputs(shape, 41);
      const std::vector<double> reference = fa::reference_attention(in);
      const double fp16_error = rmse(fp8::fp16_attention(in), reference);
      for (const fp8::Fp8Options& o : schemes) {
        const std::vector<float> out = fp8::fp8_attention(in, o);
        const std::vector<double> bound = fp8_error_bound(in, o);
        int64_t beyond = 0;
        double worst_ratio = 0.0;
        for (size_t e = 0; e < out.size(); ++e) {
          const double error = std::fabs(out[e] - reference[e]);
          if (!(error <= bound[e])) ++beyond;  // a NaN counts
          if (bound[e] > 0) worst_ratio = std::max(worst_ratio, error / bound[e]);
        }
        INFO(fa::describe(shape) << (shape.causal ? " causal" : "") << (gaussian ? " Gaussian" : " uniform")
                                 << ", Q/K per " << (o.qk == fp8::QkScaling::per_block ? "block" : "tensor")
                                 << (o.rotate ? " rotated" : "") << ", P shift " << o.p_shift
                                 << ": largest error/bound " << worst_ratio);
        CHECK(beyond == 0);
        CHECK(rmse(out, reference) > 4 * fp16_error);  // e4m3 keeps 3 mantissa bits to FP16's 10
      }
    }
  }
}

TEST_CASE("stage14: the FP16 model is within the FP16 stages' tolerance") {
  // Against the reference on the FP16-rounded inputs, as the FP16 stages are checked (metrics.hpp).
  for (const bool causal : {false, true}) {
    fa::Inputs in = fa::random_inputs({1, 4, 2, 150, 260, 72, causal}, 5);
    const std::vector<float> out = fp8::fp16_attention(in);
    fa::round_to_precision(in, fa::Precision::fp16);
    const double bound = fa::logit_bound(in.q, in.k, in.problem.dim);
    const fa::ErrorReport errors =
        fa::compare(out, fa::reference_attention(in), fa::tolerance(fa::Precision::fp16, 1.0, bound));
    INFO(errors.summary());
    CHECK(errors.passed());
  }
}

TEST_CASE("stage14: rows that see no key output zeros") {
  const fa::Inputs in = fp8::gaussian_inputs({1, 1, 1, 300, 100, 64, true}, 9, false);  // rows 0-199 see none
  const std::vector<float> out = fp8::fp8_attention(in, {});
  CHECK(std::all_of(out.begin(), out.begin() + 200 * 64, [](float x) { return x == 0.0f; }));
  CHECK(std::any_of(out.begin() + 200 * 64, out.end(), [](float x) { return x != 0.0f; }));
}

TEST_CASE("stage14: on outlier inputs block scales with the rotation beat per-tensor scales") {
  // FlashAttention-3's inputs: N(0, 1) plus N(0, 100) on 0.1% of the entries. Per-tensor scales
  // without the rotation against block scales with it (the choice for V and P the same).
  for (const uint64_t seed : {14, 15}) {
    const fa::Inputs in = fp8::gaussian_inputs(fa::Problem::square(1, 1, 512, 128), seed, true);
    const std::vector<double> reference = fa::reference_attention(in);
    fp8::Fp8Options tensor;
    tensor.qk = fp8::QkScaling::per_tensor;
    tensor.rotate = false;
    const double per_tensor = rmse(fp8::fp8_attention(in, tensor), reference);
    const double rotated = rmse(fp8::fp8_attention(in, {}), reference);
    INFO("seed " << seed << ": per-tensor RMSE " << per_tensor << ", block scales + rotation " << rotated);
    CHECK(rotated < 0.8 * per_tensor);
  }
}
