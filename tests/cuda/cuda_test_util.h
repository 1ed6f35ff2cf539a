// Shared by the CUDA tests: they skip, with the reason, on machines without a GPU.
#pragma once

#include <gtest/gtest.h>

#include "cuda/device.h"

#define SKIP_WITHOUT_CUDA_DEVICE()                                                 \
  do {                                                                             \
    if (cuda_device_count() == 0) {                                                \
      GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();             \
    }                                                                              \
  } while (0)
