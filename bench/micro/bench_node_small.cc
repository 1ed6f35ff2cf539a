// Where a small call's time goes on the node's segment (docs/shared-memory.md, "Small
// calls"): two processes on one anonymous shared mapping, each timing a loop of
//   flags      the floor of any exchange: each rank raises a counter on its own cache line
//              and waits for the other's (one line across each way per iteration);
//   allreduce  NodeCollectives::allreduce of COUNT floats, nothing around it (no Op, no
//              engine, no communicator: what the segment's protocol costs alone);
// and printing ns per iteration (rank 0's clock, median of ROUNDS rounds with min and max).
// Compare with gradcomm-bench's 8-byte allreduce (the whole call) and OpenMPI's in the
// same session: what lies between "allreduce" here and the whole call is the call's
// machinery, and between "flags" and "allreduce" the protocol's own work.
//
//   bench_node_small [COUNT=2] [ITERS=200000] [ROUNDS=5] [PIN=1]   (PIN: rank r on CPU r)
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "collectives/node_collectives.h"

namespace gradcomm::detail {
namespace {

constexpr size_t kSlotBytes = size_t{256} << 10;

struct alignas(64) Line {  // a flag on a cache line of its own
  std::atomic<uint64_t> value{0};
};
struct Shared {
  Line flag[2];
};

// Rank `rank`'s side of `iters` flag exchanges, from counter value `base`.
void flags(Shared* s, int rank, uint64_t base, int iters) {
  std::atomic<uint64_t>& mine = s->flag[rank].value;
  std::atomic<uint64_t>& theirs = s->flag[1 - rank].value;
  for (int i = 1; i <= iters; ++i) {
    mine.store(base + static_cast<uint64_t>(i), std::memory_order_release);
    while (theirs.load(std::memory_order_acquire) < base + static_cast<uint64_t>(i)) {
    }
  }
}

void allreduces(NodeCollectives& node, const NodeWait& wait, int count, int iters) {
  std::vector<float> data(static_cast<size_t>(count), 1.0f);
  for (int i = 0; i < iters; ++i) {
    node.allreduce(data.data(), count, DType::kFloat32, ReduceOp::kSum, 0x5eed, wait);
    data.assign(data.size(), 1.0f);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(int count, int iters, int rounds, bool pin) {
  const size_t bytes = node_segment_bytes(2, kSlotBytes);
  auto* segment = static_cast<uint8_t*>(
      ::mmap(nullptr, bytes + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (segment == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  init_node_segment(segment, 2, kSlotBytes);
  auto* shared = new (segment + bytes) Shared{};
  const pid_t child = ::fork();
  const int rank = child == 0 ? 1 : 0;
  if (pin) {  // rank r on CPU r: the same placement every run
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(rank, &set);
    ::sched_setaffinity(0, sizeof set, &set);
  }
  NodeCollectives node(segment, rank, 2, kSlotBytes);
  NodeWait wait;
  wait.poll = [](int) {};
  wait.disagree = [](int, std::span<const uint8_t>) { throw std::runtime_error("disagree"); };
  std::vector<double> flag_ns, allreduce_ns;
  uint64_t base = 0;
  for (int r = 0; r < rounds; ++r) {
    flags(shared, rank, base, 1000);  // warm, and start together
    base += 1000;
    auto t0 = std::chrono::steady_clock::now();
    flags(shared, rank, base, iters);
    base += static_cast<uint64_t>(iters);
    auto t1 = std::chrono::steady_clock::now();
    flag_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / iters);
    allreduces(node, wait, count, 1000);
    t0 = std::chrono::steady_clock::now();
    allreduces(node, wait, count, iters);
    t1 = std::chrono::steady_clock::now();
    allreduce_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / iters);
  }
  if (child == 0) std::_Exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  const auto show = [](const char* what, const std::vector<double>& v) {
    std::printf("%-10s %8.1f ns per iteration [%.1f-%.1f]\n", what, median(v), *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  };
  std::printf("# 2 processes, %d float(s), %d iterations x %d rounds\n", count, iters, rounds);
  show("flags", flag_ns);
  show("allreduce", allreduce_ns);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gradcomm::detail

int main(int argc, char** argv) {
  const int count = argc > 1 ? std::atoi(argv[1]) : 2;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200000;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  const bool pin = argc > 4 ? std::atoi(argv[4]) != 0 : true;
  return gradcomm::detail::run(count, iters, rounds, pin);
}
