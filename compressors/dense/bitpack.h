// Bit packing of fixed-width codes, shared by quant, qsgd and sign (and, through
// the GRADCOMM_HD functions, by their CUDA versions).
//
// Stream layout (FORMAT.md, "Packed codes"): with `bits`-wide codes, element i of a
// payload occupies stream bits [i * bits, (i + 1) * bits), least significant code bit first,
// where stream bit k is bit (k % 8) of byte k / 8. So bits = 1, 2, 4, 8 never
// straddle a byte, and every group of 8 consecutive elements starting at a multiple
// of 8 fills exactly `bits` whole bytes. Bits past the last code in the final byte
// are zero (decoders reject anything else).
//
// The CPU codecs stream codes through CodeWriter/CodeReader, which work a group of
// 8 codes at a time (one 64-bit word when bits <= 8); a GPU kernel can instead give
// each thread one group, or use read_code for random access.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "half.h"  // GRADCOMM_HD

namespace gradcomm::detail {

// Widest code the packers handle: qsgd with levels < 2^24 needs 1 + 24 bits.
constexpr unsigned kMaxCodeBits = 25;

// Bytes holding n codes of `bits` bits (n * bits must not overflow: callers bound n).
GRADCOMM_HD uint64_t packed_code_bytes(uint64_t n, unsigned bits) { return (n * bits + 7) / 8; }

// Code of element i, read byte by byte, touching only the bytes that hold it (so
// never past the end of the stream). bits in [1, kMaxCodeBits].
GRADCOMM_HD uint32_t read_code(const uint8_t* packed, uint64_t i, unsigned bits) {
  const uint64_t bit = i * bits;
  const uint8_t* p = packed + bit / 8;
  const unsigned shift = static_cast<unsigned>(bit % 8);
  const unsigned nbytes = (shift + bits + 7) / 8;  // <= 4
  uint64_t word = 0;
  for (unsigned k = 0; k < nbytes; ++k) word |= static_cast<uint64_t>(p[k]) << (8 * k);
  return static_cast<uint32_t>(word >> shift) & ((1u << bits) - 1u);
}

// Packs 8 codes (each < 2^bits) into out[0, bits). kBits = 0: width `bits` chosen at
// run time; otherwise kBits == bits, known at compile time (the fast paths).
template <unsigned kBits>
inline void pack_group8(const uint32_t* codes, unsigned bits, uint8_t* out) {
  static_assert(std::endian::native == std::endian::little, "the payload format is little-endian");
  if constexpr (kBits != 0 && kBits <= 8) {
    uint64_t word = 0;
    for (unsigned j = 0; j < 8; ++j) word |= static_cast<uint64_t>(codes[j]) << (j * kBits);
    std::memcpy(out, &word, kBits);
  } else {
    const unsigned width = kBits != 0 ? kBits : bits;
    // At most 7 bits wait in `acc` between codes, so acc never holds more than 32.
    uint64_t acc = 0;
    unsigned held = 0;
    for (unsigned j = 0; j < 8; ++j) {
      acc |= static_cast<uint64_t>(codes[j]) << held;
      held += width;
      while (held >= 8) {
        *out++ = static_cast<uint8_t>(acc);
        acc >>= 8;
        held -= 8;
      }
    }
  }
}

// Inverse of pack_group8: 8 codes from in[0, bits).
template <unsigned kBits>
inline void unpack_group8(const uint8_t* in, unsigned bits, uint32_t* codes) {
  if constexpr (kBits != 0 && kBits <= 8) {
    uint64_t word = 0;
    std::memcpy(&word, in, kBits);
    constexpr uint32_t kMask = (1u << kBits) - 1u;
    for (unsigned j = 0; j < 8; ++j) codes[j] = static_cast<uint32_t>(word >> (j * kBits)) & kMask;
  } else {
    const unsigned width = kBits != 0 ? kBits : bits;
    const uint32_t mask = (1u << width) - 1u;
    uint64_t acc = 0;
    unsigned held = 0;
    for (unsigned j = 0; j < 8; ++j) {
      while (held < width) {
        acc |= static_cast<uint64_t>(*in++) << held;
        held += 8;
      }
      codes[j] = static_cast<uint32_t>(acc) & mask;
      acc >>= width;
      held -= width;
    }
  }
}

// A faster packer for whole groups: packs a prefix of codes[0, count) whose length
// is a multiple of 8, exactly as pack_group8 would, into out, and returns that
// length (0: nothing packed). E.g. pack_codes_avx2 (dense_simd.h).
using BulkPacker = size_t (*)(const uint32_t* codes, size_t count, unsigned bits, uint8_t* out);

// Appends codes to a packed stream in any number of calls of any length (bucket
// boundaries need not fall on groups of 8): up to 7 codes wait in pending_ until
// their group is complete. finish() writes the last, partial group. With a
// BulkPacker, each call's whole groups go through it first, the rest through
// pack_group8; the bytes are the same either way.
template <unsigned kBits>
class CodeWriter {
 public:
  CodeWriter(uint8_t* out, unsigned bits, BulkPacker bulk = nullptr)
      : out_(out), bits_(kBits != 0 ? kBits : bits), bulk_(bulk) {}

