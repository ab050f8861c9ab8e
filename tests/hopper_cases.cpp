#include "hopper_cases.hpp"

#include <cstdint>
#include <string>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "gpu_contract.hpp"

namespace fa::test {

void hopper_buckets(StageFactories factories) {
  // Buckets 64, 128, 192 (stage 10's) and 256 (Br = 192, 128, 128, 128; Bc = 128, 128, 96, 64). D a
  // multiple of 8 below the bucket: TMA zero-fills the columns past D. N = 1 (one partial tile), 63,
  // 128 (exactly one 128-key tile), 129, 193 and 333 (partial last tiles, query rows past N in the
  // last block).
  for (const auto factory : factories) {
    const StageDescriptor stage = factory();
    require_stage_runnable(stage);
    uint64_t seed = 900;
    for (const int64_t seq : {1, 63, 128, 129, 193, 333}) {
      for (const int64_t dim : {8, 24, 64, 72, 96, 128, 136, 192, 200, 256}) {
        check_stage_on(stage, random_inputs(Problem::square(1, 2, seq, dim), seed++));
      }
    }
  }
}

void hopper_padded_dims(StageFactories factories) {
  // TMA needs a row stride that is a multiple of 16 bytes: these run on zero-padded copies of Q, K
  // and V in the workspace, and O is written element by element. 197 keys: two ring turns and a
  // partial tile; B·H = 4; every row checked.
  for (const auto factory : factories) {
    const StageDescriptor stage = factory();
    require_stage_runnable(stage);
    uint64_t seed = 920;
    for (const int64_t dim : {1, 2, 17, 63, 100, 127, 129, 250, 255}) {
      check_stage_on(stage, random_inputs(Problem::square(2, 2, 197, dim), seed++));
    }
  }
}

void hopper_causal_buckets(StageFactories factories) {
  // N around Br = 128 / 192 and Bc = 128 / 96 / 64: the diagonal tile whole (128, 192, 256),
  // partial (65, 129, 193, 300) or the only one (1, 5, 63); B·H = 3 so heads interleave in the
  // reversed grid. D = 100 takes the padded copies.
  for (const auto factory : factories) {
    const StageDescriptor stage = factory();
    require_stage_runnable(stage);
    uint64_t seed = 940;
    for (const int64_t seq : {1, 5, 63, 65, 128, 129, 192, 193, 256, 300}) {
      for (const int64_t dim : {40, 64, 100, 128, 160, 256}) {
        check_stage_on(stage, random_inputs(Problem::square(3, 1, seq, dim, true), seed++));
      }
    }
  }
}

void hopper_many_pieces(StageFactories factories) {
  // More pieces (query tiles x heads) than an H100 or H200 has SMs (132): stage 10's persistent
  // blocks take several each, the ring and the Q tiles running on across them, under the mask from
  // the queue (pieces of one to three tiles, heaviest first). 256 pieces in each bucket that
  // loops (Br = 128 at D = 128, 192 at D = 64); every row and the log-sum-exp checked.
  for (const auto factory : factories) {
    const StageDescriptor stage = factory();
    require_stage_runnable(stage);
    uint64_t seed = 980;
    for (const bool causal : {false, true}) {
      check_stage_on(stage, random_inputs(Problem::square(8, 16, 256, 128, causal), seed++), 0, true);
      check_stage_on(stage, random_inputs(Problem::square(8, 16, 384, 64, causal), seed++), 0, true);
    }
  }
}

void hopper_general_buckets(StageFactories factories) {
  // {B, Hq, Hkv, Nq, Nk, D}: a group of 4 query heads per K/V head; queries at the end of a longer
  // sequence (Nq < Nk, several query tiles); more queries than keys (under the mask the first
  // Nq - Nk rows see nothing: O = 0, LSE = -inf; whole query tiles see nothing at Nq - Nk >= 128).
  for (const auto factory : factories) {
    const StageDescriptor stage = factory();
    require_stage_runnable(stage);
    uint64_t seed = 960;
    for (const int64_t dim : {64, 128, 192, 256}) {
      for (const Problem& base : {Problem{1, 8, 2, 200, 200, dim, false}, Problem{2, 2, 1, 150, 411, dim, false},
                                  Problem{1, 2, 2, 330, 70, dim, false}}) {
        for (const bool causal : {false, true}) {
          Problem problem = base;
          problem.causal = causal;
          check_stage_on(stage, random_inputs(problem, seed++), 0, true);
        }
      }
    }
  }
}

void hopper_descriptor(StageFactories factories) {
  for (const auto factory : factories) {
    const StageDescriptor stage = factory();
    CHECK(stage.max_dim == 256);
    CHECK(stage.architecture.compute_capability == 90);
    CHECK(stage.architecture.exact);
    CHECK(stage.features.causal);
    CHECK(stage.features.grouped);
    CHECK(stage.features.rectangular);
    CHECK(stage.features.lse);
    CHECK_FALSE(stage.features.backward);
    // With one K/V tile (stage 10 splits no piece) the workspace holds padded copies of Q, K and V
    // only when D is not a multiple of 8.
    CHECK(workspace_bytes(stage, Problem::square(2, 3, 100, 64)) == 0);
    CHECK(workspace_bytes(stage, Problem::square(2, 3, 60, 256)) == 0);
    CHECK(workspace_bytes(stage, Problem::square(2, 3, 100, 60)) == (2 * 3 * 100) * 3 * 64 * 2);
    // TMA reads only 16-byte aligned rows: a pointer off that boundary is declined before any
    // CUDA call (the pointers are never dereferenced, so no GPU is needed).
    ForwardArgs args;
    args.problem = Problem::square(1, 1, 64, 64);
    args.q = reinterpret_cast<const void*>(std::uintptr_t{4096 + 2});
    args.k = reinterpret_cast<const void*>(std::uintptr_t{8192});
    args.v = reinterpret_cast<const void*>(std::uintptr_t{16384});
    args.o = reinterpret_cast<void*>(std::uintptr_t{32768});
    const Status status = stage.forward(args);
    CHECK(status.code() == Status::Code::unsupported);
    CHECK(status.reason().find(stage.id) != std::string::npos);  // the refusal names the stage
  }
  REQUIRE(factories.size() == 2);
  CHECK(factories.begin()[0]().precision == Precision::fp16);
  CHECK(factories.begin()[1]().precision == Precision::bf16);
}

}  // namespace fa::test
