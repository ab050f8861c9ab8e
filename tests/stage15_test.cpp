// Stage 15: ring attention. The schedule on its own (the zigzag partition covers every position once,
// every (query, key) pair the mask allows is computed exactly once, the steps are balanced); then the
// same schedule run on the CPU ring (P ranks in host memory, stages 01 and 11 in plain C++), on one
// GPU through the loopback (P virtual ranks) and over NCCL on several GPUs, each against the double
// reference on the whole sequence: O, the LSE and dQ, dK, dV. The CPU cases need no GPU; the GPU
// ones report skipped without one ("no CUDA device") and the NCCL ones without two ("too few GPUs";
// a failure instead when FA_REQUIRE_GPUS names at least two).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "fa/device.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/reference.hpp"
#include "gpu_contract.hpp"
#include "rings.hpp"

namespace {

using namespace fa;
using namespace fa::ring;

// The whole-sequence results of a ring, as FP32 in the original layout.
struct Results {
  std::vector<float> o, lse, grad_q, grad_k, grad_v;
};

// Each of P ranks' shards of the whole tensors (host floats).
struct HostShards {
  std::vector<std::vector<float>> q, k, v, o, lse, grad_o, grad_q, grad_k, grad_v;
};

Results gather_results(const HostShards& shards, const Partition& partition, const Problem& problem) {
  Results results;
  const int64_t q_heads = problem.q_heads_total(), kv_heads = problem.kv_heads_total();
  results.o.resize(problem.q_elements());
  results.lse.resize(problem.q_rows());
  results.grad_q.resize(problem.q_elements());
  results.grad_k.resize(problem.kv_elements());
  results.grad_v.resize(problem.kv_elements());
  for (int rank = 0; rank < partition.ranks; ++rank) {
    unshard(shards.o[rank], partition, rank, q_heads, problem.dim, results.o);
    unshard(shards.lse[rank], partition, rank, q_heads, 1, results.lse);
    unshard(shards.grad_q[rank], partition, rank, q_heads, problem.dim, results.grad_q);
    unshard(shards.grad_k[rank], partition, rank, kv_heads, problem.dim, results.grad_k);
    unshard(shards.grad_v[rank], partition, rank, kv_heads, problem.dim, results.grad_v);
  }
  return results;
}

HostShards shard_inputs(const Inputs& inputs, const std::vector<float>& grad_o, const Partition& partition) {
  const Problem& problem = inputs.problem;
  const int64_t q_heads = problem.q_heads_total(), kv_heads = problem.kv_heads_total();
  HostShards shards;
  for (int rank = 0; rank < partition.ranks; ++rank) {
    shards.q.push_back(shard(inputs.q, partition, rank, q_heads, problem.dim));
    shards.k.push_back(shard(inputs.k, partition, rank, kv_heads, problem.dim));
    shards.v.push_back(shard(inputs.v, partition, rank, kv_heads, problem.dim));
    shards.grad_o.push_back(shard(grad_o, partition, rank, q_heads, problem.dim));
    shards.o.push_back(std::vector<float>(shards.q.back().size(), NAN));  // poisoned: unwritten fails
    shards.lse.push_back(std::vector<float>(shards.q.back().size() / problem.dim, NAN));
    shards.grad_q.push_back(std::vector<float>(shards.q.back().size(), NAN));
    shards.grad_k.push_back(std::vector<float>(shards.k.back().size(), NAN));
    shards.grad_v.push_back(std::vector<float>(shards.k.back().size(), NAN));
  }
  return shards;
}

// The ring on the CPU: shards in host memory.
Results run_host_ring(int ranks, const Inputs& inputs, const std::vector<float>& grad_o) {
  const Partition partition(ranks, inputs.problem.q_seq);
  HostShards host = shard_inputs(inputs, grad_o, partition);
  std::vector<Shard> shards(ranks);
  std::vector<ShardGradients> gradients(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    shards[rank] = {host.q[rank].data(), host.k[rank].data(), host.v[rank].data(), host.o[rank].data(),
                    host.lse[rank].data()};
    gradients[rank] = {host.grad_o[rank].data(), host.grad_q[rank].data(), host.grad_k[rank].data(),
                       host.grad_v[rank].data()};
  }
  std::unique_ptr<Ring> ring = make_host_ring(ranks);
  const Status forward = ring_forward(*ring, inputs.problem, shards);
  REQUIRE(forward.ok());
  const Status backward = ring_backward(*ring, inputs.problem, shards, gradients);
  REQUIRE(backward.ok());
  return gather_results(host, partition, inputs.problem);
}

// The ring on GPUs (`devices`, one entry a rank): shards encoded in `precision`, each in its rank's memory.
Results run_gpu_ring(Ring& ring, const std::vector<int>& devices, Precision precision, const Inputs& inputs,
                     const std::vector<float>& grad_o) {
  const int ranks = ring.ranks();
  const Partition partition(ranks, inputs.problem.q_seq);
  HostShards host = shard_inputs(inputs, grad_o, partition);
  std::vector<std::vector<DeviceBuffer>> buffers(ranks);  // q k v o lse dO dQ dK dV
  std::vector<Shard> shards(ranks);
  std::vector<ShardGradients> gradients(ranks);
  for (int rank = 0; rank < ranks; ++rank) {
    REQUIRE(cudaSetDevice(devices[rank]) == cudaSuccess);
    for (const std::vector<float>* tensor : {&host.q[rank], &host.k[rank], &host.v[rank], &host.o[rank]}) {
      buffers[rank].push_back(DeviceBuffer::from(encode(*tensor, precision)));
    }
    buffers[rank].push_back(DeviceBuffer::from(host.lse[rank]));
    for (const std::vector<float>* tensor :
         {&host.grad_o[rank], &host.grad_q[rank], &host.grad_k[rank], &host.grad_v[rank]}) {
      buffers[rank].push_back(DeviceBuffer::from(encode(*tensor, precision)));
    }
    const std::vector<DeviceBuffer>& b = buffers[rank];
    shards[rank] = {b[0].get(), b[1].get(), b[2].get(), b[3].get(), b[4].as<float>()};
    gradients[rank] = {b[5].get(), b[6].get(), b[7].get(), b[8].get()};
  }
  const Status forward = ring_forward(ring, inputs.problem, shards);
  REQUIRE(forward.ok());
  const Status backward = ring_backward(ring, inputs.problem, shards, gradients);
  REQUIRE(backward.ok());
  REQUIRE(ring.synchronize().ok());
  for (int rank = 0; rank < ranks; ++rank) {
    const std::vector<DeviceBuffer>& b = buffers[rank];
    host.o[rank] = decode(b[3].to_vector<unsigned char>(), precision);
    host.lse[rank] = b[4].to_vector<float>();
    host.grad_q[rank] = decode(b[6].to_vector<unsigned char>(), precision);
    host.grad_k[rank] = decode(b[7].to_vector<unsigned char>(), precision);
    host.grad_v[rank] = decode(b[8].to_vector<unsigned char>(), precision);
  }
  return gather_results(host, partition, inputs.problem);
}

double max_abs(const std::vector<float>& values) {
  double largest = 0.0;
  for (float value : values) largest = std::fmax(largest, std::fabs(value));
  return largest;
}

// The ring's results against the double reference on the whole sequence: O and the LSE of every
// row, dQ, dK and dV of every (batch, K/V head) group.
void check_against_reference(const Results& results, const Inputs& inputs, const std::vector<float>& grad_o,
                             Precision precision) {
  std::vector<double> expected_lse;
  const std::vector<double> expected_o = reference_attention(inputs, &expected_lse);
  const double logits = logit_bound(inputs.q, inputs.k, inputs.problem.dim);
  const ErrorReport o_errors = compare(results.o, expected_o, tolerance(precision, max_abs(inputs.v), logits));
  INFO("O: " << o_errors.summary());
  CHECK(o_errors.passed());
  const ErrorReport lse_errors = compare_lse(results.lse, expected_lse, lse_tolerance(logits));
  INFO("LSE: " << lse_errors.summary());
  CHECK(lse_errors.passed());

  std::vector<int64_t> groups(static_cast<size_t>(inputs.problem.kv_heads_total()));
  for (size_t g = 0; g < groups.size(); ++g) groups[g] = static_cast<int64_t>(g);
  const GradientReference reference = reference_backward(inputs, grad_o, groups);
  // reference_backward lists, group by group, the dQ of its query heads, then its dK and dV: the
  // whole tensors in order, since the groups are all of them in order.
  const double unit = gradient_tolerance_unit(precision, logits);
  const ErrorReport dq = compare_gradient(results.grad_q, reference.dq, reference.dq_bound, unit);
  const ErrorReport dk = compare_gradient(results.grad_k, reference.dk, reference.dk_bound, unit);
  const ErrorReport dv = compare_gradient(results.grad_v, reference.dv, reference.dv_bound, unit);
  INFO("dQ: " << dq.summary() << "\ndK: " << dk.summary() << "\ndV: " << dv.summary());
  CHECK(dq.passed());
  CHECK(dk.passed());
  CHECK(dv.passed());
}

// Shapes for the rings: B·H > 1, GQA, chunks that are not multiples of any stage's tiles, causal or
// not. N = 2·P·chunk.
std::vector<Problem> ring_shapes(int ranks, int64_t dim) {
  std::vector<Problem> shapes;
  for (bool causal : {false, true}) {
    shapes.push_back({2, 2, 2, 2 * ranks * 13, 2 * ranks * 13, dim, causal});
    shapes.push_back({1, 4, 2, 2 * ranks * 37, 2 * ranks * 37, dim, causal});  // GQA
    shapes.push_back({1, 2, 1, 2 * ranks * 70, 2 * ranks * 70, dim, causal});  // MQA, chunks past a 64-key tile
  }
  return shapes;
}

std::string describe_case(const Problem& problem, int ranks) {
  return describe(problem) + (problem.causal ? " causal" : "") + ", P = " + std::to_string(ranks);
}

// Fewer than `needed` GPUs: skipped, or a failure when FA_REQUIRE_GPUS says this machine has them.
void require_gpus(int needed) {
  test::require_cuda_device(80);
  int visible = 0;
  REQUIRE(cudaGetDeviceCount(&visible) == cudaSuccess);
  if (visible >= needed) return;
  const std::string why =
      "too few GPUs: " + std::to_string(visible) + " visible, the test needs " + std::to_string(needed);
  const char* required = std::getenv("FA_REQUIRE_GPUS");
  if (required != nullptr && std::atoi(required) >= needed) FAIL(why + " -- and FA_REQUIRE_GPUS=" << required);
  test::skip(why);
}

}  // namespace

