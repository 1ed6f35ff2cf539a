#include "comm_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "compressors/family.h"
#include "device_path.h"
#include "engine.h"
#include "fusion.h"
#include "gpu_plan.h"
#include "logging.h"
#include "shape.h"

namespace gradcomm::detail {

CommunicatorImpl::CommunicatorImpl(std::unique_ptr<Transport> transport, std::chrono::milliseconds timeout,
                                   std::unique_ptr<Store> store)
    : rank_(transport->rank()),
      size_(transport->size()),
      transport_(std::move(transport)),
      store_(std::move(store)),
      timeout_(timeout) {
  // Last: from here on the engine thread alone drives the transport.
  engine_ = std::make_unique<Engine>(*this, FusionConfig::from_env());
}

// The engine first (it fails outstanding work and stops touching everything
// else); then the GPU side (its NCCL communicator finalizes on its own); then the
// transport, whose teardown may still need the store's peers, never the reverse.
CommunicatorImpl::~CommunicatorImpl() {
  engine_->stop();
  engine_.reset();
  device_.reset();
  transport_.reset();
  store_.reset();
}

Stats CommunicatorImpl::stats() const {
  Stats s;
  {
    std::lock_guard lock(stats_mutex_);
    s = published_stats_;
  }
  if (engine_) s.engine_cpu_s = engine_->cpu_seconds();
  return s;
}

void CommunicatorImpl::publish_stats() {
  std::lock_guard lock(stats_mutex_);
  published_stats_ = stats_;
}

bool CommunicatorImpl::stopping() const { return engine_ && engine_->stopping(); }

void CommunicatorImpl::mark_failed(ErrorCode code, const std::string& message) {
  {
    std::lock_guard lock(failure_mutex_);
    if (!failure_) failure_.emplace(code, message);
  }
  // NCCL kernels of this or earlier calls may wait on a peer that will never
  // come: aborting the NCCL communicator releases them.
  if (device_) device_->abort();
}

bool CommunicatorImpl::fail_and_tell(ErrorCode code, const std::string& message, uint64_t seq) {
  {
    std::lock_guard lock(failure_mutex_);
    if (failure_) return false;
  }
  mark_failed(code, message);
  transport_->send_abort(ControlMessage{code, rank_, seq, message.substr(0, ControlMessage::kMaxText)});
  transport_->abandon_pending(kAbandonGrace);
  return true;
}

std::optional<std::string> CommunicatorImpl::refusal() const {
  if (!engine_) return std::nullopt;
  return engine_->refusal();
}

void CommunicatorImpl::tell_peers_destroyed(uint64_t seq) {
  {
    std::lock_guard lock(failure_mutex_);
    if (told_peers_destroyed_) return;
    told_peers_destroyed_ = true;
  }
  const std::string text = fmt::format("rank {} destroyed its communicator with call #{} outstanding", rank_, seq);
  transport_->send_abort(ControlMessage{ErrorCode::kPeerFailure, rank_, seq, text});
  transport_->abandon_pending(kAbandonGrace);
}

void CommunicatorImpl::set_transport_preference(const std::string& preference) {
  if (preference != "auto" && preference != "ucx" && preference != "nccl") {
    throw InvalidArgument(fmt::format("rank {}: transport '{}' unknown; accepted: auto, ucx, nccl", rank(), preference));
  }
  transport_preference_ = preference;
}

std::string CommunicatorImpl::cuda_path() const {
  return device_ ? device_->name() : "";
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
  if (stopping()) {
    throw InvalidArgument(fmt::format("rank {}: GPU work abandoned: the communicator was destroyed with a call "
                                      "outstanding",
                                      rank()));
  }
}

bool CommunicatorImpl::usable() const {
  std::lock_guard lock(failure_mutex_);
  return !failure_;
}

void CommunicatorImpl::check_usable() const {
  std::lock_guard lock(failure_mutex_);
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
    check_device_tensor(t, fmt::format("rank {}: {}: {}", rank(), op, name));
  } else if (t.device.type != DeviceType::kCpu) {
    throw InvalidArgument(fmt::format("rank {}: {}: {} has an unknown device type {}", rank(), op, name,
                                      static_cast<int>(t.device.type)));
  }
}

