// Stage 14's quantization pass: FP16/BF16 Q, K, V to e4m3 with block scales, bit for bit the CPU
// model of fp8_numerics.hpp (its contract, points 2-5), and V transposed for the attention kernel's
// 8-bit P·V (quantize.hpp). Three kernels, all bounded by memory traffic:
//
//   quantize_qk_kernel      a block per (head, scale block: 128 rows of Q, 64 of K): each warp holds 8 rows in
//                           registers (rotated in place when asked), the block's amax from them,
//                           then the codes; nothing is read twice.
//   value_amax_kernel       V's per-channel amax over all keys of a head: a thread per channel, a
//                           block per 256 keys, merged by an integer atomicMax (non-negative floats
//                           order as their bit patterns do).
//   quantize_value_kernel   a block per (head, 64 keys, 64 channels): codes into a shared tile at
//                           their transposed, permuted places, then out as 16-byte rows of Vᵀ.
//
// And for e4m3 tensors a caller quantized (arrange_e4m3), two copies into the kernel's layouts:
//   pad_rows_kernel         rows of D codes to rows of Dpad, zeros after (Q and K).
//   transpose_value_kernel  V's rows to Vᵀ, as quantize_value_kernel places them, codes unchanged.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "fa/cuda_check.hpp"
#include "fa/kernel/convert.cuh"
#include "fa/kernel/warp.cuh"
#include "fa/launch.hpp"
#include "fp8_numerics.hpp"
#include "quantize.hpp"

