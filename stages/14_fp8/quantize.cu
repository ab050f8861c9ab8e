// Stage 14's quantization pass: FP16/BF16 Q, K, V to e4m3 with block scales, bit for bit the CPU
// model of fp8_numerics.hpp (its contract, points 2-5), and V transposed for the attention kernel's
// 8-bit P·V (quantize.hpp). Three kernels, all bounded by memory traffic:
//
//   quantize_qk_kernel      a block per (head, 128 rows) of Q or K: each warp holds 8 rows in
//                           registers (rotated in place when asked), the block's amax from them,
//                           then the codes; nothing is read twice.
//   value_amax_kernel       V's per-channel amax over all keys of a head: a thread per channel, a
//                           block per 256 keys, merged by an integer atomicMax (non-negative floats
//                           order as their bit patterns do).
//   quantize_value_kernel   a block per (head, 64 keys, 64 channels): codes into a shared tile at
//                           their transposed, permuted places, then out as 16-byte rows of Vᵀ.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "fa/cuda_check.hpp"
#include "fa/kernel/warp.cuh"
#include "fa/launch.hpp"
#include "fp8_numerics.hpp"
#include "quantize.hpp"

namespace fa::fp8 {
namespace {

using kernel::kFullWarp;
using kernel::kWarpSize;

constexpr int kQkThreads = 512;     // 16 warps, 8 rows each: a 128-row block
constexpr int kAmaxKeys = 256;      // keys per block of value_amax_kernel
constexpr int kValueTileKeys = 64;  // keys per block of quantize_value_kernel
constexpr int kValueTileDims = 64;  // channels per block
constexpr int kValueThreads = 256;
constexpr int kLayoutAlign = 256;  // every tensor of the workspace starts on such a boundary

template <typename Element>
__device__ __forceinline__ float to_float(Element value) {
  if constexpr (std::is_same_v<Element, __half>) {
    return __half2float(value);
  } else {
    return __bfloat162float(value);
  }
}

// The contract's point 2: descale and inv from a block's amax, 1 and 1 where 448/amax is not finite.
struct Scale {
  float descale;
  float inv;
};
__device__ __forceinline__ Scale scale_of(float amax) {
  const float inv = kE4m3Max / amax;
  if (amax > 0.0f && isfinite(inv)) return {amax / kE4m3Max, inv};
  return {1.0f, 1.0f};
}

// Two FP32 values as two e4m3 bytes, `low` first (cvt.rn.satfinite: the contract's encode_e4m3).
__device__ __forceinline__ unsigned short pack_e4m3x2(float low, float high) {
  unsigned short packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(packed) : "f"(high), "f"(low));
  return packed;
}

// The rotation of the contract's point 4 on a row spread over a warp: lane l holds elements
// l·kPerLane .. l·kPerLane + kPerLane - 1. Stages of len < kPerLane pair elements of one lane; the
// rest pair lane l with lane l ^ (len / kPerLane), the lower index taking a + b, the upper a - b,
// the same float operations as the CPU's butterfly, so the results are equal bit for bit.
template <int kPerLane, int kDimPad>
__device__ __forceinline__ void hadamard_rotate(float (&x)[kPerLane], int lane, float scale) {
#pragma unroll
  for (int len = 1; len < kDimPad; len *= 2) {
    if (len < kPerLane) {
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        if ((e & len) == 0) {
          const float a = x[e];
          const float b = x[e + len];
          x[e] = a + b;
          x[e + len] = a - b;
        }
      }
    } else {
      const int lane_bit = len / kPerLane;
      const bool upper = (lane & lane_bit) != 0;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const float other = __shfl_xor_sync(kFullWarp, x[e], lane_bit);
        x[e] = upper ? other - x[e] : x[e] + other;
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) x[e] *= scale;
}

// Q or K: a block per (head, 128-row block), blockIdx.x = head · blocks_per_head + block.
template <typename Element, int kDimPad>
__global__ void __launch_bounds__(kQkThreads)
    quantize_qk_kernel(const Element* __restrict__ source, uint8_t* __restrict__ codes, float* __restrict__ descales,
                       int seq, int dim, int blocks_per_head, bool rotate, float rotation_scale) {
  constexpr int kPerLane = kDimPad / kWarpSize;
  constexpr int kWarps = kQkThreads / kWarpSize;
  constexpr int kRowsPerWarp = static_cast<int>(kQueryBlock) / kWarps;
  static_assert(kQueryBlock == kKeyBlock, "one kernel for both block sizes");
  const int64_t head = blockIdx.x / blocks_per_head;
  const int block = static_cast<int>(blockIdx.x % blocks_per_head);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int first_row = block * static_cast<int>(kQueryBlock) + warp * kRowsPerWarp;

  float values[kRowsPerWarp][kPerLane];
  float amax = 0.0f;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = first_row + r;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int column = lane * kPerLane + e;
      values[r][e] = row < seq && column < dim ? to_float(source[(head * seq + row) * dim + column]) : 0.0f;
    }
    if (rotate) hadamard_rotate<kPerLane, kDimPad>(values[r], lane, rotation_scale);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) amax = fmaxf(amax, fabsf(values[r][e]));
  }
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, offset));
  }
  __shared__ float warp_amax[kWarps];
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[w]);
  const Scale scale = scale_of(amax);
  if (threadIdx.x == 0) descales[head * blocks_per_head + block] = scale.descale;

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = first_row + r;
    if (row >= seq) break;
    uint8_t* out = codes + (head * seq + row) * kDimPad + lane * kPerLane;
    unsigned short pairs[kPerLane / 2];
