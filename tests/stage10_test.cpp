// Stage 10: stage 09's kernel with FlashAttention-3's schedule (ping-pong consumer warpgroups, the
// softmax under P·V); FP16 and BF16, exactly sm_90a. The same cases as stage 09: the schedule must
// change no result, in any bucket, with any tile count (one tile: no round of the loop; two or more:
// the overlapped rounds), causal or not, with general shapes and the log-sum-exp.
//
// Structural tests (tests/structural_tests.cmake): the PTX holds wgmma.wait_group 1 (a wait that
// leaves P·V running) and the named barriers' bar.arrive beside bar.sync, and ptxas reports 0 bytes
// of spill. On a GPU that is not sm_90 every GPU test case here reports skipped.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

FA_GPU_STAGE_CONTRACT("stage10", fa::stages::overlap_fp16, fa::stages::overlap_bf16)

namespace {

const std::initializer_list<fa::StageDescriptor (*)()> kBoth = {fa::stages::overlap_fp16, fa::stages::overlap_bf16};

}  // namespace

TEST_CASE("stage10: every head-dim bucket, at its own D and padded, with partial tiles") {
  // Buckets 64, 128 and 256 (Br = 192, 128, 128; Bc = 128, 128, 64). D a multiple of 8 below the
  // bucket: TMA zero-fills the columns past D. N = 1 (one partial tile), 63, 128 (exactly one
  // 128-key tile), 129, 193 and 333 (partial last tiles, query rows past N in the last block).
  for (const auto factory : kBoth) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 900;
    for (const int64_t seq : {1, 63, 128, 129, 193, 333}) {
      for (const int64_t dim : {8, 24, 64, 72, 96, 128, 136, 200, 256}) {
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(1, 2, seq, dim), seed++));
      }
    }
  }
}

TEST_CASE("stage10: head dims that are not multiples of 8 go through the padded copies") {
  // TMA needs a row stride that is a multiple of 16 bytes: these run on zero-padded copies of Q, K
  // and V in the workspace, and O is written element by element. 197 keys: two ring turns and a
  // partial tile; B·H = 4; every row checked.
  for (const auto factory : kBoth) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 920;
    for (const int64_t dim : {1, 2, 17, 63, 100, 127, 129, 250, 255}) {
      fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(2, 2, 197, dim), seed++));
    }
  }
}

TEST_CASE("stage10: causal masking in every bucket, around the tile sizes") {
  // N around Br = 128 / 192 and Bc = 128 / 64: the diagonal tile whole (128, 192, 256), partial
  // (65, 129, 193, 300) or the only one (1, 5, 63); B·H = 3 so heads interleave in the reversed
  // grid. D = 100 takes the padded copies.
  for (const auto factory : kBoth) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 940;
    for (const int64_t seq : {1, 5, 63, 65, 128, 129, 192, 193, 256, 300}) {
      for (const int64_t dim : {40, 64, 100, 128, 256}) {
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(3, 1, seq, dim, true), seed++));
      }
    }
  }
}

TEST_CASE("stage10: grouped heads and Nq != Nk in every bucket, causal or not, with the log-sum-exp") {
  // {B, Hq, Hkv, Nq, Nk, D}: a group of 4 query heads per K/V head; queries at the end of a longer
  // sequence (Nq < Nk, several query tiles); more queries than keys (under the mask the first
  // Nq - Nk rows see nothing: O = 0, LSE = -inf; whole query tiles see nothing at Nq - Nk >= 128).
  for (const auto factory : kBoth) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 960;
    for (const int64_t dim : {64, 128, 256}) {
      for (const fa::Problem& base :
           {fa::Problem{1, 8, 2, 200, 200, dim, false}, fa::Problem{2, 2, 1, 150, 411, dim, false},
            fa::Problem{1, 2, 2, 330, 70, dim, false}}) {
        for (const bool causal : {false, true}) {
          fa::Problem problem = base;
          problem.causal = causal;
          fa::test::check_stage_on(stage, fa::random_inputs(problem, seed++), 0, true);
        }
      }
    }
  }
}

TEST_CASE("stage10: declares what it takes, and refuses misaligned inputs before touching the GPU") {
  for (const auto factory : kBoth) {
    const fa::StageDescriptor stage = factory();
    CHECK(stage.max_dim == 256);
    CHECK(stage.architecture.compute_capability == 90);
    CHECK(stage.architecture.exact);
    CHECK(stage.features.causal);
    CHECK(stage.features.grouped);
    CHECK(stage.features.rectangular);
    CHECK(stage.features.lse);
    CHECK_FALSE(stage.features.backward);
    // The workspace holds padded copies of Q, K and V only when D is not a multiple of 8.
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 64)) == 0);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 256)) == 0);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 60)) == (2 * 3 * 100) * 3 * 64 * 2);
    // TMA reads only 16-byte aligned rows: a pointer off that boundary is declined before any
    // CUDA call (the pointers are never dereferenced, so no GPU is needed).
    fa::ForwardArgs args;
    args.problem = fa::Problem::square(1, 1, 64, 64);
    args.q = reinterpret_cast<const void*>(std::uintptr_t{4096 + 2});
    args.k = reinterpret_cast<const void*>(std::uintptr_t{8192});
    args.v = reinterpret_cast<const void*>(std::uintptr_t{16384});
    args.o = reinterpret_cast<void*>(std::uintptr_t{32768});
    const fa::Status status = stage.forward(args);
    CHECK(status.code() == fa::Status::Code::unsupported);
    CHECK(status.reason().find("10_overlap") != std::string::npos);
  }
  CHECK(fa::stages::overlap_fp16().precision == fa::Precision::fp16);
  CHECK(fa::stages::overlap_bf16().precision == fa::Precision::bf16);
}
