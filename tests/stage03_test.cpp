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
    fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(257, 256, 3, 5, causal), 3));
  }
}

// No GPU needed. The traffic model (scripts/traffic.py) counts K+V reads per query tile: the three
// sweeps read K three times and V once, two K+V reads' worth.
TEST_CASE("stage03: descriptor declares causal masking and two K+V passes") {
  const fa::StageDescriptor stage = fa::stages::tiled_smem();
  CHECK(stage.features.causal);
  CHECK_FALSE(stage.features.grouped);
  CHECK_FALSE(stage.features.rectangular);
  CHECK_FALSE(stage.features.lse);
  CHECK(stage.kv_passes == 2.0);
}
