// What a stage tells the harness about itself. A stage folder holds its kernels and one
// descriptor; everything else (inputs, reference, timing, reporting) lives in common/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fa/problem.hpp"

namespace fa {

enum class Precision { fp32, fp16, bf16 };
enum class Backend { cpu, cuda };

const char* precision_name(Precision precision);
int precision_bytes(Precision precision);

// What a stage's call came to: done, declined (a shape or a GPU it does not take, with the
// reason), or a CUDA error. A stage that declines says so instead of failing a launch.
class Status {
 public:
  enum class Code { ok, unsupported, cuda_error };

  Status() = default;  // ok
  static Status unsupported(std::string reason) { return Status(Code::unsupported, cudaSuccess, std::move(reason)); }
  static Status cuda(cudaError_t error) {
    return error == cudaSuccess ? Status() : Status(Code::cuda_error, error, cudaGetErrorString(error));
  }

  bool ok() const { return code_ == Code::ok; }
  Code code() const { return code_; }
  cudaError_t cuda_error() const { return cuda_error_; }
  const std::string& reason() const { return reason_; }

 private:
  Status(Code code, cudaError_t error, std::string reason)
      : code_(code), cuda_error_(error), reason_(std::move(reason)) {}
  Code code_ = Code::ok;
  cudaError_t cuda_error_ = cudaSuccess;
  std::string reason_;
};

// A stage's forward pass: O (and, when `lse` is not null, the per-row log-sum-exp
// LSE = m + log(l) in natural-log units of the scaled scores, FP32, shape (B, Hq, Nq); -inf for
// a row that sees no key). Pointers are device pointers for CUDA stages (host pointers for the
// CPU stage) holding elements of the stage's precision. The workspace holds at least the bytes
// the stage's workspace function asked for. Launches are asynchronous on `stream`.
struct ForwardArgs {
  Problem problem;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // optional
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
};

// The backward pass: dQ, dK, dV (input precision) from Q, K, V, O, dO and the forward's LSE.
struct BackwardArgs {
  Problem problem;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const void* grad_o = nullptr;
  const float* lse = nullptr;
  void* grad_q = nullptr;
  void* grad_k = nullptr;
  void* grad_v = nullptr;
  void* workspace = nullptr;
  cudaStream_t stream = nullptr;
};

using ForwardFn = Status (*)(const ForwardArgs& args);
using BackwardFn = Status (*)(const BackwardArgs& args);
using WorkspaceFn = int64_t (*)(const Problem& problem, Pass pass);

// The online-softmax state after each K/V tile, for every query row. Rows are indexed
// (b·Hq + h)·Nq + i. o is the partial output already divided by l, so it is comparable whether a
// kernel keeps its accumulator normalized (FlashAttention-1) or not (FlashAttention-2).
struct TileTrace {
  int64_t tile = 0;   // K/V rows per tile
  int64_t tiles = 0;  // ceil(Nk / tile)
  int64_t rows = 0;
  int64_t dim = 0;
  std::vector<double> m;  // [tiles][rows]
  std::vector<double> l;  // [tiles][rows]
  std::vector<double> o;  // [tiles][rows][dim]
  double& m_at(int64_t t, int64_t r) { return m[t * rows + r]; }
  double& l_at(int64_t t, int64_t r) { return l[t * rows + r]; }
  double& o_at(int64_t t, int64_t r, int64_t d) { return o[(t * rows + r) * dim + d]; }
  double m_at(int64_t t, int64_t r) const { return m[t * rows + r]; }
  double l_at(int64_t t, int64_t r) const { return l[t * rows + r]; }
  const double& o_at(int64_t t, int64_t r, int64_t d) const { return o[(t * rows + r) * dim + d]; }
};

// Runs the stage with K/V tiles of `tile` rows on host FP32 inputs and records its trace.
using TraceFn = Status (*)(const Problem& problem, const float* q, const float* k, const float* v, int64_t tile,
                           TileTrace& trace);

// What a stage takes beyond the square (B, H, N, D) forward pass. The runner and the C ABI refuse
// anything else in one place, so a stage never sees a problem it did not declare.
struct Features {
  bool causal = false;
  bool grouped = false;      // Hkv < Hq (grouped-query and multi-query attention)
  bool rectangular = false;  // Nq != Nk
  bool lse = false;          // writes the log-sum-exp when asked
  bool backward = false;     // has a backward pass
};

// The GPUs a stage runs on: compute capability `compute_capability` or newer, or with `exact`
// that one alone (sm_90a's wgmma and setmaxnreg exist on Hopper only). 0: the CPU stage.
struct Architecture {
  int compute_capability = 0;
  bool exact = false;
};

struct StageDescriptor {
  const char* id = "";     // folder name, e.g. "04_online_softmax"
  const char* title = "";  // one line
  Backend backend = Backend::cuda;
  Precision precision = Precision::fp32;
  ForwardFn forward = nullptr;
  BackwardFn backward = nullptr;          // null unless features.backward
  WorkspaceFn workspace_bytes = nullptr;  // null: no workspace
  int64_t max_dim = 128;
  Architecture architecture;
  Features features;
  TraceFn trace = nullptr;  // null: the stage cannot report per-tile state
  // How many times the stage reads each K/V tile per query tile (stage 03's three passes read K
  // three times and V once: 2); what the traffic model of scripts/ expects from it.
  double kv_passes = 1.0;
  const char* source_hash = "";  // the source_hash of its rows (DESIGN.md, "Results CSV")
};

int64_t workspace_bytes(const StageDescriptor& stage, const Problem& problem, Pass pass = Pass::forward);

// "sm_80+" or "sm_90a"; "cpu".
std::string architecture_name(const StageDescriptor& stage);

// Empty when the stage takes this problem (with an LSE output when `wants_lse`, in `pass`), else
// one line that says why not: a size out of range, a head dim beyond the stage's, or a feature
// the stage does not have. Needs no GPU.
std::string unsupported_reason(const StageDescriptor& stage, const Problem& problem, bool wants_lse = false,
                               Pass pass = Pass::forward);

}  // namespace fa
