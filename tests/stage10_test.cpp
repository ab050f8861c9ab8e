// Stage 10: stage 09's kernel with FlashAttention-3's schedule (ping-pong consumer warpgroups, the
// softmax under P·V); FP16 and BF16, exactly sm_90a. The same cases as stage 09 (tests/hopper_cases.cpp): the schedule
// must change no result, in any bucket, with any tile count (one tile: no round of the loop; two or more: the
// overlapped rounds), causal or not, with general shapes and the log-sum-exp, and with more pieces
// than SMs (the persistent blocks' later pieces, the causal queue).
//
// Structural tests (tests/structural_tests.cmake): the PTX holds wgmma.wait_group 1 (a wait that
// leaves P·V running) and the named barriers' bar.arrive beside bar.sync, and ptxas reports 0 bytes
// of spill. On a GPU that is not sm_90 every GPU test case here reports skipped.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <tuple>

#include "catch_compat.hpp"
#include "fa/device.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"
#include "hopper_cases.hpp"
#include "last_round.hpp"

FA_GPU_STAGE_CONTRACT("stage10", fa::stages::overlap_fp16, fa::stages::overlap_bf16)
FA_HOPPER_STAGE_CASES("stage10", fa::stages::overlap_fp16, fa::stages::overlap_bf16)

// No GPU needed: under the causal mask the blocks take their pieces from a queue whose counter lives
// in the workspace, 16 bytes after the padded copies (16-byte aligned); without the mask, at D <= 64
// and D > 128 and with more than one K/V tile, the arrivals and states of the last round's parts
// (README, "The last round"): per split piece (at most 144) and consumer one counter and kMaxParts
// states of 128 threads x (D / 2 + 4) floats.
TEST_CASE("stage10: the workspace holds the queue's counter, or the parts' arrivals and states") {
  using fa::stages::overlap::kMaxParts;
  const auto states_of = [](int64_t dim) { return int64_t{128} * (dim / 2 + 4) * 4; };
  for (const auto factory : {fa::stages::overlap_fp16, fa::stages::overlap_bf16}) {
    const fa::StageDescriptor stage = factory();
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 64, true)) == 16);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 256, true)) == 16);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 60, true)) == (2 * 3 * 100) * 3 * 64 * 2 + 16);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 100, 64)) == 0);  // one K/V tile: nothing to split
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 1000, 128)) == 0);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 60, 256)) == 0);  // one K/V tile of 64 keys
    // (2, 3, 1000, 256) and (.., 192): 6 · 8 pieces of 128 rows, 2 consumers: 96 counters, 96 · kMaxParts states.
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 1000, 256)) == 96 * 4 + 96 * kMaxParts * states_of(256));
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 1000, 192)) == 96 * 4 + 96 * kMaxParts * states_of(192));
    // (2, 3, 1000, 64): 6 · 6 pieces of 192 rows, 3 consumers: 108 counters, 108 · kMaxParts states.
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(2, 3, 1000, 64)) == 108 * 4 + 108 * kMaxParts * states_of(64));
    // (1, 200, 1000, 60): the padded copies first (D = 64); 6 · 200 pieces, of which at most 144 split.
    const int64_t padded = (200 * 1000) * 3 * 64 * 2;
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(1, 200, 1000, 60)) ==
          padded + 144 * 3 * 4 + 144 * 3 * kMaxParts * states_of(64));
  }
}

// No GPU needed: the plan of the last round (last_round.hpp). D = 64 on 132 SMs: (1, 16, 16384) has
// 1376 pieces of 128 tiles, 56 in the last round: two parts each end it in one turn of 64 tiles.
// (4, 16, 4096): 1408 pieces of 32 tiles, 88 in the last round: three parts each, two turns of 11.
TEST_CASE("stage10: the last round's pieces are split where that ends the round sooner") {
  using fa::stages::overlap::kMaxParts;
  using fa::stages::overlap::kPartOverheadTiles;
  using fa::stages::overlap::LastRound;
  using fa::stages::overlap::plan_last_round;
  const LastRound long_rows = plan_last_round(1376, 128, 132);
  CHECK(long_rows.split_from == 1320);
  CHECK(long_rows.parts == 2);
  CHECK(long_rows.units(1376) == 1320 + 2 * 56);
  const LastRound short_rows = plan_last_round(1408, 32, 132);
  CHECK(short_rows.split_from == 1320);
  CHECK(short_rows.parts == 3);
  // Whole rounds, one tile, or a split that would not end the round sooner: nothing split.
  for (const LastRound& plan : {plan_last_round(264, 32, 132), plan_last_round(200, 1, 132),
                                plan_last_round(96, 8, 132), plan_last_round(131, 32, 132)}) {
    CHECK(plan.parts == 1);
  }
  // Over counts of pieces, tiles and SMs: the split pieces are the last round's, every part has a
  // tile, and the round, counted as the plan counts, ends sooner.
  int splits = 0;
  for (const int64_t blocks : {114, 132}) {
    for (int64_t pieces = 1; pieces <= 3 * blocks; pieces += 5) {
      for (const int64_t tiles : {1, 2, 3, 8, 33, 128}) {
        const LastRound plan = plan_last_round(pieces, tiles, blocks);
        INFO("pieces " << pieces << ", tiles " << tiles << ", SMs " << blocks);
        if (plan.parts == 1) {
          CHECK(plan.split_from == pieces);
          continue;
        }
        ++splits;
        const int64_t rest = pieces % blocks;
        CHECK(plan.split_from == pieces - rest);
        CHECK(plan.parts <= kMaxParts);
        CHECK(plan.parts <= tiles);
        const int64_t turns = (rest * plan.parts + blocks - 1) / blocks;
        CHECK(turns * ((tiles + plan.parts - 1) / plan.parts + kPartOverheadTiles) < tiles + kPartOverheadTiles);
      }
    }
  }
  CHECK(splits > 100);
}

