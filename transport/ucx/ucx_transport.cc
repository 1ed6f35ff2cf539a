// UCX transport: set-up, send/receive, progress and the control channel. The
// design (request lifetime, tag layout, dead-peer detection) is described in
// ucx_transport_impl.h and ucx_wire.h.
#include <dirent.h>
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "env.h"
#include "logging.h"
#include "transport/ucx/ucx_check.h"
#include "transport/ucx/ucx_transport_impl.h"
#include "transport/ucx/ucx_wire.h"

namespace gradcomm::detail {

UcxRequest::~UcxRequest() {
  if (op_ == 0) return;
  try {
    transport_->abandon(op_);
  } catch (...) {
    // Only formatting/logging can throw in there; the UcxOp is detached either way.
  }
}

// ---- set-up -------------------------------------------------------------------

// Shared memory between the ranks of one host. In peer error mode, which the
// dead-peer detection needs, UCX 1.13 leaves posix and sysv out of every endpoint
// unless their error handling is on (UCX_MM_ERROR_HANDLING, since UCX 1.11), and the
// ranks of one host then talk over TCP loopback. With it, the lane is sysv (or posix)
// shared memory, which reports a dead peer (ucx_info -d: "error handling: peer
// failure"): keepalive checks the peer's process every GRADCOMM_UCX_KEEPALIVE_MS.
// Large messages would go through the same FIFO in 8K fragments (in peer error mode
// UCX 1.13 does not pick cma for rendezvous); the transport's own single-copy read
// (ucx_cma.h) takes those of GRADCOMM_CMA_MIN_BYTES or more. wait_for_event polls
// while sends are in flight. A user's own setting wins: with UCX_TLS or any of
// the three variables set, nothing is added (UCX also warns of an unused variable when
// UCX_TLS leaves the mm transports out; a UCX_TLS that names them needs
// UCX_MM_ERROR_HANDLING=y beside it). The emulated-cluster scripts set
// UCX_TLS=tcp,self, so ranks in separate network namespaces stay on their shaped
// links (bench/cluster/netns.sh).
static void prefer_shared_memory() {
  if (env_string("UCX_TLS") || env_string("UCX_MM_ERROR_HANDLING") || env_string("UCX_POSIX_ERROR_HANDLING") ||
      env_string("UCX_SYSV_ERROR_HANDLING")) {
    return;
  }
  set_env_default("UCX_MM_ERROR_HANDLING", "y");
}

// TCP segment sizes, through the environment before UCX reads it.
static void prefer_large_tcp_segments(int world_size) {
  // UCX's TCP defaults (8K send / 64K receive segments) cost a ring allreduce over
  // loopback about a third of its bandwidth at 1-16 MB (measured with
  // gradcomm-bench, 2 ranks; bench/results/allreduce-cpu-2026-11-22.md). UCX 1.13
  // rejects transport keys in ucp_config_modify ("invalid configurations"), so
  // they go through the environment, never replacing a value the user set;
  // called before ucp_config_read.
  set_env_default("UCX_TCP_TX_SEG_SIZE", "256K");
  // Receive segments, allocated one at a time: an endpoint takes one only while it
  // is receiving, and the pages are touched only as far as a read fills them.
  // Two ranks: 8M. More ranks: 1M, with the dense ring's 1M chunks
  // (ring_allreduce.cc), so most of each chunk is read straight into its destination.
  // Measured on emulated links: bench/results/tuning-notes-2026-11-27.md#ucx-tcp-receive-segments.
  // Process-wide: the first UCX communicator's world size decides. 1M transmit
  // segments, by contrast, cost loopback a third of its bandwidth.
  set_env_default("UCX_TCP_RX_SEG_SIZE", world_size == 2 ? "8M" : "1M");
  set_env_default("UCX_TCP_RX_BUFS_GROW", "1");
  // No zero-copy sends over TCP. In UCX 1.13.1 a zero-copy active message whose socket
  // write fails (the peer died mid-send) is completed twice: uct_tcp_ep_sendv() reports
  // the error through the disconnect path, which purges the endpoint and completes the
  // send, then completes it again itself. The second completion finds the UCP request
  // already released and aborts the process (UCX's "Assertion `comp->count > 0'
  // failed ... status=-80"), so the rank that survived its peer's SIGKILL died instead
  // of raising PeerFailure: 5 of 8 runs of tests/cluster/test_last_call.sh's killed case
  // under two CPU hogs, 0 of 8 with this (and 0 of 6 with UCX_ZCOPY_THRESH=inf, which
  // would also take zero copy from RDMA transports; this knob is TCP's alone). The cost
  // is a copy into the 256K transmit segments: 64 MiB allreduce over TCP loopback
  // 1.30-1.38 GB/s against 1.54-1.69, 1-16 MiB within the noise; on a real link, slower
  // than memory, it is CPU time, not bandwidth. bench/results/ucx-tcp-zcopy-2026-11-29.md.
  set_env_default("UCX_TCP_MAX_IOV", "0");
  // A small socket send buffer facing a large receive window collapses TCP
  // throughput: the sender's segments are too few for the receiver to acknowledge
  // at once, and it waits for its delayed-ACK timer. So when the user bounds the send
  // buffer and leaves the receive buffer alone, the receive buffer gets twice it (four
  // times stalled a 64 MB allreduce at N = 4; tests/multiproc/test_multiproc_async.cc,
  // MultiprocLinger): bench/results/tuning-notes-2026-11-27.md#ucx-tcp-receive-buffer.
  if (auto sndbuf = env_string("UCX_TCP_SNDBUF"); sndbuf && !env_string("UCX_TCP_RCVBUF")) {
    if (auto bytes = parse_bytes(*sndbuf); bytes && *bytes > 0 && *bytes <= (int64_t{1} << 40)) {
      set_env_default("UCX_TCP_RCVBUF", std::to_string(2 * *bytes));
    }
  }
}

// Settings applied to the ucp config unless the user set the UCX variable
// themselves: keepalive.
static void configure_defaults(ucp_config_t* config) {
  if (!env_string("UCX_KEEPALIVE_INTERVAL")) {
    // GRADCOMM_UCX_KEEPALIVE_MS: how often UCX checks that each peer is alive.
    const int64_t ms = env_int("GRADCOMM_UCX_KEEPALIVE_MS", 300, 10, 3'600'000);
    const std::string value = fmt::format("{}ms", ms);
    GRADCOMM_UCX_CHECK(ucp_config_modify(config, "KEEPALIVE_INTERVAL", value.c_str()), "setting KEEPALIVE_INTERVAL");
  }
  if (!env_string("UCX_KEEPALIVE_NUM_EPS")) {
    // Check every endpoint each round, not 128 of them: detection time must not grow with the job.
    GRADCOMM_UCX_CHECK(ucp_config_modify(config, "KEEPALIVE_NUM_EPS", "inf"), "setting KEEPALIVE_NUM_EPS");
  }
}

// File descriptors. UCX opens a few dozen for a context and worker (epoll and event
// fds, shared-memory segments, a socket per TCP interface; 17 on a host with
// loopback and one NIC, more with more devices) and, over TCP, about one per peer
// it talks to. When it runs out inside ucp_worker_create it may fail, or assert
// and abort the process ("failed to set active message handler"), which the other
// ranks could only see as a death. So the limit is checked first, against a
// generous estimate, and a short one is refused with what to do about it.
constexpr uint64_t kUcxBaseDescriptors = 128;

static std::optional<uint64_t> open_descriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  uint64_t entries = 0;
  while (const dirent* entry = ::readdir(dir)) entries += entry->d_name[0] != '.';
  ::closedir(dir);
  return entries - 1;  // not the directory's own
}

