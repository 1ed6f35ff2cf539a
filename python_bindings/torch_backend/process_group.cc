#include "process_group.h"

#include <fmt/format.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <iterator>
#include <optional>

#include "c10d_store.h"
#include "communicator_factory.h"
#include "compressors/family.h"
#include "compressors/auto_spec.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"
#include "introspect.h"  // forget_keys

namespace gradcomm::torch_backend {
namespace {

constexpr const char* kSupported =
    "supported: all_reduce (sum, avg, min, max, premul_sum), all_reduce_coalesced, all_gather, all_gather_into_tensor, "
    "broadcast, reduce_scatter, reduce_scatter_tensor, barrier"
#if GRADCOMM_TORCH2
    ", and their coalesced forms (_coalescing_manager)"
#endif
    ;

[[noreturn]] void unsupported(const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "gradcomm: the gradcomm process group does not support ", op, "; ", kSupported);
}

[[noreturn]] void bad_argument(const std::string& message) { throw std::invalid_argument("gradcomm: " + message); }

// ---- tensors ------------------------------------------------------------------------

const char* dtype_text(const at::Tensor& t) { return c10::toString(t.scalar_type()); }

void check_tensor(const at::Tensor& t, const char* op, const std::string& what) {
  if (!t.defined()) bad_argument(fmt::format("{}: {} is an undefined tensor", op, what));
  if (t.layout() != at::kStrided) {
    bad_argument(fmt::format("{}: {} is a {} tensor; only dense (strided) tensors are supported", op, what,
                             c10::toString(t.layout())));
  }
  if (t.is_cpu()) return;
#if GRADCOMM_WITH_CUDA
  if (t.is_cuda()) return;
#else
  if (t.is_cuda()) {
    bad_argument(fmt::format("{}: {} is on {}, but this gradcomm was built without CUDA (GRADCOMM_CUDA); use CPU "
                             "tensors",
                             op, what, t.device().str()));
  }
#endif
#if GRADCOMM_WITH_CUDA
  bad_argument(fmt::format("{}: {} is on {}; supported devices: cpu, cuda", op, what, t.device().str()));
#else
  bad_argument(fmt::format("{}: {} is on {}; supported devices: cpu", op, what, t.device().str()));
#endif
}

// The library's dtype for arithmetic; nullopt when it has none.
std::optional<DType> library_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kDouble: return DType::kFloat64;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kByte: return DType::kUInt8;
    default: return std::nullopt;
  }
}

Device gradcomm_device(const at::Tensor& t) {
  if (t.is_cuda()) return Device{DeviceType::kCuda, static_cast<int>(t.get_device())};
  return Device{};
}

// A view of a contiguous tensor for a reduction: its dtype must be one the library adds.
TensorView reduce_view(const at::Tensor& flat, const char* op) {
  const auto dtype = library_dtype(flat.scalar_type());
  if (!dtype) {
    bad_argument(fmt::format("{}: dtype {} is not supported for reductions; supported: float32, float16, bfloat16, "
                             "float64, int32, int64, uint8",
                             op, dtype_text(flat)));
  }
  return TensorView{flat.data_ptr(), flat.numel(), *dtype, gradcomm_device(flat)};
}

// A view for a copy-only op: the library's dtype when it has one, else the raw bytes.
TensorView copy_view(const at::Tensor& flat) {
  if (const auto dtype = library_dtype(flat.scalar_type())) {
    return TensorView{flat.data_ptr(), flat.numel(), *dtype, gradcomm_device(flat)};
  }
  return TensorView{flat.data_ptr(), flat.numel() * static_cast<int64_t>(flat.element_size()), DType::kUInt8,
                    gradcomm_device(flat)};
}

// A c10d reduce op as the library runs it. PREMUL_SUM(f) is NCCL's sum of f * x over
// the ranks (FSDP2's set_gradient_divide_factor sends PREMUL_SUM(1 / factor)): each rank
// multiplies its own buffer by f, then the library sums, dense or compressed alike.
struct Reduction {
  ReduceOp op = ReduceOp::kSum;
  std::optional<double> factor;  // PREMUL_SUM by a number
  at::Tensor factor_tensor;      // PREMUL_SUM by a one-element tensor

  bool premultiplies() const { return factor.has_value() || factor_tensor.defined(); }
  // Multiplies `flat` (a buffer this call owns, or the caller's in-place tensor) by f.
  void premultiply(const at::Tensor& flat) const {
    if (factor) {
      flat.mul_(*factor);
    } else if (factor_tensor.defined()) {
      flat.mul_(factor_tensor.to(flat.device(), flat.scalar_type()).reshape({}));
    }
  }
};

