#include "fp8_walkthrough.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <stdexcept>
#include <string>
#include <vector>

#include "fa/cli.hpp"
#include "fa/device.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/reference.hpp"
#include "fa/runner.hpp"
#include "fp8_attention.hpp"
#include "fp8_numerics.hpp"
#include "fp8_tolerance.hpp"

namespace fa::fp8 {
namespace {

// The kernel's choices (fp8_attention.hpp), so that the model computes what the kernel does.
Fp8Options kernel_options(bool rotate) {
  Fp8Options options;
  options.qk = QkScaling::per_block;
  options.rotate = rotate;
  options.v = VScaling::per_channel;
  options.p_shift = kProbabilityShift;
  options.l_from_quantized_p = kRowSumFromQuantizedP;
  return options;
}

// Each row of a (1, N, D) tensor beside the value its e4m3 codes hold (descale · e4m3). A rotated
// tensor is rotated back (H/sqrt(Dpad) is its own inverse), so the values read as the fixture's:
// what Q·Kᵀ effectively multiplies.
void print_quantized(std::ostream& out, const char* name, const std::vector<float>& values, const Quantized& codes,
                     int64_t dim, bool rotated) {
  out << "  " << name << (rotated ? " (rotated, quantized, rotated back)" : "") << ":\n";
  std::vector<float> row(static_cast<std::size_t>(codes.dim_padded));
  for (int64_t i = 0; i < codes.seq; ++i) {
    for (int64_t d = 0; d < codes.dim_padded; ++d) row[static_cast<std::size_t>(d)] = codes.value(0, i, d);
    if (rotated) hadamard_rotate(row.data(), codes.dim_padded);
    out << "    row " << i << ":";
    for (int64_t d = 0; d < dim; ++d) {
      out << "  " << std::setw(6) << values[static_cast<std::size_t>(i * dim + d)] << " -> " << std::setw(10)
          << row[static_cast<std::size_t>(d)];
    }
    out << "\n";
  }
}

// O of the fixture from the kernel (fp8_forward), in `precision`.
std::vector<float> kernel_output(const Inputs& inputs, Precision precision, bool rotate) {
  const Problem& problem = inputs.problem;
  const DeviceBuffer q = DeviceBuffer::from(encode(inputs.q, precision));
  const DeviceBuffer k = DeviceBuffer::from(encode(inputs.k, precision));
  const DeviceBuffer v = DeviceBuffer::from(encode(inputs.v, precision));
  DeviceBuffer o(static_cast<std::size_t>(problem.q_elements() * precision_bytes(precision)));
  const DeviceBuffer work(static_cast<std::size_t>(fp8_workspace_bytes(problem)));
  FA_CUDA_CHECK(cudaMemset(o.get(), 0xff, o.bytes()));  // NaN: an element the kernel skips shows
  ForwardArgs args;
  args.problem = problem;
  args.q = q.get();
  args.k = k.get();
  args.v = v.get();
  args.o = o.get();
  args.workspace = work.get();
  const Status status = fp8_forward(args, precision, ForwardOptions{rotate});
  if (!status.ok()) throw std::runtime_error("the kernel declined the walkthrough: " + status.reason());
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  return decode(o.to_vector<unsigned char>(), precision);
}

}  // namespace

int run_walkthrough(Precision precision, bool rotate, std::ostream& out) {
  Inputs inputs = walkthrough_inputs();
  round_to_precision(inputs, precision);
  const Problem& problem = inputs.problem;
  const int64_t dim = problem.dim;
  out << std::setprecision(6);
  out << "14_fp8: the N=" << problem.q_seq << ", D=" << dim << " walkthrough in FP8 (e4m3, 3 mantissa bits: "
      << "relative steps of 2^-4 to 2^-3), inputs and O in " << precision_name(precision) << ", rotation "
      << (rotate ? "on" : "off") << "\n"
      << "Each block of Q and K (128 rows) and each channel of V is scaled by 448/amax before rounding;\n"
      << "D = " << dim << " is padded with zeros to Dpad = " << pad_dim(dim) << ".\n\n"
      << "The inputs, and what their e4m3 codes hold:\n";
  const int64_t heads = problem.q_heads_total();
  print_quantized(out, "Q", inputs.q,
                  quantize_qk(inputs.q, heads, problem.q_seq, dim, kQueryBlock, QkScaling::per_block, rotate), dim,
                  rotate);
  print_quantized(out, "K", inputs.k,
                  quantize_qk(inputs.k, heads, problem.kv_seq, dim, kKeyBlock, QkScaling::per_block, rotate), dim,
                  rotate);
  print_quantized(out, "V", inputs.v, quantize_v(inputs.v, heads, problem.kv_seq, dim, VScaling::per_channel), dim,
                  false);

  const std::vector<double> exact = reference_attention(inputs);
  const std::vector<float> model = fp8_attention(inputs, kernel_options(rotate));
  double max_abs_v = 0.0;
  for (const float value : inputs.v) max_abs_v = std::max(max_abs_v, std::fabs(static_cast<double>(value)));

  const DeviceInfo device = query_device();
  const bool runs = device.present && device.compute_capability == 90;
  const std::vector<float> kernel = runs ? kernel_output(inputs, precision, rotate) : std::vector<float>{};

  out << "\nFinal O: exact (double), the CPU FP8 model" << (runs ? ", the kernel" : "") << "; the model's error\n";
  for (int64_t i = 0; i < problem.q_seq; ++i) {
    for (int64_t d = 0; d < dim; ++d) {
      const auto at = static_cast<std::size_t>(i * dim + d);
      out << "  O[" << i << "][" << d << "]  exact " << std::setw(10) << exact[at] << "  model " << std::setw(10)
          << model[at];
      if (runs) out << "  kernel " << std::setw(10) << kernel[at];
      out << "  model - exact " << std::setw(11) << model[at] - exact[at] << "\n";
    }
  }
  out << "(16-bit stages are within 2^-11 (FP16) or 2^-8 (BF16) of the exact O here; e4m3 allows up to 2·2^-4·max|V| = "
      << reference_tolerance(max_abs_v) << ")\n";

  if (!runs) {
    out << "\nThe kernel needs an H100 or H200 (sm_90): "
        << (device.present ? device.name + " is sm_" + std::to_string(device.compute_capability)
                           : describe_missing_gpu(device))
        << "; run --walkthrough there to see its O beside these\n";
    return kExitNoDevice;
  }
  const std::vector<double> model_double(model.begin(), model.end());
  const ErrorReport against_model = compare(kernel, model_double, model_tolerance(precision, max_abs_v));
  const ErrorReport against_exact = compare(kernel, exact, reference_tolerance(max_abs_v));
  const double relative_to_magnitude =
      error_relative_to(kernel, exact, reference_attention(with_absolute_values(inputs), nullptr));
  out << "\nthe kernel against the CPU FP8 model: " << against_model.summary() << "\n"
      << "the kernel against the exact O: " << against_exact.summary() << "; relative to P·|V| "
      << relative_to_magnitude << "\n";
  if (against_model.passed() && passes_reference(against_exact, relative_to_magnitude)) {
    out << "the kernel agrees with the CPU FP8 model and with the exact values, to e4m3's precision\n";
    return kExitOk;
  }
  out << "the kernel DISAGREES\n";
  return kExitWrong;
}

}  // namespace fa::fp8
