// bin/15_ring: ring attention over P GPUs of this machine (--gpus P, NCCL), or over P virtual ranks
// on one GPU (--loopback P). Runs the whole sequence on one GPU with the same local stage too, checks
// the ring against it and prints both times, the efficiency T(1) / (P · T(P)), and the model's two
// numbers: one step's compute and one K/V pass alone.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <stdexcept>

#include "fa/cli.hpp"
#include "fa/device.hpp"
#include "fa/device_buffer.hpp"
#include "fa/inputs.hpp"
#include "fa/metrics.hpp"
#include "fa/runner.hpp"
#include "fa/timing.hpp"
#include "rings.hpp"

namespace {

using namespace fa;
using namespace fa::ring;

struct Options {
  int gpus = 0;
  int loopback = 0;
  Problem problem = Problem::square(1, 16, 32768, 128);
  std::string dtype = "bf16";
  bool backward = false;
  int backward_stage = 11;
  int warmup = 2;
  int reps = 5;
};

// One tensor on every rank: each rank's shard, encoded, in that rank's memory.
std::vector<DeviceBuffer> upload_shards(const std::vector<float>& whole, const Partition& partition,
                                        const std::vector<int>& devices, int64_t heads, int64_t width,
                                        Precision precision) {
  std::vector<DeviceBuffer> shards;
  for (int rank = 0; rank < partition.ranks; ++rank) {
    FA_CUDA_CHECK(cudaSetDevice(devices[rank]));
    shards.push_back(DeviceBuffer::from(encode(shard(whole, partition, rank, heads, width), precision)));
  }
  return shards;
}

std::vector<float> download_whole(const std::vector<DeviceBuffer>& shards, const Partition& partition, int64_t heads,
                                  int64_t width, Precision precision) {
  std::vector<float> whole(static_cast<size_t>(heads * 2 * partition.ranks * partition.chunk * width));
  for (int rank = 0; rank < partition.ranks; ++rank) {
    unshard(decode(shards[rank].to_vector<unsigned char>(), precision), partition, rank, heads, width, whole);
  }
  return whole;
}

double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected) {
  double difference = 0.0, norm = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    difference += (double{actual[i]} - expected[i]) * (double{actual[i]} - expected[i]);
    norm += double{expected[i]} * expected[i];
  }
  return std::isfinite(difference) ? std::sqrt(difference / std::max(norm, 1e-300)) : INFINITY;
}