void CommunicatorImpl::check_one_device(const TensorView& in, const TensorView& out, const char* op) const {
  if (in.device.type != out.device.type || (in.device.type == DeviceType::kCuda && in.device.index != out.device.index)) {
    throw InvalidArgument(fmt::format("rank {}: {}: input and output must be on one device (input {}:{}, "
                                      "output {}:{})",
                                      rank(), op, in.device.type == DeviceType::kCuda ? "cuda" : "cpu", in.device.index,
                                      out.device.type == DeviceType::kCuda ? "cuda" : "cpu", out.device.index));
  }
}

// ---- issuing side --------------------------------------------------------------------

std::shared_ptr<WorkState> CommunicatorImpl::submit(Call call, const char* op) {
  if (call.tensor.device.type == DeviceType::kCuda) {
    std::lock_guard lock(issue_mutex_);
    check_cuda_device(call.tensor.device.index, op);
  }
  return engine_->submit(std::move(call));
}

void CommunicatorImpl::run_local(std::function<void()> fn) {
  Call call;
  call.kind = Call::Kind::kLocal;
  call.local = std::move(fn);
  std::shared_ptr<WorkState> work = submit(std::move(call), "local");
  work->ask_to_start();
  std::unique_lock lock(work->mutex);
  work->cv.wait(lock, [&] { return work->done; });
  if (work->error) std::rethrow_exception(work->error);
}

// The compressor of an allreduce or reduce_scatter (`what`) of call.tensor: parsed once,
// checked against the tensor and the op, and its key's state bound to the call. Caller
// holds issue_mutex_.
void CommunicatorImpl::resolve_compression(Call& call, const CompressOptions& options, const char* what) {
  const TensorView& t = call.tensor;
  const ReduceOp reduce_op = call.reduce_op;
  const std::string text = options.compressor.empty() ? std::string("none") : options.compressor;
  call.key_name = options.key;
  call.key_hash = fnv1a64(std::span(reinterpret_cast<const uint8_t*>(options.key.data()), options.key.size()));
  try {
    call.spec = &compression_.spec(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("rank {}: {}: {}", rank(), what, e.what()));
  }
  const CompressorSpec& spec = *call.spec;
  if (spec.id != CompressorId::kNone) {
    // Compressed: float32 gradients, summed or averaged, state under the caller's key.
    if (t.dtype != DType::kFloat32) {
      throw InvalidArgument(fmt::format("rank {}: {}: compressor '{}' takes float32 tensors, got {}", rank(),
                                        what, text, dtype_name(t.dtype)));
    }
    if (reduce_op != ReduceOp::kSum && reduce_op != ReduceOp::kAvg) {
      throw InvalidArgument(fmt::format("rank {}: {}: compressor '{}' supports sum and avg, not {}", rank(),
                                        what, text, reduce_op_name(reduce_op)));
    }
    if (spec.algo == SparseAlgo::kReduceScatter && t.device.type == DeviceType::kCuda) {
      throw InvalidArgument(fmt::format("rank {}: {}: compressor '{}': algo=reduce_scatter is not available "
                                        "for CUDA tensors (the NCCL path runs the sparse allgather); use "
                                        "algo=allgather or auto",
                                        rank(), what, text));
    }
    if (options.key.empty() && CompressionEngine::stateful(spec)) {
      throw InvalidArgument(fmt::format(
          "rank {}: {}: compressor '{}' keeps per-tensor state (error feedback, step counter or random "
          "draws): name this tensor uniquely (Python: {}(..., name=\"...\"); C++: CompressOptions::key)",
          rank(), what, text, what));
    }
    if (!options.key.empty()) {
      KeyState& key = state_.keys[options.key];  // map nodes never move: the engine may hold &key
      if (key.numel != 0 && (key.numel != t.numel || key.dtype != t.dtype)) {
        throw InvalidArgument(fmt::format("rank {}: {}: key '{}' holds state for {} {} elements, called with {}",
                                          rank(), what, options.key, key.numel, dtype_name(key.dtype), t.numel));
      }
      if (family_of(spec.id).reads_shapes) {  // e.g. a factor sized by the shapes
        call.parts_digest = parts_digest(call.parts);  // only such a family reads the shapes
        if (key.parts_digest != 0 && key.parts_digest != call.parts_digest) {
          throw InvalidArgument(fmt::format("rank {}: {}: key '{}' was used with other shapes before (now "
                                            "{}); a key's shapes must not change",
                                            rank(), what, options.key, describe_parts(call.parts)));
        }
        key.parts_digest = call.parts_digest;
      }
      key.numel = t.numel;
      key.dtype = t.dtype;
      call.key = &key;
    }
  }
}