TEST_CASE("stage15: the zigzag gives rank r chunks r and 2P-1-r, every position once") {
  for (int ranks : {1, 2, 3, 4, 8}) {
    const int64_t chunk = 3;
    const Partition partition(ranks, 2 * ranks * chunk);
    std::vector<int> owners(static_cast<size_t>(2 * ranks * chunk), 0);
    for (int rank = 0; rank < ranks; ++rank) {
      for (int64_t local = 0; local < partition.local_seq(); ++local) {
        const int64_t position = partition.global_position(rank, local);
        ++owners[static_cast<size_t>(position)];
        // Local order is global order: the first chunk lies before the second.
        if (local > 0) CHECK(position > partition.global_position(rank, local - 1));
        CHECK(position / chunk == (local < chunk ? rank : 2 * ranks - 1 - rank));
      }
    }
    for (int count : owners) CHECK(count == 1);
    // shard then unshard gives the tensor back.
    std::vector<float> whole(static_cast<size_t>(2 * 2 * ranks * chunk * 5));
    for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i);
    std::vector<float> back(whole.size(), -1.0f);
    for (int rank = 0; rank < ranks; ++rank) unshard(shard(whole, partition, rank, 2, 5), partition, rank, 2, 5, back);
    CHECK(back == whole);
  }
}

