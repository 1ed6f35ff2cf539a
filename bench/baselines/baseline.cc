#include "baselines/baseline.h"

#include <fmt/format.h>

#include "gradcomm/errors.h"

#if GRADCOMM_BENCH_HAVE_MPI
#include "baselines/mpi_baseline.h"
#endif
#if GRADCOMM_BENCH_HAVE_GLOO
#include "baselines/gloo_baseline.h"
#endif
#if GRADCOMM_BENCH_HAVE_NCCL
#include "baselines/nccl_baseline.h"
#endif

namespace gradcomm::bench {

const char* bench_op_name(BenchOp op) {
  switch (op) {
    case BenchOp::kAllreduce: return "allreduce";
    case BenchOp::kAllgather: return "allgather";
    case BenchOp::kReduceScatter: return "reduce_scatter";
  }
  return "unknown";
}

std::optional<MpiRendezvous> rendezvous_through_mpi() {
#if GRADCOMM_BENCH_HAVE_MPI
  return mpi_rendezvous();
#else
  return std::nullopt;
#endif
}

std::unique_ptr<Baseline> make_baseline(const std::string& name, const BaselineSetup& setup) {
  if (name == "mpi") {
#if GRADCOMM_BENCH_HAVE_MPI
    return std::make_unique<MpiBaseline>(setup);
#else
    throw Unsupported("--baseline mpi: this gradcomm-bench was built without MPI (CMake found no MPI; "
                      "install libopenmpi-dev and reconfigure)");
#endif
  }
  if (name == "gloo") {
#if GRADCOMM_BENCH_HAVE_GLOO
    return std::make_unique<GlooBaseline>(setup);
#else
    throw Unsupported("--baseline gloo: this gradcomm-bench was built without Gloo (CMake found no Gloo; "
                      "install libgloo-dev and reconfigure)");
#endif
  }
  if (name == "nccl") {
#if GRADCOMM_BENCH_HAVE_NCCL
    return std::make_unique<NcclBaseline>(setup);
#else
    throw Unsupported("--baseline nccl: this gradcomm-bench was built without CUDA (configure with "
                      "GRADCOMM_CUDA=ON); on CPU use --baseline mpi or gloo");
#endif
  }
  throw InvalidArgument(fmt::format("--baseline '{}': expected mpi, gloo, nccl or none", name));
}

}  // namespace gradcomm::bench
