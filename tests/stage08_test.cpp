// Stage 08: mma.sync + ldmatrix with S and P in registers (FP16 and BF16 in and out, FP32
// accumulation; sm_80 and newer), with causal masking.
//
// Structural tests (tests/structural_tests.cmake, SOURCE stages/08_mma_registers/mma_registers.cu,
// ARCH 80 and ARCH 90): the PTX must use the raw tensor-core instruction in both precisions, the
// ldmatrix loads (plain for Q and K, transposing for V) and the cp.async pipeline:
//   mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32     (and \.bf16\.bf16)
//   ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16    ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16
//   cp\.async\.cg\.shared\.global    cp\.async\.commit_group    cp\.async\.wait_group [0-9]+
// and ptxas must report 0 bytes of spill for every kernel of the file (O, Q and S live in
// registers: a spill would put them in local memory).
// (In SASS: HMMA.16816.F32 and HMMA.16816.F32.BF16, LDSM.16.M88.4 and LDSM.16.MT88.4.)
// On a GPU older than sm_80 every GPU test case here reports skipped (require_stage_runnable).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

FA_GPU_STAGE_CONTRACT("stage08", fa::stages::mma_registers_fp16)

// The same contract for the BF16 descriptor (the macro's test names would collide).
TEST_CASE("stage08: bf16 matches the reference on the shape table") {
  fa::test::contract_shape_table(fa::stages::mma_registers_bf16());
}
TEST_CASE("stage08: bf16 reproduces the N=4 walkthrough") {
  fa::test::contract_walkthrough(fa::stages::mma_registers_bf16());
}
TEST_CASE("stage08: bf16 handles the well-conditioned fixture") {
  fa::test::contract_well_conditioned(fa::stages::mma_registers_bf16());
}
TEST_CASE("stage08: bf16 survives logits of magnitude 1e3") {
  fa::test::contract_large_logits(fa::stages::mma_registers_bf16());
}
TEST_CASE("stage08: bf16 writes every output element (NaN poison)") {
  fa::test::contract_poison(fa::stages::mma_registers_bf16());
}
TEST_CASE("stage08: bf16 causal masking matches the reference") {
  fa::test::contract_causal(fa::stages::mma_registers_bf16());
}

TEST_CASE("stage08: head dims that are not multiples of 8 take the synchronous path") {
  // 197 keys: several ring turns and a partial tile in both buckets; B·H = 4. Every row checked.
  for (const fa::StageDescriptor& stage : {fa::stages::mma_registers_fp16(), fa::stages::mma_registers_bf16()}) {
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 800;
    for (const int64_t dim : {1, 2, 17, 63, 100, 127}) {
      fa::test::check_stage_on(stage, fa::random_inputs(fa::Shape{2, 2, 197, dim}, seed++));
    }
  }
}

TEST_CASE("stage08: both buckets, with zero-filled padding columns and tail rows") {
  // D % 8 == 0 takes cp.async; 8 .. 56 are padded up to the 64 bucket, 72 .. 120 up to 128.
  // N = 1 (one partial tile), 31 (less than a tile), 64 (exactly one), 130 and 333 (several ring
  // turns, a partial last tile, and query rows past N in the last block).
  for (const fa::StageDescriptor& stage : {fa::stages::mma_registers_fp16(), fa::stages::mma_registers_bf16()}) {
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 810;
    for (const int64_t seq : {1, 31, 64, 130, 333}) {
      for (const int64_t dim : {8, 16, 24, 40, 56, 64, 72, 96, 120, 128}) {
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Shape{1, 2, seq, dim}, seed++));
      }
    }
  }
}

TEST_CASE("stage08: causal masking in both buckets and on the synchronous path") {
  // N around the 64-row query tiles and 64-key tiles: the diagonal tile whole (64, 128), partial
  // (65, 100, 333) or the only one (1, 5, 63); B·H = 3 so heads interleave in the reversed grid.
  // D = 100 takes the synchronous path.
  for (const fa::StageDescriptor& stage : {fa::stages::mma_registers_fp16(), fa::stages::mma_registers_bf16()}) {
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 820;
    for (const int64_t seq : {1, 5, 63, 64, 65, 100, 128, 333}) {
      for (const int64_t dim : {40, 64, 100, 128}) {
        fa::Shape shape{3, 1, seq, dim};
        shape.causal = true;
        fa::test::check_stage_on(stage, fa::random_inputs(shape, seed++));
      }
    }
  }
}

TEST_CASE("stage08: refuses shapes it cannot run before touching the GPU") {
  // forward validates first, so this needs no device: null pointers are never dereferenced.
  for (const fa::StageDescriptor& stage : {fa::stages::mma_registers_fp16(), fa::stages::mma_registers_bf16()}) {
    CHECK(stage.max_dim == 128);
    CHECK(stage.min_compute_capability == 80);
    CHECK(stage.supports_causal);
    for (const fa::Shape& shape : {fa::Shape{1, 1, 64, 129}, fa::Shape{1, 1, 64, 256}, fa::Shape{1, 1, 0, 64},
                                   fa::Shape{1, 1, 64, 0}, fa::Shape{0, 1, 64, 64}}) {
      CHECK(stage.forward(shape, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr) == cudaErrorInvalidValue);
    }
  }
  CHECK(fa::stages::mma_registers_fp16().precision == fa::Precision::fp16);
  CHECK(fa::stages::mma_registers_bf16().precision == fa::Precision::bf16);
}
