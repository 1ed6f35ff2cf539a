// Dissemination barrier (Hensgen, Finkel & Manber 1988): in round i rank r
// signals r + 2^i and waits for r - 2^i. After ceil(log2 N) rounds every rank has
// heard, directly or through others, from every rank that entered the barrier.
#include <vector>

#include "collectives/collectives.h"

namespace gradcomm::detail {

void dissemination_barrier(Op& op) {
  if (NodeShm* shm = op.node_shm()) return shm_barrier(op, *shm);
  const int n = op.size();
  const int r = op.rank();
  std::vector<RequestPtr> sends;
  uint32_t round = 0;
  for (int distance = 1; distance < n; distance *= 2, ++round) {
    sends.push_back(op.send((r + distance) % n, round, nullptr, 0));
    auto recv = op.recv((r - distance % n + n) % n, round, nullptr, 0);
    op.wait(*recv, "barrier round");
  }
  op.wait_all(sends, "barrier send");
}

}  // namespace gradcomm::detail
