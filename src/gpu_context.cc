#include "gpu_context.h"

#include <fmt/format.h>

#include <cstring>

#include "collectives/collectives.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "logging.h"
#include "transport/nccl/poll_wait.h"

namespace gradcomm::detail {

GpuContext::GpuContext(int device, GpuPathChoice choice, std::unique_ptr<NcclComm> nccl,
                       std::chrono::milliseconds timeout, NcclComm::Watchdog watchdog)
    : device_(device),
      choice_(std::move(choice)),
      nccl_(std::move(nccl)),
      timeout_(timeout),
      watchdog_(std::move(watchdog)) {}

// The NCCL communicator goes first: it finalizes, or aborts, which releases
// kernels stuck on a dead peer; freeing memory synchronizes the device and would
// wait for such kernels forever. Then streams and buffers, on the context's device.
GpuContext::~GpuContext() {
  try {
    DeviceGuard guard(device_);
    nccl_.reset();
    events_.clear();
    pending_checks_.clear();
    keyless_.reset();
    payloads_.reset();
    status_words_.reset();
    status_slots_.reset();
    scratch_.reset();
    pinned_.reset();
  } catch (...) {
    // Without the device there is nothing we can release more carefully.
  }
}

void GpuContext::begin(cudaStream_t stream, const char* what) {
  if (nccl_) nccl_->check_async(what);
  check_payloads(/*wait=*/false, what);
  if (any_call_) last_done_.wait_on(stream);
}

void GpuContext::end(cudaStream_t stream) {
  last_done_.record(stream);
  any_call_ = true;
}

void GpuContext::wait_event(cudaEvent_t event, const Deadline& deadline, const char* what) {
  if (nccl_) {
    nccl_->wait(event, deadline, what);
    return;
  }
  poll_with_deadline(
      [&] {
        const cudaError_t status = cudaEventQuery(event);
        if (status == cudaErrorNotReady) return false;
        if (status != cudaSuccess) throw_cuda_error(status, what, __FILE__, __LINE__);
        return true;
      },
      [&] {
        if (watchdog_) watchdog_();
      },
      deadline,
      [&] {
        throw TimeoutError(fmt::format("{}: GPU work did not complete within {:.1f} s", what,
                                       std::chrono::duration<double>(timeout_).count()));
      });
}

void GpuContext::synchronize(const char* what) {
  DeviceGuard guard(device_);
  if (nccl_) nccl_->check_async(what);
  if (!any_call_) return;
  wait_event(last_done_.get(), Deadline::after(timeout_), what);
  check_payloads(/*wait=*/true, what);
}

void GpuContext::abort() noexcept {
  if (nccl_) nccl_->abort();
}

DeviceBuffer& GpuContext::scratch(size_t bytes) {
  scratch_.reserve(bytes);
  return scratch_;
}

PinnedBuffer& GpuContext::pinned(size_t bytes) {
  pinned_.reserve(bytes);
  return pinned_;
}

DeviceBuffer& GpuContext::payload_scratch(size_t bytes) {
  payloads_.reserve(bytes);
  return payloads_;
}

DeviceStatus* GpuContext::payload_status(int peers, cudaStream_t stream) {
  if (peers != status_peers_) {
    // Sized once (the world size does not change); a resize would free the words a
    // pending check still reads, so settle those first.
    check_payloads(/*wait=*/true, "payload check");
    status_words_ = DeviceBuffer(sizeof(DeviceStatus) * static_cast<size_t>(peers));
    status_slots_ = PinnedBuffer(sizeof(DeviceStatus) * static_cast<size_t>(peers) * kPendingChecks);
    status_peers_ = peers;
  }
  if (pending_checks_.size() >= kPendingChecks) {
    wait_event(pending_checks_.front().copied.get(), Deadline::after(timeout_), "payload check");
    check_payloads(/*wait=*/false, "payload check");
  }
  GRADCOMM_CUDA_CHECK(cudaMemsetAsync(status_words_.data(), 0, status_words_.size(), stream));
  return status_words_.as<DeviceStatus>();
}

void GpuContext::queue_payload_check(cudaStream_t stream, std::string context) {
  const size_t words = static_cast<size_t>(status_peers_);
  const size_t slot = next_slot_++ % kPendingChecks;
  GRADCOMM_CUDA_CHECK(cudaMemcpyAsync(status_slots_.as<DeviceStatus>() + slot * words, status_words_.data(),
                                      words * sizeof(DeviceStatus), cudaMemcpyDeviceToHost, stream));
  if (spare_check_events_.empty()) spare_check_events_.emplace_back();
  Event event = std::move(spare_check_events_.back());
  spare_check_events_.pop_back();
  event.record(stream);
  pending_checks_.push_back(PendingCheck{std::move(context), slot, std::move(event)});
}

void GpuContext::check_payloads(bool wait, const char* what) {
  const size_t words = static_cast<size_t>(status_peers_);
  while (!pending_checks_.empty()) {
    PendingCheck& check = pending_checks_.front();
    if (wait) {
      wait_event(check.copied.get(), Deadline::after(timeout_), what);
    } else if (!check.copied.ready()) {
      return;  // in order on the device: later calls are not done either (or not checked yet)
    }
    const DeviceStatus* record = status_slots_.as<DeviceStatus>() + check.slot * words;
    std::string context = std::move(check.context);
    spare_check_events_.push_back(std::move(check.copied));
    pending_checks_.pop_front();
    for (size_t peer = 0; peer < words; ++peer) {
      const DeviceStatus& s = record[peer];
      if (s.fault == 0) continue;
      // Later calls decoded on top of a corrupt result: drop their checks too, the
      // communicator is failed by this error.
      pending_checks_.clear();
      throw CorruptPayload(fmt::format("{}: payload from rank {}: {} (found {}, expected/position {})", context, peer,
                                       payload_fault_name(static_cast<PayloadFault>(s.fault)), s.a, s.b));
    }
  }
}

std::vector<Event>& GpuContext::events(size_t n) {
  while (events_.size() < n) events_.emplace_back();
  return events_;
}

std::unique_ptr<GpuContext> create_gpu_context(Op& op, int device, const std::string& preference,
                                               std::chrono::milliseconds timeout, NcclComm::Watchdog watchdog) {
  DeviceGuard guard(device);
  GpuRankRecord mine;
  cudaDeviceProp prop{};
  GRADCOMM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::memcpy(mine.uuid.data(), prop.uuid.bytes, mine.uuid.size());
  mine.device = device;
  // Rank 0 draws the id before anyone knows whether NCCL will be used: one
  // exchange instead of two. The id is only a bootstrap address (nothing is
  // listening for it unless a communicator is created with it).
  if (op.rank() == 0 && preference != "ucx") {
    const ncclUniqueId id = nccl_unique_id();
    static_assert(sizeof(id.internal) == GpuRankRecord::kUniqueIdBytes);
    std::memcpy(mine.unique_id.data(), id.internal, sizeof(id.internal));
  }

  // Over the host transport, not the store: the store is only promised during
  // Communicator::create (rank 0 may be the only one still serving it, and an
  // external store such as torch's is the caller's), and this is the first moment
  // the device is known.
  const size_t rec = GpuRankRecord::kBytes;
  std::vector<uint8_t> all(rec * op.size());
  const auto bytes = mine.serialize();
  std::memcpy(all.data() + rec * op.rank(), bytes.data(), rec);
  if (op.size() > 1) ring_allgatherv(op, all.data(), std::vector<int64_t>(op.size(), 1), rec, /*unit_base=*/0);
  std::vector<GpuRankRecord> records;
  for (int r = 0; r < op.size(); ++r) records.push_back(GpuRankRecord::parse(std::span(all.data() + rec * r, rec)));

  GpuPathChoice choice;
  try {
    choice = choose_gpu_path(preference, records);
  } catch (const Error& e) {
    op.fail(e.code(), e.what());  // the same verdict on every rank, raised on every rank
  }
  log(LogLevel::kInfo, "rank {}/{}: cuda:{}: {}", op.rank(), op.size(), device, choice.reason);

  std::unique_ptr<NcclComm> nccl;
  if (choice.path == GpuPath::kNccl) {
    ncclUniqueId id{};
    std::memcpy(id.internal, records[0].unique_id.data(), sizeof(id.internal));
    nccl = std::make_unique<NcclComm>(id, op.rank(), op.size(), device, timeout, watchdog);
  }
  return std::make_unique<GpuContext>(device, std::move(choice), std::move(nccl), timeout, std::move(watchdog));
}

}  // namespace gradcomm::detail
