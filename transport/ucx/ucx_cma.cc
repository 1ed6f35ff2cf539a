// Single-copy rendezvous between ranks of one host: the wire formats, the slot table,
// the read, the probe, and the UcxTransport side of the exchange. The design and what
// holds are described in ucx_cma.h.
#include "transport/ucx/ucx_cma.h"

#include <fmt/format.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "logging.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace gradcomm::detail {

// ---- wire formats
// --------------------------------------------------------------------

namespace {

void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_u64(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace

std::vector<uint8_t> encode_cma_descriptor(const CmaDescriptor& d) {
  std::vector<uint8_t> out;
  out.reserve(kCmaDescriptorBytes);
  for (uint64_t v : {d.cookie, d.generation, d.slot, d.address, d.length}) put_u64(out, v);
  return out;
}

std::optional<CmaDescriptor> decode_cma_descriptor(const uint8_t* bytes, size_t length, uint64_t cookie) {
  if (length != kCmaDescriptorBytes || cookie == 0 || get_u64(bytes) != cookie) return std::nullopt;
  return CmaDescriptor{cookie, get_u64(bytes + 8), get_u64(bytes + 16), get_u64(bytes + 24), get_u64(bytes + 32)};
}

std::vector<uint8_t> encode_cma_ack(const CmaAck& ack) {
  std::vector<uint8_t> out;
  out.reserve(kCmaAckBytes);
  put_u64(out, ack.generation);
  put_u64(out, ack.slot);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(static_cast<uint32_t>(ack.receiver) >> (8 * i)));
  out.push_back(static_cast<uint8_t>(ack.outcome));
  return out;
}

std::optional<CmaAck> decode_cma_ack(const void* data, size_t length) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (length != kCmaAckBytes || bytes[20] > static_cast<uint8_t>(CmaOutcome::kFailed)) return std::nullopt;
  uint32_t receiver = 0;
  for (int i = 0; i < 4; ++i) receiver |= static_cast<uint32_t>(bytes[16 + i]) << (8 * i);
  return CmaAck{get_u64(bytes), get_u64(bytes + 8), static_cast<int32_t>(receiver), static_cast<CmaOutcome>(bytes[20])};
}

std::vector<uint8_t> encode_cma_probe(const CmaProbeRecord& record) {
  std::vector<uint8_t> out;
  for (uint64_t v : {record.pid, record.table, record.cookie}) put_u64(out, v);
  return out;
}

std::optional<CmaProbeRecord> decode_cma_probe(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != 24) return std::nullopt;
  return CmaProbeRecord{get_u64(bytes.data()), get_u64(bytes.data() + 8), get_u64(bytes.data() + 16)};
}

// ---- the slot table
// ------------------------------------------------------------------

CmaSlots::CmaSlots() : words_(new std::atomic<uint64_t>[kCmaSlots + 1]), ops_(kCmaSlots, 0) {
  std::random_device random;
  while (nonce_ == 0) nonce_ = (static_cast<uint64_t>(random()) << 32) ^ random();
  for (size_t i = 0; i < kCmaSlots; ++i) words_[i].store(0, std::memory_order_relaxed);
  words_[kCmaSlots].store(nonce_ * 0x9E3779B97F4A7C15ull | 1, std::memory_order_release);
}

CmaSlots::~CmaSlots() {
  for (size_t i = 0; i <= kCmaSlots; ++i) words_[i].store(0, std::memory_order_seq_cst);
}

CmaProbeRecord CmaSlots::probe_record() const {
  return CmaProbeRecord{static_cast<uint64_t>(::getpid()), reinterpret_cast<uint64_t>(words_.get()),
                        words_[kCmaSlots].load(std::memory_order_relaxed)};
}

std::optional<CmaDescriptor> CmaSlots::claim(uint64_t op_id) {
  const uint64_t count = ++counter_;
  const uint64_t slot = count % kCmaSlots;
  if (ops_[slot] != 0) return std::nullopt;
  const uint64_t generation = nonce_ ^ count;
  if (generation == 0) return std::nullopt;  // 0 means "free"; skip that one count
  ops_[slot] = op_id;
  // Release: the buffer's contents (written before the send was posted) are visible
  // before a reader can see the generation.
  words_[slot].store(generation, std::memory_order_release);
  return CmaDescriptor{words_[kCmaSlots].load(std::memory_order_relaxed), generation, slot, 0, 0};
}

