// CallRunner (call_runner.h): numbering, the Op around every call, fused groups, and
// the keys' steps. The algorithm a call runs is call_dispatch.cc's.
#include "call_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "collectives/collectives.h"
#include "comm_impl.h"
#include "compression.h"
#include "device_path.h"
#include "gpu_plan.h"
#include "reduce.h"
#include "compressors/spec.h"

namespace gradcomm::detail {

CallRunner::CallRunner(CommunicatorImpl& comm) : comm_(comm) {}

CallContext& CallRunner::context() { return comm_; }
bool CallRunner::usable() const { return comm_.usable(); }
void CallRunner::publish_stats() { comm_.publish_stats(); }

void CallRunner::run_numbered(const WireHeader& header, Op::HeaderMode mode, const std::function<size_t(Op&)>& body) {
  comm_.check_usable();
  const auto start = Clock::now();
  size_t calls = 0;
  {
    Op op(comm_, header, mode, start);
    try {
      calls = body(op);
      op.finish();
    } catch (const std::exception& e) {
      // Whatever escaped mid-call leaves peers waiting on this rank: record it and
      // tell them (Op::fail already did both for the errors it raised).
      auto* error = dynamic_cast<const Error*>(&e);
      comm_.fail_and_tell(error ? error->code() : ErrorCode::kTransport,
                          fmt::format("rank {}: {}: {}", comm_.rank(), op.header().describe(), e.what()),
                          op.header().seq);
      throw;
    }
  }
  next_seq_ += calls;
  comm_.transport_->note_completed(next_seq_);  // a peer that left after these calls may go
  comm_.stats_.total_s += std::chrono::duration<double>(Clock::now() - start).count();
}

void CallRunner::advance_keys(std::span<Call* const> members) {
  // A call with a key is a compressed (or auto) allreduce or reduce-scatter: each that
  // ran is one step of its key, whatever path it took (dense this step, CUDA, fused).
  for (Call* call : members) {
    if (call->key != nullptr) call->key->step += 1;
  }
}

CallRunner::Ran CallRunner::run_one(Call& call) {
  Ran ran;
  try {
    if (call.kind == Call::Kind::kLocal) {
      call.local();
    } else {
      run_collective(call);
    }
  } catch (...) {
    ran.error = std::current_exception();
  }
  return ran;
}

void CallRunner::run_collective(Call& call) {
  comm_.check_usable();
  if (call.tensor.device.type == DeviceType::kCuda && call.kind != Call::Kind::kBarrier) {
    open_device(call.tensor.device.index);
  }
  const auto run = [&] {
    run_numbered(header_for(call, next_seq_), Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
      dispatch(op, call);
      return 1;
    });
    Call* const one[] = {&call};
    advance_keys(one);
    comm_.stats_.ops += 1;
  };
  if (call.auto_spec == nullptr) return run();
  choose_auto(call);
  const Stats before = comm_.stats_;  // what auto's observation compares against
  run();
  comm_.auto_.observe(call, before, comm_.stats_, comm_.size());
}

void CallRunner::choose_auto(Call& call) {
  AutoChooser& chooser = comm_.auto_;
  if (chooser.review_due(call, comm_.size())) {
    run_numbered(chooser.review_header(call, next_seq_), Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
      chooser.review(op, comm_.compression_, call);
      return 1;  // numbered, internal: Stats::ops counts the user's collectives
    });
  }
  call.spec = chooser.choice(call);
  // A choice without error feedback sends what the residual kept (flushes it).
  KeyState& key = *call.key;
  if (!call.spec->ef && !key.residual.empty()) {
    reduce_inplace(call.tensor.data, key.residual.data(), call.tensor.numel, DType::kFloat32, ReduceOp::kSum);
    key.residual.clear();
  }
}