#pragma unroll
    for (int e = 0; e < kPerLane; e += 2) {
      pairs[e / 2] = pack_e4m3x2(values[r][e] * scale.inv, values[r][e + 1] * scale.inv);
    }
    if constexpr (kPerLane == 2) {
      *reinterpret_cast<unsigned short*>(out) = pairs[0];
    } else if constexpr (kPerLane == 4) {
      *reinterpret_cast<unsigned*>(out) = pairs[0] | static_cast<unsigned>(pairs[1]) << 16;
    } else {
      static_assert(kPerLane == 8, "Dpad is 64, 128 or 256");
      *reinterpret_cast<uint2*>(out) = make_uint2(pairs[0] | static_cast<unsigned>(pairs[1]) << 16,
                                                  pairs[2] | static_cast<unsigned>(pairs[3]) << 16);
    }
  }
}

// V's per-channel amax: a thread per channel d < Dpad (blockDim.x = Dpad), a block per (head, 256
// keys), blockIdx.x = head · chunks + chunk. `amax` (zeroed) holds the float bits.
template <typename Element>
__global__ void value_amax_kernel(const Element* __restrict__ source, unsigned* __restrict__ amax, int seq, int dim,
                                  int chunks) {
  const int64_t head = blockIdx.x / chunks;
  const int first_key = static_cast<int>(blockIdx.x % chunks) * kAmaxKeys;
  const int d = threadIdx.x;
  if (d >= dim) return;
  float value_max = 0.0f;
  const int last_key = min(seq, first_key + kAmaxKeys);
  for (int key = first_key; key < last_key; ++key) {
    value_max = fmaxf(value_max, fabsf(to_float(source[(head * seq + key) * dim + d])));
  }
  if (value_max > 0.0f) atomicMax(&amax[head * blockDim.x + d], __float_as_uint(value_max));
}

