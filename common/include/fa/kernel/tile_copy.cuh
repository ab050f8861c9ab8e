// A tile of 16-bit rows copied from global into swizzled shared memory by all the block's threads
// (taught in stage 08's README, "The swizzle"; stages 11 and 12 copy their tiles the same way).
// sm_80 and newer (cp.async): a stage that includes this guards its device code accordingly.
#pragma once

#include <cstdint>
#include <numeric>

#include "fa/kernel/convert.cuh"
#include "fa/kernel/cp_async.cuh"
#include "fa/kernel/swizzle.cuh"

namespace fa::kernel {

// Where chunk `chunk` of row `row` of a tile lands, in bytes from the tile's start. Both layouts
// permute chunks only within groups of kGroupChunks and within every 8 rows, so for a row a
// multiple of 8 further and a chunk a multiple of kGroupChunks further the offset moves by
// offset(rows, chunks): the copy below relies on that.
//
// Rows one after another, kChunksPerRow chunks each, swizzled as ldmatrix reads them (stage 08).
template <int kChunksPerRow>
struct SwizzledRows {
  static constexpr int kGroupChunks = swizzle_group_chunks(kChunksPerRow);
  __device__ __forceinline__ static int offset(int row, int chunk) {
    return swizzled_chunk_index<kChunksPerRow>(row, chunk) * kChunkBytes;
  }
};

// 64-column panels of kRows rows, a row of a panel 128 bytes with chunk c at c ^ (row % 8): the
// layout TMA's 128-byte swizzle writes and wgmma reads (stage 09), for a kernel that fills it with
// cp.async instead (stage 12's wgmma kernel).
template <int kRows>
struct SwizzledPanels {
  static constexpr int kGroupChunks = kSwizzleRows;
  static constexpr int kRowBytes = kSwizzleRows * kChunkBytes;
  __device__ __forceinline__ static int offset(int row, int chunk) {
    return chunk / kSwizzleRows * kRows * kRowBytes + row * kRowBytes +
           (chunk % kSwizzleRows ^ row % kSwizzleRows) * kChunkBytes;
  }
};

// Copies rows [0, kRows) of a (rows x dim) matrix whose rows start `dim` elements apart into a
// tile of kRowDim-wide rows laid out as Layout, zeros past `valid_rows` and past `dim`.
//
// kAsync: 16-byte cp.async copies, issued without waiting (the caller commits and waits); the
// rows must be whole 16-byte chunks on 16-byte boundaries. A row is copied by kThreadsPerRow
// consecutive threads, each taking every kThreadsPerRow-th chunk of it: whole 64- or 128-byte
// pieces of global memory, and different bank groups of shared memory.
// Otherwise ordinary loads and stores one element at a time, in a loop left rolled: the fallback
// for a head dim that is not whole chunks or a pointer off a 16-byte boundary runs when O already
// holds most registers, and an unrolled loop cost a spill.
template <bool kAsync, typename Layout, int kRowDim, int kRows, int kThreads, typename Element>
__device__ __forceinline__ void copy_tile(void* tile, const Element* source, int valid_rows, int dim) {
  constexpr int kChunkElements = kChunkBytes / static_cast<int>(sizeof(Element));
  unsigned char* const tile_bytes = static_cast<unsigned char*>(tile);
  if constexpr (kAsync) {
    constexpr int kChunksPerRow = kRowDim / kChunkElements;
    // A pass covers a multiple of 8 rows. At D = 192 (24 chunks a row) with 128 threads that
    // leaves 8 threads a row, three chunks each, 8 chunks apart.
    constexpr int kThreadsPerRow = std::gcd(kThreads / kSwizzleRows, kChunksPerRow);
    constexpr int kChunksPerThread = kChunksPerRow / kThreadsPerRow;
    constexpr int kRowsPerPass = kThreads / kThreadsPerRow;
    static_assert(kRows % kRowsPerPass == 0, "whole rows in every pass");
    // The passes are a multiple of 8 rows apart and a thread's chunks of one row whole groups
    // apart, so each destination is the thread's first one plus a constant (Layout's rule), and
    // one source pointer stepped by a fixed stride reaches every pass. (Written as row · dim per
    // pass, the compiler kept every pass's 64-bit offset in registers of its own for the whole
    // K/V loop, where they are scarce.)
    static_assert(kRowsPerPass % kSwizzleRows == 0 && kThreadsPerRow % Layout::kGroupChunks == 0,
                  "every pass keeps row % 8, every chunk of a thread keeps its place in its group");
    const int first_row = static_cast<int>(threadIdx.x) / kThreadsPerRow;
    const int chunk = static_cast<int>(threadIdx.x) % kThreadsPerRow;
    unsigned char* const destination = tile_bytes + Layout::offset(first_row, chunk);
    const int pass_stride = kRowsPerPass * dim;  // elements; a tile is far below 2^31 of them
    const Element* chunk_source = source + static_cast<int64_t>(first_row) * dim + chunk * kChunkElements;
#pragma unroll
    for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
      const bool row_inside = first_row + pass * kRowsPerPass < valid_rows;
#pragma unroll
      for (int part = 0; part < kChunksPerThread; ++part) {
        const int part_offset = part * kThreadsPerRow * kChunkElements;
        const bool inside = row_inside && chunk * kChunkElements + part_offset < dim;
        copy_async_16(destination + Layout::offset(pass * kRowsPerPass, part * kThreadsPerRow),
                      inside ? chunk_source + part_offset : source, inside ? kChunkBytes : 0);
      }
      chunk_source += pass_stride;
    }
  } else {
#pragma unroll 1
    for (int index = threadIdx.x; index < kRows * kRowDim; index += kThreads) {
      const int row = index / kRowDim;
      const int column = index % kRowDim;
      Element* element = reinterpret_cast<Element*>(tile_bytes + Layout::offset(row, column / kChunkElements)) +
                         column % kChunkElements;
      *element = row < valid_rows && column < dim ? source[static_cast<int64_t>(row) * dim + column]
                                                  : to_element<Element>(0.0f);
    }
  }
}

}  // namespace fa::kernel
