// Stage 12's host-side rule: which kernel a block runs, how many blocks share the keys of one K/V
// head, and the workspace their partial results need. Plain C++ (no GPU), so the tests check the
// rule anywhere.
#pragma once

#include <cstdint>

#include "fa/problem.hpp"
#include "fa/stage.hpp"

namespace fa::stages::split_kv {

// Query rows per block: the rows of all query heads of a group, packed (Hq/Hkv · Nq of them).
constexpr int64_t kTileRows = 64;
// Rows of one warp's strip (the M of mma.m16n8k16). A tile of at most this many packed rows (plain
// decoding: Hq/Hkv · Nq <= 16) up to D = kKeysAcrossWarpsMaxDim has its four warps share those rows
// and split each K/V tile's keys instead, so that every warp computes.
constexpr int64_t kStripRows = 16;
constexpr int64_t kKeysAcrossWarpsMaxDim = 128;
// A chunk of keys is a whole number of K/V tiles (64 keys, or 32 at D = 256) and never shorter
// than kMinChunkKeys: shorter chunks would write more partial output than they read keys.
constexpr int64_t kChunkAlign = 64;
constexpr int64_t kMinChunkKeys = 256;
constexpr int64_t kMaxSplits = 128;
// How many blocks per SM the split aims at: as many as it takes to stream the SM's share of the
// GPU's memory bandwidth, at most the two that fit at D = 128 (112 KB of shared memory each on an
// H100 or H200). A block of one strip per warp streams about kBlockBytesPerSecond: its tile loop
// (wait for a tile, multiply, softmax, multiply) is not free, and more stages in its ring do not make
// it faster (measured on an H200 at D = 128: 27-31 GB/s, Nq = 16 .. 1, with 3 to 6 stages). A block
// whose warps split the keys streams an H200 SM's whole share (36 GB/s) alone: one block per SM.
// Fewer blocks mean fewer splits: longer chunks and fewer partial rows to write and merge (README,
// "The split rule").
constexpr double kBlockBytesPerSecond = 30e9;
constexpr int64_t kMaxBlocksPerSm = 2;
// The workspace is sized for a GPU of up to this many SMs (an H200 has 132), so that it depends on
// the problem alone.
constexpr int kMaxSmCount = 256;

// A head with a full tile of its own query rows (prefill) gains nothing from packing or splitting:
// stage 08's kernel runs it unchanged.
inline bool hands_to_stage08(const Problem& problem) { return problem.q_seq >= kTileRows; }

// The block's four warps split the keys of each K/V tile (the packed rows fit in one strip).
inline bool keys_across_warps(const Problem& problem) {
  return problem.group_size() * problem.q_seq <= kStripRows && problem.dim <= kKeysAcrossWarpsMaxDim;
}

// On an H100 or H200 (compute capability 9.0) a tile of more than one strip runs on Hopper's wgmma
// instead (split_kv_wgmma.cu, built for sm_90a, which runs on those GPUs alone): its 64 rows are one
// wgmma tile, multiplied by one warpgroup. Up to D = kWgmmaMaxDim, with whole 16-byte chunks (the
// cp.async ring). The ring holds kWgmmaStages 64-key stages (144 KB at D = 128): a tile's slot is
// refilled two tiles after it lands, since its P·V is issued with the next tile's S, and so two
// tiles are in flight behind the one in hand. One such block per SM streams about its share of the
// bandwidth, and fewer blocks mean fewer splits (README, "On Hopper: the 64 rows are one wgmma").
constexpr int64_t kWgmmaMaxDim = 128;
constexpr int64_t kWgmmaStages = 4;
constexpr int64_t kWgmmaBlocksPerSm = 1;

// The kernel a block of `problem` runs: its four warps split the keys of one strip, each warp takes
// a strip of its own (mma.sync, any GPU from sm_80), or one warpgroup takes the whole tile (wgmma).
// `hopper`: the GPU's compute capability is 9.0; `async_copies`: the head dim is a multiple of 8 and
// Q, K and V start on 16-byte boundaries.
enum class BlockKernel { keys_across_warps, strip_per_warp, wgmma };
BlockKernel block_kernel(const Problem& problem, bool hopper, bool async_copies);

// The blocks one wave of `kernel` holds on a GPU of `sm_count` SMs whose memory runs at `memory_khz`
// over `bus_bits` bits (its device attributes): min(SMs, kMaxSmCount) times the blocks per SM. One
// where the warps split the keys, kWgmmaBlocksPerSm on wgmma; a strip per warp, ceil(the SM's share of
// the peak bandwidth / kBlockBytesPerSecond), from 1 to kMaxBlocksPerSm. An H100 SXM's SM has 25
// GB/s (3.35 TB/s over 132 SMs): one block each; an H200's 36 GB/s (4.8 TB/s): two.
int64_t wave_blocks(BlockKernel kernel, int sm_count, int memory_khz, int bus_bits);

struct KeySplit {
  int64_t splits = 1;      // blocks per (K/V head, row tile)
  int64_t chunk_keys = 0;  // keys per block, a multiple of kChunkAlign (the last chunk may be short)
};

// With base = B·Hkv·ceil(Hq/Hkv·Nq / 64) blocks (one per row tile of a group), as many splits as fit
// in one wave of `wave_blocks` blocks (SMs · blocks per SM, from wave_blocks()): floor(wave_blocks /
// base), at least 1 (the base blocks alone fill more than half the wave), at most kMaxSplits, chunks
// of at least kMinChunkKeys keys.
KeySplit plan_split(const Problem& problem, int64_t wave_blocks);

// The grid of a split kernel (either kind): each K/V head's packed rows in row tiles of kTileRows,
// each tile's keys in `split.splits` chunks, one block each.
struct SplitGrid {
  int64_t packed_rows = 0;  // Hq/Hkv · Nq
  int64_t row_tiles = 0;
  int64_t blocks = 0;  // B·Hkv · row_tiles · splits
};
SplitGrid split_grid(const Problem& problem, const KeySplit& split);

// FP32 partial outputs (splits × B·Hq·Nq × D) and their log-sum-exps (splits × B·Hq·Nq) when the
// largest wave (kMaxSmCount SMs of kMaxBlocksPerSm blocks) would split; 0 otherwise.
int64_t workspace_bytes(const Problem& problem, Pass pass);

// Launches the wgmma split kernel (split_kv_wgmma.cu) of `args` for `split`, writing partials to
// partial_out and partial_lse when it splits (null otherwise). Element: __half or __nv_bfloat16;
// kDim: the head-dim bucket, 64 or kWgmmaMaxDim.
template <typename Element, int kDim>
Status launch_wgmma_split(const ForwardArgs& args, const KeySplit& split, float* partial_out, float* partial_lse);

// The merge kernel on its own, for another stage's partial results (stage 15 merges the partials of
// the ring's steps with it): O (Element: __half or __nv_bfloat16) and, when `lse` is not null, the
// LSE (natural log) of `rows` rows from `splits` FP32 partials (O_s normalized, LSE_s in log2 units,
// split s of row r at s · rows + r), queued on `stream`. Up to kMaxSplits partials, D up to 256.
template <typename Element>
Status merge_partials(const float* partial_out, const float* partial_lse, Element* out, float* lse, int64_t rows,
                      int64_t dim, int64_t splits, cudaStream_t stream);

}  // namespace fa::stages::split_kv
