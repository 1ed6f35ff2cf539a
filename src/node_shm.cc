#include "node_shm.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string_view>

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
constexpr int64_t kMaxSlotBytes = int64_t{64} << 20;

// What each rank of the node publishes: whether it has the segment, a text (the first
// rank: "name slot_bytes"; a rank without it: why) and its process identity.
struct Word {
  bool ok = false;
  std::string text;
  std::vector<uint8_t> process;

  std::vector<uint8_t> encode() const {
    std::vector<uint8_t> out{static_cast<uint8_t>(ok), static_cast<uint8_t>(text.size() >> 8),
                             static_cast<uint8_t>(text.size())};
    out.insert(out.end(), text.begin(), text.end());
    out.insert(out.end(), process.begin(), process.end());
    return out;
  }
  // A malformed word reads as "not mapped", saying so.
  static Word decode(const std::vector<uint8_t>& bytes) {
    const size_t length = bytes.size() >= 3 ? size_t{bytes[1]} << 8 | bytes[2] : 0;
    if (bytes.size() < 3 + length || bytes[0] > 1) return Word{false, "a malformed word in the store", {}};
    return Word{bytes[0] == 1, std::string(bytes.begin() + 3, bytes.begin() + 3 + static_cast<long>(length)),
                std::vector<uint8_t>(bytes.begin() + 3 + static_cast<long>(length), bytes.end())};
  }
};

}  // namespace

bool shm_enabled_from_env() {
  const std::string mode = env_string("GRADCOMM_SHM").value_or("auto");
  if (mode == "auto") return true;
  if (mode == "off") return false;
  throw InvalidArgument(fmt::format("GRADCOMM_SHM='{}' unknown; accepted: auto, off", mode.substr(0, 40)));
}

NodeShm::NodeShm(ShmSegment segment, int local_rank, std::vector<int> members, size_t slot_bytes,
                 std::vector<std::optional<ProcessIdentity>> processes, std::string name_prefix)
    : segment_(std::move(segment)),
      members_(std::move(members)),
      slot_bytes_(slot_bytes),
      collectives_(segment_.data(), local_rank, static_cast<int>(members_.size()), slot_bytes),
      processes_(std::move(processes)),
      name_prefix_(std::move(name_prefix)) {}

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
  (void)node_spin_alone(ranks);  // a bad GRADCOMM_SHM_SPIN_US fails here, on the rank that has it
  const std::optional<ProcessIdentity> me = this_process();
  const std::string off = fmt::format("GRADCOMM_SHM=off on rank {}", rank);

  // 1. The first rank creates the segment and announces it; 2. the others map it. Each says
  // whether it has it.
  ShmSegment segment;
  size_t slot_bytes = 0;
  Word mine{false, off, {}};
  std::vector<uint8_t> first;  // the first rank's word, as the others read it
  const std::string prefix = fmt::format(
      "/gradcomm-{:016x}-g{}",
      fnv1a64(std::span(reinterpret_cast<const uint8_t*>(job_token.data()), job_token.size())), generation);
  if (local == 0 && enabled) {
    static std::atomic<uint64_t> counter{0};
    const std::string name = fmt::format("{}-{}-{}", prefix, ::getpid(), counter.fetch_add(1));
    slot_bytes = static_cast<size_t>(
        env_bytes("GRADCOMM_SHM_SLOT_BYTES", kDefaultSlotBytes, int64_t{64} * ranks, kMaxSlotBytes) / 64 * 64);
    try {
      segment = ShmSegment::create(name, node_segment_bytes(ranks, slot_bytes));
      init_node_segment(segment.data(), ranks, slot_bytes);
      mine = Word{true, fmt::format("{} {}", name, slot_bytes), {}};
    } catch (const Error& e) {
      mine.text = fmt::format("rank {} could not make the node's segment: {}", rank, e.what());
    }
  } else if (local != 0) {
    first = store.get(key(0), left());
    const Word announced = Word::decode(first);
    if (!announced.ok) {
      mine.text.clear();  // the first rank says why
    } else if (enabled) {
      try {
        char name[128] = {};
        unsigned long long slot = 0;
        if (std::sscanf(announced.text.c_str(), "%127s %llu", name, &slot) != 2 ||
            !std::string_view(name).starts_with("/gradcomm-") || slot == 0 || slot > kMaxSlotBytes) {
          throw CorruptPayload(fmt::format("the node's first rank announced '{}'", announced.text.substr(0, 160)));
        }
        slot_bytes = slot;
        segment = ShmSegment::open(name, node_segment_bytes(ranks, slot_bytes));
        NodeCollectives check(segment.data(), local, ranks, slot_bytes);  // its header is this node's
        mine = Word{true, "", {}};
      } catch (const std::exception& e) {
        segment = ShmSegment{};
        mine.text = fmt::format("rank {} could not map the node's segment: {}", rank, e.what());
      }
    }
  }
  if (mine.ok && me) mine.process = me->serialize();
  store.set(key(local), mine.encode());

  // 3. Every member's word: the node uses the segment only if every one mapped it.
  std::vector<std::optional<ProcessIdentity>> processes(static_cast<size_t>(ranks));
  std::string why_not;
  for (int q = 0; q < ranks; ++q) {
    const Word w = q == local ? mine : Word::decode(q == 0 ? first : store.get(key(q), left()));
    if (!w.ok) {
      if (why_not.empty() && !w.text.empty()) why_not = w.text;
      continue;
    }
    if (q != local) processes[static_cast<size_t>(q)] = ProcessIdentity::parse(w.process);
  }
  if (why_not.empty() && segment.data() == nullptr) why_not = "a rank did not map it";
  // 4. Every member has mapped it or never will: the name goes now.
  if (local == 0) segment.unlink();
  if (!why_not.empty()) {
    log(!enabled ? LogLevel::kDebug : LogLevel::kWarn,
        "rank {}: the ranks of node {} talk through the transport, not a shared segment: {}", rank, nodes.name(node),
        why_not);
    return nullptr;
  }
  for (auto& p : processes) {
    if (p && observe(*p) != ProcessState::kRunning) p.reset();  // watched only if seen running now
  }
  log(LogLevel::kDebug, "rank {}: node {}'s {} ranks share segment {} ({} byte slots)", rank, nodes.name(node), ranks,
      segment.name(), slot_bytes);
  return std::make_unique<NodeShm>(std::move(segment), local, members, slot_bytes, std::move(processes), prefix);
}

}  // namespace gradcomm::detail
