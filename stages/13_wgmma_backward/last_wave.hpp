// Stage 13's last wave (README, "The last wave"): with a block a key tile, `tiles` blocks on `sms`
// SMs leave tiles % sms of them for a last round in which the other SMs wait, and with fewer tiles
// than SMs most SMs wait throughout. The key tiles of that round are split by their steps (query
// tiles) into parts of at most `part_steps` steps, a block each, whose dK and dV are summed in FP32.
// Host code, and the table the kernel reads; checked without a GPU (tests/stage13_test.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace fa::stages::wgmma_backward {

// At most kMaxSplitTiles key tiles split (144: the SMs of a whole GH100, more than any Hopper GPU
// has), each in at most kMaxParts parts of at least kMinPartSteps steps; a block's fixed costs (K
// and V loaded, the ring filled, dK and dV written) count as kBlockOverheadSteps steps.
constexpr int kMaxSplitTiles = 144;
constexpr int kMaxParts = 16;
constexpr int kMinPartSteps = 4;
constexpr int kBlockOverheadSteps = 2;
// Split only where the count promises the whole launch at least kMinGainPercent sooner: with 15
// whole rounds before it ((4, 16, 4096, 128), (1, 16, 16384, 128) on an H200), the 2-2.6 % it
// promised did not come (README, "The last wave").
constexpr int kMinGainPercent = 10;

// What the kernel reads (a parameter): blocks from whole_tiles on are parts of the split tiles;
// split tile i (key tile whole_tiles + i in the launch order) has the blocks whole_tiles +
// first_block[i] .. whole_tiles + first_block[i + 1] − 1, part p its steps p · part_steps on.
struct SplitTiles {
  int whole_tiles;
  int split_tiles;
  int part_steps;
  uint16_t first_block[kMaxSplitTiles + 1];
};

struct LastWave {
  SplitTiles split;
  int64_t blocks() const { return split.whole_tiles + split.first_block[split.split_tiles]; }
};

// The plan for `tiles` key tiles of steps_of(t) steps each (t in the launch order, heaviest first
// under the causal mask) on `sms` SMs: the part length whose last round ends first by the count of
// steps (a round of parts ends with its longest), or nothing split (all parts whole) when the tiles
// fill whole rounds or splitting gains less than kMinGainPercent.
template <typename StepsOf>
LastWave split_last_wave(int64_t tiles, int sms, StepsOf steps_of) {
  LastWave whole{};
  whole.split.whole_tiles = static_cast<int>(tiles);
  const int64_t rest = tiles % sms;
  if (rest == 0 || rest > kMaxSplitTiles) return whole;
  const int64_t first = tiles - rest;
  std::array<int, kMaxSplitTiles> steps{};
  for (int i = 0; i < rest; ++i) steps[i] = steps_of(first + i);
  const int longest = *std::max_element(steps.begin(), steps.begin() + rest);
  const int64_t whole_rounds = tiles / sms;
  const int64_t before = (whole_rounds + 1) * (longest + kBlockOverheadSteps);
  int64_t fastest = longest + kBlockOverheadSteps;  // the last round with its tiles whole
  int best_part_steps = 0;
  for (int parts = 2; parts <= kMaxParts; ++parts) {
    const int part_steps = (longest + parts - 1) / parts;
    if (part_steps < kMinPartSteps) break;
    int64_t blocks = 0;
    for (int i = 0; i < rest; ++i) blocks += (steps[i] + part_steps - 1) / part_steps;
    const int64_t round_steps = (blocks + sms - 1) / sms * (part_steps + kBlockOverheadSteps);
    if (round_steps < fastest) {
      fastest = round_steps;
      best_part_steps = part_steps;
    }
  }
  const int64_t after = whole_rounds * (longest + kBlockOverheadSteps) + fastest;
  if (best_part_steps == 0 || after * (100 + kMinGainPercent) > before * 100) return whole;
  LastWave wave{};
  wave.split.whole_tiles = static_cast<int>(first);
  wave.split.split_tiles = static_cast<int>(rest);
  wave.split.part_steps = best_part_steps;
  for (int i = 0; i < rest; ++i) {
    const int parts = (steps[i] + best_part_steps - 1) / best_part_steps;
    wave.split.first_block[i + 1] = static_cast<uint16_t>(wave.split.first_block[i] + parts);
  }
  return wave;
}

}  // namespace fa::stages::wgmma_backward