Reduction reduce_op(const c10d::ReduceOp& op, const char* name) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: return {ReduceOp::kSum};
    case c10d::ReduceOp::AVG: return {ReduceOp::kAvg};
    case c10d::ReduceOp::MIN: return {ReduceOp::kMin};
    case c10d::ReduceOp::MAX: return {ReduceOp::kMax};
    case c10d::ReduceOp::PREMUL_SUM: {
      // torch 2.x: PreMulSumSupplement{double_factor | tensor_factor}; 1.13 has one
      // tensor per device in tensor_factors (one device per process here).
#if GRADCOMM_TORCH2
      const auto* supplement = dynamic_cast<const c10d::PreMulSumSupplement*>(op.supplement_.get());
      const at::Tensor tensor = supplement ? supplement->tensor_factor : at::Tensor();
#else
      const auto* supplement = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      const at::Tensor tensor =
          supplement && !supplement->tensor_factors.empty() ? supplement->tensor_factors[0] : at::Tensor();
#endif
      if (!supplement) bad_argument(fmt::format("{}: PREMUL_SUM without its factor (make it with ReduceOp.PREMUL_SUM(f))", name));
      Reduction r{ReduceOp::kSum};
      if (tensor.defined()) {
        if (tensor.numel() != 1) {
          bad_argument(fmt::format("{}: PREMUL_SUM's factor tensor has {} elements; it must have one", name,
                                   tensor.numel()));
        }
        r.factor_tensor = tensor;
      } else {
        r.factor = supplement->double_factor;
      }
      return r;
    }
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "gradcomm: ", name, ": reduce op ",
                                  static_cast<int>(static_cast<c10d::ReduceOp::RedOpType>(op)),
                                  " (PRODUCT, BAND, BOR or BXOR) is not supported; supported: SUM, AVG, MIN, MAX, "
                                  "PREMUL_SUM");
  }
}

// PREMUL_SUM scales the values: floating-point tensors only (as for AVG's division).
void check_premultipliable(const Reduction& r, const at::Tensor& t, const char* name) {
  if (r.premultiplies() && !at::isFloatingType(t.scalar_type())) {
    bad_argument(fmt::format("{}: PREMUL_SUM on a {} tensor; it needs a floating-point dtype", name, dtype_text(t)));
  }
}

at::Tensor contiguous(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// The buffer a reduction runs on: `t` itself when it is contiguous, else a contiguous
// copy; a float32 copy when a float16/bfloat16 tensor is compressed by a family or on a
// device that takes float32 only (the result is rounded back into `t` once).
at::Tensor staged(const at::Tensor& t, bool as_float32) {
  if (as_float32) return t.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).contiguous();
  return contiguous(t);
}

// One tensor per rank: c10d passes lists for its old one-process-many-GPUs mode.
const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* op) {
  if (tensors.size() != 1) {
    bad_argument(fmt::format("{}: takes exactly one tensor per rank, got {} (one device per process)", op,
                             tensors.size()));
  }
  check_tensor(tensors[0], op, "the tensor");
  return tensors[0];
}

void same_kind(const at::Tensor& t, const at::Tensor& ref, const char* op, const std::string& what) {
  check_tensor(t, op, what);
  if (t.scalar_type() != ref.scalar_type() || t.device() != ref.device()) {
    bad_argument(fmt::format("{}: {} is {} on {}, the input {} on {}", op, what, dtype_text(t), t.device().str(),
                             dtype_text(ref), ref.device().str()));
  }
}

}  // namespace

// ---- lifetime -----------------------------------------------------------------------

ProcessGroupGradcomm::ProcessGroupGradcomm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                           std::chrono::milliseconds timeout, const std::string& group_name,
                                           CompressionConfig compression)
    : BackendBase(rank, size), group_label_(group_name) {
  set_compression(std::move(compression));
  InitOptions options;
  options.rank = rank;
  options.world_size = size;
  if (timeout.count() > 0) options.timeout = timeout;
  const std::string address = fmt::format("torch.distributed store (group '{}')", group_name);
  try {
    comm_ = detail::create_communicator(options, std::make_unique<C10dStore>(store, address));
  } catch (...) {
    rethrow_as_torch_error();
  }
  hold_limit_ = options.timeout;
  listener_->call = [this](bool deadline) { on_completion(deadline); };  // emptied by shutdown()
  completer_ = std::make_unique<Completer>(listener_);
}

ProcessGroupGradcomm::~ProcessGroupGradcomm() { shutdown(); }