void CallRunner::open_device(int device) {
  if (comm_.device_) return;
  // A numbered call of its own, so a rank whose first CUDA call differs is caught
  // by the header check ("allgatherv(..., cuda-setup) #k" against its call).
  WireHeader header;
  header.op = OpKind::kAllgatherv;
  header.dtype = DType::kUInt8;
  header.numel = static_cast<int64_t>(GpuRankRecord::kBytes);
  header.compressor = "cuda-setup";
  header.compressor_hash = fnv1a32(header.compressor);
  header.seq = next_seq_;
  run_numbered(header, Op::HeaderMode::kPostNow, [&](Op& op) -> size_t {
    comm_.device_ = open_device_path(op, device, comm_.transport_preference_, comm_.timeout_,
                                     [this] { comm_.watch_for_aborts(); });
    return 1;  // numbered, but internal: Stats::ops counts the user's collectives
  });
}

// ---- fused groups ----------------------------------------------------------------------

CallRunner::Ran CallRunner::run_group(std::span<Call* const> view, const FusionClass& cls, int64_t fusion_bytes,
                                      GroupQueue& queue) {
  Call& first = *view.front();
  const uint64_t seq = next_seq_;
  // The header of a group: a single call keeps its own (marked as planned).
  const auto header_of = [&](std::span<Call* const> members) {
    WireHeader fused = fused_header(members, cls, seq);
    if (members.size() > 1) return fused;
    WireHeader single = header_for(*members.front(), seq);
    single.fused = 1;
    single.fused_digest = fused.fused_digest;
    return single;
  };
  const auto body = [&](Op& op, std::span<Call* const> members) {
    if (members.size() == 1) {
      dispatch(op, *members.front());
    } else {
      run_fused(op, members, cls);
    }
  };
  // A deferred Op's header until the group is known: its first call's, as planned.
  const auto provisional = [&] {
    WireHeader header = header_for(first, seq);
    header.fused = 1;
    return header;
  };
  size_t count = 0;
  std::vector<Call*> members;
  try {
    if (comm_.rank() == 0) {
      const size_t planned = fusable_prefix(view, cls, fusion_bytes);
      count = planned;
      // One call needs no agreement: its header goes out with the plan. Several are
      // agreed first (Op::agree_plan), and the header follows.
      const bool single = planned == 1;
      run_numbered(single ? header_of(view.first(1)) : provisional(),
                   single ? Op::HeaderMode::kPostNow : Op::HeaderMode::kDeferred, [&](Op& op) -> size_t {
                     const FusionPlan plan{seq, static_cast<uint32_t>(planned)};
                     op.send_plan(plan);
                     if (!single) {
                       count = op.agree_plan(plan);
                       op.post_header(header_of(view.first(count)));
                     }
                     members.assign(view.begin(), view.begin() + static_cast<ptrdiff_t>(count));
                     body(op, members);
                     return count;
                   });
    } else {
      run_numbered(provisional(), Op::HeaderMode::kDeferred, [&](Op& op) -> size_t {
        const FusionPlan plan = op.receive_plan();
        count = plan.count;
        if (plan.count > 1) {
          uint32_t takes = 0;
          op.wait_until([&] { return (takes = queue.can_take(plan.count, cls, first.work->ticket)) > 0; },
                        "this rank's own calls of the fused group rank 0 planned (issue them)");
          count = op.agree_plan(plan, takes);
        }
        members = queue.head(count);
        const size_t n = fusable_prefix(members, cls, fusion_bytes);
        if (n < count) {
          op.fail(ErrorCode::kMismatch,
                  fmt::format("mismatched collective calls: rank 0 fused calls #{}-#{} into one collective, but on "
                              "rank {} call #{} ({}) cannot travel with call #{} ({})",
                              seq, seq + count - 1, comm_.rank(), seq + n,
                              n < members.size() ? header_for(*members[n], seq + n).describe()
                                                 : std::string("not issued"),
                              seq, header_for(first, seq).describe()));
        }
        op.post_header(header_of(members));
        body(op, members);
        return count;
      });
    }
    advance_keys(members);
    comm_.stats_.ops += count;
    if (count > 1) comm_.stats_.fused_calls += count;
  } catch (...) {
    return Ran{std::max<size_t>(count, 1), std::current_exception()};  // the planned calls fail together
  }
  return Ran{count, nullptr};
}

