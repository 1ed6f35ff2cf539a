#include "fusion.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_set>

#include "compressors/family.h"
#include "compressors/spec.h"
#include "gradcomm/errors.h"

namespace gradcomm::detail {

namespace {
// Members of one group at most (the plan and the header carry the count).
constexpr size_t kMaxMembers = 1024;

int64_t call_bytes(const Call& call) { return call.tensor.nbytes(); }

// A compressed call that goes dense this step (warm-up, min_numel) is a dense
// call whose residual is folded in first (compressed_allreduce.h's rule).
bool goes_dense(const Call& call) {
  return runs_dense(*call.spec, call.key != nullptr ? call.key->step : 0, call.tensor.numel);
}

// Specs whose work scales with the elements, so one call over the members means
// the same thing as one call per member (each family says: Family::fusable).
bool fusable_spec(const CompressorSpec& spec) {
  const Family& family = family_of(spec.id);
  return family.fusable == nullptr || family.fusable(spec);
}
}  // namespace

FusionConfig FusionConfig::from_env() {
  FusionConfig config;
  // GRADCOMM_FUSION_BYTES: the largest call that fuses, and the most one group
  // holds. 4M: fusion buys one collective's latency per call it absorbs, and costs
  // a copy in and out of the buffer (and of the residuals), which outweighs that
  // latency for large tensors on CPU: 200 calls of 4 KB, 7-9x faster than unfused;
  // an MLP's six gradients with top-k, the same at 4M and 50-70 % slower at
  // Horovod's 128M (bench/results/fusion-2026-11-23.md). 0 turns fusion off.
  config.bytes = env_bytes("GRADCOMM_FUSION_BYTES", int64_t{4} << 20, 0, int64_t{1} << 40);
  // GRADCOMM_CYCLE_MS: how long rank 0 holds a group open for more calls after its
  // first one was issued (Horovod's HOROVOD_CYCLE_TIME and its default, 1 ms).
  if (auto text = env_string("GRADCOMM_CYCLE_MS")) {
    char* end = nullptr;
    const double ms = std::strtod(text->c_str(), &end);
    if (end == text->c_str() || *end != '\0' || !std::isfinite(ms) || ms < 0 || ms > 60'000) {
      throw InvalidArgument(fmt::format("GRADCOMM_CYCLE_MS='{}': expected milliseconds in [0, 60000]", *text));
    }
    config.cycle = std::chrono::microseconds(static_cast<int64_t>(std::llround(ms * 1000.0)));
  }
  return config;
}

bool FusionClass::operator==(const FusionClass& o) const {
  if (compressed != o.compressed || reduce_op != o.reduce_op || dtype != o.dtype) return false;
  return !compressed || spec == o.spec || spec->canonical() == o.spec->canonical();
}

std::optional<FusionClass> fusion_class(const Call& call, int64_t limit) {
  if (call.kind != Call::Kind::kAllreduce || call.tensor.device.type != DeviceType::kCpu) return std::nullopt;
  if (call.auto_spec != nullptr) return std::nullopt;  // its spec is chosen when it runs (auto_choice.h)
  if (call.tensor.numel == 0 || call_bytes(call) > limit) return std::nullopt;
  // A compressed float16/bfloat16 call runs alone, in float32 pieces (compression_16bit.cc):
  // the group's packing is float32's (its residuals side by side, folded in place).
  if (call.spec != nullptr && call.spec->id != CompressorId::kNone && call.tensor.dtype != DType::kFloat32) {
    return std::nullopt;
  }
  FusionClass cls;
  cls.reduce_op = call.reduce_op;
  cls.dtype = call.tensor.dtype;
  if (goes_dense(call)) return cls;
  if (!fusable_spec(*call.spec)) return std::nullopt;
  cls.compressed = true;
  cls.spec = call.spec;
  return cls;
}

size_t fusable_prefix(std::span<Call* const> calls, const FusionClass& cls, int64_t limit) {
  int64_t bytes = 0;
  std::unordered_set<const KeyState*> keys;
  std::map<uintptr_t, uintptr_t> ranges;  // start -> end of the members' tensors, disjoint
  size_t n = 0;
  for (; n < calls.size() && n < kMaxMembers; ++n) {
    const Call& call = *calls[n];
    const auto c = fusion_class(call, limit);
    if (!c || !(*c == cls) || bytes + call_bytes(call) > limit) break;
    if (call.key != nullptr && !keys.insert(call.key).second) break;  // a key's steps run one after another
    // A call on memory an earlier member uses reads that member's result: it must
    // run after it, not beside it.
    const auto start = reinterpret_cast<uintptr_t>(call.tensor.data);
    const uintptr_t end = start + static_cast<uintptr_t>(call_bytes(call));
    auto next = ranges.lower_bound(start);
    if (next != ranges.end() && next->first < end) break;
    if (next != ranges.begin() && std::prev(next)->second > start) break;
    ranges.emplace(start, end);
    bytes += call_bytes(call);
  }
  return n;
}

std::array<uint8_t, FusionPlan::kBytes> FusionPlan::serialize() const {
  std::array<uint8_t, kBytes> out{};
  std::memcpy(out.data(), &kMagic, 4);
  std::memcpy(out.data() + 4, &count, 4);
  std::memcpy(out.data() + 8, &first_seq, 8);
  return out;
}

std::optional<FusionPlan> FusionPlan::parse(const uint8_t* bytes, size_t size) {
  uint32_t magic = 0;
  FusionPlan plan;
  if (size != kBytes) return std::nullopt;
  std::memcpy(&magic, bytes, 4);
  std::memcpy(&plan.count, bytes + 4, 4);
  std::memcpy(&plan.first_seq, bytes + 8, 8);
  if (magic != kMagic || plan.count < 1 || plan.count > kMaxMembers) return std::nullopt;
  return plan;
}

WireHeader fused_header(std::span<Call* const> members, const FusionClass& cls, uint64_t first_seq) {
  WireHeader header;
  header.op = OpKind::kAllreduce;
  header.dtype = cls.dtype;
  header.reduce_op = cls.reduce_op;
  header.seq = first_seq;
  header.fused = static_cast<uint32_t>(members.size());
  header.compressor = cls.compressed ? cls.spec->canonical() : "none";
  header.compressor_hash = fnv1a32(header.compressor);
  std::string digest;
  for (const Call* call : members) {
    header.numel += call->tensor.numel;
    const uint64_t step = call->key != nullptr ? call->key->step : 0;
    digest += fmt::format("{}|{}|{}|{};", call->tensor.numel, call->key_name, call->spec->canonical(), step);
  }
  header.fused_digest = fnv1a32(digest);
  if (cls.compressed) header.step = members.front()->key != nullptr ? members.front()->key->step : 0;
  return header;
}

}  // namespace gradcomm::detail