std::shared_ptr<WorkState> CommunicatorImpl::allreduce_async(TensorView t, ReduceOp reduce_op,
                                                             const CompressOptions& options) {
  check_usable();
  check_tensor(t, "allreduce", "tensor");
  if (static_cast<uint8_t>(reduce_op) > static_cast<uint8_t>(ReduceOp::kMax)) {
    throw InvalidArgument(fmt::format("rank {}: allreduce: unknown reduce op value {}", rank(),
                                      static_cast<int>(reduce_op)));
  }
  Call call;
  call.kind = Call::Kind::kAllreduce;
  call.tensor = t;
  call.reduce_op = reduce_op;
  call.stream = options.stream;
  try {
    call.parts = tensor_parts(options.shape, options.parts, t.numel);  // checked whatever the compressor
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("rank {}: allreduce: {}", rank(), e.what()));
  }
  {
    std::lock_guard lock(issue_mutex_);
    resolve_compression(call, options, "allreduce");
  }
  return submit(std::move(call), "allreduce");
}

std::shared_ptr<WorkState> CommunicatorImpl::allgather_async(TensorView in, TensorView out) {
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
  check_one_device(in, out, "allgather");
  Call call;
  call.kind = Call::Kind::kAllgather;
  call.tensor = in;
  call.out = out;
  return submit(std::move(call), "allgather");
}

std::shared_ptr<WorkState> CommunicatorImpl::reduce_scatter_async(TensorView in, TensorView out, ReduceOp reduce_op,
                                                                  const CompressOptions& options) {
  check_usable();
  check_tensor(in, "reduce_scatter", "input");
  check_tensor(out, "reduce_scatter", "output");
  if (static_cast<uint8_t>(reduce_op) > static_cast<uint8_t>(ReduceOp::kMax)) {
    throw InvalidArgument(fmt::format("rank {}: reduce_scatter: unknown reduce op value {}", rank(),
                                      static_cast<int>(reduce_op)));
  }
  if (in.dtype != out.dtype) {
    throw InvalidArgument(fmt::format("rank {}: reduce_scatter: input is {} but output is {}", rank(),
                                      dtype_name(in.dtype), dtype_name(out.dtype)));
  }
  if (in.numel != static_cast<int64_t>(size()) * out.numel) {
    throw InvalidArgument(fmt::format("rank {}: reduce_scatter: input has {} elements, expected size() * output = "
                                      "{} * {}",
                                      rank(), in.numel, size(), out.numel));
  }
  check_one_device(in, out, "reduce_scatter");
  // The output is a buffer of its own or exactly this rank's segment of the input (the
  // in-place form NCCL allows); any other overlap would be read after it is written.
  if (out.numel > 0) {
    const size_t bytes = out.nbytes();
    const auto* in_begin = static_cast<const uint8_t*>(in.data);
    const auto* out_begin = static_cast<const uint8_t*>(out.data);
    const bool overlap = out_begin < in_begin + bytes * static_cast<size_t>(size()) && in_begin < out_begin + bytes;
    if (overlap && out_begin != in_begin + bytes * static_cast<size_t>(rank())) {
      throw InvalidArgument(fmt::format("rank {}: reduce_scatter: the output overlaps the input other than as this "
                                        "rank's segment of it (input + {} elements)",
                                        rank(), static_cast<int64_t>(rank()) * out.numel));
    }
  }
  Call call;
  call.kind = Call::Kind::kReduceScatter;
  call.tensor = in;
  call.out = out;
  call.reduce_op = reduce_op;
  {
    std::lock_guard lock(issue_mutex_);
    // Checked before resolve_compression binds a key: a refused call leaves no state.
    const std::string text = options.compressor.empty() ? std::string("none") : options.compressor;
    const CompressorSpec* spec = nullptr;
    try {
      spec = &compression_.spec(text);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("rank {}: reduce_scatter: {}", rank(), e.what()));
    }
    const Collective collective = family_of(spec->id).collective;
    if (collective != Collective::kDense && collective != Collective::kCodecRing) {
      throw InvalidArgument(fmt::format("rank {}: reduce_scatter: compressor '{}' is not available for "
                                        "reduce_scatter, which compresses with the codecs of the compressed ring "
                                        "({}); allreduce takes '{}'",
                                        rank(), text, family_names(Collective::kCodecRing), text));
    }
    if (collective == Collective::kCodecRing && in.device.type == DeviceType::kCuda) {
      throw Unsupported(fmt::format("rank {}: reduce_scatter: compressor '{}' on CUDA tensors is not available "
                                    "(the dense reduce_scatter and the compressed allreduce are)",
                                    rank(), text));
    }
    resolve_compression(call, options, "reduce_scatter");
  }
  return submit(std::move(call), "reduce_scatter");
}

