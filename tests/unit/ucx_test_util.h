// Helpers for the UCX transport tests (test_ucx_transport.cc, test_ucx_cma.cc): a
// file store that works across fork, ranks as threads (each its own transport) or
// as forked processes, and checkable message contents.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "env.h"
#include "store/store.h"
#include "transport/ucx/ucx_transport.h"

namespace gradcomm::detail::ucx_test {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// ---- test store: one file per key in a directory (works across fork) ----------

class FileStore final : public Store {
 public:
  explicit FileStore(fs::path dir) : dir_(std::move(dir)) {}
  void set(const std::string& key, std::span<const uint8_t> value) override {
    const fs::path tmp = dir_ / (file_name(key) + ".tmp." + std::to_string(getpid()) + "." +
                                 std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())));
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
    }
    fs::rename(tmp, dir_ / file_name(key));  // readers never see half a value
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    const Deadline deadline = Deadline::after(timeout);
    const fs::path path = dir_ / file_name(key);
    while (!fs::exists(path)) {
      if (deadline.expired()) throw TimeoutError("test store: no key " + key + " in " + address());
      std::this_thread::sleep_for(2ms);
    }
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  }
  int64_t add(const std::string& key, int64_t delta) override {
    const int lock = ::open((dir_ / "lock").c_str(), O_CREAT | O_RDWR, 0600);
    ::flock(lock, LOCK_EX);
    int64_t value = 0;
    if (fs::exists(dir_ / file_name(key))) {
      auto bytes = get(key, 0ms);
      value = std::stoll(std::string(bytes.begin(), bytes.end()));
    }
    value += delta;
    const std::string text = std::to_string(value);
    set(key, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    ::flock(lock, LOCK_UN);
    ::close(lock);
    return value;
  }
  std::string address() const override { return "testfile://" + dir_.string(); }

  // Convenience for the tests: text values.
  void set_text(const std::string& key, const std::string& text) {
    set(key, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }
  std::string get_text(const std::string& key, std::chrono::milliseconds timeout) {
    auto bytes = get(key, timeout);
    return std::string(bytes.begin(), bytes.end());
  }

 private:
  static std::string file_name(std::string key) {
    for (char& c : key) c = c == '/' ? '_' : c;
    return key;
  }
  fs::path dir_;
};

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "gradcomm-ucx-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

// ---- helpers --------------------------------------------------------------------

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The caller's loop the interface prescribes: progress, check, wait_for_event.
inline bool wait_until(Transport& t, const std::function<bool()>& done, std::chrono::milliseconds timeout = 60s) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    if (!t.progress()) t.wait_for_event(10ms);
  }
  return true;
}
inline bool wait_all(Transport& t, const std::vector<RequestPtr>& requests, std::chrono::milliseconds timeout = 60s) {
  return wait_until(
      t, [&] { return std::none_of(requests.begin(), requests.end(), [](auto& r) { return r->pending(); }); }, timeout);
}

// Byte i of the message rank `src` sends in round `round`: checkable, differs per source.
inline uint8_t pattern(int src, size_t round, size_t i) { return static_cast<uint8_t>(src * 131 + round * 17 + i * 7); }
inline std::vector<uint8_t> make_message(int src, size_t round, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = pattern(src, round, i);
  return out;
}
// Index of the first wrong byte, or -1.
inline int64_t first_mismatch(const std::vector<uint8_t>& got, int src, size_t round, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) {
    if (got[i] != pattern(src, round, i)) return static_cast<int64_t>(i);
  }
  return -1;
}

// A barrier that keeps progressing its transport while it waits, so peers that
// still need this rank's progress (rendezvous acks) can finish.
class ProgressBarrier {
 public:
  explicit ProgressBarrier(int n) : n_(n) {}
  void arrive_and_wait(Transport& t, int& calls) {
    ++calls;
    arrived_.fetch_add(1);
    EXPECT_TRUE(wait_until(t, [&] { return arrived_.load() >= n_ * calls; })) << "barrier timed out";
  }

 private:
  int n_;
  std::atomic<int> arrived_{0};
};

struct RankContext {
  int rank;
  int size;
  Transport& t;
  ProgressBarrier& barrier;
  int barrier_calls = 0;
  void sync() { barrier.arrive_and_wait(t, barrier_calls); }
};

