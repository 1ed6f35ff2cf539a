// C10dStore: gradcomm's rendezvous Store (store/store.h) over a c10d::Store,
// the store torch.distributed hands a backend's creator (a PrefixStore over the
// job's TCPStore or FileStore). The process group's communicator exchanges its
// transport addresses through it, so a torch job opens no second port.
//
// Unlike python_bindings/src/python_store.h this adapter stays in C++: c10d::Store is a
// C++ object with virtual calls, so no GIL is taken and nothing here can touch the
// interpreter. It holds a reference to the store (an intrusive_ptr) for as long as
// the communicator keeps it; torch's own process groups hold theirs the same way.
//
// Keys get the prefix "gradcomm/" on top of torch's per-group prefix, so they
// cannot collide with torch's keys or another backend's in the same group.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

#include "store/store.h"

namespace gradcomm::torch_backend {

class C10dStore final : public detail::Store {
 public:
  C10dStore(c10::intrusive_ptr<c10d::Store> store, std::string address);

  void set(const std::string& key, std::span<const uint8_t> value) override;
  // c10d's check(keys) polled until the deadline (never wait(): store/poll.h), then
  // get(): TimeoutError when the deadline passes.
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string address() const override { return address_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string address_;
};

}  // namespace gradcomm::torch_backend
