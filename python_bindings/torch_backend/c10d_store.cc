#include "c10d_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "gradcomm/errors.h"

namespace gradcomm::torch_backend {
namespace {

constexpr const char* kPrefix = "gradcomm/";

// A store call's failure as a gradcomm error naming the call and the key. torch's
// stores throw c10::Error (a std::exception) with "Wait timeout" / "Socket Timeout"
// when a deadline passes: that is our TimeoutError, anything else a TransportError.
[[noreturn]] void rethrow(const std::exception& e, const std::string& address, const char* what,
                          const std::string& key, bool may_time_out) {
  // c10::Error's what() carries a C++ backtrace after the first line: keep the message only.
  std::string text = e.what();
  if (auto* c10 = dynamic_cast<const c10::Error*>(&e)) text = c10->msg();
  if (const size_t nl = text.find('\n'); nl != std::string::npos) text.resize(nl);
  std::string lower = text;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string message = fmt::format("{}: {}('{}') raised: {}", address, what, key, text);
  if (may_time_out && (lower.find("timeout") != std::string::npos || lower.find("timed out") != std::string::npos)) {
    throw TimeoutError(message);
  }
  throw TransportError(message);
}

}  // namespace

C10dStore::C10dStore(c10::intrusive_ptr<c10d::Store> store, std::string address)
    : store_(std::move(store)), address_(std::move(address)) {}

void C10dStore::set(const std::string& key, std::span<const uint8_t> value) {
  const std::string full = kPrefix + key;
  try {
    store_->set(full, std::vector<uint8_t>(value.begin(), value.end()));
  } catch (const std::exception& e) {
    rethrow(e, address_, "set", full, false);
  }
}

std::vector<uint8_t> C10dStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string full = kPrefix + key;
  try {
    // At least 1 ms: c10d reads a zero wait as "no deadline".
    store_->wait({full}, std::max(timeout, std::chrono::milliseconds(1)));
  } catch (const std::exception& e) {
    rethrow(e, address_, "wait", full, true);
  }
  try {
    return store_->get(full);
  } catch (const std::exception& e) {
    rethrow(e, address_, "get", full, false);
  }
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  const std::string full = kPrefix + key;
  try {
    return store_->add(full, delta);
  } catch (const std::exception& e) {
    rethrow(e, address_, "add", full, false);
  }
}

}  // namespace gradcomm::torch_backend
