// CompressedRingPlan (see nccl_compressed_plan.h): the CPU ring's segments, the
// unit schedule and the payload layout of the compressed ring on NCCL.
#include "collectives/nccl_compressed_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {
constexpr size_t kPayloadAlign = 16;  // every payload region starts 16-byte aligned (vector loads)
size_t round_up(size_t v) { return (v + kPayloadAlign - 1) / kPayloadAlign * kPayloadAlign; }
}  // namespace

CompressedRingPlan::CompressedRingPlan(int size, int rank, int64_t numel, int64_t align, int64_t chunk_elems,
                                       int max_chunks, const std::function<size_t(int64_t)>& encoded_bytes)
    : size_(size), rank_(rank), numel_(numel), align_(align) {
  if (size < 2 || rank < 0 || rank >= size || numel < 0 || align < 1 || max_chunks < 1) {
    throw InvalidArgument(fmt::format("compressed ring plan: bad arguments (size {}, rank {}, numel {}, align {}, "
                                      "max_chunks {}); expected size >= 2, 0 <= rank < size, numel >= 0, align >= 1",
                                      size, rank, numel, align, max_chunks));
  }
  const int64_t units_total = (numel + align - 1) / align;
  const int64_t max_seg = (units_total + size - 1) / size * align;
  const int64_t chunk = std::max<int64_t>(align, chunk_elems / align * align);
  chunks_ = std::clamp<int64_t>((max_seg + chunk - 1) / chunk, 1, max_chunks);
  rs_units_ = int64_t{size - 1} * chunks_;

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

int64_t CompressedRingPlan::segment_begin(int s) const {
  const int64_t units_total = (numel_ + align_ - 1) / align_;
  return std::min(numel_, units_total * s / size_ * align_);
}

std::pair<int64_t, int64_t> CompressedRingPlan::chunk(int s, int64_t j) const {
  const int64_t b = segment_begin(s), e = segment_begin(s + 1);
  const int64_t units = (e - b + align_ - 1) / align_;
  return {std::min(e, b + units * j / chunks_ * align_), std::min(e, b + units * (j + 1) / chunks_ * align_)};
}

// Reduce-scatter step k: send segment r-k, receive segment r-k-1 (which this rank
// adds to and sends at step k+1). Allgather step k: send segment r+1-k (the one
// this rank owns at k = 0), receive segment r-k.
std::pair<int64_t, int64_t> CompressedRingPlan::send_range(int64_t u) const {
  const bool rs = u < rs_units_;
  const int64_t k = (rs ? u : u - rs_units_) / chunks_;
  return chunk(rs ? wrap(rank_ - k) : wrap(rank_ + 1 - k), u % chunks_);
}

std::pair<int64_t, int64_t> CompressedRingPlan::recv_range(int64_t u) const {
  const bool rs = u < rs_units_;
  const int64_t k = (rs ? u : u - rs_units_) / chunks_;
  return chunk(rs ? wrap(rank_ - k - 1) : wrap(rank_ - k), u % chunks_);
}

size_t CompressedRingPlan::send_offset(int64_t u) const {
  return u < encoded_units() ? out_offset_[u] : recv_offset_[u - chunks_];
}

}  // namespace gradcomm::detail
