#include "fa/runner.hpp"

#include <cuda_runtime_api.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <new>
#include <sstream>
#include <stdexcept>
#include <utility>

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

// The backward pass needs the forward's log-sum-exp whether or not --lse asked for it.
bool wants_lse(const RunOptions& options) { return options.lse || options.pass == Pass::backward; }

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

// One tensor of the backward pass, as the bytes of the stage's precision: in device memory for a
// CUDA stage, in host memory for the CPU one.
class StageTensor {
 public:
  StageTensor(bool cuda, std::vector<unsigned char> bytes) : cuda_(cuda), host_(std::move(bytes)) {
    if (cuda_) device_ = DeviceBuffer::from(host_);
  }
  // Scratch of `bytes` that nobody reads before the stage writes it (the workspace): not uploaded.
  StageTensor(bool cuda, int64_t bytes) : cuda_(cuda) {
    if (cuda_) {
      device_ = DeviceBuffer(static_cast<std::size_t>(bytes));
    } else {
      host_.resize(static_cast<std::size_t>(bytes));
    }
  }
  void* get() { return cuda_ ? device_.get() : static_cast<void*>(host_.data()); }
  const std::vector<unsigned char>& download() {
    if (cuda_) device_.download(host_.data(), host_.size());
    return host_;
  }

 private:
  bool cuda_;
  std::vector<unsigned char> host_;
  DeviceBuffer device_;
};

std::vector<unsigned char> poison_bytes(int64_t elements, int element_bytes) {
  return std::vector<unsigned char>(static_cast<std::size_t>(elements * element_bytes), 0xFF);  // NaN in every type
}

// The whole-group blocks of a gradient that the reference computed: `block` elements per K/V head
// listed, starting at head · block (dK, dV) or at the group's first query head (dQ).
std::vector<float> gather_blocks(const std::vector<float>& values, const std::vector<int64_t>& kv_heads,
                                 int64_t block) {
  std::vector<float> picked;
  picked.reserve(kv_heads.size() * static_cast<std::size_t>(block));
  for (int64_t head : kv_heads) {
    picked.insert(picked.end(), values.begin() + head * block, values.begin() + (head + 1) * block);
  }
  return picked;
}

