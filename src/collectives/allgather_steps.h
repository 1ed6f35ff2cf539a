// The allgather's steps for the ring driver (ring_driver.h): forward alone. Step k =
// 0..N-2: rank r sends block r-k to r+1 and receives block r-k-1 from r-1, straight into
// its place; every block is cut into C chunks, (step, chunk) is one unit, and a chunk
// goes on as unit u + C the moment it has arrived (recvCopySend). Blocks never overlap,
// so receives can be posted ahead with no staging, and nothing is computed. One class for
// the host ring (ring_allgather.cc) and the NCCL ones (nccl_allgather.cc,
// nccl_sparse_allgather.cc): the messages are ranges of one buffer wherever it lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "collectives/ring_driver.h"

namespace gradcomm::detail {

class AllgatherSteps {
 public:
  // Block s: counts[s] elements of `elem_bytes` at element offset offsets[s] of `base`.
  AllgatherSteps(uint8_t* base, std::vector<int64_t> offsets, std::vector<int64_t> counts, size_t elem_bytes,
                 int rank, int size, int64_t chunks)
      : base_(base), offsets_(std::move(offsets)), counts_(std::move(counts)), elem_(elem_bytes), rank_(rank),
        size_(size), chunks_(chunks) {}

  RingShape shape() const { return {chunks_, 0}; }
  int64_t units() const { return int64_t{size_ - 1} * chunks_; }

  RingMessage send_message(int64_t u) const { return chunk(wrap(rank_ - u / chunks_), u % chunks_); }
  RingMessage recv_message(int64_t u) const { return chunk(wrap(rank_ - u / chunks_ - 1), u % chunks_); }
  int64_t recv_overwrites(int64_t) const { return -1; }
  int64_t recv_reuses(int64_t) const { return -1; }
  bool absorbs(int64_t) const { return false; }
  void prepare(int64_t) {}
  void absorb(int64_t) {}

 private:
  int wrap(int64_t v) const { return static_cast<int>(((v % size_) + size_) % size_); }
  // Chunk j of block s: [len j / C, len (j + 1) / C) of its elements.
  RingMessage chunk(int s, int64_t j) const {
    const int64_t len = counts_[s];
    const int64_t b = offsets_[s] + len * j / chunks_, e = offsets_[s] + len * (j + 1) / chunks_;
    return {base_ + static_cast<size_t>(b) * elem_, static_cast<size_t>(e - b) * elem_};
  }

  uint8_t* base_;
  std::vector<int64_t> offsets_, counts_;
  size_t elem_;
  int rank_, size_;
  int64_t chunks_;
};

}  // namespace gradcomm::detail
