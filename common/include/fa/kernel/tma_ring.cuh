// The producer/consumer ring of a warp-specialized Hopper kernel (taught in stage 09's README, "The
// block" and "The mbarrier: phase bit and transaction count"): one producer thread copies tiles
// into a ring of kStages slots with TMA, each copy completing on the slot's "full" barrier; the
// consumer warps wait there, compute, and arrive on the slot's "free" barrier, which the producer
// waits on before it refills the slot. Tile r of the ring (counted over everything the block
// loads) goes to slot r % kStages on pass r / kStages: the consumers wait for the full barrier's
// phase of parity pass % 2, and the producer, from the second pass on, for the free barrier's phase
// of parity (pass - 1) % 2 (the consumers' pass-th release of the slot). sm_90 and newer
// (mbarrier.cuh, tma.cuh).
#pragma once

#include <cstdint>

#include "fa/kernel/mbarrier.cuh"
#include "fa/kernel/tma.cuh"
#include "fa/kernel/wgmma_walk.cuh"

namespace fa::kernel {

// Producer: copies a tile of kPanels 64-column panels (kPanelBytes each, panel p at tile +
// p · kPanelBytes) starting at (row, matrix) of `map`, all completing on `full`. Before it, the
// producer raises `full`'s expected bytes by the tile's size (barrier_arrive_expect_bytes: the whole
// boxes, zero-filled parts included).
template <int kPanels, int kPanelBytes>
__device__ __forceinline__ void copy_tile_to_shared(unsigned char* tile, const CUtensorMap* map, uint64_t* full,
                                                    int row, int matrix) {
  for (int panel = 0; panel < kPanels; ++panel) {
    copy_box_to_shared(shared_address(tile + panel * kPanelBytes), map, shared_address(full), panel * kPanelColumns,
                       row, matrix);
  }
}

// Consumer: waits until ring tile r has landed in its slot (pass r / kStages).
template <int kStages>
__device__ __forceinline__ void wait_slot_full(uint64_t* full_barriers, int r) {
  barrier_wait(&full_barriers[r % kStages], (r / kStages) & 1);
}

// Consumer: this warp is done with a barrier's resource (a slot, or the Q tile): one arrival per
// consumer warp frees it.
__device__ __forceinline__ void release_to_producer(uint64_t* free_barrier, int lane) {
  __syncwarp();
  if (lane == 0) barrier_arrive(free_barrier);
}

}  // namespace fa::kernel