// Runs `body` on `n` threads, each with its own UCX transport over one file store.
inline void run_ranks(int n, const std::function<void(RankContext&)>& body) {
  TempDir dir;
  ProgressBarrier barrier(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        FileStore store(dir.path);
        UcxOptions options;
        options.timeout = 30s;
        auto t = create_ucx_transport(r, n, store, options);
        RankContext ctx{r, n, *t, barrier};
        body(ctx);
        ctx.sync();  // nobody tears down while a peer may still need its progress
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << " threw: " << e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
}

// Every rank sends one message of `bytes` to every other rank and checks what it gets.
inline void all_to_all(RankContext& ctx, size_t round, size_t bytes) {
  const uint64_t tag = make_tag(TagKind::kData, round, 7);
  const std::vector<uint8_t> message = make_message(ctx.rank, round, bytes);
  std::vector<std::vector<uint8_t>> inbox(static_cast<size_t>(ctx.size));
  std::vector<RequestPtr> requests;
  for (int p = 0; p < ctx.size; ++p) {
    if (p == ctx.rank) continue;
    inbox[p].assign(bytes, 0xEE);
    requests.push_back(ctx.t.irecv(p, tag, inbox[p].data(), bytes));
    requests.push_back(ctx.t.isend(p, tag, message.data(), bytes));
  }
  ASSERT_TRUE(wait_all(ctx.t, requests)) << "rank " << ctx.rank << " timed out at " << bytes << " bytes";
  for (const auto& r : requests) {
    EXPECT_EQ(r->state(), RequestState::kDone) << r->error();
    EXPECT_EQ(r->bytes(), bytes);
  }
  for (int p = 0; p < ctx.size; ++p) {
    if (p == ctx.rank) continue;
    EXPECT_EQ(first_mismatch(inbox[p], p, round, bytes), -1) << "rank " << ctx.rank << " from " << p << ", " << bytes;
  }
}

inline void exchange_sizes(int world_size) {
  run_ranks(world_size, [](RankContext& ctx) {
    const size_t sizes[] = {0, 1, size_t{1} << 20, size_t{64} << 20};
    for (size_t i = 0; i < std::size(sizes); ++i) all_to_all(ctx, i, sizes[i]);
  });
}

// ---- fork helpers -------------------------------------------------------------------

// Forks one child per entry; each runs body(rank) and exits with its return value.
// Returns each child's wait status; kills children still running after `timeout`.
inline std::vector<int> run_processes(int n, const std::function<int(int)>& body, std::chrono::seconds timeout = 60s) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(static_cast<unsigned>(timeout.count()));  // a hung child dies rather than hanging the test
      int code = 100;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child rank %d threw: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> statuses(static_cast<size_t>(n), -1);
  const auto deadline = Clock::now() + timeout + 5s;
  for (int remaining = n; remaining > 0;) {
    for (int r = 0; r < n; ++r) {
      if (statuses[r] != -1) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        statuses[r] = status;
        --remaining;
      } else if (Clock::now() > deadline) {
        kill(pids[r], SIGKILL);
      }
    }
    std::this_thread::sleep_for(5ms);
  }
  return statuses;
}

inline std::string describe(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Child side: every pair exchanges one message both ways, so every endpoint is
// wired up (and watched by keepalive) before anyone dies.
inline bool warm_up(Transport& t) {
  std::vector<uint8_t> out(64, 1), in(static_cast<size_t>(t.size()) * 64);
  std::vector<RequestPtr> requests;
  for (int p = 0; p < t.size(); ++p) {
    if (p == t.rank()) continue;
    requests.push_back(t.irecv(p, make_tag(TagKind::kData, 0, 0), in.data() + p * 64, 64));
    requests.push_back(t.isend(p, make_tag(TagKind::kData, 0, 0), out.data(), 64));
  }
  if (!wait_all(t, requests, 30s)) return false;
  return std::all_of(requests.begin(), requests.end(), [](auto& r) { return r->state() == RequestState::kDone; });
}

inline int64_t now_ms();

// Child side: rank `rank` of `n` connects and wires up; rank `victim` then records
// when (key "died_at") and SIGKILLs itself. Null when the wire-up failed.
inline std::unique_ptr<Transport> connect_then_kill(FileStore& store, int rank, int n, int victim) {
  auto t = create_ucx_transport(rank, n, store, UcxOptions{});
  if (!warm_up(*t)) return nullptr;
  if (rank == victim) {
    store.set_text("died_at", std::to_string(now_ms()));  // steady clock: shared by processes on one host
    raise(SIGKILL);
  }
  return t;
}

// Whether process `pid` ended (a zombie or gone) within `limit`: a killed process keeps
// its memory until the kernel has torn it down, and a single-copy read before that
// still succeeds.
inline bool wait_until_dead(pid_t pid, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    if (!std::getline(stat, text)) return true;  // gone
    const size_t close = text.rfind(')');        // "pid (comm) S ...": the state follows the name
    if (close != std::string::npos && close + 2 < text.size() && (text[close + 2] == 'Z' || text[close + 2] == 'X')) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

inline int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace gradcomm::detail::ucx_test