TEST_CASE("stage15: each rank holds every block once, passed on from the rank before") {
  for (int ranks : {1, 2, 3, 5, 8}) {
    for (int rank = 0; rank < ranks; ++rank) {
      std::vector<int> seen(static_cast<size_t>(ranks), 0);
      for (int step = 0; step < ranks; ++step) {
        ++seen[static_cast<size_t>(block_source(rank, step, ranks))];
        if (step > 0)
          CHECK(block_source(rank, step, ranks) == block_source((rank + ranks - 1) % ranks, step - 1, ranks));
      }
      CHECK(block_source(rank, 0, ranks) == rank);
      for (int count : seen) CHECK(count == 1);
    }
  }
}

TEST_CASE("stage15: the steps compute every pair the mask allows once, the same work on every rank") {
  for (int ranks : {1, 2, 3, 4, 8}) {
    for (bool causal : {false, true}) {
      const int64_t chunk = 4;
      const int64_t seq = 2 * ranks * chunk;
      const Partition partition(ranks, seq);
      std::vector<int> computed(static_cast<size_t>(seq * seq), 0);
      std::vector<std::vector<int64_t>> pairs(static_cast<size_t>(ranks), std::vector<int64_t>(ranks, 0));
      for (int rank = 0; rank < ranks; ++rank) {
        for (int step = 0; step < ranks; ++step) {
          const int source = block_source(rank, step, ranks);
          const BlockTask task = block_task(rank, source, causal);
          const HalfRows queries = half_rows(task.queries, chunk), keys = half_rows(task.keys, chunk);
          for (int64_t i = 0; i < queries.count; ++i) {
            for (int64_t j = 0; j < keys.count; ++j) {
              // Inside a task the mask is the local stage's: bottom-right aligned on its own rows.
              if (task.causal && j >= causal_key_end(i, queries.count, keys.count)) continue;
              const int64_t query = partition.global_position(rank, queries.first + i);
              const int64_t key = partition.global_position(source, keys.first + j);
              ++computed[static_cast<size_t>(query * seq + key)];
              ++pairs[static_cast<size_t>(rank)][static_cast<size_t>(step)];
            }
          }
        }
      }
      for (int64_t query = 0; query < seq; ++query) {
        for (int64_t key = 0; key < seq; ++key) {
          const int expected = !causal || key < causal_key_end(query, seq, seq) ? 1 : 0;
          CHECK(computed[static_cast<size_t>(query * seq + key)] == expected);
        }
      }
      // Balance: at every step every rank has the same number of pairs.
      for (int step = 0; step < ranks; ++step) {
        for (int rank = 1; rank < ranks; ++rank) CHECK(pairs[rank][step] == pairs[0][step]);
      }
    }
  }
}

