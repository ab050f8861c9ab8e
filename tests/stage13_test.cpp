// Stage 13: the backward pass on wgmma (FP16 and BF16, exactly sm_90a). Its forward pass is stage
// 10's, so the shared contract runs on it too; the backward is compared with the double reference's
// gradients (reference_backward) on every (batch, K/V head) group, with stage 11's per-element
// tolerances from 16-bit rounding (metrics.hpp, gradient_tolerance_unit). The runner poisons dQ,
// dK and dV with NaN first, so an unwritten element fails.
//
// Structural tests (tests/structural_tests.cmake, SOURCE stages/13_wgmma_backward/wgmma_backward.cu,
// ARCH 90a): the PTX holds the five products as wgmma (both operands from shared memory for Sᵀ and
// dPᵀ, A from registers for dV and dK, both transposed for dQ; at D = 256 Sᵀ and dPᵀ of 32 queries
// and dV, dK with A from shared memory), the TMA ring, the bulk copies of the LSE and D, setmaxnreg
// and dQ's 16-byte atomic adds; ptxas spills nothing. On a GPU that is not sm_90 every GPU case here
// reports skipped (require_stage_runnable).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <vector>

#include "backward_contract.hpp"
#include "catch_compat.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/problem.hpp"
#include "fa/runner.hpp"
#include "fa/stage.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"
#include "last_wave.hpp"

FA_GPU_STAGE_CONTRACT("stage13", fa::stages::wgmma_backward_fp16, fa::stages::wgmma_backward_bf16)

namespace {

const std::initializer_list<fa::StageDescriptor (*)()> kStages = {fa::stages::wgmma_backward_fp16,
                                                                  fa::stages::wgmma_backward_bf16};

using fa::test::check_backward;
using fa::test::DeterministicMode;

// The general shapes of stage 11's tests, and 300 queries against 260 keys: several key tiles of 128
// and query tiles of 64, each partial.
std::vector<fa::Problem> general_problems(int64_t dim) {
  std::vector<fa::Problem> problems = fa::test::general_problems(dim);
  for (const bool causal : {false, true}) problems.push_back(fa::Problem{1, 4, 1, 300, 260, dim, causal});
  return problems;
}

// 16-bit copies of random numbers in [-1, 1) (FP16 or BF16), for direct calls of the stage.
std::vector<uint16_t> random_elements(int64_t count, bool bf16, uint64_t seed) {
  std::vector<uint16_t> values(static_cast<std::size_t>(count));
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& value : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float x = static_cast<float>(state >> 40) / static_cast<float>(1ull << 24) * 2.0f - 1.0f;
    if (bf16) {
      const __nv_bfloat16 element = __float2bfloat16(x);
      value = *reinterpret_cast<const uint16_t*>(&element);
    } else {
      const __half element = __float2half(x);
      value = *reinterpret_cast<const uint16_t*>(&element);
    }
  }
  return values;
}

