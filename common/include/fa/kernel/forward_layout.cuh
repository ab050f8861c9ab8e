// The shared memory of a warp-specialized TMA forward block (taught in stage 09's README, "The
// block"; stage 10's "Persistent blocks" adds an O tile and a second Q tile): the Q tiles (kPanels
// panels of Br rows x 128 bytes each), the O staging tile where the block has one (else O is staged
// in the Q tile), then ring slot s = (K tile, V tile), each kPanels panels of Bc rows x 128 bytes,
// then the barriers and the piece slots. The offsets count from the start aligned to 1024 bytes (the
// 128-byte swizzle's period; dynamic shared memory only promises 16), which ForwardShared finds and
// kBytes leaves room for. Stages 09 and 10 size their blocks with it and cut their shared memory up
// with ForwardShared. sm_90a only (wgmma_walk.cuh).
#pragma once

#include <cstdint>

#include "fa/kernel/wgmma_walk.cuh"

namespace fa::kernel {

constexpr int kSharedBytesPerBlock = 227 * 1024;  // H100/H200: the opt-in limit of one block

// Br = kQueryRows, Bc = kKeys, kStages ring slots. kSpareTiles: an O tile of its own where it fits,
// and then a second Q tile where that fits too (stage 10); without them one Q tile, in which O is
// staged too (stage 09).
template <int kDim, int kQueryRows, int kKeys, int kStages, bool kSpareTiles>
struct ForwardLayout {
  static constexpr int kPanels = kDim / kPanelColumns;  // 64-column panels of a tile
  static constexpr int kQueryPanelBytes = kQueryRows * kPanelRowBytes;
  static constexpr int kKvPanelBytes = kKeys * kPanelRowBytes;
  static constexpr int kQueryTileBytes = kPanels * kQueryPanelBytes;
  static constexpr int kKvTileBytes = kPanels * kKvPanelBytes;
  static constexpr int kRingSlots = kStages;
  static constexpr int kRingBytes = kStages * 2 * kKvTileBytes;
  // The barriers: per Q tile, Q has landed, Q is free again; per ring slot, K has landed, V has
  // landed, K is free again, V is free again. Beside them, per Q tile the index of the piece it holds
  // (an int; 8 bytes hold two). With spare tiles, room for two Q tiles' whether the second fits or not.
  static constexpr int kQuerySlots = kSpareTiles ? 2 : 1;
  static constexpr int kBarriers = 2 * kQuerySlots + 4 * kStages;
  static constexpr int kBaseBytes = kSwizzleBytes + kQueryTileBytes + kRingBytes + kBarriers * 8 + 8;

  static constexpr bool kOutTile = kSpareTiles && kBaseBytes + kQueryTileBytes <= kSharedBytesPerBlock;
  static constexpr int kQueryBuffers = kOutTile && kBaseBytes + 2 * kQueryTileBytes <= kSharedBytesPerBlock ? 2 : 1;
  static constexpr int kBytes = kBaseBytes + (kOutTile ? kQueryTileBytes : 0) + (kQueryBuffers - 1) * kQueryTileBytes;

  // From the aligned start: the O tile, the ring, the barriers.
  static constexpr int kOutTileOffset = kOutTile ? kQueryBuffers * kQueryTileBytes : 0;
  static constexpr int kRingOffset = (kQueryBuffers + (kOutTile ? 1 : 0)) * kQueryTileBytes;
  static constexpr int kBarrierOffset = kRingOffset + kRingBytes;
  static_assert(kBytes <= kSharedBytesPerBlock, "the tiles do not fit in one block's shared memory");
};

// The block's shared memory cut up by its Layout: from the start aligned to the swizzle's period,
// the Q tiles, the O tile (the Q tile where there is none), the ring, the barriers (per Q tile:
// landed, free; per ring slot: K landed, V landed, K free, V free) and the piece slots.
template <typename Layout>
struct ForwardShared {
  unsigned char* query_buffers;
  unsigned char* out_tile;
  unsigned char* ring;
  uint64_t* query_full;  // [kQueryBuffers]
  uint64_t* query_free;  // [kQueryBuffers]
  uint64_t* key_full;    // [kRingSlots]
  uint64_t* value_full;  // [kRingSlots]
  uint64_t* key_free;    // [kRingSlots]
  uint64_t* value_free;  // [kRingSlots]
  int* piece_slots;      // [kQueryBuffers]

  __device__ __forceinline__ explicit ForwardShared(unsigned char* shared_memory) {
    unsigned char* shared =
        shared_memory + ((kSwizzleBytes - shared_address(shared_memory) % kSwizzleBytes) % kSwizzleBytes);
    query_buffers = shared;
    out_tile = shared + Layout::kOutTileOffset;
    ring = shared + Layout::kRingOffset;
    uint64_t* barriers = reinterpret_cast<uint64_t*>(shared + Layout::kBarrierOffset);
    query_full = barriers;
    query_free = barriers + Layout::kQuerySlots;
    key_full = barriers + 2 * Layout::kQuerySlots;
    value_full = barriers + 2 * Layout::kQuerySlots + Layout::kRingSlots;
    key_free = barriers + 2 * Layout::kQuerySlots + 2 * Layout::kRingSlots;
    value_free = barriers + 2 * Layout::kQuerySlots + 3 * Layout::kRingSlots;
    piece_slots = reinterpret_cast<int*>(barriers + Layout::kBarriers);
  }
  __device__ __forceinline__ unsigned char* key_slot(int slot) const { return ring + 2 * slot * Layout::kKvTileBytes; }
  __device__ __forceinline__ unsigned char* value_slot(int slot) const {
    return ring + (2 * slot + 1) * Layout::kKvTileBytes;
  }
};

}  // namespace fa::kernel
