#include "c10d_store.h"

#include <fmt/format.h>

#include "gradcomm/errors.h"
#include "store/poll.h"

namespace gradcomm::torch_backend {
namespace {

constexpr const char* kPrefix = "gradcomm/";

// A store call's failure as a gradcomm error naming the call and the key. (Keys are
// polled with check(), so an expired deadline is ours, never the store's.)
[[noreturn]] void rethrow(const std::exception& e, const std::string& address, const char* what,
                          const std::string& key) {
  // c10::Error's what() carries a C++ backtrace after the first line: keep the message only.
  std::string text = e.what();
  if (auto* c10 = dynamic_cast<const c10::Error*>(&e)) text = c10->msg();
  if (const size_t nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  throw TransportError(fmt::format("{}: {}('{}') raised: {}", address, what, key, text));
}

}  // namespace

C10dStore::C10dStore(c10::intrusive_ptr<c10d::Store> store, std::string address)
    : store_(std::move(store)), address_(std::move(address)) {}

void C10dStore::set(const std::string& key, std::span<const uint8_t> value) {
  const std::string full = kPrefix + key;
  try {
    store_->set(full, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    rethrow(e, address_, "set", full);
  }
}

std::vector<uint8_t> C10dStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string full = kPrefix + key;
  // check() polled, never wait(): see store/poll.h for what a timed-out wait does to
  // a TCPStore connection.
  const auto present = [&] {
    try {
      return store_->check({full});
    } catch (const std::exception& e) {
      rethrow(e, address_, "check", full);
    }
  };
  if (!detail::poll_until_ready(present, timeout)) {
    throw TimeoutError(fmt::format("{}: key '{}' not set within {} ms", address_, full, timeout.count()));
  }
  try {
    return store_->get(full);
  } catch (const std::exception& e) {
    rethrow(e, address_, "get", full);
  }
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  const std::string full = kPrefix + key;
  try {
    return store_->add(full, delta);
  } catch (const std::exception& e) {
    rethrow(e, address_, "add", full);
  }
}

}  // namespace gradcomm::torch_backend
