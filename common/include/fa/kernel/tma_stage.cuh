// The host side of a Hopper stage that reads Q, K and V with TMA (taught in stage 09's README,
// "The 128-byte swizzle and the tensor map" and "Causal masking, partial tiles, head dims, general shapes"):
// the padded copies a head dim that is not a multiple of 8 needs (and the workspace they take), the
// four tensor maps of Q, K, V and O, and the stage descriptor these stages share. Stages 09 and 10
// (and every later TMA stage) compose it; each keeps its own kernel and launch.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "fa/cuda_check.hpp"
#include "fa/kernel/convert.cuh"
#include "fa/kernel/tma.cuh"
#include "fa/kernel/wgmma_walk.cuh"
#include "fa/launch.hpp"
#include "fa/problem.hpp"
#include "fa/stage.hpp"

namespace fa::kernel {

constexpr int kTmaAlignElements = 8;  // TMA: a row's byte stride is a multiple of 16
constexpr int kTmaMaxDim = 256;       // the largest head-dim bucket of these stages

inline int64_t tma_padded_dim(int64_t dim) {
  return (dim + kTmaAlignElements - 1) / kTmaAlignElements * kTmaAlignElements;
}

// Bytes of the padded copies of Q, K and V; none when D is a multiple of 8 (TMA reads the inputs).
inline int64_t tma_workspace_bytes(const Problem& problem, Pass /*pass*/) {
  if (problem.dim % kTmaAlignElements == 0) return 0;
  return (problem.q_rows() + 2 * problem.kv_rows()) * tma_padded_dim(problem.dim) * 2;
}

// Rows whose D is not a multiple of 8 cannot be described to TMA: copy them into rows of
// `padded_dim` (the next multiple of 8), zero-filled. Used only for such head dims.
template <typename Element>
__global__ void pad_rows_kernel(const Element* __restrict__ source, Element* __restrict__ destination, int64_t rows,
                                int dim, int padded_dim) {
  const int64_t total = rows * padded_dim;
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = index / padded_dim;
    const int column = static_cast<int>(index % padded_dim);
    destination[index] = column < dim ? source[row * dim + column] : to_element<Element>(0.0f);
  }
}

template <typename Element>
Status pad_rows(const void* source, Element* destination, int64_t rows, const Problem& problem, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t total = rows * tma_padded_dim(problem.dim);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + kThreads - 1) / kThreads, 65536));
  pad_rows_kernel<Element><<<blocks, kThreads, 0, stream>>>(static_cast<const Element*>(source), destination, rows,
                                                            static_cast<int>(problem.dim),
                                                            static_cast<int>(tma_padded_dim(problem.dim)));
  FA_LAUNCH_TRY();
  return Status();
}

// Q, K and V as the tensor maps will describe them: the inputs, or their padded copies in the
// workspace (rows of `columns` elements); and whether O goes out by TMA too.
struct TmaInputs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t columns = 0;
  bool store_by_copy_engine = false;
};

