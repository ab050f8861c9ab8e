// The XOR swizzle of 16-byte chunks in shared tiles that ldmatrix reads (taught in stage 08's
// README, "The swizzle"; stages 11 and 12 store their tiles the same way).
#pragma once

namespace fa::kernel {

constexpr int kChunkBytes = 16;  // the unit the swizzle moves: one cp.async, one ldmatrix row
constexpr int kSwizzleRows = 8;  // the swizzle permutes the chunks of every 8 consecutive rows

// The chunks of a row that the swizzle permutes among themselves: groups of 8 (64 dims of a 16-bit
// type) where a row is whole such groups, else groups of 4 (D = 96: a row of 12 chunks, three
// groups of 4).
constexpr int swizzle_group_chunks(int chunks_per_row) {
  return chunks_per_row % kSwizzleRows == 0 ? kSwizzleRows : kSwizzleRows / 2;
}

// In a row-major tile the 8 row addresses of one ldmatrix 8x8 matrix are 128 or 256 bytes apart:
// all in the same four banks, an 8-way conflict. Storing chunk c of row r at chunk c ^ (r % 8)
// spreads any 8 consecutive rows' copies of one chunk over 8 different 16-byte bank groups, and
// every chunk stays whole (cp.async writes it in one piece). Rows of 12 chunks (D = 96, 192 bytes)
// already alternate between the two halves of the 32 banks, so c ^ (r / 2 % 4), within a group of
// 4 chunks, does the rest: again 8 different bank groups. The chunk index of (row, chunk):
template <int kChunksPerRow>
__device__ __forceinline__ int swizzled_chunk_index(int row, int chunk) {
  constexpr int kRowsPerPattern = kSwizzleRows / swizzle_group_chunks(kChunksPerRow);   // 1, or 2 at D = 96
  return row * kChunksPerRow + (chunk ^ (row & (kSwizzleRows - 1)) / kRowsPerPattern);  // rows being >= 0
}

// The swizzle as address arithmetic, for a walk along a row in 16-column (two-chunk) steps: chunk
// 2·(step % 4) + bit of a row lands at chunk (2·(step % 4)) ^ (bit ^ row % 8) of its group of 8, so
// the lane's byte address for step 0, XOR 32·(step % 4), plus 128 bytes per group of 4 steps (in
// groups of 4 chunks: XOR 32·(step % 2), plus 64 bytes per 2 steps). Rows and tiles must start on
// group boundaries, so that the XOR touches only the chunk bits.
template <int kGroupChunks>
__device__ __forceinline__ unsigned swizzled_step_address(unsigned lane_address, int step) {
  constexpr int kStepsPerGroup = kGroupChunks / 2;
  constexpr int kGroupBytes = kGroupChunks * kChunkBytes;
  return (lane_address ^ step % kStepsPerGroup * 2 * kChunkBytes) + step / kStepsPerGroup * kGroupBytes;
}

}  // namespace fa::kernel
