// Rank program for the non-blocking tests (test_multiproc_async.cc), started by
// gradcomm-run. Prints "RESULT key=value ..." lines the test parses.
//
//   fault10 KIND VICTIM TIMEOUT_MS   ten calls in flight on every rank, then the
//            victim fails: sigkill | sigstop (50 ms after issuing its first five) |
//            mismatch (its sixth call has another numel). Survivors wait on all ten
//            and report each wait's outcome and how long the waits took.
//   destroy10                        rank 0 issues ten calls and destroys its
//            communicator at once; the others wait on theirs.
//   starve SPEC BYTES REPS DIR       REPS times: every rank allreduces BYTES under
//            SPEC, then rank 0 blocks outside gradcomm (polling for files in DIR)
//            until every other rank has finished its call and said so with a
//            file. A rank that returned from a call must not leave its peers
//            without that call's last bytes while it blocks elsewhere.
//   linger SPEC BYTES REPS SLEEP_MS  REPS times: every rank allreduces BYTES under SPEC
//            (timed), then rank 0 sleeps SLEEP_MS outside gradcomm, then all meet in a
//            barrier. Each rank reports its slowest call: one that lasted about
//            SLEEP_MS waited on bytes rank 0 had left queued when it returned.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/gradcomm.h"

using namespace gradcomm;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Ten calls of mixed sizes and kinds: large dense (not fused), small dense (fused
// in groups), compressed with error feedback. A call issued after the
// communicator failed throws at once: its outcome is that error.
struct Calls {
  std::vector<std::vector<float>> data;
  std::vector<std::shared_ptr<Work>> works;  // null where the issue itself threw
  std::vector<std::string> issue_errors;
};

Calls issue_ten(Communicator& comm, int odd_call, int count = 10) {
  Calls c;
  for (int i = 0; i < count; ++i) {
    const int64_t numel = i % 3 == 0 ? (int64_t{3} << 19) : (i % 3 == 1 ? 1000 : 100003);
    c.data.emplace_back(static_cast<size_t>(numel), 1.0f + static_cast<float>(comm.rank()));
    const auto t = TensorView::of(c.data.back().data(), i == odd_call ? numel - 1 : numel);
    try {
      if (i % 3 == 2) {
        c.works.push_back(comm.allreduce_async(t, ReduceOp::kAvg, {"topk:ratio=0.01", fmt::format("k{}", i)}));
      } else {
        c.works.push_back(comm.allreduce_async(t, ReduceOp::kSum));
      }
      c.issue_errors.emplace_back();
    } catch (const Error& e) {
      c.works.push_back(nullptr);
      c.issue_errors.push_back(error_code_name(e.code()));
    }
  }
  return c;
}

// Waits on every call; prints each outcome (ok or the error's class) and the time
// from the first wait to the last outcome.
// Returns whether any call failed.
bool report_waits(int rank, Calls& c, const std::string& extra = "") {
  std::string outcomes;
  const auto start = Clock::now();
  double last = 0;
  std::string message;
  for (size_t i = 0; i < c.works.size(); ++i) {
    auto& work = c.works[i];
    if (!work) {
      outcomes += c.issue_errors[i] + ",";
      continue;
    }
    try {
      work->wait();
      outcomes += "ok,";
    } catch (const Error& e) {
      outcomes += fmt::format("{},", error_code_name(e.code()));
      if (message.empty()) message = e.what();
    }
    last = seconds_since(start);
  }
  fmt::print("RESULT rank={} outcomes={} waits_s={:.3f}{} message={}\n", rank, outcomes, last, extra, message);
  return outcomes.find("Error") != std::string::npos || outcomes.find("Failure") != std::string::npos ||
         outcomes.find("Argument") != std::string::npos;
}

// Survivors that saw the failure end with this code, so that gradcomm-run stops a
// victim that did not end by itself (a stopped process) after its grace period.
constexpr int kSawFailure = 10;

int run_fault10(std::unique_ptr<Communicator> comm, const std::string& kind, int victim) {
  const bool me = comm->rank() == victim;
  const bool dies = me && (kind == "sigkill" || kind == "sigstop");
  // The victim issues only five: the others' last five can never complete.
  Calls c = issue_ten(*comm, kind == "mismatch" && me ? 5 : -1, dies ? 5 : 10);
  if (dies) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fmt::print("RESULT dying rank={}\n", comm->rank());
    std::fflush(stdout);
    raise(kind == "sigkill" ? SIGKILL : SIGSTOP);
  }
  const bool failed = report_waits(comm->rank(), c);
  const int rank = comm->rank();
  const auto t0 = Clock::now();
  comm.reset();
  fmt::print("RESULT destroyed rank={} destroy_s={:.3f}\n", rank, seconds_since(t0));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the victim's exit is reaped first
  return failed ? kSawFailure : 0;
}

