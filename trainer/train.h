// The training loop of gradcomm-train (train.cc): shards, steps, allreduce,
// evaluation, logs and checkpoints.
#pragma once

#include <functional>
#include <memory>

#include "gradcomm/communicator.h"
#include "trainer/backend.h"
#include "trainer/config.h"

namespace gradcomm::train {

// Makes the backend for --device; `max_batch` as make_cpu_backend takes it.
using BackendFactory = std::function<std::unique_ptr<Backend>(const MlpLayout& layout, int64_t max_batch, Device device)>;

// Runs the whole training described by `config` on `comm`. Throws gradcomm::Error
// (or std::exception) on failure; returns normally when every epoch is done.
// `make_backend` (tests): null makes make_cpu_backend's or make_cuda_backend's.
void run_training(const Config& config, Communicator& comm, const BackendFactory& make_backend = nullptr);

}  // namespace gradcomm::train
