// The warp as the kernels count it (taught in stage 05's README, "What changed from stage 04": a
// block is split into warps, and the lanes of a warp share a row's max and sum through shuffles).
#pragma once

namespace fa::kernel {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;  // every lane takes part in the shuffle

}  // namespace fa::kernel
