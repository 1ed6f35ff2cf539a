// A peer library measured beside gradcomm in the same run (MPI, Gloo, NCCL). The
// bench sees only this interface; each peer lives in its own file and is compiled
// in only when its package was found (GRADCOMM_BENCH_HAVE_MPI / _GLOO / _NCCL).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gradcomm/types.h"
#include "store/store.h"

namespace gradcomm::bench {

enum class BenchOp { kAllreduce, kAllgather, kReduceScatter };

// Under a bare MPI launch (`mpirun -np N gradcomm-bench`, no GRADCOMM_STORE and no
// MASTER_ADDR/MASTER_PORT), the job meets through MPI itself, as nccl-tests hands out
// its NCCL id: MPI is initialized, rank 0 picks the store's URL and a job token, and
// MPI_Bcast gives them to every rank. Collective over MPI_COMM_WORLD. Empty when not
// under an MPI launcher, when a store is configured already, or without MPI.
struct MpiRendezvous {
  std::string store;
  std::string job_token;
};
std::optional<MpiRendezvous> rendezvous_through_mpi();
const char* bench_op_name(BenchOp op);

// What a baseline needs to join the job's ranks: they come from gradcomm's launch
// configuration, and the store is a client connection to the job's gradcomm store
// (keys under "bench/<baseline>/", so they never meet the Communicator's own keys).
struct BaselineSetup {
  detail::Store* store = nullptr;  // not owned; outlives the baseline
  std::string store_url;           // for choosing the address Gloo binds
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{300'000};
  Device device{};                 // where the bench's buffers live (NCCL: the rank's GPU)
};

class Baseline {
 public:
  virtual ~Baseline() = default;
  // "mpi", "gloo": the `impl` of its JSON records.
  virtual std::string name() const = 0;
  // How the peer was connected, for the table's header ("singletons joined via ompi-server").
  virtual std::string describe() const = 0;
  // Unsupported when the peer cannot run `op` on `dtype`; called once before any
  // measurement, so the run fails before it starts rather than after the first size.
  virtual void validate(BenchOp op, DType dtype) const = 0;
  // Binds the buffers for one size. May allocate and exchange setup messages (Gloo
  // builds its algorithm object here), so it is never inside the timed loop.
  // allreduce: in place on `in` (count elements, summed); `out` unused.
  // allgather: `in` holds count elements, `out` size()*count, rank r's at r*count.
  // InvalidArgument/Unsupported for a dtype or count the peer cannot take.
  virtual void prepare(BenchOp op, DType dtype, void* in, void* out, int64_t count) = 0;
  // One collective on the prepared buffers: blocking for host peers (MPI, Gloo);
  // enqueued on the stream for GPU peers (NCCL). TransportError on failure.
  virtual void run() = 0;
  // Waits until every run() so far has completed (GPU peers; host peers block in
  // run() already). The bench calls it after each loop, inside the timing.
  virtual void synchronize() {}
  // Collective teardown (MPI_Finalize) while every rank is still alive; the bench
  // calls it on all ranks, then a gradcomm barrier, then destroys the object.
  virtual void shutdown() {}
};

// "mpi" | "gloo" | "nccl". InvalidArgument for an unknown name, Unsupported for a peer this
// binary was built without. Collective: every rank must call it together.
std::unique_ptr<Baseline> make_baseline(const std::string& name, const BaselineSetup& setup);

}  // namespace gradcomm::bench