void ProcessGroupGradcomm::shutdown() {
  without_gil([this] {
    listener_->clear();  // no completion reaches this group from here on (not under the issue lock)
    std::unique_ptr<Communicator> comm;
    std::unique_ptr<Completer> completer;
    std::deque<Held> held;
    {
      std::lock_guard<std::mutex> lock(issue_mutex_);
      comm = std::move(comm_);
      completer = std::move(completer_);
      held = std::move(held_);
      open_.clear();
      returned_cv_.notify_all();  // a thread waiting in one_issuer sees the group shut
    }
    comm.reset();  // fails what is outstanding, at once
    if (completer) {
      // Held ops were never issued: they fail here, through the Completer like the rest.
      const auto error = std::make_exception_ptr(std::runtime_error(
          "gradcomm: the process group was shut down while this op was held, not yet issued (issue_order.cc)"));
      for (Held& op : held) {
        op.work->set_works({}, error);
        completer->push(op.work, /*top_level=*/true);
      }
    }
    completer.reset();  // drains (every wait now returns) and waits for its threads
  });
}

void ProcessGroupGradcomm::set_compression(CompressionConfig compression) {
  if (compression.spec.empty()) compression.spec = "none";
  // Validates the spec, and says whether the library's reduce-scatter compresses with it
  // (the codec-ring families and top-k: detail::reduce_scatter_compresses).
  bool library_reduce_scatter = false, library_16bit = false;
  try {
    detail::check_compressor_spec(compression.spec);  // auto's too: it chooses per allreduce
    if (!detail::is_auto_spec(compression.spec)) {
      const detail::CompressorSpec spec = detail::parse_compressor_spec(compression.spec);
      library_reduce_scatter = detail::reduce_scatter_compresses(detail::family_of(spec.id).collective);
      library_16bit = detail::compresses_16bit(spec);
    }
  } catch (...) {
    rethrow_as_torch_error();
  }
  if (compression.min_numel < 0) {
    bad_argument(fmt::format("set_compression: min_compress_numel must be >= 0, got {}", compression.min_numel));
  }
  std::lock_guard<std::mutex> lock(issue_mutex_);
  compression_ = std::move(compression);
  library_reduce_scatter_ = library_reduce_scatter;
  library_16bit_ = library_16bit;
}

CompressionConfig ProcessGroupGradcomm::compression() const {
  std::lock_guard<std::mutex> lock(issue_mutex_);
  return compression_;
}

// ---- issuing (start: issue_order.cc) -----------------------------------------------

size_t ProcessGroupGradcomm::compression_state_bytes() {
  std::lock_guard lock(issue_mutex_);
  return comm_->save_state().size();
}

// Error feedback needs a key that names "this tensor" on every rank alike. A
// storage's ordinal (the order in which this process group first compressed it) is
// the same on every rank, since every rank issues the same calls. Within a storage
// the key must name the elements and their order, since the residual is laid out
// in the order the compressor saw them: a contiguous tensor's are the numel from its
// offset, in memory order (any shape); a strided view's go through a contiguous
// copy in its logical order, which its sizes and strides give, so W.t() and W never
// share a residual laid out for the other.
std::string ProcessGroupGradcomm::compression_key(const at::Tensor& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  auto it = ordinals_.find(impl);
  if (it == ordinals_.end() || it->second.storage.expired()) {
    // A new storage, or a dead one's address reused: a new ordinal.
    if (ordinals_.size() >= sweep_at_) sweep_dead_storages();
    it = ordinals_.insert_or_assign(impl, StorageOrdinal{t.storage().getWeakStorageImpl(), next_ordinal_++, {}}).first;
  }
  std::string key = fmt::format("torch/s{}/o{}/n{}", it->second.ordinal, t.storage_offset(), t.numel());
  if (!t.is_contiguous()) {
    for (int64_t d = 0; d < t.dim(); ++d) key += fmt::format("{}{}:{}", d == 0 ? "/v" : ",", t.size(d), t.stride(d));
  }
  std::vector<std::string>& keys = it->second.keys;
  if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  return key;
}

// A freed storage's keys are never issued again (a new storage gets a new ordinal),
// and no call in flight holds one (a Work keeps its tensors alive until it is done),
// so their residuals can go. Every rank frees at its own moment; that is fine: each
// rank drops only state that no later call of its own reads.
void ProcessGroupGradcomm::sweep_dead_storages() {
  std::vector<std::string> dead_keys;
  for (auto e = ordinals_.begin(); e != ordinals_.end();) {
    if (e->second.storage.expired()) {
      std::move(e->second.keys.begin(), e->second.keys.end(), std::back_inserter(dead_keys));
      e = ordinals_.erase(e);
    } else {
      ++e;
    }
  }
  if (!dead_keys.empty()) gradcomm::detail::forget_keys(*comm_, dead_keys);
  sweep_at_ = std::max(kMinSweep, 2 * ordinals_.size());
}

