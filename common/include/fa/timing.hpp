// Timing: warm-up runs, then the median and minimum of repeated runs.
#pragma once

#include <functional>

namespace fa {

struct Timing {
  double ms_median = 0.0;
  double ms_min = 0.0;
};

// Times `run` with CUDA events around each repetition (the work is enqueued on `stream`).
Timing time_cuda(const std::function<void()>& run, int warmup, int reps, void* stream);

// Times `run` with the host's steady clock (the CPU stage).
Timing time_host(const std::function<void()>& run, int warmup, int reps);

}  // namespace fa
