// Stage 12: split-KV decoding (FP16 and BF16 in and out, FP32 accumulation; sm_80 and newer). A
// group's query rows packed into one tile, the keys split across blocks, the partials merged by a
// second kernel; prefill shapes (Nq >= 64) run stage 08's kernel.
//
// The split rule and the workspace (split_kv.hpp) are checked here without a GPU. On a GPU the
// shared contract, then decode shapes (Nq in {1, 4, 16}, Hq/Hkv = 32/8 and others, long Nk, causal
// and not, every head-dim bucket, both copy paths), with more than one split and with one, against
// the double reference with the LSE; and a CUDA graph capture of one call.
//
// On an H100 or H200 the shapes of more than 16 packed rows up to D = 128 run the wgmma kernel
// (split_kv_wgmma.cu), the others the mma.sync kernel.
//
// Structural tests (tests/structural_tests.cmake, SOURCE stages/12_split_kv/split_kv.cu, ARCH 80
// and 90): mma.sync in both precisions, ldmatrix plain and transposing, cp.async, and a kernel of
// each bucket; split_kv_wgmma.cu for sm_90a: wgmma in both precisions and both operand kinds, the
// proxy fence; ptxas must report no spills. On a GPU older than sm_80 the GPU cases report skipped.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "catch_compat.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa/stages.hpp"
#include "gpu_contract.hpp"
#include "split_kv.hpp"

FA_GPU_STAGE_CONTRACT("stage12", fa::stages::split_kv_fp16, fa::stages::split_kv_bf16)

namespace {

namespace split_kv = fa::stages::split_kv;

const std::initializer_list<fa::StageDescriptor (*)()> kStages = {fa::stages::split_kv_fp16, fa::stages::split_kv_bf16};

// The decode shape: Hq = 32, Hkv = 8.
fa::Problem decode(int64_t batch, int64_t q_seq, int64_t kv_seq, int64_t dim, bool causal = false) {
  return {batch, 32, 8, q_seq, kv_seq, dim, causal};
}

// The splits this GPU uses for `problem` (Q, K and V from cudaMalloc: 16-byte aligned): the stage
// reads the same attributes.
int64_t splits_here(const fa::Problem& problem) {
  int device = 0;
  int sm_count = 0;
  int memory_khz = 0;
  int bus_bits = 0;
  int major = 0;
  int minor = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&memory_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess);
  const split_kv::BlockKernel kernel = split_kv::block_kernel(problem, major == 9 && minor == 0, problem.dim % 8 == 0);
  return split_kv::plan_split(problem, split_kv::wave_blocks(kernel, sm_count, memory_khz, bus_bits)).splits;
}

}  // namespace

TEST_CASE("stage12: which kernel a block runs") {
  // Needs no device. Up to 16 packed rows (Nq <= 4 at Hq/Hkv = 4) and D = 128 the warps split the
  // keys, on any GPU; more rows take a strip per warp, or on an H100 or H200 (hopper) one wgmma tile,
  // up to D = 128 on the cp.async path.
  using split_kv::BlockKernel;
  for (const bool hopper : {false, true}) {
    for (const int64_t q_seq : {1, 4}) {
      CHECK(split_kv::keys_across_warps(decode(16, q_seq, 65536, 128)));
      CHECK(split_kv::block_kernel(decode(16, q_seq, 65536, 128), hopper, true) == BlockKernel::keys_across_warps);
    }
    CHECK(split_kv::block_kernel(decode(1, 1, 65536, 256), hopper, true) == BlockKernel::strip_per_warp);
  }
  CHECK_FALSE(split_kv::keys_across_warps(decode(1, 5, 65536, 128)));  // 20 packed rows
  for (const int64_t dim : {8, 64, 120, 128}) {
    CHECK(split_kv::block_kernel(decode(1, 16, 65536, dim), true, true) == BlockKernel::wgmma);
    CHECK(split_kv::block_kernel(decode(1, 16, 65536, dim), false, true) == BlockKernel::strip_per_warp);
    CHECK(split_kv::block_kernel(decode(1, 16, 65536, dim), true, false) == BlockKernel::strip_per_warp);
  }
  CHECK(split_kv::block_kernel(decode(1, 5, 4096, 128), true, true) == BlockKernel::wgmma);
  CHECK(split_kv::block_kernel(decode(1, 16, 65536, 136), true, true) == BlockKernel::strip_per_warp);
}