// float32, or float16/bfloat16 on CPU where the library takes them (library_16bit_).
bool ProcessGroupGradcomm::compressible_type(const at::Tensor& flat) const {
  const auto type = flat.scalar_type();
  return type == at::kFloat || ((type == at::kHalf || type == at::kBFloat16) && library_16bit_ && flat.is_cpu());
}

CompressOptions ProcessGroupGradcomm::compress_options(const at::Tensor& t, const at::Tensor& flat, ReduceOp op) {
  CompressOptions options;
  if (compression_.spec == "none" || !compressible_type(flat) || flat.numel() == 0 ||
      flat.numel() < compression_.min_numel || (op != ReduceOp::kSum && op != ReduceOp::kAvg)) {
    count_reduction(flat.numel(), t.scalar_type(), options);
    return options;  // exact
  }
  options.compressor = compression_.spec;
  options.key = compression_key(t);
  count_reduction(flat.numel(), t.scalar_type(), options);
  return options;
}

// ---- compressed reduce-scatter ----------------------------------------------------------
//
// FSDP reduces each gradient with reduce_scatter_tensor, so compressing it compresses
// FSDP. Exact reductions (no spec, a tensor too small or of another dtype, min/max) take
// the library's dense reduce-scatter, which sends (N-1)/N of the input. Compressed ones
// with a codec-ring spec (fp16, bf16, quant, qsgd, sign) on CPU tensors take the
// library's compressed reduce-scatter: a payload per hop, (N-1)/N of the input's
// compressed size; so do top-k specs, each rank sending each segment's owner its
// selected entries there (about (N-1)/N of k entries). The others (random-k, sketch,
// powersgd, auto, and CUDA tensors) are an allreduce of the input, staged whole, and
// this rank's chunk copied out: every rank ends with bitwise the same sum, so the
// shards agree, and the bytes are an allreduce's.
//
// Error feedback needs a key naming "this gradient" on every rank and in every step.
// A storage-based key (as allreduce uses) is wrong here: FSDP reduces from buffers
// it allocates per call, which its caching allocator hands to another layer's
// gradient the next time ("bucket reuse"), so a storage would mix residuals of
// different layers. What does name a gradient is its call site: within a training
// step FSDP issues the same reduce-scatters in the same order on every rank, so
// "the j-th reduce-scatter of this size and dtype in this round" is the same
// gradient (the same flat parameter or layer) on every rank and in every step. A
// round ends where every rank agrees it does: gradcomm.torch calls next_round()
// before each optimizer step (a global torch.optim hook). The residual so keyed
// covers this rank's whole input, i.e. its contribution to every output shard.
CompressOptions ProcessGroupGradcomm::reduce_scatter_options(const at::Tensor& flat, at::ScalarType input_type,
                                                             ReduceOp op) {
  CompressOptions options;
  if (compression_.spec == "none" || !compressible_type(flat) || flat.numel() == 0 ||
      flat.numel() < compression_.min_numel || (op != ReduceOp::kSum && op != ReduceOp::kAvg)) {
    count_reduction(flat.numel(), input_type, options, /*reduce_scatter=*/true);
    return options;  // exact
  }
  const std::string site = fmt::format("{}/{}", flat.numel(), c10::toString(input_type));
  const uint64_t call = round_calls_[site]++;
  if (call == kRoundCallsWarning) {
    TORCH_WARN("gradcomm: ", call, " reduce-scatters of ", flat.numel(), " elements in one round of group '",
               group_label_, "': no optimizer step has ended the round, so every call gets new error-feedback "
               "state. Call gradcomm.torch.next_round(group) once per training step if you do not use a "
               "torch.optim optimizer.");
  }
  options.compressor = compression_.spec;
  options.key = fmt::format("torch/rs/n{}#{}", site, call);
  count_reduction(flat.numel(), input_type, options, /*reduce_scatter=*/true);
  return options;
}

void ProcessGroupGradcomm::next_round() {
  std::lock_guard<std::mutex> lock(issue_mutex_);
  round_calls_.clear();
}

