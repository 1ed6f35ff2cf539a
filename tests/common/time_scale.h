// How much slower than a plain build this one runs: GRADCOMM_TEST_TIME_SCALE (default 1;
// scripts/test-sanitizers.sh sets it for TSan). Stretches waits and deadlines that only
// bound how long the machine takes, never ones a test is about.
#pragma once

#include <cstdlib>

namespace gradcomm::testing {

inline int time_scale() {
  const char* text = std::getenv("GRADCOMM_TEST_TIME_SCALE");
  const int scale = text != nullptr ? std::atoi(text) : 1;
  return scale >= 1 ? scale : 1;
}

}  // namespace gradcomm::testing