uint64_t CmaSlots::op_of(uint64_t slot, uint64_t generation) const {
  if (slot >= kCmaSlots || words_[slot].load(std::memory_order_relaxed) != generation) return 0;
  return ops_[slot];
}

void CmaSlots::release(uint64_t slot, uint64_t generation) {
  if (slot >= kCmaSlots || words_[slot].load(std::memory_order_relaxed) != generation) return;
  // Seq_cst: the clear is visible before the caller hands the buffer back to its owner.
  words_[slot].store(0, std::memory_order_seq_cst);
  ops_[slot] = 0;
}

// ---- the read and the probe
// ---------------------------------------------------------------

namespace {

// One remote range into one local one; partial reads continue (the kernel stops at a
// page it cannot reach, and the next call reports why).
int read_remote(pid_t pid, void* out, uint64_t address, uint64_t length) {
  auto* to = static_cast<uint8_t*>(out);
  while (length > 0) {
    iovec local{to, length};
    iovec remote{reinterpret_cast<void*>(address), length};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno;
    if (got == 0) return EFAULT;
    to += got;
    address += static_cast<uint64_t>(got);
    length -= static_cast<uint64_t>(got);
  }
  return 0;
}

}  // namespace

int cma_read(pid_t pid, void* out, uint64_t address, uint64_t length, uint64_t slot, uint64_t generation) {
  if (const int error = read_remote(pid, out, address, length); error != 0) return error;
  uint64_t now = 0;
  if (const int error = read_remote(pid, &now, slot, sizeof now); error != 0) return error;
  return now == generation ? 0 : ECANCELED;
}

std::string cma_probe(const CmaProbeRecord& record) {
  uint64_t seen = 0;
  const int error =
      read_remote(static_cast<pid_t>(record.pid), &seen, CmaSlots::slot_address(record.table, kCmaSlots), sizeof seen);
  if (error != 0) return fmt::format("process_vm_readv of pid {}: {}", record.pid, std::strerror(error));
  if (seen != record.cookie || seen == 0) {
    return fmt::format(
        "pid {} is another process here (another pid "
        "namespace?): its cookie did not match",
        record.pid);
  }
  return {};
}

// ---- the transport's side
// -------------------------------------------------------------

// Two rounds through the store (no rank waits on one that has not published yet): every
// rank publishes its probe record; reads each shared-memory peer's and tries it;
// publishes one byte per rank, 1 where that rank's memory was readable; reads what each
// shared-memory peer could read of its own.
void UcxTransport::connect_cma(Store& store, const std::string& prefix, const Deadline& deadline) {
  cma_slots_ = std::make_unique<CmaSlots>();
  const auto key = [&](const char* what, int r) { return fmt::format("{}/ucx/{}/{}", prefix, what, r); };
  store.set(key("cma", rank_), encode_cma_probe(cma_slots_->probe_record()));
  std::vector<uint8_t> readable(static_cast<size_t>(size_), 0);
  for (Peer& peer : peers_) {
    if (!peer.shared_memory) continue;
    const auto record = decode_cma_probe(store.get(key("cma", peer.rank), deadline.remaining()));
    const std::string why = record ? cma_probe(*record) : "its probe record is malformed";
    if (why.empty()) {
      peer.cma_from = true;
      peer.pid = static_cast<pid_t>(record->pid);
      peer.cma_table = record->table;
      peer.cma_cookie = record->cookie;
      readable[static_cast<size_t>(peer.rank)] = 1;
    } else {
      log(LogLevel::kInfo,
          "ucx: rank {} cannot read rank {}'s memory ({}): its large messages "
          "take the FIFO",
          rank_, peer.rank, why);
    }
  }
  store.set(key("cmaok", rank_), readable);
  // GRADCOMM_CMA_MIN_BYTES: see ucx_cma.h. A user's UCX_TLS means they chose the
  // transports themselves (bench/cluster pins tcp,self): this rank then adds none.
  cma_min_bytes_ = env_bytes("GRADCOMM_CMA_MIN_BYTES", kCmaDefaultMinBytes, 0, int64_t{1} << 40);
  const char* off = cma_min_bytes_ == 0     ? "GRADCOMM_CMA_MIN_BYTES=0"
                    : env_string("UCX_TLS") ? "UCX_TLS is set"
                                            : nullptr;
  for (Peer& peer : peers_) {
    if (!peer.shared_memory) continue;
    const std::vector<uint8_t> theirs = store.get(key("cmaok", peer.rank), deadline.remaining());
    const bool can = theirs.size() == static_cast<size_t>(size_) && theirs[static_cast<size_t>(rank_)] == 1;
    peer.cma_to = can && off == nullptr;
    if (peer.cma_to) {
      log(LogLevel::kInfo,
          "ucx: rank {} sends messages of {} bytes or more to rank {} by "
          "single-copy read (cma)",
          rank_, cma_min_bytes_, peer.rank);
    } else {
      log(LogLevel::kInfo, "ucx: rank {} sends to rank {} through the FIFO only: {}", rank_, peer.rank,
          off != nullptr ? off : "it cannot read this rank's memory");
    }
  }
}

