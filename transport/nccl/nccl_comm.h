// The NCCL edge: an RAII communicator in NCCL's nonblocking mode, grouped
// send/receive enqueued on a caller's stream, and waits with a deadline.
//
// Nonblocking mode (ncclConfig_t::blocking = 0) is what makes every wait here
// bounded: init, group launches and finalize return at once (ncclInProgress) and
// we poll ncclCommGetAsyncError, with our own deadline, instead of letting NCCL
// block inside a call that a dead peer never lets return. On an error or a
// timeout the communicator is aborted (ncclCommAbort also stops kernels stuck on
// a dead peer), and every later use throws.
//
// Errors: TransportError (NCCL failed), PeerFailure (ncclRemoteError: a peer
// exited or the network broke), TimeoutError (our deadline), CudaError (a CUDA
// runtime call). Messages say which NCCL call, what for, and NCCL's own words.
//
// libnccl is not linked: every NCCL call goes through nccl_api() (nccl_loader.h),
// which opens it at the first use, so CPU-only processes never load it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <span>
#include <string>

#include "env.h"

namespace gradcomm::detail {

// "ncclInvalidUsage (invalid usage) in `ncclSend(...)` at file:line: <ncclGetLastError>".
std::string nccl_error_message(ncclResult_t result, const char* expression, const char* file, int line);
// Throws the typed error for `result` (PeerFailure for ncclRemoteError, else TransportError).
[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* expression, const char* file, int line);

// A fresh id for ncclCommInitRank* (rank 0 draws it; the others receive its bytes).
ncclUniqueId nccl_unique_id();

// One point-to-point operation of a group. Sizes are bytes (sent as ncclUint8,
// so every dtype travels the same way); zero-byte operations are skipped.
struct P2pOp {
  enum Kind : uint8_t { kSend, kRecv };
  Kind kind;
  int peer;
  void* data;
  size_t bytes;
};

class NcclComm {
 public:
  // Runs between polls of every wait; throws to end the wait early (the
  // communicator watches the host transport's abort channel with it, so a rank
  // whose init failed does not leave the others waiting out their deadline).
  using Watchdog = std::function<void()>;

  // Collective: every rank of the job calls it with the same id. Makes `device`
  // current during the call. Throws (after aborting what was built) when init
  // fails or has not completed within `timeout`; `timeout` also bounds every
  // later group launch.
  NcclComm(const ncclUniqueId& id, int rank, int size, int device, std::chrono::milliseconds timeout,
           Watchdog watchdog = {});
  // Finalizes within a short grace period, else aborts: never hangs.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  bool aborted() const noexcept { return aborted_; }

  // Enqueues `ops` as one NCCL group on `stream` and returns once NCCL has taken
  // the group (in nonblocking mode ncclGroupEnd may hand that back as
  // ncclInProgress; we poll until it settles). Never waits for the GPU work.
  void group(std::span<const P2pOp> ops, cudaStream_t stream, const char* what);

  // Runs one NCCL call that enqueues work on this communicator (ncclAllReduce,
  // ...): `call(get())`, then, when NCCL answers ncclInProgress, polls until it
  // has taken the work. Errors abort the communicator and throw.
  void launch(const std::function<ncclResult_t(ncclComm_t)>& call, const char* what);

  // Raises the communicator's asynchronous error, if any, now (nonblocking).
  void check_async(const char* what);

  // Waits until `event` has completed (recorded after NCCL work), polling NCCL's
  // asynchronous error between queries. On timeout aborts the communicator and
  // throws TimeoutError.
  void wait(cudaEvent_t event, const Deadline& deadline, const char* what);

  // ncclCommAbort (once); the communicator is unusable afterwards.
  void abort() noexcept;

 private:
  void run_watchdog();
  // Polls ncclCommGetAsyncError while it says ncclInProgress; throws (after
  // aborting) on an error or when `deadline` passes.
  void settle(const Deadline& deadline, const char* what);
  [[noreturn]] void fail(ncclResult_t result, const char* what);
  void check_usable(const char* what) const;

  ncclComm_t comm_ = nullptr;
  int rank_, size_, device_;
  std::chrono::milliseconds timeout_;
  Watchdog watchdog_;
  bool aborted_ = false;
};

}  // namespace gradcomm::detail

// For NCCL calls outside NcclComm (the bench's baseline, unique ids): throws
// TransportError/PeerFailure with NCCL's words, the call and file:line.
#define GRADCOMM_NCCL_CHECK(expr)                                                             \
  do {                                                                                        \
    const ncclResult_t gradcomm_nccl_status_ = (expr);                                        \
    if (gradcomm_nccl_status_ != ncclSuccess && gradcomm_nccl_status_ != ncclInProgress) {    \
      ::gradcomm::detail::throw_nccl_error(gradcomm_nccl_status_, #expr, __FILE__, __LINE__); \
    }                                                                                         \
  } while (0)
