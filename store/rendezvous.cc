#include "store/rendezvous.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <unistd.h>  // getpid, gethostname

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "bytes.h"
#include "env.h"
#include "gradcomm/errors.h"
#include "logging.h"
#include "store/auth.h"

namespace gradcomm::detail {

namespace {

// Layout (little-endian): magic[4] "GCRV", version u8, reserved[3] (0), rank u32,
// world_size u32, generation u64, process u64, pid u32, host_len u32, payload_len u32,
// then host, payload, and the 32-byte tag over (key, 0, everything before the tag).
constexpr uint8_t kMagic[4] = {'G', 'C', 'R', 'V'};
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = 44;
constexpr size_t kTagBytes = 32;
constexpr size_t kMaxHostBytes = 255;

RecordTag tag_of(std::string_view key, std::span<const uint8_t> framed, std::string_view token) {
  std::vector<uint8_t> message(key.begin(), key.end());
  message.push_back(0);
  message.insert(message.end(), framed.begin(), framed.end());
  return make_record_tag(token, message);
}

std::string host_name() {
  char name[kMaxHostBytes + 1] = {};
  if (::gethostname(name, kMaxHostBytes) != 0) return "?";
  return name;
}

std::string counter_key(int rank) { return fmt::format("gradcomm/rank/{}/generation", rank); }
std::string generation_prefix(int64_t generation) { return fmt::format("gradcomm/g{}/", generation); }
std::string join_key(int64_t generation, int rank) {
  return fmt::format("{}join/{}", generation_prefix(generation), rank);
}
std::string error_key(int64_t generation) { return generation_prefix(generation) + "error"; }

// What a generation's error record says: its first payload byte; text follows.
enum Report : uint8_t {
  kFound = 1,   // a problem with the job one rank found (world sizes, a rank claimed twice): InvalidArgument
  kFailed = 2,  // the writer's own creation failed ("TransportError: ..." follows): PeerFailure elsewhere
  kLeft = 3,    // the writer's connection to the store closed before it had joined (its last will)
};

}  // namespace

uint64_t rendezvous_process_id() {
  static std::mutex mutex;
  static pid_t owner = 0;
  static uint64_t id = 0;
  std::lock_guard lock(mutex);
  if (owner != ::getpid()) {  // first use, or a forked child: a process of its own
    if (RAND_bytes(reinterpret_cast<uint8_t*>(&id), sizeof id) != 1) {
      id = (static_cast<uint64_t>(::getpid()) << 32) ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    }
    owner = ::getpid();
  }
  return id;
}

std::vector<uint8_t> encode_rendezvous_record(const RendezvousRecord& record, std::string_view key,
                                              std::string_view token) {
  const std::string host = record.host.substr(0, kMaxHostBytes);
  std::vector<uint8_t> out(kHeaderBytes + host.size() + record.payload.size());
  std::copy(std::begin(kMagic), std::end(kMagic), out.begin());
  out[4] = kVersion;
  put_u32(&out[8], static_cast<uint32_t>(record.rank));
  put_u32(&out[12], static_cast<uint32_t>(record.world_size));
  put_u64(&out[16], record.generation);
  put_u64(&out[24], record.process);
  put_u32(&out[32], record.pid);
  put_u32(&out[36], static_cast<uint32_t>(host.size()));
  put_u32(&out[40], static_cast<uint32_t>(record.payload.size()));
  std::copy(host.begin(), host.end(), out.begin() + kHeaderBytes);
  std::copy(record.payload.begin(), record.payload.end(), out.begin() + kHeaderBytes + host.size());
  const RecordTag tag = tag_of(key, out, token);
  out.insert(out.end(), tag.begin(), tag.end());
  return out;
}

RendezvousRecord decode_rendezvous_record(std::span<const uint8_t> bytes, std::string_view key,
                                          std::string_view token, std::string_view store_address) {
  const auto refuse = [&](std::string_view why) {
    throw TransportError(fmt::format(
        "store {}: key {} holds {} bytes that are not a gradcomm rendezvous record ({}); a rank of this job did not "
        "write them{}",
        store_address, key, bytes.size(), why,
        token.empty() ? " (without GRADCOMM_JOB_TOKEN anyone who can reach the store can write to it)" : ""));
  };
  if (bytes.size() < kHeaderBytes + kTagBytes) refuse("too short");
  if (!std::equal(std::begin(kMagic), std::end(kMagic), bytes.begin())) refuse("bad magic");
  if (bytes[4] != kVersion) refuse(fmt::format("version {} (expected {})", bytes[4], kVersion));
  const uint64_t host_len = get_u32(&bytes[36]);
  const uint64_t payload_len = get_u32(&bytes[40]);
  if (host_len > kMaxHostBytes || kHeaderBytes + host_len + payload_len + kTagBytes != bytes.size()) {
    refuse("lengths do not add up");
  }
  const size_t framed = bytes.size() - kTagBytes;
  const RecordTag expected = tag_of(key, bytes.first(framed), token);
  if (CRYPTO_memcmp(expected.data(), bytes.data() + framed, kTagBytes) != 0) {
    refuse(token.empty() ? "checksum mismatch" : "MAC mismatch: written without this job's token, or altered");
  }
  RendezvousRecord record;
  record.rank = static_cast<int>(get_u32(&bytes[8]));
  record.world_size = static_cast<int>(get_u32(&bytes[12]));
  record.generation = get_u64(&bytes[16]);
  record.process = get_u64(&bytes[24]);
  record.pid = get_u32(&bytes[32]);
  record.host.assign(bytes.begin() + kHeaderBytes, bytes.begin() + kHeaderBytes + static_cast<ptrdiff_t>(host_len));
  record.payload.assign(bytes.begin() + kHeaderBytes + static_cast<ptrdiff_t>(host_len), bytes.begin() + framed);
  return record;
}

RendezvousStore::RendezvousStore(std::unique_ptr<Store> base, int rank, int world_size, std::string job_token,
                                 bool hosts_store)
    : base_(std::move(base)),
      rank_(rank),
      world_size_(world_size),
      token_(std::move(job_token)),
      hosts_store_(hosts_store) {
  const int64_t generation = base_->add(counter_key(rank_), 1);
  if (generation < 1) {
    throw TransportError(fmt::format("store {}: add('{}', 1) returned {}: not a counter (a broken store?)",
                                     base_->address(), counter_key(rank_), generation));
  }
  generation_ = static_cast<uint64_t>(generation);
  prefix_ = generation_prefix(static_cast<int64_t>(generation_));
  self_.rank = rank_;
  self_.world_size = world_size_;
  self_.generation = generation_;
  self_.process = rendezvous_process_id();
  self_.pid = static_cast<uint32_t>(::getpid());
  self_.host = host_name();
  const std::string key = join_key(static_cast<int64_t>(generation_), rank_);
  base_->set(key, encode_rendezvous_record(self_, key, token_));
  RendezvousRecord left = self_;
  left.payload = {kLeft};
  const std::string error = error_key(static_cast<int64_t>(generation_));
  will_ = base_->set_last_will(error, encode_rendezvous_record(left, error, token_));
  // What a failed generation left (a successful one is retired at once). Not the
  // previous one: a rank that comes late to it still reads why it failed.
  if (rank_ == 0 && generation_ > 2) erase_generation(static_cast<int64_t>(generation_) - 2);
  // A rank that comes late may find every address there (a dead rank's too): it looks here once.
  check_reported_error();
}

std::unique_ptr<LastWill> RendezvousStore::set_last_will(const std::string& key, std::span<const uint8_t> value) {
  RendezvousRecord record = self_;
  record.payload.assign(value.begin(), value.end());
  const std::string full = prefix_ + key;
  return base_->set_last_will(full, encode_rendezvous_record(record, full, token_));
}

void RendezvousStore::retire() {
  if (rank_ == 0) erase_generation(static_cast<int64_t>(generation_));
}

void RendezvousStore::erase_generation(int64_t generation) {
  try {
    base_->erase_prefix(generation_prefix(generation));
  } catch (const Error& e) {
    log(LogLevel::kWarn, "rank {}: could not delete generation {}'s keys from store {}: {}", rank_, generation,
        base_->address(), e.what());
  }
}

void RendezvousStore::publish(uint8_t kind, const std::string& text, int64_t generation) {
  RendezvousRecord record = self_;
  record.payload.reserve(1 + text.size());
  record.payload.push_back(kind);
  record.payload.insert(record.payload.end(), text.begin(), text.end());
  const std::string key = error_key(generation);
  base_->set(key, encode_rendezvous_record(record, key, token_));
}

void RendezvousStore::report_failure(const Error& error) {
  if (reported_ || error.code() == ErrorCode::kTimeout || error.code() == ErrorCode::kPeerFailure) return;
  reported_ = true;
  try {
    publish(kFailed, fmt::format("{}: {}", error_code_name(error.code()), error.what()),
            static_cast<int64_t>(generation_));
  } catch (const Error&) {
    return;  // best effort: the store may be what failed
  }
  if (hosts_store_) std::this_thread::sleep_for(kHostLinger);
}

void RendezvousStore::set(const std::string& key, std::span<const uint8_t> value) {
  RendezvousRecord record = self_;
  record.payload.assign(value.begin(), value.end());
  const std::string full = prefix_ + key;
  base_->set(full, encode_rendezvous_record(record, full, token_));
}

int64_t RendezvousStore::add(const std::string& key, int64_t delta) { return base_->add(prefix_ + key, delta); }

std::string RendezvousStore::who(const RendezvousRecord& record) const {
  return fmt::format("rank {} (pid {} on {})", record.rank, record.pid, record.host);
}

void RendezvousStore::fail(const std::string& message, std::initializer_list<int64_t> generations) {
  // Tell the ranks still waiting, through the store, before this process goes away:
  // they would otherwise wait for a rank that is not coming. Best effort.
  reported_ = true;
  try {
    for (int64_t g : generations) {
      if (g >= 1) publish(kFound, message, g);
    }
  } catch (const Error&) {
  }
  // The host of the store stays a moment, so that they can read it.
  if (hosts_store_) std::this_thread::sleep_for(kHostLinger);
  throw InvalidArgument(message);
}

void RendezvousStore::check_reported_error() {
  std::optional<RendezvousRecord> report = peek(error_key(static_cast<int64_t>(generation_)), false);
  if (!report) return;
  reported_ = true;
  // Another rank found it, failed or went away; the others may not have read it yet.
  if (hosts_store_) std::this_thread::sleep_for(kHostLinger);
  const std::vector<uint8_t>& payload = report->payload;
  const uint8_t kind = payload.empty() ? 0 : payload[0];
  const std::string text(payload.begin() + (payload.empty() ? 0 : 1), payload.end());
  switch (kind) {
    case kFailed:
      throw PeerFailure(fmt::format("{} failed during creation: {}", who(*report), text));
    case kLeft:
      throw PeerFailure(fmt::format("{} left or died during creation: its connection to the store closed before it "
                                    "had read the others' addresses (killed by a signal, or exited)",
                                    who(*report)));
    default:
      throw InvalidArgument(fmt::format("{} found: {}", who(*report), text));
  }
}

void RendezvousStore::throw_world_size_mismatch(const RendezvousRecord& theirs) {
  fail(fmt::format("world size mismatch: {} was started with world size {}, this rank, {}, with {}; every rank "
                   "must be given the same WORLD_SIZE",
                   who(theirs), theirs.world_size, who(self_), world_size_),
       {static_cast<int64_t>(generation_)});
}

RendezvousRecord RendezvousStore::checked(std::span<const uint8_t> bytes, const std::string& full_key) {
  RendezvousRecord record = decode_rendezvous_record(bytes, full_key, token_, base_->address());
  if (record.world_size != world_size_) throw_world_size_mismatch(record);
  if (record.generation != generation_) {
    throw TransportError(fmt::format("store {}: key {} holds a record of generation {} (expected {})",
                                     base_->address(), full_key, record.generation, generation_));
  }
  return record;
}

std::optional<RendezvousRecord> RendezvousStore::peek(const std::string& full_key, bool check_world_size) {
  std::vector<uint8_t> bytes;
  try {
    bytes = base_->get(full_key, std::chrono::milliseconds(0));
  } catch (const TimeoutError&) {
    return std::nullopt;
  }
  RendezvousRecord record = decode_rendezvous_record(bytes, full_key, token_, base_->address());
  if (check_world_size && record.world_size != world_size_) throw_world_size_mismatch(record);
  return record;
}

int64_t RendezvousStore::generation_of(int rank) { return base_->add(counter_key(rank), 0); }

std::vector<int> RendezvousStore::scan() {
  const auto g = static_cast<int64_t>(generation_);
  std::vector<int> missing;
  for (int r = 0; r < world_size_; ++r) {
    std::optional<RendezvousRecord> here = r == rank_ ? self_ : peek(join_key(g, r));
    if (!here) {
      missing.push_back(r);
      continue;
    }
    // Rank r joined this generation, and its counter has gone past it: one process
    // re-creating sooner than we do keeps its identity; a second process has another.
    const int64_t at = generation_of(r);
    for (int64_t later = g + 1; later <= at; ++later) {
      std::optional<RendezvousRecord> again = peek(join_key(later, r));
      if (again && again->process != here->process) {
        fail(fmt::format("rank {} joined twice: {} and pid {} on {} both claim it; check RANK (or the launcher's "
                         "rank assignment)",
                         r, who(*here), again->pid, again->host),
             {g, later});
      }
    }
  }
  return missing;
}

void RendezvousStore::check_claimed_elsewhere() {
  // Seen from the second process: its previous generation belongs to another process,
  // and the job has not come this far (rank 0, or rank 1 for rank 0, is behind).
  const auto g = static_cast<int64_t>(generation_);
  if (g < 2 || world_size_ < 2 || generation_of(rank_ == 0 ? 1 : 0) >= g) return;
  std::optional<RendezvousRecord> before = peek(join_key(g - 1, rank_));
  if (before && before->process != self_.process) {
    fail(fmt::format("rank {} joined twice: this process (pid {} on {}) and {} both claim it; check RANK (or the "
                     "launcher's rank assignment). (If that process died, this store still holds its "
                     "registration: start the job with a fresh store.)",
                     rank_, self_.pid, self_.host, who(*before)),
         {g - 1, g});
  }
}

std::vector<uint8_t> RendezvousStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string full = prefix_ + key;
  const Deadline deadline = Deadline::after(timeout);
  Deadline next_scan = Deadline::after(kDiagnoseAfter);
  while (true) {
    try {
      return checked(base_->get(full, std::min(deadline.remaining(), kSlice)), full).payload;
    } catch (const TimeoutError& e) {
      if (deadline.expired()) {
        std::vector<int> missing;
        try {
          missing = scan();
        } catch (const TimeoutError&) {
        }
        if (missing.empty()) throw;
        throw TimeoutError(fmt::format("{} (ranks that have not joined generation {}: {})", e.what(), generation_,
                                       fmt::join(missing, ", ")));
      }
    }
    // Every slice: what another rank found. Once the wait is long enough to be odd,
    // also this rank's own claim; and rank 0 alone scans every rank (a store round
    // trip or two per rank), once per kDiagnoseAfter, so that a slow start at scale
    // does not become N^2 requests on the store.
    check_reported_error();
    if (!next_scan.expired()) continue;
    check_claimed_elsewhere();
    if (rank_ == 0) {
      scan();
      next_scan = Deadline::after(kDiagnoseAfter);
    }
  }
}

}  // namespace gradcomm::detail
