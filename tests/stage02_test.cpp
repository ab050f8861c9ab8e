// Stage 02: the shared GPU contract, and the size of S computed without overflow.
#include <cstdint>

#include "catch_compat.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

FA_GPU_STAGE_CONTRACT("stage02", fa::stages::naive_gpu)

// No GPU needed: runs in CI too. B·H·N·N·4 passes 2^31 at everyday sizes; computed in 32 bits it
// would wrap to a small or negative size and the runner would allocate too little.
TEST_CASE("stage02: workspace is B*H*N*N*4 bytes, computed in 64 bits") {
  const fa::StageDescriptor stage = fa::stages::naive_gpu();
  REQUIRE(stage.workspace_bytes != nullptr);

  const fa::Problem seed_problem = fa::Problem::square(4, 16, 4096, 128);
  const int64_t seed_bytes = int64_t{4} * 16 * 4096 * 4096 * 4;  // 2^32
  REQUIRE(seed_bytes > (int64_t{1} << 31));
  CHECK(stage.workspace_bytes(seed_problem, fa::Pass::forward) == seed_bytes);
  CHECK(fa::workspace_bytes(stage, seed_problem) == seed_bytes);

  const fa::Problem odd_problem = fa::Problem::square(3, 5, 40001, 7);
  const int64_t odd_bytes = int64_t{3} * 5 * 40001 * 40001 * 4;  // about 9.6e10, no power of two
  REQUIRE(odd_bytes > (int64_t{1} << 32));
  CHECK(stage.workspace_bytes(odd_problem, fa::Pass::forward) == odd_bytes);
}
