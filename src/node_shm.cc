#include "node_shm.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>

#include "checksum.h"
#include "env.h"
#include "gradcomm/errors.h"
#include "logging.h"

namespace gradcomm::detail {
namespace {

// Slots of this many bytes per rank (two each): large enough that a round's
// synchronization is a small part of its copies, small enough that the node's slots stay
// in the last-level cache (4 ranks: 2 MiB). GRADCOMM_SHM_SLOT_BYTES on the node's first
// rank overrides it (tuning; the others take the first rank's).
constexpr int64_t kDefaultSlotBytes = int64_t{256} << 10;

// The words the node's ranks publish: a status byte, then the process identity (ok) or
// the reason (not).
constexpr uint8_t kOk = 1;
constexpr uint8_t kNot = 0;

std::vector<uint8_t> word(uint8_t status, std::span<const uint8_t> rest) {
  std::vector<uint8_t> out{status};
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}
std::vector<uint8_t> word(uint8_t status, const std::string& text) {
  return word(status, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}
std::string text_of(const std::vector<uint8_t>& w) { return w.size() > 1 ? std::string(w.begin() + 1, w.end()) : ""; }

// The first rank's word on success: name, segment bytes and slot bytes, then its process.
struct Announcement {
  std::string name;
  uint64_t slot_bytes = 0;
};

}  // namespace

bool shm_enabled_from_env() {
  const std::string mode = env_string("GRADCOMM_SHM").value_or("auto");
  if (mode == "auto") return true;
  if (mode == "off") return false;
  throw InvalidArgument(fmt::format("GRADCOMM_SHM='{}' unknown; accepted: auto, off", mode.substr(0, 40)));
}

NodeShm::NodeShm(ShmSegment segment, int local_rank, std::vector<int> members, size_t slot_bytes,
                 std::vector<std::optional<ProcessIdentity>> processes)
    : segment_(std::move(segment)),
      members_(std::move(members)),
      slot_bytes_(slot_bytes),
      collectives_(segment_.data(), local_rank, static_cast<int>(members_.size()), slot_bytes),
      processes_(std::move(processes)) {}

void NodeShm::check_peers() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_poll_) return;
  next_poll_ = now + kProcessPoll;
  for (size_t q = 0; q < processes_.size(); ++q) {
    if (!processes_[q] || static_cast<int>(q) == collectives_.rank()) continue;
    const std::optional<ProcessState> state = observe(*processes_[q]);
    if (state != ProcessState::kZombie && state != ProcessState::kGone) continue;
    throw PeerFailure(fmt::format("rank {} lost rank {} on the node's shared segment: its process (pid {}) {}",
                                  members_[static_cast<size_t>(collectives_.rank())], members_[q], processes_[q]->pid,
                                  *state == ProcessState::kZombie
                                      ? "is a zombie (it exited; its parent has not reaped it yet)"
                                      : "has exited"));
  }
}

std::string NodeShm::describe_peers() const {
  std::string out;
  for (size_t q = 0; q < processes_.size(); ++q) {
    if (!processes_[q] || static_cast<int>(q) == collectives_.rank()) continue;
    const std::optional<ProcessState> state = observe(*processes_[q]);
    if (!state || *state == ProcessState::kRunning) continue;
    out += fmt::format("{}rank {} (pid {}) is {}", out.empty() ? "" : "; ", members_[q], processes_[q]->pid,
                       process_state_name(*state));
  }
  return out;
}

