// Stage 07's choice between its two rings at D = 128 (fp16_pipelined.cu; README "Two rings at
// D = 128"). Host code only, shared with tests/stage07_test.cpp so the tests can pick shapes
// that take each ring.
#pragma once

#include <cstdint>

namespace fa::stages::stage07 {

// Grids of at most this many blocks per SM take the wide ring (64-key tiles x 2 stages, 86 KB a
// block, two blocks per SM): with no more blocks than that, the narrow ring's third block per SM
// would find no work anyway, and half as many tiles means half the per-tile overhead (barrier,
// shuffles, rescale of O). Larger grids take the narrow ring (32-key tiles x 3 stages, 68 KB,
// three blocks per SM). Measured on the H200 (README): at (32, 16, 512, 128), 4096 blocks, the
// wide ring reached 139 TFLOP/s and the narrow one 165; at (1, 1, 16384, 128), 256 blocks on 132
// SMs, the wide ring 194 and the narrow one 187.
inline constexpr int64_t kWideTilesMaxBlocksPerSm = 2;

// true: 64-key tiles x 2 stages; false: 32-key tiles x 3 stages.
inline constexpr bool use_wide_tiles(int64_t blocks, int64_t multiprocessors) {
  return blocks <= kWideTilesMaxBlocksPerSm * multiprocessors;
}

}  // namespace fa::stages::stage07
