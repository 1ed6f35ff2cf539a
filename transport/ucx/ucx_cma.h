// Single-copy rendezvous between ranks of one host ("cma", cross-memory attach).
//
// Why. In peer error mode UCX 1.13 leaves its own cma transport out, so a large message
// between ranks of one host crosses the sysv FIFO in 8 KiB fragments, copied twice
// (bench/results/latency-2026-11-26.md: 0.36-0.64x OpenMPI's own shared memory at 256
// KiB-16 MiB). Here the receiver copies once, straight from the sender's buffer into
// the posted receive buffer, with process_vm_readv.
//
// The exchange, for a send of at least GRADCOMM_CMA_MIN_BYTES to a peer that can read
// this rank's memory (probed at connection, below):
//  1. The sender claims a slot in its slot table (a transport-lifetime array in its own
//     memory), writes the exchange's generation into it, and sends a descriptor
//     (cookie, generation, slot, address, length) over UCX as the message itself, on
//     its own tag. Plain messages and descriptors of one tag thus travel in one UCX
//     stream and match receives in the order sent, so transport.h's ordering holds. The
//     receiver tells a descriptor by its length (40 bytes) and its first 8 bytes: the
//     sender's cookie, a random number it published in the store (the probe, below). A
//     plain 40-byte message would have to begin with that number to pass for one (odds
//     2^-64), and would then fail loudly: its slot would not hold its generation. (A
//     tag bit would be neater, but UCX 1.13 does not report the matched tag reliably:
//     measured, the callback's sender_tag held garbage.)
//  2. The receiver's UCX receive completes with the descriptor. A length above the
//     receive buffer is kTruncated, as for a plain message. Otherwise the read is
//     queued and done in drive(), outside UCX callbacks: the bytes go straight into the
//     posted buffer, then the receiver reads the sender's slot again. Only if it still
//     holds the generation is the receive kDone: a sender clears the slot before it
//     lets go of the buffer (an abandoned Request, the transport's destruction), and a
//     generation is never written twice, so an unchanged slot after the copy means the
//     buffer was the sender's throughout.
//  3. The receiver answers with an ack (a UCX active message: delivered, truncated or
//     failed). The sender's request completes only then; until then the buffer is the
//     receiver's to read, as transport.h requires of every send anyway.
//
// Faults. A receiver's failed read (ESRCH: the sender is gone; EFAULT, EPERM; or a
// cleared slot) makes that receive kPeerFailed with what happened; ESRCH also fails the
// peer. A sender waiting for the ack of a peer that died fails through the endpoint
// error callback like any request to it (fail_peer marks every pending request to the
// peer). An abandoned send waits no longer than a plain one (kUcxAbandonWait, none
// after abandon_pending()) and then clears its slot; an abandoned receive drops its
// queued read. Nothing here blocks: a stopped peer is a TimeoutError at the caller's
// deadline, as before.
//
// Probe. A transport publishes (pid, slot table address, cookie) in the store; each
// rank tries to read every shared-memory peer's cookie and publishes which it could,
// and a rank sends descriptors to a peer only when that peer could read it. So a
// container that forbids process_vm_readv (no ptrace-read permission), ranks in
// separate pid namespaces, or a user's UCX_TLS keep the FIFO path, logged at
// GRADCOMM_LOG=info with the reason.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gradcomm::detail {

// GRADCOMM_CMA_MIN_BYTES: the smallest send that goes by descriptor (0: never). Below
// it the FIFO's eager path needs no ack round trip. 64 KiB is a choice, not tuned:
// bench/results/cma-2026-11-27.md measures 256 KiB and up, with and without it.
inline constexpr int64_t kCmaDefaultMinBytes = int64_t{64} << 10;
inline constexpr size_t kCmaSlots = size_t{1} << 14;  // descriptors one rank may have unacknowledged
inline constexpr unsigned kCmaAckAmId = 7;            // the ack's active-message id

