// Ring allgather of variable-size blocks (allgather is the equal-size case).
//
// Step k = 0..N-2: rank r sends block r-k to r+1 and receives block r-k-1 from
// r-1, straight into its place in the output. After N-1 steps every rank holds
// every block; each rank sends (N-1)/N of the output, the lower bound.
//
// The ring driver (ring_driver.h) with the allgather's forward steps
// (allgather_steps.h) over the host channel: every block is cut into C chunks, and a
// chunk is forwarded as unit u+C the moment it arrives.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "collectives/allgather_steps.h"
#include "collectives/collectives.h"
#include "collectives/host_ring_channel.h"

namespace gradcomm::detail {

void ring_allgatherv(Op& op, uint8_t* out, const std::vector<int64_t>& counts, size_t elem_bytes,
                     uint32_t unit_base) {
  if (NodeShm* shm = op.node_shm()) return shm_allgatherv(op, *shm, out, counts, elem_bytes);
  const int n = op.size();
  std::vector<int64_t> offsets(n, 0);  // element offset of block s
  std::partial_sum(counts.begin(), counts.end() - 1, offsets.begin() + 1);
  const int64_t max_count = *std::max_element(counts.begin(), counts.end());
  const int64_t chunk_elems = std::max<int64_t>(1, chunk_bytes() / static_cast<int64_t>(elem_bytes));
  const int64_t max_chunks = (int64_t{1} << 30) / (n - 1);  // units fit below the second-phase tags
  const int64_t C = std::clamp<int64_t>((max_count + chunk_elems - 1) / chunk_elems, 1, max_chunks);
  AllgatherSteps steps(out, std::move(offsets), counts, elem_bytes, op.rank(), n, C);
  HostRingChannel channel(op, steps.shape(), steps.units(), pipeline_depth(), unit_base, "allgather receive",
                          "allgather receive");
  drive_ring(steps.shape(), steps.units(), channel, steps);
}

}  // namespace gradcomm::detail

namespace gradcomm::detail {

std::vector<uint8_t> ring_allgatherv_bytes(Op& op, std::span<const uint8_t> mine, std::vector<int64_t>& sizes) {
  const int n = op.size();
  const int r = op.rank();
  sizes.assign(n, 0);
  sizes[r] = static_cast<int64_t>(mine.size());
  if (n > 1) {
    ring_allgatherv(op, reinterpret_cast<uint8_t*>(sizes.data()), std::vector<int64_t>(n, 1), sizeof(int64_t),
                    /*unit_base=*/0);
  }
  // Sizes come from other processes: refuse what cannot be a real payload.
  int64_t total = 0;
  if (auto problem = check_block_sizes(sizes, total)) op.fail(ErrorCode::kCorruptPayload, *problem);
  int64_t offset = 0;
  for (int s = 0; s < r; ++s) offset += sizes[s];
  std::vector<uint8_t> out(static_cast<size_t>(total));
  if (!mine.empty()) std::memcpy(out.data() + offset, mine.data(), mine.size());
  if (n > 1 && total > 0) ring_allgatherv(op, out.data(), sizes, 1, kSecondPhaseUnits);
  return out;
}

}  // namespace gradcomm::detail
