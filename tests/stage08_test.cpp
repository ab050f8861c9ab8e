// Stage 08: mma.sync + ldmatrix with S and P in registers (FP16 and BF16 in and out, FP32
// accumulation; sm_80 and newer), with causal masking, grouped-query heads, Nq != Nk and the
// log-sum-exp.
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
#include <cstdint>
#include <initializer_list>

#include "catch_compat.hpp"
#include "fa/inputs.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"

FA_GPU_STAGE_CONTRACT("stage08", fa::stages::mma_registers_fp16, fa::stages::mma_registers_bf16)

namespace {

const std::initializer_list<fa::StageDescriptor (*)()> kStages = {fa::stages::mma_registers_fp16,
                                                                  fa::stages::mma_registers_bf16};

}  // namespace

TEST_CASE("stage08: every head dim from 1 to 256, in every bucket, causal and not, with the LSE") {
  // D = 1 .. 256 covers every bucket (64, 96, 128, 192, 256) at its own D (two strips up to 128),
  // padded up to it (one strip) and on the synchronous path (D % 8 != 0). 150 queries: two query
  // tiles of 128 rows, the second partial; 150 keys: three 64-key tiles or five 32-key tiles, the
  // last partial. Every row and the LSE checked.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 790;
    for (int64_t dim = 1; dim <= 256; ++dim) {
      for (const bool causal : {false, true}) {
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(1, 2, 150, dim, causal), seed++), 0,
                                 /*lse=*/true);
      }
    }
  }
}

TEST_CASE("stage08: head dims that are not multiples of 8 take the synchronous path") {
  // 197 keys: several ring turns and a partial tile in every bucket; B·H = 4. Every row checked.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 800;
    for (const int64_t dim : {1, 2, 17, 63, 90, 100, 127, 130, 191, 201, 255}) {
      fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(2, 2, 197, dim), seed++));
    }
  }
}

TEST_CASE("stage08: every bucket, with zero-filled padding columns and tail rows") {
  // D % 8 == 0 takes cp.async; 8 .. 56 are padded up to the 64 bucket, 72 and 88 up to 96,
  // 104 and 120 up to 128, 136 and 184 up to 192, 200 and 248 up to 256.
  // N = 1 (one partial tile), 31 (less than a tile), 64 (exactly one), 130 and 333 (several ring
  // turns, a partial last tile, and query rows past N in the last block).
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 810;
    for (const int64_t seq : {1, 31, 64, 130, 333}) {
      for (const int64_t dim : {8, 16, 24, 40, 56, 64, 72, 88, 96, 104, 120, 128, 136, 184, 192, 200, 248, 256}) {
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(1, 2, seq, dim), seed++));
      }
    }
  }
}

TEST_CASE("stage08: causal masking in every bucket and on the synchronous path") {
  // N around the 64- and 128-row query tiles and the 32- and 64-key tiles: the diagonal tile whole
  // (64, 128), partial (65, 100, 333) or the only one (1, 5, 63); B·H = 3 so heads interleave in
  // the reversed grid. D = 100 and 250 take the synchronous path, 200 the padded 256 bucket.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 820;
    for (const int64_t seq : {1, 5, 63, 64, 65, 100, 128, 333}) {
      for (const int64_t dim : {40, 64, 96, 100, 128, 192, 200, 250, 256}) {
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem::square(3, 1, seq, dim, true), seed++));
      }
    }
  }
}

TEST_CASE("stage08: grouped-query and multi-query heads read their group's K and V") {
  // Hq = 8 over Hkv = 2 (four query heads a group) and Hkv = 1 (multi-query), B = 2 so the batch
  // offset of the K/V head counts too; the buckets' own D (64, 96, 128: two strips; 192, 256: eight
  // warps of one strip), a padded D (72, 200: one strip) and the synchronous path (100); causal
  // and not. Every row and the LSE checked.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 830;
    for (const int64_t kv_heads : {2, 1}) {
      for (const int64_t dim : {64, 96, 128, 192, 256, 72, 200, 100}) {
        for (const bool causal : {false, true}) {
          const fa::Problem problem{2, 8, kv_heads, 150, 150, dim, causal};
          fa::test::check_stage_on(stage, fa::random_inputs(problem, seed++), 0, /*lse=*/true);
        }
      }
    }
  }
}