TEST_CASE("stage12: blocks per SM follow the SM's share of the memory bandwidth") {
  // Needs no device. The attributes the lent H100 SXM (2619 MHz over 5120 bits: 3.35 TB/s) and
  // H200 (3201 MHz over 6016 bits: 4.81 TB/s) report, 132 SMs each.
  using split_kv::BlockKernel;
  const BlockKernel strips = BlockKernel::strip_per_warp;
  CHECK(split_kv::wave_blocks(strips, 132, 2619000, 5120) == 132);
  CHECK(split_kv::wave_blocks(strips, 132, 3201000, 6016) == 2 * 132);
  // No bandwidth reported: one block per SM; any bandwidth: at most the blocks that fit.
  CHECK(split_kv::wave_blocks(strips, 108, 0, 0) == 108);
  CHECK(split_kv::wave_blocks(strips, 16, 3201000, 6016) == split_kv::kMaxBlocksPerSm * 16);
  // A GPU past kMaxSmCount plans as one of kMaxSmCount SMs (the workspace is sized for that).
  CHECK(split_kv::wave_blocks(strips, 1000, 1000000, 1024) == split_kv::kMaxSmCount);
  // A block whose warps split the keys, or a wgmma block, streams an SM's share alone.
  for (const BlockKernel alone : {BlockKernel::keys_across_warps, BlockKernel::wgmma}) {
    const int64_t per_sm = alone == BlockKernel::wgmma ? split_kv::kWgmmaBlocksPerSm : 1;
    CHECK(split_kv::wave_blocks(alone, 132, 2619000, 5120) == per_sm * 132);
    CHECK(split_kv::wave_blocks(alone, 132, 3201000, 6016) == per_sm * 132);
    CHECK(split_kv::wave_blocks(alone, 1000, 3201000, 6016) == per_sm * split_kv::kMaxSmCount);
  }
  // The workspace is sized for the largest wave of any kernel.
  CHECK(split_kv::kWgmmaBlocksPerSm <= split_kv::kMaxBlocksPerSm);
}

TEST_CASE("stage12: the split rule fills the GPU, keeps chunks whole and long, and covers every key") {
  // Needs no device. 132 SMs (H100, H200) of one block each, or two.
  for (const int64_t wave : {132, 2 * 132}) {
    for (const int64_t batch : {1, 4, 16}) {
      for (const int64_t q_seq : {1, 4, 16}) {
        for (const int64_t kv_seq : {1, 100, 255, 256, 1000, 4096, 16384, 65536, 262144}) {
          const fa::Problem problem = decode(batch, q_seq, kv_seq, 128);
          const split_kv::KeySplit split = split_kv::plan_split(problem, wave);
          INFO(fa::describe(problem) << ", wave of " << wave << ": " << split.splits << " splits of "
                                     << split.chunk_keys << " keys");
          CHECK(split.splits >= 1);
          CHECK(split.splits <= split_kv::kMaxSplits);
          CHECK(split.chunk_keys % split_kv::kChunkAlign == 0);
          CHECK(split.splits * split.chunk_keys >= kv_seq);       // every key in a chunk
          CHECK((split.splits - 1) * split.chunk_keys < kv_seq);  // no empty chunk
          if (split.splits > 1) CHECK(split.chunk_keys >= split_kv::kMinChunkKeys);
          // B·Hkv blocks (the group's 4·Nq <= 64 rows are one tile) never start a second wave, and
          // with keys enough they fill most of one (rounding chunks up to whole tiles may leave a
          // split fewer than asked for).
          const int64_t blocks = batch * 8 * split.splits;
          CHECK(blocks <= std::max<int64_t>(wave, batch * 8));
          if (kv_seq >= 65536) CHECK(blocks + 2 * batch * 8 > wave);
        }
      }
    }
  }
  constexpr int kSms = 132;
  // Enough row tiles to fill the GPU: one split, no merge.
  CHECK(split_kv::plan_split(fa::Problem{64, 8, 4, 3, 5000, 64, false}, kSms).splits == 1);
  CHECK(split_kv::plan_split(decode(64, 1, 65536, 128), kSms).splits == 1);
  // Prefill shapes: stage 08's kernel, no split.
  CHECK(split_kv::hands_to_stage08(fa::Problem::square(1, 8, 4096, 128)));
  CHECK(split_kv::plan_split(fa::Problem::square(1, 8, 4096, 128), kSms).splits == 1);
  CHECK_FALSE(split_kv::hands_to_stage08(decode(1, 16, 4096, 128)));
}

