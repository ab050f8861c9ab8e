// Stage 13's last wave (README, "The last wave"): with a block a key tile, `tiles` blocks of equal
// work on `sms` SMs leave tiles % sms of them for a last round in which the other SMs wait. Those
// key tiles are split by their steps (query tiles) into `parts` blocks each, whose dK and dV are
// summed in FP32; host code, checked without a GPU (tests/stage13_test.cpp).
#pragma once

#include <cstdint>

namespace fa::stages::wgmma_backward {

// At most kMaxSplitTiles key tiles split (144: the SMs of a whole GH100, more than any Hopper GPU
// has), in at most kMaxParts parts of at least kMinPartSteps steps; a block's fixed costs (K and V
// loaded, the ring filled, dK and dV written) count as kBlockOverheadSteps steps.
constexpr int kMaxSplitTiles = 144;
constexpr int kMaxParts = 16;
constexpr int kMinPartSteps = 4;
constexpr int kBlockOverheadSteps = 2;
// Split only where the count promises the whole launch at least kMinGainPercent sooner: with 15
// whole rounds before it ((4, 16, 4096, 128), (1, 16, 16384, 128) on an H200), the 2-2.6 % it
// promised did not come (README, "The last wave").
constexpr int kMinGainPercent = 10;

struct LastWave {
  int64_t whole_tiles;  // the key tiles before the split ones, in the launch order
  int64_t split_tiles;
  int parts;
  int64_t blocks() const { return whole_tiles + split_tiles * parts; }
};

// The number of parts whose round ends first by the count of steps (ties: fewer parts); 1 (nothing
// split) when the tiles fill whole rounds or splitting gains too little.
inline LastWave split_last_wave(int64_t tiles, int steps, int sms) {
  const LastWave whole{tiles, 0, 1};
  const int64_t rest = tiles % sms;
  if (rest == 0 || rest > kMaxSplitTiles) return whole;
  LastWave wave = whole;
  const int64_t block_steps = steps + kBlockOverheadSteps;
  int64_t fastest = block_steps;  // the last round with its tiles whole
  for (int parts = 2; parts <= kMaxParts && steps / parts >= kMinPartSteps; ++parts) {
    const int64_t rounds = (rest * parts + sms - 1) / sms;
    const int64_t round_steps = rounds * ((steps + parts - 1) / parts + kBlockOverheadSteps);
    if (round_steps < fastest) {
      fastest = round_steps;
      wave = {tiles - rest, rest, parts};
    }
  }
  const int64_t whole_rounds = tiles / sms;
  const int64_t before = (whole_rounds + 1) * block_steps;
  const int64_t after = whole_rounds * block_steps + fastest;
  return after * (100 + kMinGainPercent) <= before * 100 ? wave : whole;
}

}  // namespace fa::stages::wgmma_backward
