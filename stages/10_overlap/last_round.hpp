// Stage 10's last round (README, "The last round"): `pieces` pieces of `tiles` K/V tiles each on
// `blocks` SMs (persistent blocks, or blocks one per piece that start as SMs free) leave
// pieces % blocks of them for a last round in which the other SMs wait. Split by their key tiles
// into parts, a block each, those pieces take ceil(rest · parts / blocks) turns of a part instead of
// one turn of a piece. Host code, checked without a GPU (tests/stage10_test.cpp).
#pragma once

#include <cstdint>

namespace fa::stages::overlap {

// At most kMaxSplitPieces pieces split (the SMs of a whole GH100, more than any Hopper GPU has),
// each in at most kMaxParts parts of at least one tile; a part's own fixed work (its Q and first S,
// the states merged, O written) counts as kPartOverheadTiles tiles.
constexpr int64_t kMaxSplitPieces = 144;
constexpr int kMaxParts = 3;
constexpr int64_t kPartOverheadTiles = 2;

// Pieces from split_from on are split, each in `parts` parts: the launch has units() pieces and parts.
struct LastRound {
  int64_t split_from;
  int parts;
  int64_t units(int64_t pieces) const { return split_from + (pieces - split_from) * parts; }
};

// The count of parts whose turns end the last round first, counted in tiles; nothing split (one
// part) where the pieces fill whole rounds or no split ends it sooner.
inline LastRound plan_last_round(int64_t pieces, int64_t tiles, int64_t blocks) {
  const int64_t rest = pieces % blocks;
  LastRound plan{pieces, 1};
  if (rest == 0 || rest > kMaxSplitPieces) return plan;
  int64_t fastest = tiles + kPartOverheadTiles;
  for (int parts = 2; parts <= kMaxParts && parts <= tiles; ++parts) {
    const int64_t turns = (rest * parts + blocks - 1) / blocks;
    const int64_t round = turns * ((tiles + parts - 1) / parts + kPartOverheadTiles);
    if (round < fastest) {
      fastest = round;
      plan = {pieces - rest, parts};
    }
  }
  return plan;
}

}  // namespace fa::stages::overlap
