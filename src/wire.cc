#include "wire.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>

namespace gradcomm::detail {

static_assert(std::endian::native == std::endian::little,
              "gradcomm's wire format is little-endian; add byte swaps for this host");

const char* op_kind_name(OpKind op) {
  switch (op) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kAllgatherv: return "allgatherv";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kReduceScatter: return "reduce_scatter";
  }
  return "unknown";
}

uint32_t fnv1a32(const std::string& text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

namespace {
template <class T>
void put(uint8_t* out, size_t offset, T value) {
  std::memcpy(out + offset, &value, sizeof value);
}
template <class T>
T get(const uint8_t* in, size_t offset) {
  T value;
  std::memcpy(&value, in + offset, sizeof value);
  return value;
}
}  // namespace

std::array<uint8_t, WireHeader::kBytes> WireHeader::serialize() const {
  std::array<uint8_t, kBytes> out{};
  uint8_t* p = out.data();
  put<uint32_t>(p, 0, kMagic);
  put<uint16_t>(p, 4, kVersion);
  put<uint8_t>(p, 6, static_cast<uint8_t>(op));
  put<uint8_t>(p, 7, static_cast<uint8_t>(dtype));
  put<uint8_t>(p, 8, static_cast<uint8_t>(reduce_op));
  put<uint64_t>(p, 12, seq);
  put<int64_t>(p, 20, numel);
  put<int32_t>(p, 28, root);
  put<uint32_t>(p, 32, compressor_hash);
  put<uint64_t>(p, 36, step);
  put<uint64_t>(p, 44, payload_bytes);
  std::memcpy(p + 52, compressor.data(), std::min(compressor.size(), kSpecBytes));
  put<uint32_t>(p, 88, fused);
  put<uint32_t>(p, 92, fused_digest);
  return out;
}

std::optional<WireHeader> WireHeader::parse(const uint8_t* p, size_t size) {
  if (size != kBytes || get<uint32_t>(p, 0) != kMagic || get<uint16_t>(p, 4) != kVersion) return std::nullopt;
  WireHeader h;
  const auto op = get<uint8_t>(p, 6);
  const auto dtype = get<uint8_t>(p, 7);
  const auto reduce_op = get<uint8_t>(p, 8);
  if (op < static_cast<uint8_t>(OpKind::kAllreduce) || op > static_cast<uint8_t>(kLastOpKind)) return std::nullopt;
  if (!dtype_valid(dtype) || reduce_op > static_cast<uint8_t>(ReduceOp::kMax)) return std::nullopt;
  h.op = static_cast<OpKind>(op);
  h.dtype = static_cast<DType>(dtype);
  h.reduce_op = static_cast<ReduceOp>(reduce_op);
  h.seq = get<uint64_t>(p, 12);
  h.numel = get<int64_t>(p, 20);
  h.root = get<int32_t>(p, 28);
  h.compressor_hash = get<uint32_t>(p, 32);
  h.step = get<uint64_t>(p, 36);
  h.payload_bytes = get<uint64_t>(p, 44);
  const char* spec = reinterpret_cast<const char*>(p + 52);
  h.compressor.assign(spec, strnlen(spec, kSpecBytes));
  h.fused = get<uint32_t>(p, 88);
  h.fused_digest = get<uint32_t>(p, 92);
  // Only printable ASCII is shown back to users: the text came from another process.
  for (char& c : h.compressor) {
    if (c < 0x20 || c > 0x7E) c = '?';
  }
  return h;
}

// A spec longer than the field arrives cut: shown up to its last whole key (or name),
// saying so, never a half-word that reads like another value ("ratio=0.0"). Agreement
// is decided by compressor_hash, which covers the whole spec; it also tells a spec of
// exactly kSpecBytes (whose hash matches) from a longer one. `compressor` itself stays
// the field's bytes, so a header re-serializes to the same bytes.
std::string WireHeader::shown_compressor() const {
  if (compressor.size() != kSpecBytes || fnv1a32(compressor) == compressor_hash) return compressor;
  const size_t cut = compressor.find_last_of(",:|");
  return compressor.substr(0, cut == std::string::npos ? 0 : cut + 1) +
         fmt::format("... (cut: longer than the {} bytes the header carries)", kSpecBytes);
}

std::string WireHeader::describe() const {
  if (fused > 1) {
    const std::string spec = compressor != "none" ? fmt::format(", {}, step={}", shown_compressor(), step) : ", none";
    return fmt::format("fused allreduce of {} calls (numel={}, {}, {}{}, members {:08x}) #{}-#{}", fused, numel,
                       dtype_name(dtype), reduce_op_name(reduce_op), spec, fused_digest, seq, seq + fused - 1);
  }
  switch (op) {
    case OpKind::kAllreduce:
      if (compressor != "none") {  // compressed calls also agree on the key's step (and shapes: Family::reads_shapes)
        // A plain call's digest is its shapes' (powersgd); a planned group of one carries its member's.
        const std::string shapes = fused == 0 && fused_digest != 0 ? fmt::format(", shapes {:08x}", fused_digest) : "";
        return fmt::format("allreduce(numel={}, {}, {}, {}, step={}{}) #{}", numel, dtype_name(dtype),
                           reduce_op_name(reduce_op), shown_compressor(), step, shapes, seq);
      }
      return fmt::format("allreduce(numel={}, {}, {}, {}) #{}", numel, dtype_name(dtype), reduce_op_name(reduce_op),
                         compressor, seq);
    case OpKind::kAllgather:
      return fmt::format("allgather(numel={}, {}) #{}", numel, dtype_name(dtype), seq);
    case OpKind::kAllgatherv:
      return fmt::format("allgatherv({}) #{}", dtype_name(dtype), seq);
    case OpKind::kBroadcast:
      return fmt::format("broadcast(numel={}, {}, root={}) #{}", numel, dtype_name(dtype), root, seq);
    case OpKind::kBarrier:
      return fmt::format("barrier() #{}", seq);
    case OpKind::kReduceScatter:
      return fmt::format("reduce_scatter(numel={}, {}, {}) #{}", numel, dtype_name(dtype), reduce_op_name(reduce_op),
                         seq);
  }
  return fmt::format("unknown op #{}", seq);
}

std::optional<std::string> check_block_sizes(std::span<const int64_t> sizes, int64_t& total) {
  total = 0;
  for (size_t s = 0; s < sizes.size(); ++s) {
    if (sizes[s] < 0 || sizes[s] > kMaxGatherBytes) {
      return fmt::format("rank {} announced a block of {} bytes (expected 0 to {})", s, sizes[s], kMaxGatherBytes);
    }
    total += sizes[s];  // both terms <= 2^40 here: no overflow
    if (total > kMaxGatherBytes) {
      return fmt::format("ranks 0 to {} announced {} bytes in all, more than the {} one gather may hold", s, total,
                         kMaxGatherBytes);
    }
  }
  return std::nullopt;
}

std::optional<std::string> check_sample_counts(std::span<const uint64_t> counts, uint64_t capacity, int64_t numel,
                                               int64_t k) {
  for (size_t p = 0; p < counts.size(); ++p) {
    if (counts[p] > capacity) {
      return fmt::format("sampled selection count {} from rank {} exceeds the bound {} (select=sample, numel {}, k {})",
                         counts[p], p, capacity, numel, k);
    }
  }
  return std::nullopt;
}

std::string WireHeader::differences(const WireHeader& o) const {
  std::string out;
  const auto note = [&](const char* field, const auto& mine, const auto& theirs) {
    if (mine == theirs) return;
    out += fmt::format("{}{} {} against {}", out.empty() ? "" : ", ", field, mine, theirs);
  };
  note("op", op_kind_name(op), op_kind_name(o.op));
  note("dtype", dtype_name(dtype), dtype_name(o.dtype));
  note("reduce op", reduce_op_name(reduce_op), reduce_op_name(o.reduce_op));
  note("seq", seq, o.seq);
  note("numel", numel, o.numel);
  note("root", root, o.root);
  if (compressor_hash != o.compressor_hash) {
    out += fmt::format("{}compressor '{}' (hash {:08x}) against '{}' (hash {:08x})", out.empty() ? "" : ", ",
                       shown_compressor(), compressor_hash, o.shown_compressor(), o.compressor_hash);
  }
  note("step", step, o.step);
  note("payload_bytes", payload_bytes, o.payload_bytes);
  note("fused calls", fused, o.fused);
  if (fused_digest != o.fused_digest) {
    const char* what = fused > 0 ? "fused members' digest" : op == OpKind::kBarrier ? "topology and levels digest (GRADCOMM_NODE, GRADCOMM_HIERARCHY, GRADCOMM_SCHEDULE)" : "shapes digest";
    out += fmt::format("{}{} {:08x} against {:08x}", out.empty() ? "" : ", ", what, fused_digest, o.fused_digest);
  }
  return out;
}

bool WireHeader::agrees_with(const WireHeader& o) const {
  return op == o.op && dtype == o.dtype && reduce_op == o.reduce_op && seq == o.seq && numel == o.numel &&
         root == o.root && compressor_hash == o.compressor_hash && step == o.step && payload_bytes == o.payload_bytes &&
         fused == o.fused && fused_digest == o.fused_digest;
}

}  // namespace gradcomm::detail
