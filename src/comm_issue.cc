// CommunicatorImpl's issuing side (comm_impl.h), on any caller thread: a call's
// validation (tensors, devices, sizes, the compressor spec and its key), and its queueing
// on the engine; the blocking helpers built on it (allgatherv, synchronize, save and
// load of state, the connect barrier).
#include "comm_impl.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "checksum.h"
#include "collectives/collectives.h"
#include "compressors/family.h"
#include "compressors/sparse/sparse.h"
#include "compressors/auto_spec.h"
#include "compressors/spec.h"
#include "device_path.h"
#include "engine.h"
#include "logging.h"
#include "shape.h"

namespace gradcomm::detail {

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

std::shared_ptr<WorkState> CommunicatorImpl::submit(Call&& call, const char* op, bool blocking) {
  if (call.tensor.device.type == DeviceType::kCuda) {
    std::lock_guard lock(issue_mutex_);
    check_cuda_device(call.tensor.device.index, op);
  }
  return engine_->submit(std::move(call), blocking);
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
  std::string text = options.compressor.empty() ? std::string("none") : options.compressor;
  if (options.compress_inside_nodes) {  // the spec's inside=compress: the registry says where it does not apply
    if (is_auto_spec(text)) {
      throw InvalidArgument(fmt::format("rank {}: {}: compress_inside_nodes takes a codec-ring spec (fp16, bf16, "
                                        "quant, qsgd, sign), not auto",
                                        rank(), what));
    }
    text += text.find(':') == std::string::npos ? ":inside=compress" : ",inside=compress";
  }
  call.key_name = options.key;
  call.key_hash = fnv1a64(std::span(reinterpret_cast<const uint8_t*>(options.key.data()), options.key.size()));
  if (is_auto_spec(text)) {
    resolve_auto(call, options, text, what);
    return;
  }
  try {
    call.spec = options.compressor.empty() && !options.compress_inside_nodes ? &compression_.none_spec()
                                                                             : &compression_.spec(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("rank {}: {}: {}", rank(), what, e.what()));
  }
  const CompressorSpec& spec = *call.spec;
  if (spec.id != CompressorId::kNone) {
    // Compressed: float32 gradients (float16 / bfloat16 host tensors too for the families
    // whose wire format does not depend on the type), summed or averaged, state under the
    // caller's key.
    const bool half_width = t.dtype == DType::kFloat16 || t.dtype == DType::kBFloat16;
    if (t.dtype != DType::kFloat32 &&
        !(half_width && t.device.type != DeviceType::kCuda && compresses_16bit(spec))) {
      throw InvalidArgument(fmt::format("rank {}: {}: compressor '{}' takes float32 tensors{}, got {}{}", rank(),
                                        what, text,
                                        compresses_16bit(spec) ? " (and float16/bfloat16 host tensors)" : "",
                                        dtype_name(t.dtype), t.device.type == DeviceType::kCuda ? " on a GPU" : ""));
    }
    if (reduce_op != ReduceOp::kSum && reduce_op != ReduceOp::kAvg) {
      throw InvalidArgument(fmt::format("rank {}: {}: compressor '{}' supports sum and avg, not {}", rank(),
                                        what, text, reduce_op_name(reduce_op)));
    }
    if (t.device.type == DeviceType::kCuda && family_of(spec.id).collective == Collective::kSparseSelection &&
        sparse_ops(spec).shape(spec).algo == SparseAlgo::kReduceScatter) {
      throw InvalidArgument(fmt::format("rank {}: {}: compressor '{}': algo=reduce_scatter is not available "
                                        "for CUDA tensors (the NCCL path runs the sparse allgather); use "
                                        "algo=allgather or auto",
                                        rank(), what, text));
    }
    if (options.key.empty() && HostCompression::stateful(spec)) {
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

// compressor=auto (auto_choice.h): the engine chooses a candidate per call; here the
// spec is parsed (once per text), the call checked as any compressed call, and its key
// bound. Caller holds issue_mutex_.
void CommunicatorImpl::resolve_auto(Call& call, const CompressOptions& options, const std::string& text,
                                    const char* what) {
  const TensorView& t = call.tensor;
  if (std::string_view(what) != "allreduce") {
    throw InvalidArgument(fmt::format("rank {}: {}: compressor 'auto' chooses per allreduce; {} takes a fixed "
                                      "codec ({})",
                                      rank(), what, what, family_names(Collective::kCodecRing)));
  }
  const AutoSpec* spec = nullptr;
  try {
    spec = &auto_spec(text);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("rank {}: {}: {}", rank(), what, e.what()));
  }
  if (t.dtype != DType::kFloat32) {
    throw InvalidArgument(fmt::format("rank {}: {}: compressor 'auto' takes float32 tensors, got {}", rank(), what,
                                      dtype_name(t.dtype)));
  }
  if (call.reduce_op != ReduceOp::kSum && call.reduce_op != ReduceOp::kAvg) {
    throw InvalidArgument(fmt::format("rank {}: {}: compressor 'auto' supports sum and avg, not {}", rank(), what,
                                      reduce_op_name(call.reduce_op)));
  }
  if (t.device.type == DeviceType::kCuda) {
    throw Unsupported(fmt::format("rank {}: {}: compressor 'auto' on CUDA tensors is not available (it runs on host "
                                  "tensors); name a compressor for CUDA tensors",
                                  rank(), what));
  }
  if (options.key.empty()) {
    throw InvalidArgument(fmt::format("rank {}: {}: compressor 'auto' keeps per-tensor state (its choice and error "
                                      "feedback): name this tensor uniquely (Python: {}(..., name=\"...\"); C++: "
                                      "CompressOptions::key)",
                                      rank(), what, what));
  }
  KeyState& key = state_.keys[options.key];  // map nodes never move: the engine may hold &key
  if (key.numel != 0 && (key.numel != t.numel || key.dtype != t.dtype)) {
    throw InvalidArgument(fmt::format("rank {}: {}: key '{}' holds state for {} {} elements, called with {}", rank(),
                                      what, options.key, key.numel, dtype_name(key.dtype), t.numel));
  }
  key.numel = t.numel;
  key.dtype = t.dtype;
  call.key = &key;
  call.auto_spec = spec;
  call.spec = &spec->candidates.front();  // a placeholder until the engine chooses
}

const AutoSpec& CommunicatorImpl::auto_spec(const std::string& text) {
  auto it = auto_specs_.find(text);
  if (it == auto_specs_.end()) {
    auto parsed = std::make_unique<AutoSpec>(parse_auto_spec(text));
    parsed->hash = fnv1a32(parsed->canonical());
    it = auto_specs_.emplace(text, std::move(parsed)).first;
  }
  return *it->second;
}

std::shared_ptr<WorkState> CommunicatorImpl::allreduce_async(TensorView t, ReduceOp reduce_op,
                                                             const CompressOptions& options, bool blocking) {
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
  if (!options.shape.empty() || !options.parts.empty()) {  // none given: no parts (most calls)
    try {
      call.parts = tensor_parts(options.shape, options.parts, t.numel);  // checked whatever the compressor
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("rank {}: allreduce: {}", rank(), e.what()));
    }
  }
  const bool dense = options.compressor.empty() || std::string_view(options.compressor) == "none";
  if (dense && !options.compress_inside_nodes) {
    // Dense (most small calls): nothing to parse, check or bind, so no lock either. The
    // key's name still tells fused groups apart (fusion.cc); its hash seeds compressors only.
    call.spec = &compression_.none_spec();
    call.key_name = options.key;
  } else {
    std::lock_guard lock(issue_mutex_);
    resolve_compression(call, options, "allreduce");
  }
  return submit(std::move(call), "allreduce", blocking);
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
    if (is_auto_spec(text)) resolve_auto(call, options, text, "reduce_scatter");  // refuses it, saying why
    const CompressorSpec* spec = nullptr;
    try {
      spec = &compression_.spec(text);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("rank {}: reduce_scatter: {}", rank(), e.what()));
    }
    const Collective collective = family_of(spec->id).collective;
    if (collective != Collective::kDense && !reduce_scatter_compresses(collective)) {
      throw InvalidArgument(fmt::format("rank {}: reduce_scatter: compressor '{}' is not available for "
                                        "reduce_scatter, which compresses with the codecs of the compressed ring "
                                        "({}) and with {}; allreduce takes '{}'",
                                        rank(), text, family_names(Collective::kCodecRing),
                                        family_names(Collective::kSparseSelection), text));
    }
    if (collective != Collective::kDense && in.device.type == DeviceType::kCuda) {
      throw Unsupported(fmt::format("rank {}: reduce_scatter: compressor '{}' on CUDA tensors is not available "
                                    "(the dense reduce_scatter and the compressed allreduce are)",
                                    rank(), text));
    }
    resolve_compression(call, options, "reduce_scatter");
  }
  return submit(std::move(call), "reduce_scatter");
}

