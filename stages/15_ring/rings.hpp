// The rings stage 15's schedule runs on (ring.hpp's Ring): P ranks on the CPU, P virtual ranks on
// one GPU (a loopback: passes are device-to-device copies), and P GPUs over NCCL.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ring.hpp"

namespace fa::ring {

// FP32 in host memory: stage 01's forward and stage 11's backward in plain C++ on each block, passes
// by memcpy. The schedule's bookkeeping checked without any GPU.
std::unique_ptr<Ring> make_host_ring(int ranks);

// The local stages of one GPU rank (16-bit, the same precision): a forward that writes the LSE and
// a backward. Hopper: stage 10 forward; otherwise stage 08's; backward stage 11's (pluggable).
struct LocalStages {
  StageDescriptor forward;
  StageDescriptor backward;
};
LocalStages default_local_stages(Precision precision, int compute_capability);

// `ranks` virtual ranks on the current GPU, each with its own compute stream; every pass is a
// device-to-device copy on one shared stream.
std::unique_ptr<Ring> make_loopback_ring(int ranks, const LocalStages& stages);

// One rank per GPU in `devices`, one process driving them all (ncclCommInitAll): passes are
// ncclSend/ncclRecv in a group, each rank's on a stream of its own. Throws std::runtime_error with
// NCCL's reason when it cannot start.
std::unique_ptr<Ring> make_nccl_ring(const std::vector<int>& devices, const LocalStages& stages);

}  // namespace fa::ring
