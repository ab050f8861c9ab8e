// Stage 14's quantization pass: FP16/BF16 Q, K, V to e4m3 with block scales, bit for bit the CPU
// model of fp8_numerics.hpp (its contract, points 2-5), and V transposed for the attention kernel's
// 8-bit P·V (quantize.hpp). Three kernels, all bounded by memory traffic, each reading its input in
// 16-byte pieces (8 elements: a "chunk") where the rows allow it (D a multiple of 8, aligned):
//
//   quantize_qk_kernel      a block per (head, scale block: 128 rows of Q, 64 of K): two lanes share
//                           a row at D = 64, four from D = 128, and hold it in registers, rotated in
//                           place when asked (the butterflies cross lanes at one of its stages at
//                           D = 64, two from D = 128: a shuffle each); the block's amax from them,
//                           then the codes; nothing is read twice. K's launch clears V's amax.
//   value_amax_kernel       V's per-channel amax, a block per (head, 64 keys): each thread the
//                           maxima of its chunk's 8 channels, merged over the block, then by an
//                           integer atomicMax (non-negative floats order as their bit patterns do).
//   quantize_value_kernel   a block per (head, 64 keys): codes into a shared tile at their
//                           transposed, permuted places, then out as 16-byte rows of Vᵀ.
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

constexpr int kChunk = 8;           // elements of one 16-byte load of FP16/BF16
constexpr int kValueKeys = 64;      // keys per block of the V kernels
constexpr int kValueTileDims = 64;  // channels per block of transpose_value_kernel
constexpr int kValueThreads = 256;
constexpr int kValueRowBytes = kValueKeys + 4;  // a row of a V tile in shared memory (below)
constexpr int kLayoutAlign = 256;               // every tensor of the workspace starts on such a boundary

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

// The two 16-bit elements of a 32-bit word, low first, as floats (exact).
template <typename Element>
__device__ __forceinline__ float2 unpack_pair(unsigned bits) {
  if constexpr (std::is_same_v<Element, __half>) {
    __half2 pair;
    memcpy(&pair, &bits, sizeof(bits));
    return __half22float2(pair);
  } else {
    __nv_bfloat162 pair;
    memcpy(&pair, &bits, sizeof(bits));
    return __bfloat1622float2(pair);
  }
}

// Elements first .. first + 7 of a row as floats, zeros past `dim` and for a row that is not
// `valid`: one 16-byte load where `vector` (D a multiple of 8, the tensor 16-byte aligned: a chunk
// is then whole or past D), else element by element.
template <typename Element>
__device__ __forceinline__ void load_chunk(float* x, const Element* row, int first, int dim, bool valid, bool vector) {
  if (vector) {
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (valid && first < dim) raw = *reinterpret_cast<const uint4*>(row + first);
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 pair = unpack_pair<Element>(words[w]);
      x[2 * w] = pair.x;
      x[2 * w + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) x[j] = valid && first + j < dim ? to_float(row[first + j]) : 0.0f;
  }
}

// How quantize_qk_kernel spreads a row over lanes: kLanes lanes a row, lane c of a row holding the
// chunks that start at i·kStride + 8c (i < kChunks). One load instruction of a warp then reads whole
// 32-byte sectors of kRowsPerWarp rows, and the rotation's butterflies of len = 8 .. kStride / 2
// pair elements of lanes c and c ^ (len / 8) (a shuffle each); all others pair two registers.
template <int kDimPad>
struct QkLayout {
  static constexpr int kLanes = kDimPad <= 64 ? 2 : 4;
  static constexpr int kRowsPerWarp = kWarpSize / kLanes;
  static constexpr int kStride = kChunk * kLanes;
  static constexpr int kChunks = kDimPad / kStride;
  static constexpr int kPerLane = kChunks * kChunk;  // 32, 32, 64 floats a thread
  template <int kBlockRows>
  static constexpr int threads() {
    return kBlockRows / kRowsPerWarp * kWarpSize;
  }
};

