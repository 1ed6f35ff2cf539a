// The MPI peer: MPI_Allreduce (in place, MPI_SUM) and MPI_Allgather on one
// communicator holding the job's ranks in gradcomm's rank order.
//
// Two ways to get that communicator:
//  - Under mpirun (OMPI_COMM_WORLD_SIZE or PMIX_RANK set before MPI_Init):
//    MPI_COMM_WORLD, checked against gradcomm's rank and size.
//  - Under gradcomm-run (or any launcher that is not MPI's): each process's
//    MPI_Init makes a singleton, and Open MPI 4.1 connects separate jobs only
//    through a PMIx publish/lookup server (MPI_Comm_join and accept/connect both
//    fail without one). So rank 0 starts `ompi-server` (its child, killed with it),
//    every rank points OMPI_MCA_pmix_server_uri at it before MPI_Init, rank 0 opens
//    an MPI port, and the group grows one rank at a time: all current members
//    MPI_Comm_accept, rank k MPI_Comm_connect, then MPI_Intercomm_merge puts k last.
//    Ranks connect strictly in order (a store key says whose turn it is): two
//    simultaneous connects to one port deadlock the merge. Between jobs Open MPI
//    has no shared-memory path, so this MPI runs over its TCP BTL (loopback).
//    A user-run ompi-server is used instead when OMPI_MCA_pmix_server_uri is set.
#pragma once

#include <sys/types.h>

#include <mpi.h>

#include <string>

#include "baselines/baseline.h"

namespace gradcomm::bench {

// rendezvous_through_mpi() (baseline.h) when built with MPI.
std::optional<MpiRendezvous> mpi_rendezvous();

class MpiBaseline : public Baseline {
 public:
  // Collective over all ranks: initializes MPI and builds the communicator.
  explicit MpiBaseline(const BaselineSetup& setup);
  ~MpiBaseline() override;

  std::string name() const override { return "mpi"; }
  std::string describe() const override { return description_; }
  void validate(BenchOp op, DType dtype) const override;
  void prepare(BenchOp op, DType dtype, void* in, void* out, int64_t count) override;
  void run() override;
  void shutdown() override;

 private:
  void join_singletons(const BaselineSetup& setup);
  // Starts ompi-server (rank 0) and returns the URI it reports.
  std::string start_server(std::chrono::milliseconds timeout);
  void stop_server();

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool initialized_ = false;   // we called MPI_Init, so we owe MPI_Finalize
  std::string port_;           // rank 0 of the singleton path: the open MPI port
  pid_t server_pid_ = -1;      // rank 0: the ompi-server child
  std::string server_dir_;     // rank 0: temp dir of the server's URI file
  std::string description_;

  BenchOp op_ = BenchOp::kAllreduce;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  void* in_ = nullptr;
  void* out_ = nullptr;
  int count_ = 0;
};

}  // namespace gradcomm::bench
