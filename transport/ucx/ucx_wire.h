// What the UCX transport puts on the wire besides user payloads: the 64-bit UCX
// tag (the interface's tag with the source rank folded in) and the control
// (abort) message encoding.
//
// UCX tag layout. UCX matches on (tag, mask) only and has no notion of a source,
// but the interface receives from one named peer, so the sender's rank must be
// part of the tag. The interface tag is [63..60] kind, [59..32] seq (28 bits),
// [31..0] sub. On the wire we use
//
//     [63..62] kind (TagKind values 0..3)
//     [61..46] source rank (16 bits: up to 2^16 ranks)
//     [45..32] seq mod 2^14
//     [31..0]  sub, all 32 bits
//
// So kind and sub keep their full meaning and the sequence number wraps at 2^14
// instead of 2^28: two messages alias only when their sequence numbers differ by a
// multiple of 16384 with the same peer, kind and sub, while both are in flight.
// Collectives are blocking and keep a handful of sequence numbers live at once,
// so this never happens. Kinds above 3 cannot be encoded; such sends and
// receives fail (kFailed) instead of silently matching something else.
//
// The control channel uses kind kControl with seq and sub all ones; its receive
// masks out the source field so that it matches an abort from any peer. That one
// (kind, seq, sub) combination is reserved: user requests with it fail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "transport/transport.h"

namespace gradcomm::detail {

inline constexpr int kUcxRankBits = 16;
inline constexpr int kUcxMaxRanks = 1 << kUcxRankBits;
inline constexpr uint64_t kUcxSourceMask = 0xFFFFull << 46;
inline constexpr uint64_t kUcxSeqMask = 0x3FFFull << 32;
inline constexpr uint64_t kUcxSubMask = 0xFFFFFFFFull;

// True when `tag`'s kind fits the 2 bits the wire tag has for it.
constexpr bool ucx_tag_encodable(uint64_t tag) { return (tag >> 60) <= 3; }

// Interface tag + source rank -> UCX tag. Requires ucx_tag_encodable(tag) and
// 0 <= source < kUcxMaxRanks.
constexpr uint64_t ucx_wire_tag(uint64_t tag, int source) {
  const uint64_t kind = (tag >> 60) & 0x3;
  const uint64_t seq = (tag >> 32) & 0x3FFF;
  const uint64_t sub = tag & kUcxSubMask;
  return (kind << 62) | (static_cast<uint64_t>(source) << 46) | (seq << 32) | sub;
}
constexpr int ucx_tag_source(uint64_t wire_tag) { return static_cast<int>((wire_tag & kUcxSourceMask) >> 46); }

// The control channel's tag from `source`, and the mask its receive uses (any source).
constexpr uint64_t ucx_control_tag(int source) {
  return (static_cast<uint64_t>(TagKind::kControl) << 62) | (static_cast<uint64_t>(source) << 46) | kUcxSeqMask |
         kUcxSubMask;
}
inline constexpr uint64_t kUcxControlMask = ~kUcxSourceMask;
constexpr bool ucx_is_control_tag(uint64_t wire_tag) {
  return (wire_tag & kUcxControlMask) == (ucx_control_tag(0) & kUcxControlMask);
}

// Control message encoding (little-endian, fixed header then the text):
//   u32 magic "GCAB" | u8 version | u8 error code | u8 kind | u8 reserved (0) |
//   i32 origin rank | u32 text bytes (<= ControlMessage::kMaxText) | u64 call seq |
//   i32 sender rank | text
// The sender travels in the message: UCX 1.13 does not always fill in the sender
// tag of a receive that matched any source. Kinds:
//  - abort: a rank failed; origin is the rank that failed first, which may not be the
//    sender (ranks relay what they raise).
//  - receipt: a rank returns one for each abort it takes in (origin: the rank that took
//    it in; no text). A rank that sent aborts waits for the receipts before it closes
//    its endpoints (bounded), so its notice is in every live peer's hands before its
//    departure can be seen there.
//  - ping, pong: a liveness check (Transport::find_silent); seq is the check's number,
//    which the pong returns.
//  - goodbye: the sender leaves cleanly after call `seq` (Transport::leave).
//  - release: the sender has completed every call the goodbye's sender took part in.
// Only aborts carry text; the others carry the code kPeerFailure.
inline constexpr uint32_t kControlMagic = 0x42414347;  // "GCAB" read little-endian
inline constexpr uint8_t kControlVersion = 4;
inline constexpr size_t kControlHeaderBytes = 28;
inline constexpr size_t kControlWireBytes = kControlHeaderBytes + ControlMessage::kMaxText;

enum class ControlKind : uint8_t { kAbort = 0, kReceipt = 1, kPing = 2, kPong = 3, kGoodbye = 4, kRelease = 5 };
constexpr ControlKind kLastControlKind = ControlKind::kRelease;
struct ControlFrame {
  ControlKind kind = ControlKind::kAbort;
  int sender = -1;
  ControlMessage message;
};

// Text longer than kMaxText is cut to kMaxText bytes.
std::vector<uint8_t> encode_control(const ControlMessage& message, ControlKind kind = ControlKind::kAbort,
                                    int sender = 0);
// nullopt when the bytes are not a well-formed control message (wrong magic or
// version, text length disagreeing with the size, unknown error code or kind, text
// in anything but an abort).
std::optional<ControlFrame> decode_control(std::span<const uint8_t> bytes);

}  // namespace gradcomm::detail
