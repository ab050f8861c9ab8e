// The tensor memory accelerator (TMA): tensor maps built on the host, bulk tensor copies between
// global and shared memory on the device (taught in stage 09's README, "The 128-byte swizzle
// and the tensor map" and "setmaxnreg and the fence.proxy.async rule"). Copies to shared memory need sm_90; the stage
// that includes this guards its device code accordingly.
//
// A tensor map (CUtensorMap, 128 bytes) describes a tensor in global memory (base address, sizes,
// byte strides), the box one copy moves, and how the box is laid out in shared memory (here the
// 128-byte swizzle that wgmma's descriptors read). The driver builds it (cuTensorMapEncodeTiled);
// it reaches the kernel as a __grid_constant__ parameter, and one thread then moves a whole box
// with one instruction, filling whatever lies outside the tensor with zeros.
#pragma once

#include <cuda.h>          // CUtensorMap and its enums: types only, nothing here links libcuda
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "fa/stage.hpp"

namespace fa::kernel {

// ---- Host: building a tensor map -------------------------------------------------------------

// cuTensorMapEncodeTiled is a driver function. The runtime hands out the driver's entry points,
// so the stage needs no libcuda at link time (the driver is loaded anyway). Null when the driver
// does not have it (older than CUDA 12.0).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t error =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t error = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found);
#endif
    return error == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function)
               : nullptr;
  }();
  return encoder;
}

// A tensor map over a stack of `matrices` row-major matrices of `rows` x `columns` 16-bit elements
// (Q as (B·Hq) x Nq x D, say), copied in boxes of `box_rows` x `box_columns` with the 128-byte
// swizzle. The box's row is at most 128 bytes (64 elements): a wider tile takes one copy per
// 64-column panel. TMA's rules, checked by the driver: the base address 16-byte aligned, every
// byte stride a multiple of 16 (so `columns` a multiple of 8), box sizes at most 256. A box may
// reach past the tensor's end (more rows than are left, or wider than `columns`): TMA fills those
// elements with zeros on loads and skips them on stores.
inline Status encode_matrix_stack(CUtensorMap& map, bool bf16, const void* base, uint64_t columns, uint64_t rows,
                                  uint64_t matrices, uint32_t box_columns, uint32_t box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return Status::unsupported("the CUDA driver has no cuTensorMapEncodeTiled (needs 12.0+)");
  const cuuint64_t sizes[3] = {columns, rows, matrices};            // fastest first
  const cuuint64_t strides[2] = {columns * 2, columns * rows * 2};  // bytes, for dimensions 1 and 2
  const cuuint32_t box[3] = {box_columns, box_rows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result =
      encode(&map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
             const_cast<void*>(base), sizes, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return Status::unsupported("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(static_cast<int>(result)) +
                               ") for a " + std::to_string(matrices) + " x " + std::to_string(rows) + " x " +
                               std::to_string(columns) + " tensor");
  }
  return Status();
}

// ---- Device: the copies ----------------------------------------------------------------------

// Brings the tensor map (a kernel parameter, in constant memory) into the copy engine's cache
// before the first copy needs it.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// Copies the box at (column, row, matrix) into shared memory at `destination` (1024-byte aligned
// for the 128-byte swizzle), and completes its bytes on `barrier` (whose expected byte count the
// issuing thread has raised by the box's size: the whole box, zero-filled parts included).
__device__ __forceinline__ void copy_box_to_shared(unsigned destination, const CUtensorMap* map, unsigned barrier,
                                                   int column, int row, int matrix) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(destination),
      "l"(map), "r"(barrier), "r"(column), "r"(row), "r"(matrix)
      : "memory");
}

// Copies a box from shared memory at `source` to (column, row, matrix); the parts of the box
// outside the tensor are not written.
__device__ __forceinline__ void copy_box_to_global(const CUtensorMap* map, unsigned source, int column, int row,
                                                   int matrix) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(map),
               "r"(source), "r"(column), "r"(row), "r"(matrix)
               : "memory");
}

// Stores are tracked in bulk groups, per thread: commit the ones issued, then wait until they
// have finished *reading* shared memory (before it may be reused or the block may exit).
__device__ __forceinline__ void commit_stores() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void wait_stores_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// The proxy rule: ordinary stores to shared memory (the generic proxy) are not seen by the copy
// engine or the tensor cores (the async proxy) until the writing thread executes this fence. Then
// a barrier, then the copy or wgmma that reads them.
__device__ __forceinline__ void fence_shared_for_async_proxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace fa::kernel