static void check_descriptor_headroom(int rank, int size) {
  rlimit limit{};
  const std::optional<uint64_t> open = open_descriptors();
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY || !open) return;
  const uint64_t needed = kUcxBaseDescriptors + static_cast<uint64_t>(size - 1);
  const uint64_t available = limit.rlim_cur > *open ? limit.rlim_cur - *open : 0;
  if (available >= needed) return;
  throw TransportError(fmt::format(
      "ucx: rank {} has {} file descriptors free ({} open, RLIMIT_NOFILE soft limit {}, hard limit {}); UCX needs "
      "about {} for {} ranks. Raise the limit where the rank starts: ulimit -n 4096 (up to the hard limit; above "
      "it, /etc/security/limits.conf), LimitNOFILE= under systemd, --ulimit nofile=4096 under docker",
      rank, available, *open, limit.rlim_cur,
      limit.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(limit.rlim_max), needed, size));
}

UcxTransport::UcxTransport(int rank, int size, Store& store, const UcxOptions& options) : rank_(rank), size_(size) {
  try {
    connect(store, options);
  } catch (...) {
    shutdown();
    throw;
  }
}

// Shared memory (and the single-copy cma, ucx_cma.h) are what a lane to other nodes
// leaves out: UCX_TLS syntax, "all but these"; "sm" names every shared-memory transport
// (posix, sysv, cma, knem, xpmem) without a warning for those this host lacks.
constexpr const char* kNetLaneTransports = "^sm";

