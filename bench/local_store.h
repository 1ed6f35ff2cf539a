// A store inside the process, for a one-rank run: the Communicator of a single
// rank starts no store server, so there is nothing to connect to, and nothing
// else would ever set a key this process waits for.
#pragma once

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <string>

#include "gradcomm/errors.h"
#include "store/store.h"

namespace gradcomm::bench {

class LocalStore final : public detail::Store {
 public:
  void set(const std::string& key, std::span<const uint8_t> value) override {
    std::lock_guard lock(mutex_);
    values_[key].assign(value.begin(), value.end());
  }
  // No other rank can set a missing key, so waiting for it would only end at the timeout.
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds) override {
    std::lock_guard lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) throw TimeoutError(fmt::format("one-rank store: key '{}' was never set", key));
    return it->second;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard lock(mutex_);
    auto& v = values_[key];
    int64_t n = (v.empty() ? 0 : std::stoll(std::string(v.begin(), v.end()))) + delta;
    std::string text = std::to_string(n);
    v.assign(text.begin(), text.end());
    return n;
  }
  std::string address() const override { return "local://"; }

 private:
  std::mutex mutex_;
  std::map<std::string, std::vector<uint8_t>> values_;
};

}  // namespace gradcomm::bench
