// Which piece of work a block does (taught in stage 03's README, "Causal masking").
//
// A fused stage launches one block per (query tile, head). Without the mask every block does the
// same work, and the query tile is the fast index: the blocks in flight at once then share a few
// heads' K and V through L2. Under the causal mask the last query tile of a head sees every key
// and the first sees one tile, so the blocks run heaviest first: the query tile is the slow index,
// in reverse (longest-processing-time-first; the short blocks fill the tail of the grid).
#pragma once

#include <cstdint>

namespace fa::kernel {

struct BlockWork {
  int query_tile;      // which Br rows of the head
  int64_t query_head;  // b·Hq + h
};

__device__ __forceinline__ BlockWork block_work(int64_t block, int query_tiles, int64_t heads_total, bool causal) {
  if (causal) {
    return {query_tiles - 1 - static_cast<int>(block / heads_total), block % heads_total};
  }
  return {static_cast<int>(block % query_tiles), block / query_tiles};
}

}  // namespace fa::kernel