void ProcessGroupGradcomm::count_reduction(int64_t numel, at::ScalarType dtype, const CompressOptions& options,
                                           bool reduce_scatter) {
  // In the caller's dtype: a bfloat16 gradient compressed through a float32 copy is
  // measured against the bfloat16 bytes a dense reduction would send.
  const auto bytes = static_cast<uint64_t>(numel) * static_cast<uint64_t>(c10::elementSize(dtype));
  const auto n = static_cast<uint64_t>(getSize());
  ++stats_.reductions;
  if (options.compressor != "none") ++stats_.compressed;
  stats_.reduced_bytes += bytes;
  stats_.dense_ring_bytes += n > 1 ? (reduce_scatter ? 1 : 2) * (n - 1) * bytes / n : 0;
}

bool ProcessGroupGradcomm::compresses(const at::Tensor& t, ReduceOp op) const {
  const auto type = t.scalar_type();
  std::lock_guard<std::mutex> lock(issue_mutex_);
  return compression_.spec != "none" && (type == at::kFloat || type == at::kHalf || type == at::kBFloat16) &&
         t.numel() > 0 && t.numel() >= compression_.min_numel && (op == ReduceOp::kSum || op == ReduceOp::kAvg);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::dense_reduce_scatter(c10d::OpType type, const char* op,
                                                                          const at::Tensor& in, const at::Tensor& out,
                                                                          ReduceOp reduce_op) {
  // The library leaves its input unchanged and writes its own buffer of the output:
  // no copies unless a tensor is not contiguous.
  const at::Tensor flat_in = contiguous(in).reshape({-1});
  const at::Tensor flat_out = contiguous(out);
  const TensorView vin = reduce_view(flat_in, op);
  const TensorView vout = reduce_view(flat_out, op);
  std::function<void()> finish;
  if (!flat_out.is_same(out)) finish = [out, flat_out] { out.copy_(flat_out); };
  return start(
      type, op,
      [=, this](auto& works) {
        count_reduction(flat_in.numel(), flat_in.scalar_type(), CompressOptions{}, /*reduce_scatter=*/true);
        works.push_back(comm_->reduce_scatter_async(vin, vout, reduce_op));
      },
      {out}, {flat_in, flat_out}, std::move(finish));
}

void ProcessGroupGradcomm::count_gather(const at::Tensor& in) {
  // Ranks that all share one node's segment gather there: nothing on the wire.
  const Topology& topology = comm_->topology();
  if (topology.node_shm && topology.local_size == getSize()) return;
  std::lock_guard<std::mutex> lock(issue_mutex_);
  const auto bytes = static_cast<uint64_t>(in.numel()) * static_cast<uint64_t>(in.element_size());
  stats_.gathered_bytes += static_cast<uint64_t>(getSize() - 1) * bytes;
}

bool ProcessGroupGradcomm::compress_through_float32(const at::Tensor& t, ReduceOp op) const {
  if (t.scalar_type() != at::kHalf && t.scalar_type() != at::kBFloat16) return false;
  {
    std::lock_guard<std::mutex> lock(issue_mutex_);
    if (compressible_type(t)) return false;  // the library compresses it as it is
  }
  return compresses(t, op);
}

ProcessGroupGradcomm::GroupStats ProcessGroupGradcomm::stats() {
  std::lock_guard<std::mutex> lock(issue_mutex_);
  GroupStats out = stats_;
  if (comm_) out.comm = comm_->stats();
  return out;
}

// ---- the collectives --------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allreduce(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  const at::Tensor t = single(tensors, "allreduce");
  const Reduction reduction = reduce_op(opts.reduceOp, "allreduce");
  check_premultipliable(reduction, t, "allreduce");
  const ReduceOp op = reduction.op;
  const at::Tensor flat = staged(t, compress_through_float32(t, op));
  reduction.premultiply(flat);
  const TensorView view = reduce_view(flat, "allreduce");
  std::function<void()> finish;
  if (!flat.is_same(t)) finish = [t, flat] { t.copy_(flat); };
  return start(
      c10d::OpType::ALLREDUCE, "allreduce",
      [=, this](auto& works) { works.push_back(comm_->allreduce_async(view, op, compress_options(t, flat, op))); },
      {t}, {flat}, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                        const c10d::AllreduceCoalescedOptions& opts) {
  const Reduction reduction = reduce_op(opts.reduceOp, "allreduce_coalesced");
  const ReduceOp op = reduction.op;
  std::vector<at::Tensor> flats;
  std::vector<TensorView> views;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_tensor(tensors[i], "allreduce_coalesced", fmt::format("tensor {}", i));
    check_premultipliable(reduction, tensors[i], "allreduce_coalesced");
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    flats.push_back(staged(tensors[i], compress_through_float32(tensors[i], op)));
    reduction.premultiply(flats.back());
    views.push_back(reduce_view(flats.back(), "allreduce_coalesced"));
  }
  std::function<void()> finish = [tensors, flats] {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!flats[i].is_same(tensors[i])) tensors[i].copy_(flats[i]);
    }
  };
  return start(
      c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced",
      [=, this](auto& works) {
        for (size_t i = 0; i < views.size(); ++i) {
          works.push_back(comm_->allreduce_async(views[i], op, compress_options(tensors[i], flats[i], op)));
        }
      },
      tensors, flats, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::broadcast(std::vector<at::Tensor>& tensors,
                                                              const c10d::BroadcastOptions& opts) {
  const at::Tensor t = single(tensors, "broadcast");
  if (opts.rootTensor != 0) {
    bad_argument(fmt::format("broadcast: rootTensor {} (one tensor per rank: 0)", opts.rootTensor));
  }
  if (opts.rootRank < 0 || opts.rootRank >= getSize()) {
    bad_argument(fmt::format("broadcast: root rank {} is outside the group of {}", opts.rootRank, getSize()));
  }
  const int root = static_cast<int>(opts.rootRank);
  const at::Tensor flat = contiguous(t);
  const TensorView view = copy_view(flat);
  std::function<void()> finish;
  if (!flat.is_same(t)) finish = [t, flat] { t.copy_(flat); };
  return start(
      c10d::OpType::BROADCAST, "broadcast",
      [=, this](auto& works) { works.push_back(comm_->broadcast_async(view, root)); }, {t}, {flat}, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                              std::vector<at::Tensor>& inputs,
                                                              const c10d::AllgatherOptions&) {
  const at::Tensor in = contiguous(single(inputs, "allgather"));
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(getSize())) {
    bad_argument(fmt::format("allgather: expects one list of {} output tensors (the group's size), got {} list(s) "
                             "of {}",
                             getSize(), outputs.size(), outputs.empty() ? 0 : outputs[0].size()));
  }
  const std::vector<at::Tensor> outs = outputs[0];
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string what = fmt::format("output tensor {}", i);
    same_kind(outs[i], in, "allgather", what);
    if (outs[i].numel() != in.numel()) {
      bad_argument(fmt::format("allgather: {} has {} elements, the input {}", what, outs[i].numel(), in.numel()));
    }
  }
  const at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
  const TensorView vin = copy_view(in), vout = copy_view(flat);
  const int64_t n = in.numel();
  auto finish = [outs, flat, n] {
    for (size_t i = 0; i < outs.size(); ++i) {
      outs[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(outs[i].sizes()));
    }
  };
  count_gather(in);
  return start(
      c10d::OpType::ALLGATHER, "allgather",
      [=, this](auto& works) { works.push_back(comm_->allgather_async(vin, vout)); }, outs, {in, flat}, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::AllgatherOptions&) {
  check_tensor(input, "all_gather_into_tensor", "the input");
  same_kind(output, input, "all_gather_into_tensor", "the output");
  if (output.numel() != getSize() * input.numel()) {
    bad_argument(fmt::format("all_gather_into_tensor: the output has {} elements, expected {} (group size {} x "
                             "input {})",
                             output.numel(), getSize() * input.numel(), getSize(), input.numel()));
  }
  const at::Tensor in = contiguous(input), out = output;
  const at::Tensor flat = contiguous(out);
  const TensorView vin = copy_view(in), vout = copy_view(flat);
  std::function<void()> finish;
  if (!flat.is_same(out)) finish = [out, flat] { out.copy_(flat); };
  count_gather(in);
  return start(
      c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor",
      [=, this](auto& works) { works.push_back(comm_->allgather_async(vin, vout)); }, {out}, {in, flat}, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                                   const c10d::ReduceScatterOptions& opts) {
  const at::Tensor out = single(outputs, "reduce_scatter");
  const Reduction reduction = reduce_op(opts.reduceOp, "reduce_scatter");
  check_premultipliable(reduction, out, "reduce_scatter");
  const ReduceOp op = reduction.op;
  if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(getSize())) {
    bad_argument(fmt::format("reduce_scatter: expects one list of {} input tensors (the group's size), got {} "
                             "list(s) of {}",
                             getSize(), inputs.size(), inputs.empty() ? 0 : inputs[0].size()));
  }
  const int64_t n = out.numel();
  for (size_t i = 0; i < inputs[0].size(); ++i) {
    const std::string what = fmt::format("input tensor {}", i);
    same_kind(inputs[0][i], out, "reduce_scatter", what);
    if (inputs[0][i].numel() != n) {
      bad_argument(fmt::format("reduce_scatter: {} has {} elements, the output {}", what, inputs[0][i].numel(), n));
    }
  }
  if (!compresses(out, op)) {  // exact: the inputs end to end, the library's reduce-scatter
    const at::Tensor flat = at::empty({getSize() * n}, out.options().memory_format(at::MemoryFormat::Contiguous));
    for (size_t i = 0; i < inputs[0].size(); ++i) {
      flat.narrow(0, static_cast<int64_t>(i) * n, n).copy_(inputs[0][i].reshape({n}));
    }
    reduction.premultiply(flat);
    return dense_reduce_scatter(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", flat, out, op);
  }
  // Compressed: the inputs end to end (float32 when a float16/bfloat16 input is compressed).
  const auto dtype = compress_through_float32(out, op) ? at::kFloat : out.scalar_type();
  const at::Tensor flat =
      at::empty({getSize() * n}, out.options().dtype(dtype).memory_format(at::MemoryFormat::Contiguous));
  for (size_t i = 0; i < inputs[0].size(); ++i) {
    flat.narrow(0, static_cast<int64_t>(i) * n, n).copy_(inputs[0][i].reshape({n}));
  }
  reduction.premultiply(flat);
  return compressed_reduce_scatter(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", flat, out, op);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::compressed_reduce_scatter(c10d::OpType type, const char* name,
                                                                               const at::Tensor& flat,
                                                                               const at::Tensor& out, ReduceOp op) {
  const int64_t n = out.numel();
  const TensorView view = reduce_view(flat, name);
  bool library_reduce_scatter = false;
  {
    std::lock_guard<std::mutex> lock(issue_mutex_);
    library_reduce_scatter = library_reduce_scatter_;
  }
  if (library_reduce_scatter && flat.is_cpu()) {
    // The library's compressed reduce-scatter: a payload per hop, this rank's share exact
    // in what it received. Written into `out` when it is float32 and contiguous.
    const bool direct = out.scalar_type() == flat.scalar_type() && out.is_contiguous();
    const at::Tensor share = direct ? out : at::empty({n}, flat.options());
    const TensorView vshare = reduce_view(share, name);
    std::function<void()> finish;
    if (!direct) finish = [out, share] { out.copy_(share.view(out.sizes())); };
    return start(
        type, name,
        [=, this](auto& works) {
          works.push_back(
              comm_->reduce_scatter_async(view, vshare, op, reduce_scatter_options(flat, out.scalar_type(), op)));
        },
        {out}, {flat, share}, std::move(finish));
  }
  // Other compressors (random-k, sketch, powersgd, auto: no library reduce-scatter) and
  // CUDA tensors: a compressed allreduce of the whole input; this rank's chunk is the result.
  const int64_t rank = getRank();
  auto finish = [out, flat, n, rank] { out.copy_(flat.narrow(0, rank * n, n).view(out.sizes())); };
  return start(
      type, name,
      [=, this](auto& works) {
        works.push_back(comm_->allreduce_async(view, op, reduce_scatter_options(flat, out.scalar_type(), op)));
      },
      {out}, {flat}, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                         const c10d::ReduceScatterOptions& opts) {
  check_tensor(output, "reduce_scatter_tensor", "the output");
  same_kind(input, output, "reduce_scatter_tensor", "the input");
  const Reduction reduction = reduce_op(opts.reduceOp, "reduce_scatter_tensor");
  check_premultipliable(reduction, input, "reduce_scatter_tensor");
  const ReduceOp op = reduction.op;
  const int64_t n = output.numel();
  if (input.numel() != getSize() * n) {
    bad_argument(fmt::format("reduce_scatter_tensor: the input has {} elements, expected {} (group size {} x "
                             "output {})",
                             input.numel(), getSize() * n, getSize(), n));
  }
  const at::Tensor out = output;
  if (!compresses(input, op)) {
    if (!reduction.premultiplies()) {
      return dense_reduce_scatter(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", input, out, op);
    }
    const at::Tensor scaled = input.reshape({-1}).clone(at::MemoryFormat::Contiguous);  // the input stays unchanged
    reduction.premultiply(scaled);
    return dense_reduce_scatter(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", scaled, out, op);
  }
  // Compressed. The library's reduce-scatter leaves its input unchanged: the input itself,
  // unless premultiplied; the allreduce form works in place: a copy (float32 when a
  // float16/bfloat16 input goes through float32).
  bool allreduce_form = false;  // works in place on its input
  {
    std::lock_guard<std::mutex> lock(issue_mutex_);
    allreduce_form = !(library_reduce_scatter_ && input.is_cpu());
  }
  const at::Tensor flat = compress_through_float32(input, op)
                              ? input.reshape({-1}).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true)
                          : (allreduce_form || reduction.premultiplies())
                              ? input.reshape({-1}).clone(at::MemoryFormat::Contiguous)
                              : contiguous(input).reshape({-1});
  reduction.premultiply(flat);
  return compressed_reduce_scatter(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", flat, out, op);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::barrier(const c10d::BarrierOptions&) {
  const at::Tensor token = at::zeros({1}, at::kByte);
  const TensorView view = copy_view(token);
  return start(
      c10d::OpType::BARRIER, "barrier",
      [=, this](auto& works) { works.push_back(comm_->allreduce_async(view, ReduceOp::kSum)); }, {}, {token}, nullptr);
}

// ---- torch 2.x coalescing -------------------------------------------------------------------
#if GRADCOMM_TORCH2

void ProcessGroupGradcomm::startCoalescing() {
  std::lock_guard<std::mutex> lock(issue_mutex_);
  if (coalescing_.active) {
    bad_argument("startCoalescing: this group is coalescing already (a _coalescing_manager inside another)");
  }
  coalescing_ = Coalescing{};
  coalescing_.active = true;
  coalescing_.calls = std::make_shared<Calls>();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::endCoalescing() {
  Coalescing batch;
  {
    std::lock_guard<std::mutex> lock(issue_mutex_);
    if (!coalescing_.active) bad_argument("endCoalescing: the group is not coalescing (no startCoalescing)");
    batch = std::move(coalescing_);
    coalescing_ = Coalescing{};
  }
  // No new calls: the batch's own, issued by then (a held batch is issued after its
  // ops, which were held too). It is queued after them, so it settles (and its Future
  // completes) only once each of them has, local steps included.
  std::shared_ptr<Calls> calls = std::move(batch.calls);
  return start(
      c10d::OpType::COALESCED, "coalesced ops", [calls](Calls& works) { works = *calls; },
      std::move(batch.outputs), {}, nullptr);
}

// The *_coalesced tensor ops: each pair issued as its plain op inside one coalescing
// bracket. On an error, what was issued completes on its own; the caller gets the error.
template <class IssueOne>
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::coalesced(const char* name, std::vector<at::Tensor>& outputs,
                                                              std::vector<at::Tensor>& inputs, IssueOne issue_one) {
  if (outputs.size() != inputs.size()) {
    bad_argument(fmt::format("{}: {} outputs for {} inputs", name, outputs.size(), inputs.size()));
  }
  startCoalescing();
  try {
    for (size_t i = 0; i < inputs.size(); ++i) issue_one(outputs[i], inputs[i]);
  } catch (...) {
    (void)endCoalescing();
    throw;
  }
  return endCoalescing();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  return coalesced("all_gather_into_tensor_coalesced", outputs, inputs,
                   [&](at::Tensor& out, at::Tensor& in) { _allgather_base(out, in, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  return coalesced("reduce_scatter_tensor_coalesced", outputs, inputs,
                   [&](at::Tensor& out, at::Tensor& in) { _reduce_scatter_base(out, in, opts); });
}

#endif  // GRADCOMM_TORCH2

// ---- not provided ---------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::reduce(std::vector<at::Tensor>&, const c10d::ReduceOptions&) {
  unsupported("reduce");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::allgather_coalesced(std::vector<std::vector<at::Tensor>>&,
                                                                        std::vector<at::Tensor>&,
                                                                        const c10d::AllgatherOptions&) {
  unsupported("allgather_coalesced");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::gather(std::vector<std::vector<at::Tensor>>&,
                                                           std::vector<at::Tensor>&, const c10d::GatherOptions&) {
  unsupported("gather");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::scatter(std::vector<at::Tensor>&,
                                                            std::vector<std::vector<at::Tensor>>&,
                                                            const c10d::ScatterOptions&) {
  unsupported("scatter");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&,
                                                                  std::vector<int64_t>&,
                                                                  const c10d::AllToAllOptions&) {
  unsupported("alltoall_base (all_to_all_single)");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::alltoall(std::vector<at::Tensor>&, std::vector<at::Tensor>&,
                                                             const c10d::AllToAllOptions&) {
  unsupported("alltoall");
}
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::send(std::vector<at::Tensor>&, int, int) { unsupported("send"); }
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::recv(std::vector<at::Tensor>&, int, int) { unsupported("recv"); }
c10::intrusive_ptr<c10d::Work> ProcessGroupGradcomm::recvAnysource(std::vector<at::Tensor>&, int) {
  unsupported("recv (any source)");
}

}  // namespace gradcomm::torch_backend
