#include "state.h"

#include <fmt/format.h>

#include <cstring>

#include "gradcomm/errors.h"

namespace gradcomm::detail {
namespace {

constexpr uint32_t kStateMagic = 0x31534347;  // "GCS1"
constexpr uint16_t kStateVersion = 2;
constexpr uint16_t kOldestVersion = 1;
constexpr uint64_t kMaxExtraBytes = uint64_t{1} << 40;
constexpr size_t kMaxKeyBytes = 4096;

class Writer {
 public:
  template <class T>
  void put(T value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof value);
  }
  void put_bytes(const void* data, size_t size) {
    const auto* p = static_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + size);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  template <class T>
  T get(const char* what) {
    T value;
    std::memcpy(&value, take(sizeof value, what), sizeof value);
    return value;
  }
  const uint8_t* take(size_t size, const char* what) {
    if (size > bytes_.size() - offset_) {
      throw CorruptPayload(fmt::format("load_state: truncated at byte {} reading {} ({} bytes needed, {} left)",
                                       offset_, what, size, bytes_.size() - offset_));
    }
    const uint8_t* p = bytes_.data() + offset_;
    offset_ += size;
    return p;
  }
  size_t offset() const { return offset_; }
  size_t remaining() const { return bytes_.size() - offset_; }

 private:
  std::span<const uint8_t> bytes_;
  size_t offset_ = 0;
};

}  // namespace

void take_back_from_device(KeyState& key) {
  if (!key.device) return;
  key.residual = key.device->residual_to_host();
  key.extra = key.device->extra_to_host();
  key.device.reset();
}

std::vector<uint8_t> serialize_state(const CompressionState& state, int rank, int world_size) {
  Writer w;
  w.put<uint32_t>(kStateMagic);
  w.put<uint16_t>(kStateVersion);
  w.put<uint16_t>(0);
  w.put<uint32_t>(static_cast<uint32_t>(world_size));
  w.put<uint32_t>(static_cast<uint32_t>(rank));
  w.put<uint64_t>(state.keys.size());
  for (const auto& [key, entry] : state.keys) {
    w.put<uint32_t>(static_cast<uint32_t>(key.size()));
    w.put_bytes(key.data(), key.size());
    w.put<uint64_t>(entry.step);
    w.put<uint8_t>(static_cast<uint8_t>(entry.dtype));
    w.put<int64_t>(entry.numel);
    const std::vector<uint8_t> on_device = entry.device ? entry.device->residual_to_host() : std::vector<uint8_t>{};
    const std::vector<uint8_t>& residual = entry.device ? on_device : entry.residual;
    w.put<uint64_t>(residual.size());
    w.put_bytes(residual.data(), residual.size());
    const std::vector<uint8_t> extra_on_device = entry.device ? entry.device->extra_to_host() : std::vector<uint8_t>{};
    const std::vector<uint8_t>& extra = entry.device ? extra_on_device : entry.extra;
    w.put<uint64_t>(extra.size());
    w.put_bytes(extra.data(), extra.size());
  }
  w.put<uint64_t>(fnv1a64(w.bytes()));
  return std::move(w.bytes());
}

CompressionState parse_state(std::span<const uint8_t> bytes, int rank, int world_size) {
  if (bytes.size() < 32) {
    throw CorruptPayload(fmt::format("load_state: {} bytes is shorter than the smallest state (32)", bytes.size()));
  }
  const auto body = bytes.first(bytes.size() - 8);
  uint64_t stored;
  std::memcpy(&stored, bytes.data() + body.size(), sizeof stored);
  Reader r(body);
  if (const auto magic = r.get<uint32_t>("magic"); magic != kStateMagic) {
    throw CorruptPayload(fmt::format("load_state: bad magic {:#010x}, expected {:#010x}", magic, kStateMagic));
  }
  const auto version = r.get<uint16_t>("version");
  if (version < kOldestVersion || version > kStateVersion) {
    throw CorruptPayload(fmt::format("load_state: format version {} unsupported (this build reads {} to {})", version,
                                     kOldestVersion, kStateVersion));
  }
  r.get<uint16_t>("reserved");
  if (const uint64_t actual = fnv1a64(body); actual != stored) {
    throw CorruptPayload(
        fmt::format("load_state: checksum mismatch (stored {:#018x}, computed {:#018x})", stored, actual));
  }
  const auto saved_world = r.get<uint32_t>("world size");
  const auto saved_rank = r.get<uint32_t>("rank");
  if (saved_world != static_cast<uint32_t>(world_size) || saved_rank != static_cast<uint32_t>(rank)) {
    throw InvalidArgument(fmt::format("load_state: state saved by rank {} of {} cannot load into rank {} of {}",
                                      saved_rank, saved_world, rank, world_size));
  }
  const auto count = r.get<uint64_t>("entry count");
  // Each entry takes at least 29 bytes: reject absurd counts before looping.
  if (count > r.remaining() / 29) {
    throw CorruptPayload(fmt::format("load_state: {} entries cannot fit in {} bytes", count, r.remaining()));
  }
  CompressionState state;
  for (uint64_t i = 0; i < count; ++i) {
    const auto key_bytes = r.get<uint32_t>("key length");
    if (key_bytes > kMaxKeyBytes) {
      throw CorruptPayload(fmt::format("load_state: entry {}: key of {} bytes (limit {})", i, key_bytes, kMaxKeyBytes));
    }
    std::string key(reinterpret_cast<const char*>(r.take(key_bytes, "key")), key_bytes);
    KeyState entry;
    entry.step = r.get<uint64_t>("step");
    const auto dtype = r.get<uint8_t>("dtype");
    if (!dtype_valid(dtype)) throw CorruptPayload(fmt::format("load_state: key '{}': bad dtype {}", key, dtype));
    entry.dtype = static_cast<DType>(dtype);
    entry.numel = r.get<int64_t>("numel");
    const auto residual_bytes = r.get<uint64_t>("residual length");
    const uint64_t expected = static_cast<uint64_t>(entry.numel) * sizeof(float);  // float32 whatever the dtype
    if (entry.numel < 0 || entry.numel > (int64_t{1} << 48) || (residual_bytes != 0 && residual_bytes != expected)) {
      throw CorruptPayload(fmt::format("load_state: key '{}': residual of {} bytes for numel {} of {}", key,
                                       residual_bytes, entry.numel, dtype_name(entry.dtype)));
    }
    const uint8_t* p = r.take(residual_bytes, "residual");
    entry.residual.assign(p, p + residual_bytes);
    if (version >= 2) {
      const auto extra_bytes = r.get<uint64_t>("extra length");
      if (extra_bytes > kMaxExtraBytes || extra_bytes % 4 != 0) {
        throw CorruptPayload(fmt::format("load_state: key '{}': compressor state of {} bytes (a multiple of 4 up to "
                                         "2^40 expected)", key, extra_bytes));
      }
      const uint8_t* x = r.take(extra_bytes, "compressor state");
      entry.extra.assign(x, x + extra_bytes);
    }
    if (!state.keys.emplace(std::move(key), std::move(entry)).second) {
      throw CorruptPayload(fmt::format("load_state: entry {}: duplicate key", i));
    }
  }
  if (r.remaining() != 0) {
    throw CorruptPayload(fmt::format("load_state: {} unexpected bytes after the last entry", r.remaining()));
  }
  return state;
}

}  // namespace gradcomm::detail
