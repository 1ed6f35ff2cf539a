// CallRunner's dispatch (call_runner.h): the header a call puts on the wire, and the
// algorithm it runs inside its Op, by kind, device and compressor. Nothing here
// numbers a call or advances a key: the runner does both around it.
#include "call_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/collectives.h"
#include "comm_impl.h"
#include "compression.h"
#include "compressors/family.h"
#include "compressors/spec.h"
#include "device_path.h"
#include "hierarchy.h"
#include "shape.h"

namespace gradcomm::detail {

namespace {

// What ranks must agree on for a reduction (allreduce, reduce_scatter): the op, the
// compressor and, compressed, the key's step.
void set_reduction(WireHeader& header, const Call& call) {
  header.reduce_op = call.reduce_op;
  if (call.spec->id == CompressorId::kNone) {
    static const uint32_t kNoneHash = fnv1a32("none");
    header.compressor_hash = kNoneHash;  // header.compressor is "none" already (a fresh header)
  } else {
    header.compressor = call.spec->canonical();
    header.compressor_hash = fnv1a32(header.compressor);
  }
  // (auto: whatever it chose, the key's step decides its reviews, so ranks agree on it.)
  if ((call.spec->id != CompressorId::kNone || call.auto_spec != nullptr) && call.key != nullptr) {
    header.step = call.key->step;
  }
}

}  // namespace

WireHeader CallRunner::header_for(const Call& call, uint64_t seq) const {
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

void CallRunner::dispatch(Op& op, Call& call) {
  const TensorView& t = call.tensor;
  const bool cuda = t.device.type == DeviceType::kCuda;
  switch (call.kind) {
    case Call::Kind::kAllreduce: {
      const CompressorSpec& spec = *call.spec;
      if (spec.id == CompressorId::kNone) {
        if (cuda) {
          comm_.device_->allreduce(op, t, call.reduce_op, call.stream, nullptr);
          break;
        }
        dense_allreduce(op, t.data, t.numel, t.dtype, call.reduce_op);
        break;
      }
      if (cuda) {
        const std::function<void(float*)> host_allreduce = [&](float* host) {
          comm_.compression_.allreduce(op, host, t.numel, call.reduce_op, spec, call.key, call.key_hash, &call.parts);
        };
        const std::function<void(float*, const TwoLevelPlan&)> host_across = [&](float* segment,
                                                                                   const TwoLevelPlan& plan) {
          comm_.compression_.two_level_across(op, segment, t.numel, plan, call.reduce_op, spec, call.key, call.key_hash);
        };
        DevicePath::Compressed compressed{&spec, call.key, call.key_hash, &host_allreduce, &call.parts};
        if (op.two_levels() && HostCompression::compresses_pieces(spec)) {
          compressed.host_across = &host_across;
          compressed.align = comm_.compression_.piece_alignment(spec);
        }
        comm_.device_->allreduce(op, t, call.reduce_op, call.stream, t.numel > 0 ? &compressed : nullptr);
        break;
      }
      if (t.numel > 0 && t.dtype != DType::kFloat32) {  // float16 / bfloat16: in float32 pieces
        comm_.compression_.allreduce_16bit(op, t.data, t.numel, t.dtype, call.reduce_op, spec, call.key, call.key_hash);
      } else if (t.numel > 0) {
        comm_.compression_.allreduce(op, static_cast<float*>(t.data), t.numel, call.reduce_op, spec, call.key, call.key_hash,
                               &call.parts);
      }
      break;
    }
    case Call::Kind::kAllgather: {
      if (cuda) {
        comm_.device_->allgather(op, t, call.out);
        break;
      }
      const size_t elem = dtype_size(t.dtype);
      auto* base = static_cast<uint8_t*>(call.out.data);
      uint8_t* mine = base + static_cast<size_t>(comm_.rank()) * t.numel * elem;
      if (t.numel > 0 && mine != t.data) std::memmove(mine, t.data, t.numel * elem);
      if (comm_.size() > 1 && t.numel > 0) {
        ring_allgatherv(op, base, std::vector<int64_t>(static_cast<size_t>(comm_.size()), t.numel), elem, /*unit_base=*/0);
      }
      break;
    }
    case Call::Kind::kReduceScatter: {
      const CompressorSpec& spec = *call.spec;
      if (spec.id == CompressorId::kNone) {
        if (cuda) {
          comm_.device_->reduce_scatter(op, t, call.out, call.reduce_op);
          break;
        }
        dense_reduce_scatter(op, t.data, call.out.data, call.out.numel, t.dtype, call.reduce_op);
        break;
      }
      // Compressed (host tensors). float16 / bfloat16: in float32 pieces, the input unchanged.
      if (t.numel > 0 && t.dtype != DType::kFloat32) {
        comm_.compression_.reduce_scatter_16bit(op, t.data, call.out.data, call.out.numel, t.dtype, call.reduce_op, spec,
                                          call.key, call.key_hash);
      } else if (t.numel > 0) {  // float32: on a copy, so the caller's input stays as given

        std::vector<float> work(static_cast<const float*>(t.data), static_cast<const float*>(t.data) + t.numel);
        comm_.compression_.reduce_scatter(op, work.data(), t.numel, call.reduce_op, spec, call.key, call.key_hash);
        std::memcpy(call.out.data, work.data() + static_cast<size_t>(comm_.rank()) * call.out.numel, call.out.nbytes());
      }
      break;
    }
    case Call::Kind::kBroadcast:
      if (cuda) {
        comm_.device_->broadcast(op, t, call.root);
        break;
      }
      if (comm_.size() > 1 && t.numel > 0) chain_broadcast(op, t.data, t.nbytes(), call.root);
      break;
    case Call::Kind::kBarrier:
      if (comm_.size() > 1) dissemination_barrier(op);
      break;
    case Call::Kind::kLocal:
      break;
  }
  (void)cuda;
}

}  // namespace gradcomm::detail
