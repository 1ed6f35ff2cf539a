#include "transport/ucx/ucx_link_watch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace gradcomm::detail {
namespace {

// The address of a socket's peer as text, IPv4-mapped IPv6 written as IPv4; empty when
// it has none (not connected, not IP).
std::string peer_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) == nullptr) return {};
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      if (inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], text, sizeof text) == nullptr) return {};
    } else if (inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text) == nullptr) {
      return {};
    }
  } else {
    return {};
  }
  return text;
}

bool is_tcp_socket(int fd) {
  int protocol = 0;
  socklen_t len = sizeof protocol;
  return getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &len) == 0 && protocol == IPPROTO_TCP;
}

}  // namespace

bool StuckClock::dead(const TcpSample& s, std::chrono::steady_clock::time_point now, std::chrono::milliseconds limit) {
  if (s.unacked == 0 || s.retransmits == 0) {  // nothing outstanding, or acknowledged since
    stuck = false;
    return false;
  }
  if (!stuck) {
    stuck = true;
    since = now;
  }
  return now - since >= limit && std::chrono::milliseconds(s.last_ack_recv_ms) >= limit;
}

std::vector<std::string> interface_addresses() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {};
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> guard(list, freeifaddrs);
  std::vector<std::string> out;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr, text, sizeof text);
    } else {
      continue;
    }
    if (text[0] != '\0' && std::find(out.begin(), out.end(), text) == out.end()) out.emplace_back(text);
  }
  return out;
}

LinkWatch::LinkWatch(const std::vector<std::vector<std::string>>& peers, std::chrono::milliseconds limit)
    : limit_(limit) {
  const std::vector<std::string> mine = interface_addresses();
  for (size_t r = 0; r < peers.size(); ++r) {
    for (const std::string& address : peers[r]) {
      // An address this host has too (another rank here, or a shared one) is no link.
      if (std::find(mine.begin(), mine.end(), address) != mine.end()) continue;
      std::vector<int>& ranks = ranks_at_[address];
      if (std::find(ranks.begin(), ranks.end(), static_cast<int>(r)) == ranks.end()) ranks.push_back(static_cast<int>(r));
    }
  }
}

std::vector<LinkWatch::Finding> LinkWatch::poll(std::chrono::steady_clock::time_point now) {
  std::vector<Finding> found;
  if (ranks_at_.empty()) return found;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc/self/fd"), closedir);
  if (!dir) return found;
  std::unordered_map<ino_t, StuckClock> seen;
  const int own = dirfd(dir.get());
  while (const dirent* entry = readdir(dir.get())) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode) || !is_tcp_socket(static_cast<int>(fd))) continue;
    const std::string address = peer_address(static_cast<int>(fd));
    const auto at = ranks_at_.find(address);
    if (at == ranks_at_.end()) continue;
    tcp_info info{};
    socklen_t len = sizeof info;
    if (getsockopt(static_cast<int>(fd), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) continue;
    const TcpSample sample{info.tcpi_unacked, info.tcpi_retransmits, info.tcpi_last_ack_recv};
    StuckClock clock = sockets_.count(st.st_ino) ? sockets_[st.st_ino] : StuckClock{};
    const bool dead = clock.dead(sample, now, limit_);
    seen[st.st_ino] = clock;
    if (!dead || std::find(reported_.begin(), reported_.end(), address) != reported_.end()) continue;
    reported_.push_back(address);
    const double stuck_s = std::chrono::duration<double>(now - clock.since).count();
    found.push_back({at->second,
                     fmt::format("its host {} acknowledged nothing this process sent it for {:.1f} s ({} segments "
                                 "unacknowledged, retransmitted {} times on timeout, stuck since {:.1f} s ago): a "
                                 "network partition or a dead host (GRADCOMM_LINK_TIMEOUT_S={:g})",
                                 address, sample.last_ack_recv_ms / 1000.0, sample.unacked, sample.retransmits,
                                 stuck_s, limit_.count() / 1000.0)});
  }
  sockets_ = std::move(seen);  // closed sockets drop out
  return found;
}

}  // namespace gradcomm::detail