// The split path on the GPU: shapes made for this GPU's count of SMs so that the plan splits the last
// round's pieces in two and in three parts (REQUIREd first), with grouped heads, Nq != Nk, partial
// tiles, the padded copies (D = 60, 252) and the log-sum-exp; every row checked. One query tile a
// head, so the pieces are the heads: Nq = 150 at D <= 64 (192 rows a piece), 100 above (128 rows), where
// persistent blocks (D = 64) and blocks one per piece (D = 192, 256) both run the last round split.
TEST_CASE("stage10: the last round's pieces split in parts and merged, with the log-sum-exp") {
  using fa::stages::overlap::plan_last_round;
  for (const auto factory : {fa::stages::overlap_fp16, fa::stages::overlap_bf16}) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    int device = 0;
    int sms = 0;
    REQUIRE(cudaGetDevice(&device) == cudaSuccess);
    REQUIRE(fa::multiprocessor_count(device, &sms).ok());
    uint64_t seed = 1010;
    // {D, Nq, keys a K/V tile, Nk to split in two, Nk to split in three}
    using Bucket = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;
    for (const auto& [dim, q_seq, tile_keys, two_keys, three_keys] :
         {Bucket{64, 150, 128, 1100, 1500}, Bucket{60, 150, 128, 1100, 1500}, Bucket{256, 100, 64, 400, 400},
          Bucket{252, 100, 64, 400, 400}, Bucket{192, 100, 96, 400, 400}}) {
      // {query heads, keys, parts}
      for (const auto& [heads, keys, parts] : {std::tuple<int64_t, int64_t, int>{sms + sms / 2, two_keys, 2},
                                               std::tuple<int64_t, int64_t, int>{sms + sms / 3, three_keys, 3}}) {
        REQUIRE(plan_last_round(heads, (keys + tile_keys - 1) / tile_keys, sms).parts == parts);
        const int64_t kv_heads = heads % 3 == 0 ? heads / 3 : heads;
        INFO("Hq " << heads << ", Hkv " << kv_heads << ", Nq " << q_seq << ", Nk " << keys << ", D " << dim
                   << ", parts " << parts);
        fa::test::check_stage_on(
            stage, fa::random_inputs(fa::Problem{1, heads, kv_heads, q_seq, keys, dim, false}, seed++), 0, true);
      }
    }
  }
}

// The lazy rescale (README, "The lazy rescale"): the running max moves only when a tile's row max
// passes it by more than 2^8. Keys whose scores climb, 0.04 a key in log2 units and 12 more every
// 300 keys, make the max pass it by less than the slack on some tiles (m stays, p grows up to 256)
// and by more on others (m moves, O is rescaled), in every bucket (D = 64, whose max is not lazy,
// as a check of the plain one), causal or not, with the log-sum-exp; every row checked.
TEST_CASE("stage10: a running max that grows by less than the lazy rescale's slack and by more") {
  for (const auto factory : {fa::stages::overlap_fp16, fa::stages::overlap_bf16}) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1020;
    for (const int64_t dim : {64, 128, 192, 256}) {
      for (const bool causal : {false, true}) {
        fa::Inputs inputs = fa::random_inputs(fa::Problem{1, 2, 2, 300, 1000, dim, causal}, seed++);
        const double scale_log2 = fa::softmax_scale(inputs.problem) / std::log(2.0);  // log2 e = 1 / ln 2
        for (float& value : inputs.q) value = 1.0f + 0.05f * value;
        for (int64_t row = 0; row < 2 * 1000; ++row) {
          const int64_t key = row % 1000;
          const double climb = 0.04 * static_cast<double>(key) + 12.0 * static_cast<double>(key / 300);
          for (int64_t d = 0; d < dim; ++d) {
            float& value = inputs.k[static_cast<std::size_t>(row * dim + d)];
            value = static_cast<float>(climb / (scale_log2 * static_cast<double>(dim))) + 0.02f * value;
          }
        }
        INFO("D " << dim << (causal ? ", causal" : ""));
        fa::test::check_stage_on(stage, inputs, 0, true);
      }
    }
  }
}
