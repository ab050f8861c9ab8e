// The test cases every Hopper stage shares beyond the contract (stages 09 and 10: the same tiles,
// buckets, padded path and general shapes; stage 10 changes only the schedule, which must change no
// result). Each function runs its case for every precision the factories give, and reports skipped
// on a GPU that is not sm_90 (require_stage_runnable).
#pragma once

#include <initializer_list>

#include "fa/stage.hpp"

namespace fa::test {

using StageFactories = std::initializer_list<StageDescriptor (*)()>;

void hopper_buckets(StageFactories factories);
void hopper_padded_dims(StageFactories factories);
void hopper_causal_buckets(StageFactories factories);
void hopper_general_buckets(StageFactories factories);
void hopper_many_pieces(StageFactories factories);
// No GPU needed: the descriptor, the workspace sizes, and a misaligned pointer refused before any
// CUDA call. The factories are FP16 then BF16.
void hopper_descriptor(StageFactories factories);

}  // namespace fa::test

// The cases as TEST_CASEs named "<prefix>: ...": FA_HOPPER_STAGE_CASES("stage09", wgmma_tma_fp16, wgmma_tma_bf16).
#define FA_HOPPER_STAGE_CASES(prefix, ...)                                                                \
  TEST_CASE(prefix ": every head-dim bucket, at its own D and padded, with partial tiles") {              \
    fa::test::hopper_buckets({__VA_ARGS__});                                                              \
  }                                                                                                       \
  TEST_CASE(prefix ": head dims that are not multiples of 8 go through the padded copies") {              \
    fa::test::hopper_padded_dims({__VA_ARGS__});                                                          \
  }                                                                                                       \
  TEST_CASE(prefix ": causal masking in every bucket, around the tile sizes") {                           \
    fa::test::hopper_causal_buckets({__VA_ARGS__});                                                       \
  }                                                                                                       \
  TEST_CASE(prefix ": grouped heads and Nq != Nk in every bucket, causal or not, with the log-sum-exp") { \
    fa::test::hopper_general_buckets({__VA_ARGS__});                                                      \
  }                                                                                                       \
  TEST_CASE(prefix ": more pieces than SMs, causal or not, with the log-sum-exp") {                       \
    fa::test::hopper_many_pieces({__VA_ARGS__});                                                          \
  }                                                                                                       \
  TEST_CASE(prefix ": declares what it takes, and refuses misaligned inputs before touching the GPU") {   \
    fa::test::hopper_descriptor({__VA_ARGS__});                                                           \
  }
