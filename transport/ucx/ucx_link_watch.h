// Evidence below UCX that a peer's host is cut off (docs/fault-model.md, "A dead peer").
//
// Over TCP, UCX reports a peer whose process died (its sockets reset) but not one whose
// host stopped answering: a partition or a dead machine leaves the connection
// retransmitting for the kernel's ~15 minutes, and the ranks wait until the call's
// deadline. A stopped process looks the same to UCX, yet it differs one level down: its
// kernel still acknowledges every segment (and answers zero-window probes), while a
// cut-off host acknowledges nothing. So LinkWatch reads TCP_INFO of this process's TCP
// connections to the peers' addresses and calls a host unreachable when one of them has
// held unacknowledged data that the kernel is retransmitting on timeout, with no
// acknowledgement at all, for the whole limit (GRADCOMM_LINK_TIMEOUT_S). Transient loss
// clears the retransmit count at the next acknowledgement, within a round trip or two.
//
// UCX's keepalive (GRADCOMM_UCX_KEEPALIVE_MS) puts data on every connection every few
// hundred milliseconds, so both sides of a cut see data go unacknowledged, also a rank
// that was only receiving.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace gradcomm::detail {

// What TCP_INFO says about one connection, the fields the judgement reads.
struct TcpSample {
  uint32_t unacked = 0;           // segments sent and not yet acknowledged (tcpi_unacked)
  uint32_t retransmits = 0;       // unrecovered retransmission timeouts in a row (tcpi_retransmits)
  uint32_t last_ack_recv_ms = 0;  // since the last acknowledgement arrived (tcpi_last_ack_recv)
};

// One connection's state across polls: when it was first seen stuck (unacknowledged data
// being retransmitted on timeout), and whether it is dead now: stuck continuously since at
// least `limit` ago and no acknowledgement for `limit` either. Pure, for the tests.
struct StuckClock {
  std::chrono::steady_clock::time_point since{};
  bool stuck = false;
  bool dead(const TcpSample& s, std::chrono::steady_clock::time_point now, std::chrono::milliseconds limit);
};

// IPv4 and IPv6 addresses of this host's interfaces that are up, loopback left out, as
// text ("10.0.0.2", "fd00::2"): what a rank publishes for its peers' LinkWatch.
std::vector<std::string> interface_addresses();

class LinkWatch {
 public:
  // peers[r]: the addresses rank r published (empty for this rank and for peers it reaches
  // over shared memory, which cannot be cut off this way); limit > 0.
  LinkWatch(const std::vector<std::vector<std::string>>& peers, std::chrono::milliseconds limit);

  struct Finding {
    std::vector<int> ranks;  // every rank at the unreachable address
    std::string why;         // for the PeerFailure: the address, the evidence, the limit
  };
  // Scans this process's TCP connections to the peers' addresses (/proc/self/fd, TCP_INFO).
  // Returns the addresses found unreachable now, each once per LinkWatch.
  std::vector<Finding> poll(std::chrono::steady_clock::time_point now);

  std::chrono::milliseconds limit() const { return limit_; }
  bool empty() const { return ranks_at_.empty(); }

 private:
  std::map<std::string, std::vector<int>> ranks_at_;  // address -> ranks there
  std::unordered_map<ino_t, StuckClock> sockets_;     // by socket inode: fds are reused
  std::vector<std::string> reported_;
  std::chrono::milliseconds limit_;
};

}  // namespace gradcomm::detail