// The backward pass of run_stage_on: the stage's own forward writes O and the LSE, its backward
// turns dO into dQ, dK and dV (each poisoned first), checked on whole (batch, K/V head) groups and
// timed alone.
void run_backward(const StageDescriptor& stage, const Inputs& inputs, const RunOptions& options, int64_t workspace,
                  RunOutcome& outcome) {
  const Problem& problem = inputs.problem;
  const bool cuda = stage.backend == Backend::cuda;
  const Precision precision = stage.precision;
  const int element_bytes = precision_bytes(precision);
  std::vector<float> grad_o = random_output_gradient(problem, options.seed);
  round_to_precision(grad_o, precision);
  const std::vector<float> nan_lse(static_cast<std::size_t>(problem.q_rows()), std::nanf(""));
  StageTensor q(cuda, encode(inputs.q, precision));
  StageTensor k(cuda, encode(inputs.k, precision));
  StageTensor v(cuda, encode(inputs.v, precision));
  StageTensor o(cuda, poison_bytes(problem.q_elements(), element_bytes));
  StageTensor grad_out(cuda, encode(grad_o, precision));
  StageTensor lse(cuda, encode(nan_lse, Precision::fp32));
  StageTensor grad_q(cuda, poison_bytes(problem.q_elements(), element_bytes));
  StageTensor grad_k(cuda, poison_bytes(problem.kv_elements(), element_bytes));
  StageTensor grad_v(cuda, poison_bytes(problem.kv_elements(), element_bytes));
  StageTensor work(cuda, workspace);

  ForwardArgs forward_args;
  forward_args.problem = problem;
  forward_args.q = q.get();
  forward_args.k = k.get();
  forward_args.v = v.get();
  forward_args.o = o.get();
  forward_args.lse = static_cast<float*>(lse.get());
  forward_args.workspace = work.get();
  require_ok(stage.forward(forward_args));

  BackwardArgs args;
  args.problem = problem;
  args.q = q.get();
  args.k = k.get();
  args.v = v.get();
  args.o = o.get();
  args.grad_o = grad_out.get();
  args.lse = static_cast<const float*>(lse.get());
  args.grad_q = grad_q.get();
  args.grad_k = grad_k.get();
  args.grad_v = grad_v.get();
  args.workspace = work.get();
  require_ok(stage.backward(args));
  if (cuda) FA_CUDA_CHECK(cudaDeviceSynchronize());

  ResultRow& row = outcome.row;
  if (options.check) {
    const std::vector<int64_t> heads = kv_heads_to_check(problem, options.check_kv_heads, options.seed);
    const GradientReference expected = reference_backward(inputs, grad_o, heads);
    const double unit = gradient_tolerance_unit(precision, logit_bound(inputs.q, inputs.k, problem.dim));
    const int64_t group_q_block = problem.group_size() * problem.q_seq * problem.dim;
    const int64_t kv_block = problem.kv_seq * problem.dim;
    outcome.grad_q_errors = compare_gradient(gather_blocks(decode(grad_q.download(), precision), heads, group_q_block),
                                             expected.dq, expected.dq_bound, unit);
    outcome.grad_k_errors = compare_gradient(gather_blocks(decode(grad_k.download(), precision), heads, kv_block),
                                             expected.dk, expected.dk_bound, unit);
    outcome.grad_v_errors = compare_gradient(gather_blocks(decode(grad_v.download(), precision), heads, kv_block),
                                             expected.dv, expected.dv_bound, unit);
    outcome.checked = true;
    for (const auto& [name, errors] : {std::pair<const char*, const ErrorReport*>{"dQ", &outcome.grad_q_errors},
                                       {"dK", &outcome.grad_k_errors},
                                       {"dV", &outcome.grad_v_errors}}) {
      row.max_abs_err = std::max(row.max_abs_err, errors->max_abs_err);
      row.rel_l2_err = std::max(row.rel_l2_err, errors->rel_l2_err);
      if (!errors->passed()) {
        row.status = "error";
        row.note += std::string(row.note.empty() ? "" : "; ") + "wrong " + name + ": " + errors->summary();
        outcome.exit_code = kExitWrong;
      }
    }
  }

  if (options.time && options.reps > 0) {
    auto run_once = [&] { require_ok(stage.backward(args)); };
    const Timing timing = cuda ? time_cuda(run_once, options.warmup, options.reps, nullptr)
                               : time_host(run_once, options.warmup, options.reps);
    row.ms_median = timing.ms_median;
    row.ms_min = timing.ms_min;
    row.tflops = attention_flops(problem, Pass::backward) / (timing.ms_median * 1e-3) / 1e12;
    row.gbps =
        static_cast<double>(minimum_bytes(problem, element_bytes, Pass::backward)) / (timing.ms_median * 1e-3) / 1e9;
  }
}

}  // namespace

int64_t host_bytes_needed(const StageDescriptor& stage, const Problem& problem, bool with_lse, Pass pass) {
  const int64_t element_bytes = precision_bytes(stage.precision);
  const int64_t q = problem.q_elements();
  const int64_t kv = problem.kv_elements();
  int64_t bytes = 4 * (q + 2 * kv);                                       // the FP32 inputs
  bytes += element_bytes * (2 * q + 2 * kv);                              // Q, K, V and O in the stage's precision
  bytes += 4 * q;                                                         // O decoded to FP32
  if (with_lse || pass == Pass::backward) bytes += 8 * problem.q_rows();  // the LSE, and its copy
  if (pass == Pass::backward) {
    bytes += (4 + element_bytes) * q;                 // dO in FP32 and in the stage's precision
    bytes += (4 + 2 * element_bytes) * (q + 2 * kv);  // dQ, dK, dV: two copies, and decoded
  }
  if (stage.backend == Backend::cpu) {
    bytes += std::max(workspace_bytes(stage, problem), workspace_bytes(stage, problem, Pass::backward));
  }
  return bytes;
}

int64_t available_host_bytes() {
  int64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  if (available == 0) {
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    const long page_size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page_size > 0) available = static_cast<int64_t>(pages) * page_size;
  }
  // A container's memory limit (cgroup v2) can be far below what the machine has.
  std::ifstream limit_file("/sys/fs/cgroup/memory.max");
  std::ifstream current_file("/sys/fs/cgroup/memory.current");
  int64_t limit = 0;
  int64_t current = 0;
  if ((limit_file >> limit) && (current_file >> current) && limit > current) {
    available = available > 0 ? std::min(available, limit - current) : limit - current;
  }
  return available;
}

int cpu_threads() { return std::max(1, omp_get_max_threads()); }

double estimated_cpu_seconds(const Problem& problem, double flops_per_second, Pass pass) {
  constexpr double kFlopsPerThread = 5e9;  // stage 01 measures 2-10 GFLOP/s per core
  const double speed = flops_per_second > 0.0 ? flops_per_second : kFlopsPerThread * cpu_threads();
  return attention_flops(problem, pass) / speed;
}