// V quantized per channel and transposed: a block per (head, 64 keys, 64 channels), blockIdx.x =
// (head · channel tiles + channel tile) · key tiles + key tile. Key k of the tile goes to position
// kernel_key_position(k) of the channel's row (quantize.hpp); keys past Nk are zeros.
template <typename Element>
__global__ void __launch_bounds__(kValueThreads)
    quantize_value_kernel(const Element* __restrict__ source, const unsigned* __restrict__ amax,
                          uint8_t* __restrict__ transposed, float* __restrict__ descales, int seq, int seq_padded,
                          int dim, int dim_padded, int key_tiles) {
  __shared__ __align__(16) uint8_t tile[kValueTileDims][kValueTileKeys];
  const int key_tile = static_cast<int>(blockIdx.x % key_tiles);
  const int64_t rest = blockIdx.x / key_tiles;
  const int dim_tiles = dim_padded / kValueTileDims;
  const int dim_tile = static_cast<int>(rest % dim_tiles);
  const int64_t head = rest / dim_tiles;
  const int first_key = key_tile * kValueTileKeys;
  // Every element this thread loads is in channel column threadIdx.x % 64 (256 is a multiple of 64).
  const int column = threadIdx.x % kValueTileDims;
  const int d = dim_tile * kValueTileDims + column;
  const Scale scale = scale_of(__uint_as_float(amax[head * dim_padded + d]));
  if (key_tile == 0 && threadIdx.x < kValueTileDims) descales[head * dim_padded + d] = scale.descale;
  for (int index = threadIdx.x; index < kValueTileKeys * kValueTileDims; index += kValueThreads) {
    const int key = index / kValueTileDims;
    const float value =
        first_key + key < seq && d < dim ? to_float(source[(head * seq + first_key + key) * dim + d]) : 0.0f;
    tile[column][kernel_key_position(key)] = static_cast<uint8_t>(pack_e4m3x2(value * scale.inv, 0.0f) & 0xff);
  }
  __syncthreads();
  constexpr int kChunks = kValueTileKeys / 16;  // 16-byte chunks of a channel's row
  for (int index = threadIdx.x; index < kValueTileDims * kChunks; index += kValueThreads) {
    const int row = index / kChunks;
    const int position = first_key + index % kChunks * 16;
    if (position >= seq_padded) continue;  // Nk_pad is a multiple of 16: a chunk is in or out whole
    const int64_t channel = head * dim_padded + dim_tile * kValueTileDims + row;
    *reinterpret_cast<uint4*>(transposed + channel * seq_padded + position) =
        *reinterpret_cast<const uint4*>(&tile[row][index % kChunks * 16]);
  }
}

int64_t align_up(int64_t value, int64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

unsigned grid_of(int64_t blocks) { return static_cast<unsigned>(blocks); }

template <typename Element>
Status quantize_typed(const Problem& problem, const QuantizedLayout& layout, const void* q, const void* k,
                      const void* v, bool rotate, unsigned char* workspace, cudaStream_t stream) {
  const int dim = static_cast<int>(problem.dim);
  const float rotation_scale = hadamard_scale(layout.dim_padded);
  const auto quantize_rows = [&](const void* source, int64_t heads, int64_t seq, int64_t blocks, int64_t codes_offset,
                                 int64_t descale_offset) -> Status {
    FA_STATUS_TRY(check_grid(heads * blocks));
    const auto launch = [&](auto bucket) -> Status {
      constexpr int kDimPad = decltype(bucket)::value;
      quantize_qk_kernel<Element, kDimPad><<<grid_of(heads * blocks), kQkThreads, 0, stream>>>(
          static_cast<const Element*>(source), workspace + codes_offset,
          reinterpret_cast<float*>(workspace + descale_offset), static_cast<int>(seq), dim, static_cast<int>(blocks),
          rotate, rotation_scale);
      FA_LAUNCH_TRY();
      return Status();
    };
    return dispatch_head_dim<64, 128, 256>(problem.dim, launch);
  };
  FA_STATUS_TRY(quantize_rows(q, problem.q_heads_total(), problem.q_seq, layout.q_blocks, layout.q_offset,
                              layout.q_descale_offset));
  FA_STATUS_TRY(quantize_rows(k, problem.kv_heads_total(), problem.kv_seq, layout.k_blocks, layout.k_offset,
                              layout.k_descale_offset));

  const int64_t kv_heads = problem.kv_heads_total();
  unsigned* amax = reinterpret_cast<unsigned*>(workspace + layout.v_amax_offset);
  FA_CUDA_TRY(cudaMemsetAsync(amax, 0, kv_heads * layout.dim_padded * sizeof(float), stream));
  const int64_t chunks = (problem.kv_seq + kAmaxKeys - 1) / kAmaxKeys;
  FA_STATUS_TRY(check_grid(kv_heads * chunks));
  value_amax_kernel<Element><<<grid_of(kv_heads * chunks), static_cast<unsigned>(layout.dim_padded), 0, stream>>>(
      static_cast<const Element*>(v), amax, static_cast<int>(problem.kv_seq), dim, static_cast<int>(chunks));
  FA_LAUNCH_TRY();
  const int64_t key_tiles = (layout.kv_seq_padded + kValueTileKeys - 1) / kValueTileKeys;
  const int64_t value_blocks = kv_heads * (layout.dim_padded / kValueTileDims) * key_tiles;
  FA_STATUS_TRY(check_grid(value_blocks));
  quantize_value_kernel<Element><<<grid_of(value_blocks), kValueThreads, 0, stream>>>(
      static_cast<const Element*>(v), amax, workspace + layout.v_offset,
      reinterpret_cast<float*>(workspace + layout.v_descale_offset), static_cast<int>(problem.kv_seq),
      static_cast<int>(layout.kv_seq_padded), dim, static_cast<int>(layout.dim_padded), static_cast<int>(key_tiles));
  FA_LAUNCH_TRY();
  return Status();
}

}  // namespace

