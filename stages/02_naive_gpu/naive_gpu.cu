// Stage 02: attention as a direct CUDA translation of its definition, three kernels in a row:
//
//   1. S = Q K^T · scale   one thread per score, written to an N × N matrix per head in global memory
//   2. P = softmax(S)      one block per row of S, in place
//   3. O = P V             one thread per output element
//
// Every kernel is correct and simple, and the whole is slow for one reason: S. It holds
// B·H·N² floats (4.3 GB at B=4, H=16, N=4096), is written once, read and rewritten by the
// softmax and read once more by the third kernel, so the memory it needs grows with N² and runs
// out long before the inputs do. And no thread reuses anything it loads: every multiply-add of
// kernels 1 and 3 loads both of its operands from memory. The later stages remove both costs.
//
// Causal masking (query i sees keys 0..i; the rule lives in common/include/fa/causal.hpp): the
// scores above the diagonal would be -inf and weigh exp(-inf) = 0, so no kernel touches them.
// Kernel 1 computes and stores only S[i][0..i], and kernels 2 and 3 read only that part of each
// row: the upper triangle of S is never written or read (it is still allocated: the layout of S
// does not change).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "fa/cuda_check.hpp"
#include "fa/kernel/launch_order.cuh"
#include "fa/problem.hpp"
#include "fa/stage.hpp"
#include "fa_source_hash.h"

namespace fa::stages {
namespace {

constexpr int64_t kMaxDim = 256;
constexpr int kThreads = 256;          // per block, every kernel
constexpr int kWarps = kThreads / 32;  // the softmax kernel reduces over its warps
// grid.x can hold 2^31 - 1 blocks; capping it lower and striding over the rest keeps any B·H·N·N
// (which passes 2^31 at realistic sizes) inside the limits with 64-bit indices.
constexpr int64_t kMaxBlocks = int64_t{1} << 24;

int64_t blocks_for(int64_t work_items, int64_t items_per_block) {
  return std::min((work_items + items_per_block - 1) / items_per_block, kMaxBlocks);
}

// With causal masking, how many keys the query of row head · N + i sees: keys 0..i. The rule is
// causal.hpp's, taken here in 32 bits (visible_key_limit): i, the keys and N fit an int
// (N <= 2^24), and kernel 1 pays for every instruction of it on every score. Called only when
// masking, so the 64-bit remainder is too.
__device__ int causal_keys(int64_t query_row, int64_t seq) {
  const int n = static_cast<int>(seq);
  return visible_key_limit(static_cast<int>(query_row % seq), n, n, true);
}

// Kernel 1: S[head][i][j] = (q_i · k_j) · scale. Neighbouring threads take neighbouring keys j of
// the same query i, so their writes to S are contiguous; their reads of k_j are D floats apart.
// A thread whose key its query does not see skips it: no dot product, nothing written.
__global__ void scores_kernel(const float* q, const float* k, float* scores, int64_t seq, int dim, float scale,
                              bool causal, int64_t total_scores) {
  for (int64_t index = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; index < total_scores;
       index += int64_t{gridDim.x} * blockDim.x) {
    const int64_t key = index % seq;
    const int64_t query_row = index / seq;  // (head · N + i): the row of Q, and of S
    if (causal && static_cast<int>(key) >= causal_keys(query_row, seq)) continue;
    const int64_t head = query_row / seq;
    const float* query = q + query_row * dim;
    const float* key_row = k + (head * seq + key) * dim;
    float dot = 0.0f;
    for (int d = 0; d < dim; ++d) dot += query[d] * key_row[d];
    scores[index] = dot * scale;
  }
}

// The row softmax needs two reductions over a row (its max, then its sum) that all the block's
// threads must see: each warp reduces with shuffles, then every thread combines the warps' results.
template <typename Combine>
__device__ float block_reduce(float value, Combine combine) {
  __shared__ float warp_results[kWarps];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  __syncthreads();  // every thread has read the previous reduction's results
  if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = value;
  __syncthreads();
  float result = warp_results[0];
#pragma unroll
  for (int warp = 1; warp < kWarps; ++warp) result = combine(result, warp_results[warp]);
  return result;
}

__device__ float block_max(float value) {
  return block_reduce(value, [](float a, float b) { return fmaxf(a, b); });
}

__device__ float block_sum(float value) {
  return block_reduce(value, [](float a, float b) { return a + b; });
}

// Kernel 2: each row of S becomes softmax(row), in place. One block per row: its threads stride
// over the row, so any N works, and with one row per block few rows are in flight at a time (a few
// MB at N = 4096), so the second and third sweeps below find the row in cache: DRAM sees S read
// about once and written once here. A row is its first `keys` scores: N, or i + 1 with causal
// masking (at least one, so the max is finite and the sum at least exp(0) = 1).
__global__ void softmax_rows_kernel(float* scores, int64_t seq, bool causal, int64_t rows) {
  for (int64_t row_index = blockIdx.x; row_index < rows; row_index += gridDim.x) {
    const int64_t keys = causal ? causal_keys(row_index, seq) : seq;
    // EXERCISE BEGIN: the row max (block_max), the sum of exp(s - max) (block_sum), then write exp(s - max) / sum
    float* row = scores + row_index * seq;
    // Subtracting the row max first makes every exponent <= 0: exp cannot overflow, however large the
    // scores, and the result is unchanged because the factor exp(-max) cancels in the quotient.
    float thread_max = -INFINITY;
    for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) thread_max = fmaxf(thread_max, row[j]);
    const float row_max = block_max(thread_max);

    float thread_sum = 0.0f;
    for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) thread_sum += expf(row[j] - row_max);
    const float inverse_sum = 1.0f / block_sum(thread_sum);