TEST_CASE("stage15: the local stages are 11 or 13 backward, 13 on Hopper only") {
  CHECK(local_stages(Precision::bf16, 80).backward.id == std::string("11_backward"));
  CHECK(local_stages(Precision::bf16, 80).forward.id == std::string("08_mma_registers"));
  CHECK(local_stages(Precision::fp16, 90).forward.id == std::string("10_overlap"));
  CHECK(local_stages(Precision::fp16, 90, 13).backward.id == std::string("13_wgmma_backward"));
  CHECK_THROWS_AS(local_stages(Precision::bf16, 80, 13), std::invalid_argument);
  CHECK_THROWS_AS(local_stages(Precision::bf16, 90, 12), std::invalid_argument);
}

TEST_CASE("stage15: the ring refuses a sequence it cannot split, with the reason") {
  CHECK(ring_unsupported_reason(Problem::square(1, 1, 12, 8), 2).empty());
  CHECK(ring_unsupported_reason(Problem::square(1, 1, 10, 8), 2).find("multiple of 2·P") != std::string::npos);
  CHECK(!ring_unsupported_reason({1, 1, 1, 8, 16, 8, false}, 2).empty());
  std::unique_ptr<Ring> ring = make_host_ring(2);
  std::vector<float> data(10 * 8, 0.0f);
  const Shard shard{data.data(), data.data(), data.data(), data.data(), data.data()};
  const Status status = ring_forward(*ring, Problem::square(1, 1, 10, 8), {shard, shard});
  CHECK(status.code() == Status::Code::unsupported);
}

