// Programmatic dependent launch (sm_90 on), taught in stage 12's README ("On Hopper: the 64 rows are
// one wgmma", the merge's launch). A kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may start before the kernel ahead of it on the
// stream has finished: as soon as every block of that kernel has called launch_dependents (or
// exited). Before it reads what that kernel wrote it calls wait_for_prerequisite, which returns once
// that kernel has finished and its writes are visible. On older GPUs both are no-ops, and the launch
// is an ordinary one.
#pragma once

namespace fa::kernel {

__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace fa::kernel