TEST_CASE("stage12: describes what it takes and sizes its workspace") {
  // Needs no device.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    CHECK(std::strcmp(stage.id, "12_split_kv") == 0);
    CHECK(stage.max_dim == 256);
    CHECK(stage.architecture.compute_capability == 80);
    CHECK_FALSE(stage.architecture.exact);
    CHECK(stage.features.causal);
    CHECK(stage.features.grouped);
    CHECK(stage.features.rectangular);
    CHECK(stage.features.lse);
    CHECK_FALSE(stage.features.backward);
    // FP32 partial rows and one LSE per row for every split of the largest GPU; none without a split.
    const fa::Problem problem = decode(1, 4, 65536, 128);
    const int64_t splits = split_kv::plan_split(problem, split_kv::kMaxBlocksPerSm * split_kv::kMaxSmCount).splits;
    CHECK(splits > 1);
    CHECK(fa::workspace_bytes(stage, problem) == splits * problem.q_rows() * (128 + 1) * 4);
    CHECK(fa::workspace_bytes(stage, fa::Problem::square(4, 16, 4096, 128)) == 0);
    CHECK(fa::workspace_bytes(stage, decode(1, 4, 100, 128)) == 0);
    CHECK(fa::workspace_bytes(stage, problem, fa::Pass::backward) == 0);
    CHECK(fa::unsupported_reason(stage, decode(1, 16, 100000, 256, true), true).empty());
    CHECK_FALSE(fa::unsupported_reason(stage, decode(1, 1, 4096, 257)).empty());
  }
}

TEST_CASE("stage12: decode shapes match the reference, with several splits and the LSE") {
  // Nq = 1, 4 and 16 over Hq/Hkv = 32/8 (4, 16 and 64 packed rows), with Nk long enough for many
  // splits and not a multiple of the chunk (the last chunk partial, its last tile partial). Sampled
  // rows of every head, and the LSE.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 12000;
    for (const int64_t q_seq : {1, 4, 16}) {
      for (const int64_t kv_seq : {4096 + 37, 50000 + 3}) {
        for (const bool causal : {false, true}) {
          const fa::Problem problem = decode(1, q_seq, kv_seq, 128, causal);
          INFO(fa::describe(problem) << ": " << splits_here(problem) << " splits");
          CHECK(splits_here(problem) > 1);
          fa::test::check_stage_on(stage, fa::random_inputs(problem, seed++), 64, /*lse=*/true);
        }
      }
    }
  }
}

TEST_CASE("stage12: every head-dim bucket, padded and on the synchronous path, split and merged") {
  // D = 64, 128, 256 at the bucket's own size; 1, 40, 100, 200 padded up to it; 17, 90, 255 not whole
  // 16-byte chunks (ordinary loads). Nk = 3001 keys: several chunks, the last one partial.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 12100;
    for (const int64_t dim : {1, 17, 40, 64, 90, 100, 128, 200, 255, 256}) {
      for (const bool causal : {false, true}) {
        const fa::Problem problem{2, 6, 2, 5, 3001, dim, causal};
        CHECK(splits_here(problem) > 1);
        fa::test::check_stage_on(stage, fa::random_inputs(problem, seed++), 0, /*lse=*/true);
      }
    }
  }
}

