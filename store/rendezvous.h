// RendezvousStore: a communicator's view of the job's store.
//
// Generations. Every communicator a rank creates against a store is that rank's next
// generation: the store's counter gradcomm/rank/<r>/generation, incremented by each
// creation. Ranks create their communicators in the same order, so the g-th one of
// every rank pairs with the g-th of the others, and its keys live under
// gradcomm/g<g>/. A rank that re-creates its communicator before another has torn its
// old one down therefore never reads that rank's stale address: it waits for the new
// one.
//
// Records. Every value set through it is framed: a header (magic, the writer's rank,
// world size, generation, process and host), the value, and a tag over the key and
// all of that: HMAC-SHA256 keyed by the job token, or SHA-256 without one. get()
// returns a value only when its frame and tag check out; anything else is a
// TransportError naming the key, and never reaches the transport (UCX asserts on a
// malformed worker address). Without a token the tag is a checksum: it stops garbage,
// not someone who can reach the store on purpose (the trust model:
// docs/fault-model.md, "The store and its token").
//
// Joining. The constructor publishes a join record (rank, world size, process) in the
// new generation. A value from a rank with another world size is InvalidArgument at
// once, naming both sizes. A get() that has waited kDiagnoseAfter starts asking why:
// a rank claimed by two processes ("rank R joined twice": rank 0 scans every rank's
// record once per kDiagnoseAfter, and the second claimant sees its own); at its
// deadline it names the ranks that have not joined.
// A rank that finds such a problem publishes it (gradcomm/g<g>/error), where every
// waiting rank looks each slice, and the rank that hosts the store lingers kHostLinger
// before it throws (whether it found the problem or read it), so that the others can
// read it before the store goes with it.
//
// Failing ranks. A rank whose own part of creation fails (its transport could not be
// set up) publishes its error there too (report_failure), and the others raise
// PeerFailure naming it and quoting it. A rank that cannot say anything (killed by a
// signal, or exited) is reported by the store itself: on joining, each rank leaves
// the store a last will (Store::set_last_will) that writes "left or died during
// creation" there if its connection closes first; done_joining() withdraws it once
// the rank has read every address, after which its death is the transport's to
// report. Stores that cannot notice a process going away (the file store) leave such
// a death to the deadline.
//
// Retirement. A generation's keys are read only while its ranks join. Rank 0 deletes
// them (erase_prefix of gradcomm/g<g>/) once its connect barrier has passed, which
// every rank enters only after reading all it needs (retire()); and, when it starts
// generation g, whatever a failed generation g - 2 left. So the store holds the
// per-rank counters and at most three generations (one while all goes well),
// however often communicators are re-created.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradcomm/errors.h"
#include "store/store.h"

namespace gradcomm::detail {

// What a rank publishes, as it travels.
struct RendezvousRecord {
  int rank = 0;
  int world_size = 0;
  uint64_t generation = 0;
  uint64_t process = 0;  // random per process (new after fork): tells two processes apart
  uint32_t pid = 0;
  std::string host;
  std::vector<uint8_t> payload;
};

// The frame of `record` stored at `key`, tagged with `token` (empty: SHA-256).
std::vector<uint8_t> encode_rendezvous_record(const RendezvousRecord& record, std::string_view key,
                                              std::string_view token);
// The record in `bytes` read from `key`; TransportError naming the key and the store
// when it is not a well-formed record with a matching tag.
RendezvousRecord decode_rendezvous_record(std::span<const uint8_t> bytes, std::string_view key,
                                          std::string_view token, std::string_view store_address);

// This process's identity in records (regenerated in a forked child).
uint64_t rendezvous_process_id();

class RendezvousStore final : public Store {
 public:
  // Joins `rank`'s next generation in `base` and publishes its join record.
  RendezvousStore(std::unique_ptr<Store> base, int rank, int world_size, std::string job_token,
                  bool hosts_store = false);

  uint64_t generation() const { return generation_; }
  std::string key_in_generation(const std::string& key) const { return prefix_ + key; }

  void set(const std::string& key, std::span<const uint8_t> value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string address() const override { return base_->address(); }
  size_t erase_prefix(const std::string& prefix) override { return base_->erase_prefix(prefix_ + prefix); }
  std::unique_ptr<LastWill> set_last_will(const std::string& key, std::span<const uint8_t> value) override;

  // This rank has read every key it needs: withdraws its last will.
  void done_joining() { will_.reset(); }
  // Called by every rank once its connect barrier has passed; rank 0 then deletes
  // the generation's keys. Best effort: a failure is logged, never thrown.
  void retire();
  // Publishes this rank's own failure during creation for the ranks waiting on it,
  // then, on the host of the store, lingers kHostLinger. Nothing is published when
  // the error is not news: a report this rank read or published, a timeout waiting
  // for another rank, or a lost store.
  void report_failure(const Error& error);

  static constexpr std::chrono::milliseconds kDiagnoseAfter{1000};
  static constexpr std::chrono::milliseconds kSlice{250};
  static constexpr std::chrono::milliseconds kHostLinger{2000};

 private:
  std::optional<RendezvousRecord> peek(const std::string& full_key, bool check_world_size = true);
  RendezvousRecord checked(std::span<const uint8_t> bytes, const std::string& full_key);
  // Publishes `message` as the error of `generations`, lingers if this rank hosts
  // the store, and throws it as InvalidArgument.
  [[noreturn]] void fail(const std::string& message, std::initializer_list<int64_t> generations);
  // Writes a report (its kind byte, then `text`) as the error of `generation`.
  void publish(uint8_t kind, const std::string& text, int64_t generation);
  void erase_generation(int64_t generation);
  void check_reported_error();
  [[noreturn]] void throw_world_size_mismatch(const RendezvousRecord& theirs);
  std::string who(const RendezvousRecord& record) const;
  int64_t generation_of(int rank);
  // Every rank's join record in this generation: throws for a rank claimed by two
  // processes; returns the ranks that have not joined.
  std::vector<int> scan();
  // Throws when this rank's previous generation belongs to another process.
  void check_claimed_elsewhere();

  std::unique_ptr<Store> base_;
  int rank_;
  int world_size_;
  std::string token_;
  bool hosts_store_;
  uint64_t generation_ = 0;
  std::string prefix_;
  RendezvousRecord self_;  // this rank's identity, payload empty
  std::unique_ptr<LastWill> will_;  // "left or died during creation", until done_joining()
  bool reported_ = false;           // this generation's error was published or read here
};

}  // namespace gradcomm::detail
