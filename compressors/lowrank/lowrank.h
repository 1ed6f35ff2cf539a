// The low-rank shape: what the compressed allreduce's low-rank step
// (src/collectives/powersgd_allreduce.cc, nccl_powersgd_allreduce.cc) asks of a family
// (Family::low_rank). The arithmetic is powersgd.h and gpu_powersgd.h beside this.
#pragma once

namespace gradcomm::detail {

struct LowRankShape {
  int rank = 1;                       // the approximation's rank, at most
  bool warm_start = true;             // Q carries over from step to step
  double min_compression_rate = 2.0;  // how much smaller than a matrix P and Q must be for it to
                                      // be compressed (torch's min_compression_rate)
};

}  // namespace gradcomm::detail