std::shared_ptr<WorkState> CommunicatorImpl::broadcast_async(TensorView t, int root) {
  check_usable();
  check_tensor(t, "broadcast", "tensor");
  if (root < 0 || root >= size()) {
    throw InvalidArgument(fmt::format("rank {}: broadcast: root {} out of range [0, {})", rank(), root, size()));
  }
  Call call;
  call.kind = Call::Kind::kBroadcast;
  call.tensor = t;
  call.root = root;
  return submit(std::move(call), "broadcast");
}

std::shared_ptr<WorkState> CommunicatorImpl::barrier_async() {
  check_usable();
  Call call;
  call.kind = Call::Kind::kBarrier;
  return submit(std::move(call), "barrier");
}

std::vector<int64_t> CommunicatorImpl::allgatherv(const void* in, int64_t count, DType dtype,
                                                  std::vector<uint8_t>& out) {
  check_usable();
  if (count < 0 || (count > 0 && in == nullptr)) {
    throw InvalidArgument(fmt::format("rank {}: allgatherv: bad input (count {}, data {})", rank(), count, in));
  }
  const size_t elem = dtype_size(dtype);
  std::vector<int64_t> counts;
  run_local([&] {
    WireHeader header;
    header.op = OpKind::kAllgatherv;
    header.dtype = dtype;
    header.numel = -1;  // counts differ by rank by design
    header.seq = next_seq_;
    run_op(header, Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
      std::vector<int64_t> sizes;
      out = ring_allgatherv_bytes(op, std::span(static_cast<const uint8_t*>(in), static_cast<size_t>(count) * elem),
                                  sizes);
      for (int r = 0; r < size(); ++r) {
        if (sizes[r] % static_cast<int64_t>(elem) != 0) {
          op.fail(ErrorCode::kCorruptPayload, fmt::format("rank {} sent {} bytes, not a whole number of {} elements",
                                                          r, sizes[r], dtype_name(dtype)));
        }
        counts.push_back(sizes[r] / static_cast<int64_t>(elem));
      }
      return 1;
    });
    stats_.ops += 1;
  });
  return counts;
}

void CommunicatorImpl::synchronize() {
  run_local([&] {
    if (!device_) return;  // no CUDA call yet: nothing in flight, nothing new to report
    check_usable();
    try {
      device_->synchronize();
    } catch (const std::exception& e) {
      auto* error = dynamic_cast<const Error*>(&e);
      const ErrorCode code = error ? error->code() : ErrorCode::kTransport;
      const std::string message = fmt::format("rank {}: synchronize (after call #{}): {}", rank(), next_seq_ - 1,
                                              e.what());
      fail_and_tell(code, message, next_seq_ - 1);
      throw_error(code, message);
    }
  });
}

std::vector<uint8_t> CommunicatorImpl::save_state() {
  std::lock_guard lock(issue_mutex_);
  std::vector<uint8_t> bytes;
  run_local([&] { bytes = serialize_state(state_, rank(), size()); });
  return bytes;
}

