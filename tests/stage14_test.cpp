// Stage 14: FP8 (e4m3) attention on Hopper. The quantization pass against the CPU model of the
// numerics (fp8_numerics.hpp: codes and descales bit for bit), the forward pass against the double
// reference (tolerances from e4m3's unit roundoff, 2^-4) and, tighter, against the CPU model of the
// FP8 forward with the kernel's own choices; shapes with N not a multiple of 128, D not a bucket,
// causal, grouped-query heads, Nq != Nk; outputs poisoned with NaN first.
//
// Two cases need no GPU (the layout, and where the P register trick puts each key). Every GPU case
// reports skipped without an sm_90 device (a failure instead with FA_REQUIRE_GPU=1).
//
// Structural tests (tests/structural_tests.cmake): the PTX of fp8_attention.cu holds the e4m3
// wgmma, the TMA copies, setmaxnreg and the e4m3 conversion; ptxas spills nothing; its SASS issues
// both products as e4m3 QGMMA (no HGMMA) and runs the exponentials between the two waits.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "fa/device.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "fp8_attention.hpp"
#include "fp8_numerics.hpp"
#include "fp8_tolerance.hpp"
#include "gpu_contract.hpp"
#include "quantize.hpp"

namespace {

using namespace fa;

// Exactly sm_90 (the kernels are sm_90a): skipped elsewhere, or a failure with FA_REQUIRE_GPU=1.
void require_hopper() {
  test::require_cuda_device(90);
  const DeviceInfo device = query_device();
  if (device.compute_capability == 90) return;
  const char* required = std::getenv("FA_REQUIRE_GPU");
  const std::string why =
      "stage 14 needs sm_90 (H100/H200); this GPU is sm_" + std::to_string(device.compute_capability);
  if (required != nullptr && std::strcmp(required, "1") == 0) FAIL(why + " -- and FA_REQUIRE_GPU=1");
  test::skip(why);
}

Problem general(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t q_seq, int64_t kv_seq, int64_t dim,
                bool causal) {
  return {batch, q_heads, kv_heads, q_seq, kv_seq, dim, causal};
}

// The shapes: partial tiles everywhere, D off the buckets, GQA, Nq != Nk both ways, many pieces.
std::vector<Problem> forward_shapes() {
  std::vector<Problem> shapes;
  for (const bool causal : {false, true}) {
    shapes.push_back(general(1, 2, 2, 300, 300, 128, causal));
    shapes.push_back(general(2, 4, 2, 200, 333, 100, causal));  // GQA, Nq < Nk, D in the 128 bucket
    shapes.push_back(general(1, 3, 1, 333, 200, 64, causal));   // MQA, Nq > Nk (causal: rows with no key)
    shapes.push_back(general(1, 2, 2, 129, 257, 256, causal));
    shapes.push_back(general(1, 1, 1, 65, 17, 37, causal));  // D % 8 != 0: O element by element
    shapes.push_back(general(1, 2, 1, 1, 130, 1, causal));
  }
  // More pieces than an H100's or H200's 132 SMs: the persistent blocks' later pieces (256 each).
  shapes.push_back(general(8, 16, 16, 256, 256, 128, false));
  shapes.push_back(general(8, 16, 16, 384, 384, 64, false));
  return shapes;
}

struct Device {
  DeviceBuffer q, k, v;
};
Device upload(const Inputs& inputs, Precision precision) {
  return {DeviceBuffer::from(encode(inputs.q, precision)), DeviceBuffer::from(encode(inputs.k, precision)),
          DeviceBuffer::from(encode(inputs.v, precision))};
}

template <typename T>
std::vector<T> download(const void* device, int64_t count) {
  std::vector<T> host(static_cast<size_t>(count));
  FA_CUDA_CHECK(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// The place of an e4m3 code on the number line (sign and magnitude to one ordered integer), so
// that "one rounding step apart" is a difference of 1.
int ordinal(uint8_t code) { return code & 0x80 ? -(code & 0x7f) : code; }

// Runs the quantization pass and compares it with the CPU model; `max_steps` is the largest
// difference of codes allowed (0: bit for bit).
void check_quantization(const Problem& problem, Precision precision, bool rotate, int max_steps) {
  Inputs inputs = random_inputs(problem, 14);
  round_to_precision(inputs, precision);
  const Device device = upload(inputs, precision);
  const fp8::QuantizedLayout layout = fp8::quantized_layout(problem);
  DeviceBuffer workspace(static_cast<size_t>(layout.bytes));
  fp8::QuantizedInputs quantized;
  const Status status = fp8::quantize_inputs(problem, precision, device.q.get(), device.k.get(), device.v.get(), rotate,
                                             workspace.get(), &quantized, nullptr);
  INFO(describe(problem) << (rotate ? " rotated" : "") << ": " << status.reason());
  REQUIRE(status.ok());
  FA_CUDA_CHECK(cudaDeviceSynchronize());

  const int64_t dpad = layout.dim_padded;
  const auto q_model = fp8::quantize_qk(inputs.q, problem.q_heads_total(), problem.q_seq, problem.dim, fp8::kQueryBlock,
                                        fp8::QkScaling::per_block, rotate);
  const auto k_model = fp8::quantize_qk(inputs.k, problem.kv_heads_total(), problem.kv_seq, problem.dim, fp8::kKeyBlock,
                                        fp8::QkScaling::per_block, rotate);
  const auto v_model =
      fp8::quantize_v(inputs.v, problem.kv_heads_total(), problem.kv_seq, problem.dim, fp8::VScaling::per_channel);
  const auto codes_differ = [&](const std::vector<uint8_t>& gpu, const fp8::Quantized& model) {
    int worst = 0;
    for (size_t i = 0; i < gpu.size(); ++i)
      worst = std::max(worst, std::abs(ordinal(gpu[i]) - ordinal(model.codes[i])));
    return worst;
  };
  CHECK(codes_differ(download<uint8_t>(quantized.q, problem.q_rows() * dpad), q_model) <= max_steps);
  CHECK(codes_differ(download<uint8_t>(quantized.k, problem.kv_rows() * dpad), k_model) <= max_steps);
  const auto descales_match = [&](const float* gpu, const std::vector<float>& model) {
    const std::vector<float> host = download<float>(gpu, static_cast<int64_t>(model.size()));
    for (size_t i = 0; i < host.size(); ++i) {
      if (max_steps == 0 ? host[i] != model[i] : std::fabs(host[i] - model[i]) > 1e-6f * model[i]) return false;
    }
    return true;
  };
  CHECK(descales_match(quantized.q_descale, q_model.descales));
  CHECK(descales_match(quantized.k_descale, k_model.descales));
  CHECK(descales_match(quantized.v_descale, v_model.descales));

  // V_qᵀ: channel d's row holds key j at kernel_key_position(j); the keys past Nk are zero.
  const std::vector<uint8_t> v_gpu =
      download<uint8_t>(quantized.v_transposed, problem.kv_heads_total() * dpad * layout.kv_seq_padded);
  int64_t wrong = 0;
  for (int64_t head = 0; head < problem.kv_heads_total(); ++head) {
    for (int64_t d = 0; d < dpad; ++d) {
      const uint8_t* row = &v_gpu[(head * dpad + d) * layout.kv_seq_padded];
      for (int64_t j = 0; j < layout.kv_seq_padded; ++j) {
        const uint8_t expected = j < problem.kv_seq ? v_model.code(head, j, d) : 0;
        wrong += row[fp8::kernel_key_position(static_cast<int>(j))] != expected;
      }
    }
  }
  CHECK(wrong == 0);
}

std::vector<Problem> quantization_shapes() {
  // D off the buckets (rows read element by element: 100, 1; in 16-byte chunks with padding: 96)
  // and on them (64, 128, 256), partial scale blocks and V tiles.
  return {general(2, 3, 1, 200, 333, 100, false), general(1, 2, 2, 129, 17, 64, false),
          general(1, 2, 2, 300, 200, 128, false), general(2, 2, 1, 150, 97, 96, false),
          general(1, 1, 1, 300, 260, 256, false), general(1, 2, 1, 5, 3, 1, false)};
}

// The forward pass against the double reference and the CPU model; NaN-poisoned O and LSE.
void check_forward(const Problem& problem, Precision precision) {
  Inputs inputs = random_inputs(problem, 1400 + problem.dim);
  round_to_precision(inputs, precision);
  const Device device = upload(inputs, precision);
  DeviceBuffer o(static_cast<size_t>(problem.q_elements() * 2));
  DeviceBuffer lse(static_cast<size_t>(problem.q_rows() * sizeof(float)));
  DeviceBuffer workspace(static_cast<size_t>(fp8::fp8_workspace_bytes(problem)));
  FA_CUDA_CHECK(cudaMemset(o.get(), 0xff, o.bytes()));  // NaN in FP16, BF16 and FP32
  FA_CUDA_CHECK(cudaMemset(lse.get(), 0xff, lse.bytes()));
  ForwardArgs args;
  args.problem = problem;
  args.q = device.q.get();
  args.k = device.k.get();
  args.v = device.v.get();
  args.o = o.get();
  args.lse = lse.as<float>();
  args.workspace = workspace.get();
  const Status status = fp8::fp8_forward(args, precision);
  INFO(describe(problem) << (problem.causal ? " causal" : "") << " " << precision_name(precision) << ": "
                         << status.reason());
  REQUIRE(status.ok());
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> out = decode(o.to_vector<unsigned char>(), precision);
  const std::vector<float> out_lse = lse.to_vector<float>();

  std::vector<double> reference_lse;
  const std::vector<double> reference = reference_attention(inputs, &reference_lse);
  double max_v = 0.0;
  for (const float x : inputs.v) max_v = std::max(max_v, static_cast<double>(std::fabs(x)));
  // The tolerances, shared with bin/14_fp8, are derived in fp8_tolerance.hpp.
  const ErrorReport report = compare(out, reference, fp8::reference_tolerance(max_v));
  const double relative_to_magnitude =
      fp8::error_relative_to(out, reference, reference_attention(fp8::with_absolute_values(inputs), nullptr));
  INFO("against the double reference: " << report.summary() << "; relative to P·|V| " << relative_to_magnitude);
  CHECK(report.non_finite == 0);
  CHECK(report.passed());
  CHECK(relative_to_magnitude <= fp8::kReferenceRelL2);
  const ErrorReport lse_report = compare_lse(out_lse, reference_lse, fp8::kLseTolerance);
  INFO("LSE: " << lse_report.summary());
  CHECK(lse_report.passed());

  // The CPU model with the kernel's choices (fp8_tolerance.hpp, model_tolerance).
  fp8::Fp8Options options;
  options.qk = fp8::QkScaling::per_block;
  options.rotate = true;
  options.v = fp8::VScaling::per_channel;
  options.p_shift = fp8::kProbabilityShift;
  options.l_from_quantized_p = fp8::kRowSumFromQuantizedP;
  const std::vector<float> model = fp8::fp8_attention(inputs, options);
  const std::vector<double> model_double(model.begin(), model.end());
  const ErrorReport model_report = compare(out, model_double, fp8::model_tolerance(precision, max_v));
  INFO("against the CPU FP8 model: " << model_report.summary());
  CHECK(model_report.passed());
}

}  // namespace

TEST_CASE("stage14: the workspace layout holds every tensor, 256-byte aligned (no GPU)") {
  const Problem problem = general(2, 4, 2, 200, 333, 100, true);
  const fp8::QuantizedLayout layout = fp8::quantized_layout(problem);
  CHECK(layout.dim_padded == 128);
  CHECK(layout.kv_seq_padded == 336);
  CHECK(layout.q_blocks == 2);
  CHECK(layout.k_blocks == 6);  // ⌈333 / 64⌉
  for (const int64_t offset : {layout.q_offset, layout.k_offset, layout.v_offset, layout.q_descale_offset,
                               layout.k_descale_offset, layout.v_descale_offset, layout.v_amax_offset}) {
    CHECK(offset % 256 == 0);
  }
  CHECK(layout.k_offset >= layout.q_offset + problem.q_rows() * 128);
  CHECK(layout.v_offset >= layout.k_offset + problem.kv_rows() * 128);
  CHECK(layout.bytes >= layout.v_amax_offset + problem.kv_heads_total() * 128 * 4);
  CHECK(fp8::fp8_workspace_bytes(problem) == layout.bytes);
}

TEST_CASE("stage14: V's key permutation puts P's accumulator keys where the 8-bit A operand reads them (no GPU)") {
  // Thread quad q packs, per 32-key step, register r (r / 2: keys 0-15 or 16-31 of the step) from
  // accumulator tiles 2(r/2) and 2(r/2) + 1, elements e = 0, 1 of each: keys 8·tile + 2q + e. The A
  // operand reads byte b of that register as key 16·(r/2) + 4q + b of V_qᵀ's row.
  for (int q = 0; q < 4; ++q) {
    for (int half = 0; half < 2; ++half) {
      for (int b = 0; b < 4; ++b) {
        const int key = 8 * (2 * half + b / 2) + 2 * q + b % 2;
        CHECK(fp8::kernel_key_position(key) == 16 * half + 4 * q + b);
      }
    }
  }
  std::vector<int> seen(64, 0);
  for (int key = 0; key < 64; ++key) ++seen[static_cast<size_t>(fp8::kernel_key_position(key))];
  CHECK(std::count(seen.begin(), seen.end(), 1) == 64);  // a permutation, within each group of 16
}

TEST_CASE("stage14: fp8_forward_quantized refuses null tensors in one line (no GPU)") {
  const Status status = fp8::fp8_forward_quantized(general(1, 1, 1, 16, 16, 64, false), fp8::QuantizedInputs{},
                                                   Precision::fp16, nullptr, nullptr, nullptr);
  CHECK(status.code() == Status::Code::unsupported);
  CHECK(status.reason().find("null") != std::string::npos);
}

TEST_CASE("stage14: quantization equals the CPU model bit for bit (codes and descales, unrotated)") {
  require_hopper();
  for (const Precision precision : {Precision::fp16, Precision::bf16}) {
    for (const Problem& problem : quantization_shapes()) check_quantization(problem, precision, false, 0);
  }
}

TEST_CASE("stage14: rotated quantization is within one e4m3 step of the CPU model") {
  require_hopper();
  for (const Precision precision : {Precision::fp16, Precision::bf16}) {
    for (const Problem& problem : quantization_shapes()) check_quantization(problem, precision, true, 1);
  }
}

TEST_CASE("stage14: the FP8 forward matches the reference and the CPU FP8 model (causal, GQA, Nq != Nk, any D)") {
  require_hopper();
  for (const Precision precision : {Precision::fp16, Precision::bf16}) {
    for (const Problem& problem : forward_shapes()) check_forward(problem, precision);
  }
}