// dQ, dK and dV of two backward calls on the same inputs, byte for byte.
std::vector<uint16_t> gradients_of_one_call(const fa::StageDescriptor& stage, const fa::Problem& problem,
                                            const std::vector<fa::DeviceBuffer>& inputs, fa::DeviceBuffer& lse) {
  const int64_t q_bytes = problem.q_elements() * 2;
  const int64_t kv_bytes = problem.kv_elements() * 2;
  fa::DeviceBuffer grad_q(static_cast<std::size_t>(q_bytes));
  fa::DeviceBuffer grad_k(static_cast<std::size_t>(kv_bytes));
  fa::DeviceBuffer grad_v(static_cast<std::size_t>(kv_bytes));
  fa::DeviceBuffer workspace(static_cast<std::size_t>(fa::workspace_bytes(stage, problem, fa::Pass::backward)));
  fa::BackwardArgs args;
  args.problem = problem;
  args.q = inputs[0].get();
  args.k = inputs[1].get();
  args.v = inputs[2].get();
  args.o = inputs[3].get();
  args.grad_o = inputs[4].get();
  args.lse = lse.as<float>();
  args.grad_q = grad_q.get();
  args.grad_k = grad_k.get();
  args.grad_v = grad_v.get();
  args.workspace = workspace.get();
  const fa::Status status = stage.backward(args);
  INFO(status.reason());
  REQUIRE(status.ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<uint16_t> all = grad_q.to_vector<uint16_t>();
  for (const fa::DeviceBuffer* buffer : {&grad_k, &grad_v}) {
    const std::vector<uint16_t> part = buffer->to_vector<uint16_t>();
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

}  // namespace

TEST_CASE("stage13: describes what it takes") {
  // Needs no device.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    CHECK(stage.max_dim == 256);
    CHECK(stage.architecture.compute_capability == 90);
    CHECK(stage.architecture.exact);
    CHECK(fa::architecture_name(stage) == "sm_90a");
    CHECK(stage.features.backward);
    CHECK(stage.features.lse);
    CHECK(stage.features.causal);
    CHECK(stage.features.grouped);
    CHECK(stage.features.rectangular);
    REQUIRE(stage.backward != nullptr);
    // The workspace: dQ's FP32 sum (each query head's 100 rows rounded up to 128, in rows of the
    // head-dim bucket), the LSE and D of those rows, and a turn counter per 64 x 64 part of dQ's sum
    // (per 64 rows: one per consumer, or per dims panel at D = 256); at least what stage 11 needs,
    // which takes the shapes this stage hands over.
    const fa::Problem problem = fa::Problem::square(2, 3, 100, 64);
    const int64_t rows = problem.q_heads_total() * 128;
    const int64_t own = 4 * (rows * 64 + 2 * rows + rows / 64 * 2);
    const int64_t fallback = fa::workspace_bytes(fa::stages::backward_fp16(), problem, fa::Pass::backward);
    CHECK(fa::workspace_bytes(stage, problem, fa::Pass::backward) == std::max(own, fallback));
    // D = 200 takes the 256 bucket: rows of 256 floats, four parts per 64 rows.
    const fa::Problem wide = fa::Problem::square(2, 3, 100, 200);
    const int64_t wide_own = 4 * (rows * 256 + 2 * rows + rows / 64 * 4);
    CHECK(fa::workspace_bytes(stage, wide, fa::Pass::backward) ==
          std::max(wide_own, fa::workspace_bytes(fa::stages::backward_fp16(), wide, fa::Pass::backward)));
    // Where the last wave may split key tiles (D <= 128, 8 steps or more a tile; under the mask
    // fewer than 144 tiles), the split tiles' FP32 dK and dV too: 128 keys of the bucket's dims
    // each, for as many tiles as there are.
    const fa::Problem long_rows = fa::Problem::square(2, 3, 1000, 64);
    const int64_t long_head_rows = 1024;
    const int64_t long_rows_total = long_rows.q_heads_total() * long_head_rows;
    const int64_t split_floats = 8 * 6 * 2 * 128 * 64;  // 8 key tiles in each of 6 heads
    CHECK(fa::workspace_bytes(stage, long_rows, fa::Pass::backward) ==
          4 * (long_rows_total * 64 + split_floats + 2 * long_rows_total + long_rows_total / 64 * 2));
    const fa::Problem long_causal = fa::Problem::square(2, 3, 1000, 64, true);
    CHECK(fa::workspace_bytes(stage, long_causal, fa::Pass::backward) ==
          fa::workspace_bytes(stage, long_rows, fa::Pass::backward));
    const fa::Problem many_causal = fa::Problem::square(2, 8, 1200, 64, true);  // 160 key tiles
    const int64_t many_rows_total = many_causal.q_heads_total() * 1280;
    CHECK(fa::workspace_bytes(stage, many_causal, fa::Pass::backward) ==
          4 * (many_rows_total * 64 + 2 * many_rows_total + many_rows_total / 64 * 2));
    // D not a multiple of 8 is stage 11's.
    const fa::Problem odd = fa::Problem::square(2, 3, 100, 100);
    CHECK(fa::workspace_bytes(stage, odd, fa::Pass::backward) ==
          fa::workspace_bytes(fa::stages::backward_fp16(), odd, fa::Pass::backward));
    CHECK_FALSE(fa::unsupported_reason(stage, fa::Problem::square(1, 1, 64, 257), true, fa::Pass::backward).empty());
    CHECK(fa::unsupported_reason(stage, fa::Problem{2, 8, 2, 70, 35, 100, true}, true, fa::Pass::backward).empty());
  }
}

TEST_CASE("stage13: the wgmma backward matches the reference gradients in every bucket") {
  // D 8 .. 64 take the 64 bucket (Br = 128), 72 .. 128 the 128 bucket (Br = 64), 136 .. 256 the
  // 256 bucket (64 keys a block, dK and dV split by dims); N = 1, 31, 64, 65, 130, 197, 300: less
  // than a tile, whole tiles, several key and query tiles with partial ones.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1300;
    for (const int64_t seq : {1, 31, 64, 65, 130, 197, 300}) {
      for (const int64_t dim : {8, 40, 64, 72, 96, 128, 136, 200, 256})
        check_backward(stage, fa::Problem::square(2, 2, seq, dim), seed++);
    }
  }
}