TEST_CASE("stage12: one split (enough row tiles to fill the GPU) writes O and the LSE without a merge") {
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 12200;
    for (const bool causal : {false, true}) {
      // B·Hkv = 256 blocks of 24 packed rows (8 heads of a group, Nq = 3): enough to fill the GPU;
      // and a group of 32 heads (96 rows: 2 row tiles, the second partial) over too few keys to split.
      for (const fa::Problem problem :
           {fa::Problem{64, 32, 4, 3, 700, 64, causal}, fa::Problem{16, 32, 1, 3, 300, 128, causal}}) {
        INFO(fa::describe(problem));
        CHECK(splits_here(problem) == 1);
        fa::test::check_stage_on(stage, fa::random_inputs(problem, seed++), 256, /*lse=*/true);
      }
    }
  }
}

TEST_CASE("stage12: causal rows of a packed tile see different keys, and Nq > Nk leaves blind rows") {
  // Each packed tile holds the Nq positions of several heads: under the bottom-right mask its rows see
  // Nk - Nq + 1 .. Nk keys, and with Nq > Nk the first Nq - Nk positions see none (O = 0, LSE = -inf),
  // also when their chunk sees keys for the other rows. Nq = 63 (the largest this kernel takes), MQA;
  // and 16 packed rows (the warps split the keys), blind and not.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    uint64_t seed = 12300;
    for (const fa::Problem problem :
         {fa::Problem{1, 8, 1, 63, 2000, 64, true}, fa::Problem{2, 4, 2, 40, 30, 128, true},
          fa::Problem{1, 2, 1, 20, 1, 64, true}, fa::Problem{3, 4, 4, 1, 1, 32, true},
          fa::Problem{1, 16, 2, 7, 600, 256, true}, fa::Problem{1, 8, 1, 63, 2000, 100, false},
          fa::Problem{1, 4, 1, 4, 2, 64, true}, fa::Problem{2, 8, 2, 4, 900, 128, true}}) {
      fa::test::check_stage_on(stage, fa::random_inputs(problem, seed++), 0, /*lse=*/true);
    }
  }
}

TEST_CASE("stage12: one call captured in a CUDA graph replays to the same bits") {
  // No allocation or synchronization inside the call: it captures (in global mode, which refuses
  // unsafe calls), and the replay writes what a direct call wrote.
  for (const auto factory : kStages) {
    const fa::StageDescriptor stage = factory();
    fa::test::require_stage_runnable(stage);
    const fa::Problem problem = decode(2, 4, 20000, 128, true);
    REQUIRE(splits_here(problem) > 1);
    const auto bytes = [](int64_t elements) { return static_cast<std::size_t>(elements) * 2; };
    fa::DeviceBuffer q(bytes(problem.q_elements())), k(bytes(problem.kv_elements())), v(bytes(problem.kv_elements())),
        o(bytes(problem.q_elements())), lse(static_cast<std::size_t>(problem.q_rows()) * sizeof(float)),
        workspace(static_cast<std::size_t>(fa::workspace_bytes(stage, problem)));
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    // Small positive 16-bit values (0x2c2c: 0.065 in FP16, 2.4e-12 in BF16) in every input. Every
    // operation goes to `stream`: a non-blocking stream is not ordered after the legacy default one.
    for (const fa::DeviceBuffer* input : {&q, &k, &v}) {
      REQUIRE(cudaMemsetAsync(input->get(), 0x2c, input->bytes(), stream) == cudaSuccess);
    }
    fa::ForwardArgs args;
    args.problem = problem;
    args.q = q.get();
    args.k = k.get();
    args.v = v.get();
    args.o = o.get();
    args.lse = lse.as<float>();
    args.workspace = workspace.get();
    args.stream = stream;

    REQUIRE(stage.forward(args).ok());
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    std::vector<unsigned char> direct(o.bytes());
    o.download(direct.data(), direct.size());
    REQUIRE(cudaMemsetAsync(o.get(), 0xff, o.bytes(), stream) == cudaSuccess);  // NaN in either type

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t graph_exec = nullptr;
    REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    const fa::Status captured = stage.forward(args);
    REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    REQUIRE(captured.ok());
    REQUIRE(cudaGraphInstantiate(&graph_exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(graph_exec, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    std::vector<unsigned char> replayed(o.bytes());
    o.download(replayed.data(), replayed.size());
    CHECK(replayed == direct);
    cudaGraphExecDestroy(graph_exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}