void CommunicatorImpl::load_state(std::span<const uint8_t> bytes) {
  CompressionState parsed = parse_state(bytes, rank(), size());  // validates before anything changes
  std::lock_guard lock(issue_mutex_);
  run_local([&] { state_ = std::move(parsed); });
}

void CommunicatorImpl::connect_barrier() {
  run_local([&] {
    WireHeader header;
    header.op = OpKind::kBarrier;
    header.seq = 0;
    run_op(header, Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
      if (size() > 1) dissemination_barrier(op);
      return 0;
    });
    stats_ = Stats{};  // user-visible counters start after creation
    publish_stats();
  });
}

// ---- engine thread -------------------------------------------------------------------

void CommunicatorImpl::run_op(const WireHeader& header, Op::HeaderMode mode, const std::function<size_t(Op&)>& body) {
  check_usable();
  const auto start = Clock::now();
  size_t calls = 0;
  {
    Op op(*this, header, mode);
    try {
      calls = body(op);
      op.finish();
    } catch (const std::exception& e) {
      // Whatever escaped mid-call leaves peers waiting on this rank: record it and
      // tell them (Op::fail already did both for the errors it raised).
      auto* error = dynamic_cast<const Error*>(&e);
      fail_and_tell(error ? error->code() : ErrorCode::kTransport,
                    fmt::format("rank {}: {}: {}", rank(), op.header().describe(), e.what()), op.header().seq);
      throw;
    }
  }
  next_seq_ += calls;
  stats_.total_s += std::chrono::duration<double>(Clock::now() - start).count();
}

namespace {

// What ranks must agree on for a reduction (allreduce, reduce_scatter): the op, the
// compressor and, compressed, the key's step.
void set_reduction(WireHeader& header, const Call& call) {
  header.reduce_op = call.reduce_op;
  header.compressor = call.spec->id == CompressorId::kNone ? "none" : call.spec->canonical();
  header.compressor_hash = fnv1a32(header.compressor);
  if (call.spec->id != CompressorId::kNone && call.key != nullptr) header.step = call.key->step;
}

}  // namespace

WireHeader CommunicatorImpl::header_for(const Call& call, uint64_t seq) const {
  WireHeader header;
  header.seq = seq;
  header.dtype = call.tensor.dtype;
  header.numel = call.tensor.numel;
  switch (call.kind) {
    case Call::Kind::kAllreduce:
      header.op = OpKind::kAllreduce;
      set_reduction(header, call);
      // A compressor that views the tensor as matrices: ranks must agree on the shapes.
      if (family_of(call.spec->id).reads_shapes) header.fused_digest = call.parts_digest;
      break;
    case Call::Kind::kAllgather:
      header.op = OpKind::kAllgather;
      break;
    case Call::Kind::kReduceScatter:
      header.op = OpKind::kReduceScatter;
      set_reduction(header, call);
      break;
    case Call::Kind::kBroadcast:
      header.op = OpKind::kBroadcast;
      header.root = call.root;
      break;
    case Call::Kind::kBarrier:
    case Call::Kind::kLocal:
      header = WireHeader{};
      header.op = OpKind::kBarrier;
      header.seq = seq;
      break;
  }
  return header;
}

