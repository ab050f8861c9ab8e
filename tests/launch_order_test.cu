// The launch orders of common/include/fa/kernel/launch_order.cuh, run on the host (no GPU): every
// piece of work once, heaviest first within a head, and the backward's tail last. The kernels trust
// all three: a piece left out is a tile of O (or of dK, dV) never written, and stage 13's
// deterministic mode waits, for each dQ tile, on the key tiles below its own, which must therefore
// start before it (README 13, "The block: roles and barriers").
#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "fa/kernel/launch_order.cuh"

namespace {

using Order = fa::kernel::Work<unsigned> (*)(unsigned, unsigned, unsigned, bool);
constexpr Order forward_order = fa::kernel::ordered_work<unsigned>;
constexpr Order backward_order = fa::kernel::ordered_work_wide_bands<unsigned>;

// The (tile, head) of each index, in launch order.
std::vector<std::pair<unsigned, unsigned>> launch_sequence(Order order, unsigned tiles, unsigned heads, bool causal) {
  std::vector<std::pair<unsigned, unsigned>> sequence;
  for (unsigned index = 0; index < tiles * heads; ++index) {
    const fa::kernel::Work<unsigned> work = order(index, tiles, heads, causal);
    sequence.emplace_back(work.query_tile, work.query_head);
  }
  return sequence;
}

// Each (tile, head) exactly once; under the causal mask each head's tiles heaviest (the highest
// tile: the last query tile, or the first key tile of the backward) first.
void check_order(Order order, unsigned tiles, unsigned heads, bool causal) {
  const auto sequence = launch_sequence(order, tiles, heads, causal);
  const std::set<std::pair<unsigned, unsigned>> seen(sequence.begin(), sequence.end());
  bool in_range = true;
  for (const auto& [tile, head] : sequence) in_range = in_range && tile < tiles && head < heads;
  CHECK(in_range);
  CHECK(seen.size() == sequence.size());
  if (!causal) return;
  std::vector<int64_t> last_tile(heads, -1);
  bool heaviest_first = true;
  for (const auto& [tile, head] : sequence) {
    heaviest_first = heaviest_first && (last_tile[head] < 0 || tile < last_tile[head]);
    last_tile[head] = tile;
  }
  CHECK(heaviest_first);
}

}  // namespace

TEST_CASE("common: the launch orders cover every piece once, heaviest first under the causal mask (no GPU)") {
  for (const unsigned heads : {1u, 2u, 3u, 16u, 33u}) {
    for (unsigned tiles = 1; tiles <= 200; ++tiles) {
      INFO(tiles << " tiles, " << heads << " heads");
      for (const bool causal : {false, true}) {
        check_order(forward_order, tiles, heads, causal);
        check_order(backward_order, tiles, heads, causal);
      }
    }
  }
}

TEST_CASE("common: the backward's causal order launches the lightest quarter of the tiles last (no GPU)") {
  // At 16k keys of 128 (128 tiles): bands of 32 tiles for tiles 127 .. 32, then bands of 4.
  for (const unsigned tiles : {8u, 16u, 32u, 64u, 128u, 200u}) {
    const unsigned heads = 16;
    const auto sequence = launch_sequence(backward_order, tiles, heads, true);
    const unsigned wide = std::max(1u, std::min(unsigned{fa::kernel::kWideBandTiles}, tiles / 4));
    const unsigned light = tiles - (tiles - tiles / 4) / wide * wide;  // the tail's tiles: 0 .. light - 1
    bool tail_last = true;
    for (std::size_t i = 0; i < sequence.size(); ++i) {
      const bool in_tail = sequence[i].first < light;
      tail_last = tail_last && in_tail == (i >= (tiles - light) * heads);
    }
    INFO(tiles << " tiles");
    CHECK(light >= tiles / 4);
    CHECK(tail_last);
    // The first wide band: `wide` tiles of head 0, then of head 1.
    CHECK(sequence[0] == std::make_pair(tiles - 1, 0u));
    CHECK(sequence[wide] == std::make_pair(tiles - 1, 1u));
  }
}
