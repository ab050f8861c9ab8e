#include "fa/runner.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <new>
#include <sstream>
#include <stdexcept>

#include "fa/cli.hpp"
#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/device_buffer.hpp"
#include "fa/reference.hpp"
#include "fa/timing.hpp"

namespace fa {
namespace {

double max_abs(const std::vector<float>& values) {
  double largest = 0.0;
  for (float value : values) largest = std::max(largest, std::fabs(static_cast<double>(value)));
  return largest;
}

// The rows of O picked out of the whole output, in the order of `rows`.
std::vector<float> gather_rows(const std::vector<float>& output, const std::vector<int64_t>& rows, int64_t dim) {
  std::vector<float> picked;
  picked.reserve(rows.size() * static_cast<std::size_t>(dim));
  for (int64_t row : rows) {
    picked.insert(picked.end(), output.begin() + row * dim, output.begin() + (row + 1) * dim);
  }
  return picked;
}

// Where the stage's buffers live: device memory for CUDA stages, host memory for the CPU one.
class StageBuffers {
 public:
  StageBuffers(const StageDescriptor& stage, const Inputs& inputs, int64_t workspace, bool with_lse)
      : cuda_(stage.backend == Backend::cuda), precision_(stage.precision) {
    q_ = encode(inputs.q, precision_);
    k_ = encode(inputs.k, precision_);
    v_ = encode(inputs.v, precision_);
    o_.assign(q_.size(), 0xFF);  // all-ones bytes are NaN in FP32, FP16 and BF16: the poison
    if (with_lse) lse_.assign(static_cast<std::size_t>(inputs.problem.q_rows()), std::nanf(""));
    if (cuda_) {
      device_q_ = DeviceBuffer::from(q_);
      device_k_ = DeviceBuffer::from(k_);
      device_v_ = DeviceBuffer::from(v_);
      device_o_ = DeviceBuffer::from(o_);
      device_lse_ = DeviceBuffer::from(lse_);
      device_workspace_ = DeviceBuffer(static_cast<std::size_t>(workspace));
    } else {
      host_workspace_.resize(static_cast<std::size_t>(workspace));
    }
  }

  Status forward(const StageDescriptor& stage, const Problem& problem) {
    ForwardArgs args;
    args.problem = problem;
    if (cuda_) {
      args.q = device_q_.get();
      args.k = device_k_.get();
      args.v = device_v_.get();
      args.o = device_o_.get();
      args.lse = lse_.empty() ? nullptr : device_lse_.as<float>();
      args.workspace = device_workspace_.get();
    } else {
      args.q = q_.data();
      args.k = k_.data();
      args.v = v_.data();
      args.o = o_.data();
      args.lse = lse_.empty() ? nullptr : lse_.data();
      args.workspace = host_workspace_.empty() ? nullptr : host_workspace_.data();
    }
    return stage.forward(args);
  }

  std::vector<float> output() {
    if (cuda_) device_o_.download(o_.data(), o_.size());
    return decode(o_, precision_);
  }

  std::vector<float> lse() {
    if (cuda_ && !lse_.empty()) device_lse_.download(lse_.data(), lse_.size() * sizeof(float));
    return lse_;
  }

