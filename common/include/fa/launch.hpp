// Host plumbing every GPU stage's forward() needs before a launch, written once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "fa/stage.hpp"

namespace fa {

// 16-byte vector loads, cp.async and TMA need every row to start on a 16-byte boundary.
inline bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }
inline bool all_aligned16(std::initializer_list<const void*> pointers) {
  for (const void* pointer : pointers) {
    if (!aligned16(pointer)) return false;
  }
  return true;
}

// How a kernel that opted in to more shared memory wants the SM's memory split between shared
// memory and L1: as much shared memory as possible (the blocks that fit per SM are what counts),
// or the driver's own choice, as for a kernel that never opted in (stages 03-05, whose ordinary
// global loads also go through L1, which the largest carveout would shrink).
enum class Carveout { max_shared, driver_default };

// Lets `kernel` use `bytes` of dynamic shared memory (above 48 KB a kernel must opt in) with the
// given carveout. A size beyond the device's per-block limit is declined with the numbers.
Status opt_in_shared_memory(const void* kernel, int64_t bytes, Carveout carveout);

template <typename Kernel>
Status opt_in_shared_memory(Kernel* kernel, int64_t bytes, Carveout carveout = Carveout::max_shared) {
  return opt_in_shared_memory(reinterpret_cast<const void*>(kernel), bytes, carveout);
}

// A grid of this many blocks, or a decline when it exceeds the launch limit of 2^31 - 1.
Status check_grid(int64_t blocks);

// For a forward pass that tests also call directly, past the runner's checks: the sizes within
// the limits for a stage whose largest head dim is max_dim, and the four tensors given. A decline
// with the reason, before anything touches the GPU, or ok.
inline Status check_forward_args(const ForwardArgs& args, int64_t max_dim) {
  if (const std::string why = validate_problem(args.problem, max_dim); !why.empty()) return Status::unsupported(why);
  if (args.q == nullptr || args.k == nullptr || args.v == nullptr || args.o == nullptr) {
    return Status::unsupported("Q, K, V and O must all be given (a tensor pointer is null)");
  }
  return Status();
}

// Calls `launch(std::integral_constant<int, kBucket>{})` for the smallest head-dim bucket that
// holds `dim` (the kernel then pads D up to it with zeros); declines a dim beyond the largest.
template <int... kBuckets, typename Launch>
Status dispatch_head_dim(int64_t dim, Launch&& launch) {
  Status status = Status::unsupported("head dim " + std::to_string(dim) + " is beyond the largest bucket");
  bool done = false;
  ((!done && dim <= kBuckets ? (status = launch(std::integral_constant<int, kBuckets>{}), done = true) : false), ...);
  return status;
}

}  // namespace fa
