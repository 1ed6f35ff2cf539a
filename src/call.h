// Call: one user call as issued, queued for the engine (engine.h), and WorkState,
// what its Work handle and the engine share.
//
// Ownership. The issuing thread validates the arguments and fills a Call; from
// then on only the thread that runs it reads it: the engine, or the issuing thread
// itself for a call it runs inline (engine.h), with the engine held off. `key` points into the communicator's
// CompressionState (map nodes never move); the engine alone touches the key's
// step, residual and device state, the issuing side only its numel and dtype.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "compressors/tensor_part.h"
#include "env.h"
#include "gradcomm/types.h"
#include "state.h"

namespace gradcomm::detail {

struct CompressorSpec;  // compressors/spec.h
struct AutoSpec;        // compressors/auto_spec.h

class Engine;

// Asks the engine to stop waiting for more calls to fuse with the ones a caller
// now waits on. Outlives the engine: ring() does nothing once it is gone.
class Doorbell {
 public:
  void ring(uint64_t ticket);
  void attach(Engine* engine);
  void detach();
  // Callers blocked in Work::wait/wait_for right now. While any is, the engine's waits
  // poll before they sleep (src/spin.h): a caller waits on them, and it leaves the core
  // free. While none is (a training step overlapping its allreduces with backward),
  // polling would only take the core from the caller's computation.
  void enter_wait() { waiters_.fetch_add(1, std::memory_order_relaxed); }
  void leave_wait() { waiters_.fetch_sub(1, std::memory_order_relaxed); }
  bool waited_on() const { return waiters_.load(std::memory_order_relaxed) > 0; }

 private:
  std::mutex mutex_;
  Engine* engine_ = nullptr;
  std::atomic<int> waiters_{0};
};

struct WorkState {
  uint64_t ticket = 0;  // issue order, over every call (collective or local)
  std::shared_ptr<Doorbell> doorbell;

  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  // When the application first needed the call (its Work::wait or wait_for, or
  // Work::needed; a helper's wait does not count; steady-clock ns, 0: not yet): how
  // long it computed after issuing, which compressor=auto reads as the time a call's
  // wire may hide behind (auto_choice.h).
  std::atomic<int64_t> first_wait_ns{0};
  void note_wait() {
    if (first_wait_ns.load(std::memory_order_relaxed) != 0) return;  // only the first counts
    int64_t none = 0;
    const int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
    first_wait_ns.compare_exchange_strong(none, now, std::memory_order_relaxed);
  }

  void complete(std::exception_ptr e);
  void ask_to_start() const {
    if (doorbell) doorbell->ring(ticket);
  }
};

struct Call {
  enum class Kind : uint8_t { kAllreduce, kAllgather, kBroadcast, kBarrier, kLocal, kReduceScatter };
  Kind kind = Kind::kBarrier;
  TensorView tensor{};  // allreduce, broadcast; allgather's and reduce_scatter's input
  TensorView out{};     // allgather's and reduce_scatter's output
  ReduceOp reduce_op = ReduceOp::kSum;  // allreduce, reduce_scatter
  int root = 0;
  const CompressorSpec* spec = nullptr;  // allreduce: parsed once, owned by the communicator
  // compressor=auto (owned by the communicator): the engine sets `spec` to the key's
  // choice before the call's header is made (auto_choice.h); until then spec is a placeholder.
  const AutoSpec* auto_spec = nullptr;
  KeyState* key = nullptr;               // allreduce with a key
  std::string key_name;
  uint64_t key_hash = 0;                 // a compressed call's: seeds its random streams
  std::vector<TensorPart> parts;         // allreduce: the tensor's shape(s), when the caller gave them
  uint32_t parts_digest = 0;             // Family::reads_shapes: fingerprint of parts, compared across ranks (0: none)
  void* stream = nullptr;                // CUDA stream (allreduce on device tensors)
  std::function<void()> local;           // kLocal: runs on the engine thread, in issue order
  Clock::time_point issued{};
  int issuer = 0;  // the issuing thread's id (gettid), for Engine's issuing-thread rule
  std::shared_ptr<WorkState> work;
};

}  // namespace gradcomm::detail
