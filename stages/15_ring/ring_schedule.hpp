// Stage 15's schedule in plain C++ (no GPU): which positions of the sequence each rank holds, which
// rank's K/V block it holds at each step, and which part of its queries meets which part of that
// block. The ring (ring.hpp) runs this schedule; the tests check it on its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fa/problem.hpp"

namespace fa::ring {

// The zigzag partition. The sequence of N positions is cut into 2P chunks of N / (2P); rank r holds
// chunk r and chunk 2P-1-r, in that order, as one local sequence of 2·N/(2P) positions. Under the
// causal mask the early chunks see few keys and the late ones many: pairing chunk r with its mirror
// gives every rank the same work (README, "The zigzag").
//
//   P = 2, N = 8:  positions  0 1 | 2 3 | 4 5 | 6 7
//                  chunks       0     1     2     3
//                  rank 0 holds chunks 0, 3;  rank 1 holds chunks 1, 2
struct Partition {
  int ranks = 1;
  int64_t chunk = 0;  // positions per chunk, N / (2P)

  Partition(int ranks_, int64_t seq) : ranks(ranks_), chunk(seq / (2 * ranks_)) {}
  int64_t local_seq() const { return 2 * chunk; }
  // The chunk that local half `half` (0 or 1) of `rank` holds, and the global position of local
  // position `local` of `rank`.
  int chunk_of(int rank, int half) const { return half == 0 ? rank : 2 * ranks - 1 - rank; }
  int64_t global_position(int rank, int64_t local) const {
    return chunk_of(rank, static_cast<int>(local / chunk)) * chunk + local % chunk;
  }
};

// Empty when `problem` (the whole sequence) can be split over `ranks`, else why not: the ring takes
// Nq = Nk, split into 2·ranks chunks of equal length.
std::string ring_unsupported_reason(const Problem& problem, int ranks);

// The rank whose K/V block `rank` holds at `step`: its own at step 0, then each step the block of
// the rank before the last one (blocks travel from rank r to r + 1).
inline int block_source(int rank, int step, int ranks) { return (rank - step % ranks + ranks) % ranks; }

// A part of a rank's local sequence: both chunks, or one of them.
enum class Half { both, first, second };

// What a rank computes with the block of `source`: which of its queries meet which of the block's
// keys, and whether the causal mask applies inside. Without the mask: everything, unmasked. With it:
//   source == rank: both halves against both, masked (the local order is the global order);
//   source <  rank: all queries against the block's first chunk, which lies before both of ours;
//   source >  rank: our second chunk against both of the block's, which lie before it.
// Every step but the first is unmasked and has the same (query, key) pairs: 2·chunk².
struct BlockTask {
  Half queries = Half::both;
  Half keys = Half::both;
  bool causal = false;
};
BlockTask block_task(int rank, int source, bool causal);

// Rows of a rank's local tensor that a half covers, per head: [first, first + count).
struct HalfRows {
  int64_t first = 0;
  int64_t count = 0;
};
HalfRows half_rows(Half half, int64_t chunk);

// Host helpers for the executable and the tests. A whole tensor of `heads` heads (B·H), each of
// `partition` × 2 chunks of rows of `width` values, to rank `rank`'s local tensor (heads × local_seq
// rows) and back.
std::vector<float> shard(const std::vector<float>& whole, const Partition& partition, int rank, int64_t heads,
                         int64_t width);
void unshard(const std::vector<float>& local, const Partition& partition, int rank, int64_t heads, int64_t width,
             std::vector<float>& whole);

}  // namespace fa::ring