double estimated_cpu_run_seconds(const RunOptions& options, double flops_per_second) {
  const Problem& problem = options.problem;
  const int runs = 1 + (options.time ? options.warmup + options.reps : 0);
  // The reference is double precision on one core: about 1 GFLOP/s over the checked rows.
  const double rows = static_cast<double>(std::min(options.check_rows, problem.q_rows()));
  const double check = options.check ? 4.0 * rows * static_cast<double>(problem.kv_seq * problem.dim) / 1e9 : 0.0;
  if (options.pass == Pass::backward) {
    // The forward once, then the backward; the reference's backward is about 12 products per checked group.
    const double groups = static_cast<double>(std::min(options.check_kv_heads, problem.kv_heads_total()));
    const double reference =
        options.check
            ? 12.0 * groups * static_cast<double>(problem.group_size() * problem.q_seq * problem.kv_seq * problem.dim) /
                  1e9
            : 0.0;
    return estimated_cpu_seconds(problem, flops_per_second) +
           runs * estimated_cpu_seconds(problem, flops_per_second, Pass::backward) + reference;
  }
  return runs * estimated_cpu_seconds(problem, flops_per_second) + check;
}

double measure_cpu_speed(const StageDescriptor& stage, int64_t dim) {
  RunOptions probe;
  probe.problem = Problem::square(1, cpu_threads(), 512, std::min(dim, stage.max_dim));
  probe.check = false;
  probe.warmup = 0;
  probe.reps = 1;
  probe.time = true;
  const RunOutcome outcome = run_stage(stage, probe);
  return outcome.exit_code == kExitOk ? outcome.row.tflops * 1e12 : 0.0;
}

std::string format_duration(double seconds) {
  std::ostringstream text;
  text << std::setprecision(2);
  if (seconds < 60.0) {
    text << seconds << " s";
  } else if (seconds < 3600.0) {
    text << seconds / 60.0 << " min";
  } else if (seconds < 2.0 * 86400.0) {
    text << seconds / 3600.0 << " h";
  } else if (seconds < 2.0 * 365.0 * 86400.0) {
    text << std::fixed << std::setprecision(0) << seconds / 86400.0 << " days";
  } else {
    text << seconds / (365.0 * 86400.0) << " years";
  }
  return text.str();
}

RunOutcome run_stage(const StageDescriptor& stage, const RunOptions& options) {
  const Problem& problem = options.problem;
  Inputs none;
  none.problem = problem;
  // What run_stage_on refuses (bad sizes, features, no GPU) it refuses before touching the inputs:
  // let it, without generating inputs for a problem that will not run.
  const DeviceInfo device = stage.backend == Backend::cuda ? query_device() : DeviceInfo{};
  if (!validate_problem(problem, stage.max_dim).empty() ||
      !unsupported_reason(stage, problem, wants_lse(options), options.pass).empty() ||
      !stage_unavailable_reason(stage, device).empty()) {
    return run_stage_on(stage, none, options);
  }
  // The host memory check: a problem too large for this machine is reported as out of memory
  // with the bytes it needs, never as std::bad_alloc (or the kernel's OOM killer).
  const int64_t needed = host_bytes_needed(stage, problem, options.lse, options.pass);
  const int64_t available = available_host_bytes();
  auto host_oom = [&](const std::string& note) {
    RunOutcome outcome;
    outcome.row.stage = stage.id;
    outcome.row.gpu = stage.backend == Backend::cuda ? device.name : "cpu";
    outcome.row.problem = problem;
    outcome.row.dtype = precision_name(stage.precision);
    outcome.row.pass = pass_name(options.pass);
    outcome.row.source_hash = stage.source_hash;
    outcome.row.peak_bytes = needed;
    outcome.row.status = "oom";
    outcome.row.note = note;
    outcome.exit_code = kExitOom;
    return outcome;
  };
  if (available > 0 && needed > available) {
    return host_oom("needs " + format_bytes(needed) + " of host memory for its inputs and output; " +
                    format_bytes(available) + " available");
  }
  Inputs inputs;
  try {
    inputs = random_inputs(problem, options.seed);
  } catch (const std::bad_alloc&) {
    return host_oom("needs " + format_bytes(needed) + " of host memory for its inputs and output; allocation failed");
  }
  return run_stage_on(stage, std::move(inputs), options);
}

