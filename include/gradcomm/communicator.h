// The communicator: one per process and job, the entry point of every collective.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gradcomm/types.h"

namespace gradcomm {

struct CompressOptions {
  std::string compressor = "none";  // spec string (DESIGN.md section 5)
  std::string key;                  // names this tensor's state; required for stateful compressors
  void* stream = nullptr;           // cudaStream_t for device tensors; null = default stream
};

struct InitOptions {  // unset fields come from the environment (see README, "Launching")
  int rank = -1, world_size = -1;
  std::string store;                // "tcp://host:port" | "file:///shared/dir"
  std::string transport = "auto";   // "ucx" | "nccl" | "auto"
  std::chrono::milliseconds timeout{300'000};
  std::string job_token;            // shared secret; empty = GRADCOMM_JOB_TOKEN
};

// Counters since the communicator was created. Wire bytes count everything this
// rank put on (or took off) the transport: headers, payloads and control messages.
struct Stats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t messages_sent = 0;
  uint64_t ops = 0;             // collectives completed
  double total_s = 0;           // wall time inside collectives
  double reduce_s = 0;          // of which: local reduction (CPU arithmetic)
  double encode_s = 0;          // of which: compression encode
  double decode_s = 0;          // of which: compression decode
  double comm_s() const { return total_s - reduce_s - encode_s - decode_s; }  // waiting on the wire
};

namespace detail {
class CommunicatorImpl;
}

class Communicator {
 public:
  // Rendezvous through the store and connect the transport. Blocks until every
  // rank has joined or `timeout` passes (TimeoutError).
  static std::unique_ptr<Communicator> create(const InitOptions& options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;

  // In place. Every rank must call with the same numel, dtype, op and compressor.
  void allreduce(TensorView t, ReduceOp op = ReduceOp::kSum, const CompressOptions& options = {});
  // out.numel == size() * in.numel; rank r's input lands at out[r * in.numel].
  void allgather(TensorView in, TensorView out);
  void broadcast(TensorView t, int root);
  void barrier();
  // Waits for stream-ordered work (CUDA tensors) to finish and surfaces its errors.
  void synchronize();

  std::vector<uint8_t> save_state() const;   // all compression state (residuals, steps)
  void load_state(std::span<const uint8_t> bytes);  // validates; CorruptPayload on bad input
  Stats stats() const;

  // For internal factories (tests build communicators over the in-process transport).
  explicit Communicator(std::unique_ptr<detail::CommunicatorImpl> impl);
  detail::CommunicatorImpl& impl() { return *impl_; }

 private:
  std::unique_ptr<detail::CommunicatorImpl> impl_;
};

}  // namespace gradcomm