bool UcxTransport::cma_describe(UcxOp& op, const Peer& target, const void* data, size_t bytes) {
  if (!target.cma_to || bytes < static_cast<uint64_t>(cma_min_bytes_)) return false;
  std::optional<CmaDescriptor> descriptor = cma_slots_->claim(op.id);
  if (!descriptor) return false;
  descriptor->address = reinterpret_cast<uint64_t>(data);
  descriptor->length = bytes;
  op.cma = descriptor;
  op.storage = encode_cma_descriptor(*descriptor);
  return true;
}

void UcxTransport::cma_receive_into(UcxOp& op, const Peer& source, void* data, void*& target, size_t& capacity) {
  if (!source.cma_from) return;
  // A descriptor must land whole even in a receive smaller than it (a message it stands
  // for is then longer than the buffer: kTruncated, and the sender is told).
  op.cma_capable = true;
  op.data = data;
  if (capacity < kCmaDescriptorBytes) {
    op.storage.resize(kCmaDescriptorBytes);
    target = op.storage.data();
    capacity = op.storage.size();
  }
}

bool UcxTransport::cma_continues(UcxOp& op, ucs_status_t& status, size_t length) {
  if (op.kind == UcxOp::Kind::kSend && op.cma) {
    if (status == UCS_OK) return true;  // the descriptor is out: the ack completes the send
    cma_slots_->release(op.cma->slot, op.cma->generation);
    op.cma.reset();
    return false;
  }
  if (op.kind != UcxOp::Kind::kRecv || !op.cma_capable || status != UCS_OK) return false;
  const uint8_t* landed = op.storage.empty() ? static_cast<const uint8_t*>(op.data) : op.storage.data();
  const uint64_t cookie = peers_[static_cast<size_t>(op.peer)].cma_cookie;
  const std::optional<CmaDescriptor> descriptor = decode_cma_descriptor(landed, length, cookie);
  if (!descriptor) {  // a plain message
    if (op.storage.empty()) return false;
    if (length > op.bytes) {
      status = UCS_ERR_MESSAGE_TRUNCATED;
    } else if (length > 0) {
      std::memcpy(op.data, landed, length);
    }
    return false;
  }
  if (descriptor->length > op.bytes || op.owner == nullptr) {
    send_cma_ack(op.peer, *descriptor, op.owner == nullptr ? CmaOutcome::kFailed : CmaOutcome::kTruncated);
    status = op.owner == nullptr ? UCS_ERR_CANCELED : UCS_ERR_MESSAGE_TRUNCATED;
    return false;
  }
  op.cma = descriptor;
  cma_reads_.push_back(op.id);
  return true;
}

// Outside UCX callbacks (drive()): each queued receive reads its message, and its
// sender is told how that went.
void UcxTransport::run_cma_reads() {
  std::vector<uint64_t> queued;
  queued.swap(cma_reads_);
  for (uint64_t id : queued) {
    auto it = ops_.find(id);
    if (it == ops_.end()) continue;  // abandoned meanwhile (drop_cma_read)
    UcxOp* op = it->second.get();
    const CmaDescriptor descriptor = *op->cma;
    const int source = op->peer;
    const Peer& peer = peers_[static_cast<size_t>(source)];
    UcxRequest* owner = op->owner;
    op->owner = nullptr;
    op->done = true;
    ++events_;
    if (owner != nullptr) owner->op_ = 0;
    if (owner == nullptr || !owner->pending()) {  // failed meanwhile (fail_peer): nobody wants it
      send_cma_ack(source, descriptor, CmaOutcome::kFailed);
      erase(op);
      continue;
    }
    const uint64_t slot = CmaSlots::slot_address(peer.cma_table, descriptor.slot);
    const int error = cma_read(peer.pid, op->data, descriptor.address, descriptor.length, slot, descriptor.generation);
    if (error == 0) {
      owner->complete(descriptor.length);
      ++cma_reads_done_;
      cma_bytes_read_ += descriptor.length;
      send_cma_ack(source, descriptor, CmaOutcome::kDelivered);
      erase(op);
      continue;
    }
    std::string what = fmt::format(
        "ucx: rank {} receive from rank {} (tag {:#x}, {} bytes): "
        "reading it from pid {} (process_vm_readv) failed: {}",
        rank_, source, op->tag, descriptor.length, peer.pid,
        error == ECANCELED ? "the sender withdrew the message" : std::strerror(error));
    erase(op);
    owner->fail(RequestState::kPeerFailed, what);
    if (error == ESRCH) {
      fail_peer(source,
                std::move(what));  // the process is gone: everything with it fails now
    } else {
      send_cma_ack(source, descriptor, CmaOutcome::kFailed);
    }
  }
}