  void put(const uint32_t* codes, size_t count) {
    size_t k = 0;
    if (pending_count_ != 0) {
      while (pending_count_ < 8 && k < count) pending_[pending_count_++] = codes[k++];
      if (pending_count_ < 8) return;
      emit(pending_);
      pending_count_ = 0;
    }
    if (bulk_ != nullptr) {
      const size_t done = bulk_(codes + k, count - k, bits_, out_);
      out_ += done / 8 * bits_;
      k += done;
    }
    for (; k + 8 <= count; k += 8) emit(codes + k);
    while (k < count) pending_[pending_count_++] = codes[k++];
  }

  // Writes exactly packed_code_bytes(pending, bits) bytes, zero-padded.
  void finish() {
    if (pending_count_ == 0) return;
    for (unsigned j = pending_count_; j < 8; ++j) pending_[j] = 0;
    uint8_t group[kMaxCodeBits];
    pack_group8<kBits>(pending_, bits_, group);
    std::memcpy(out_, group, packed_code_bytes(pending_count_, bits_));
    out_ += packed_code_bytes(pending_count_, bits_);
    pending_count_ = 0;
  }

 private:
  void emit(const uint32_t* group) {
    pack_group8<kBits>(group, bits_, out_);
    out_ += bits_;
  }

  uint8_t* out_;
  unsigned bits_;
  BulkPacker bulk_;
  uint32_t pending_[8];
  unsigned pending_count_ = 0;
};

// Reads codes back in the order they were written, in calls of any length. The
// stream must hold packed_code_bytes(total, bits) bytes (the decoder checks the
// payload length first); the last group is read without touching bytes past it.
template <unsigned kBits>
class CodeReader {
 public:
  CodeReader(const uint8_t* in, uint64_t total, unsigned bits)
      : in_(in), bits_(kBits != 0 ? kBits : bits), left_(total) {}

  void get(uint32_t* codes, size_t count) {
    size_t k = 0;
    while (k < count && ready_ < 8) codes[k++] = group_[ready_++];
    for (; k + 8 <= count; k += 8) next_group(codes + k);
    if (k < count) {
      next_group(group_);
      ready_ = 0;
      while (k < count) codes[k++] = group_[ready_++];
    }
  }

 private:
  void next_group(uint32_t* codes) {
    if (left_ >= 8) {
      unpack_group8<kBits>(in_, bits_, codes);
      in_ += bits_;
      left_ -= 8;
      return;
    }
    uint8_t group[kMaxCodeBits] = {};
    std::memcpy(group, in_, packed_code_bytes(left_, bits_));
    unpack_group8<kBits>(group, bits_, codes);
    in_ += packed_code_bytes(left_, bits_);
    left_ = 0;
  }

  const uint8_t* in_;
  unsigned bits_;
  uint64_t left_;  // codes not yet unpacked from the stream
  uint32_t group_[8];
  unsigned ready_ = 8;  // next unread code in group_ (8: none buffered)
};

}  // namespace gradcomm::detail