TEST_CASE("stage13: the last wave's key tiles split into parts that end the launch sooner (no GPU)") {
  using fa::stages::wgmma_backward::kBlockOverheadSteps;
  using fa::stages::wgmma_backward::kMinGainPercent;
  using fa::stages::wgmma_backward::kMinPartSteps;
  using fa::stages::wgmma_backward::LastWave;
  using fa::stages::wgmma_backward::split_last_wave;
  const auto equal = [](int steps) { return [steps](int64_t) { return steps; }; };
  // Whole rounds, tiles too short to split, or a last round behind 15 whole ones ((4, 16, 4096, 128)
  // and (1, 16, 16384, 128) on 132 SMs: 2048 key tiles): nothing split.
  for (const LastWave& wave : {split_last_wave(2 * 132, 132, equal(64)), split_last_wave(100, 132, equal(2)),
                               split_last_wave(2048, 132, equal(64)), split_last_wave(2048, 132, equal(256))}) {
    CHECK(wave.split.split_tiles == 0);
    CHECK(wave.blocks() == wave.split.whole_tiles);
  }
  // Multi-query heads, (1, 32/1, 4096, 128): 32 key tiles of 32 · 64 steps for 132 SMs, 4 parts each;
  // under the causal mask tile t (heaviest first) has 32 · (64 − 2t) steps, and the heavy tiles get
  // more parts than the light ones.
  const LastWave multi_query = split_last_wave(32, 132, equal(32 * 64));
  CHECK(multi_query.split.whole_tiles == 0);
  CHECK(multi_query.split.split_tiles == 32);
  CHECK(multi_query.split.part_steps == 32 * 64 / 4);
  CHECK(multi_query.blocks() == 128);
  const LastWave causal = split_last_wave(32, 132, [](int64_t t) { return static_cast<int>(32 * (64 - 2 * t)); });
  REQUIRE(causal.split.split_tiles == 32);
  CHECK(causal.split.part_steps < multi_query.split.part_steps);  // the light tiles leave SMs for more parts
  CHECK(causal.split.first_block[1] - causal.split.first_block[0] >
        causal.split.first_block[32] - causal.split.first_block[31]);
  // For every count of tiles and steps, equal or falling: the split tiles are the rest of the last
  // round, every part has at least kMinPartSteps steps and none is empty, and the launch (counted
  // as the rule counts) is shorter by at least kMinGainPercent.
  int splits = 0;
  for (const int sms : {114, 132}) {
    for (int64_t tiles = 1; tiles <= 3 * sms; tiles += 7) {
      for (const int steps : {1, 5, 16, 33, 64, 256, 2048}) {
        for (const bool falling : {false, true}) {
          const auto steps_of = [&](int64_t t) {
            return falling ? std::max(1, static_cast<int>(steps - steps * t / tiles)) : steps;
          };
          const LastWave wave = split_last_wave(tiles, sms, steps_of);
          INFO("tiles " << tiles << ", steps " << steps << (falling ? " falling" : "") << ", SMs " << sms);
          const auto& split = wave.split;
          if (split.split_tiles == 0) {
            CHECK(split.whole_tiles == tiles);
            continue;
          }
          CHECK(split.split_tiles == tiles % sms);
          CHECK(split.whole_tiles + split.split_tiles == tiles);
          CHECK(split.part_steps >= kMinPartSteps);
          int longest = 0;
          for (int i = 0; i < split.split_tiles; ++i) {
            const int tile_steps = steps_of(split.whole_tiles + i);
            longest = std::max(longest, tile_steps);
            const int parts = split.first_block[i + 1] - split.first_block[i];
            CHECK((parts - 1) * split.part_steps < tile_steps);  // the last part is not empty
            CHECK(parts * split.part_steps >= tile_steps);       // the parts cover the tile
          }
          const int64_t whole_rounds = tiles / sms;
          const int64_t before = (whole_rounds + 1) * (longest + kBlockOverheadSteps);
          const int64_t split_rounds = (wave.blocks() - split.whole_tiles + sms - 1) / sms;
          const int64_t after =
              whole_rounds * (longest + kBlockOverheadSteps) + split_rounds * (split.part_steps + kBlockOverheadSteps);
          CHECK(after * (100 + kMinGainPercent) <= before * 100);
          ++splits;
        }
      }
    }
  }
  CHECK(splits > 0);
}

