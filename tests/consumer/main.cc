// Averages a vector across the job's ranks and checks the result.
#include <gradcomm/gradcomm.h>

#include <cstdio>
#include <vector>

int main() {
  try {
    auto comm = gradcomm::Communicator::create();
    std::vector<float> x(1000, static_cast<float>(comm->rank() + 1));
    comm->allreduce(gradcomm::TensorView::of(x.data(), static_cast<int64_t>(x.size())), gradcomm::ReduceOp::kAvg);
    const float expected = (comm->size() + 1) / 2.0f;
    for (float v : x) {
      if (v != expected) {
        std::fprintf(stderr, "rank %d: got %f, expected %f\n", comm->rank(), v, expected);
        return 1;
      }
    }
    std::printf("consumer rank %d/%d: gradcomm %s ok\n", comm->rank(), comm->size(), GRADCOMM_VERSION_STRING);
    return 0;
  } catch (const gradcomm::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
