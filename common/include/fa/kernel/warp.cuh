// The warp: 32 threads that issue each instruction together (from stage 02 on, whose reductions
// combine a warp's 32 lanes with __shfl_xor_sync).
#pragma once

namespace fa::kernel {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;  // the lane mask of a __shfl_*_sync over the whole warp

}  // namespace fa::kernel
