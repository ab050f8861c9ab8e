// Stage 14's host API: FP8 (e4m3) attention forward on Hopper (sm_90a). Inputs and outputs as the
// 16-bit stages (ForwardArgs: FP16 or BF16 Q, K, V; O in the same type; the optional FP32 LSE);
// inside, the quantization pass (quantize.hpp) and then the attention kernel on e4m3 tensors.
// Causal (bottom-right), grouped-query heads, Nq != Nk and D = 1 .. 256 as stage 10.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "quantize.hpp"

namespace fa::fp8 {

// P is stored as e4m3(p · 2^kProbabilityShift) (fp8_numerics.hpp, point 6: 0 or 8). With 8 the
// largest weight, 1, becomes 256 (below e4m3's 448) and weights down to 2^-17 stay nonzero.
constexpr int kProbabilityShift = 8;
// The row sum l from the quantized P (the weights P·V actually uses, so they sum to one) or from
// the FP32 P (fp8_numerics.hpp, Fp8Options::l_from_quantized_p; the FP32 sum costs no conversions).
constexpr bool kRowSumFromQuantizedP = false;

// Bytes of workspace fp8_forward needs (the quantized tensors and their descales), 256-aligned.
int64_t fp8_workspace_bytes(const Problem& problem);

struct ForwardOptions {
  bool rotate = true;  // the Hadamard rotation of Q and K before quantization (fp8_numerics.hpp)
};

// FP16 (`precision` fp16) or BF16 Q, K, V in, O of the same type (and LSE when args.lse is set);
// args.workspace holds fp8_workspace_bytes(args.problem) bytes, 256-byte aligned. Declines (with
// the reason) a GPU other than sm_90, a shape beyond the limits, missing tensors.
Status fp8_forward(const ForwardArgs& args, Precision precision, const ForwardOptions& options = {});

// The attention kernel alone on tensors already quantized in quantize.hpp's layouts. O is FP16
// or BF16 (`out_precision`), (B, Hq, Nq, D); `lse` (B, Hq, Nq) may be null.
Status fp8_forward_quantized(const Problem& problem, const QuantizedInputs& inputs, Precision out_precision, void* o,
                             float* lse, cudaStream_t stream);

}  // namespace fa::fp8
