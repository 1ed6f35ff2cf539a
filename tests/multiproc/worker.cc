// gradcomm-test-worker: one rank of a multi-process test, started by gradcomm-run.
// Uses only the public API (and the shared library), like a user program.
//
//   collectives              allreduce (sizes 0, 1, 1000003 x sum/avg/min/max x 5 dtypes),
//                            allgather, broadcast, barrier; results checked against closed
//                            form and, through a hash allgather, bitwise across ranks
//   fault KIND VICTIM TIMEOUT_MS SPEC SEED
//                            VICTIM fails (KIND: sigkill sigterm sigstop exit0 exit1 throw)
//                            a random moment into a loop of allreduces under SPEC, of 4M
//                            floats or GRADCOMM_FAULT_NUMEL (in an alloc_shared buffer with
//                            GRADCOMM_FAULT_SHARED=1)
//   mismatch numel|dtype|op|kind|empty   rank 1 calls something different (empty: no
//                            element, so no data to carry its header on the node's segment)
//   sequence skip|skip_last|barrier|compressor   rank 1 skips or changes one call
//   inline                   small calls on the caller's thread: complete on return, exact
//   compressed               every compressor spec, 3 steps each: finite, bitwise identical
//                            across ranks, topk = sum of each rank's own top-k, fp16 within rounding
//   abuse                    ranks >= 1 first attack the job's store (garbage, HTTP,
//                            wrong token, a 2^64-1 length), then all rendezvous and allreduce
//
// Every rank prints one "RESULT ..." line. Fault modes exit 10 once the expected
// error was seen (non-zero on purpose: gradcomm-run then ends the job), 1 otherwise.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <span>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gradcomm/gradcomm.h"
#include "common/closed_form.h"
#include "store_attacks.h"

using namespace gradcomm;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kExpectedError = 10;

int64_t epoch_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using gradcomm::testing::contribution;
using gradcomm::testing::store_average;
using gradcomm::testing::store_value;

// Counts checks and failures, naming each failure on stderr.
struct Checker {
  explicit Checker(int rank) : rank(rank) {}
  void operator()(bool ok, const std::string& what) {
    ++checks;
    if (!ok) {
      ++wrong;
      fmt::print(stderr, "rank {}: WRONG {}\n", rank, what);
    }
  }
  int rank, checks = 0, wrong = 0;
};

uint64_t fnv(const void* data, size_t bytes) {
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  return h;
}

// True when every rank's bytes hash the same.
bool same_on_every_rank(Communicator& comm, const void* data, size_t bytes) {
  uint64_t mine = fnv(data, bytes);
  std::vector<uint64_t> all(comm.size());
  comm.allgather(TensorView{&mine, 1, DType::kInt64, {}}, TensorView{all.data(), comm.size(), DType::kInt64, {}});
  for (uint64_t h : all) {
    if (h != mine) return false;
  }
  return true;
}

int run_collectives(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  Checker check(r);
  for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{1000003}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
        const size_t bytes = numel * dtype_size(dtype);
        std::vector<uint8_t> x(bytes), expected(bytes);
        for (int64_t i = 0; i < numel; ++i) {
          store_value(dtype, x.data(), i, contribution(r, i));
          double sum = 0, lo = 1e9, hi = -1e9;
          for (int s = 0; s < n; ++s) {
            sum += contribution(s, i);
            lo = std::min(lo, contribution(s, i));
            hi = std::max(hi, contribution(s, i));
          }
          if (op == ReduceOp::kAvg) {
            store_average(dtype, expected.data(), i, sum, n);
          } else {
            store_value(dtype, expected.data(), i, op == ReduceOp::kSum ? sum : op == ReduceOp::kMin ? lo : hi);
          }
        }
        comm.allreduce(TensorView{x.data(), numel, dtype, {}}, op);
        const std::string what = fmt::format("allreduce numel={} {} {}", numel, dtype_name(dtype), reduce_op_name(op));
        check(x == expected, what);
        check(same_on_every_rank(comm, x.data(), bytes), what + " bitwise across ranks");
      }
    }
    // allgather: rank s's block holds s*7 + i.
    std::vector<int32_t> in(numel), out(numel * n, -1);
    for (int64_t i = 0; i < numel; ++i) in[i] = r * 7 + static_cast<int32_t>(i);
    comm.allgather(TensorView::of(in.data(), numel), TensorView::of(out.data(), numel * n));
    bool ok = true;
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < numel; ++i) ok &= out[s * numel + i] == s * 7 + static_cast<int32_t>(i);
    }
    check(ok, fmt::format("allgather numel={}", numel));
    // broadcast from every root.
    for (int root = 0; root < n; ++root) {
      std::vector<double> b(numel, r == root ? 0.0 : -1.0);
      if (r == root) {
        for (int64_t i = 0; i < numel; ++i) b[i] = root + i * 0.5;
      }
      comm.broadcast(TensorView::of(b.data(), numel), root);
      bool same = true;
      for (int64_t i = 0; i < numel; ++i) same &= b[i] == root + i * 0.5;
      check(same, fmt::format("broadcast numel={} root={}", numel, root));
    }
    comm.barrier();
  }
  const Stats s = comm.stats();
  fmt::print("RESULT rank={} checks={} wrong={} ops={} sent={}\n", r, check.checks, check.wrong, s.ops, s.bytes_sent);
  return check.wrong == 0 ? 0 : 1;
}