namespace {

// A member's residual while the group runs: its slice of the group's.
float* residual_of(const Call& call, const CompressorSpec& spec) {
  if (!spec.ef || call.key == nullptr) return nullptr;
  KeyState& key = *call.key;
  take_back_from_device(key);  // the key's state was on a GPU (NCCL path)
  key.residual.resize(static_cast<size_t>(call.tensor.numel) * sizeof(float));  // zero-filled the first time
  return reinterpret_cast<float*>(key.residual.data());
}

}  // namespace

void CallRunner::run_fused(Op& op, std::span<Call* const> members, const FusionClass& cls) {
  const size_t elem = dtype_size(cls.dtype);
  const int64_t total = op.header().numel;
  std::vector<uint8_t>& buffer = fusion_buffer_;
  if (buffer.size() < static_cast<size_t>(total) * elem) buffer.resize(static_cast<size_t>(total) * elem);
  uint8_t* base = buffer.data();

  // Pack. Dense members that are compressed calls going dense fold their residual in (and clear it).
  {
    Op::PhaseTimer timer(op, &Stats::reduce_s);
    size_t at = 0;
    for (const Call* call : members) {
      std::memcpy(base + at, call->tensor.data, static_cast<size_t>(call->tensor.nbytes()));
      if (!cls.compressed) {
        if (float* residual = residual_of(*call, *call->spec)) {
          reduce_inplace(base + at, residual, call->tensor.numel, DType::kFloat32, ReduceOp::kSum);
          std::fill(residual, residual + call->tensor.numel, 0.0f);
        }
      }
      at += static_cast<size_t>(call->tensor.nbytes());
    }
  }

  if (!cls.compressed) {
    dense_allreduce(op, base, total, cls.dtype, cls.reduce_op);
  } else {
    // One state for the group: its residual is the members' side by side, its
    // random streams keyed by the members' digest (the same on every rank).
    KeyState group;
    group.step = op.header().step;
    group.numel = total;
    if (cls.spec->ef) {
      group.residual.resize(static_cast<size_t>(total) * sizeof(float));
      size_t at = 0;
      for (const Call* call : members) {
        if (const float* residual = residual_of(*call, *cls.spec)) {
          std::memcpy(group.residual.data() + at, residual, static_cast<size_t>(call->tensor.nbytes()));
        }
        at += static_cast<size_t>(call->tensor.nbytes());
      }
    }
    const uint64_t group_hash = (uint64_t{op.header().fused_digest} << 32) | op.header().fused;
    comm_.compression_.allreduce(op, reinterpret_cast<float*>(base), total, cls.reduce_op, *cls.spec, &group,
                                 group_hash);
    if (cls.spec->ef) {
      size_t at = 0;
      for (const Call* call : members) {
        if (float* residual = residual_of(*call, *cls.spec)) {
          std::memcpy(residual, group.residual.data() + at, static_cast<size_t>(call->tensor.nbytes()));
        }
        at += static_cast<size_t>(call->tensor.nbytes());
      }
    }
    // Each member's share of what the group sent, in its own index space.
    uint64_t first = 0;
    size_t j = 0;
    for (const Call* call : members) {
      const uint64_t end = first + static_cast<uint64_t>(call->tensor.numel);
      std::vector<uint64_t> sent;
      for (; j < group.sent.size() && group.sent[j] < end; ++j) sent.push_back(group.sent[j] - first);
      if (call->key != nullptr) call->key->sent = std::move(sent);
      first = end;
    }
  }

  // Unpack.
  Op::PhaseTimer timer(op, &Stats::reduce_s);
  size_t at = 0;
  for (const Call* call : members) {
    std::memcpy(call->tensor.data, base + at, static_cast<size_t>(call->tensor.nbytes()));
    at += static_cast<size_t>(call->tensor.nbytes());
  }
}

}  // namespace gradcomm::detail
