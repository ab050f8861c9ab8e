// bin/14_fp8: stage 14's command line. Stage 14 is no stage of the registry (the harness judges a
// stage by the tolerance of its 16-bit precision, and e4m3's is 2^-4), so this is its own main; it
// takes the harness's flags with their meanings (common's parser, so scripts/gpu_suite.sh calls it
// as any stage), refuses what the harness refuses with its exit codes, and reuses the harness's
// inputs, double reference, metrics, timing and CSV rows. What differs: the check is stage 14's
// (fp8_tolerance.hpp, the tests' own), and a timed run times three things, each a results row:
//
//   14_fp8            quantize+attention, the call a user makes (fp8_forward)
//   14_fp8/attention  the attention kernel alone, on the tensors already quantized
//   14_fp8/quantize   the quantization pass alone
//
// with /bf16 after 14_fp8 for BF16 inputs and output (DESIGN.md, "Results CSV"): the stage column
// tells the three apart, since the note is no part of a row's key.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "fa/cli.hpp"
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/reference.hpp"
#include "fa/report.hpp"
#include "fa/runner.hpp"
#include "fa/timing.hpp"
#include "fa_source_hash.h"
#include "fp8_attention.hpp"
#include "fp8_tolerance.hpp"
#include "fp8_walkthrough.hpp"

