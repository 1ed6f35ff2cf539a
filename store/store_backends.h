// The TCP store's two halves, usable on their own (tests start a server on an
// ephemeral port and connect clients to it), and the file store's factory.
// create_store() composes them from a URL.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "store/store.h"

namespace gradcomm::detail {

// Waits are clamped to [0, 30 days], so now() + wait cannot overflow (callers may
// pass milliseconds::max() to mean "forever").
inline std::chrono::milliseconds clamp_store_wait(std::chrono::milliseconds wait) {
  constexpr std::chrono::milliseconds kMaxWait{int64_t{30} * 24 * 3600 * 1000};
  if (wait < std::chrono::milliseconds(0)) return std::chrono::milliseconds(0);
  return wait < kMaxWait ? wait : kMaxWait;
}

// Serves the store from one background thread (poll loop over nonblocking sockets).
// Binding happens in the constructor, so bind errors surface to the caller and
// port() is valid as soon as the constructor returns. The destructor stops the
// thread and closes every socket; clients still connected see their connection
// close (their pending get() fails), and it never waits on a client.
class TcpStoreServer {
 public:
  struct Stats {
    size_t open_connections = 0;     // accepted and not yet closed
    uint64_t accepted = 0;           // connections accepted so far
    uint64_t dropped = 0;            // closed by the server for a reason (bad input, timeout, auth, capacity)
    uint64_t refused_over_capacity = 0;
    uint64_t evicted_unauthenticated = 0;  // closed before their proof to make room (table full)
    uint64_t failed_auth = 0;
    size_t keys = 0;
    size_t stored_bytes = 0;         // keys + values held
    size_t wills = 0;                // connections holding a last will
    size_t peak_buffered_bytes = 0;  // largest input buffer any one connection ever held
  };

  // Binds exactly `host` (resolved; not INADDR_ANY) and `port` (0: an ephemeral
  // port, see port()). An empty `job_token` disables authentication.
  // TransportError when the address cannot be bound.
  TcpStoreServer(const std::string& host, uint16_t port, std::string job_token, StoreLimits limits = {});
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  std::string address() const;  // "tcp://host:port"
  // A snapshot taken at the end of each event-loop turn: it may trail by one turn
  // what a client has already observed (e.g. its connection closing).
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Connects a client, retrying until `timeout` (the server may start later).
// When `server` is given the Store holds a reference to it until the client closes.
std::unique_ptr<Store> connect_tcp_store(const std::string& host, uint16_t port, const std::string& job_token,
                                         std::chrono::milliseconds timeout,
                                         std::shared_ptr<TcpStoreServer> server = nullptr);

// A store in `dir` (created when missing); `timeout` bounds add()'s lock wait.
std::unique_ptr<Store> open_file_store(const std::string& dir, std::chrono::milliseconds timeout);

}  // namespace gradcomm::detail
