// Stage 03: the shared GPU contract, and many heads.
#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

FA_GPU_STAGE_CONTRACT("stage03", fa::stages::tiled_smem)

// B·H = 65792 heads: the work items (query tile, head) are numbered in one grid dimension, with the
// head the fast index under causal masking and the slow one without.
TEST_CASE("stage03: B*H = 65792 heads, causal and not") {
  const fa::StageDescriptor stage = fa::stages::tiled_smem();
  fa::test::require_stage_runnable(stage);
  for (const bool causal : {false, true}) {
    fa::test::check_stage_on(stage, fa::random_inputs(fa::Shape{257, 256, 3, 5, causal}, 3));
  }
}
