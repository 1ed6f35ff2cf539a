#include "transport/nccl/nccl_comm.h"

#include <fmt/format.h>

#include "cuda/check.h"
#include "cuda/device.h"
#include "gradcomm/errors.h"
#include "logging.h"
#include "transport/nccl/nccl_loader.h"
#include "transport/nccl/poll_wait.h"

namespace gradcomm::detail {
namespace {

// How long the destructor lets ncclCommFinalize flush before it aborts instead.
// Finalize only waits for work already enqueued; a healthy job is done in
// milliseconds, and a job with a dead peer would never be.
constexpr auto kFinalizeGrace = std::chrono::seconds(5);

double seconds(std::chrono::milliseconds d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::string nccl_error_message(ncclResult_t result, const char* expression, const char* file, int line) {
  const char* text = nccl_api().get_error_string(result);
  std::string message = fmt::format("NCCL error {} ({}) in `{}` at {}:{}", static_cast<int>(result),
                                    text ? text : "unknown", expression ? expression : "?", file ? file : "?", line);
  // NCCL's own words on the last failure of this thread (e.g. which argument was invalid).
  const char* last = nccl_api().get_last_error(nullptr);
  if (last != nullptr && *last != '\0') message += fmt::format(": {}", last);
  return message;
}

void throw_nccl_error(ncclResult_t result, const char* expression, const char* file, int line) {
  const std::string message = nccl_error_message(result, expression, file, line);
  if (result == ncclRemoteError) throw PeerFailure(message);
  throw TransportError(message);
}

ncclUniqueId nccl_unique_id() {
  ncclUniqueId id{};
  GRADCOMM_NCCL_CHECK(nccl_api().get_unique_id(&id));
  return id;
}

NcclComm::NcclComm(const ncclUniqueId& id, int rank, int size, int device, std::chrono::milliseconds timeout,
                   Watchdog watchdog)
    : rank_(rank), size_(size), device_(device), timeout_(timeout), watchdog_(std::move(watchdog)) {
  DeviceGuard guard(device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "gradcomm";
  ncclUniqueId copy = id;  // the API takes it by value but not as const
  const ncclResult_t started = nccl_api().comm_init_rank_config(&comm_, size, copy, rank, &config);
  if (started != ncclSuccess && started != ncclInProgress) {
    if (comm_ != nullptr) abort();
    throw_nccl_error(started, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  try {
    settle(Deadline::after(timeout), "communicator init");
  } catch (...) {
    abort();  // settle() aborted already on its own errors; abort() is idempotent
    throw;
  }
}

NcclComm::~NcclComm() {
  if (comm_ == nullptr) return;
  try {
    DeviceGuard guard(device_);
    if (!aborted_) {
      ncclResult_t state = nccl_api().comm_finalize(comm_);
      if (state == ncclSuccess || state == ncclInProgress) {
        state = ncclInProgress;
        poll_with_deadline(
            [&] {
              const ncclResult_t query = nccl_api().comm_get_async_error(comm_, &state);
              if (query != ncclSuccess) state = query;
              return state != ncclInProgress;
            },
            [] {}, Deadline::after(std::chrono::duration_cast<std::chrono::milliseconds>(kFinalizeGrace)), [] {});
      }
      if (state == ncclSuccess) {
        nccl_api().comm_destroy(comm_);
      } else {
        log(LogLevel::kWarn, "nccl: rank {}: finalize did not complete cleanly ({}); aborting the communicator",
            rank_, nccl_api().get_error_string(state));
        abort();
      }
    }
  } catch (...) {
    abort();  // DeviceGuard failed (the context is gone): abort needs no device call of ours
  }
}

void NcclComm::abort() noexcept {
  if (comm_ == nullptr || aborted_) return;
  aborted_ = true;
  const ncclResult_t result = nccl_api().comm_abort(comm_);
  if (result != ncclSuccess && result != ncclInProgress) {
    try {
      log(LogLevel::kWarn, "nccl: rank {}: ncclCommAbort failed: {}", rank_, nccl_api().get_error_string(result));
    } catch (...) {
    }
  }
}

void NcclComm::fail(ncclResult_t result, const char* what) {
  abort();
  const std::string message = fmt::format("nccl: rank {} of {}: {} failed: {} ({}); communicator aborted", rank_,
                                          size_, what, nccl_api().get_error_string(result), static_cast<int>(result));
  if (result == ncclRemoteError) throw PeerFailure(message);
  throw TransportError(message);
}

// The caller's watchdog (aborts arriving over UCX); anything it raises aborts the
// communicator first, so NCCL's kernels cannot outlive the error.
void NcclComm::run_watchdog() {
  if (!watchdog_) return;
  try {
    watchdog_();
  } catch (...) {
    abort();
    throw;
  }
}

void NcclComm::check_usable(const char* what) const {
  if (aborted_) {
    throw TransportError(fmt::format("nccl: rank {}: {}: the communicator was aborted after an earlier failure",
                                     rank_, what));
  }
}

void NcclComm::settle(const Deadline& deadline, const char* what) {
  ncclResult_t state = ncclInProgress;
  poll_with_deadline(
      [&] {
        const ncclResult_t query = nccl_api().comm_get_async_error(comm_, &state);
        if (query != ncclSuccess) fail(query, what);
        if (state != ncclSuccess && state != ncclInProgress) fail(state, what);
        return state == ncclSuccess;
      },
      [&] { run_watchdog(); },
      deadline,
      [&] {
        abort();
        throw TimeoutError(fmt::format("nccl: rank {} of {}: {} did not complete within {:.1f} s; communicator "
                                       "aborted",
                                       rank_, size_, what, seconds(timeout_)));
      });
}

void NcclComm::check_async(const char* what) {
  check_usable(what);
  ncclResult_t state = ncclSuccess;
  const ncclResult_t query = nccl_api().comm_get_async_error(comm_, &state);
  if (query != ncclSuccess) fail(query, what);
  if (state != ncclSuccess && state != ncclInProgress) fail(state, what);
}

void NcclComm::group(std::span<const P2pOp> ops, cudaStream_t stream, const char* what) {
  check_usable(what);
  bool any = false;
  for (const P2pOp& p : ops) any = any || p.bytes > 0;
  if (!any) return;
  // Group calls never fail on their own in nonblocking mode except for invalid
  // arguments; the launch itself is reported by ncclGroupEnd and then settle().
  ncclResult_t result = nccl_api().group_start();
  if (result != ncclSuccess) fail(result, what);
  for (const P2pOp& p : ops) {
    if (p.bytes == 0) continue;
    result = p.kind == P2pOp::kSend ? nccl_api().send(p.data, p.bytes, ncclUint8, p.peer, comm_, stream)
                                    : nccl_api().recv(p.data, p.bytes, ncclUint8, p.peer, comm_, stream);
    if (result != ncclSuccess && result != ncclInProgress) {
      (void)nccl_api().group_end();
      fail(result, what);
    }
  }
  result = nccl_api().group_end();
  if (result == ncclInProgress) {
    settle(Deadline::after(timeout_), what);
  } else if (result != ncclSuccess) {
    fail(result, what);
  }
}

void NcclComm::launch(const std::function<ncclResult_t(ncclComm_t)>& call, const char* what) {
  check_usable(what);
  const ncclResult_t result = call(comm_);
  if (result == ncclInProgress) {
    settle(Deadline::after(timeout_), what);
  } else if (result != ncclSuccess) {
    fail(result, what);
  }
}

void NcclComm::wait(cudaEvent_t event, const Deadline& deadline, const char* what) {
  check_usable(what);
  poll_with_deadline(
      [&] {
        const cudaError_t status = cudaEventQuery(event);
        if (status == cudaErrorNotReady) return false;
        if (status != cudaSuccess) {
          abort();  // the context faulted: NCCL's kernels are gone with it
          throw_cuda_error(status, what, __FILE__, __LINE__);
        }
        return true;
      },
      [&] {
        check_async(what);
        run_watchdog();
      },
      deadline,
      [&] {
        abort();
        throw TimeoutError(fmt::format("nccl: rank {} of {}: {}: GPU work did not complete within {:.1f} s (a peer "
                                       "may be stuck or dead); communicator aborted",
                                       rank_, size_, what, seconds(timeout_)));
      });
}

}  // namespace gradcomm::detail
