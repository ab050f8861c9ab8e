// Ampere's asynchronous copies, global -> shared (taught in stage 07's README, "The pipeline").
// sm_80 and newer: a stage that includes this guards its device code with __CUDA_ARCH__ >= 800.
#pragma once

namespace fa::kernel {

constexpr int kCopyBytes = 16;  // one cp.async

// One 16-byte asynchronous copy. `.cg` caches it in L2 only (K and V are reused by other blocks
// through L2, never by this SM through L1). With source_bytes = 0 it reads nothing and fills the
// 16 bytes with zeros: rows past N and padding columns are cleared without a branch.
__device__ __forceinline__ void copy_async_16(void* shared_destination, const void* global_source, int source_bytes) {
  const unsigned destination = static_cast<unsigned>(__cvta_generic_to_shared(shared_destination));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination), "l"(global_source),
               "r"(source_bytes)
               : "memory");
}

// Closes the group of copies this thread has issued since the last commit.
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's committed groups are still in flight. It covers
// only this thread's copies: a __syncthreads after it makes every thread's copies visible.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace fa::kernel