int run_destroy10(std::unique_ptr<Communicator> comm) {
  const int rank = comm->rank();
  if (rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Calls c = issue_ten(*comm, -1);
  if (rank == 0) {
    const auto t0 = Clock::now();
    comm.reset();
    report_waits(rank, c, fmt::format(" destroy_s={:.3f}", seconds_since(t0)));
    return 0;
  }
  return report_waits(rank, c) ? kSawFailure : 0;
}

bool exists(const std::string& path) { return std::filesystem::exists(path); }

// One rep of the starve and linger modes: fills x with this rank's values for `rep`, then
// allreduces it under `spec` (keyed `key` unless dense); returns the call's seconds.
double timed_allreduce(Communicator& comm, std::vector<float>& x, int rep, ReduceOp op, const std::string& spec,
                       const char* key) {
  const int r = comm.rank();
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7 + rep + r) % 23) - 11.0f;
  const auto t0 = Clock::now();
  comm.allreduce(TensorView::of(x.data(), static_cast<int64_t>(x.size())), op, {spec, spec == "none" ? "" : key});
  return seconds_since(t0);
}

int run_starve(Communicator& comm, const std::string& spec, int64_t bytes, int reps, const std::string& dir) {
  const int r = comm.rank(), n = comm.size();
  std::vector<float> x(static_cast<size_t>(bytes / 4));
  double slowest = 0;
  for (int rep = 0; rep < reps; ++rep) {
    slowest = std::max(slowest, timed_allreduce(comm, x, rep, ReduceOp::kAvg, spec, "starve"));
    if (r != 0) {
      std::ofstream(fmt::format("{}/rep{}.r{}", dir, rep, r)) << "done";
      continue;
    }
    // Rank 0 blocks outside gradcomm until every other rank has its call's result.
    const auto wait_start = Clock::now();
    for (int q = 1; q < n; ++q) {
      while (!exists(fmt::format("{}/rep{}.r{}", dir, rep, q))) {
        if (seconds_since(wait_start) > 30) {
          fmt::print("RESULT rank=0 starved rep={} waiting_for={}\n", rep, q);
          return 1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }
  fmt::print("RESULT rank={} reps={} slowest_call_s={:.3f}\n", r, reps, slowest);
  return 0;
}

int run_linger(Communicator& comm, const std::string& spec, int64_t bytes, int reps, int sleep_ms) {
  const int r = comm.rank();
  std::vector<float> x(static_cast<size_t>(bytes / 4));
  double slowest = 0;
  for (int rep = 0; rep < reps; ++rep) {
    slowest = std::max(slowest, timed_allreduce(comm, x, rep, ReduceOp::kSum, spec, "linger"));
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    comm.barrier();
  }
  fmt::print("RESULT rank={} reps={} slowest_call_s={:.3f}\n", r, reps, slowest);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    fmt::print(stderr, "usage: gradcomm-test-async-worker fault10 KIND VICTIM TIMEOUT_MS | destroy10 | "
                       "starve SPEC BYTES REPS DIR | linger SPEC BYTES REPS SLEEP_MS\n");
    return 2;
  }
  const std::string mode = argv[1];
  try {
    InitOptions options;
    if (mode == "fault10" && argc > 4) options.timeout = std::chrono::milliseconds(std::stoll(argv[4]));
    if (mode == "starve") options.timeout = std::chrono::seconds(20);
    if (mode == "linger") options.timeout = std::chrono::seconds(60);
    auto comm = Communicator::create(options);
    if (mode == "fault10" && argc > 4) return run_fault10(std::move(comm), argv[2], std::stoi(argv[3]));
    if (mode == "destroy10") return run_destroy10(std::move(comm));
    if (mode == "starve" && argc > 5) {
      return run_starve(*comm, argv[2], std::stoll(argv[3]), std::stoi(argv[4]), argv[5]);
    }
    if (mode == "linger" && argc > 5) {
      return run_linger(*comm, argv[2], std::stoll(argv[3]), std::stoi(argv[4]), std::stoi(argv[5]));
    }
  } catch (const Error& e) {
    fmt::print(stderr, "async worker: {}: {}\n", error_code_name(e.code()), e.what());
    fmt::print("RESULT error={} message={}\n", error_code_name(e.code()), e.what());
    return 1;
  }
  fmt::print(stderr, "async worker: unknown mode '{}'\n", mode);
  return 2;
}