TEST_CASE("stage13: key tiles split in the last wave add up their dK and dV") {
  // Shapes whose last wave this GPU splits (the test says so first, from the heaviest tile's steps):
  // parts of a query head's tiles, parts that cross from one query head of a group to the next,
  // partial tiles, Nq != Nk; under the causal mask, fewer tiles than SMs, light tiles in fewer parts.
  int device = 0;
  int sms = 0;
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    REQUIRE(cudaGetDevice(&device) == cudaSuccess);
    REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
    uint64_t seed = 1900;
    for (const fa::Problem& problem :
         {fa::Problem{2, 4, 4, 1024, 1024, 128, false}, fa::Problem{1, 8, 2, 700, 700, 64, false},
          fa::Problem{1, 2, 2, 700, 700, 96, false}, fa::Problem{1, 4, 1, 1000, 600, 128, false},
          fa::Problem{2, 4, 4, 1024, 1024, 128, true}, fa::Problem{1, 8, 1, 1000, 1300, 64, true}}) {
      const int queries = problem.dim <= 64 ? 128 : 64;
      const int64_t tiles = (problem.kv_seq + 127) / 128 * problem.kv_heads_total();
      const int steps = static_cast<int>(problem.group_size() * ((problem.q_seq + queries - 1) / queries));
      INFO("(" << problem.batch << ", " << problem.q_heads << "/" << problem.kv_heads << ", " << problem.q_seq << ", "
               << problem.kv_seq << ", " << problem.dim << ") on " << sms << " SMs");
      const auto wave = fa::stages::wgmma_backward::split_last_wave(tiles, sms, [steps](int64_t) { return steps; });
      REQUIRE(wave.split.split_tiles > 0);
      check_backward(stage, problem, seed++);
    }
  }
}

TEST_CASE("stage13: head dims it does not take go to stage 11 and match the reference") {
  // D not a multiple of 8: TMA cannot describe the rows.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1350;
    for (const int64_t seq : {1, 65, 197}) {
      for (const int64_t dim : {1, 17, 100, 138, 250})
        check_backward(stage, fa::Problem::square(2, 2, seq, dim), seed++);
    }
  }
}

