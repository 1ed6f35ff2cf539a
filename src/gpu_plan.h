// Host-side planning for CUDA tensors, free of CUDA headers so it is built (and
// unit-tested) in every configuration:
//  - which path CUDA tensors take (NCCL, or pinned-host staging over UCX), from
//    the device identities every rank reports at the first CUDA call;
//  - the schedule of the stream-ordered NCCL ring allreduce (which bytes each
//    group moves, which reduce each group must wait for, which scratch slot and
//    event a unit uses);
//  - the chunks of the staged (UCX) dense allreduce.
// The GPU code (gpu_context.cc, collectives/nccl_*.cc, collectives/staging.cc)
// executes these plans; tests/unit/test_gpu_plan.cc executes them on the host.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>


namespace gradcomm::detail {

// ---- path choice ----------------------------------------------------------------

// What a rank reports at its first CUDA call (fixed-size record, exchanged with an
// allgather over the host transport). Rank 0's record also carries the NCCL unique
// id, so one exchange both decides the path and, when it is NCCL, bootstraps it.
struct GpuRankRecord {
  static constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
  static constexpr size_t kBytes = 16 + 4 + 4 + kUniqueIdBytes;
  std::array<uint8_t, 16> uuid{};  // cudaDeviceProp::uuid: identifies the physical GPU across processes
  int32_t device = 0;              // this rank's device index (for messages)
  uint32_t flags = 0;              // reserved, zero
  std::array<uint8_t, kUniqueIdBytes> unique_id{};  // rank 0 only; zeros elsewhere

  std::array<uint8_t, kBytes> serialize() const;
  static GpuRankRecord parse(std::span<const uint8_t> bytes);  // exactly kBytes; never fails otherwise
};

enum class GpuPath : uint8_t { kNccl, kStaging };

struct GpuPathChoice {
  GpuPath path = GpuPath::kStaging;
  std::string reason;  // for the info log line
};

// `preference`: "auto" (NCCL unless two ranks share a GPU: NCCL refuses two ranks
// on one device), "ucx" (always staging), "nccl" (NCCL; Unsupported, naming the
// ranks and the GPU, when two ranks share one). Deterministic in its inputs, so
// every rank, given the same records, decides the same. InvalidArgument for an
// unknown preference.
GpuPathChoice choose_gpu_path(const std::string& preference, const std::vector<GpuRankRecord>& ranks);

// "GPU-1a2b3c4d-..." as nvidia-smi prints it.
std::string format_gpu_uuid(const std::array<uint8_t, 16>& uuid);

// ---- staging chunks ---------------------------------------------------------------------

// [begin, end) element ranges of the staged dense allreduce: consecutive, covering
// [0, numel), each at most max(1, chunk_bytes / elem_bytes) elements. Chunk c uses
// pinned slot c % kStagingSlots: while chunk c crosses the network, chunk c+1 is
// being copied down and chunk c-1 up.
constexpr int kStagingSlots = 3;
std::vector<std::pair<int64_t, int64_t>> staging_chunks(int64_t numel, int64_t elem_bytes, int64_t chunk_bytes);

}  // namespace gradcomm::detail
