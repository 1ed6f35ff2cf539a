// Ring allgather of variable-size blocks (allgather is the equal-size case).
//
// Step k = 0..N-2: rank r sends block r-k to r+1 and receives block r-k-1 from
// r-1, straight into its place in the output. After N-1 steps every rank holds
// every block; each rank sends (N-1)/N of the output, the lower bound.
//
// As in the ring allreduce, every block is cut into C chunks, (step, chunk) is
// one message ("unit" u = step*C + chunk) and a chunk is forwarded as unit u+C
// the moment it arrives. Blocks never overlap, so receives can be posted ahead
// with no staging.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "collectives/collectives.h"

namespace gradcomm::detail {

void ring_allgatherv(Op& op, uint8_t* out, const std::vector<int64_t>& counts, size_t elem_bytes,
                     uint32_t unit_base) {
  const int n = op.size();
  const int r = op.rank();
  const int right = (r + 1) % n;
  const int left = (r + n - 1) % n;
  auto wrap = [n](int64_t v) { return static_cast<int>(((v % n) + n) % n); };

  std::vector<int64_t> offsets(n + 1, 0);  // element offset of block s
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  const int64_t max_count = *std::max_element(counts.begin(), counts.end());
  const int64_t chunk_elems = std::max<int64_t>(1, chunk_bytes() / static_cast<int64_t>(elem_bytes));
  const int depth = pipeline_depth();
  const int64_t max_chunks = (int64_t{1} << 30) / (n - 1);
  const int64_t C = std::clamp<int64_t>((max_count + chunk_elems - 1) / chunk_elems, 1, max_chunks);
  const int64_t total_units = int64_t{n - 1} * C;

  // Byte range of chunk j of block s.
  auto chunk = [&](int s, int64_t j) {
    const int64_t len = counts[s];
    const int64_t b = offsets[s] + len * j / C;
    const int64_t e = offsets[s] + len * (j + 1) / C;
    return std::pair<size_t, size_t>(static_cast<size_t>(b) * elem_bytes, static_cast<size_t>(e - b) * elem_bytes);
  };
  // Unit u (step k, chunk j) sends block r-k and receives block r-k-1.
  auto send_unit = [&](int64_t u) {
    const auto [at, bytes] = chunk(wrap(r - u / C), u % C);
    return op.send(right, unit_base + static_cast<uint32_t>(u), out + at, bytes);
  };

  std::vector<RequestPtr> sends, recvs(total_units);
  sends.reserve(total_units);
  int64_t posted = 0;
  auto post_until = [&](int64_t limit) {
    for (limit = std::min(limit, total_units); posted < limit; ++posted) {
      const auto [at, bytes] = chunk(wrap(r - posted / C - 1), posted % C);
      recvs[posted] = op.recv(left, unit_base + static_cast<uint32_t>(posted), out + at, bytes);
    }
  };

  for (int64_t j = 0; j < C; ++j) sends.push_back(send_unit(j));  // step 0: our own block
  for (int64_t u = 0; u < total_units; ++u) {
    post_until(u + depth);
    op.wait(*recvs[u], "allgather receive");
    recvs[u].reset();
    if (u + C < total_units) sends.push_back(send_unit(u + C));  // recvCopySend
  }
  op.wait_all(sends, "allgather send");
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
