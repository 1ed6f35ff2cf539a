// The training loop of gradcomm-train (train.cc): shards, steps, allreduce,
// evaluation, logs and checkpoints.
#pragma once

#include "gradcomm/communicator.h"
#include "trainer/config.h"

namespace gradcomm::train {

// Runs the whole training described by `config` on `comm`. Throws gradcomm::Error
// (or std::exception) on failure; returns normally when every epoch is done.
void run_training(const Config& config, Communicator& comm);

}  // namespace gradcomm::train
