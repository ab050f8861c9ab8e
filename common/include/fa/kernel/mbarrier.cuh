// The shared-memory barrier of asynchronous copies, mbarrier (taught in stage 09's README, "The
// mbarrier: phase bit and transaction count"). sm_90 and newer (the transaction count is Hopper's).
//
// An mbarrier is 8 bytes of shared memory that counts two things down to zero: arrivals (threads
// that said "done") and transaction bytes (bytes that copies have promised to deliver). When both
// reach zero the current *phase* completes: the barrier flips its phase bit and re-arms itself with
// the arrival count it was initialized with. A waiter asks "has the phase with parity P
// completed?", so a ring of buffers reuses one barrier per buffer, pass after pass: pass n of the
// ring waits for parity n % 2.
#pragma once

#include <cstdint>

namespace fa::kernel {

__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// One thread initializes; then fence_barrier_init() and a __syncthreads() before anyone uses it
// (the copy engine included).
__device__ __forceinline__ void barrier_init(uint64_t* barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
}

// Makes the initialized barriers visible to the asynchronous proxy (the copy engine that will
// complete transactions on them).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival, and `bytes` more to expect in this phase (the copies issued next deliver them).
__device__ __forceinline__ void barrier_arrive_expect_bytes(uint64_t* barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}

// One arrival.
__device__ __forceinline__ void barrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}

// Waits until the phase with parity `parity` (0 or 1) has completed. try_wait suspends the thread
// for a while inside the instruction before it answers "not yet", so the loop does not spin hot.
// Completion also makes the bytes the copies wrote visible to this thread.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, unsigned parity) {
  const unsigned address = shared_address(barrier);
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  } while (done == 0);
}

}  // namespace fa::kernel