 private:
  bool cuda_;
  Precision precision_;
  std::vector<unsigned char> q_, k_, v_, o_, host_workspace_;
  std::vector<float> lse_;
  DeviceBuffer device_q_, device_k_, device_v_, device_o_, device_lse_, device_workspace_;
};

bool is_out_of_memory(cudaError_t code) { return code == cudaErrorMemoryAllocation; }

// A stage's Status as the runner's exception: a decline is "unsupported", not a CUDA error.
class Declined : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void require_ok(const Status& status) {
  if (status.code() == Status::Code::unsupported) throw Declined(status.reason());
  if (!status.ok()) throw CudaError(status.cuda_error(), status.reason());
}

std::vector<float> gather(const std::vector<float>& values, const std::vector<int64_t>& rows) {
  return gather_rows(values, rows, 1);
}

}  // namespace

RunOutcome run_stage(const StageDescriptor& stage, const RunOptions& options) {
  return run_stage_on(stage, random_inputs(options.problem, options.seed), options);
}

RunOutcome run_stage_on(const StageDescriptor& stage, Inputs inputs, const RunOptions& options, bool keep_output) {
  RunOutcome outcome;
  ResultRow& row = outcome.row;
  const Problem problem = inputs.problem;
  row.stage = stage.id;
  row.problem = problem;
  row.dtype = precision_name(stage.precision);
  row.source_hash = stage.source_hash;

  auto refuse = [&](const std::string& status, const std::string& note, int exit_code) {
    row.status = status;
    row.note = note;
    outcome.exit_code = exit_code;
    return outcome;
  };

  const DeviceInfo device = stage.backend == Backend::cuda ? query_device() : DeviceInfo{};
  row.gpu = stage.backend == Backend::cuda ? device.name : "cpu";
  // Everything a stage does not take is refused here, in one place, before any buffer exists.
  if (const std::string why = validate_problem(problem, stage.max_dim); !why.empty()) {
    return refuse(problem.dim > stage.max_dim ? "unsupported" : "error", why, kExitBadInput);
  }
  if (const std::string why = unsupported_reason(stage, problem, options.lse); !why.empty()) {
    return refuse("unsupported", why, kExitBadInput);
  }
  if (const std::string why = stage_unavailable_reason(stage, device); !why.empty()) {
    return refuse("unsupported", why, kExitNoDevice);
  }

  round_to_precision(inputs, stage.precision);
  const int64_t workspace = workspace_bytes(stage, problem);
  const int element_bytes = precision_bytes(stage.precision);
  const int64_t needed = minimum_bytes(problem, element_bytes, Pass::forward, options.lse) + workspace;
  row.peak_bytes = needed;

  try {
    int64_t free_before = 0;
    if (stage.backend == Backend::cuda) {
      free_before = device_memory().free_bytes;
      if (needed > free_before) {
        // The note starts with the free bytes as a plain integer (the memory notebook reads it).
        return refuse("oom",
                      std::to_string(free_before) + " bytes free (" + format_bytes(free_before) + "); needs " +
                          format_bytes(needed),
                      kExitOom);
      }
    }
    StageBuffers buffers(stage, inputs, workspace, options.lse);
    if (stage.backend == Backend::cuda) {
      // Cross-check the declared footprint against what the allocations really took (the
      // allocator rounds each buffer up to its page size, so allow a few MiB).
      const int64_t taken = free_before - device_memory().free_bytes;
      if (taken > needed + (int64_t{8} << 20)) row.note = "allocations took " + format_bytes(taken);
    }

    require_ok(buffers.forward(stage, problem));
    if (stage.backend == Backend::cuda) FA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> output = buffers.output();

    if (options.check) {
      const std::vector<int64_t> rows = rows_to_check(problem, options.check_rows, options.seed);
      std::vector<double> expected_lse;
      const std::vector<double> expected = reference_rows(inputs, rows, options.lse ? &expected_lse : nullptr);
      const double bound = logit_bound(inputs.q, inputs.k, problem.dim);
      outcome.errors = compare(gather_rows(output, rows, problem.dim), expected,
                               tolerance(stage.precision, max_abs(inputs.v), bound));
      outcome.checked = true;
      row.max_abs_err = outcome.errors.max_abs_err;
      row.rel_l2_err = outcome.errors.rel_l2_err;
      if (!outcome.errors.passed()) {
        row.status = "error";
        row.note = "wrong output: " + outcome.errors.summary();
        outcome.exit_code = kExitWrong;
      }
      if (options.lse) {
        outcome.lse_errors = compare_lse(gather(buffers.lse(), rows), expected_lse, lse_tolerance(bound));
        if (!outcome.lse_errors.passed()) {
          row.status = "error";
          row.note += std::string(row.note.empty() ? "" : "; ") + "wrong log-sum-exp: " + outcome.lse_errors.summary();
          outcome.exit_code = kExitWrong;
        }
      }
    }
    if (keep_output) outcome.output = output;

    if (options.time && options.reps > 0) {
      auto run_once = [&] { require_ok(buffers.forward(stage, problem)); };
      const Timing timing = stage.backend == Backend::cuda ? time_cuda(run_once, options.warmup, options.reps, nullptr)
                                                           : time_host(run_once, options.warmup, options.reps);
      row.ms_median = timing.ms_median;
      row.ms_min = timing.ms_min;
      row.tflops = attention_flops(problem) / (timing.ms_median * 1e-3) / 1e12;
      row.gbps = static_cast<double>(minimum_bytes(problem, element_bytes, Pass::forward, options.lse)) /
                 (timing.ms_median * 1e-3) / 1e9;
    }
  } catch (const Declined& declined) {
    return refuse("unsupported", std::string("stage ") + stage.id + " declined: " + declined.what(), kExitBadInput);
  } catch (const CudaError& error) {
    if (is_out_of_memory(error.code())) {
      cudaGetLastError();
      return refuse("oom", "needs " + format_bytes(needed) + "; allocation failed: " + error.what(), kExitOom);
    }
    return refuse("error", error.what(), kExitError);
  } catch (const std::bad_alloc&) {
    return refuse("oom", "needs " + format_bytes(needed) + " of host memory", kExitOom);
  }
  return outcome;
}

int stage_main(const StageDescriptor& stage, int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const ParseResult parsed = parse_command_line(stage.id, stage.max_dim, args);
  if (!parsed.ok) {
    (parsed.exit_code == kExitOk ? std::cout : std::cerr) << parsed.message << "\n";
    return parsed.exit_code;
  }
  const CommandLine& line = parsed.command_line;
  try {
    if (line.walkthrough) return run_walkthrough(stage, std::cout);
    // A problem the stage does not take is refused in one line, before anything runs.
    if (const std::string why = unsupported_reason(stage, line.run.problem, line.run.lse); !why.empty()) {
      std::cerr << why << "\n";
      return kExitBadInput;
    }
    std::cout << stage.id << ": " << stage.title << "\n"
              << describe(line.run.problem) << ", seed " << line.run.seed << "\n\n";
    RunOutcome outcome = run_stage(stage, line.run);
    print_table(std::cout, {outcome.row}, false);
    if (!line.csv_path.empty()) append_csv(line.csv_path, {outcome.row});
    if (outcome.exit_code != kExitOk) std::cerr << stage.id << ": " << outcome.row.note << "\n";
    return outcome.exit_code;
  } catch (const std::exception& error) {
    std::cerr << stage.id << ": " << error.what() << "\n";
    return kExitError;
  }
}

}  // namespace fa
