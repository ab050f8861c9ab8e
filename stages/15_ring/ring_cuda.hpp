// The GPU ring's one moving part that differs between NCCL and the loopback: how the blocks of a
// pass get from each rank to the next.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "rings.hpp"

namespace fa::ring {

class Transport {
 public:
  virtual ~Transport() = default;
  // Queues pass `transfers` (rank r sends transfers[r] to rank r + 1) on each rank's pass stream.
  virtual Status exchange(const std::vector<std::vector<Transfer>>& transfers,
                          const std::vector<cudaStream_t>& pass_streams) = 0;
};

// A ring of one rank per entry of `devices` (a device may repeat: virtual ranks), each with its own
// compute stream; with `shared_pass_stream` every rank's passes go on one stream (the loopback's
// copies read one rank's buffer and write another's, so one stream keeps them in order).
std::unique_ptr<Ring> make_cuda_ring(const std::vector<int>& devices, const LocalStages& stages,
                                     std::unique_ptr<Transport> transport, bool shared_pass_stream);

}  // namespace fa::ring
