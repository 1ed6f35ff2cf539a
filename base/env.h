// Environment knobs, read and checked: tunables are declared next to their use with
// env_int/env_bytes/env_string, one variable each. (Launch settings, which also read
// InitOptions, are resolved a layer up: src/launch_config.h.)
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>


namespace gradcomm::detail {

// The process environment is one array that setenv may move while getenv reads it: every
// read and write of it by gradcomm holds this lock (ranks as threads of one process, a
// program's own threads), and so do the libraries' reads gradcomm starts (UCX's config read
// and init: transport/ucx). Recursive: a writer may read under it.
std::recursive_mutex& environment_mutex();
// Sets `name` to `value` unless it is set already (the user's value wins), under the lock.
void set_env_default(const char* name, const std::string& value);

// The variable's value, or nullopt when unset or empty (read under environment_mutex()).
std::optional<std::string> env_string(const char* name);
// Integer knob in [min, max]; InvalidArgument naming the variable on garbage or out of range.
int64_t env_int(const char* name, int64_t fallback, int64_t min, int64_t max);
// The same, nullopt when the variable is unset or empty.
std::optional<int64_t> env_int_if_set(const char* name, int64_t min, int64_t max);
// Byte-size knob: "4M", "256K", "1G" or plain bytes.
int64_t env_bytes(const char* name, int64_t fallback, int64_t min, int64_t max);
// Parses "8", "1K", "64M", "2G" (powers of 1024). nullopt on garbage.
std::optional<int64_t> parse_bytes(const std::string& text);

// Monotonic deadline.
using Clock = std::chrono::steady_clock;
struct Deadline {
  Clock::time_point at;
  static Deadline after(std::chrono::milliseconds d) { return {Clock::now() + d}; }
  bool expired() const { return Clock::now() >= at; }
  std::chrono::milliseconds remaining() const {
    auto r = std::chrono::duration_cast<std::chrono::milliseconds>(at - Clock::now());
    return r.count() > 0 ? r : std::chrono::milliseconds(0);
  }
};

}  // namespace gradcomm::detail