std::unique_ptr<NodeShm> connect_node_shm(Store& store, const NodeMap& nodes, int rank, const std::string& job_token,
                                          uint64_t generation, std::chrono::milliseconds timeout) {
  const int node = nodes.node_of(rank);
  const std::vector<int>& members = nodes.members(node);
  const int local = nodes.local_rank(rank);
  const int ranks = static_cast<int>(members.size());
  if (ranks < 2) return nullptr;
  const auto key = [&](int local_rank) { return fmt::format("shm/{}/{}", node, local_rank); };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  const bool enabled = shm_enabled_from_env();
  const std::optional<ProcessIdentity> me = this_process();
  const std::vector<uint8_t> my_process = me ? me->serialize() : std::vector<uint8_t>{};

  // 1. The first rank creates the segment and announces it: "name\nslot bytes", then its process.
  ShmSegment segment;
  size_t slot_bytes = 0;
  std::string name;
  if (local == 0) {
    std::vector<uint8_t> mine;
    if (!enabled) {
      mine = word(kNot, fmt::format("GRADCOMM_SHM=off on rank {}", rank));
    } else {
      static std::atomic<uint64_t> counter{0};
      const std::string token_hash = fmt::format(
          "{:016x}", fnv1a64(std::span(reinterpret_cast<const uint8_t*>(job_token.data()), job_token.size())));
      name = fmt::format("/gradcomm-{}-g{}-{}-{}", token_hash, generation, ::getpid(), counter.fetch_add(1));
      slot_bytes = static_cast<size_t>(
          env_bytes("GRADCOMM_SHM_SLOT_BYTES", kDefaultSlotBytes, int64_t{64} * ranks, int64_t{64} << 20) / 64 * 64);
      try {
        segment = ShmSegment::create(name, node_segment_bytes(ranks, slot_bytes));
        init_node_segment(segment.data(), ranks, slot_bytes);
        std::string head = fmt::format("{}\n{}\n", name, slot_bytes);
        mine = word(kOk, head);
        mine.insert(mine.end(), my_process.begin(), my_process.end());
      } catch (const Error& e) {
        mine = word(kNot, fmt::format("rank {} could not make the node's segment: {}", rank, e.what()));
      }
    }
    store.set(key(0), mine);
  }
  // 2. The others map it (or say why not).
  const std::vector<uint8_t> first = local == 0 ? std::vector<uint8_t>{} : store.get(key(0), left());
  Announcement announced;
  std::optional<ProcessIdentity> first_process;
  if (local != 0) {
    std::vector<uint8_t> mine;
    if (first.empty() || first[0] != kOk) {
      mine = word(kNot, "");
    } else if (!enabled) {
      mine = word(kNot, fmt::format("GRADCOMM_SHM=off on rank {}", rank));
    } else {
      // name \n slot \n process
      const std::string all(first.begin() + 1, first.end());
      const size_t a = all.find('\n');
      const size_t b = a == std::string::npos ? a : all.find('\n', a + 1);
      try {
        if (b == std::string::npos) throw CorruptPayload("the node's first rank announced a malformed segment");
        announced.name = all.substr(0, a);
        announced.slot_bytes = std::stoull(all.substr(a + 1, b - a - 1));
        first_process = ProcessIdentity::parse(std::vector<uint8_t>(first.begin() + 1 + static_cast<long>(b) + 1,
                                                                     first.end()));
        if (!announced.name.starts_with("/gradcomm-") || announced.slot_bytes == 0 ||
            announced.slot_bytes > (uint64_t{64} << 20)) {
          throw CorruptPayload(fmt::format("the node's first rank announced segment '{}' with slots of {} bytes",
                                           announced.name.substr(0, 80), announced.slot_bytes));
        }
        slot_bytes = announced.slot_bytes;
        segment = ShmSegment::open(announced.name, node_segment_bytes(ranks, slot_bytes));
        NodeCollectives check(segment.data(), local, ranks, slot_bytes);  // its header is this node's
        mine = word(kOk, my_process);
      } catch (const std::exception& e) {
        segment = ShmSegment{};
        mine = word(kNot, fmt::format("rank {} could not map the node's segment: {}", rank, e.what()));
      }
    }
    store.set(key(local), mine);
  }
  // 3. Every member's word: the node uses the segment only if every one mapped it.
  std::vector<std::optional<ProcessIdentity>> processes(static_cast<size_t>(ranks));
  std::string why_not;
  for (int q = 0; q < ranks; ++q) {
    std::vector<uint8_t> w;
    if (q == local) {
      w = segment.data() != nullptr ? word(kOk, my_process)
                                    : word(kNot, enabled ? "" : fmt::format("GRADCOMM_SHM=off on rank {}", rank));
    } else {
      w = q == 0 ? first : store.get(key(q), left());
    }
    if (w.empty() || w[0] != kOk) {
      const std::string reason = text_of(w);
      if (why_not.empty() && !reason.empty()) why_not = reason;
      if (why_not.empty()) why_not = fmt::format("rank {} did not map it", members[static_cast<size_t>(q)]);
      continue;
    }
    if (q == 0 && q != local) {
      processes[0] = first_process;
    } else if (q != local) {
      processes[static_cast<size_t>(q)] = ProcessIdentity::parse(std::vector<uint8_t>(w.begin() + 1, w.end()));
    }
  }
  // 4. Every member has mapped it or never will: the name goes now.
  if (local == 0) segment.unlink();
  if (!why_not.empty()) {
    const bool off = why_not.find("GRADCOMM_SHM=off") != std::string::npos;
    log(off && !enabled ? LogLevel::kDebug : LogLevel::kWarn,
        "rank {}: the ranks of node {} talk through the transport, not a shared segment: {}", rank, nodes.name(node),
        why_not);
    return nullptr;
  }
  for (auto& p : processes) {
    if (p && observe(*p) != ProcessState::kRunning) p.reset();  // watched only if seen running now
  }
  log(LogLevel::kDebug, "rank {}: node {}'s {} ranks share segment {} ({} byte slots)", rank, nodes.name(node), ranks,
      segment.name(), slot_bytes);
  return std::make_unique<NodeShm>(std::move(segment), local, members, slot_bytes, std::move(processes));
}

}  // namespace gradcomm::detail
