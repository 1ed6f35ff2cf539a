// Tensor fusion: small allreduces issued close together travel as one collective
// over one buffer (Horovod's "tensor fusion"), so a step's many small gradients
// pay the collective's fixed latency once.
//
// Which calls fuse. Consecutive allreduces of CPU tensors of at most
// GRADCOMM_FUSION_BYTES each, that agree on the op, the dtype and the way they
// travel: dense (compressor none, or a compressed call that goes dense this step:
// warm-up or min_numel), or compressed with one spec (same canonical text). A
// group holds at most GRADCOMM_FUSION_BYTES and 1024 calls, each key at most once
// and each byte of memory at most once (a call on an earlier member's tensor reads
// its result), and ends at the first call that does not fit.
//
// Who decides, and when. Every rank must run the same groups, so rank 0 plans
// and tells the others (FusionPlan, rank 0 -> every rank). Rank 0 closes a group
// when the next call cannot join, when the group is full, when any of its calls
// is waited on, or GRADCOMM_CYCLE_MS after its first call was issued (Horovod's
// cycle). A plan of several calls is then agreed (Op::agree_plan): each other
// rank replies with how many of them it can take, and the least runs. A rank
// takes fewer where its own calls cannot travel together: a local call
// (save_state, load_state, synchronize) or a call on a member's memory sits
// between them, or its caller waits on one of them and so will issue no more (a
// rank that skipped a call: the group's members then differ and the header check
// reports the mismatch at once, instead of a wait for a call that never comes).
// One call needs no agreement. Grouping follows rank 0's timing and the other
// ranks' program order; with GRADCOMM_FUSION_BYTES=0 nothing fuses and every call
// runs alone.
//
// What a fused group computes. Dense: the members' bytes side by side, one dense
// allreduce, copied back: each element equals the unfused call's within fp32
// reduction-order error (the ring's order depends on where an element falls).
// Compressed: error feedback stays per key: each member's residual is folded into
// its slice, the compressor runs once on the whole buffer (top-k selects across
// the members), and each slice of the new residual goes back to its key. Every
// rank computes bitwise the same bytes, as for unfused calls.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "call.h"
#include "wire.h"

namespace gradcomm::detail {

struct FusionConfig {
  int64_t bytes = 0;                      // per call and per group; 0 disables fusion
  std::chrono::microseconds cycle{1000};  // how long rank 0 keeps a group open for more calls
  // GRADCOMM_FUSION_BYTES (default 4M), GRADCOMM_CYCLE_MS (default 1, fractions allowed).
  static FusionConfig from_env();
};

// What calls must share to travel together.
struct FusionClass {
  bool compressed = false;
  ReduceOp reduce_op = ReduceOp::kSum;
  DType dtype = DType::kFloat32;
  const CompressorSpec* spec = nullptr;  // compressed only
  bool operator==(const FusionClass& o) const;
};

// The class of `call`, or nullopt when it never fuses (not an allreduce, a CUDA
// tensor, empty, larger than `limit` bytes, a spec whose result depends on the
// tensor's size: top-k/sketch with an absolute k, the sketch itself). Reads the
// key's step, so only the engine calls it, with every earlier call completed.
std::optional<FusionClass> fusion_class(const Call& call, int64_t limit);

// How many of `calls` (consecutive, the first of class `cls`) one group may hold.
size_t fusable_prefix(std::span<Call* const> calls, const FusionClass& cls, int64_t limit);

// Rank 0's decision, sent to every other rank before the group's header.
struct FusionPlan {
  static constexpr uint32_t kMagic = 0x31464347;  // "GCF1"
  static constexpr size_t kBytes = 16;
  uint64_t first_seq = 0;
  uint32_t count = 0;
  std::array<uint8_t, kBytes> serialize() const;
  static std::optional<FusionPlan> parse(const uint8_t* bytes, size_t size);
};

// The header of a group starting at call number `first_seq`.
WireHeader fused_header(std::span<Call* const> members, const FusionClass& cls, uint64_t first_seq);

}  // namespace gradcomm::detail
