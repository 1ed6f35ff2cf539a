#include "python_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "gradcomm/errors.h"
#include "store/poll.h"

namespace py = pybind11;

namespace gradcomm::python {

PythonStoreLink::PythonStoreLink(py::object store) : store_(store.release().ptr()) {}

PythonStoreLink::~PythonStoreLink() { detach(); }

void PythonStoreLink::detach() {
  if (store_ == nullptr) return;
  // The interpreter may already be gone when a process exits without
  // gradcomm.shutdown(): then the reference is simply not returned.
  if (!Py_IsInitialized()) {
    store_ = nullptr;
    return;
  }
  py::gil_scoped_acquire gil;
  PyObject* store = store_;
  store_ = nullptr;
  Py_DECREF(store);
}

PythonStore::PythonStore(std::shared_ptr<PythonStoreLink> link, std::string prefix, std::string address)
    : link_(std::move(link)), prefix_(std::move(prefix)), address_(std::move(address)) {}

py::object PythonStore::store(const char* what, const std::string& key) const {
  PyObject* object = link_->get();
  if (object == nullptr) {
    throw Unsupported(fmt::format("{}: {}('{}{}') after gradcomm.init() returned: the Python store is only used "
                                  "during init",
                                  address_, what, prefix_, key));
  }
  return py::reinterpret_borrow<py::object>(object);
}

namespace {

// A Python exception raised by the store, as a gradcomm error naming the call.
// Torch reports an expired wait as RuntimeError("... timeout ..."); that one is
// our TimeoutError, anything else a TransportError.
[[noreturn]] void rethrow(const py::error_already_set& e, const std::string& address, const char* what,
                          const std::string& key, bool may_time_out) {
  // "RuntimeError: Wait timeout", without the Python traceback e.what() appends.
  std::string text = fmt::format("{}: {}", py::str(e.type().attr("__name__")).cast<std::string>(),
                                 py::str(e.value()).cast<std::string>());
  std::string lower = text;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string message = fmt::format("{}: {}('{}') raised: {}", address, what, key, text);
  if (may_time_out && lower.find("timeout") != std::string::npos) throw TimeoutError(message);
  if (may_time_out && lower.find("timed out") != std::string::npos) throw TimeoutError(message);
  throw TransportError(message);
}

}  // namespace

void PythonStore::set(const std::string& key, std::span<const uint8_t> value) {
  const std::string full = prefix_ + key;
  py::gil_scoped_acquire gil;
  try {
    py::object s = store("set", key);
    s.attr("set")(full, py::bytes(reinterpret_cast<const char*>(value.data()), value.size()));
  } catch (py::error_already_set& e) {
    rethrow(e, address_, "set", full, false);
  }
}

namespace {

// What the probe below asks for; a value nobody stores.
constexpr char kAbsent[] = "\x01gradcomm: no such key\x01";

}  // namespace

// torch's TCPStore cannot wait() with a short deadline: one that expires leaves the
// connection out of step (store/poll.h says how). Stores with compare_set (all of
// torch's) are polled instead: compare_set(key, absent, absent) changes nothing and
// answers at once, with the value when the key is there and `absent` when it is not.
// Other store objects (a user's own) are waited on, as torch's own code does.
std::vector<uint8_t> PythonStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string full = prefix_ + key;
  std::optional<std::string> value;
  bool can_probe = false;
  {
    py::gil_scoped_acquire gil;
    can_probe = py::hasattr(store("get", key), "compare_set");
  }
  if (can_probe) {
    const auto probe = [&] {
      py::gil_scoped_acquire gil;
      try {
        std::string seen = store("get", key).attr("compare_set")(full, kAbsent, kAbsent).cast<std::string>();
        if (seen != kAbsent) value = std::move(seen);
      } catch (py::error_already_set& e) {
        rethrow(e, address_, "compare_set", full, false);
      } catch (py::cast_error& e) {
        throw TransportError(fmt::format("{}: compare_set('{}') returned a value that is not bytes: {}", address_,
                                         full, e.what()));
      }
      return value.has_value();
    };
    if (!detail::poll_until_ready(probe, timeout)) {
      throw TimeoutError(fmt::format("{}: get('{}'): not set within {} ms", address_, full, timeout.count()));
    }
    return std::vector<uint8_t>(value->begin(), value->end());
  }
  py::gil_scoped_acquire gil;
  try {
    py::object s = store("get", key);
    // wait() takes the deadline; a bare get() would use the store's own timeout.
    py::object timedelta = py::module_::import("datetime").attr("timedelta");
    py::list keys;
    keys.append(full);
    try {
      // At least 1 ms: torch's stores read a zero wait as "no deadline".
      const int64_t ms = std::max<int64_t>(timeout.count(), 1);
      s.attr("wait")(keys, timedelta(py::arg("milliseconds") = ms));
    } catch (py::error_already_set& e) {
      rethrow(e, address_, "wait", full, true);
    }
    value = s.attr("get")(full).cast<std::string>();
  } catch (py::error_already_set& e) {
    rethrow(e, address_, "get", full, false);
  } catch (py::cast_error& e) {
    throw TransportError(fmt::format("{}: get('{}') returned a value that is not bytes: {}", address_, full,
                                     e.what()));
  }
  return std::vector<uint8_t>(value->begin(), value->end());
}

int64_t PythonStore::add(const std::string& key, int64_t delta) {
  const std::string full = prefix_ + key;
  py::gil_scoped_acquire gil;
  try {
    py::object s = store("add", key);
    return s.attr("add")(full, delta).cast<int64_t>();
  } catch (py::error_already_set& e) {
    rethrow(e, address_, "add", full, false);
  } catch (py::cast_error& e) {
    throw TransportError(fmt::format("{}: add('{}') returned a value that is not an integer: {}", address_, full,
                                     e.what()));
  }
}

}  // namespace gradcomm::python
