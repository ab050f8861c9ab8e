// Running a stage: validate, allocate (or report OOM), check against the reference, time,
// report. Every stage executable is `return fa::stage_main(descriptor, argc, argv);`.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/report.hpp"
#include "fa/stage.hpp"

namespace fa {

enum ExitCode : int {
  kExitOk = 0,
  kExitWrong = 1,     // the output did not match the reference
  kExitBadInput = 2,  // sizes out of range, unsupported head dim, bad flags
  kExitOom = 3,       // the problem does not fit in the device's memory
  kExitNoDevice = 4,  // no CUDA device, or one too old for the stage
  kExitError = 5,     // a CUDA error while running
};

struct RunOptions {
  Problem problem = Problem::square(1, 1, 1024, 64);
  bool lse = false;  // also ask for the log-sum-exp, and check it
  // The pass timed and checked. Backward: the stage's forward writes O and the LSE, then its
  // backward turns a random dO into dQ, dK, dV, compared with the double reference's gradients on
  // `check_kv_heads` whole (batch, key/value head) groups.
  Pass pass = Pass::forward;
  int64_t check_kv_heads = 2;
  uint64_t seed = 0;
  int warmup = 3;
  int reps = 10;
  bool check = true;
  int64_t check_rows = 256;  // rows compared with the reference (all rows when there are fewer)
  bool time = true;
};

struct RunOutcome {
  ResultRow row;
  ErrorReport errors;                                       // of O
  ErrorReport lse_errors;                                   // of the LSE, when options.lse
  ErrorReport grad_q_errors, grad_k_errors, grad_v_errors;  // of dQ, dK, dV, for the backward pass
  bool checked = false;
  int exit_code = kExitOk;
  std::vector<float> output;  // the stage's O (FP32), filled when keep_output is set
};

// Runs on random inputs from options.seed.
RunOutcome run_stage(const StageDescriptor& stage, const RunOptions& options);

// Runs on the given inputs (rounded to the stage's precision first). With `keep_output` the
// whole O comes back in RunOutcome::output.
RunOutcome run_stage_on(const StageDescriptor& stage, Inputs inputs, const RunOptions& options,
                        bool keep_output = false);

// The walkthrough fixture through the stage, printed beside the exact values; the return value
// is an ExitCode (kExitWrong when the stage disagrees).
int run_walkthrough(const StageDescriptor& stage, std::ostream& out);

int stage_main(const StageDescriptor& stage, int argc, char** argv);

// The walkthrough through several stages (`fa_course --walkthrough`): the exact values once, then
// one verdict line per stage. Returns kExitWrong when a stage that ran disagrees, else kExitOk
// (stages that cannot run here are listed as such).
int run_walkthrough_all(const std::vector<StageDescriptor>& stages, std::ostream& out);

// Host memory. The bytes a run of `stage` on `problem` allocates in host memory (the FP32 inputs,
// their copies in the stage's precision, the output and, for the CPU stage, its workspace), and
// the bytes this machine can still give (MemAvailable, capped by a cgroup limit; 0 when unknown).
// run_stage refuses a problem that does not fit as out of memory before allocating any of it.
int64_t host_bytes_needed(const StageDescriptor& stage, const Problem& problem, bool with_lse = false,
                          Pass pass = Pass::forward);
int64_t available_host_bytes();

// How long the CPU stage takes, roughly: the FLOPs of one run over `flops_per_second`, the speed
// measure_cpu_speed found, or when that is 0 a typical 5 GFLOP/s per OpenMP thread. For warnings
// and refusals only.
double estimated_cpu_seconds(const Problem& problem, double flops_per_second = 0.0, Pass pass = Pass::forward);
// The whole of a run_stage call on the CPU: one checked run, warm-up and timed runs, the
// reference rows.
double estimated_cpu_run_seconds(const RunOptions& options, double flops_per_second = 0.0);
// FLOP/s of `stage` (the CPU stage) on a small problem of head dim `dim`, timed once (about a
// tenth of a second); 0 when it could not run.
double measure_cpu_speed(const StageDescriptor& stage, int64_t dim);
int cpu_threads();  // OpenMP threads the CPU stage runs on
// Beyond this estimate the CPU stage refuses a problem (stage_main), with the estimate.
constexpr double kCpuRefuseSeconds = 3600.0;
// Beyond this it says how long it will take before starting.
constexpr double kCpuWarnSeconds = 20.0;

// "3.2 s", "4 min", "2.5 h", "12 days".
std::string format_duration(double seconds);

}  // namespace fa