TEST_CASE("stage13: the wgmma backward under the causal mask") {
  // Diagonal tiles whole (64, 128, 256) or partial (65, 100, 129, 333); query tiles skipped above
  // the diagonal; the launch order heaviest first.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1400;
    for (const int64_t seq : {1, 5, 63, 64, 65, 100, 128, 129, 256, 333}) {
      for (const int64_t dim : {40, 64, 96, 128, 256})
        check_backward(stage, fa::Problem::square(2, 1, seq, dim, true), seed++);
    }
    // Eight key tiles of 128 keys (a cluster's at D = 256) a head: launch_order.cuh's wide bands
    // (six tiles, in bands of two) and its tail (two bands of one), over four heads.
    for (const int64_t dim : {64, 128, 256}) check_backward(stage, fa::Problem::square(2, 2, 1000, dim, true), seed++);
  }
}

TEST_CASE("stage13: the wgmma backward takes grouped-query heads and Nq != Nk") {
  // dK and dV summed over a group's query heads in registers; the causal mask bottom-right, with
  // rows that see no key.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1500;
    for (const int64_t dim : {64, 128, 48, 112, 256}) {
      for (const fa::Problem& problem : general_problems(dim)) check_backward(stage, problem, seed++);
    }
  }
}

TEST_CASE("stage13: the wgmma backward stays correct with logits of magnitude 1e3") {
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    for (const bool causal : {false, true}) {
      check_backward(stage, fa::large_logit_inputs(fa::Problem::square(2, 1, 200, 64, causal), 1600), 1600);
      check_backward(stage, fa::large_logit_inputs(fa::Problem::square(1, 2, 150, 128, causal), 1601), 1601);
      check_backward(stage, fa::large_logit_inputs(fa::Problem::square(1, 2, 150, 256, causal), 1602), 1602);
    }
  }
}

TEST_CASE("stage13: in the deterministic mode dQ's additions go in key order and match the reference") {
  const DeterministicMode deterministic;
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 1700;
    for (const int64_t dim : {64, 128, 96, 256}) {
      check_backward(stage, fa::Problem::square(2, 2, 300, dim), seed++);
      check_backward(stage, fa::Problem::square(2, 1, 333, dim, true), seed++);
      check_backward(stage, fa::Problem{2, 8, 2, 150, 270, dim, true}, seed++);
    }
  }
}

TEST_CASE("stage13: in the deterministic mode two calls give the same bits") {
  // Many key tiles add to every dQ tile (Nk = 2048: 16 of 128 keys, 32 of 64), where the atomics' order varies
  // from run to run; in key order the sums are the same bits every time.
  const DeterministicMode deterministic;
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    for (const bool causal : {false, true}) {
      for (const int64_t dim : {64, 128, 256}) {
        const fa::Problem problem{2, 4, 2, 512, 2048, dim, causal};
        const bool bf16 = stage.precision == fa::Precision::bf16;
        std::vector<fa::DeviceBuffer> inputs;
        uint64_t seed = 1800;
        for (const int64_t count : {problem.q_elements(), problem.kv_elements(), problem.kv_elements(),
                                    problem.q_elements(), problem.q_elements()}) {
          inputs.push_back(fa::DeviceBuffer::from(random_elements(count, bf16, seed++)));
        }
        // O and dO are random too: the LSE comes from the stage's forward on Q, K, V.
        fa::DeviceBuffer lse(static_cast<std::size_t>(problem.q_rows() * 4));
        fa::DeviceBuffer out(static_cast<std::size_t>(problem.q_elements() * 2));
        fa::DeviceBuffer forward_workspace(
            static_cast<std::size_t>(fa::workspace_bytes(stage, problem, fa::Pass::forward)));
        fa::ForwardArgs forward;
        forward.problem = problem;
        forward.q = inputs[0].get();
        forward.k = inputs[1].get();
        forward.v = inputs[2].get();
        forward.o = out.get();
        forward.lse = lse.as<float>();
        forward.workspace = forward_workspace.get();
        REQUIRE(stage.forward(forward).ok());
        const std::vector<uint16_t> first = gradients_of_one_call(stage, problem, inputs, lse);
        const std::vector<uint16_t> second = gradients_of_one_call(stage, problem, inputs, lse);
        INFO(fa::describe(problem) << (causal ? " causal" : ""));
        CHECK(first == second);
      }
    }
  }
}