// The rotation of the contract's point 4 on a row spread as QkLayout says: for each len the same
// pairs and the same float operations as the CPU's butterfly (the lower index takes a + b, the
// upper a - b), so the results are equal bit for bit.
template <int kDimPad>
__device__ __forceinline__ void hadamard_rotate(float (&x)[QkLayout<kDimPad>::kPerLane], int lane_in_row, float scale) {
  using Layout = QkLayout<kDimPad>;
  const auto butterfly = [](float& low, float& high) {
    const float a = low;
    const float b = high;
    low = a + b;
    high = a - b;
  };
#pragma unroll
  for (int len = 1; len < kDimPad; len *= 2) {
    if (len < kChunk) {  // within a chunk
#pragma unroll
      for (int e = 0; e < Layout::kPerLane; ++e) {
        if ((e & len) == 0) butterfly(x[e], x[e + len]);
      }
    } else if (len < Layout::kStride) {  // across the lanes of the row
      // The lower lane's x + other and the upper's other - x, as one fma with an exact product.
      const int lane_bit = len / kChunk;
      const float sign = (lane_in_row & lane_bit) != 0 ? -1.0f : 1.0f;
#pragma unroll
      for (int e = 0; e < Layout::kPerLane; ++e) {
        const float other = __shfl_xor_sync(kFullWarp, x[e], lane_bit);
        x[e] = fmaf(sign, x[e], other);
      }
    } else {  // across a lane's chunks
      const int chunk_bit = len / Layout::kStride;
#pragma unroll
      for (int i = 0; i < Layout::kChunks; ++i) {
        if ((i & chunk_bit) != 0) continue;
#pragma unroll
        for (int j = 0; j < kChunk; ++j) butterfly(x[i * kChunk + j], x[(i + chunk_bit) * kChunk + j]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < Layout::kPerLane; ++e) x[e] *= scale;
}

// Q or K: a block per (head, block of kBlockRows rows), blockIdx.x = head · blocks_per_head + block.
// The launch for K also clears V's amax (`clear`, read by the V pass after it: no launch of its own).
template <typename Element, int kDimPad, int kBlockRows>
__global__ void __launch_bounds__(QkLayout<kDimPad>::template threads<kBlockRows>())
    quantize_qk_kernel(const Element* __restrict__ source, uint8_t* __restrict__ codes, float* __restrict__ descales,
                       int seq, int dim, int blocks_per_head, bool vector, bool rotate, float rotation_scale,
                       unsigned* __restrict__ clear, int clear_words) {
  using Layout = QkLayout<kDimPad>;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < clear_words; i += gridDim.x * blockDim.x) clear[i] = 0;
  constexpr int kWarps = kBlockRows / Layout::kRowsPerWarp;
  const int64_t head = blockIdx.x / blocks_per_head;
  const int block = static_cast<int>(blockIdx.x % blocks_per_head);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int lane_in_row = lane % Layout::kLanes;
  const int row = block * kBlockRows + warp * Layout::kRowsPerWarp + lane / Layout::kLanes;
  const bool valid = row < seq;

  float x[Layout::kPerLane];
  const Element* row_start = source + (head * seq + (valid ? row : 0)) * dim;
#pragma unroll
  for (int i = 0; i < Layout::kChunks; ++i) {
    load_chunk(&x[i * kChunk], row_start, i * Layout::kStride + lane_in_row * kChunk, dim, valid, vector);
  }
  if (rotate) hadamard_rotate<kDimPad>(x, lane_in_row, rotation_scale);
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < Layout::kPerLane; ++e) amax = fmaxf(amax, fabsf(x[e]));
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
  if (!valid) return;

  // A chunk's 8 codes in one 8-byte store.
  uint8_t* out = codes + (head * seq + row) * kDimPad + lane_in_row * kChunk;
#pragma unroll
  for (int i = 0; i < Layout::kChunks; ++i) {
    unsigned words[2];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const float* v = &x[i * kChunk + 4 * w];
      words[w] = pack_e4m3x2(v[0] * scale.inv, v[1] * scale.inv) |
                 static_cast<unsigned>(pack_e4m3x2(v[2] * scale.inv, v[3] * scale.inv)) << 16;
    }
    *reinterpret_cast<uint2*>(out + i * Layout::kStride) = make_uint2(words[0], words[1]);
  }
}

