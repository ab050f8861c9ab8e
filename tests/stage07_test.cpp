// Stage 07: the cp.async pipeline (FP16 and BF16 in and out, FP32 accumulation; sm_80 and newer).
//
// Structural test (tests/structural_tests.cmake, SOURCE stages/07_fp16_pipelined/fp16_pipelined.cu,
// ARCH 80 and ARCH 90): the PTX must issue asynchronous copies, group them and wait for them,
// which a synchronous rewrite of the exercise would lose, and must use BF16 tensor cores:
//   cp\.async\.cg\.shared\.global    cp\.async\.commit_group    cp\.async\.wait_group [0-9]+
//   wmma\.mma\.sync\.aligned\.row\.col\.m16n16k16\.f32\.bf16\.bf16\.f32
// (In SASS the copies are LDGSTS and the waits LDGDEPBAR / DEPBAR.) A second test assembles the
// same PTX with ptxas -v and fails if any kernel spills to local memory.
// On a GPU older than sm_80 every GPU test case here reports skipped (require_stage_runnable).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

// The shared contract, for the FP16 and the BF16 descriptor alike.
FA_GPU_STAGE_CONTRACT("stage07", fa::stages::pipelined_fp16, fa::stages::pipelined_bf16)

TEST_CASE("stage07: head dims that are not multiples of 8 take the synchronous path") {
  // 197 keys: several ring turns and a partial tile in every bucket; B·H = 4; causal or not.
  for (const fa::StageDescriptor& stage : {fa::stages::pipelined_fp16(), fa::stages::pipelined_bf16()}) {
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 700;
    for (const bool causal : {false, true}) {
      for (const int64_t dim : {1, 2, 17, 100, 200}) {
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(2, 2, 197, dim, causal), seed++));
      }
    }
  }
}

TEST_CASE("stage07: every bucket through the ring, with zero-filled padding columns and tail rows") {
  // D % 8 == 0 takes cp.async; 8, 24, 40, 72 and 136 also leave padding columns in their bucket.
  // N = 1 (one partial tile), 31 (less than the first tile), 130 and 333 (many ring turns, with a
  // partial tail tile in every bucket). Causal too: fewer tiles than the ring has slots for the
  // first query tiles (the prologue must issue only those), and at D = 256 four 16-key tiles on
  // each diagonal, the later ones all masked for the block's first warps.
  for (const fa::StageDescriptor& stage : {fa::stages::pipelined_fp16(), fa::stages::pipelined_bf16()}) {
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 710;
    for (const bool causal : {false, true}) {
      for (const int64_t seq : {1, 31, 130, 333}) {
        for (const int64_t dim : {8, 16, 24, 32, 40, 64, 72, 128, 136, 256}) {
          fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(1, 2, seq, dim, causal), seed++));
        }
      }
    }
  }
}

TEST_CASE("stage07: D = 128 through the three-slot ring, both copy paths, causal or not") {
  // Three slots for a stream of six or more K and V tiles: N = 1, 63 (inside the first tile), 65
  // (one full tile and a partial one), 333 (several ring turns and a partial tail) and, with
  // enough heads for several waves of blocks, 1061 (sampled rows). D = 128 and 120 (padding
  // columns) take cp.async, D = 100 the synchronous path.
  for (const fa::StageDescriptor& stage : {fa::stages::pipelined_fp16(), fa::stages::pipelined_bf16()}) {
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 760;
    for (const bool causal : {false, true}) {
      for (const int64_t dim : {128, 120, 100}) {
        for (const int64_t seq : {1, 63, 65, 333}) {
          fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(2, 2, seq, dim, causal), seed++));
        }
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(2, 48, 1061, dim, causal), seed++), 1024);
      }
    }
  }
}

TEST_CASE("stage07: refuses shapes it cannot run before touching the GPU") {
  // forward validates first, so this needs no device: null pointers are never dereferenced.
  for (const fa::StageDescriptor& stage : {fa::stages::pipelined_fp16(), fa::stages::pipelined_bf16()}) {
    CHECK(stage.max_dim == 256);
    CHECK(stage.architecture.compute_capability == 80);
    CHECK_FALSE(stage.architecture.exact);
    CHECK(stage.features.causal);
    for (const fa::Problem& problem :
         {fa::Problem::square(1, 1, 64, 257), fa::Problem::square(1, 1, 0, 64), fa::Problem::square(1, 1, 64, 0)}) {
      fa::ForwardArgs args;
      args.problem = problem;
      const fa::Status status = stage.forward(args);
      INFO(fa::describe(problem) << ": " << status.reason());
      CHECK(status.code() == fa::Status::Code::unsupported);
    }
  }
  CHECK(fa::stages::pipelined_fp16().precision == fa::Precision::fp16);
  CHECK(fa::stages::pipelined_bf16().precision == fa::Precision::bf16);
}
