// The header every collective call puts on the wire. Before moving data, each
// rank sends its header to its right neighbour and checks the one from its left
// neighbour against its own call; if all adjacent pairs around the ring agree,
// all ranks agree. A disagreement is a MismatchError naming both calls.
//
// Layout (little-endian, 96 bytes; offsets in the serializer):
//   magic u32 'GCW1' | version u16 | op u8 | dtype u8 | reduce_op u8 | flags u8 |
//   reserved u16 | seq u64 | numel i64 | root i32 | compressor_hash u32 | step u64 |
//   payload_bytes u64 | compressor (spec text, 32 bytes, NUL-padded, may be truncated) |
//   fused u32 | fused_digest u32
// A fused group (fusion.h) is one collective for `fused` consecutive calls, numbered
// from `seq`; its digest fingerprints every member (numel, key, spec), so ranks
// whose members differ disagree even when the totals match.
// A plain call (fused = 0) of a compressor that views tensors as matrices (Family::reads_shapes)
// puts the fingerprint of its shapes (shape.h) in fused_digest instead.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "gradcomm/types.h"

namespace gradcomm::detail {

// Values travel in the header: new kinds go at the end (kLastOpKind follows them).
enum class OpKind : uint8_t { kAllreduce = 1, kAllgather, kAllgatherv, kBroadcast, kBarrier, kReduceScatter };
constexpr OpKind kLastOpKind = OpKind::kReduceScatter;
const char* op_kind_name(OpKind op);

struct WireHeader {
  static constexpr uint32_t kMagic = 0x31574347;  // "GCW1" in memory order
  static constexpr uint16_t kVersion = 1;
  static constexpr size_t kBytes = 96;
  static constexpr size_t kSpecBytes = 32;

  OpKind op = OpKind::kBarrier;
  DType dtype = DType::kUInt8;
  ReduceOp reduce_op = ReduceOp::kSum;
  uint64_t seq = 0;
  int64_t numel = 0;          // allgatherv: -1 (counts differ by rank); reduce_scatter: the input's
  int32_t root = -1;          // broadcast only
  uint32_t compressor_hash = 0;
  uint64_t step = 0;          // compression step of the key (0 for dense)
  uint64_t payload_bytes = 0;
  std::string compressor = "none";
  uint32_t fused = 0;         // calls in a fused group (0: one plain call)
  uint32_t fused_digest = 0;

  std::array<uint8_t, kBytes> serialize() const;
  // nullopt when the bytes are not a header this version understands.
  static std::optional<WireHeader> parse(const uint8_t* bytes, size_t size);

  // "allreduce(numel=1000, float32, sum, none) #17"
  std::string describe() const;
  // The spec as messages show it: `compressor`, or, where the field holds the first
  // kSpecBytes of a longer spec (its hash says so), that cut at its last whole key with
  // a note.
  std::string shown_compressor() const;
  // True when both describe the same call (every field that must agree across ranks).
  bool agrees_with(const WireHeader& other) const;
  // The fields agrees_with compares that differ, this header's value first, e.g.
  // "step 5 against 4, payload_bytes 1024 against 2048"; empty when they agree. A
  // mismatch message names them, since describe() shows only what tells calls apart to
  // a reader, and two calls may differ only in a field it leaves out.
  std::string differences(const WireHeader& other) const;
};

// ---- counts peers announce inside a call ------------------------------------------
// Checked before anything is sized from them; each returns the problem (naming the
// rank that sent the bad value) or nullopt. Pure, so tests/fuzz feeds them garbage.

// The most bytes one rank's block, and all blocks together, may hold in
// ring_allgatherv_bytes (allgatherv, the top-k payload allgather).
inline constexpr int64_t kMaxGatherBytes = int64_t{1} << 40;
// Block sizes announced by every rank, in rank order: each in [0, kMaxGatherBytes]
// and their sum too. On success `total` is the sum.
std::optional<std::string> check_block_sizes(std::span<const int64_t> sizes, int64_t& total);
// Entry counts of a select=sample top-k, one per rank: each at most `capacity`
// (the selection's bound for this numel and k, named in the message).
std::optional<std::string> check_sample_counts(std::span<const uint64_t> counts, uint64_t capacity, int64_t numel,
                                               int64_t k);

// 32-bit FNV-1a, stable across builds and machines (compressor spec fingerprint).
uint32_t fnv1a32(const std::string& text);

}  // namespace gradcomm::detail