// The V kernels' share of a head's keys: a block per (head, 64 keys), blockIdx.x = head · key_tiles +
// key tile; thread t reads chunk t % kChunks (channels 8c .. 8c + 7) of keys t / kChunks + p ·
// kKeysPerPass, p < kPasses (at D = 128: 16 chunks a key row, 16 keys a pass, 4 passes).
template <int kDimPad>
struct ValueChunks {
  static constexpr int kChunks = kDimPad / kChunk;
  static constexpr int kKeysPerPass = kValueThreads / kChunks;
  static constexpr int kPasses = kValueKeys / kKeysPerPass;
  int64_t head;
  int first_key;
  int chunk;
  __device__ ValueChunks(int key_tiles)
      : head(blockIdx.x / key_tiles),
        first_key(static_cast<int>(blockIdx.x % key_tiles) * kValueKeys),
        chunk(static_cast<int>(threadIdx.x % kChunks)) {}
  __device__ int key_of(int pass) const {  // within the block's 64
    return static_cast<int>(threadIdx.x / kChunks) + pass * kKeysPerPass;
  }
};

// V's per-channel amax. `amax` (zeroed) holds the float bits of (head, Dpad) channels.
template <typename Element, int kDimPad>
__global__ void __launch_bounds__(kValueThreads)
    value_amax_kernel(const Element* __restrict__ source, unsigned* __restrict__ amax, int seq, int dim, int key_tiles,
                      bool vector) {
  using Chunks = ValueChunks<kDimPad>;
  const Chunks at(key_tiles);
  float channel_max[kChunk] = {};
#pragma unroll
  for (int pass = 0; pass < Chunks::kPasses; ++pass) {
    const int key = at.first_key + at.key_of(pass);
    float x[kChunk];
    load_chunk(x, source + (at.head * seq + min(key, seq - 1)) * dim, at.chunk * kChunk, dim, key < seq, vector);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) channel_max[j] = fmaxf(channel_max[j], fabsf(x[j]));
  }
  // The lanes of a warp that read the same chunk are kChunks apart; then the warps, in shared memory.
#pragma unroll
  for (int offset = Chunks::kChunks; offset < kWarpSize; offset *= 2) {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      channel_max[j] = fmaxf(channel_max[j], __shfl_xor_sync(kFullWarp, channel_max[j], offset));
    }
  }
  constexpr int kWarps = kValueThreads / kWarpSize;
  __shared__ float warp_max[kWarps][kDimPad];
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize < Chunks::kChunks) {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) warp_max[warp][at.chunk * kChunk + j] = channel_max[j];
  }
  __syncthreads();
  const int d = threadIdx.x;
  if (d >= dim) return;
  float value_max = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) value_max = fmaxf(value_max, warp_max[w][d]);
  if (value_max > 0.0f) atomicMax(&amax[at.head * kDimPad + d], __float_as_uint(value_max));
}