    for (int64_t j = threadIdx.x; j < keys; j += blockDim.x) row[j] = expf(row[j] - row_max) * inverse_sum;
    // EXERCISE END
  }
}

// Kernel 3: O[head][i][d] = sum_j P[head][i][j] · V[head][j][d], over the keys row i sees.
// Neighbouring threads take neighbouring d: their reads of V are contiguous, and they all read the
// same P element.
__global__ void output_kernel(const float* probabilities, const float* v, float* o, int64_t seq, int dim, bool causal,
                              int64_t total_outputs) {
  for (int64_t index = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; index < total_outputs;
       index += int64_t{gridDim.x} * blockDim.x) {
    const int d = static_cast<int>(index % dim);
    const int64_t query_row = index / dim;
    const int64_t head = query_row / seq;
    const int64_t keys = causal ? causal_keys(query_row, seq) : seq;
    const float* p_row = probabilities + query_row * seq;
    const float* v_column = v + head * seq * dim + d;
    float sum = 0.0f;
    for (int64_t j = 0; j < keys; ++j) sum += p_row[j] * v_column[j * dim];
    o[index] = sum;
  }
}

// S as B·H·N·N floats, in 64 bits: at (4, 16, 4096, 128) that is 4.3 GB, past 2^31 and 2^32.
// Within the harness's limits (B·H·N·D <= 2^36, N <= 2^24) it stays below 2^62.
int64_t workspace_bytes(const Problem& problem, Pass /*pass*/) {
  return problem.q_heads_total() * problem.q_seq * problem.kv_seq * static_cast<int64_t>(sizeof(float));
}

// The runner has checked the problem against the descriptor (sizes, head dim, features) and
// allocated the workspace before this runs.
Status forward(const ForwardArgs& args) {
  const Problem& problem = args.problem;
  const int64_t seq = problem.q_seq;  // this stage takes Nq = Nk only (its descriptor says so)
  const int dim = static_cast<int>(problem.dim);
  float* scores = static_cast<float*>(args.workspace);
  const int64_t total_scores = problem.q_heads_total() * seq * seq;

  scores_kernel<<<blocks_for(total_scores, kThreads), kThreads, 0, args.stream>>>(
      static_cast<const float*>(args.q), static_cast<const float*>(args.k), scores, seq, dim, softmax_scale(problem),
      problem.causal, total_scores);
  FA_LAUNCH_TRY();

  softmax_rows_kernel<<<blocks_for(problem.q_rows(), 1), kThreads, 0, args.stream>>>(scores, seq, problem.causal,
                                                                                     problem.q_rows());
  FA_LAUNCH_TRY();

  output_kernel<<<blocks_for(problem.q_elements(), kThreads), kThreads, 0, args.stream>>>(
      scores, static_cast<const float*>(args.v), static_cast<float*>(args.o), seq, dim, problem.causal,
      problem.q_elements());
  FA_LAUNCH_TRY();
  return Status();
}

}  // namespace

StageDescriptor naive_gpu() {
  StageDescriptor stage;
  stage.id = "02_naive_gpu";
  stage.title = "Direct CUDA translation: S = QK^T, softmax and PV as three kernels, S in global memory";
  stage.backend = Backend::cuda;
  stage.precision = Precision::fp32;
  stage.forward = &forward;
  stage.workspace_bytes = &workspace_bytes;
  stage.max_dim = kMaxDim;
  stage.architecture = {75, false};
  stage.features.causal = true;  // and nothing else: square problems (Hq = Hkv, Nq = Nk), no LSE
  stage.trace = nullptr;
  stage.kv_passes = 1.0;  // unused: scripts/traffic.py models this stage's S in global memory on its own
  stage.source_hash = FA_SOURCE_HASH;
  return stage;
}

}  // namespace fa::stages
