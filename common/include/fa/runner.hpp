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
  uint64_t seed = 0;
  int warmup = 3;
  int reps = 10;
  bool check = true;
  int64_t check_rows = 256;  // rows compared with the reference (all rows when there are fewer)
  bool time = true;
};

struct RunOutcome {
  ResultRow row;
  ErrorReport errors;      // of O
  ErrorReport lse_errors;  // of the LSE, when options.lse
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

}  // namespace fa