// The fault matrix: every rank allreduces 4M floats (dense, or under SPEC) in a
// loop; the victim fails a random moment in, so it dies while the others are inside
// a collective waiting for it:
//   sigkill, sigterm, sigstop   raised from a second thread after a random delay
//                               (mid-call: the loop spends nearly all its time in calls)
//   exit0, exit1                std::exit from a second thread after a random delay
//   throw                       an exception out of a random iteration; main catches
//                               it, so the communicator is destroyed while the others
//                               are inside the call the victim never made
// Survivors report the error, check that the communicator now refuses every call
// with the original error, and time its destruction.
int run_fault(Communicator& comm, const std::string& kind, int victim, const std::string& spec, uint32_t seed) {
  const int r = comm.rank();
  std::mt19937 rng(seed);
  const int delay_ms = 150 + static_cast<int>(rng() % 450);
  const int throw_at = 1 + static_cast<int>(rng() % 4);
  const char* numel = std::getenv("GRADCOMM_FAULT_NUMEL");
  const size_t n = numel != nullptr ? std::stoull(numel) : size_t{4} << 20;
  // GRADCOMM_FAULT_SHARED=1: the loop's buffer comes from alloc_shared, so the node's ranks
  // read each other's buffers in place (allocated before the victim's clock starts).
  const char* shared_env = std::getenv("GRADCOMM_FAULT_SHARED");
  const bool shared = shared_env != nullptr && std::string(shared_env) == "1";
  SharedBuffer block = shared ? comm.alloc_shared(n * sizeof(float)) : SharedBuffer();
  if (shared && !block.shared()) {
    fmt::print("RESULT rank={} error=none message=alloc_shared gave plain memory\n", r);
    return 1;
  }
  std::vector<float> own(shared ? 0 : n);
  const std::span<float> x(shared ? static_cast<float*>(block.data()) : own.data(), n);
  if (r == victim && kind != "throw") {
    std::thread([kind, delay_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      fmt::print("RESULT rank_dying kind={} at_ms={}\n", kind, epoch_ms());
      std::fflush(stdout);
      if (kind == "sigkill") raise(SIGKILL);
      if (kind == "sigterm") raise(SIGTERM);
      if (kind == "sigstop") raise(SIGSTOP);
      std::exit(kind == "exit0" ? 0 : 1);
    }).detach();
  }
  const CompressOptions compress{spec, "grad", nullptr};
  auto start = Clock::now();
  int64_t call = 0;
  try {
    for (;; ++call) {
      if (r == victim && kind == "throw" && call == throw_at) {
        fmt::print("RESULT rank_dying kind=throw at_ms={}\n", epoch_ms());
        throw std::runtime_error(fmt::format("rank {}: injected failure before call {}", r, call));
      }
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7 + call + r) % 101) - 50.0f;
      start = Clock::now();
      comm.allreduce(TensorView::of(x.data(), static_cast<int64_t>(x.size())), ReduceOp::kAvg, compress);
    }
  } catch (const Error& e) {
    const double in_call = std::chrono::duration<double>(Clock::now() - start).count();
    const int64_t at_ms = epoch_ms();
    // Refused from now on, with the original error: an allreduce and a barrier.
    bool refused = true;
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        if (attempt == 0) {
          comm.allreduce(TensorView::of(x.data(), 16), ReduceOp::kSum);
        } else {
          comm.barrier();
        }
        refused = false;
      } catch (const Error& again) {
        refused &= again.code() == e.code() && std::string(again.what()).find(e.what()) != std::string::npos;
      }
    }
    fmt::print("RESULT rank={} error={} at_ms={} in_call_s={:.3f} calls={} refused={} message={}\n", r,
               error_code_name(e.code()), at_ms, in_call, call, refused ? 1 : 0, e.what());
    const bool expected = kind == "sigstop" ? e.code() == ErrorCode::kTimeout : e.code() == ErrorCode::kPeerFailure;
    return expected && refused ? kExpectedError : 1;
  }
}

