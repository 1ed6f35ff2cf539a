// INTERNAL looks into the compression state; see introspect.h.
#include "introspect.h"

#include <fmt/format.h>

#include "comm_impl.h"
#include "compressors/spec.h"

namespace gradcomm::detail {

std::span<const float> residual_view(Communicator& comm, const std::string& key) {
  CompressionState& state = comm.impl().compression_state();
  std::lock_guard lock(comm.impl().issue_mutex());  // the map, not the residual (see introspect.h)
  const auto it = state.keys.find(key);
  if (it == state.keys.end() || it->second.residual.empty()) return {};
  const KeyState& k = it->second;
  if (k.dtype != DType::kFloat32 || k.residual.size() != static_cast<size_t>(k.numel) * sizeof(float)) {
    throw InvalidArgument(fmt::format("residual_view: key '{}' holds {} bytes of {} state for {} elements, "
                                      "expected float32",
                                      key, k.residual.size(), dtype_name(k.dtype), k.numel));
  }
  return {reinterpret_cast<const float*>(k.residual.data()), static_cast<size_t>(k.numel)};
}

std::vector<float> sent_mask(Communicator& comm, const std::string& key) {
  CompressionState& state = comm.impl().compression_state();
  std::lock_guard lock(comm.impl().issue_mutex());  // the map (see introspect.h)
  const auto it = state.keys.find(key);
  if (it == state.keys.end() || it->second.device != nullptr || it->second.step == 0) return {};
  const KeyState& k = it->second;
  std::vector<float> mask(static_cast<size_t>(k.numel), 1.0f);
  for (uint64_t i : k.sent) {
    if (i < mask.size()) mask[i] = 0.0f;
  }
  return mask;
}

NextAllreduce next_allreduce(Communicator& comm, const std::string& spec_text, const std::string& key,
                             int64_t numel) {
  const CompressorSpec spec = parse_compressor_spec(spec_text.empty() ? "none" : spec_text);
  uint64_t step = 0;
  const CompressionState& state = comm.impl().compression_state();
  std::lock_guard lock(comm.impl().issue_mutex());
  if (const auto it = state.keys.find(key); it != state.keys.end()) step = it->second.step;
  NextAllreduce next;
  // The same tests, in the same order, as CompressionEngine::allreduce.
  next.dense = spec.id == CompressorId::kNone || step < static_cast<uint64_t>(spec.warmup) || numel < spec.min_numel;
  next.sparsifier_with_ef = spec.ef && (spec.id == CompressorId::kTopk || spec.id == CompressorId::kRandomk ||
                                        spec.id == CompressorId::kSketch);
  return next;
}

void forget_keys(Communicator& comm, std::span<const std::string> keys) {
  CompressionState& state = comm.impl().compression_state();
  // Callers insert keys under this lock, and save_state/load_state hold it while the
  // engine reads or replaces the map. The engine reaches a key only through a queued
  // call, and every call of these keys has completed (introspect.h): erasing their
  // nodes touches nothing it reads.
  std::lock_guard lock(comm.impl().issue_mutex());
  for (const std::string& key : keys) state.keys.erase(key);
}

}  // namespace gradcomm::detail