// The runner has checked the problem (sizes, head dim, features) and the GPU (exactly sm_90)
// against the descriptor of stage `stage_id` before this runs.
template <typename Element>
Status tma_inputs(const ForwardArgs& args, const char* stage_id, TmaInputs* inputs) {
  const Problem& problem = args.problem;
  inputs->q = args.q;
  inputs->k = args.k;
  inputs->v = args.v;
  inputs->columns = problem.dim;
  const bool padded = problem.dim % kTmaAlignElements != 0;
  if (padded) {
    // TMA cannot describe rows of D elements: copy Q, K and V into rows of the next multiple of 8,
    // zero-filled, and read those. The kernel still scales by 1/sqrt(D) of the real D and writes
    // only D columns of O.
    if (args.workspace == nullptr || !aligned16(args.workspace)) {
      return Status::unsupported(std::string(stage_id) + ": head dim " + std::to_string(problem.dim) +
                                 " needs the declared workspace (16-byte aligned) for padded copies of Q, K and V");
    }
    inputs->columns = tma_padded_dim(problem.dim);
    Element* q_copy = static_cast<Element*>(args.workspace);
    Element* k_copy = q_copy + problem.q_rows() * inputs->columns;
    Element* v_copy = k_copy + problem.kv_rows() * inputs->columns;
    FA_STATUS_TRY(pad_rows<Element>(args.q, q_copy, problem.q_rows(), problem, args.stream));
    FA_STATUS_TRY(pad_rows<Element>(args.k, k_copy, problem.kv_rows(), problem, args.stream));
    FA_STATUS_TRY(pad_rows<Element>(args.v, v_copy, problem.kv_rows(), problem, args.stream));
    inputs->q = q_copy;
    inputs->k = k_copy;
    inputs->v = v_copy;
  } else if (!all_aligned16({args.q, args.k, args.v})) {
    return Status::unsupported(std::string(stage_id) + ": TMA reads Q, K and V only from 16-byte aligned addresses");
  }
  // O goes out by TMA too when it can be described to it; else element by element.
  inputs->store_by_copy_engine = !padded && aligned16(args.o);
  return Status();
}

// The tensor maps: Q and O are (B·Hq) x Nq x D, K and V (B·Hkv) x Nk x D, with `columns` the
// (possibly padded) row length, in boxes of 64 columns (one swizzled panel) and `query_rows`,
// `key_rows` and 64 rows (one warpgroup's O). A grouped query head finds its K/V head by coordinate.
struct AttentionMaps {
  CUtensorMap query{};
  CUtensorMap key{};
  CUtensorMap value{};
  CUtensorMap out{};
};

template <typename Element>
Status encode_attention_maps(const ForwardArgs& args, const TmaInputs& inputs, uint32_t query_rows, uint32_t key_rows,
                             AttentionMaps* maps) {
  const Problem& problem = args.problem;
  constexpr bool kBf16 = std::is_same_v<Element, __nv_bfloat16>;
  FA_STATUS_TRY(encode_matrix_stack(maps->query, kBf16, inputs.q, inputs.columns, problem.q_seq,
                                    problem.q_heads_total(), kPanelColumns, query_rows));
  FA_STATUS_TRY(encode_matrix_stack(maps->key, kBf16, inputs.k, inputs.columns, problem.kv_seq,
                                    problem.kv_heads_total(), kPanelColumns, key_rows));
  FA_STATUS_TRY(encode_matrix_stack(maps->value, kBf16, inputs.v, inputs.columns, problem.kv_seq,
                                    problem.kv_heads_total(), kPanelColumns, key_rows));
  if (inputs.store_by_copy_engine) {
    FA_STATUS_TRY(encode_matrix_stack(maps->out, kBf16, args.o, problem.dim, problem.q_seq, problem.q_heads_total(),
                                      kPanelColumns, kMmaRows));
  }
  return Status();
}

// The descriptor of a TMA stage: sm_90a (wgmma and setmaxnreg; TMA and mbarrier's byte count need
// sm_90), every feature of the forward pass, head dims 1 .. 256, the padded copies' workspace (or a
// stage's own that holds them: `workspace_function`).
inline StageDescriptor describe_tma_stage(const char* id, Precision precision, ForwardFn forward_function,
                                          const char* title, const char* source_hash,
                                          WorkspaceFn workspace_function = &tma_workspace_bytes) {
  StageDescriptor stage;
  stage.id = id;
  stage.title = title;
  stage.backend = Backend::cuda;
  stage.precision = precision;
  stage.forward = forward_function;
  stage.workspace_bytes = workspace_function;
  stage.max_dim = kTmaMaxDim;
  stage.architecture = {90, true};
  stage.features.causal = true;
  stage.features.grouped = true;
  stage.features.rectangular = true;
  stage.features.lse = true;
  stage.features.backward = false;
  stage.trace = nullptr;
  stage.kv_passes = 1.0;
  stage.source_hash = source_hash;
  return stage;
}

}  // namespace fa::kernel
