// What a stage tells the harness about itself. A stage folder holds its kernels and one
// descriptor; everything else (inputs, reference, timing, reporting) lives in common/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "fa/problem.hpp"

namespace fa {

enum class Precision { fp32, fp16, bf16 };
enum class Backend { cpu, cuda };

const char* precision_name(Precision precision);
int precision_bytes(Precision precision);

// Computes O for one problem. Pointers are device pointers for CUDA stages (host pointers for
// the CPU stage) holding elements of the stage's precision. The workspace holds at least
// workspace_bytes(shape) bytes. Launches are asynchronous on `stream`; the return value is the
// first error seen (cudaSuccess otherwise), launch errors included.
using ForwardFn = cudaError_t (*)(const Shape& shape, const void* q, const void* k, const void* v, void* o,
                                  void* workspace, cudaStream_t stream);
using WorkspaceFn = int64_t (*)(const Shape& shape);

// The online-softmax state after each K/V tile, for every query row. Rows are indexed
// (b·H + h)·N + i. o is the partial output already divided by l, so it is comparable whether a
// kernel keeps its accumulator normalized (FlashAttention-1) or not (FlashAttention-2).
struct TileTrace {
  int64_t tile = 0;   // K/V rows per tile
  int64_t tiles = 0;  // ceil(N / tile)
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
using TraceFn = cudaError_t (*)(const Shape& shape, const float* q, const float* k, const float* v, int64_t tile,
                                TileTrace& trace);

struct StageDescriptor {
  const char* id = "";     // folder name, e.g. "04_online_softmax"
  const char* title = "";  // one line
  Backend backend = Backend::cuda;
  Precision precision = Precision::fp32;
  ForwardFn forward = nullptr;
  WorkspaceFn workspace_bytes = nullptr;  // null: no workspace
  int64_t max_dim = 128;
  int min_compute_capability = 0;  // e.g. 80 for sm_80; 0 for the CPU stage
  TraceFn trace = nullptr;         // null: the stage cannot report per-tile state
  bool supports_causal = false;    // false: the runner refuses shapes with causal set
  const char* source_hash = "";    // hash of stages/<id> and common/ (see design.md)
};

int64_t workspace_bytes(const StageDescriptor& stage, const Shape& shape);

}  // namespace fa