// Makes the lanes this rank needs (UcxLane): one for its node's peers and one for the
// other nodes', or just one when all its peers are of one kind or UCX_TLS is the user's,
// and publishes each lane's worker address under the kind of peer it serves: node peers
// read <prefix>/ucx/addr/<r>, other nodes' <prefix>/ucx/net/<r>. A peer's relation to this
// rank is the same seen from both sides, so each finds the lane the other made for it.
void UcxTransport::make_lanes(Store& store, const UcxOptions& options, const Deadline&) {
  bool node_peers = false, net_peers = false;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const bool same = options.same_node.empty() || options.same_node[static_cast<size_t>(r)];
    (same ? node_peers : net_peers) = true;
  }
  const bool users_choice = env_string("UCX_TLS").has_value();
  std::vector<UcxLane::Kind> kinds;
  if (users_choice || !net_peers) {
    kinds.push_back(UcxLane::Kind::kNode);  // UCX picks among what it (or the user) allows
  } else if (!node_peers) {
    kinds.push_back(UcxLane::Kind::kNet);
  } else {
    kinds = {UcxLane::Kind::kNode, UcxLane::Kind::kNet};
  }
  // The UCX variables are process-wide, and ranks may be threads of one process (the
  // unit tests): setenv and the reads of the environment, ours and UCX's (config read,
  // init, the worker's interfaces), happen under one lock (base/env.h), never beside
  // another thread's setenv.
  for (UcxLane::Kind kind : kinds) {
    UcxLane& lane = lanes_.emplace_back();
    lane.kind = kind;
    ucp_config_t* config = nullptr;
    std::unique_lock environment_lock(environment_mutex());
    prefer_shared_memory();
    prefer_large_tcp_segments(size_);
    GRADCOMM_UCX_CHECK(ucp_config_read(nullptr, nullptr, &config), "reading the UCX configuration");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP | UCP_FEATURE_AM;  // AM: single-copy acks (ucx_cma.h)
    params.estimated_num_eps = static_cast<size_t>(size_);
    ucs_status_t status = UCS_OK;
    try {
      configure_defaults(config);
      if (kind == UcxLane::Kind::kNet && !users_choice) {
        GRADCOMM_UCX_CHECK(ucp_config_modify(config, "TLS", kNetLaneTransports), "leaving shared memory out");
      }
      status = ucp_init(&params, config, &lane.context);
    } catch (...) {
      ucp_config_release(config);
      throw;
    }
    ucp_config_release(config);
    GRADCOMM_UCX_CHECK(status, "creating the UCX context");

    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // One thread at a time drives the transport, not always the same one: the engine, or
    // a caller running a small call inline (src/engine.h), under the engine's drive lock.
    worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    // (Still under the lock: opening the worker's interfaces reads their UCX_<TL>_* variables.)
    GRADCOMM_UCX_CHECK(ucp_worker_create(lane.context, &worker_params, &lane.worker), "creating the UCX worker");
    environment_lock.unlock();
    GRADCOMM_UCX_CHECK(ucp_worker_get_efd(lane.worker, &lane.event_fd), "getting the worker's event fd");
    ucp_am_handler_param_t ack{};
    ack.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                     UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    ack.id = kCmaAckAmId;
    ack.flags = UCP_AM_FLAG_WHOLE_MSG;
    ack.cb = &UcxTransport::on_cma_ack;
    ack.arg = this;
    GRADCOMM_UCX_CHECK(ucp_worker_set_am_recv_handler(lane.worker, &ack), "setting the single-copy ack handler");

    ucp_address_t* address = nullptr;
    size_t address_bytes = 0;
    GRADCOMM_UCX_CHECK(ucp_worker_get_address(lane.worker, &address, &address_bytes), "getting the worker address");
    const std::vector<uint8_t> mine(reinterpret_cast<const uint8_t*>(address),
                                    reinterpret_cast<const uint8_t*>(address) + address_bytes);
    ucp_worker_release_address(lane.worker, address);
    // One lane serving both kinds answers under both keys.
    const bool serves_node = kind == UcxLane::Kind::kNode || kinds.size() == 1;
    const bool serves_net = kind == UcxLane::Kind::kNet || kinds.size() == 1;
    if (serves_node) store.set(fmt::format("{}/ucx/addr/{}", options.key_prefix, rank_), mine);
    if (serves_net) store.set(fmt::format("{}/ucx/net/{}", options.key_prefix, rank_), mine);
  }
}

