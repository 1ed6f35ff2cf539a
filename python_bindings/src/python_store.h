// PythonStore: a detail::Store over a Python object with the torch.distributed
// Store interface (set/get/add/wait), so that gradcomm.init() inside a
// torch.distributed job rendezvous through torch's own store instead of opening
// a second port.
//
// Threading and lifetime: the store is called only while the communicator is
// being created, on the creating thread, with the GIL released by the binding;
// every call re-acquires the GIL. The Python object is reached through a
// PythonStoreLink that the binding detaches (drops the reference, with the GIL)
// as soon as creation returns, so no Python object outlives init inside C++ and
// nothing touches Python during interpreter shutdown. A call after detach is an
// Unsupported error, never a call into a dead interpreter.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "store/store.h"

namespace gradcomm::python {

// Owns one reference to the Python store object until detach().
class PythonStoreLink {
 public:
  explicit PythonStoreLink(pybind11::object store);  // caller holds the GIL
  ~PythonStoreLink();                                 // detaches (acquires the GIL if still attached)
  PythonStoreLink(const PythonStoreLink&) = delete;
  PythonStoreLink& operator=(const PythonStoreLink&) = delete;

  // Drops the reference; idempotent; acquires the GIL itself.
  void detach();
  // The object (borrowed) or null once detached. Caller holds the GIL.
  PyObject* get() const { return store_; }

 private:
  PyObject* store_ = nullptr;
};

class PythonStore final : public detail::Store {
 public:
  // Every key is `prefix + key`, so ours cannot collide with the other users of
  // the same store (torch's own keys, or an earlier gradcomm.init in the job).
  PythonStore(std::shared_ptr<PythonStoreLink> link, std::string prefix, std::string address);

  void set(const std::string& key, std::span<const uint8_t> value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string address() const override { return address_; }

 private:
  // The store object with the GIL held; Unsupported when detached.
  pybind11::object store(const char* what, const std::string& key) const;

  std::shared_ptr<PythonStoreLink> link_;
  std::string prefix_;
  std::string address_;
};

}  // namespace gradcomm::python