// A block's codes of V_qᵀ, out of a shared tile of kRows rows of 64 keys (kValueRowBytes apart:
// below) into 16-byte pieces of the channels' rows: tile row r holds channel first_channel +
// channel_of(r) of `head`, from key first_key.
template <int kRows, typename ChannelOf>
__device__ __forceinline__ void write_value_rows(const uint8_t (&tile)[kRows][kValueRowBytes],
                                                 uint8_t* __restrict__ transposed, int64_t first_channel_row,
                                                 int first_key, int seq_padded, ChannelOf&& channel_of) {
  constexpr int kPieces = kValueKeys / 16;  // 16-byte pieces of a channel's row
  for (int index = threadIdx.x; index < kRows * kPieces; index += kValueThreads) {
    const int row = index / kPieces;
    const int position = first_key + index % kPieces * 16;
    if (position >= seq_padded) continue;  // Nk_pad is a multiple of 16: a piece is in or out whole
    const unsigned* words = reinterpret_cast<const unsigned*>(&tile[row][index % kPieces * 16]);
    *reinterpret_cast<uint4*>(transposed + (first_channel_row + channel_of(row)) * seq_padded + position) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}

// V quantized per channel and transposed, a block per (head, 64 keys). Key k of the block goes to
// position kernel_key_position(k) of its channel's row (quantize.hpp). A warp's stores of one of its
// chunks' channels j land in tile rows j · kChunks + chunk (channel 8 · chunk + j): with rows of 68
// bytes (17 words) the warp's chunks fall in different banks. At least three blocks an SM: left to
// itself, ptxas gives the D = 128 kernel 32 registers and a spill.
template <typename Element, int kDimPad>
__global__ void __launch_bounds__(kValueThreads, 3)
    quantize_value_kernel(const Element* __restrict__ source, const unsigned* __restrict__ amax,
                          uint8_t* __restrict__ transposed, float* __restrict__ descales, int seq, int seq_padded,
                          int dim, int key_tiles, bool vector) {
  using Chunks = ValueChunks<kDimPad>;
  // Each channel's scale once (two divisions), by thread d, into shared memory; the first key
  // tile writes the descales.
  __shared__ float channel_inv[kDimPad];
  if (threadIdx.x < kDimPad) {
    const int64_t channel = blockIdx.x / key_tiles * kDimPad + threadIdx.x;
    const Scale scale = scale_of(__uint_as_float(amax[channel]));
    channel_inv[threadIdx.x] = scale.inv;
    if (blockIdx.x % key_tiles == 0) descales[channel] = scale.descale;
  }
  __syncthreads();
  const Chunks at(key_tiles);
  float inv[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) inv[j] = channel_inv[at.chunk * kChunk + j];
  __shared__ __align__(16) uint8_t tile[kDimPad][kValueRowBytes];
#pragma unroll
  for (int pass = 0; pass < Chunks::kPasses; ++pass) {
    const int key = at.key_of(pass);
    const int at_key = at.first_key + key;
    float x[kChunk];
    load_chunk(x, source + (at.head * seq + min(at_key, seq - 1)) * dim, at.chunk * kChunk, dim, at_key < seq, vector);
    const int position = kernel_key_position(key);
#pragma unroll
    for (int j = 0; j < kChunk; j += 2) {
      const unsigned short pair = pack_e4m3x2(x[j] * inv[j], x[j + 1] * inv[j + 1]);
      tile[j * Chunks::kChunks + at.chunk][position] = static_cast<uint8_t>(pair & 0xff);
      tile[(j + 1) * Chunks::kChunks + at.chunk][position] = static_cast<uint8_t>(pair >> 8);
    }
  }
  __syncthreads();
  write_value_rows(tile, transposed, at.head * kDimPad, at.first_key, seq_padded,
                   [](int row) { return row % Chunks::kChunks * kChunk + row / Chunks::kChunks; });
}

// e4m3 V rows (B·Hkv, Nk, D) to Vᵀ, codes unchanged, and the descales (B·Hkv, D) to (B·Hkv, Dpad),
// 1 for the padding channels (their codes are zero), a block per (head, 64 keys, 64 channels),
// blockIdx.x = (head · channel tiles + channel tile) · key tiles + key tile. A warp's 32 threads store
// one key of 32 channels, in 32 banks with rows of 68 bytes.
__global__ void __launch_bounds__(kValueThreads)
    transpose_value_kernel(const uint8_t* __restrict__ source, const float* __restrict__ source_descales,
                           uint8_t* __restrict__ transposed, float* __restrict__ descales, int seq, int seq_padded,
                           int dim, int dim_padded, int key_tiles) {
  const int key_tile = static_cast<int>(blockIdx.x % key_tiles);
  const int64_t rest = blockIdx.x / key_tiles;
  const int64_t head = rest / (dim_padded / kValueTileDims);
  const int first_key = key_tile * kValueKeys;
  const int first_channel = static_cast<int>(rest % (dim_padded / kValueTileDims)) * kValueTileDims;
  const int column = threadIdx.x % kValueTileDims;
  const int d = first_channel + column;
  if (key_tile == 0 && threadIdx.x < kValueTileDims) {
    descales[head * dim_padded + d] = d < dim ? source_descales[head * dim + d] : 1.0f;
  }
  __shared__ __align__(16) uint8_t tile[kValueTileDims][kValueRowBytes];
  for (int index = threadIdx.x; index < kValueKeys * kValueTileDims; index += kValueThreads) {
    const int key = index / kValueTileDims;
    const int64_t at_key = first_key + key;
    tile[column][kernel_key_position(key)] = at_key < seq && d < dim ? source[(head * seq + at_key) * dim + d] : 0;
  }
  __syncthreads();
  write_value_rows(tile, transposed, head * dim_padded + first_channel, first_key, seq_padded,
                   [](int row) { return row; });
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

// Whether a tensor's rows can be read in 16-byte chunks (load_chunk).
bool chunks_readable(const void* tensor, int64_t dim) {
  return dim % kChunk == 0 && reinterpret_cast<std::uintptr_t>(tensor) % 16 == 0;
}

template <typename Element>
Status quantize_typed(const Problem& problem, const QuantizedLayout& layout, const void* q, const void* k,
                      const void* v, bool rotate, const QuantizedOutputs& out, cudaStream_t stream) {
  const int dim = static_cast<int>(problem.dim);
  const float rotation_scale = hadamard_scale(layout.dim_padded);
  const int64_t kv_heads = problem.kv_heads_total();
  // 64-key tiles of V: Nk_pad (a multiple of 16) opens no tile that Nk does not.
  const int64_t key_tiles = (layout.kv_seq_padded + kValueKeys - 1) / kValueKeys;
  FA_STATUS_TRY(check_grid(problem.q_heads_total() * layout.q_blocks));
  FA_STATUS_TRY(check_grid(kv_heads * layout.k_blocks));
  FA_STATUS_TRY(check_grid(kv_heads * key_tiles));
  const auto launch = [&](auto bucket) -> Status {
    constexpr int kDimPad = decltype(bucket)::value;
    unsigned* amax = static_cast<unsigned*>(out.v_amax);
    const auto quantize_rows = [&](auto block_rows, const void* source, int64_t heads, int64_t seq, int64_t blocks,
                                   uint8_t* codes, float* descales, unsigned* clear, int64_t clear_words) -> Status {
      constexpr int kBlockRows = decltype(block_rows)::value;
      constexpr unsigned kThreads = QkLayout<kDimPad>::template threads<kBlockRows>();
      quantize_qk_kernel<Element, kDimPad, kBlockRows><<<grid_of(heads * blocks), kThreads, 0, stream>>>(
          static_cast<const Element*>(source), codes, descales, static_cast<int>(seq), dim, static_cast<int>(blocks),
          chunks_readable(source, dim), rotate, rotation_scale, clear, static_cast<int>(clear_words));
      FA_LAUNCH_TRY();
      return Status();
    };
    FA_STATUS_TRY(quantize_rows(std::integral_constant<int, static_cast<int>(kQueryBlock)>{}, q,
                                problem.q_heads_total(), problem.q_seq, layout.q_blocks, out.q, out.q_descale, nullptr,
                                0));
    FA_STATUS_TRY(quantize_rows(std::integral_constant<int, static_cast<int>(kKeyBlock)>{}, k, kv_heads, problem.kv_seq,
                                layout.k_blocks, out.k, out.k_descale, amax, kv_heads * kDimPad));

    const bool vector = chunks_readable(v, dim);
    const int kv_seq = static_cast<int>(problem.kv_seq);
    value_amax_kernel<Element, kDimPad><<<grid_of(kv_heads * key_tiles), kValueThreads, 0, stream>>>(
        static_cast<const Element*>(v), amax, kv_seq, dim, static_cast<int>(key_tiles), vector);
    FA_LAUNCH_TRY();
    quantize_value_kernel<Element, kDimPad><<<grid_of(kv_heads * key_tiles), kValueThreads, 0, stream>>>(
        static_cast<const Element*>(v), amax, out.v_transposed, out.v_descale, kv_seq,
        static_cast<int>(layout.kv_seq_padded), dim, static_cast<int>(key_tiles), vector);
    FA_LAUNCH_TRY();
    return Status();
  };
  return dispatch_head_dim<64, 128, 256>(problem.dim, launch);
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
    const int64_t key_tiles = (layout.kv_seq_padded + kValueKeys - 1) / kValueKeys;
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