int run_mismatch(Communicator& comm, const std::string& kind) {
  const bool odd = comm.rank() == 1;
  std::vector<float> x(1000, 1.0f), out(1000 * comm.size());
  try {
    TensorView t = TensorView::of(x.data(), kind == "numel" && odd ? 999 : kind == "empty" && odd ? 0 : 1000);
    if (kind == "dtype" && odd) t.dtype = DType::kInt32;
    if (kind == "kind" && odd) {
      comm.allgather(t, TensorView::of(out.data(), static_cast<int64_t>(out.size())));
    } else {
      comm.allreduce(t, kind == "op" && odd ? ReduceOp::kMax : ReduceOp::kSum);
    }
  } catch (const Error& e) {
    fmt::print("RESULT rank={} error={} message={}\n", comm.rank(), error_code_name(e.code()), e.what());
    return e.code() == ErrorCode::kMismatch ? kExpectedError : 1;
  }
  fmt::print("RESULT rank={} error=none\n", comm.rank());
  return 1;
}

// Small blocking calls on one host's segment run on the issuing thread (src/engine.h,
// "Calls on the caller's thread"): 300 rounds of a small allreduce (1 to 1024 floats,
// exact sum checked), a 64-byte broadcast from a rotating root and, every 10th, a barrier,
// each counted in Stats::inline_ops ("inline": how many did), and one small async
// allreduce, which queues (it returns at once: not counted). Every 50th round adds a
// 1 MiB allreduce (the engine's). Then the same again while a second thread keeps issuing
// local calls (synchronize), which queue on the engine: results only.
int run_inline(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  Checker check(r);
  int small = 0;
  const uint64_t inline_before = comm.stats().inline_ops;
  uint64_t inline_done = 0;
  const auto phase = [&](bool count) {
    for (int i = 0; i < 300; ++i) {
      const int64_t numel = 1 + (i * 37) % 1024;
      std::vector<float> x(numel);
      for (int64_t j = 0; j < numel; ++j) x[j] = static_cast<float>(contribution(r, j + i));
      comm.allreduce(TensorView::of(x.data(), numel));
      bool ok = true;
      for (int64_t j = 0; j < numel; ++j) {
        double sum = 0;
        for (int s = 0; s < n; ++s) sum += static_cast<float>(contribution(s, j + i));
        ok &= x[j] == static_cast<float>(sum);
      }
      check(ok, fmt::format("small allreduce {} of {} floats", i, numel));
      const int root = i % n;
      std::vector<int32_t> b(16, r == root ? 1000 * i + root : -1);
      comm.broadcast(TensorView::of(b.data(), 16), root);
      check(std::all_of(b.begin(), b.end(), [&](int32_t v) { return v == 1000 * i + root; }),
            fmt::format("broadcast {} from {}", i, root));
      small += count ? 2 : 0;
      if (i % 10 == 0) {
        comm.barrier();
        small += count ? 1 : 0;
      }
      std::vector<float> y(4, 1.0f);
      comm.allreduce_async(TensorView::of(y.data(), 4))->wait();
      check(std::all_of(y.begin(), y.end(), [&](float v) { return v == static_cast<float>(n); }),
            fmt::format("async allreduce {}", i));
      if (i % 50 == 0) {
        std::vector<int32_t> big(int64_t{1} << 18, r + 1);
        comm.allreduce(TensorView::of(big.data(), static_cast<int64_t>(big.size())));
        check(std::all_of(big.begin(), big.end(), [&](int32_t v) { return v == n * (n + 1) / 2; }),
              fmt::format("1 MiB allreduce at {}", i));
      }
    }
  };
  phase(true);
  inline_done = comm.stats().inline_ops - inline_before;
  std::atomic<bool> stop{false};
  std::thread local([&] {
    while (!stop.load()) comm.synchronize();
  });
  phase(false);
  stop = true;
  local.join();
  const Stats stats = comm.stats();
  fmt::print("RESULT rank={} small={} inline={} checks={} wrong={} shm_ops={}\n", r, small, inline_done, check.checks,
             check.wrong, stats.node_shm_ops);
  return check.wrong == 0 ? 0 : 1;
}