int run(const Options& options) {
  const int ranks = options.gpus > 0 ? options.gpus : options.loopback;
  // A problem the ring cannot split is bad input, refused before any GPU is looked for.
  if (const std::string why = ring_unsupported_reason(options.problem, ranks); !why.empty()) {
    std::fprintf(stderr, "15_ring: %s\n", why.c_str());
    return kExitBadInput;
  }
  const DeviceInfo device = query_device();
  if (!device.present) {
    std::fprintf(stderr, "15_ring: %s\n", describe_missing_gpu(device).c_str());
    return kExitNoDevice;
  }
  int visible = 0;
  FA_CUDA_CHECK(cudaGetDeviceCount(&visible));
  if (options.gpus > visible) {
    std::fprintf(stderr,
                 "15_ring: --gpus %d, but this machine shows %d GPU(s); --loopback %d runs %d virtual ranks on one\n",
                 options.gpus, visible, options.gpus, options.gpus);
    return kExitNoDevice;
  }
  const Problem& problem = options.problem;
  const Precision precision = options.dtype == "fp16" ? Precision::fp16 : Precision::bf16;
  if (options.backward_stage == 13 && device.compute_capability != 90) {
    std::fprintf(stderr, "15_ring: --backward-stage 13 runs on an H100 or H200 (sm_90a) only; this is %s\n",
                 device.name.c_str());
    return kExitNoDevice;
  }
  const LocalStages stages = local_stages(precision, device.compute_capability, options.backward_stage);
  for (const StageDescriptor* stage : {&stages.forward, &stages.backward}) {
    if (const std::string why = stage_unavailable_reason(*stage, device); !why.empty()) {
      std::fprintf(stderr, "15_ring: %s\n", why.c_str());
      return kExitNoDevice;
    }
  }
  std::printf("local stages: forward %s, backward %s\n", stages.forward.id, stages.backward.id);
  std::vector<int> devices(static_cast<size_t>(ranks), 0);
  if (options.gpus > 0) std::iota(devices.begin(), devices.end(), 0);
  std::unique_ptr<Ring> ring = options.gpus > 0 ? make_nccl_ring(devices, stages) : make_loopback_ring(ranks, stages);

  // Inputs, sharded by the zigzag.
  Inputs inputs = random_inputs(problem, 1);
  round_to_precision(inputs, precision);
  std::vector<float> grad_o = random_output_gradient(problem, 1);
  round_to_precision(grad_o, precision);
  const Partition partition(ranks, problem.q_seq);
  const int64_t q_heads = problem.q_heads_total(), kv_heads = problem.kv_heads_total(), dim = problem.dim;
  std::vector<DeviceBuffer> q = upload_shards(inputs.q, partition, devices, q_heads, dim, precision);
  std::vector<DeviceBuffer> k = upload_shards(inputs.k, partition, devices, kv_heads, dim, precision);
  std::vector<DeviceBuffer> v = upload_shards(inputs.v, partition, devices, kv_heads, dim, precision);
  std::vector<DeviceBuffer> d_o = upload_shards(grad_o, partition, devices, q_heads, dim, precision);
  std::vector<DeviceBuffer> o, lse, dq, dk, dv;
  std::vector<Shard> shards(ranks);
  std::vector<ShardGradients> gradients(ranks);
  const size_t bytes = static_cast<size_t>(precision_bytes(precision));
  for (int rank = 0; rank < ranks; ++rank) {
    FA_CUDA_CHECK(cudaSetDevice(devices[rank]));
    o.emplace_back(q[rank].bytes());
    lse.emplace_back(q[rank].bytes() / bytes / dim * sizeof(float));
    dq.emplace_back(q[rank].bytes());
    dk.emplace_back(k[rank].bytes());
    dv.emplace_back(v[rank].bytes());
    shards[rank] = {q[rank].get(), k[rank].get(), v[rank].get(), o[rank].get(), lse[rank].as<float>()};
    gradients[rank] = {d_o[rank].get(), dq[rank].get(), dk[rank].get(), dv[rank].get()};
  }
  bool with_backward = options.backward;  // what ring_pass and single_pass run: fwd, or fwd+bwd
  const auto ring_pass = [&] {
    Status status = ring_forward(*ring, problem, shards);
    if (status.ok() && with_backward) status = ring_backward(*ring, problem, shards, gradients);
    if (status.ok()) status = ring->synchronize();
    if (!status.ok()) throw std::runtime_error("the ring: " + status.reason());
  };

  // The same problem, whole, on one GPU with the same local stages.
  FA_CUDA_CHECK(cudaSetDevice(devices[0]));
  std::vector<DeviceBuffer> whole_q, whole_k, whole_v, whole_o, whole_do, whole_dq, whole_dk, whole_dv, whole_lse;
  whole_q.push_back(DeviceBuffer::from(encode(inputs.q, precision)));
  whole_k.push_back(DeviceBuffer::from(encode(inputs.k, precision)));
  whole_v.push_back(DeviceBuffer::from(encode(inputs.v, precision)));
  whole_do.push_back(DeviceBuffer::from(encode(grad_o, precision)));
  for (auto* buffers : {&whole_o, &whole_dq}) buffers->emplace_back(whole_q[0].bytes());
  for (auto* buffers : {&whole_dk, &whole_dv}) buffers->emplace_back(whole_k[0].bytes());
  whole_lse.emplace_back(static_cast<size_t>(problem.q_rows()) * sizeof(float));
  DeviceBuffer forward_workspace(static_cast<size_t>(workspace_bytes(stages.forward, problem, Pass::forward)));
  DeviceBuffer backward_workspace(static_cast<size_t>(workspace_bytes(stages.backward, problem, Pass::backward)));
  const auto single_pass = [&] {
    ForwardArgs forward{problem,          whole_q[0].get(),         whole_k[0].get(),        whole_v[0].get(),
                        whole_o[0].get(), whole_lse[0].as<float>(), forward_workspace.get(), nullptr};
    Status status = stages.forward.forward(forward);
    if (status.ok() && with_backward) {
      BackwardArgs backward{problem,           whole_q[0].get(),  whole_k[0].get(),         whole_v[0].get(),
                            whole_o[0].get(),  whole_do[0].get(), whole_lse[0].as<float>(), whole_dq[0].get(),
                            whole_dk[0].get(), whole_dv[0].get(), backward_workspace.get(), nullptr};
      status = stages.backward.backward(backward);
    }
    if (status.ok()) status = Status::cuda(cudaDeviceSynchronize());
    if (!status.ok()) throw std::runtime_error("the single GPU: " + status.reason());
  };

  // The ring against the single GPU: O within twice the forward's tolerance (each carries one),
  // the gradients' relative L2 difference within 8 unit roundoffs.
  ring_pass();
  single_pass();
  const double v_max = std::fabs(*std::max_element(inputs.v.begin(), inputs.v.end(),
                                                   [](float a, float b) { return std::fabs(a) < std::fabs(b); }));
  const std::vector<float> single_o = decode(whole_o[0].to_vector<unsigned char>(), precision);
  const ErrorReport o_errors =
      compare(download_whole(o, partition, q_heads, dim, precision),
              std::vector<double>(single_o.begin(), single_o.end()), 2.0 * tolerance(precision, v_max));
  bool passed = o_errors.passed();
  std::printf("O   vs one GPU: %s\n", o_errors.summary().c_str());
  if (options.backward) {
    const double unit = precision == Precision::fp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    const char* names[] = {"dQ", "dK", "dV"};
    const std::vector<DeviceBuffer>* ring_grads[] = {&dq, &dk, &dv};
    const DeviceBuffer* single_grads[] = {&whole_dq[0], &whole_dk[0], &whole_dv[0]};
    for (int g = 0; g < 3; ++g) {
      const int64_t heads = g == 0 ? q_heads : kv_heads;
      const double difference = relative_l2(download_whole(*ring_grads[g], partition, heads, dim, precision),
                                            decode(single_grads[g]->to_vector<unsigned char>(), precision));
      std::printf("%s  vs one GPU: relative L2 difference %.3g (limit %.3g)\n", names[g], difference, 8 * unit);
      passed = passed && difference <= 8 * unit;
    }
  }

  // Forward alone, then (with --backward) forward and backward.
  for (const bool backward : {false, true}) {
    if (backward && !options.backward) break;
    with_backward = backward;
    const Timing ring_time = time_host(ring_pass, options.warmup, options.reps);
    FA_CUDA_CHECK(cudaSetDevice(devices[0]));
    const Timing single_time = time_host(single_pass, options.warmup, options.reps);
    std::printf("%s, %s, %s %s %s: one GPU %.3f ms; ring of %d (%s) %.3f ms; efficiency %.3f\n", device.name.c_str(),
                describe(problem).c_str(), options.dtype.c_str(), problem.causal ? "causal" : "non-causal",
                backward ? "fwd+bwd" : "fwd", single_time.ms_median, ranks, options.gpus > 0 ? "NCCL" : "loopback",
                ring_time.ms_median, single_time.ms_median / (ranks * ring_time.ms_median));
  }

  // The model's two numbers (README, "The model"): one step's work on one GPU (a middle step: all
  // 2·chunk queries against one chunk of keys, unmasked; twice that for fwd+bwd's backward), and one
  // pass of a K/V block alone.
  Problem step = problem;
  step.q_seq = partition.local_seq();
  step.kv_seq = partition.chunk;
  step.causal = false;
  DeviceBuffer step_workspace(static_cast<size_t>(workspace_bytes(stages.forward, step, Pass::forward)));
  FA_CUDA_CHECK(cudaSetDevice(devices[0]));
  const Timing step_time = time_host(
      [&] {
        const ForwardArgs forward{step,       q[0].get(),         k[0].get(),           v[0].get(),
                                  o[0].get(), lse[0].as<float>(), step_workspace.get(), nullptr};
        if (!stages.forward.forward(forward).ok() || cudaDeviceSynchronize() != cudaSuccess) {
          throw std::runtime_error("timing one step failed");
        }
      },
      options.warmup, options.reps);
  std::printf("model: one step's forward (Nq = %lld, Nk = %lld, unmasked) %.3f ms", static_cast<long long>(step.q_seq),
              static_cast<long long>(step.kv_seq), step_time.ms_median);
  if (ranks > 1) {
    std::vector<std::vector<Transfer>> transfers(ranks);
    for (int rank = 0; rank < ranks; ++rank) {
      const int next = (rank + 1) % ranks;
      transfers[rank] = {{k[rank].get(), dk[next].get(), static_cast<int64_t>(k[rank].bytes())},
                         {v[rank].get(), dv[next].get(), static_cast<int64_t>(v[rank].bytes())}};
    }
    const Timing pass_time = time_host(
        [&] {
          int pass = 0;
          if (!ring->pass_to_next(transfers, &pass).ok() || !ring->synchronize().ok()) {
            throw std::runtime_error("timing one pass failed");
          }
        },
        options.warmup, options.reps);
    const double pass_bytes = 2.0 * static_cast<double>(k[0].bytes());
    std::printf("; one K/V pass (%.1f MB a rank) %.3f ms, %.0f GB/s a link", pass_bytes / 1e6, pass_time.ms_median,
                pass_bytes / pass_time.ms_median / 1e6);
  }
  std::printf("\n");
  return passed ? kExitOk : kExitWrong;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"Stage 15: ring attention, the sequence split across GPUs (zigzag), K/V blocks passed around a ring",
               "15_ring"};
  auto* gpus =
      app.add_option("--gpus", options.gpus, "ranks, one a GPU of this machine, over NCCL")->check(CLI::Range(1, 128));
  auto* loopback = app.add_option("--loopback", options.loopback, "ranks, all virtual on one GPU (no NCCL)")
                       ->check(CLI::Range(1, 128));
  gpus->excludes(loopback);
  app.add_option("-B,--batch", options.problem.batch, "batch")->check(CLI::Range(1, 1 << 20));
  app.add_option("-H,--heads", options.problem.q_heads, "query heads")->check(CLI::Range(1, 1 << 20));
  app.add_option("--kv-heads", options.problem.kv_heads, "key/value heads (default: --heads)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("-N,--seq", options.problem.q_seq, "whole sequence length")->check(CLI::Range(1, 1 << 24));
  app.add_option("-D,--dim", options.problem.dim, "head dim")->check(CLI::Range(1, 256));
  app.add_flag("--causal", options.problem.causal, "causal mask (zigzag balances it)");
  app.add_option("--dtype", options.dtype, "fp16 or bf16")->check(CLI::IsMember({"fp16", "bf16"}));
  app.add_flag("--backward", options.backward, "also check and time forward and backward (fwd+bwd)");
  app.add_option("--backward-stage", options.backward_stage, "the local backward: 11 (sm_80+) or 13 (Hopper)")
      ->check(CLI::IsMember({11, 13}));
  app.add_option("--warmup", options.warmup, "untimed runs")->check(CLI::Range(0, 1000));
  app.add_option("--reps", options.reps, "timed runs")->check(CLI::Range(1, 1000));
  app.footer(
      "Exit codes: 0 ok, 1 wrong output, 2 bad command line or a problem the ring does not take, 4 no CUDA GPU here "
      "(too few, or one too old for the local stages), 5 CUDA or NCCL error.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    // One line, as the other stages' command lines say it.
    std::fprintf(stderr, "15_ring: %s (see --help)\n", error.what());
    return kExitBadInput;
  }
  if (app.count("--kv-heads") == 0) options.problem.kv_heads = options.problem.q_heads;
  options.problem.kv_seq = options.problem.q_seq;
  if (options.gpus == 0 && options.loopback == 0) {
    std::fprintf(stderr, "15_ring: say how many ranks: --gpus P (P GPUs over NCCL) or --loopback P (one GPU)\n");
    return kExitBadInput;
  }
  if (options.problem.q_heads % options.problem.kv_heads != 0) {
    std::fprintf(stderr, "15_ring: --kv-heads %lld does not divide --heads %lld (see --help)\n",
                 static_cast<long long>(options.problem.kv_heads), static_cast<long long>(options.problem.q_heads));
    return kExitBadInput;
  }
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "15_ring: %s\n", error.what());
    return kExitError;
  }
}