// Little-endian u64 cookie | u64 generation | u64 slot index | u64 address | u64
// length.
struct CmaDescriptor {
  uint64_t cookie = 0;
  uint64_t generation = 0;
  uint64_t slot = 0;
  uint64_t address = 0;
  uint64_t length = 0;
};
inline constexpr size_t kCmaDescriptorBytes = 40;
std::vector<uint8_t> encode_cma_descriptor(const CmaDescriptor& descriptor);
// nullopt unless `length` is a descriptor's and it begins with `cookie`.
std::optional<CmaDescriptor> decode_cma_descriptor(const uint8_t* bytes, size_t length, uint64_t cookie);

enum class CmaOutcome : uint8_t { kDelivered = 0, kTruncated = 1, kFailed = 2 };
// Little-endian u64 generation | u64 slot | i32 receiver rank | u8 outcome.
struct CmaAck {
  uint64_t generation = 0;
  uint64_t slot = 0;
  int receiver = -1;
  CmaOutcome outcome = CmaOutcome::kFailed;
};
inline constexpr size_t kCmaAckBytes = 21;
std::vector<uint8_t> encode_cma_ack(const CmaAck& ack);
std::optional<CmaAck> decode_cma_ack(const void* bytes, size_t length);

// What a rank publishes for its peers' probe: little-endian u64 pid | u64 slot table
// address | u64 cookie.
struct CmaProbeRecord {
  uint64_t pid = 0;
  uint64_t table = 0;
  uint64_t cookie = 0;
};
std::vector<uint8_t> encode_cma_probe(const CmaProbeRecord& record);
std::optional<CmaProbeRecord> decode_cma_probe(const std::vector<uint8_t>& bytes);

// The sender's slot table: kCmaSlots words another process reads with process_vm_readv,
// and one more holding the probe's cookie. A slot holds the generation of the exchange
// using it, or 0. Generations are this table's random nonce xor a counter, so no two
// exchanges (and, but with odds of 2^-64, no other table or freed memory) show the same
// one. Single-threaded, like the transport.
class CmaSlots {
 public:
  CmaSlots();
  ~CmaSlots();  // clears every slot first: a late reader finds its exchange gone
  CmaSlots(const CmaSlots&) = delete;
  CmaSlots& operator=(const CmaSlots&) = delete;

  CmaProbeRecord probe_record() const;
  // Claims a slot for the Op `op_id`: a descriptor with its generation and slot (the
  // caller adds address and length), or nullopt when the slot the counter points at is
  // still busy (the caller then sends the plain way).
  std::optional<CmaDescriptor> claim(uint64_t op_id);
  // The Op holding `generation` in `slot`, or 0 when that exchange is not live.
  uint64_t op_of(uint64_t slot, uint64_t generation) const;
  // Clears the slot if it still holds `generation`.
  void release(uint64_t slot, uint64_t generation);
  // Where slot `slot` lies in a table at address `table` (of any process).
  static uint64_t slot_address(uint64_t table, uint64_t slot) { return table + slot * sizeof(uint64_t); }

 private:
  std::unique_ptr<std::atomic<uint64_t>[]> words_;  // kCmaSlots slots, then the cookie
  std::vector<uint64_t> ops_;                       // the Op id per slot
  uint64_t nonce_ = 0;
  uint64_t counter_ = 0;
};

// Reads `length` bytes at `address` in process `pid` into `out`, then the word at
// `slot` there, which must still equal `generation`. Returns 0, an errno value (ESRCH,
// EFAULT, EPERM, ...), or ECANCELED when the slot no longer holds it.
int cma_read(pid_t pid, void* out, uint64_t address, uint64_t length, uint64_t slot, uint64_t generation);

// The probe: whether this process can read the cookie `record` names. Empty when it
// can, else why not.
std::string cma_probe(const CmaProbeRecord& record);

}  // namespace gradcomm::detail