QuantizedLayout quantized_layout(const Problem& problem) {
  QuantizedLayout layout;
  layout.dim_padded = pad_dim(problem.dim);
  layout.kv_seq_padded = align_up(problem.kv_seq, kVKeyAlign);
  layout.q_blocks = (problem.q_seq + kQueryBlock - 1) / kQueryBlock;
  layout.k_blocks = (problem.kv_seq + kKeyBlock - 1) / kKeyBlock;
  int64_t offset = 0;
  const auto take = [&](int64_t bytes) {
    const int64_t start = offset;
    offset = align_up(offset + bytes, kLayoutAlign);
    return start;
  };
  const int64_t kv_heads = problem.kv_heads_total();
  layout.q_offset = take(problem.q_rows() * layout.dim_padded);
  layout.k_offset = take(problem.kv_rows() * layout.dim_padded);
  layout.v_offset = take(kv_heads * layout.dim_padded * layout.kv_seq_padded);
  layout.q_descale_offset = take(problem.q_heads_total() * layout.q_blocks * 4);
  layout.k_descale_offset = take(kv_heads * layout.k_blocks * 4);
  layout.v_descale_offset = take(kv_heads * layout.dim_padded * 4);
  layout.v_amax_offset = take(kv_heads * layout.dim_padded * 4);
  layout.bytes = offset;
  return layout;
}

Status quantize_inputs(const Problem& problem, Precision precision, const void* q, const void* k, const void* v,
                       bool rotate, void* workspace, QuantizedInputs* out, cudaStream_t stream) {
  if (precision != Precision::fp16 && precision != Precision::bf16) {
    return Status::unsupported("stage 14 quantizes FP16 or BF16 inputs");
  }
  if (const std::string why = validate_problem(problem, 256); !why.empty()) return Status::unsupported(why);
  if (q == nullptr || k == nullptr || v == nullptr || workspace == nullptr) {
    return Status::unsupported("stage 14's quantization needs Q, K, V and its workspace");
  }
  if (reinterpret_cast<std::uintptr_t>(workspace) % kLayoutAlign != 0) {
    return Status::unsupported("stage 14's workspace must be 256-byte aligned");
  }
  const QuantizedLayout layout = quantized_layout(problem);
  unsigned char* bytes = static_cast<unsigned char*>(workspace);
  FA_STATUS_TRY(precision == Precision::fp16
                    ? quantize_typed<__half>(problem, layout, q, k, v, rotate, bytes, stream)
                    : quantize_typed<__nv_bfloat16>(problem, layout, q, k, v, rotate, bytes, stream));
  out->q = bytes + layout.q_offset;
  out->k = bytes + layout.k_offset;
  out->v_transposed = bytes + layout.v_offset;
  out->q_descale = reinterpret_cast<const float*>(bytes + layout.q_descale_offset);
  out->k_descale = reinterpret_cast<const float*>(bytes + layout.k_descale_offset);
  out->v_descale = reinterpret_cast<const float*>(bytes + layout.v_descale_offset);
  return Status();
}

}  // namespace fa::fp8