std::shared_ptr<WorkState> CommunicatorImpl::broadcast_async(TensorView t, int root, bool blocking) {
  check_usable();
  check_tensor(t, "broadcast", "tensor");
  if (root < 0 || root >= size()) {
    throw InvalidArgument(fmt::format("rank {}: broadcast: root {} out of range [0, {})", rank(), root, size()));
  }
  Call call;
  call.kind = Call::Kind::kBroadcast;
  call.tensor = t;
  call.root = root;
  return submit(std::move(call), "broadcast", blocking);
}

std::shared_ptr<WorkState> CommunicatorImpl::barrier_async(bool blocking) {
  check_usable();
  Call call;
  call.kind = Call::Kind::kBarrier;
  return submit(std::move(call), "barrier", blocking);
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
    header.seq = runner_.next_seq();
    runner_.run_numbered(header, Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
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
      const std::string message = fmt::format("rank {}: synchronize (after call #{}): {}", rank(), runner_.next_seq() - 1,
                                              e.what());
      fail_and_tell(code, message, runner_.next_seq() - 1);
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
    // Every rank derives the topology from the same records, and reads GRADCOMM_HIERARCHY and
    // GRADCOMM_SCHEDULE itself; the digest makes sure they agree (a mismatch is a
    // MismatchError at create naming both digests).
    header.fused_digest = levels_digest(nodes_, two_levels_, schedule_mode_);
    runner_.run_numbered(header, Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
      if (size() > 1) dissemination_barrier(op);
      return 0;
    });
    stats_ = Stats{};  // user-visible counters start after creation
    publish_stats();
  });
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

void CommunicatorImpl::set_auto_test_override(double compute_scale, std::optional<LinkModel> link) {
  run_local([&] { auto_.set_test_override(compute_scale, link); });
}

}  // namespace gradcomm::detail