RunOutcome run_stage_on(const StageDescriptor& stage, Inputs inputs, const RunOptions& options, bool keep_output) {
  RunOutcome outcome;
  ResultRow& row = outcome.row;
  const Problem problem = inputs.problem;
  row.stage = stage.id;
  row.problem = problem;
  row.dtype = precision_name(stage.precision);
  row.pass = pass_name(options.pass);
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
  if (const std::string why = unsupported_reason(stage, problem, wants_lse(options), options.pass); !why.empty()) {
    return refuse("unsupported", why, kExitBadInput);
  }
  const bool backward = options.pass == Pass::backward;
  if (backward && stage.backward == nullptr) {
    return refuse("error", std::string("stage ") + stage.id + " declares a backward pass but has none", kExitError);
  }
  if (const std::string why = stage_unavailable_reason(stage, device); !why.empty()) {
    return refuse("unsupported", why, kExitNoDevice);
  }

  round_to_precision(inputs, stage.precision);
  // The backward pass runs the forward first, in the same workspace.
  const int64_t workspace =
      backward ? std::max(workspace_bytes(stage, problem), workspace_bytes(stage, problem, Pass::backward))
               : workspace_bytes(stage, problem);
  const int element_bytes = precision_bytes(stage.precision);
  const int64_t needed = minimum_bytes(problem, element_bytes, options.pass, options.lse) + workspace;
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
    if (backward) {
      run_backward(stage, inputs, options, workspace, outcome);
      return outcome;
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
  const RunOptions& options = line.run;
  try {
    if (line.walkthrough) return run_walkthrough(stage, std::cout);
    // A problem the stage does not take is refused in one line, before anything runs.
    if (const std::string why = unsupported_reason(stage, options.problem, wants_lse(options), options.pass);
        !why.empty()) {
      std::cerr << why << "\n";
      return kExitBadInput;
    }
    // So is a GPU stage on a machine that cannot run it, in words that say what is missing.
    if (stage.backend == Backend::cuda) {
      const DeviceInfo device = query_device();
      if (const std::string why = stage_unavailable_reason(stage, device); !why.empty()) {
        if (!line.csv_path.empty()) append_csv(line.csv_path, {run_stage(stage, options).row});
        std::cerr << stage.id << ": "
                  << (device.present
                          ? why
                          : "this stage runs on a CUDA GPU, and there is none here: " + describe_missing_gpu(device) +
                                " (--walkthrough prints the exact values it must reproduce; 01_cpu runs "
                                "anywhere)")
                  << "\n";
        return kExitNoDevice;
      }
    }
    // A problem too large for this machine's memory is refused in one line, before any allocation.
    if (const int64_t needed = host_bytes_needed(stage, options.problem, options.lse, options.pass),
        available = available_host_bytes();
        available > 0 && needed > available) {
      if (!line.csv_path.empty()) append_csv(line.csv_path, {run_stage(stage, options).row});
      std::cerr << stage.id << ": " << describe(options.problem) << " needs " << format_bytes(needed)
                << " of host memory for its inputs and output; this machine has " << format_bytes(available)
                << " available\n";
      return kExitOom;
    }
    // The CPU stage says how long a large problem will take, and refuses one that would take hours.
    if (stage.backend == Backend::cpu && estimated_cpu_run_seconds(options) > kCpuWarnSeconds) {
      const double speed = measure_cpu_speed(stage, options.problem.dim);  // a better estimate, at a small cost
      const double seconds = estimated_cpu_run_seconds(options, speed);
      const int runs = 1 + (options.time ? options.warmup + options.reps : 0);
      std::ostringstream estimate;
      estimate << "about " << format_duration(seconds) << " (" << runs << (runs == 1 ? " run" : " runs") << " of "
               << format_duration(estimated_cpu_seconds(options.problem, speed, options.pass)) << " at the "
               << std::setprecision(2) << (speed > 0.0 ? speed : 5e9 * cpu_threads()) / 1e9
               << " GFLOP/s the CPU stage reaches on this machine's " << cpu_threads() << " thread"
               << (cpu_threads() == 1 ? "" : "s") << ")";
      if (seconds > kCpuRefuseSeconds) {
        std::cerr << stage.id << ": " << describe(options.problem) << " would take " << estimate.str()
                  << ": too long for the CPU stage; try a smaller --seq or --heads (the course runs it at N = 2048), "
                     "or a GPU stage\n";
        return kExitBadInput;
      }
      if (seconds > kCpuWarnSeconds) {
        std::cerr << stage.id << ": " << describe(options.problem) << " will take " << estimate.str()
                  << (runs > 1 ? "; --warmup 0 --reps 1 shortens it" : "") << "\n";
      }
    }
    std::cout << stage.id << ": " << stage.title << "\n"
              << describe(options.problem) << ", seed " << options.seed << "\n\n";
    RunOutcome outcome = run_stage(stage, options);
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
