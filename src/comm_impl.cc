#include "comm_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "logging.h"

#if GRADCOMM_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/device.h"
#include "gpu_context.h"
#endif

namespace gradcomm::detail {

#if !GRADCOMM_WITH_CUDA
class GpuContext {};  // never created without CUDA; complete only so the unique_ptr can be destroyed
#endif

namespace {
// Polls this many times without progress before sleeping in wait_for_event().
// Small, because ranks often share cores: a spinning rank steals its peer's CPU.
constexpr int kSpinBeforeSleep = 64;
constexpr auto kMaxSleep = std::chrono::microseconds(20'000);
// After a failure, how long outstanding sends (the abort to the others among them)
// may take before the transport drops them.
constexpr auto kAbandonGrace = std::chrono::milliseconds(300);

int left_of(int rank, int size) { return (rank + size - 1) % size; }
int right_of(int rank, int size) { return (rank + 1) % size; }
}  // namespace

// ---- Op -------------------------------------------------------------------------

Op::Op(CommunicatorImpl& comm, const WireHeader& header)
    : comm_(comm),
      header_(header),
      rank_(comm.rank()),
      size_(comm.size()),
      deadline_(Deadline::after(comm.timeout())) {
  if (size_ == 1) {
    header_checked_ = true;
    return;
  }
  // Headers travel on their own tag without the sequence number, so a rank that
  // skipped a call is caught by comparison instead of waiting on unmatched tags.
  const uint64_t tag = make_tag(TagKind::kHeader, 0, 0);
  header_out_ = header_.serialize();
  header_recv_ = comm_.transport().irecv(left_of(rank_, size_), tag, header_in_.data(), header_in_.size());
  header_send_ = comm_.transport().isend(right_of(rank_, size_), tag, header_out_.data(), header_out_.size());
  auto& stats = comm_.mutable_stats();
  stats.bytes_sent += header_out_.size();
  stats.messages_sent += 1;
}

Op::~Op() = default;

RequestPtr Op::send(int peer, uint32_t unit, const void* data, size_t bytes) {
  auto& stats = comm_.mutable_stats();
  stats.bytes_sent += bytes;
  stats.messages_sent += 1;
  return comm_.transport().isend(peer, make_tag(TagKind::kData, header_.seq, unit), data, bytes);
}

RequestPtr Op::recv(int peer, uint32_t unit, void* data, size_t bytes) {
  // Counted when posted, like sends: a receive that then fails ends the communicator anyway.
  comm_.mutable_stats().bytes_received += bytes;
  return comm_.transport().irecv(peer, make_tag(TagKind::kData, header_.seq, unit), data, bytes);
}

// An abort names the call that failed on its origin rank. A call before that
// one may still complete here (every rank was in it), so only the named call, or
// a call whose own exchange fails, raises it: errors land on the call they concern.
void Op::spin_until_done(Request& request, const char* what) {
  Transport& transport = comm_.transport();
  auto& abort = comm_.pending_abort();
  int idle = 0;
  while (true) {
    const bool moved = transport.progress();
    while (auto incoming = transport.poll_abort()) {
      if (!abort) abort = std::move(*incoming);
    }
    const bool failed = !request.pending() && request.state() != RequestState::kDone;
    if (abort && (abort->seq <= header_.seq || failed)) raise_abort(*abort);
    if (!request.pending()) break;
    if (deadline_.expired()) {
      fail(ErrorCode::kTimeout,
           fmt::format("timed out after {:.1f} s waiting for rank {} ({})",
                       std::chrono::duration<double>(comm_.timeout()).count(), request.peer(), what));
    }
    if (moved) {
      idle = 0;
    } else if (++idle >= kSpinBeforeSleep) {
      transport.wait_for_event(std::min<std::chrono::microseconds>(kMaxSleep, deadline_.remaining()));
    }
  }
  switch (request.state()) {
    case RequestState::kDone:
      break;
    case RequestState::kPeerFailed:
      fail(ErrorCode::kPeerFailure,
           fmt::format("rank {} failed or disconnected ({}): {}", request.peer(), what, request.error()));
    case RequestState::kTruncated:
      fail(ErrorCode::kCorruptPayload, fmt::format("rank {} sent a longer message than this call expects ({}): {}",
                                                   request.peer(), what, request.error()));
    default:
      fail(ErrorCode::kTransport,
           fmt::format("transport error with rank {} ({}): {}", request.peer(), what, request.error()));
  }
  if (request.bytes() != request.posted_bytes()) {
    fail(ErrorCode::kCorruptPayload, fmt::format("rank {} sent {} bytes where this call expects {} ({})",
                                                 request.peer(), request.bytes(), request.posted_bytes(), what));
  }
}

// Another rank failed first: raise its error here, without re-broadcasting.
void Op::raise_abort(const ControlMessage& abort) {
  const std::string message = fmt::format("rank {}: {} aborted: rank {} reported: {}", rank_, header_.describe(),
                                          abort.origin, abort.text);
  const ErrorCode code = abort.code;
  comm_.mark_failed(code, message);
  comm_.transport().abandon_pending(kAbandonGrace);
  throw_error(code, message);
}

void Op::check_header() {
  if (header_checked_) return;
  header_checked_ = true;  // set first: failures below must not re-enter
  spin_until_done(*header_recv_, "call header");
  comm_.mutable_stats().bytes_received += header_in_.size();
  const int left = left_of(rank_, size_);
  auto theirs = WireHeader::parse(header_in_.data(), header_in_.size());
  if (!theirs) {
    fail(ErrorCode::kCorruptPayload, fmt::format("rank {} sent a malformed call header", left));
  }
  if (!theirs->agrees_with(header_)) {
    fail(ErrorCode::kMismatch, fmt::format("mismatched collective calls: rank {} called {}; rank {} called {}",
                                           rank_, header_.describe(), left, theirs->describe()));
  }
}

void Op::wait(Request& request, const char* what) {
  check_header();
  spin_until_done(request, what);
}

void Op::wait_all(std::vector<RequestPtr>& requests, const char* what) {
  for (auto& request : requests) {
    if (request) wait(*request, what);
  }
}

void Op::count_wire(uint64_t sent, uint64_t received, uint64_t messages) {
  auto& stats = comm_.mutable_stats();
  stats.bytes_sent += sent;
  stats.bytes_received += received;
  stats.messages_sent += messages;
}

void Op::finish() {
  check_header();
  if (header_send_) spin_until_done(*header_send_, "call header to the right neighbour");
}

void Op::fail(ErrorCode code, const std::string& what) {
  const std::string message = fmt::format("rank {}: {}: {}", rank_, header_.describe(), what);
  comm_.mark_failed(code, message);
  ControlMessage abort{code, rank_, header_.seq, message.substr(0, ControlMessage::kMaxText)};
  comm_.transport().send_abort(abort);
  comm_.transport().abandon_pending(kAbandonGrace);
  throw_error(code, message);
}

Op::PhaseTimer::~PhaseTimer() {
  op_.comm_.mutable_stats().*phase_ += std::chrono::duration<double>(Clock::now() - start_).count();
}

// ---- CommunicatorImpl ---------------------------------------------------------------

CommunicatorImpl::CommunicatorImpl(std::unique_ptr<Transport> transport, std::chrono::milliseconds timeout,
                                   std::unique_ptr<Store> store)
    : transport_(std::move(transport)), store_(std::move(store)), timeout_(timeout) {}

// GPU side first (its NCCL communicator finalizes on its own, and its waits may
// call into the transport); then the transport, whose teardown may still need the
// store's peers, never the reverse.
CommunicatorImpl::~CommunicatorImpl() {
  gpu_.reset();
  transport_.reset();
  store_.reset();
}

void CommunicatorImpl::mark_failed(ErrorCode code, const std::string& message) {
  if (!failure_) failure_.emplace(code, message);
#if GRADCOMM_WITH_CUDA
  // NCCL kernels of this or earlier calls may wait on a peer that will never
  // come: aborting the NCCL communicator releases them.
  gpu_abort();
#endif
}

void CommunicatorImpl::set_transport_preference(const std::string& preference) {
  if (preference != "auto" && preference != "ucx" && preference != "nccl") {
    throw InvalidArgument(fmt::format("rank {}: transport '{}' unknown; accepted: auto, ucx, nccl", rank(), preference));
  }
  transport_preference_ = preference;
}

std::string CommunicatorImpl::cuda_path() const {
#if GRADCOMM_WITH_CUDA
  if (gpu_) return gpu_->path() == GpuPath::kNccl ? "nccl" : "staging";
#endif
  return "";
}

void CommunicatorImpl::watch_for_aborts() {
  transport_->progress();
  while (auto incoming = transport_->poll_abort()) {
    if (!pending_abort_) pending_abort_ = std::move(*incoming);
  }
  if (pending_abort_) {
    throw_error(pending_abort_->code, fmt::format("rank {}: GPU work abandoned: rank {} reported: {}", rank(),
                                                  pending_abort_->origin, pending_abort_->text));
  }
}

void CommunicatorImpl::synchronize() {
#if GRADCOMM_WITH_CUDA
  if (!gpu_) return;  // no CUDA call yet: nothing in flight, nothing new to report
  check_usable();
  try {
    gpu_synchronize();
  } catch (const std::exception& e) {
    auto* error = dynamic_cast<const Error*>(&e);
    const ErrorCode code = error ? error->code() : ErrorCode::kTransport;
    const std::string message = fmt::format("rank {}: synchronize (after call #{}): {}", rank(), next_seq_ - 1,
                                            e.what());
    if (!failure_) {
      mark_failed(code, message);
      transport_->send_abort(ControlMessage{code, rank(), next_seq_ - 1, message.substr(0, ControlMessage::kMaxText)});
      transport_->abandon_pending(kAbandonGrace);
    }
    throw_error(code, message);
  }
#endif
}

void CommunicatorImpl::check_usable() const {
  if (failure_) {
    throw_error(failure_->first, fmt::format("rank {}: communicator unusable after an earlier failure: {}", rank(),
                                             failure_->second));
  }
}

void CommunicatorImpl::check_tensor(const TensorView& t, const char* op, const char* name) const {
  if (!dtype_valid(static_cast<uint8_t>(t.dtype))) {
    throw InvalidArgument(fmt::format("rank {}: {}: {} has an unknown dtype value {}", rank(), op, name,
                                      static_cast<int>(t.dtype)));
  }
  if (t.numel < 0) {
    throw InvalidArgument(fmt::format("rank {}: {}: {} has negative numel {}", rank(), op, name, t.numel));
  }
  if (t.numel > 0 && t.data == nullptr) {
    throw InvalidArgument(fmt::format("rank {}: {}: {} has numel {} but a null data pointer", rank(), op, name,
                                      t.numel));
  }
  if (t.device.type == DeviceType::kCuda) {
#if GRADCOMM_WITH_CUDA
    require_cuda_device(t.device.index, fmt::format("rank {}: {}: {} on cuda:{}", rank(), op, name,
                                                    t.device.index).c_str());
    if (t.numel > 0) {
      // NCCL and the copies would fault (or silently read the wrong memory) on a
      // pointer that is not this device's: catch a mislabelled tensor here.
      cudaPointerAttributes attributes{};
      const cudaError_t status = cudaPointerGetAttributes(&attributes, t.data);
      if (status != cudaSuccess) (void)cudaGetLastError();
      const bool device_memory = status == cudaSuccess && (attributes.type == cudaMemoryTypeDevice ||
                                                           attributes.type == cudaMemoryTypeManaged);
      if (!device_memory) {
        throw InvalidArgument(fmt::format("rank {}: {}: {} is labelled cuda:{} but {:p} is not CUDA device memory "
                                          "(host memory? pass Device{{DeviceType::kCpu}})",
                                          rank(), op, name, t.device.index, t.data));
      }
      if (attributes.type == cudaMemoryTypeDevice && attributes.device != t.device.index) {
        throw InvalidArgument(fmt::format("rank {}: {}: {} is labelled cuda:{} but its memory is on cuda:{}", rank(),
                                          op, name, t.device.index, attributes.device));
      }
    }
#else
    throw Unsupported(fmt::format("rank {}: {}: {} is a CUDA tensor, but this gradcomm was built without CUDA "
                                  "(configure with GRADCOMM_CUDA=ON)",
                                  rank(), op, name));
#endif
  } else if (t.device.type != DeviceType::kCpu) {
    throw InvalidArgument(fmt::format("rank {}: {}: {} has an unknown device type {}", rank(), op, name,
                                      static_cast<int>(t.device.type)));
  }
}

template <class Body>
void CommunicatorImpl::run(WireHeader header, Body&& body, bool numbered) {
  check_usable();
  header.seq = numbered ? next_seq_++ : 0;
  const auto start = Clock::now();
  {
    Op op(*this, header);
    try {
      body(op);
      op.finish();
    } catch (const std::exception& e) {
      // Whatever escaped mid-call leaves peers waiting on this rank: record it and
      // tell them (Op::fail already did both for the errors it raised).
      if (!failure_) {
        const ErrorCode code = [&] {
          auto* error = dynamic_cast<const Error*>(&e);
          return error ? error->code() : ErrorCode::kTransport;
        }();
        const std::string message = fmt::format("rank {}: {}: {}", rank(), header.describe(), e.what());
        mark_failed(code, message);
        transport_->send_abort(ControlMessage{code, rank(), header.seq, message.substr(0, ControlMessage::kMaxText)});
        transport_->abandon_pending(kAbandonGrace);
      }
      throw;
    }
  }
  stats_.ops += 1;
  stats_.total_s += std::chrono::duration<double>(Clock::now() - start).count();
}

void CommunicatorImpl::allreduce(TensorView t, ReduceOp reduce_op, const CompressOptions& options) {
  check_usable();
  check_tensor(t, "allreduce", "tensor");
  if (static_cast<uint8_t>(reduce_op) > static_cast<uint8_t>(ReduceOp::kMax)) {
    throw InvalidArgument(fmt::format("rank {}: allreduce: unknown reduce op value {}", rank(),
                                      static_cast<int>(reduce_op)));
  }
  const std::string text = options.compressor.empty() ? std::string("none") : options.compressor;
  const CompressorSpec* spec = nullptr;
  try {
    spec = &compression_.spec(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("rank {}: allreduce: {}", rank(), e.what()));
  }
  WireHeader header;
  header.op = OpKind::kAllreduce;
  header.dtype = t.dtype;
  header.reduce_op = reduce_op;
  header.numel = t.numel;
  header.compressor = spec->id == CompressorId::kNone ? "none" : spec->canonical();
  header.compressor_hash = fnv1a32(header.compressor);
  const bool cuda = t.device.type == DeviceType::kCuda;
  if (spec->id == CompressorId::kNone) {
#if GRADCOMM_WITH_CUDA
    if (cuda) {
      gpu_setup(t.device.index, "allreduce");
      run(header, [&](Op& op) { gpu_allreduce(op, t, reduce_op, options.stream, nullptr); });
      return;
    }
#endif
    run(header, [&](Op& op) { dense_allreduce(op, t.data, t.numel, t.dtype, reduce_op); });
    return;
  }

  // Compressed: float32 gradients, summed or averaged, state under the caller's key.
  if (t.dtype != DType::kFloat32) {
    throw InvalidArgument(fmt::format("rank {}: allreduce: compressor '{}' takes float32 tensors, got {}", rank(),
                                      text, dtype_name(t.dtype)));
  }
  if (reduce_op != ReduceOp::kSum && reduce_op != ReduceOp::kAvg) {
    throw InvalidArgument(fmt::format("rank {}: allreduce: compressor '{}' supports sum and avg, not {}", rank(), text,
                                      reduce_op_name(reduce_op)));
  }
  if (options.key.empty() && CompressionEngine::stateful(*spec)) {
    throw InvalidArgument(fmt::format(
        "rank {}: allreduce: compressor '{}' keeps per-tensor state (error feedback, step counter or random "
        "draws): set CompressOptions::key to a name unique to this tensor",
        rank(), text));
  }
  KeyState* key = nullptr;
  if (!options.key.empty()) {
    key = &state_.keys[options.key];
    if (key->numel != 0 && (key->numel != t.numel || key->dtype != t.dtype)) {
      throw InvalidArgument(fmt::format("rank {}: allreduce: key '{}' holds state for {} {} elements, called with {}",
                                        rank(), options.key, key->numel, dtype_name(key->dtype), t.numel));
    }
    key->numel = t.numel;
    key->dtype = t.dtype;
    header.step = key->step;
  }
  const uint64_t key_hash = fnv1a64(std::span(reinterpret_cast<const uint8_t*>(options.key.data()), options.key.size()));
#if GRADCOMM_WITH_CUDA
  if (cuda) {
    gpu_setup(t.device.index, "allreduce");
    run(header, [&](Op& op) {
      const std::function<void(float*)> engine = [&](float* host) {
        compression_.allreduce(op, host, t.numel, reduce_op, *spec, key, key_hash);
      };
      const GpuCompressed compressed{spec, key, key_hash, &engine};
      gpu_allreduce(op, t, reduce_op, options.stream, t.numel > 0 ? &compressed : nullptr);
    });
    if (key != nullptr) key->step += 1;
    return;
  }
#endif
  (void)cuda;
  run(header, [&](Op& op) {
    if (t.numel > 0) compression_.allreduce(op, static_cast<float*>(t.data), t.numel, reduce_op, *spec, key, key_hash);
  });
  if (key != nullptr) key->step += 1;
}

void CommunicatorImpl::allgather(TensorView in, TensorView out) {
  check_usable();
  check_tensor(in, "allgather", "input");
  check_tensor(out, "allgather", "output");
  if (in.dtype != out.dtype) {
    throw InvalidArgument(fmt::format("rank {}: allgather: input is {} but output is {}", rank(),
                                      dtype_name(in.dtype), dtype_name(out.dtype)));
  }
  if (out.numel != static_cast<int64_t>(size()) * in.numel) {
    throw InvalidArgument(fmt::format("rank {}: allgather: output has {} elements, expected size() * input = {} * {}",
                                      rank(), out.numel, size(), in.numel));
  }
  if (in.device.type != out.device.type || (in.device.type == DeviceType::kCuda && in.device.index != out.device.index)) {
    throw InvalidArgument(fmt::format("rank {}: allgather: input and output must be on one device (input {}:{}, "
                                      "output {}:{})",
                                      rank(), in.device.type == DeviceType::kCuda ? "cuda" : "cpu", in.device.index,
                                      out.device.type == DeviceType::kCuda ? "cuda" : "cpu", out.device.index));
  }
  WireHeader header;
  header.op = OpKind::kAllgather;
  header.dtype = in.dtype;
  header.numel = in.numel;
#if GRADCOMM_WITH_CUDA
  if (in.device.type == DeviceType::kCuda) {
    gpu_setup(in.device.index, "allgather");
    run(header, [&](Op& op) { gpu_allgather(op, in, out); });
    return;
  }
#endif
  run(header, [&](Op& op) {
    const size_t elem = dtype_size(in.dtype);
    auto* base = static_cast<uint8_t*>(out.data);
    uint8_t* mine = base + static_cast<size_t>(rank()) * in.numel * elem;
    if (in.numel > 0 && mine != in.data) std::memmove(mine, in.data, in.numel * elem);
    if (size() > 1 && in.numel > 0) {
      ring_allgatherv(op, base, std::vector<int64_t>(size(), in.numel), elem, /*unit_base=*/0);
    }
  });
}

std::vector<int64_t> CommunicatorImpl::allgatherv(const void* in, int64_t count, DType dtype,
                                                  std::vector<uint8_t>& out) {
  check_usable();
  if (count < 0 || (count > 0 && in == nullptr)) {
    throw InvalidArgument(fmt::format("rank {}: allgatherv: bad input (count {}, data {})", rank(), count, in));
  }
  WireHeader header;
  header.op = OpKind::kAllgatherv;
  header.dtype = dtype;
  header.numel = -1;  // counts differ by rank by design
  const size_t elem = dtype_size(dtype);
  std::vector<int64_t> counts;
  run(header, [&](Op& op) {
    std::vector<int64_t> sizes;
    out = ring_allgatherv_bytes(op, std::span(static_cast<const uint8_t*>(in), static_cast<size_t>(count) * elem), sizes);
    for (int r = 0; r < size(); ++r) {
      if (sizes[r] % static_cast<int64_t>(elem) != 0) {
        op.fail(ErrorCode::kCorruptPayload,
                fmt::format("rank {} sent {} bytes, not a whole number of {} elements", r, sizes[r], dtype_name(dtype)));
      }
      counts.push_back(sizes[r] / static_cast<int64_t>(elem));
    }
  });
  return counts;
}

void CommunicatorImpl::broadcast(TensorView t, int root) {
  check_usable();
  check_tensor(t, "broadcast", "tensor");
  if (root < 0 || root >= size()) {
    throw InvalidArgument(fmt::format("rank {}: broadcast: root {} out of range [0, {})", rank(), root, size()));
  }
  WireHeader header;
  header.op = OpKind::kBroadcast;
  header.dtype = t.dtype;
  header.numel = t.numel;
  header.root = root;
#if GRADCOMM_WITH_CUDA
  if (t.device.type == DeviceType::kCuda) {
    gpu_setup(t.device.index, "broadcast");
    run(header, [&](Op& op) { gpu_broadcast(op, t, root); });
    return;
  }
#endif
  run(header, [&](Op& op) {
    if (size() > 1 && t.numel > 0) chain_broadcast(op, t.data, t.nbytes(), root);
  });
}

void CommunicatorImpl::barrier() {
  WireHeader header;
  header.op = OpKind::kBarrier;
  run(header, [&](Op& op) {
    if (size() > 1) dissemination_barrier(op);
  });
}

#if GRADCOMM_WITH_CUDA
void CommunicatorImpl::gpu_setup(int device, const char* op_name) {
  if (gpu_) {
    if (device != gpu_->device()) {
      throw InvalidArgument(fmt::format("rank {}: {}: tensor on cuda:{}, but this communicator is bound to cuda:{} "
                                        "(its first CUDA tensor's device); use one device per communicator",
                                        rank(), op_name, device, gpu_->device()));
    }
    return;
  }
  // A numbered call of its own, so a rank whose first CUDA call differs is caught
  // by the header check ("allgatherv(..., cuda-setup) #k" against its call).
  WireHeader header;
  header.op = OpKind::kAllgatherv;
  header.dtype = DType::kUInt8;
  header.numel = static_cast<int64_t>(GpuRankRecord::kBytes);
  header.compressor = "cuda-setup";
  header.compressor_hash = fnv1a32(header.compressor);
  run(header, [&](Op& op) {
    gpu_ = create_gpu_context(op, device, transport_preference_, timeout_, [this] { watch_for_aborts(); });
  });
  stats_.ops -= 1;  // internal: Stats::ops counts the user's collectives
}
#endif

void CommunicatorImpl::connect_barrier() {
  WireHeader header;
  header.op = OpKind::kBarrier;
  run(
      header, [&](Op& op) {
        if (size() > 1) dissemination_barrier(op);
      },
      /*numbered=*/false);
  stats_ = Stats{};  // user-visible counters start after creation
}

}  // namespace gradcomm::detail
