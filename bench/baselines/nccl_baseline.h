// The NCCL peer: ncclAllReduce (in place, sum) and ncclAllGather on the bench's
// device buffers, through NCCL's own algorithms (ring/tree/NVLS as NCCL picks),
// the collectives PyTorch's NCCL backend runs. Built only with CUDA.
//
// Its communicator is its own, separate from the one gradcomm may have created:
// rank 0 draws an NCCL unique id and publishes it through the job's store
// (a client connection the bench opens beside the Communicator's; key
// "bench/nccl/id"), every rank creates the communicator on its bench device
// (nonblocking mode, with the job's timeout). NCCL needs one GPU per rank: two
// ranks on one GPU make the creation fail, and the error says so.
//
// Timing as gradcomm's on CUDA: run() only enqueues on the legacy default stream
// (the stream gradcomm-bench gives gradcomm); synchronize() after the loop waits.
#pragma once

#include <memory>
#include <string>

#include "baselines/baseline.h"

namespace gradcomm::detail {
class NcclComm;
class Event;
}  // namespace gradcomm::detail

namespace gradcomm::bench {

class NcclBaseline : public Baseline {
 public:
  // Collective: every rank creates the NCCL communicator together.
  explicit NcclBaseline(const BaselineSetup& setup);
  ~NcclBaseline() override;

  std::string name() const override { return "nccl"; }
  std::string describe() const override { return description_; }
  void validate(BenchOp op, DType dtype) const override;
  void prepare(BenchOp op, DType dtype, void* in, void* out, int64_t count) override;
  void run() override;
  void synchronize() override;

 private:
  std::unique_ptr<detail::NcclComm> comm_;
  std::unique_ptr<detail::Event> done_;
  std::chrono::milliseconds timeout_;
  int device_;
  std::string description_;
  BenchOp op_ = BenchOp::kAllreduce;
  int dtype_ = 0;  // ncclDataType_t
  void* in_ = nullptr;
  void* out_ = nullptr;
  int64_t count_ = 0;
};

}  // namespace gradcomm::bench
