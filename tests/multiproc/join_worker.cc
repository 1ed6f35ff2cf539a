// Rank program for the rendezvous tests (test_multiproc_join.cc): how ranks come
// together, and how they fail to. Prints one "RESULT ..." line per rank.
//
//   join TIMEOUT_MS [P:rank=R | P:world=W]
//       create a communicator and allreduce once; the process whose RANK is P first
//       claims rank R, or world size W, instead of what the launcher gave it.
//       RESULT rank=.. ok=1 | RESULT rank=.. error=CODE elapsed_ms=.. message=...
//   recreate SKEW_MS GENERATIONS
//       create, allreduce, destroy, GENERATIONS times; rank 0 destroys each one
//       SKEW_MS after the others (it sleeps first), so they re-create before it has.
//   attack SHAPE
//       rank 0 joins (as "join", 20 s deadline); every other process writes SHAPE
//       (random|short|large|framed) where its rank's worker address belongs and exits.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "store/rendezvous.h"
#include "store/store.h"

using namespace gradcomm;
using Clock = std::chrono::steady_clock;

namespace {

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : -1;
}

int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

// Creates a communicator and allreduces rank + 1; reports either the sum or the error.
int join(InitOptions options) {
  const auto t0 = Clock::now();
  const int claimed = options.rank >= 0 ? options.rank : env_int("RANK");
  try {
    auto comm = Communicator::create(options);
    std::vector<int64_t> x(100, comm->rank() + 1);
    comm->allreduce(TensorView::of(x.data(), x.size()));
    const int64_t n = comm->size();
    const bool ok = x[0] == n * (n + 1) / 2 && x[99] == x[0];
    fmt::print("RESULT rank={} ok={} elapsed_ms={}\n", comm->rank(), ok ? 1 : 0, ms_since(t0));
    return ok ? 0 : 1;
  } catch (const Error& e) {
    fmt::print("RESULT rank={} error={} elapsed_ms={} message={}\n", claimed, error_code_name(e.code()),
               ms_since(t0), one_line(e.what()));
    return 10;
  }
}

int recreate(int skew_ms, int generations) {
  const int rank = env_int("RANK");
  int good = 0;
  for (int g = 1; g <= generations; ++g) {
    try {
      InitOptions options;
      options.timeout = std::chrono::seconds(20);
      auto comm = Communicator::create(options);
      std::vector<int64_t> x(1000, comm->rank() + g);
      comm->allreduce(TensorView::of(x.data(), x.size()));
      const int64_t n = comm->size();
      if (x[0] == n * (n - 1) / 2 + n * g && x[999] == x[0]) ++good;
      if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(skew_ms));
    } catch (const Error& e) {
      fmt::print("RESULT rank={} generation={} error={} message={}\n", rank, g, error_code_name(e.code()),
                 one_line(e.what()));
      return 10;
    }
  }
  fmt::print("RESULT rank={} generations={} ok={}\n", rank, good, good == generations ? 1 : 0);
  return good == generations ? 0 : 1;
}

// What an attacker might write where a worker address belongs.
std::vector<uint8_t> garbage(const std::string& shape) {
  std::mt19937 rng(1234);
  std::vector<uint8_t> bytes;
  if (shape == "random") bytes.resize(300);
  if (shape == "short") bytes.resize(3);
  if (shape == "large") bytes.resize(64 << 10);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  if (shape == "framed") {  // a well-formed frame under a key and token that are not the job's
    detail::RendezvousRecord record;
    record.rank = env_int("RANK");
    record.world_size = env_int("WORLD_SIZE");
    record.generation = 1;
    record.payload.assign(200, 0xab);
    bytes = detail::encode_rendezvous_record(record, "elsewhere", "not-the-token");
  }
  return bytes;
}

int attack(const std::string& shape) {
  const int rank = env_int("RANK");
  const char* token = std::getenv("GRADCOMM_JOB_TOKEN");
  detail::StoreOptions options;
  options.url = std::getenv("GRADCOMM_STORE");
  options.rank = rank;  // not 0: a client
  options.job_token = token ? token : "";
  options.timeout = std::chrono::seconds(20);
  auto store = detail::create_store(options);
  // Where rank `rank` of the job's first generation publishes its UCX worker address.
  store->set(fmt::format("gradcomm/g1/comm/ucx/addr/{}", rank), garbage(shape));
  fmt::print("RESULT rank={} attacked={}\n", rank, shape);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "join" && argc > 2) {
    InitOptions options;
    options.timeout = std::chrono::milliseconds(std::atoll(argv[2]));
    if (argc > 3) {  // "P:rank=R" or "P:world=W"
      const std::string change = argv[3];
      const int process = std::atoi(change.c_str());
      const auto eq = change.find('=');
      if (process == env_int("RANK") && eq != std::string::npos) {
        const int value = std::atoi(change.c_str() + eq + 1);
        if (change.find(":rank=") != std::string::npos) options.rank = value;
        if (change.find(":world=") != std::string::npos) options.world_size = value;
      }
    }
    return join(options);
  }
  if (mode == "recreate" && argc > 3) return recreate(std::atoi(argv[2]), std::atoi(argv[3]));
  if (mode == "attack" && argc > 2) {
    if (env_int("RANK") != 0) return attack(argv[2]);
    InitOptions options;
    options.timeout = std::chrono::seconds(20);
    return join(options);
  }
  fmt::print(stderr, "usage: gradcomm-test-join-worker join TIMEOUT_MS [P:rank=R|P:world=W] | recreate SKEW_MS N | "
             "attack random|short|large|framed\n");
  return 2;
}
