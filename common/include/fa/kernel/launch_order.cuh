// Which piece of work a block does (taught in stage 03's README, "Causal masking").
//
// A fused stage launches one block per (query tile, head). Without the mask every block does the
// same work, and the query tile is the fast index: the blocks in flight at once then share a few
// heads' K and V through L2. Under the causal mask the last query tile of a head sees every key
// and the first sees one tile, so the blocks run heaviest first (longest-processing-time-first:
// the short blocks fill the tail of the grid). Strictly by weight, the blocks in flight would be
// one query tile of every head: each reads its own head's K and V, and at long sequences those
// no longer fit in L2 together. So the order goes heaviest first in bands of a few query tiles,
// and inside a band head by head: the blocks in flight are then a few consecutive tiles of fewer
// heads, which read the same K/V tiles. The band is at most 8 tiles, and at most a quarter of a
// head's tiles, so that the last band (the tail of the grid) still holds only light blocks.
//
//   query tiles 0..7 of heads a, b (band 2):  a7 a6 b7 b6 | a5 a4 b5 b4 | a3 a2 b3 b2 | a1 a0 b1 b0
#pragma once

#include <cstdint>

namespace fa::kernel {

template <typename Index>
struct Work {
  Index query_tile;  // which Br rows of the head
  Index query_head;  // b·Hq + h
};

constexpr int kCausalBandTiles = 8;

// The order, in one integer type: unsigned 32-bit for a grid of one block per piece of work (the
// block index is below 2^31, the launch limit, and B·Hq <= 2^20, problem.hpp: a 32-bit division
// costs a few instructions and registers where a 64-bit one costs dozens), int64_t for kernels that
// loop over their pieces (a grid-stride loop: stages 03-05, whose row arithmetic is 64-bit; narrowed
// to 32 bits, the tile costs them their uniform-datapath address arithmetic: ptxas moves it to
// vector registers). On the host too: tests/launch_order_test.cu checks the orders without a GPU.
template <typename Index, int kBandTiles = kCausalBandTiles>
__host__ __device__ __forceinline__ Work<Index> ordered_work(Index index, Index query_tiles, Index heads_total,
                                                             bool causal) {
  if (!causal) return {index % query_tiles, index / query_tiles};
  const Index band_tiles = max(Index{1}, min(Index{kBandTiles}, query_tiles / 4));
  const Index band = index / (band_tiles * heads_total);
  const Index heaviest = query_tiles - 1 - band * band_tiles;  // the band's first tile
  const Index width = min(band_tiles, heaviest + 1);           // the last band may be short
  const Index in_band = index - band * band_tiles * heads_total;
  return {heaviest - in_band % width, in_band / width};
}

// The backward's order (taught in stage 13's README, "Causal masking"): a block owns a key tile and
// walks the query tiles below the diagonal, so its weight falls with the key tile as a forward
// block's does with the query tile ("tiles" here). Each head's Q, dO and FP32 dQ (which dQ's adds
// read and write) pass between L2 and memory about once per band, and a band holds every head's
// tiles in turn: the wider the band, the fewer heads in flight and the fewer passes. So the three
// heaviest quarters of the tiles go in bands of up to 32 (at most a quarter of the tiles), and the
// lightest quarter, which fills the tail of the grid, in bands of up to 4 (the same rule).
constexpr int kWideBandTiles = 32;
constexpr int kTailBandTiles = 4;

template <typename Index>
__host__ __device__ __forceinline__ Work<Index> ordered_work_wide_bands(Index index, Index tiles, Index heads_total,
                                                                        bool causal) {
  const Index wide = max(Index{1}, min(Index{kWideBandTiles}, tiles / 4));  // ordered_work's band
  const Index wide_tiles = (tiles - tiles / 4) / wide * wide;               // the heaviest, in whole bands
  if (!causal || index < wide_tiles * heads_total) {
    return ordered_work<Index, kWideBandTiles>(index, tiles, heads_total, causal);
  }
  // The rest: the lightest tiles, numbered 0 .. tiles − wide_tiles − 1 in ordered_work's order too.
  return ordered_work<Index, kTailBandTiles>(index - wide_tiles * heads_total, tiles - wide_tiles, heads_total, causal);
}

struct BlockWork {
  int query_tile;
  int64_t query_head;
};

__device__ __forceinline__ BlockWork block_work(int64_t block, int query_tiles, int64_t heads_total, bool causal) {
  const Work<unsigned> work = ordered_work<unsigned>(static_cast<unsigned>(block), static_cast<unsigned>(query_tiles),
                                                     static_cast<unsigned>(heads_total), causal);
  return {static_cast<int>(work.query_tile), static_cast<int64_t>(work.query_head)};
}

using WorkItem = Work<int64_t>;

__device__ __forceinline__ WorkItem work_item(int64_t work, int64_t query_tiles, int64_t heads_total, bool causal) {
  return ordered_work<int64_t>(work, query_tiles, heads_total, causal);
}

// The key/value head that query head `query_head` (= b·Hq + h) reads: b·Hkv + h / (Hq / Hkv), the
// rule of Problem::kv_head_of, on the device (taught in stage 08's README, "The rest of the kernel"). A
// group's query heads are consecutive, so the blocks in flight under either order above share a
// few K/V heads. Computed once per block, in unsigned 32-bit arithmetic (B·Hq <= 2^20,
// problem.hpp), a few instructions where a 64-bit division takes dozens.
__device__ __forceinline__ int64_t kv_head_of(int64_t query_head, int q_heads, int kv_heads) {
  const unsigned head = static_cast<unsigned>(query_head);
  const unsigned heads = static_cast<unsigned>(q_heads);
  const unsigned group = heads / static_cast<unsigned>(kv_heads);
  return static_cast<int64_t>(head / heads * static_cast<unsigned>(kv_heads) + head % heads / group);
}

}  // namespace fa::kernel