// A rank out of step in a sequence of four allreduces that alternate between two
// tensors, numel 1000 and 10 (as a model's layers do); calls are numbered from #1:
//   skip        rank 1 skips call #2 and goes on: its #2 is the others' #3
//   skip_last   rank 1 skips call #4 and waits (the others time out)
//   barrier     rank 1 calls barrier() as its #3, where the others allreduce
//   compressor  rank 1 uses topk for #3 where the others use qsgd (same key)
int run_sequence_mismatch(Communicator& comm, const std::string& kind) {
  const bool odd = comm.rank() == 1;
  std::vector<float> x(1000, 1.0f);
  try {
    for (int call = 1; call <= 4; ++call) {
      const auto t = TensorView::of(x.data(), call % 2 == 1 ? 1000 : 10);
      if (odd && kind == "skip" && call == 2) continue;
      if (odd && kind == "skip_last" && call == 4) {
        std::this_thread::sleep_for(std::chrono::seconds(4));  // past the others' 2 s deadline
        fmt::print("RESULT rank={} error=none skipped={}\n", comm.rank(), call);
        return kExpectedError;
      }
      if (odd && kind == "barrier" && call == 3) {
        comm.barrier();
        continue;
      }
      const char* spec = kind == "compressor" && call == 3 ? (odd ? "topk:ratio=0.1" : "qsgd") : "none";
      comm.allreduce(t, ReduceOp::kSum, CompressOptions{spec, "layer" + std::to_string(call % 2), nullptr});
    }
  } catch (const Error& e) {
    fmt::print("RESULT rank={} error={} message={}\n", comm.rank(), error_code_name(e.code()), e.what());
    return kExpectedError;
  }
  fmt::print("RESULT rank={} error=none\n", comm.rank());
  return 1;
}

std::vector<float> gradient(int rank, int64_t n, int step) {
  std::mt19937 rng(static_cast<uint32_t>(step * 7919 + rank));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> g(static_cast<size_t>(n));
  for (auto& v : g) v = dist(rng);
  return g;
}

int run_compressed(Communicator& comm) {
  static const char* kSpecs[] = {"fp16", "bf16", "topk:ratio=0.01", "topk:ratio=0.01,select=sample",
                                 "topk:ratio=0.01,algo=reduce_scatter", "topk:k=100,ef=0,values=fp32",
                                 "randomk:ratio=0.01", "qsgd", "quant:bits=8",
                                 "quant:bits=4,round=nearest", "quant:bits=2", "quant:bits=1", "sign",
                                 "sketch:ratio=0.01"};
  const int n = comm.size(), r = comm.rank();
  const int64_t numel = 100003;
  Checker check(r);
  for (const char* spec : kSpecs) {
    for (int step = 0; step < 3; ++step) {
      auto g = gradient(r, numel, step);
      comm.allreduce(TensorView::of(g.data(), numel), ReduceOp::kSum, CompressOptions{spec, spec, nullptr});
      const std::string what = fmt::format("{} step {}", spec, step);
      check(std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); }), what + " finite");
      check(same_on_every_rank(comm, g.data(), g.size() * sizeof(float)), what + " bitwise across ranks");
      // Over two levels (docs/two-levels.md) top-k selects once per node: its own reference
      // is tests/unit/test_two_level.cc's.
      const Topology& t = comm.topology();
      const bool two_levels = t.nodes > 1 && t.nodes < n && std::getenv("GRADCOMM_HIERARCHY") == nullptr;
      if (std::string(spec) == "topk:k=100,ef=0,values=fp32" && !two_levels) {
        // Each rank's own top-100 (ties to the lower index), summed in rank order.
        std::vector<float> expected(numel, 0.0f);
        for (int s = 0; s < n; ++s) {
          const auto gs = gradient(s, numel, step);
          std::vector<int64_t> order(numel);
          std::iota(order.begin(), order.end(), 0);
          std::partial_sort(order.begin(), order.begin() + 100, order.end(), [&](int64_t a, int64_t b) {
            return std::abs(gs[a]) != std::abs(gs[b]) ? std::abs(gs[a]) > std::abs(gs[b]) : a < b;
          });
          for (int j = 0; j < 100; ++j) expected[order[j]] += gs[order[j]];
        }
        check(g == expected, what + " equals the sum of each rank's top-k");
      }
      if (std::string(spec) == "fp16") {
        bool close = true;
        std::vector<std::vector<float>> all;
        for (int s = 0; s < n; ++s) all.push_back(gradient(s, numel, step));
        for (int64_t i = 0; i < numel; ++i) {
          double exact = 0, magnitude = 0;
          for (int s = 0; s < n; ++s) {
            exact += all[s][i];
            magnitude += std::abs(all[s][i]);
          }
          close &= std::abs(g[i] - exact) <= n * std::ldexp(magnitude, -11) + 1e-6;
        }
        check(close, what + " within fp16 rounding of the exact sum");
      }
    }
  }
  fmt::print("RESULT rank={} checks={} wrong={} sent={}\n", r, check.checks, check.wrong, comm.stats().bytes_sent);
  return check.wrong == 0 ? 0 : 1;
}

