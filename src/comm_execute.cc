// CommunicatorImpl's execute side (comm_impl.h), on the engine thread: the CallExecutor
// of call_context.h. A call's header, its Op and accounting (run_op), the dispatch to
// its algorithm (run_body), and the numbered setup of the device path at the first
// CUDA call.
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
#include "hierarchy.h"
#include "logging.h"
#include "shape.h"

namespace gradcomm::detail {

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
  transport_->note_completed(next_seq_);  // a peer that left after these calls may go
  stats_.total_s += std::chrono::duration<double>(Clock::now() - start).count();
}

namespace {

// What ranks must agree on for a reduction (allreduce, reduce_scatter): the op, the
// compressor and, compressed, the key's step.
void set_reduction(WireHeader& header, const Call& call) {
  header.reduce_op = call.reduce_op;
  header.compressor = call.spec->id == CompressorId::kNone ? "none" : call.spec->canonical();
  header.compressor_hash = fnv1a32(header.compressor);
  // (auto: whatever it chose, the key's step decides its reviews, so ranks agree on it.)
  if ((call.spec->id != CompressorId::kNone || call.auto_spec != nullptr) && call.key != nullptr) {
    header.step = call.key->step;
  }
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
        if (call.auto_spec != nullptr) call.key->step += 1;  // auto's steps count every call
        break;
      }
      if (cuda) {
        const std::function<void(float*)> host_allreduce = [&](float* host) {
          compression_.allreduce(op, host, t.numel, call.reduce_op, spec, call.key, call.key_hash, &call.parts);
        };
        const std::function<void(float*, const TwoLevelPlan&)> host_across = [&](float* segment,
                                                                                   const TwoLevelPlan& plan) {
          compression_.two_level_across(op, segment, t.numel, plan, call.reduce_op, spec, call.key, call.key_hash);
        };
        DevicePath::Compressed compressed{&spec, call.key, call.key_hash, &host_allreduce, &call.parts};
        if (op.two_levels() && HostCompression::compresses_pieces(spec)) {
          compressed.host_across = &host_across;
          compressed.align = compression_.piece_alignment(spec);
        }
        device_->allreduce(op, t, call.reduce_op, call.stream, t.numel > 0 ? &compressed : nullptr);
        if (call.key != nullptr) call.key->step += 1;
        break;
      }
      if (t.numel > 0 && t.dtype != DType::kFloat32) {  // float16 / bfloat16: in float32 pieces
        compression_.allreduce_16bit(op, t.data, t.numel, t.dtype, call.reduce_op, spec, call.key, call.key_hash);
      } else if (t.numel > 0) {
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
      // Compressed (host tensors). float16 / bfloat16: in float32 pieces, the input unchanged.
      if (t.numel > 0 && t.dtype != DType::kFloat32) {
        compression_.reduce_scatter_16bit(op, t.data, call.out.data, call.out.numel, t.dtype, call.reduce_op, spec,
                                          call.key, call.key_hash);
      } else if (t.numel > 0) {  // float32: on a copy, so the caller's input stays as given

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
  if (call.auto_spec != nullptr) auto_.choose(*this, call);  // may run its review first
  const Stats before = call.auto_spec != nullptr ? stats_ : Stats{};
  run_op(header_for(call, next_seq_), Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
    run_body(op, call);
    return 1;
  });
  stats_.ops += 1;
  if (call.auto_spec != nullptr) auto_.observe(call, before, stats_, size());
}

void CommunicatorImpl::set_auto_test_override(double compute_scale, std::optional<LinkModel> link) {
  run_local([&] { auto_.set_test_override(compute_scale, link); });
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

}  // namespace gradcomm::detail
