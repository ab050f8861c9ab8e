#include "fa/runner.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <new>
#include <sstream>

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
  StageBuffers(const StageDescriptor& stage, const Inputs& inputs, int64_t workspace)
      : cuda_(stage.backend == Backend::cuda), precision_(stage.precision) {
    q_ = encode(inputs.q, precision_);
    k_ = encode(inputs.k, precision_);
    v_ = encode(inputs.v, precision_);
    o_.assign(q_.size(), 0xFF);  // all-ones bytes are NaN in FP32, FP16 and BF16: the poison
    if (cuda_) {
      device_q_ = DeviceBuffer(q_.size());
      device_k_ = DeviceBuffer(k_.size());
      device_v_ = DeviceBuffer(v_.size());
      device_o_ = DeviceBuffer(o_.size());
      device_workspace_ = DeviceBuffer(static_cast<std::size_t>(workspace));
      device_q_.upload(q_.data(), q_.size());
      device_k_.upload(k_.data(), k_.size());
      device_v_.upload(v_.data(), v_.size());
      FA_CUDA_CHECK(cudaMemset(device_o_.get(), 0xFF, o_.size()));
    } else {
      host_workspace_.resize(static_cast<std::size_t>(workspace));
    }
  }

  cudaError_t forward(const StageDescriptor& stage, const Shape& shape) {
    if (cuda_) {
      return stage.forward(shape, device_q_.get(), device_k_.get(), device_v_.get(), device_o_.get(),
                           device_workspace_.get(), nullptr);
    }
    return stage.forward(shape, q_.data(), k_.data(), v_.data(), o_.data(),
                         host_workspace_.empty() ? nullptr : host_workspace_.data(), nullptr);
  }

  std::vector<float> output() {
    if (cuda_) device_o_.download(o_.data(), o_.size());
    return decode(o_, precision_);
  }

 private:
  bool cuda_;
  Precision precision_;
  std::vector<unsigned char> q_, k_, v_, o_, host_workspace_;
  DeviceBuffer device_q_, device_k_, device_v_, device_o_, device_workspace_;
};

bool is_out_of_memory(cudaError_t code) { return code == cudaErrorMemoryAllocation; }

}  // namespace

RunOutcome run_stage(const StageDescriptor& stage, const RunOptions& options) {
  return run_stage_on(stage, random_inputs(options.shape, options.seed), options);
}

RunOutcome run_stage_on(const StageDescriptor& stage, Inputs inputs, const RunOptions& options, bool keep_output) {
  RunOutcome outcome;
  ResultRow& row = outcome.row;
  const Shape shape = inputs.shape;
  row.stage = stage.id;
  row.shape = shape;
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
  if (const std::string why = validate_shape(shape, stage.max_dim); !why.empty()) {
    return refuse(shape.dim > stage.max_dim ? "unsupported" : "error", why, kExitBadInput);
  }
  if (shape.causal && !stage.supports_causal) {
    return refuse("unsupported", std::string("stage ") + stage.id + " has no causal masking yet", kExitBadInput);
  }
  if (const std::string why = stage_unavailable_reason(stage, device); !why.empty()) {
    return refuse("unsupported", why, kExitNoDevice);
  }

  round_to_precision(inputs, stage.precision);
  const int64_t workspace = workspace_bytes(stage, shape);
  const int64_t needed = minimum_bytes(shape, precision_bytes(stage.precision)) + workspace;
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
    StageBuffers buffers(stage, inputs, workspace);
    if (stage.backend == Backend::cuda) {
      // Cross-check the declared footprint against what the allocations really took (the
      // allocator rounds each buffer up to its page size, so allow a few MiB).
      const int64_t taken = free_before - device_memory().free_bytes;
      if (taken > needed + (int64_t{8} << 20)) row.note = "allocations took " + format_bytes(taken);
    }

    FA_CUDA_CHECK(buffers.forward(stage, shape));
    if (stage.backend == Backend::cuda) FA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> output = buffers.output();

    if (options.check) {
      const std::vector<int64_t> rows = rows_to_check(shape, options.check_rows, options.seed);
      const std::vector<double> expected = reference_rows(inputs, rows);
      outcome.errors =
          compare(gather_rows(output, rows, shape.dim), expected,
                  tolerance(stage.precision, max_abs(inputs.v), logit_bound(inputs.q, inputs.k, shape.dim)));
      outcome.checked = true;
      row.max_abs_err = outcome.errors.max_abs_err;
      row.rel_l2_err = outcome.errors.rel_l2_err;
      if (!outcome.errors.passed()) {
        row.status = "error";
        row.note = "wrong output: " + outcome.errors.summary();
        outcome.exit_code = kExitWrong;
      }
    }
    if (keep_output) outcome.output = output;

    if (options.time && options.reps > 0) {
      auto run_once = [&] { FA_CUDA_CHECK(buffers.forward(stage, shape)); };
      const Timing timing = stage.backend == Backend::cuda ? time_cuda(run_once, options.warmup, options.reps, nullptr)
                                                           : time_host(run_once, options.warmup, options.reps);
      row.ms_median = timing.ms_median;
      row.ms_min = timing.ms_min;
      row.tflops = attention_flops(shape) / (timing.ms_median * 1e-3) / 1e12;
      row.gbps =
          static_cast<double>(minimum_bytes(shape, precision_bytes(stage.precision))) / (timing.ms_median * 1e-3) / 1e9;
    }
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
    std::cout << stage.id << ": " << stage.title << "\n"
              << describe(line.run.shape) << ", seed " << line.run.seed << "\n\n";
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