void CommunicatorImpl::run_body(Op& op, Call& call) {
  const TensorView& t = call.tensor;
  const bool cuda = t.device.type == DeviceType::kCuda;
  switch (call.kind) {
    case Call::Kind::kAllreduce: {
      const CompressorSpec& spec = *call.spec;
      if (spec.id == CompressorId::kNone) {
        if (cuda) {
          device_->allreduce(op, t, call.reduce_op, call.stream, nullptr);
          break;
        }
        dense_allreduce(op, t.data, t.numel, t.dtype, call.reduce_op);
        break;
      }
      if (cuda) {
        const std::function<void(float*)> engine = [&](float* host) {
          compression_.allreduce(op, host, t.numel, call.reduce_op, spec, call.key, call.key_hash, &call.parts);
        };
        const DevicePath::Compressed compressed{&spec, call.key, call.key_hash, &engine, &call.parts};
        device_->allreduce(op, t, call.reduce_op, call.stream, t.numel > 0 ? &compressed : nullptr);
        if (call.key != nullptr) call.key->step += 1;
        break;
      }
      if (t.numel > 0) {
        compression_.allreduce(op, static_cast<float*>(t.data), t.numel, call.reduce_op, spec, call.key, call.key_hash,
                               &call.parts);
      }
      if (call.key != nullptr) call.key->step += 1;
      break;
    }
    case Call::Kind::kAllgather: {
      if (cuda) {
        device_->allgather(op, t, call.out);
        break;
      }
      const size_t elem = dtype_size(t.dtype);
      auto* base = static_cast<uint8_t*>(call.out.data);
      uint8_t* mine = base + static_cast<size_t>(rank()) * t.numel * elem;
      if (t.numel > 0 && mine != t.data) std::memmove(mine, t.data, t.numel * elem);
      if (size() > 1 && t.numel > 0) {
        ring_allgatherv(op, base, std::vector<int64_t>(size(), t.numel), elem, /*unit_base=*/0);
      }
      break;
    }
    case Call::Kind::kReduceScatter: {
      const CompressorSpec& spec = *call.spec;
      if (spec.id == CompressorId::kNone) {
        if (cuda) {
          device_->reduce_scatter(op, t, call.out, call.reduce_op);
          break;
        }
        dense_reduce_scatter(op, t.data, call.out.data, call.out.numel, t.dtype, call.reduce_op);
        break;
      }
      // Compressed (host tensors, float32): on a copy, so the caller's input stays as given.
      if (t.numel > 0) {
        std::vector<float> work(static_cast<const float*>(t.data), static_cast<const float*>(t.data) + t.numel);
        compression_.reduce_scatter(op, work.data(), t.numel, call.reduce_op, spec, call.key, call.key_hash);
        std::memcpy(call.out.data, work.data() + static_cast<size_t>(rank()) * call.out.numel, call.out.nbytes());
      }
      if (call.key != nullptr) call.key->step += 1;
      break;
    }
    case Call::Kind::kBroadcast:
      if (cuda) {
        device_->broadcast(op, t, call.root);
        break;
      }
      if (size() > 1 && t.numel > 0) chain_broadcast(op, t.data, t.nbytes(), call.root);
      break;
    case Call::Kind::kBarrier:
      if (size() > 1) dissemination_barrier(op);
      break;
    case Call::Kind::kLocal:
      break;
  }
  (void)cuda;
}

void CommunicatorImpl::execute(Call& call) {
  if (call.kind == Call::Kind::kLocal) {
    call.local();
    return;
  }
  check_usable();
  if (call.tensor.device.type == DeviceType::kCuda && call.kind != Call::Kind::kBarrier) {
    open_device(call.tensor.device.index);
  }
  run_op(header_for(call, next_seq_), Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
    run_body(op, call);
    return 1;
  });
  stats_.ops += 1;
}

// The device check of a CUDA call, on the issuing side: the first CUDA call binds
// the communicator to its device (the setup itself runs on the engine).
void CommunicatorImpl::check_cuda_device(int device, const char* op_name) {
  if (cuda_device_ < 0) {
    cuda_device_ = device;
    return;
  }
  if (device != cuda_device_) {
    throw InvalidArgument(fmt::format("rank {}: {}: tensor on cuda:{}, but this communicator is bound to cuda:{} "
                                      "(its first CUDA tensor's device); use one device per communicator",
                                      rank(), op_name, device, cuda_device_));
  }
}

void CommunicatorImpl::open_device(int device) {
  if (device_) return;
  // A numbered call of its own, so a rank whose first CUDA call differs is caught
  // by the header check ("allgatherv(..., cuda-setup) #k" against its call).
  WireHeader header;
  header.op = OpKind::kAllgatherv;
  header.dtype = DType::kUInt8;
  header.numel = static_cast<int64_t>(GpuRankRecord::kBytes);
  header.compressor = "cuda-setup";
  header.compressor_hash = fnv1a32(header.compressor);
  header.seq = next_seq_;
  run_op(header, Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
    device_ = open_device_path(op, device, transport_preference_, timeout_, [this] { watch_for_aborts(); });
    return 1;  // numbered, but internal: Stats::ops counts the user's collectives
  });
}

bool CommunicatorImpl::waited_on() const { return engine_ != nullptr && engine_->waited_on(); }

}  // namespace gradcomm::detail