// Before joining, ranks >= 1 attack the store rank 0 is about to serve; every
// attack must be dropped, and the real ranks must still rendezvous and compute.
int run_abuse() {
  const char* rank = std::getenv("RANK");
  const bool attacker = rank != nullptr && std::string(rank) != "0";
  int dropped = 0, attacks = 0;
  if (attacker) {
    const char* url = std::getenv("GRADCOMM_STORE");
    const char* token = std::getenv("GRADCOMM_JOB_TOKEN");
    if (url == nullptr || token == nullptr) return 1;
    for (const auto& a : gradcomm::testing::attack_store(url, token)) {
      ++attacks;
      dropped += a.dropped;
      if (!a.dropped) fmt::print(stderr, "rank {}: attack {} was not dropped {}\n", rank, a.name, a.detail);
    }
  }
  auto comm = Communicator::create();
  std::vector<int64_t> x(1000, comm->rank() + 1);
  comm->allreduce(TensorView::of(x.data(), 1000));
  const int64_t n = comm->size();
  const bool ok = std::all_of(x.begin(), x.end(), [&](int64_t v) { return v == n * (n + 1) / 2; });
  fmt::print("RESULT rank={} attacks={} dropped={} allreduce_ok={}\n", comm->rank(), attacks, dropped, ok ? 1 : 0);
  return ok && dropped == attacks ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    fmt::print(stderr, "usage: gradcomm-test-worker collectives | compressed | fault KIND V TIMEOUT_MS SPEC SEED | mismatch KIND | sequence KIND | abuse\n");
    return 2;
  }
  const std::string mode = argv[1];
  try {
    if (mode == "abuse") return run_abuse();
    InitOptions options;
    if (mode == "fault" && argc > 4) options.timeout = std::chrono::milliseconds(std::stoll(argv[4]));
    if (mode == "sequence") options.timeout = std::chrono::seconds(2);
    auto comm = Communicator::create(options);
    if (mode == "collectives") return run_collectives(*comm);
    if (mode == "compressed") return run_compressed(*comm);
    if (mode == "fault" && argc > 6) {
      const int code = run_fault(*comm, argv[2], std::stoi(argv[3]), argv[5], static_cast<uint32_t>(std::stoul(argv[6])));
      // A failed communicator must be destroyed without hanging.
      const auto t0 = Clock::now();
      const int rank = comm->rank();
      comm.reset();
      fmt::print("RESULT destroyed rank={} destroy_ms={}\n", rank,
                 std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
      // gradcomm-run reports the first failure it reaps. Survivors end milliseconds
      // after the victim, possibly within one reaping sweep; lingering makes the
      // victim's exit unambiguously first.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      return code;
    }
    if (mode == "sequence" && argc > 2) return run_sequence_mismatch(*comm, argv[2]);
    if (mode == "mismatch" && argc > 2) return run_mismatch(*comm, argv[2]);
    if (mode == "inline") return run_inline(*comm);
  } catch (const Error& e) {
    fmt::print(stderr, "worker: {}: {}\n", error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::runtime_error& e) {
    // The fault matrix's injected exception, after the communicator was destroyed.
    fmt::print(stderr, "worker: {}\n", e.what());
    return 3;
  }
  fmt::print(stderr, "worker: unknown mode '{}'\n", mode);
  return 2;
}
