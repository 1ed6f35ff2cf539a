// INTERNAL looks into the compression state; see introspect.h.
#include "introspect.h"

#include <fmt/format.h>

#include <algorithm>

#include "comm_impl.h"
#include "device_path.h"
#include "engine.h"  // issuer_override
#include "compressors/family.h"
#include "compressors/spec.h"
#include "compressors/auto_spec.h"

namespace gradcomm::detail {

std::span<const float> residual_view(Communicator& comm, const std::string& key) {
  CompressionState& state = comm.impl().compression_state();
  std::lock_guard lock(comm.impl().issue_mutex());  // the map, not the residual (see introspect.h)
  const auto it = state.keys.find(key);
  if (it == state.keys.end() || it->second.residual.empty()) return {};
  const KeyState& k = it->second;
  if (k.residual.size() != static_cast<size_t>(k.numel) * sizeof(float)) {  // float32, whatever the key's dtype
    throw InvalidArgument(fmt::format("residual_view: key '{}' holds {} bytes of {} state for {} elements, "
                                      "expected float32",
                                      key, k.residual.size(), dtype_name(k.dtype), k.numel));
  }
  return {reinterpret_cast<const float*>(k.residual.data()), static_cast<size_t>(k.numel)};
}

AllreducePlan CommunicatorImpl::plan_allreduce(int64_t numel, const CompressOptions& options) {
  const std::string text = options.compressor.empty() ? "none" : options.compressor;
  CompressorSpec spec;
  uint64_t step = 0;
  std::lock_guard lock(issue_mutex_);
  const auto it = state_.keys.find(options.key);
  if (it != state_.keys.end()) step = it->second.step;
  if (is_auto_spec(text)) {
    // The key's current choice (its last call has completed: introspect.h); none
    // before its first call chose. A review at the next call may change it.
    const AutoSpec& parsed = auto_spec(text);
    const auto record = it != state_.keys.end() ? AutoRecord::parse(it->second.extra) : std::nullopt;
    if (!record || record->choice < 0 || static_cast<size_t>(record->choice) >= parsed.candidates.size() ||
        record->spec_hash != parsed.hash) {
      return AllreducePlan{};
    }
    spec = parsed.candidates[static_cast<size_t>(record->choice)];
  } else {
    spec = parse_compressor_spec(text);
  }
  AllreducePlan plan;
  // The compressed allreduce's own test (compressed_allreduce.h).
  const Collective collective = family_of(spec.id).collective;
  plan.compressed = !runs_dense(spec, step, numel);
  plan.sparse_with_feedback = spec.ef && (collective == Collective::kSparseSelection ||
                                          collective == Collective::kSharedIndices ||
                                          collective == Collective::kTableThenValues);
  return plan;
}

bool CommunicatorImpl::sent_mask(const std::string& key, TensorView mask, void* stream) {
  check_tensor(mask, "sent_mask", "mask");
  if (mask.dtype != DType::kFloat32) {
    throw InvalidArgument(fmt::format("rank {}: sent_mask: mask is {}, expected float32", rank(), dtype_name(mask.dtype)));
  }
  std::vector<float> host;
  {
    std::lock_guard lock(issue_mutex_);  // the map (the key's own fields: its last call has completed)
    const auto it = state_.keys.find(key);
    if (it == state_.keys.end()) return false;
    const KeyState& k = it->second;
    if (mask.numel != k.numel) {
      throw InvalidArgument(fmt::format("rank {}: sent_mask: mask has {} elements, key '{}' has {}", rank(),
                                        mask.numel, key, k.numel));
    }
    if (k.device != nullptr) {
      if (mask.device.type != DeviceType::kCuda) {
        throw InvalidArgument(fmt::format("rank {}: sent_mask: key '{}' keeps its state on the GPU; pass a mask in "
                                          "device memory",
                                          rank(), key));
      }
      return k.device->sent_mask(static_cast<float*>(mask.data), stream);
    }
    if (k.sent.empty()) return false;
    // Written in place for a host mask; for a device one (state kept on the host: CUDA
    // tensors on the staged path), built here and copied up below.
    const bool on_host = mask.device.type == DeviceType::kCpu;
    if (!on_host) host.resize(static_cast<size_t>(mask.numel));
    const std::span<float> out(on_host ? static_cast<float*>(mask.data) : host.data(), static_cast<size_t>(mask.numel));
    std::fill(out.begin(), out.end(), 1.0f);
    for (uint64_t i : k.sent) {
      if (i < out.size()) out[i] = 0.0f;
    }
    if (on_host) return true;
  }
  copy_to_device(host.data(), mask, stream);
  return true;
}

void forget_keys(Communicator& comm, std::span<const std::string> keys) {
  CompressionState& state = comm.impl().compression_state();
  // Callers insert keys under this lock, and save_state/load_state hold it while the
  // engine reads or replaces the map. The engine reaches a key only through a queued
  // call, and every call of these keys has completed (introspect.h): erasing their
  // nodes touches nothing it reads.
  std::lock_guard lock(comm.impl().issue_mutex());
  for (const std::string& key : keys) state.keys.erase(key);
  comm.impl().forget_auto_reports(keys);
}

int thread_issuer() { return this_thread_issuer(); }

IssueAs::IssueAs(int issuer) : previous_(issuer_override()) { issuer_override() = issuer; }
IssueAs::~IssueAs() { issuer_override() = previous_; }

void refuse_calls(Communicator& comm, const std::string& why) { comm.impl().refuse_calls(why); }

}  // namespace gradcomm::detail