TEST_CASE("stage15: the CPU ring equals the reference on the whole sequence (forward and backward)") {
  for (int ranks : {1, 2, 3, 4}) {
    for (const Problem& problem : ring_shapes(ranks, 16)) {
      INFO(describe_case(problem, ranks));
      const Inputs inputs = random_inputs(problem, 15);
      const std::vector<float> grad_o = random_output_gradient(problem, 15);
      check_against_reference(run_host_ring(ranks, inputs, grad_o), inputs, grad_o, Precision::fp32);
    }
  }
}

TEST_CASE("stage15: the CPU ring merges logits of magnitude 1e3 exactly (the partials' LSEs far apart)") {
  for (int ranks : {2, 3}) {
    for (bool causal : {false, true}) {
      const Problem problem{1, 2, 2, 2 * ranks * 9, 2 * ranks * 9, 8, causal};
      INFO(describe_case(problem, ranks));
      const Inputs inputs = large_logit_inputs(problem, 3);
      const std::vector<float> grad_o = random_output_gradient(problem, 3);
      check_against_reference(run_host_ring(ranks, inputs, grad_o), inputs, grad_o, Precision::fp32);
    }
  }
}

TEST_CASE("stage15: the loopback ring on one GPU equals the reference (FP16, BF16)") {
  test::require_cuda_device(80);
  int device = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  const DeviceInfo info = query_device();
  // Stage 11's backward everywhere, and on Hopper stage 13's too.
  std::vector<int> backward_stages = {11};
  if (info.compute_capability == 90) backward_stages.push_back(13);
  for (int backward_stage : backward_stages) {
    for (Precision precision : {Precision::fp16, Precision::bf16}) {
      const LocalStages stages = local_stages(precision, info.compute_capability, backward_stage);
      for (int ranks : {1, 2, 3}) {
        std::unique_ptr<Ring> ring = make_loopback_ring(ranks, stages);
        for (const Problem& problem : ring_shapes(ranks, 64)) {
          INFO(describe_case(problem, ranks) << " " << precision_name(precision) << ", forward " << stages.forward.id
                                             << ", backward " << stages.backward.id);
          Inputs inputs = random_inputs(problem, 7);
          round_to_precision(inputs, precision);
          std::vector<float> grad_o = random_output_gradient(problem, 7);
          round_to_precision(grad_o, precision);
          const Results results =
              run_gpu_ring(*ring, std::vector<int>(static_cast<size_t>(ranks), device), precision, inputs, grad_o);
          check_against_reference(results, inputs, grad_o, precision);
        }
      }
    }
  }
}

TEST_CASE("stage15: the NCCL ring over two GPUs and more equals the reference") {
  require_gpus(2);
  int visible = 0;
  REQUIRE(cudaGetDeviceCount(&visible) == cudaSuccess);
  const DeviceInfo info = query_device();
  for (int ranks = 2; ranks <= visible; ranks *= 2) {
    std::vector<int> devices(static_cast<size_t>(ranks));
    for (int rank = 0; rank < ranks; ++rank) devices[rank] = rank;
    const LocalStages stages = local_stages(Precision::bf16, info.compute_capability);
    std::unique_ptr<Ring> ring = make_nccl_ring(devices, stages);
    for (const Problem& problem : ring_shapes(ranks, 128)) {
      INFO(describe_case(problem, ranks) << " bf16 over NCCL");
      Inputs inputs = random_inputs(problem, 11);
      round_to_precision(inputs, Precision::bf16);
      std::vector<float> grad_o = random_output_gradient(problem, 11);
      round_to_precision(grad_o, Precision::bf16);
      check_against_reference(run_gpu_ring(*ring, devices, Precision::bf16, inputs, grad_o), inputs, grad_o,
                              Precision::bf16);
    }
  }
}