void UcxTransport::connect(Store& store, const UcxOptions& options) {
  const Deadline deadline = Deadline::after(options.timeout);
  check_descriptor_headroom(rank_, size_);
  if (!options.same_node.empty() && options.same_node.size() != static_cast<size_t>(size_)) {
    throw InvalidArgument(fmt::format("ucx: rank {}: a node map of {} ranks for {}", rank_, options.same_node.size(),
                                      size_));
  }
  make_lanes(store, options, deadline);
  const auto lane_for = [&](bool same) {
    const UcxLane::Kind want = same ? UcxLane::Kind::kNode : UcxLane::Kind::kNet;
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i].kind == want) return static_cast<int>(i);
    }
    return 0;  // one lane serves both
  };
  peers_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    Peer& peer = peers_[static_cast<size_t>(r)];
    peer.transport = this;
    peer.rank = r;
    const bool same = r == rank_ || options.same_node.empty() || options.same_node[static_cast<size_t>(r)];
    peer.lane = lane_for(same);
    const std::string key =
        fmt::format("{}/ucx/{}/{}", options.key_prefix, same ? "addr" : "net", r);
    std::vector<uint8_t> theirs;
    try {
      theirs = store.get(key, deadline.remaining());
    } catch (const TimeoutError& e) {
      throw TimeoutError(fmt::format(
          "ucx: rank {} timed out after {} ms waiting for rank {} to publish its worker address (key {} in store "
          "{}): {}",
          rank_, options.timeout.count(), r, key, store.address(), e.what()));
    } catch (const Error& e) {  // a refused record, a mismatched world size: same class, with where
      throw_error(e.code(), fmt::format("ucx: rank {} reading rank {}'s worker address: {}", rank_, r, e.what()));
    }
    if (theirs.empty()) {
      throw TransportError(fmt::format("ucx: rank {} found an empty worker address for rank {} (key {} in store {})",
                                       rank_, r, key, store.address()));
    }
    ucp_ep_params_t ep_params{};
    ep_params.field_mask =
        UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(theirs.data());
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep_params.err_handler.cb = &UcxTransport::on_ep_error;
    ep_params.err_handler.arg = &peer;
    GRADCOMM_UCX_CHECK(ucp_ep_create(worker_of(r), &ep_params, &peer.ep),
                       fmt::format("creating the endpoint from rank {} to rank {}", rank_, r));
  }
  for (size_t i = 0; i < lanes_.size(); ++i) post_control_recv(static_cast<int>(i));
  for (Peer& peer : peers_) {
    if (peer.rank == rank_) continue;
    const std::string over = lanes(peer.ep);
    peer.shared_memory = over.find("sysv/") != std::string::npos || over.find("posix/") != std::string::npos;
    log(LogLevel::kInfo, "ucx: rank {} reaches rank {} over {}{}", rank_, peer.rank, over,
        lanes_[static_cast<size_t>(peer.lane)].kind == UcxLane::Kind::kNet && lanes_.size() > 1
            ? " (another node: no shared memory)"
            : "");
  }
  connect_cma(store, options.key_prefix, deadline);
  connect_link_watch(store, options.key_prefix, deadline);
  connect_process_watch(store, options.key_prefix, deadline);
}

