#include "gpu_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "gradcomm/errors.h"

namespace gradcomm::detail {

// ---- path choice ----------------------------------------------------------------------

std::array<uint8_t, GpuRankRecord::kBytes> GpuRankRecord::serialize() const {
  std::array<uint8_t, kBytes> out{};
  uint8_t* p = out.data();
  std::memcpy(p, uuid.data(), uuid.size());
  p += uuid.size();
  for (int i = 0; i < 4; ++i) *p++ = static_cast<uint8_t>(static_cast<uint32_t>(device) >> (8 * i));
  for (int i = 0; i < 4; ++i) *p++ = static_cast<uint8_t>(flags >> (8 * i));
  std::memcpy(p, unique_id.data(), unique_id.size());
  return out;
}

GpuRankRecord GpuRankRecord::parse(std::span<const uint8_t> bytes) {
  if (bytes.size() != kBytes) {
    throw CorruptPayload(fmt::format("GPU setup record of {} bytes, expected {}", bytes.size(), kBytes));
  }
  GpuRankRecord r;
  const uint8_t* p = bytes.data();
  std::memcpy(r.uuid.data(), p, r.uuid.size());
  p += r.uuid.size();
  uint32_t device = 0;
  for (int i = 0; i < 4; ++i) device |= static_cast<uint32_t>(*p++) << (8 * i);
  r.device = static_cast<int32_t>(device);
  for (int i = 0; i < 4; ++i) r.flags |= static_cast<uint32_t>(*p++) << (8 * i);
  std::memcpy(r.unique_id.data(), p, r.unique_id.size());
  return r;
}

std::string format_gpu_uuid(const std::array<uint8_t, 16>& u) {
  std::string hex;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) hex += '-';
    hex += fmt::format("{:02x}", u[i]);
  }
  return "GPU-" + hex;
}

GpuPathChoice choose_gpu_path(const std::string& preference, const std::vector<GpuRankRecord>& ranks) {
  if (preference != "auto" && preference != "ucx" && preference != "nccl") {
    throw InvalidArgument(fmt::format("transport '{}' unknown; accepted: auto, ucx, nccl", preference));
  }
  if (preference == "ucx") {
    return {GpuPath::kStaging, "transport=ucx: CUDA tensors are staged through pinned host memory over UCX"};
  }
  // The first pair of ranks on one GPU, in rank order (so every rank names the same pair).
  for (size_t i = 0; i < ranks.size(); ++i) {
    for (size_t j = i + 1; j < ranks.size(); ++j) {
      if (ranks[i].uuid != ranks[j].uuid) continue;
      const std::string shared = fmt::format("ranks {} and {} share GPU {} (cuda:{} and cuda:{})", i, j,
                                             format_gpu_uuid(ranks[i].uuid), ranks[i].device, ranks[j].device);
      if (preference == "nccl") {
        throw Unsupported(fmt::format("transport=nccl: {}; NCCL needs one GPU per rank. Use transport=auto or ucx "
                                      "(CUDA tensors then go through pinned host memory over UCX), or give each "
                                      "rank its own GPU (CUDA_VISIBLE_DEVICES, LOCAL_RANK)",
                                      shared));
      }
      return {GpuPath::kStaging, shared + ": NCCL needs one GPU per rank, so CUDA tensors are staged through "
                                          "pinned host memory over UCX"};
    }
  }
  return {GpuPath::kNccl, fmt::format("every rank has its own GPU: CUDA tensors go over NCCL ({} rank{})",
                                      ranks.size(), ranks.size() == 1 ? "" : "s")};
}

// ---- staging chunks -------------------------------------------------------------------------

std::vector<std::pair<int64_t, int64_t>> staging_chunks(int64_t numel, int64_t elem_bytes, int64_t chunk_bytes) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t step = std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(elem_bytes, 1));
  for (int64_t b = 0; b < numel; b += step) out.emplace_back(b, std::min(numel, b + step));
  return out;
}

}  // namespace gradcomm::detail
