// Stage 03: the shared GPU contract, and more heads than one grid dimension holds.
#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

FA_GPU_STAGE_CONTRACT("stage03", fa::stages::tiled_smem)

// grid.y holds at most 65535 heads; the kernel strides over the rest.
TEST_CASE("stage03: B*H beyond the grid's 65535 (heads stride over grid.y)") {
  const fa::StageDescriptor stage = fa::stages::tiled_smem();
  fa::test::require_stage_runnable(stage);
  fa::test::check_stage_on(stage, fa::random_inputs(fa::Shape{257, 256, 3, 5, false}, 3));
}