namespace fa::fp8 {
namespace {

using kernel::kFullWarp;
using kernel::kWarpSize;
using kernel::to_float;

constexpr int kQkRowsPerWarp = 8;   // quantize_qk_kernel: a warp per 8 rows of a scale block
constexpr int kAmaxKeys = 256;      // keys per block of value_amax_kernel
constexpr int kValueTileKeys = 64;  // keys per block of quantize_value_kernel
constexpr int kValueTileDims = 64;  // channels per block
constexpr int kValueThreads = 256;
constexpr int kLayoutAlign = 256;  // every tensor of the workspace starts on such a boundary

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

// Q or K: a block per (head, block of kBlockRows rows), blockIdx.x = head · blocks_per_head + block.
template <typename Element, int kDimPad, int kBlockRows>
__global__ void __launch_bounds__(kBlockRows / kQkRowsPerWarp * kWarpSize)
    quantize_qk_kernel(const Element* __restrict__ source, uint8_t* __restrict__ codes, float* __restrict__ descales,
                       int seq, int dim, int blocks_per_head, bool rotate, float rotation_scale) {
  constexpr int kPerLane = kDimPad / kWarpSize;
  constexpr int kWarps = kBlockRows / kQkRowsPerWarp;
  constexpr int kRowsPerWarp = kQkRowsPerWarp;
  const int64_t head = blockIdx.x / blocks_per_head;
  const int block = static_cast<int>(blockIdx.x % blocks_per_head);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int first_row = block * kBlockRows + warp * kRowsPerWarp;

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

// The tile of Vᵀ a block of quantize_value_kernel or transpose_value_kernel handles: blockIdx.x =
// (head · channel tiles + channel tile) · key tiles + key tile, (head, 64 keys, 64 channels).
struct ValueTile {
  int64_t head;
  int first_key;
  int first_channel;
  bool first;  // the head's first key tile, which writes the descales
  __device__ ValueTile(int dim_padded, int key_tiles) {
    const int key_tile = static_cast<int>(blockIdx.x % key_tiles);
    const int64_t rest = blockIdx.x / key_tiles;
    const int dim_tiles = dim_padded / kValueTileDims;
    head = rest / dim_tiles;
    first_key = key_tile * kValueTileKeys;
    first_channel = static_cast<int>(rest % dim_tiles) * kValueTileDims;
    first = key_tile == 0;
  }
};

// Fills a shared tile of codes, tile[channel][kernel_key_position(key)] = code_of(key, d) (keys past
// Nk and channels past D zero), and writes it out as 16-byte rows of Vᵀ. Every element a thread
// loads is in channel column threadIdx.x % 64 (256 is a multiple of 64): `code_of` may read that
// channel's scale once. A warp's 32 threads store one key of 32 channels: with rows of 64 bytes
// those bytes would fall in 2 of the 32 banks (16-way conflicts); rows of 68 bytes (17 words) put
// them in 32. The rows are read back a word at a time (68 is no multiple of 16).
template <typename CodeOf>
__device__ __forceinline__ void store_value_tile(const ValueTile& at, uint8_t* __restrict__ transposed, int seq,
                                                 int seq_padded, int dim, int dim_padded, CodeOf&& code_of) {
  constexpr int kRowBytes = kValueTileKeys + 4;
  __shared__ __align__(16) uint8_t tile[kValueTileDims][kRowBytes];
  const int column = threadIdx.x % kValueTileDims;
  const int d = at.first_channel + column;
  for (int index = threadIdx.x; index < kValueTileKeys * kValueTileDims; index += kValueThreads) {
    const int key = index / kValueTileDims;
    const int64_t at_key = at.first_key + key;
    tile[column][kernel_key_position(key)] = at_key < seq && d < dim ? code_of(at.head * seq + at_key) : 0;
  }
  __syncthreads();
  constexpr int kChunks = kValueTileKeys / 16;  // 16-byte chunks of a channel's row
  for (int index = threadIdx.x; index < kValueTileDims * kChunks; index += kValueThreads) {
    const int row = index / kChunks;
    const int position = at.first_key + index % kChunks * 16;
    if (position >= seq_padded) continue;  // Nk_pad is a multiple of 16: a chunk is in or out whole
    const int64_t channel = at.head * dim_padded + at.first_channel + row;
    const unsigned* words = reinterpret_cast<const unsigned*>(&tile[row][index % kChunks * 16]);
    *reinterpret_cast<uint4*>(transposed + channel * seq_padded + position) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// V quantized per channel and transposed, a block per ValueTile. Key k of the tile goes to position
// kernel_key_position(k) of the channel's row (quantize.hpp).
template <typename Element>
__global__ void __launch_bounds__(kValueThreads)
    quantize_value_kernel(const Element* __restrict__ source, const unsigned* __restrict__ amax,
                          uint8_t* __restrict__ transposed, float* __restrict__ descales, int seq, int seq_padded,
                          int dim, int dim_padded, int key_tiles) {
  const ValueTile at(dim_padded, key_tiles);
  const int d = at.first_channel + static_cast<int>(threadIdx.x % kValueTileDims);
  const Scale scale = scale_of(__uint_as_float(amax[at.head * dim_padded + d]));
  if (at.first && threadIdx.x < kValueTileDims) descales[at.head * dim_padded + d] = scale.descale;
  store_value_tile(at, transposed, seq, seq_padded, dim, dim_padded, [&](int64_t row) {
    return static_cast<uint8_t>(pack_e4m3x2(to_float(source[row * dim + d]) * scale.inv, 0.0f) & 0xff);
  });
}

// e4m3 V rows (B·Hkv, Nk, D) to Vᵀ, codes unchanged, and the descales (B·Hkv, D) to (B·Hkv, Dpad),
// 1 for the padding channels (their codes are zero), a block per ValueTile.
__global__ void __launch_bounds__(kValueThreads)
    transpose_value_kernel(const uint8_t* __restrict__ source, const float* __restrict__ source_descales,
                           uint8_t* __restrict__ transposed, float* __restrict__ descales, int seq, int seq_padded,
                           int dim, int dim_padded, int key_tiles) {
  const ValueTile at(dim_padded, key_tiles);
  const int d = at.first_channel + static_cast<int>(threadIdx.x % kValueTileDims);
  if (at.first && threadIdx.x < kValueTileDims) {
    descales[at.head * dim_padded + d] = d < dim ? source_descales[at.head * dim + d] : 1.0f;
  }
  store_value_tile(at, transposed, seq, seq_padded, dim, dim_padded,
                   [&](int64_t row) { return source[row * dim + d]; });
}

// Rows of `dim` e4m3 codes to rows of `dim_padded`, zeros after: a thread per output byte (a copy
// bounded by memory traffic, run once per call).
__global__ void pad_rows_kernel(const uint8_t* __restrict__ source, uint8_t* __restrict__ padded, int64_t rows, int dim,
                                int dim_padded) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * dim_padded) return;
  const int64_t row = index / dim_padded;
  const int d = static_cast<int>(index % dim_padded);
  padded[index] = d < dim ? source[row * dim + d] : 0;
}

int64_t align_up(int64_t value, int64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

unsigned grid_of(int64_t blocks) { return static_cast<unsigned>(blocks); }

template <typename Element>
Status quantize_typed(const Problem& problem, const QuantizedLayout& layout, const void* q, const void* k,
                      const void* v, bool rotate, const QuantizedOutputs& out, cudaStream_t stream) {
  const int dim = static_cast<int>(problem.dim);
  const float rotation_scale = hadamard_scale(layout.dim_padded);
  const auto quantize_rows = [&](auto block_rows, const void* source, int64_t heads, int64_t seq, int64_t blocks,
                                 uint8_t* codes, float* descales) -> Status {
    constexpr int kBlockRows = decltype(block_rows)::value;
    FA_STATUS_TRY(check_grid(heads * blocks));
    const auto launch = [&](auto bucket) -> Status {
      constexpr int kDimPad = decltype(bucket)::value;
      constexpr unsigned kThreads = kBlockRows / kQkRowsPerWarp * kWarpSize;
      quantize_qk_kernel<Element, kDimPad, kBlockRows><<<grid_of(heads * blocks), kThreads, 0, stream>>>(
          static_cast<const Element*>(source), codes, descales, static_cast<int>(seq), dim, static_cast<int>(blocks),
          rotate, rotation_scale);
      FA_LAUNCH_TRY();
      return Status();
    };
    return dispatch_head_dim<64, 128, 256>(problem.dim, launch);
  };
  FA_STATUS_TRY(quantize_rows(std::integral_constant<int, static_cast<int>(kQueryBlock)>{}, q, problem.q_heads_total(),
                              problem.q_seq, layout.q_blocks, out.q, out.q_descale));
  FA_STATUS_TRY(quantize_rows(std::integral_constant<int, static_cast<int>(kKeyBlock)>{}, k, problem.kv_heads_total(),
                              problem.kv_seq, layout.k_blocks, out.k, out.k_descale));

  const int64_t kv_heads = problem.kv_heads_total();
  unsigned* amax = static_cast<unsigned*>(out.v_amax);
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
      static_cast<const Element*>(v), amax, out.v_transposed, out.v_descale, static_cast<int>(problem.kv_seq),
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

int64_t quantize_scratch_bytes(const Problem& problem) {
  return problem.kv_heads_total() * pad_dim(problem.dim) * static_cast<int64_t>(sizeof(float));
}

Status quantize_into(const Problem& problem, Precision precision, const void* q, const void* k, const void* v,
                     bool rotate, const QuantizedOutputs& out, cudaStream_t stream) {
  if (precision != Precision::fp16 && precision != Precision::bf16) {
    return Status::unsupported("stage 14 quantizes FP16 or BF16 inputs");
  }
  if (const std::string why = validate_problem(problem, 256); !why.empty()) return Status::unsupported(why);
  if (q == nullptr || k == nullptr || v == nullptr || out.q == nullptr || out.k == nullptr ||
      out.v_transposed == nullptr || out.q_descale == nullptr || out.k_descale == nullptr || out.v_descale == nullptr ||
      out.v_amax == nullptr) {
    return Status::unsupported(
        "stage 14's quantization needs Q, K, V, its outputs and its scratch (a pointer is null)");
  }
  const QuantizedLayout layout = quantized_layout(problem);
  return precision == Precision::fp16 ? quantize_typed<__half>(problem, layout, q, k, v, rotate, out, stream)
                                      : quantize_typed<__nv_bfloat16>(problem, layout, q, k, v, rotate, out, stream);
}

Status quantize_inputs(const Problem& problem, Precision precision, const void* q, const void* k, const void* v,
                       bool rotate, void* workspace, QuantizedInputs* out, cudaStream_t stream) {
  if (workspace == nullptr) return Status::unsupported("stage 14's quantization needs its workspace");
  if (reinterpret_cast<std::uintptr_t>(workspace) % kLayoutAlign != 0) {
    return Status::unsupported("stage 14's workspace must be 256-byte aligned");
  }
  const QuantizedLayout layout = quantized_layout(problem);
  unsigned char* bytes = static_cast<unsigned char*>(workspace);
  QuantizedOutputs outputs;
  outputs.q = bytes + layout.q_offset;
  outputs.k = bytes + layout.k_offset;
  outputs.v_transposed = bytes + layout.v_offset;
  outputs.q_descale = reinterpret_cast<float*>(bytes + layout.q_descale_offset);
  outputs.k_descale = reinterpret_cast<float*>(bytes + layout.k_descale_offset);
  outputs.v_descale = reinterpret_cast<float*>(bytes + layout.v_descale_offset);
  outputs.v_amax = bytes + layout.v_amax_offset;
  FA_STATUS_TRY(quantize_into(problem, precision, q, k, v, rotate, outputs, stream));
  out->q = outputs.q;
  out->k = outputs.k;
  out->v_transposed = outputs.v_transposed;
  out->q_descale = outputs.q_descale;
  out->k_descale = outputs.k_descale;
  out->v_descale = outputs.v_descale;
  return Status();
}

Status arrange_e4m3(const Problem& problem, const E4m3Rows& rows, void* workspace, QuantizedInputs* out,
                    cudaStream_t stream) {
  if (const std::string why = validate_problem(problem, 256); !why.empty()) return Status::unsupported(why);
  const QuantizedLayout layout = quantized_layout(problem);
  if (rows.qk_dim != problem.dim && rows.qk_dim != layout.dim_padded) {
    return Status::unsupported("stage 14: Q and K hold rows of D = " + std::to_string(problem.dim) + " or Dpad = " +
                               std::to_string(layout.dim_padded) + " codes, not " + std::to_string(rows.qk_dim));
  }
  if (rows.q == nullptr || rows.k == nullptr || rows.v == nullptr || rows.q_descale == nullptr ||
      rows.k_descale == nullptr || rows.v_descale == nullptr) {
    return Status::unsupported("stage 14 needs Q, K, V and their descales (a pointer is null)");
  }
  const bool pad = rows.qk_dim != layout.dim_padded;
  if ((pad || !rows.v_transposed) &&
      (workspace == nullptr || reinterpret_cast<std::uintptr_t>(workspace) % kLayoutAlign != 0)) {
    return Status::unsupported("stage 14 needs its workspace, 256-byte aligned, to arrange Q, K and V");
  }
  unsigned char* bytes = static_cast<unsigned char*>(workspace);
  *out = QuantizedInputs{rows.q, rows.k, rows.v, rows.q_descale, rows.k_descale, rows.v_descale};
  if (pad) {
    const auto pad_rows = [&](const uint8_t* source, int64_t count, int64_t offset) -> Status {
      constexpr int kThreads = 256;
      const int64_t blocks = (count * layout.dim_padded + kThreads - 1) / kThreads;
      FA_STATUS_TRY(check_grid(blocks));
      pad_rows_kernel<<<grid_of(blocks), kThreads, 0, stream>>>(
          source, bytes + offset, count, static_cast<int>(problem.dim), static_cast<int>(layout.dim_padded));
      FA_LAUNCH_TRY();
      return Status();
    };
    FA_STATUS_TRY(pad_rows(rows.q, problem.q_rows(), layout.q_offset));
    FA_STATUS_TRY(pad_rows(rows.k, problem.kv_rows(), layout.k_offset));
    out->q = bytes + layout.q_offset;
    out->k = bytes + layout.k_offset;
  }
  if (!rows.v_transposed) {
    const int64_t key_tiles = (layout.kv_seq_padded + kValueTileKeys - 1) / kValueTileKeys;
    const int64_t value_blocks = problem.kv_heads_total() * (layout.dim_padded / kValueTileDims) * key_tiles;
    FA_STATUS_TRY(check_grid(value_blocks));
    float* descales = reinterpret_cast<float*>(bytes + layout.v_descale_offset);
    transpose_value_kernel<<<grid_of(value_blocks), kValueThreads, 0, stream>>>(
        rows.v, rows.v_descale, bytes + layout.v_offset, descales, static_cast<int>(problem.kv_seq),
        static_cast<int>(layout.kv_seq_padded), static_cast<int>(problem.dim), static_cast<int>(layout.dim_padded),
        static_cast<int>(key_tiles));
    FA_LAUNCH_TRY();
    out->v_transposed = bytes + layout.v_offset;
    out->v_descale = descales;
  }
  return Status();
}

}  // namespace fa::fp8