void UcxTransport::connect_link_watch(Store& store, const std::string& prefix, const Deadline& deadline) {
  const auto key = [&](int r) { return fmt::format("{}/ucx/ips/{}", prefix, r); };
  std::string mine;
  for (const std::string& address : interface_addresses()) mine += (mine.empty() ? "" : ",") + address;
  store.set(key(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
  // GRADCOMM_LINK_TIMEOUT_S: how long a TCP peer's host may leave this process's data
  // unacknowledged before it counts as cut off (docs/fault-model.md); 0: never.
  const int64_t seconds = env_int("GRADCOMM_LINK_TIMEOUT_S", kUcxLinkTimeoutS, 0, 86'400);
  if (seconds == 0) return;
  std::vector<std::vector<std::string>> addresses(static_cast<size_t>(size_));
  bool any = false;
  for (const Peer& peer : peers_) {
    if (peer.rank == rank_ || peer.shared_memory) continue;
    const std::vector<uint8_t> theirs = store.get(key(peer.rank), deadline.remaining());
    std::string text(theirs.begin(), theirs.end());
    for (size_t begin = 0; begin < text.size();) {
      size_t end = text.find(',', begin);
      if (end == std::string::npos) end = text.size();
      if (end > begin) addresses[static_cast<size_t>(peer.rank)].push_back(text.substr(begin, end - begin));
      begin = end + 1;
    }
    any = true;
  }
  if (!any) return;
  link_watch_ = std::make_unique<LinkWatch>(addresses, std::chrono::seconds(seconds));
  if (link_watch_->empty()) link_watch_.reset();  // every TCP peer shares an address with this host
}

// At most every kUcxLinkPoll, while a data exchange is pending: a host found cut off
// fails every rank there, as UCX's own error callback would for a broken connection.
bool UcxTransport::exchanging() const {
  return std::any_of(ops_.begin(), ops_.end(), [](const auto& entry) {
    return entry.second->kind == UcxOp::Kind::kSend || entry.second->kind == UcxOp::Kind::kRecv;
  });
}

void UcxTransport::poll_links(Clock::time_point now) {
  next_link_poll_ = now + kUcxLinkPoll;
  if (!exchanging()) return;
  for (const LinkWatch::Finding& finding : link_watch_->poll(now)) {
    for (int r : finding.ranks) {
      Peer& peer = peers_[static_cast<size_t>(r)];
      if (peer.failed) continue;
      peer.lost = true;  // as from on_ep_error: nothing more will come through it
      fail_peer(r, fmt::format("ucx: rank {} lost rank {}: {}", rank_, r, finding.why));
    }
  }
}

// The transports of an endpoint's lanes, e.g. "sysv/memory cma/memory" or "tcp/lo":
// what UCX chose for this peer, from ucp_ep_print_info (UCX 1.13 has no query for it).
std::string UcxTransport::lanes(ucp_ep_h ep) {
  char* text = nullptr;
  size_t length = 0;
  FILE* stream = open_memstream(&text, &length);
  if (stream == nullptr) return "(unknown lanes)";
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  // Lines such as "#  lane[0]:  3:sysv/memory.0 md[2] -> md[2]/sysv/sysdev[255] am ...".
  std::vector<std::string> names;
  const std::string all(text, length);
  std::free(text);
  for (size_t at = all.find("lane["); at != std::string::npos; at = all.find("lane[", at + 1)) {
    const size_t colon = all.find(':', at);
    size_t begin = all.find(':', colon + 1);
    if (colon == std::string::npos || begin == std::string::npos) break;
    ++begin;
    const size_t end = all.find_first_of(". \n", begin);
    std::string name = all.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  }
  if (names.empty()) return "(unknown lanes)";
  std::string joined;
  for (const std::string& name : names) joined += (joined.empty() ? "" : " ") + name;
  return joined;
}

// ---- operations ---------------------------------------------------------------

UcxOp* UcxTransport::new_op(UcxOp::Kind kind, int peer, uint64_t tag, size_t bytes, UcxRequest* owner) {
  auto op = std::make_unique<UcxOp>();
  op->transport = this;
  op->id = next_op_id_++;
  op->kind = kind;
  op->peer = peer;
  op->tag = tag;
  op->bytes = bytes;
  op->owner = owner;
  op->lane = peer >= 0 ? peers_[static_cast<size_t>(peer)].lane : 0;
  if (owner != nullptr) owner->op_ = op->id;
  UcxOp* raw = op.get();
  if (polled(*raw)) ++polled_sends_;
  ops_.emplace(raw->id, std::move(op));
  return raw;
}

// Empty when (peer, tag) can be sent to / received from; otherwise why not.
std::string UcxTransport::check_target(int peer, uint64_t tag) const {
  if (peer < 0 || peer >= size_) return fmt::format("ucx: rank {} has no peer {} (world size {})", rank_, peer, size_);
  if (!ucx_tag_encodable(tag))
    return fmt::format("ucx: tag {:#x} has a kind above 3, which UCX tags cannot carry", tag);
  if (ucx_is_control_tag(ucx_wire_tag(tag, 0))) return fmt::format("ucx: tag {:#x} is reserved for aborts", tag);
  return {};
}

RequestPtr UcxTransport::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  auto request = std::make_unique<UcxRequest>(this, peer, bytes);
  if (std::string why = check_target(peer, tag); !why.empty()) {
    request->fail(RequestState::kFailed, std::move(why));
    return request;
  }
  const Peer& target = peers_[static_cast<size_t>(peer)];
  if (target.failed) {
    request->fail(RequestState::kPeerFailed, target.error);
    return request;
  }
  UcxOp* op = new_op(UcxOp::Kind::kSend, peer, tag, bytes, request.get());
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransport::on_send;
  param.user_data = op;
  if (cma_describe(*op, target, data, bytes)) {  // the peer reads it itself: send where to (ucx_cma.h)
    data = op->storage.data();
    bytes = op->storage.size();
  }
  after_post(op, ucp_tag_send_nbx(target.ep, data, bytes, ucx_wire_tag(tag, rank_), &param));
  return request;
}

// Receives always complete through the callback (NO_IMM_CMPL), even when the
// message is already waiting: UCX 1.13's immediate-completion path does not
// report the received length in recv_info (measured: it stays 0), and the
// callback's ucp_tag_recv_info_t does.
void UcxTransport::recv_params(UcxOp* op, ucp_request_param_t& param) {
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = &UcxTransport::on_recv;
  param.user_data = op;
}

RequestPtr UcxTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  auto request = std::make_unique<UcxRequest>(this, peer, bytes);
  if (std::string why = check_target(peer, tag); !why.empty()) {
    request->fail(RequestState::kFailed, std::move(why));
    return request;
  }
  const Peer& source = peers_[static_cast<size_t>(peer)];
  UcxOp* op = new_op(UcxOp::Kind::kRecv, peer, tag, bytes, request.get());
  ucp_request_param_t param{};
  recv_params(op, param);
  // Full mask: the source rank is part of the tag, so this matches `peer` only.
  // Posted even when `peer` has failed: a message it sent before it went away may
  // already wait in UCX's unexpected queue (a rank that finished its last
  // collective and exited), and matching it here loses nothing it delivered.
  void* target = data;
  size_t capacity = bytes;
  cma_receive_into(*op, source, data, target, capacity);
  after_post(op, ucp_tag_recv_nbx(worker_of(peer), target, capacity, ucx_wire_tag(tag, peer), ~0ull, &param));
  if (source.failed && request->pending()) {
    auto it = ops_.find(request->op_);
    void* ucx_request = it != ops_.end() ? it->second->ucx_request : nullptr;
    if (ucx_request == nullptr || ucp_request_check_status(ucx_request) == UCS_INPROGRESS) {
      // Nothing was waiting, and nothing more will come from a failed peer.
      if (ucx_request != nullptr) ucp_request_cancel(worker_of(peer), ucx_request);
      request->fail(RequestState::kPeerFailed, source.error);
    }
  }
  return request;
}

// The three ways a UCX operation ends: at once with UCS_OK (NULL), at once with
// an error, or later through the callback (a request pointer). The callback may
// even run inside the *_nbx call; `posting` keeps the UcxOp alive until here.
void UcxTransport::after_post(UcxOp* op, ucs_status_ptr_t result) {
  op->posting = false;
  if (UCS_PTR_IS_PTR(result)) {
    if (op->done) {
      erase(op);
    } else if (!op->ucx_done) {
      op->ucx_request = result;
    }
    return;
  }
  op->ucx_done = true;
  finish(op, UCS_PTR_STATUS(result), 0);  // receives never complete here with UCS_OK
  if (op->done) erase(op);
}

void UcxTransport::on_send(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<UcxOp*>(user_data);
  ucp_request_free(request);
  op->ucx_request = nullptr;
  op->ucx_done = true;
  UcxTransport* self = op->transport;
  self->finish(op, status, op->bytes);
  if (!op->posting && op->done) self->erase(op);
}

void UcxTransport::on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<UcxOp*>(user_data);
  ucp_request_free(request);
  op->ucx_request = nullptr;
  op->ucx_done = true;
  UcxTransport* self = op->transport;
  self->finish(op, status, info != nullptr ? info->length : 0);
  if (!op->posting && op->done) self->erase(op);
}