void UcxTransport::send_cma_ack(int rank, const CmaDescriptor& descriptor, CmaOutcome outcome) {
  const Peer& peer = peers_[static_cast<size_t>(rank)];
  if (peer.failed || peer.ep == nullptr || closing_) return;
  UcxOp* op = new_op(UcxOp::Kind::kControlSend, rank, 0, kCmaAckBytes, nullptr);
  op->storage = encode_cma_ack(CmaAck{descriptor.generation, descriptor.slot, rank_, outcome});
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = &UcxTransport::on_send;
  param.user_data = op;
  after_post(op, ucp_am_send_nbx(peer.ep, kCmaAckAmId, nullptr, 0, op->storage.data(), op->storage.size(), &param));
}

// Runs inside ucp_worker_progress. An ack for an exchange no longer live (withdrawn, or
// a stale or forged one) is ignored.
ucs_status_t UcxTransport::on_cma_ack(void* arg, const void*, size_t, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  // An ack is small and sent eager: its bytes are here (UCX 1.13 leaves recv_attr 0 for
  // such a message, measured, so only a rendezvous one is turned away).
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || !self->cma_slots_) return UCS_OK;
  const std::optional<CmaAck> ack = decode_cma_ack(data, length);
  if (!ack) return UCS_OK;
  auto it = self->ops_.find(self->cma_slots_->op_of(ack->slot, ack->generation));
  if (it == self->ops_.end() || it->second->peer != ack->receiver) return UCS_OK;
  UcxOp* op = it->second.get();
  self->cma_slots_->release(ack->slot, ack->generation);
  op->cma.reset();
  ++self->events_;
  if (UcxRequest* owner = op->owner) {
    op->owner = nullptr;
    owner->op_ = 0;
    if (owner->pending() && ack->outcome == CmaOutcome::kFailed) {
      owner->fail(RequestState::kFailed, fmt::format("ucx: rank {} send to rank {} (tag {:#x}, {} bytes): the "
                                                     "receiver could not read it (see its error)",
                                                     self->rank_, op->peer, op->tag, op->bytes));
    } else if (owner->pending()) {
      owner->complete(op->bytes);  // truncated: the receiver fails, as with a plain message
    }
  }
  if (op->ucx_done && !op->posting) {  // else the descriptor's own completion erases it
    op->done = true;
    self->erase(op);
  }
  return UCS_OK;
}

// A receive whose descriptor arrived but whose read has not run: its buffer goes with
// the Request, so the read is dropped and the sender told.
void UcxTransport::drop_cma_read(uint64_t id) {
  auto it = ops_.find(id);
  if (it == ops_.end() || it->second->kind != UcxOp::Kind::kRecv || !it->second->cma) return;
  send_cma_ack(it->second->peer, *it->second->cma, CmaOutcome::kFailed);
  erase(it->second.get());
}

// A send still waiting for its ack when its Request goes (after abandon() gave it the
// time a plain send gets): the slot is cleared first, so a read from here on fails at
// the receiver (ECANCELED) rather than return what the buffer holds next.
void UcxTransport::withdraw_cma_send(uint64_t id) {
  auto it = ops_.find(id);
  if (it == ops_.end() || it->second->kind != UcxOp::Kind::kSend || !it->second->cma) return;
  UcxOp* op = it->second.get();
  cma_slots_->release(op->cma->slot, op->cma->generation);
  op->cma.reset();
  if (op->ucx_request == nullptr) erase(op);  // else its completion callback erases it
}

}  // namespace gradcomm::detail
