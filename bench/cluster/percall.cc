// percall: one dense allreduce per line, the time of each call on rank 0, for
// looking at the spread that gradcomm-bench's per-size mean hides.
//
//   g++ -std=c++20 -O2 bench/cluster/percall.cc -Iinclude -Lbuild -lgradcomm \
//       -Wl,-rpath,$PWD/build -o build/percall
//   PERCALL_NUMEL=67108864 PERCALL_ITERS=24 build/tools/gradcomm-run -n 2 build/percall
//
// Under bench/cluster/run.sh, point --build at a directory whose
// bench/gradcomm-bench is a script that runs it (the arguments are ignored and
// rank 0 prints to its log). Every call reduces the same input (all ones, refilled
// before the call), and the ranks are released together by a barrier.
#include <gradcomm/communicator.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main() {
  const char* numel_text = std::getenv("PERCALL_NUMEL");
  const char* iters_text = std::getenv("PERCALL_ITERS");
  const int64_t numel = numel_text ? std::atoll(numel_text) : int64_t{64} << 20;
  const int iters = iters_text ? std::atoi(iters_text) : 20;
  auto comm = gradcomm::Communicator::create();
  std::vector<float> data(static_cast<size_t>(numel));
  for (int i = 0; i < iters; ++i) {
    std::fill(data.begin(), data.end(), 1.0f);
    comm->barrier();
    const auto start = std::chrono::steady_clock::now();
    comm->allreduce(gradcomm::TensorView::of(data.data(), numel));
    const auto end = std::chrono::steady_clock::now();
    if (data[0] != static_cast<float>(comm->size())) {
      std::fprintf(stderr, "percall: wrong result %g on rank %d\n", data[0], comm->rank());
      return 1;
    }
    if (comm->rank() == 0) std::printf("%.1f\n", std::chrono::duration<double, std::milli>(end - start).count());
  }
}