// Records how `op` ended, unless a single-copy exchange goes on. Does not erase it
// (the caller does, once done).
void UcxTransport::finish(UcxOp* op, ucs_status_t status, size_t length) {
  ++events_;
  if (cma_continues(*op, status, length)) return;
  op->done = true;
  switch (op->kind) {
    case UcxOp::Kind::kControlRecv: {
      lanes_[static_cast<size_t>(op->lane)].control_posted = false;  // drive() re-posts, outside UCX callbacks
      if (status == UCS_OK) {
        auto frame = decode_control(std::span<const uint8_t>(op->storage.data(), length));
        const int sender = frame ? frame->sender : -1;
        if (!frame || sender < 0 || sender >= size_ || sender == rank_) {
          log(LogLevel::kWarn, "ucx: rank {} dropped a malformed control message ({} bytes)", rank_, length);
        } else if (frame->kind == ControlKind::kReceipt) {
          int& owed = peers_[static_cast<size_t>(sender)].receipts_owed;
          owed = std::max(owed - 1, 0);
        } else if (frame->kind == ControlKind::kAbort) {
          receipts_due_.push_back(ControlMessage{frame->message.code, sender, frame->message.seq, {}});
          aborts_.push_back(std::move(frame->message));
        } else {
          take_liveness(frame->kind, sender, frame->message.seq);
        }
      } else if (status != UCS_ERR_CANCELED) {
        log(LogLevel::kWarn, "ucx: rank {}: abort receive failed: {}", rank_, ucs_status_string(status));
      }
      return;
    }
    case UcxOp::Kind::kControlSend:
      return;  // best effort: nobody waits
    case UcxOp::Kind::kSend:
    case UcxOp::Kind::kRecv:
      if (UcxRequest* owner = op->owner) {
        op->owner = nullptr;
        owner->op_ = 0;
        if (owner->pending()) settle(*owner, *op, status, length);
      }
      return;
  }
}

