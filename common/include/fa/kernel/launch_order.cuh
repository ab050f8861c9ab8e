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

// The same order for a kernel that loops over its work items (a grid-stride loop: stages 03-05),
// with the query tile in 64 bits like the rest of their row arithmetic. (Narrowed to 32 bits, as
// block_work has it, the tile costs those kernels their uniform-datapath address arithmetic:
// ptxas moves it to vector registers.)
struct WorkItem {
  int64_t query_tile;
  int64_t query_head;  // b·Hq + h
};

__device__ __forceinline__ WorkItem work_item(int64_t work, int64_t query_tiles, int64_t heads_total, bool causal) {
  if (causal) return {query_tiles - 1 - work / heads_total, work % heads_total};
  return {work % query_tiles, work / query_tiles};
}

// The keys a block's rows see follow from the rule of fa/causal.hpp (causal_key_end). This is that
// rule in 32-bit arithmetic, for kernels that number rows and keys with ints and have no register
// to spare (stages 05-07, where 64-bit bounds cost registers in the hot loop): row `row` sees the
// keys below the returned limit. It equals causal_key_end(row, q_seq, kv_seq) where that is
// positive, and is 0 or less for a row that sees no key (no clamp at 0: the kernels compare
// `key < limit`, which needs none). Without the mask every row sees all kv_seq keys.
__device__ __forceinline__ int visible_key_limit(int row, int q_seq, int kv_seq, bool causal) {
  return causal ? min(kv_seq, row + 1 + kv_seq - q_seq) : kv_seq;
}

// The key/value head that query head `query_head` (= b·Hq + h) reads: b·Hkv + h / (Hq / Hkv), the
// rule of Problem::kv_head_of, on the device (taught in stage 08's README, "General shapes"). A
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
