// Pipelined chain broadcast. The ranks form a chain starting at the root and
// following the ring (root, root+1, ..., root-1); each rank receives chunk j from
// its predecessor and passes it on to its successor right away, so the time is
// about (N-1 + C) chunk transfers for C chunks instead of (N-1)·C.
//
// Mismatches: the call headers are checked pairwise around the ring, so all
// ranks agree once every rank's check passed. In a chain a rank's data depends
// only on its predecessors, so without more a rank before a disagreeing pair
// could return while the ranks after it raise MismatchError. Hence the root checks
// its header before its data leaves, and the end of the chain, having received
// everything (so every rank before it passed its check), tells every other rank
// it is done; each rank returns only after that word (or raises the abort that
// the rank that found a mismatch sent instead). Cost: one small message latency.
#include <algorithm>
#include <vector>

#include "collectives/collectives.h"

namespace gradcomm::detail {

void chain_broadcast(Op& op, void* data, int64_t bytes, int root) {
  if (NodeShm* shm = op.node_shm()) return shm_broadcast(op, *shm, data, bytes, root);
  const int n = op.size();
  const int r = op.rank();
  const int position = (r - root + n) % n;  // 0 = root, n-1 = end of the chain
  const bool receives = position > 0;
  const bool forwards = position < n - 1;
  const int right = (r + 1) % n;
  const int left = (r + n - 1) % n;
  auto* base = static_cast<uint8_t*>(data);

  const int64_t chunk = chunk_bytes();
  const int depth = pipeline_depth();
  const int64_t C = std::max<int64_t>(1, (bytes + chunk - 1) / chunk);
  auto range = [&](int64_t j) {
    const int64_t b = bytes * j / C;
    return std::pair<uint8_t*, size_t>(base + b, static_cast<size_t>(bytes * (j + 1) / C - b));
  };

  std::vector<RequestPtr> sends, recvs(receives ? C : 0);
  int64_t posted = 0;
  auto post_until = [&](int64_t limit) {
    for (limit = std::min(limit, C); receives && posted < limit; ++posted) {
      const auto [at, len] = range(posted);
      recvs[posted] = op.recv(left, static_cast<uint32_t>(posted), at, len);
    }
  };

  if (!receives) op.confirm_header();  // the root: nothing leaves before its check
  constexpr uint32_t kDoneUnit = 0x7FFFFFFF;  // below the pipeline units' range
  uint8_t done_word = 1;
  RequestPtr done = position < n - 1 ? op.recv((root + n - 1) % n, kDoneUnit, &done_word, 1) : nullptr;

  for (int64_t j = 0; j < C; ++j) {
    if (receives) {
      post_until(j + depth);
      op.wait(*recvs[j], "broadcast receive");
      recvs[j].reset();
    }
    if (forwards) {
      const auto [at, len] = range(j);
      sends.push_back(op.send(right, static_cast<uint32_t>(j), at, len));
    }
  }
  op.wait_all(sends, "broadcast send");
  if (done) {
    op.wait(*done, "broadcast completion from the end of the chain");
  } else {
    std::vector<RequestPtr> dones;
    for (int peer = 0; peer < n; ++peer) {
      if (peer != r) dones.push_back(op.send(peer, kDoneUnit, &done_word, 1));
    }
    op.wait_all(dones, "broadcast completion");
  }
}

}  // namespace gradcomm::detail