void UcxTransport::settle(UcxRequest& request, const UcxOp& op, ucs_status_t status, size_t length) {
  const bool send = op.kind == UcxOp::Kind::kSend;
  if (status == UCS_OK) {
    request.complete(send ? op.bytes : length);
    return;
  }
  const char* what = send ? "send to" : "receive from";
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    request.fail(RequestState::kTruncated,
                 fmt::format("ucx: rank {} {} rank {} (tag {:#x}): the message is longer than the {}-byte buffer",
                             rank_, what, op.peer, op.tag, op.bytes));
    return;
  }
  const Peer& peer = peers_[static_cast<size_t>(op.peer)];
  std::string error = fmt::format("ucx: rank {} {} rank {} (tag {:#x}, {} bytes) failed: {}", rank_, what, op.peer,
                                  op.tag, op.bytes, ucs_status_string(status));
  if (peer.failed) {
    request.fail(RequestState::kPeerFailed, peer.error);
  } else if (is_peer_error(status)) {
    request.fail(RequestState::kPeerFailed, std::move(error));
  } else {
    request.fail(RequestState::kFailed, std::move(error));
  }
}

// ---- progress and waiting -----------------------------------------------------------

bool UcxTransport::drive() {
  const uint64_t before = events_;
  for (const UcxLane& lane : lanes_) {
    for (int i = 0; i < kUcxMaxProgressRounds && ucp_worker_progress(lane.worker) != 0; ++i) {
    }
  }
  if (const auto now = Clock::now(); now - last_kick_ >= kUcxKeepaliveKick) {
    last_kick_ = now;
    for (const UcxLane& lane : lanes_) {
      for (int i = 0; i < kUcxKeepaliveIterSkip; ++i) ucp_worker_progress(lane.worker);
    }
  }
  if (!cma_reads_.empty()) run_cma_reads();
  if ((link_watch_ || watching_processes_) && !closing_) {
    const auto now = Clock::now();
    if (link_watch_ && now >= next_link_poll_) poll_links(now);
    if (watching_processes_ && now >= next_process_poll_) poll_processes(now);
  }
  if (peers_newly_failed_) cancel_receives_from_failed();
  for (size_t i = 0; i < lanes_.size(); ++i) {
    if (!lanes_[i].control_posted && !closing_) post_control_recv(static_cast<int>(i));
  }
  if (!receipts_due_.empty()) send_receipts();
  if (!pongs_due_.empty() || departures_due_) answer_liveness();
  return events_ != before;
}