namespace {

using namespace fa;

constexpr const char* kProgram = "14_fp8";
constexpr int64_t kMaxDim = 256;

const char* kDescription =
    "Stage 14: FP8 (e4m3) attention on Hopper (sm_90a: H100, H200). Quantizes FP16 or BF16 Q, K, V to e4m3 "
    "with block scales, runs the FP8 wgmma kernel, checks O against the double CPU reference with the FP8 "
    "tolerance of the stage's tests (2·2^-4·max|V| per element, the L2 error within 2^-3 of P·|V|'s), and times the "
    "quantization pass alone, the attention kernel alone on the quantized tensors, and both (the call a user "
    "makes): one results row each (stages 14_fp8/quantize, 14_fp8/attention, 14_fp8).";

const char* kFooter =
    "Stage 14's own options:\n"
    "  --precision fp16|bf16       Q, K, V and O in FP16 (default) or BF16; BF16 rows are 14_fp8/bf16...\n"
    "  --rotate, --no-rotate       the Hadamard rotation of Q and K before quantization (default: on; the\n"
    "                              README's accuracy table: half the error on inputs with outliers, at\n"
    "                              Dpad·log2(Dpad) adds per row in the quantization pass). Rows of\n"
    "                              --no-rotate say so in their note.\n"
    "  --walkthrough               here: the N=4 fixture through e4m3 (one tile of all 4 keys), O beside the\n"
    "                              exact one and the CPU FP8 model's; without an H100 or H200, the model's only.\n\n"
    "Exit codes: 0 ok, 1 wrong output, 2 bad command line or a problem the stage does not take, 3 out of memory, "
    "4 no CUDA GPU here or one other than sm_90 (H100, H200), 5 CUDA error.";

struct Fp8Line {
  CommandLine line;
  Precision precision = Precision::fp16;
  bool rotate = true;
};

// Stage 14's options come off the command line first (CLI11 keeps the rest, in order); the rest goes
// to common's parser, which prints the whole --help text (with kFooter) and judges every shared flag.
ParseResult parse(const std::vector<std::string>& args, Fp8Line& out) {
  CLI::App own{"", kProgram};
  own.set_help_flag();  // --help is common's
  own.allow_extras();
  std::string precision = "fp16";
  own.add_option("--precision", precision)->check(CLI::IsMember({"fp16", "bf16"}));
  own.add_flag("--rotate,!--no-rotate", out.rotate);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes from the back
  try {
    own.parse(reversed);
  } catch (const CLI::ParseError& error) {
    ParseResult bad;
    bad.exit_code = kExitBadInput;
    bad.message = std::string(kProgram) + ": " + error.what() + " (see --help)";
    return bad;
  }
  out.precision = precision == "bf16" ? Precision::bf16 : Precision::fp16;
  ParseResult parsed = parse_command_line(kProgram, kMaxDim, own.remaining(), CommandLine{}, kDescription, kFooter);
  out.line = parsed.command_line;
  return parsed;
}

// What the harness knows of a stage, for its checks that need no kernel: the shape limits and
// features (unsupported_reason), the GPU (stage_unavailable_reason), host memory (host_bytes_needed).
// No forward function: this descriptor never reaches the runner, whose tolerance is 16-bit.
StageDescriptor descriptor(Precision precision) {
  StageDescriptor stage;
  stage.id = precision == Precision::bf16 ? "14_fp8/bf16" : "14_fp8";
  stage.title = "FP8 (e4m3) attention on Hopper: block scales, a Hadamard rotation, P in e4m3";
  stage.backend = Backend::cuda;
  stage.precision = precision;
  stage.max_dim = kMaxDim;
  stage.architecture = {90, true};
  stage.features.causal = true;
  stage.features.grouped = true;
  stage.features.rectangular = true;
  stage.features.lse = true;
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

// A stage call that did not finish: declined (unsupported) or failed.
struct Refusal {
  std::string status;
  std::string note;
  int exit_code;
};

void require_ok(const Status& status) {
  if (status.code() == Status::Code::unsupported) throw Refusal{"unsupported", status.reason(), kExitBadInput};
  if (!status.ok()) throw CudaError(status.cuda_error(), status.reason());
}

template <typename T>
std::vector<T> gather(const std::vector<T>& values, const std::vector<int64_t>& rows, int64_t width) {
  std::vector<T> picked;
  picked.reserve(rows.size() * static_cast<std::size_t>(width));
  for (const int64_t row : rows)
    picked.insert(picked.end(), values.begin() + row * width, values.begin() + (row + 1) * width);
  return picked;
}

double max_abs(const std::vector<float>& values) {
  double largest = 0.0;
  for (const float value : values) largest = std::max(largest, std::fabs(static_cast<double>(value)));
  return largest;
}

// O (and the LSE) of the checked run on the sampled rows against the double reference; a failure
// marks `row` and returns kExitWrong.
int check(const Inputs& inputs, const std::vector<float>& output, const std::vector<float>& lse,
          const RunOptions& options, ResultRow& row) {
  const Problem& problem = inputs.problem;
  const std::vector<int64_t> rows = rows_to_check(problem, options.check_rows, options.seed);
  std::vector<double> expected_lse;
  const std::vector<double> expected = reference_rows(inputs, rows, options.lse ? &expected_lse : nullptr);
  const ErrorReport errors =
      compare(gather(output, rows, problem.dim), expected, fp8::reference_tolerance(max_abs(inputs.v)));
  const double relative_to_magnitude = fp8::error_relative_to(
      gather(output, rows, problem.dim), expected, reference_rows(fp8::with_absolute_values(inputs), rows, nullptr));
  row.max_abs_err = errors.max_abs_err;
  row.rel_l2_err = errors.rel_l2_err;
  std::cout << "checked " << rows.size() << " rows against the double reference: " << errors.summary()
            << "; relative to P·|V| " << relative_to_magnitude << " (at most " << fp8::kReferenceRelL2 << ")\n";
  int exit_code = kExitOk;
  if (!fp8::passes_reference(errors, relative_to_magnitude)) {
    row.status = "error";
    row.note = "wrong output: " + errors.summary() + "; relative to P·|V| " + std::to_string(relative_to_magnitude);
    exit_code = kExitWrong;
  }
  if (options.lse) {
    const ErrorReport lse_errors = compare_lse(gather(lse, rows, 1), expected_lse, fp8::kLseTolerance);
    std::cout << "log-sum-exp: " << lse_errors.summary() << "\n";
    if (!lse_errors.passed()) {
      row.status = "error";
      row.note += std::string(row.note.empty() ? "" : "; ") + "wrong log-sum-exp: " + lse_errors.summary();
      exit_code = kExitWrong;
    }
  }
  return exit_code;
}

// The user's call checked once (O and the LSE poisoned with NaN first), then, with --reps, the three
// timings. Returns the rows (one without timing, three with) and sets `exit_code`.
std::vector<ResultRow> measure(const StageDescriptor& stage, const Fp8Line& fp8, const ResultRow& base,
                               int& exit_code) {
  const RunOptions& options = fp8.line.run;
  const Problem& problem = options.problem;
  const Precision precision = fp8.precision;
  ResultRow user = base;
  user.note = std::string("quantize+attention") + (fp8.rotate ? "" : "; no rotation");
  const int64_t workspace = fp8::fp8_workspace_bytes(problem);
  user.peak_bytes = minimum_bytes(problem, precision_bytes(precision), Pass::forward, options.lse) + workspace;
  if (const int64_t free_bytes = device_memory().free_bytes; user.peak_bytes > free_bytes) {
    user.status = "oom";
    // The note starts with the free bytes as a plain integer, as the runner's (the memory notebook reads it).
    user.note = std::to_string(free_bytes) + " bytes free (" + format_bytes(free_bytes) + "); needs " +
                format_bytes(user.peak_bytes);
    exit_code = kExitOom;
    return {user};
  }

  Inputs inputs = random_inputs(problem, options.seed);
  round_to_precision(inputs, precision);
  const DeviceBuffer q = DeviceBuffer::from(encode(inputs.q, precision));
  const DeviceBuffer k = DeviceBuffer::from(encode(inputs.k, precision));
  const DeviceBuffer v = DeviceBuffer::from(encode(inputs.v, precision));
  DeviceBuffer o(static_cast<std::size_t>(problem.q_elements() * precision_bytes(precision)));
  DeviceBuffer lse(options.lse ? static_cast<std::size_t>(problem.q_rows()) * sizeof(float) : 0);
  const DeviceBuffer work(static_cast<std::size_t>(workspace));
  FA_CUDA_CHECK(cudaMemset(o.get(), 0xff, o.bytes()));  // all-ones bytes: NaN in FP16, BF16 and FP32
  if (options.lse) FA_CUDA_CHECK(cudaMemset(lse.get(), 0xff, lse.bytes()));

  ForwardArgs args;
  args.problem = problem;
  args.q = q.get();
  args.k = k.get();
  args.v = v.get();
  args.o = o.get();
  args.lse = options.lse ? lse.as<float>() : nullptr;
  args.workspace = work.get();
  const fp8::ForwardOptions forward_options{fp8.rotate};
  require_ok(fp8::fp8_forward(args, precision, forward_options));
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  if (options.check) {
    exit_code = check(inputs, decode(o.to_vector<unsigned char>(), precision),
                      options.lse ? lse.to_vector<float>() : std::vector<float>{}, options, user);
  }
  if (!options.time) return {user};

  // The quantized tensors of the checked call, remade in the same workspace, for the kernel alone.
  fp8::QuantizedInputs quantized;
  const auto quantize = [&] {
    require_ok(fp8::quantize_inputs(problem, precision, args.q, args.k, args.v, fp8.rotate, args.workspace, &quantized,
                                    args.stream));
  };
  quantize();
  FA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto attention = [&] {
    require_ok(fp8::fp8_forward_quantized(problem, quantized, precision, args.o, args.lse, args.stream));
  };
  const auto both = [&] { require_ok(fp8::fp8_forward(args, precision, forward_options)); };

  const auto timed = [&](ResultRow row, const std::function<void()>& run, bool counts_flops) {
    const Timing timing = time_cuda(run, options.warmup, options.reps, args.stream);
    row.ms_median = timing.ms_median;
    row.ms_min = timing.ms_min;
    row.tflops = counts_flops ? attention_flops(problem) / (timing.ms_median * 1e-3) / 1e12 : 0.0;
    row.gbps = static_cast<double>(minimum_bytes(problem, precision_bytes(precision), Pass::forward, options.lse)) /
               (timing.ms_median * 1e-3) / 1e9;
    return row;
  };
  const std::string suffix = fp8.rotate ? "" : "; no rotation";
  ResultRow kernel = user;
  kernel.stage = std::string(stage.id) + "/attention";
  kernel.note = (user.status == "ok" ? std::string("attention alone, on the quantized tensors") : user.note) + suffix;
  ResultRow pass = base;
  pass.stage = std::string(stage.id) + "/quantize";
  pass.peak_bytes = user.peak_bytes;
  pass.note = "quantize alone (no attention FLOPs: tflops 0)" + suffix;
  return {timed(user, both, true), timed(kernel, attention, true), timed(pass, quantize, false)};
}

// The row a run that never started leaves in the CSV (the harness writes one too).
void refuse_row(const CommandLine& line, ResultRow row, const std::string& status, const std::string& note) {
  if (line.csv_path.empty()) return;
  row.status = status;
  row.note = note;
  append_csv(line.csv_path, {row});
}

int run(const Fp8Line& fp8) {
  const CommandLine& line = fp8.line;
  const RunOptions& options = line.run;
  const StageDescriptor stage = descriptor(fp8.precision);
  if (line.walkthrough) return fp8::run_walkthrough(fp8.precision, fp8.rotate, std::cout);
  if (const std::string why = unsupported_reason(stage, options.problem, options.lse, options.pass); !why.empty()) {
    std::cerr << why << "\n";
    return kExitBadInput;
  }
  const DeviceInfo device = query_device();
  ResultRow base;
  base.stage = stage.id;
  base.gpu = device.name;
  base.problem = options.problem;
  base.dtype = precision_name(fp8.precision);
  base.source_hash = stage.source_hash;
  if (const std::string why = stage_unavailable_reason(stage, device); !why.empty()) {
    refuse_row(line, base, "unsupported", why);
    std::cerr << kProgram << ": "
              << (device.present ? why + " (the FP8 wgmma kernels are sm_90a: H100 or H200)"
                                 : "this stage runs on an H100 or H200 (sm_90), and there is no CUDA GPU here: " +
                                       describe_missing_gpu(device) +
                                       " (--walkthrough shows the CPU FP8 model on the N = 4 fixture)")
              << "\n";
    return kExitNoDevice;
  }
  if (const int64_t needed = host_bytes_needed(stage, options.problem, options.lse), available = available_host_bytes();
      available > 0 && needed > available) {
    const std::string note = "needs " + format_bytes(needed) + " of host memory for its inputs and output; " +
                             format_bytes(available) + " available";
    refuse_row(line, base, "oom", note);
    std::cerr << kProgram << ": " << describe(options.problem) << " " << note << "\n";
    return kExitOom;
  }
  std::cout << kProgram << ": " << stage.title << "\n"
            << describe(options.problem) << ", seed " << options.seed << ", " << precision_name(fp8.precision)
            << " in and out, rotation " << (fp8.rotate ? "on" : "off") << "\n\n";
  int exit_code = kExitOk;
  std::vector<ResultRow> rows;
  try {
    rows = measure(stage, fp8, base, exit_code);
  } catch (const Refusal& refusal) {
    ResultRow row = base;
    row.status = refusal.status;
    row.note = std::string("stage ") + stage.id + " declined: " + refusal.note;
    rows = {row};
    exit_code = refusal.exit_code;
  } catch (const CudaError& error) {
    const bool oom = error.code() == cudaErrorMemoryAllocation;
    cudaGetLastError();
    ResultRow row = base;
    row.status = oom ? "oom" : "error";
    row.note = error.what();
    rows = {row};
    exit_code = oom ? kExitOom : kExitError;
  } catch (const std::bad_alloc&) {
    ResultRow row = base;
    row.status = "oom";
    row.note = "host memory allocation failed";
    rows = {row};
    exit_code = kExitOom;
  }
  print_table(std::cout, rows, false);
  if (!line.csv_path.empty()) append_csv(line.csv_path, rows);
  if (exit_code != kExitOk) std::cerr << kProgram << ": " << rows.front().note << "\n";
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  Fp8Line fp8;
  const ParseResult parsed = parse(std::vector<std::string>(argv + 1, argv + argc), fp8);
  if (!parsed.ok) {
    (parsed.exit_code == kExitOk ? std::cout : std::cerr) << parsed.message << "\n";
    return parsed.exit_code;
  }
  try {
    return run(fp8);
  } catch (const std::exception& error) {
    std::cerr << kProgram << ": " << error.what() << "\n";
    return kExitError;
  }
}
