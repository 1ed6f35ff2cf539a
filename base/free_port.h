// TCP ports on 127.0.0.1 that are free right now, for a program that must hand a port
// number (not a socket) to another process or thread: gradcomm-run's MASTER_PORT and
// store port, tests that start a store server after choosing its URL.
//
// Between the check and the other side's bind, someone else can take the port. bind(0)
// picks from the kernel's ephemeral range (ip_local_port_range), where every outgoing
// connection's local end comes from too, and a busy machine (parallel tests, UCX,
// stores) opens many a second. So ports are drawn at random below that range (from
// 10000 up), where only another listener can take them; bind(0) is the fallback when
// none there is free. Header-only, POSIX, no gradcomm dependency (the launcher, which
// links nothing of gradcomm, uses it).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <vector>

namespace gradcomm::detail {

// A TCP socket bound to 127.0.0.1:port (0: any free port) and the port it got, or
// {-1, 0} when that port is taken.
struct BoundPort {
  int fd = -1;
  int port = 0;
};
inline BoundPort bind_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return {};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return {};
  }
  return {fd, ntohs(addr.sin_port)};
}

// The first port of the kernel's ephemeral range; 32768 when it cannot be read.
inline int ephemeral_port_low() {
  int low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "re")) {
    int a = 0, b = 0;
    if (std::fscanf(f, "%d %d", &a, &b) == 2 && a > 0 && a <= b && b <= 65535) low = a;
    std::fclose(f);
  }
  return low;
}

// The first of `count` (>= 1) consecutive ports free on 127.0.0.1 right now, or 0 when
// none was found (errno from the last bind). Every socket stays bound until a run is
// found, so a rejected port is not offered again; all are closed on return.
inline int free_loopback_ports(int count) {
  constexpr int kLowest = 10000;
  const int span = ephemeral_port_low() - count - kLowest;  // the whole run below the range
  uint64_t seed = (static_cast<uint64_t>(::getpid()) << 32) ^ static_cast<uint64_t>(std::time(nullptr)) ^
                  reinterpret_cast<uintptr_t>(&seed);
  std::vector<int> held;
  int first = 0;
  for (int attempt = 0; attempt < 128 && first == 0; ++attempt) {
    int port = 0;  // bind(0): the kernel's pick, inside the ephemeral range
    if (attempt < 64 && span > 0) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;  // an LCG step: any spread will do
      port = kLowest + static_cast<int>((seed >> 33) % static_cast<uint64_t>(span));
    }
    const BoundPort start = bind_loopback(port);
    if (start.fd < 0) {
      if (port == 0) break;
      continue;
    }
    held.push_back(start.fd);
    int got = 1;
    for (; got < count && start.port + got <= 65535; ++got) {
      const BoundPort next = bind_loopback(start.port + got);
      if (next.fd < 0) break;
      held.push_back(next.fd);
    }
    if (got == count) first = start.port;
  }
  for (int fd : held) ::close(fd);
  return first;
}

}  // namespace gradcomm::detail