TEST_CASE("stage08: Nq != Nk, with the causal mask aligned to the bottom-right corner") {
  // Nq < Nk: every row sees Nk - Nq keys more than its index. Nq > Nk under the mask: the first
  // Nq - Nk rows see no key (zeros and LSE = -inf); with 333 queries over 100 keys the first
  // 233 rows are blind, so whole blocks see nothing (Br = 128 in the two-strip and eight-warp
  // kernels, 64 otherwise) and must still write their zeros. Nq = 1 with 1000 keys: the decoding
  // shape, one query row that sees every key. The 64, 128, 192 and 256 buckets and the synchronous
  // path, causal and not.
  struct Lengths {
    int64_t q_seq, kv_seq;
  };
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 850;
    for (const Lengths lengths : {Lengths{100, 333}, Lengths{333, 100}, Lengths{1, 1000}, Lengths{64, 1},
                                  Lengths{1000, 10}, Lengths{129, 128}}) {
      for (const int64_t dim : {64, 128, 192, 256, 100}) {
        for (const bool causal : {false, true}) {
          const fa::Problem problem{1, 2, 2, lengths.q_seq, lengths.kv_seq, dim, causal};
          fa::test::check_stage_on(stage, fa::random_inputs(problem, seed++), 0, /*lse=*/true);
        }
      }
    }
  }
}

TEST_CASE("stage08: everything general at once (GQA, Nq != Nk, causal, LSE)") {
  // Hq = 6 over Hkv = 3, B = 2, 77 queries over 250 keys and 250 over 77, in the three kernels
  // of the buckets (own D, padded D, synchronous).
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 880;
    for (const int64_t dim : {32, 64, 96, 128, 160, 192, 256, 50, 210}) {
      for (const bool causal : {false, true}) {
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem{2, 6, 3, 77, 250, dim, causal}, seed++), 0,
                                 /*lse=*/true);
        fa::test::check_stage_on(stage, fa::random_inputs(fa::Problem{2, 6, 3, 250, 77, dim, causal}, seed++), 0,
                                 /*lse=*/true);
      }
    }
  }
}

TEST_CASE("stage08: describes what it takes, and the runner refuses the rest before the GPU") {
  // Needs no device: the descriptor and fa::unsupported_reason only.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    CHECK(stage.max_dim == 256);
    CHECK(stage.architecture.compute_capability == 80);
    CHECK_FALSE(stage.architecture.exact);
    CHECK(stage.features.causal);
    CHECK(stage.features.grouped);
    CHECK(stage.features.rectangular);
    CHECK(stage.features.lse);
    CHECK_FALSE(stage.features.backward);
    CHECK(stage.backward == nullptr);
    CHECK(stage.kv_passes == 1.0);
    for (const fa::Problem& problem : {fa::Problem::square(1, 1, 64, 257), fa::Problem::square(1, 1, 64, 512),
                                       fa::Problem::square(1, 1, 0, 64), fa::Problem::square(1, 1, 64, 0),
                                       fa::Problem::square(0, 1, 64, 64), fa::Problem{1, 8, 3, 64, 64, 64, false}}) {
      CHECK_FALSE(fa::unsupported_reason(stage, problem, /*wants_lse=*/true).empty());
    }
    CHECK_FALSE(fa::unsupported_reason(stage, fa::Problem::square(1, 1, 64, 64), false, fa::Pass::backward).empty());
    for (const fa::Problem& problem :
         {fa::Problem{2, 32, 8, 4, 4096, 128, true}, fa::Problem{1, 8, 1, 333, 100, 64, true},
          fa::Problem::square(4, 16, 4096, 128, true), fa::Problem::square(4, 16, 4096, 256),
          fa::Problem{2, 32, 8, 4096, 4096, 192, true}}) {
      CHECK(fa::unsupported_reason(stage, problem, /*wants_lse=*/true).empty());
    }
  }
  CHECK(fa::stages::mma_registers_fp16().precision == fa::Precision::fp16);
  CHECK(fa::stages::mma_registers_bf16().precision == fa::Precision::bf16);
}
