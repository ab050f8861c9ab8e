// `14_fp8 --walkthrough`: the N = 4, D = 2 fixture of DESIGN.md (common's walkthrough_inputs) through
// stage 14's FP8 path, so a student sees what e4m3 does to it: Q, K and V as their e4m3 codes hold
// them, then O exact (double, on the 16-bit inputs), from the CPU FP8 model (fp8_numerics.hpp) and,
// on an H100 or H200, from the kernel.
#pragma once

#include <ostream>

#include "fa/stage.hpp"

namespace fa::fp8 {

// Returns an ExitCode (runner.hpp): ok when the kernel agrees with the CPU model and the reference
// (fp8_tolerance.hpp), wrong when it does not, no device when the kernel cannot run here (the exact
// and the model's values are printed all the same).
int run_walkthrough(Precision precision, bool rotate, std::ostream& out);

}  // namespace fa::fp8
