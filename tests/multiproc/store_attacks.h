// Hostile clients for the job's TCP store (GRADCOMM_STORE), used by the worker's
// "abuse" mode: each attack opens its own connection, misbehaves, and reports
// whether the store dropped it (EOF or reset within the deadline).
#pragma once

#include <string>
#include <vector>

namespace gradcomm::testing {

struct AttackResult {
  std::string name;
  bool dropped = false;
  std::string detail;
};

// host:port from "tcp://host:port"; the token from GRADCOMM_JOB_TOKEN. Waits for
// the store to come up (rank 0 may start serving after this rank runs).
std::vector<AttackResult> attack_store(const std::string& url, const std::string& token);

}  // namespace gradcomm::testing
