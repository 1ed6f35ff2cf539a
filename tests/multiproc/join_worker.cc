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
//   nofile VICTIM LIMIT
//       as "join 60000", but rank VICTIM first lowers its RLIMIT_NOFILE (soft and hard,
//       as `ulimit -n LIMIT` does) to LIMIT.
//   die VICTIM kill|abort
//       as "join 60000", but rank VICTIM joins the store as Communicator::create does
//       and, a second later, before publishing its worker address (where UCX's abort
//       strikes when it runs out of file descriptors), dies by SIGKILL or SIGABRT.
//   churn GENERATIONS [G,G,...]
//       create, allreduce, destroy, GENERATIONS times, with no pause; rank 0 checks
//       after each creation that the generation's keys are gone from the store
//       (retired), and prints "RSS rank=0 generation=G kb=K ms=T" at each listed G.
//   attack SHAPE
//       rank 0 joins (as "join", 20 s deadline); every other process writes SHAPE
//       (random|short|large|framed) where its rank's worker address belongs and exits.
#include <fmt/format.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "store/rendezvous.h"
#include "topology.h"
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

InitOptions within_a_minute() {
  InitOptions options;
  options.timeout = std::chrono::seconds(60);
  return options;
}

int nofile(int victim, int limit) {
  if (env_int("RANK") == victim) {
    const rlimit lowered{static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
    if (::setrlimit(RLIMIT_NOFILE, &lowered) != 0) return 2;
  }
  return join(within_a_minute());
}

int die(int victim, const std::string& how) {
  if (env_int("RANK") != victim) {
    const int code = join(within_a_minute());
    // gradcomm-run reports the first failure it reaps. The others fail within a
    // millisecond of the victim's death (rank 0's: its store goes with it), possibly in
    // the same reaping sweep; lingering makes the victim's exit unambiguously first (as
    // the fault matrix's worker does; 1 run in 5 here reported a survivor's code).
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    return code;
  }
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  const char* token = std::getenv("GRADCOMM_JOB_TOKEN");
  detail::StoreOptions options;
  options.url = std::getenv("GRADCOMM_STORE");
  options.rank = victim;
  options.world_size = env_int("WORLD_SIZE");
  options.job_token = token ? token : "";
  options.timeout = std::chrono::seconds(60);
  detail::RendezvousStore joined(detail::create_store(options), victim, options.world_size, options.job_token,
                                 victim == 0);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  // The default action, as UCX's abort gets it: ASan's own SIGABRT handler would
  // report and exit(1) instead of the process dying by the signal.
  ::signal(SIGABRT, SIG_DFL);
  ::raise(how == "abort" ? SIGABRT : SIGKILL);
  return 1;  // not reached
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

long rss_kb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmRSS:")) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// Whether `key` is absent from the job's store (read through a client of its own).
bool absent(detail::Store& store, const std::string& key) {
  try {
    store.get(key, std::chrono::milliseconds(0));
    return false;
  } catch (const TimeoutError&) {
    return true;
  }
}

int churn(int generations, const std::string& report_at) {
  const int rank = env_int("RANK");
  const int n = env_int("WORLD_SIZE");
  std::set<int> reports;
  std::istringstream list(report_at);
  for (std::string g; std::getline(list, g, ',');) reports.insert(std::atoi(g.c_str()));
  std::unique_ptr<detail::Store> store;  // rank 0's own look at the store
  if (rank == 0) {
    detail::StoreOptions options;
    options.url = std::getenv("GRADCOMM_STORE");
    options.rank = 0;  // the server this process serves (it starts with the first communicator)
    const char* token = std::getenv("GRADCOMM_JOB_TOKEN");
    options.job_token = token ? token : "";
    store = detail::create_store(options);
  }
  const auto t0 = Clock::now();
  int kept = 0;  // generations whose keys were still in the store after creation
  for (int g = 1; g <= generations; ++g) {
    try {
      auto comm = Communicator::create(within_a_minute());
      std::vector<int64_t> x(16, comm->rank() + g);
      comm->allreduce(TensorView::of(x.data(), x.size()));
      if (x[0] != int64_t{n} * (n - 1) / 2 + int64_t{n} * g) {
        fmt::print("RESULT rank={} generation={} wrong={}\n", rank, g, x[0]);
        return 1;
      }
      if (store) {
        for (int r = 0; r < n; ++r) {
          const bool gone = absent(*store, fmt::format("gradcomm/g{}/join/{}", g, r)) &&
                            absent(*store, fmt::format("gradcomm/g{}/comm/ucx/addr/{}", g, r));
          kept += gone ? 0 : 1;
        }
      }
    } catch (const Error& e) {
      fmt::print("RESULT rank={} generation={} error={} message={}\n", rank, g, error_code_name(e.code()),
                 one_line(e.what()));
      return 10;
    }
    if (rank == 0 && reports.contains(g)) {
      fmt::print("RSS rank=0 generation={} kb={} ms={}\n", g, rss_kb(), ms_since(t0));
    }
  }
  fmt::print("RESULT rank={} generations={} ok=1 kept={} elapsed_ms={}\n", rank, generations, kept, ms_since(t0));
  return kept == 0 ? 0 : 1;
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
  // A real rank publishes its node first (src/topology.h), which this one does as it
  // should, so that the garbage is read where a worker address belongs.
  const std::string node_key = fmt::format("gradcomm/g1/comm/node/{}", rank);
  detail::RendezvousRecord node;
  node.rank = rank;
  node.world_size = env_int("WORLD_SIZE");
  node.generation = 1;
  const std::string name = detail::this_node_name();  // rank 0's host: the same node
  node.payload.assign(name.begin(), name.end());
  store->set(node_key, detail::encode_rendezvous_record(node, node_key, options.job_token));
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
  if (mode == "nofile" && argc > 3) return nofile(std::atoi(argv[2]), std::atoi(argv[3]));
  if (mode == "die" && argc > 3) return die(std::atoi(argv[2]), argv[3]);
  if (mode == "churn" && argc > 2) return churn(std::atoi(argv[2]), argc > 3 ? argv[3] : "");
  if (mode == "attack" && argc > 2) {
    if (env_int("RANK") != 0) return attack(argv[2]);
    InitOptions options;
    options.timeout = std::chrono::seconds(20);
    return join(options);
  }
  fmt::print(stderr, "usage: gradcomm-test-join-worker join TIMEOUT_MS [P:rank=R|P:world=W] | recreate SKEW_MS N | "
             "nofile VICTIM LIMIT | die VICTIM kill|abort | churn N [G,G,...] | attack random|short|large|framed\n");
  return 2;
}
