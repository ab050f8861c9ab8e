// The ring over NCCL, one process driving every GPU of the machine: ncclCommInitAll makes one
// communicator per GPU, and each pass is one group in which every rank sends to the next and
// receives from the one before, each on its own pass stream.
#include <nccl.h>

#include <stdexcept>
#include <string>

#include "ring_cuda.hpp"

namespace fa::ring {
namespace {

void check_nccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(result));
}

class NcclTransport final : public Transport {
 public:
  explicit NcclTransport(const std::vector<int>& devices) : comms_(devices.size()) {
    check_nccl(ncclCommInitAll(comms_.data(), static_cast<int>(devices.size()), devices.data()), "ncclCommInitAll");
  }
  ~NcclTransport() override {
    for (ncclComm_t comm : comms_) ncclCommDestroy(comm);
  }

  Status exchange(const std::vector<std::vector<Transfer>>& transfers,
                  const std::vector<cudaStream_t>& pass_streams) override {
    const int ranks = static_cast<int>(comms_.size());
    // One group: NCCL matches every send with its receive, whatever the order within the group.
    if (ncclGroupStart() != ncclSuccess) return Status::unsupported("ncclGroupStart failed");
    ncclResult_t result = ncclSuccess;
    for (int rank = 0; rank < ranks && result == ncclSuccess; ++rank) {
      const int next = (rank + 1) % ranks;
      const int previous = (rank + ranks - 1) % ranks;
      for (size_t i = 0; i < transfers[rank].size() && result == ncclSuccess; ++i) {
        const Transfer& out = transfers[rank][i];
        const Transfer& in = transfers[previous][i];
        result = ncclSend(out.send, static_cast<size_t>(out.bytes), ncclChar, next, comms_[rank], pass_streams[rank]);
        if (result == ncclSuccess) {
          result =
              ncclRecv(in.receive, static_cast<size_t>(in.bytes), ncclChar, previous, comms_[rank], pass_streams[rank]);
        }
      }
    }
    const ncclResult_t ended = ncclGroupEnd();
    if (result != ncclSuccess || ended != ncclSuccess) {
      return Status::unsupported(std::string("NCCL send/receive failed: ") +
                                 ncclGetErrorString(result != ncclSuccess ? result : ended));
    }
    return Status();
  }

 private:
  std::vector<ncclComm_t> comms_;
};

}  // namespace

std::unique_ptr<Ring> make_nccl_ring(const std::vector<int>& devices, const LocalStages& stages) {
  return make_cuda_ring(devices, stages, std::make_unique<NcclTransport>(devices), false);
}

}  // namespace fa::ring
