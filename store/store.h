// Stores: the out-of-band key-value rendezvous through which ranks find each
// other (transport addresses, NCCL unique ids). Small values only.
//
//  - TCP store ("tcp://host:port"): rank 0 serves it from a background thread,
//    bound to that address only; every rank (rank 0 too) is a client. With a job
//    token, each connection proves it knows the token (HMAC-SHA256 challenge) before
//    any request is served. The server caps key/value sizes and connections, drops
//    idle and misbehaving clients, and keeps serving the others.
//  - File store ("file:///shared/dir"): one file per key in a directory every rank
//    can see (NFS, Lustre); written to a temporary name and renamed, so readers
//    never see half a value.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace gradcomm::detail {

// What Store::set_last_will returns: while it lives, the store holds a key to set
// if this process goes away. Destroying it withdraws that (best effort, and
// without waiting on the store: a store that is gone has nothing to withdraw).
class LastWill {
 public:
  virtual ~LastWill() = default;
};

class Store {
 public:
  virtual ~Store() = default;
  // Sets (or overwrites) a key.
  virtual void set(const std::string& key, std::span<const uint8_t> value) = 0;
  // Blocks until `key` exists, then returns its value; TimeoutError naming the key
  // (and the store's address) when `timeout` passes first.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds `delta` to the integer stored at `key` (absent = 0); returns the new value.
  // The counter is stored as decimal ASCII text ("3", "-12"), so get() on it returns
  // that text; add() on a key holding anything else is InvalidArgument.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Human-readable address for error messages ("tcp://127.0.0.1:29500").
  virtual std::string address() const = 0;

  // Deletes every key that starts with `prefix`; returns how many it deleted. A
  // parked get() of such a key keeps waiting. A store that cannot delete (an
  // adapter over another framework's store) keeps its keys: the default does
  // nothing and returns 0.
  virtual size_t erase_prefix(const std::string& prefix) {
    (void)prefix;
    return 0;
  }

  // MQTT's "last will": until the returned handle is destroyed, the store sets `key`
  // to `value` if this process's connection to it closes (the process exited or was
  // killed), unless the key holds a value by then. Null when the store cannot tell
  // that a process went away (the file store, adapters): nothing is arranged.
  virtual std::unique_ptr<LastWill> set_last_will(const std::string& key, std::span<const uint8_t> value) {
    (void)key;
    (void)value;
    return nullptr;
  }
};

// Limits the TCP store enforces (server side).
struct StoreLimits {
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 1 << 20;
  size_t max_connections = 1024;
  size_t max_keys = 1 << 16;
  size_t max_total_bytes = size_t{256} << 20;      // keys + values held (last wills too), all together
  std::chrono::milliseconds idle_timeout{60'000};  // a client silent this long is dropped (not one holding a last will)
  std::chrono::milliseconds auth_timeout{5'000};   // ... or this long before proving the token
};

struct StoreOptions {
  std::string url;              // "tcp://host:port" or "file:///dir"
  int rank = 0;                 // rank 0 serves a TCP store
  int world_size = 1;
  std::string job_token;        // empty: no authentication
  std::chrono::milliseconds timeout{300'000};  // connect / wait deadline
  StoreLimits limits{};
};

// Parses the URL and connects (and, on rank 0 for tcp://, starts serving).
// InvalidArgument for a malformed URL; TimeoutError if the server never answers.
// Accepted forms: "tcp://host:port" (port 1..65535; IPv6 as "tcp://[::1]:port") and
// "file:///absolute/dir" (created when missing). The returned Store is thread-safe.
std::unique_ptr<Store> create_store(const StoreOptions& options);

}  // namespace gradcomm::detail
