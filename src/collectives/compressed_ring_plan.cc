// CompressedRingPlan (see compressed_ring_plan.h): the compressed ring's segments,
// unit schedule and payload layout, for the CPU and the NCCL ring alike.
#include "collectives/compressed_ring_plan.h"

#include <fmt/format.h>

#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {
constexpr size_t kPayloadAlign = 16;  // every payload region starts 16-byte aligned (vector loads)
size_t round_up(size_t v) { return (v + kPayloadAlign - 1) / kPayloadAlign * kPayloadAlign; }

// The schedule, once the arguments are known to be good (RingSchedule checks nothing).
RingSchedule checked_schedule(int size, int rank, int64_t numel, int64_t align, int64_t chunk_elems, int max_chunks) {
  if (size < 2 || rank < 0 || rank >= size || numel < 0 || align < 1 || max_chunks < 1) {
    throw InvalidArgument(fmt::format("compressed ring plan: bad arguments (size {}, rank {}, numel {}, align {}, "
                                      "max_chunks {}); expected size >= 2, 0 <= rank < size, numel >= 0, align >= 1",
                                      size, rank, numel, align, max_chunks));
  }
  return RingSchedule(size, rank, numel, align, chunk_elems, max_chunks);
}
}  // namespace

CompressedRingPlan::CompressedRingPlan(int size, int rank, int64_t numel, int64_t align, int64_t chunk_elems,
                                       int max_chunks, const std::function<size_t(int64_t)>& encoded_bytes)
    : schedule_(checked_schedule(size, rank, numel, align, chunk_elems, max_chunks)) {
  const int64_t total = units();
  out_offset_.assign(static_cast<size_t>(encoded_units()), 0);
  send_bytes_.assign(static_cast<size_t>(total), 0);
  recv_offset_.assign(static_cast<size_t>(total), 0);
  recv_bytes_.assign(static_cast<size_t>(total), 0);
  size_t at = 0;
  for (int64_t u = 0; u < total; ++u) {
    const auto [sb, se] = send_range(u);
    const auto [rb, re] = recv_range(u);
    send_bytes_[u] = encoded_bytes(se - sb);
    recv_bytes_[u] = encoded_bytes(re - rb);
    if (u < encoded_units()) {
      out_offset_[u] = at;
      at += round_up(send_bytes_[u]);
    }
    recv_offset_[u] = at;
    at += round_up(recv_bytes_[u]);
  }
  buffer_bytes_ = at;
}

size_t CompressedRingPlan::send_offset(int64_t u) const {
  return u < encoded_units() ? out_offset_[u] : recv_offset_[u - chunks()];
}

}  // namespace gradcomm::detail
