// Stage 10: stage 09's kernel with FlashAttention-3's schedule (ping-pong consumer warpgroups, the
// softmax under P·V); FP16 and BF16, exactly sm_90a. The same cases as stage 09 (tests/hopper_cases.cpp): the schedule
// must change no result, in any bucket, with any tile count (one tile: no round of the loop; two or more: the
// overlapped rounds), causal or not, with general shapes and the log-sum-exp, and with more pieces
// than SMs (the persistent blocks' later pieces, the causal queue).
//
// Structural tests (tests/structural_tests.cmake): the PTX holds wgmma.wait_group 1 (a wait that
// leaves P·V running) and the named barriers' bar.arrive beside bar.sync, and ptxas reports 0 bytes
// of spill. On a GPU that is not sm_90 every GPU test case here reports skipped.
#include "catch_compat.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"
#include "hopper_cases.hpp"

FA_GPU_STAGE_CONTRACT("stage10", fa::stages::overlap_fp16, fa::stages::overlap_bf16)
FA_HOPPER_STAGE_CASES("stage10", fa::stages::overlap_fp16, fa::stages::overlap_bf16)

// No GPU needed: under the causal mask the blocks take their pieces from a queue whose counter lives
// in the workspace, 16 bytes after the padded copies (16-byte aligned); without the mask nothing.
TEST_CASE("stage10: under the causal mask the workspace also holds the queue's counter") {
  for (const auto factory : {fa::stages::overlap_fp16, fa::stages::overlap_bf16}) {
    const fa::StageDescriptor stage = factory();
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 64, true)) == 16);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 256, true)) == 16);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 60, true)) == (2 * 3 * 100) * 3 * 64 * 2 + 16);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 64)) == 0);
  }
}