void UcxTransport::wait_for_event(std::chrono::microseconds max_wait) {
  if (max_wait.count() <= 0 || !cma_reads_.empty()) return;
  if (polled_sends_ > 0 && !abandoned_) {
    // A send to a shared-memory peer may be waiting for room in its FIFO (large
    // messages go through it in 8K fragments, since peer error mode leaves cma out), and
    // nothing raises an event when room appears: a worker asleep on its event fd would
    // move on only at its next timeout. So while such a send is in flight this rank
    // yields instead of sleeping: 2 to 20 times faster on 2 cores, loaded or not
    // (bench/results/tuning-notes-2026-11-27.md#shared-memory-sends-yield).
    // Not for TCP peers: a socket that drains does raise an event, and polling there
    // only takes CPU from the other ranks. Not after a failure either: sends that
    // cannot finish then stay until destruction.
    sched_yield();
    return;
  }
  // Arm fails with BUSY when events are already queued: the caller should progress now.
  pollfd fds[2]{};
  for (size_t i = 0; i < lanes_.size() && i < 2; ++i) {
    if (ucp_worker_arm(lanes_[i].worker) != UCS_OK) return;
    fds[i] = pollfd{lanes_[i].event_fd, POLLIN, 0};
  }
  const auto sleep = std::min<std::chrono::microseconds>(max_wait, kUcxMaxSleep);
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(sleep.count() / 1'000'000);
  ts.tv_nsec = static_cast<long>((sleep.count() % 1'000'000) * 1000);
  (void)ppoll(fds, std::min<nfds_t>(lanes_.size(), 2), &ts, nullptr);  // EINTR or timeout: both mean "go progress"
}

// ucp_worker_signal is safe from any thread (ucp.h); it makes the next arm fail
// with BUSY or wakes the poll above, so a signal is never lost.
void UcxTransport::interrupt() {
  for (const UcxLane& lane : lanes_) (void)ucp_worker_signal(lane.worker);
}

// ---- control channel -------------------------------------------------------------

void UcxTransport::post_control_recv(int lane) {
  // A loop because an abort already waiting completes the receive at once;
  // bounded so that a worker failing every post cannot spin here.
  UcxLane& l = lanes_[static_cast<size_t>(lane)];
  for (int attempt = 0; attempt < 64 && !l.control_posted && !closing_; ++attempt) {
    UcxOp* op = new_op(UcxOp::Kind::kControlRecv, -1, 0, kControlWireBytes, nullptr);
    op->lane = lane;
    op->storage.resize(kControlWireBytes);
    ucp_request_param_t param{};
    recv_params(op, param);
    l.control_posted = true;
    after_post(op, ucp_tag_recv_nbx(l.worker, op->storage.data(), op->storage.size(), ucx_control_tag(0),
                                    kUcxControlMask, &param));
  }
}

bool UcxTransport::send_control(int rank, const std::vector<uint8_t>& payload) {
  const Peer& peer = peers_[static_cast<size_t>(rank)];
  if (peer.rank == rank_ || peer.failed || peer.ep == nullptr) return false;
  UcxOp* op = new_op(UcxOp::Kind::kControlSend, peer.rank, 0, payload.size(), nullptr);
  op->storage = payload;  // the UcxOp owns the bytes until UCX is done with them
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransport::on_send;
  param.user_data = op;
  after_post(op, ucp_tag_send_nbx(peer.ep, op->storage.data(), op->storage.size(), ucx_control_tag(rank_), &param));
  return true;
}

void UcxTransport::send_abort(const ControlMessage& message) {
  try {
    const std::vector<uint8_t> payload = encode_control(message, ControlKind::kAbort, rank_);
    for (Peer& peer : peers_) {
      if (send_control(peer.rank, payload)) ++peer.receipts_owed;
    }
  } catch (...) {
    // Best effort by contract: the caller is already failing and peers may be dead.
  }
}

void UcxTransport::send_receipts() {
  std::vector<ControlMessage> due;
  due.swap(receipts_due_);
  try {
    for (const ControlMessage& abort : due) {
      const ControlMessage receipt{abort.code, rank_, abort.seq, {}};
      send_control(abort.origin, encode_control(receipt, ControlKind::kReceipt, rank_));
    }
  } catch (...) {
    // Best effort, as the aborts themselves: the sender waits for receipts only so long.
  }
}

bool UcxTransport::receipts_in() const {
  return std::all_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.receipts_owed == 0 || p.failed; });
}

std::optional<ControlMessage> UcxTransport::poll_abort() {
  if (aborts_.empty()) return std::nullopt;
  ControlMessage message = std::move(aborts_.front());
  aborts_.pop_front();
  return message;
}

std::unique_ptr<Transport> create_ucx_transport(int rank, int size, Store& store, const UcxOptions& options) {
  if (size < 1 || size > kUcxMaxRanks || rank < 0 || rank >= size) {
    throw InvalidArgument(
        fmt::format("ucx: rank {} of world size {} is out of range (1..{} ranks)", rank, size, kUcxMaxRanks));
  }
  return std::make_unique<UcxTransport>(rank, size, store, options);
}

}  // namespace gradcomm::detail
