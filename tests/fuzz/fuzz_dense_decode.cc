// Every dense codec's decode/decode_add (codec.h: fp16, bf16, quant, qsgd, sign)
// on arbitrary payloads and element counts.
//
// Input: codec u8 (index into kSpecs) | mode u8 | numel | rest.
//   mode bits 0-1 pick how numel is read: 0: u16, 1: u8, 2: i64 (any value, negative
//                 and past 2^48 included), 3: u32;
//   mode bit 2:   structured: numel is cut to at most 4096; the rest gives a count u16
//                 of fp32 inputs (cycled to numel elements; none: a fixed ramp), the
//                 run starts at element alignment() * (mode bits 4-6), it is encoded,
//                 then (pos u16, xor u8) triples corrupt the payload. Unmutated, the
//                 payload must decode, decode_add onto zeros must give the same
//                 values, and encoding again must give the same bytes;
//   mode bit 3:   decode_add instead of decode (raw payloads);
//   otherwise:    the rest is the payload, as received off the wire.
// The output holds min(numel, 2^20) floats and ends at a guard page: no payload that
// fits in the input can validly describe more, so any write past it is a bug. Only
// CorruptPayload and InvalidArgument may escape.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/spec.h"
#include "fuzz_util.h"
#include "gradcomm/errors.h"

using gradcomm::detail::DenseCodec;
using gradcomm::fuzz::ByteReader;
using gradcomm::fuzz::put;

namespace {

constexpr const char* kSpecs[] = {
    "fp16",
    "bf16",
    "quant:bits=1",
    "quant:bits=2,bucket=3",
    "quant:bits=4,bucket=7,round=nearest",
    "quant:bits=8",
    "quant:bits=8,bucket=1",
    "qsgd",
    "qsgd:levels=1,bucket=5",
    "qsgd:levels=32768,bucket=2",
    "qsgd:levels=3,bucket=1000",
    "sign",
    "sign:bucket=1",
    "sign:bucket=33",
};
constexpr size_t kCodecs = sizeof kSpecs / sizeof kSpecs[0];
constexpr int64_t kMaxStructured = 4096;
constexpr int64_t kMaxBuffer = int64_t{1} << 20;

const std::vector<std::unique_ptr<DenseCodec>>& codecs() {
  static const auto all = [] {
    std::vector<std::unique_ptr<DenseCodec>> v;
    for (const char* spec : kSpecs) {
      v.push_back(gradcomm::detail::make_dense_codec(gradcomm::detail::parse_compressor_spec(spec)));
    }
    return v;
  }();
  return all;
}

std::vector<uint8_t> structured_seed(uint8_t codec, uint8_t extra_mode, uint16_t n, std::vector<float> values) {
  std::vector<uint8_t> input{codec, static_cast<uint8_t>(0x04 | extra_mode)};
  put<uint16_t>(input, n);
  put<uint16_t>(input, static_cast<uint16_t>(values.size()));
  for (float v : values) put<float>(input, v);
  return input;
}

}  // namespace

void write_seeds(gradcomm::fuzz::SeedWriter& seeds) {
  const std::vector<float> mixed{1.0f, -2.5f, 0.0f, 1e-3f, -7.0f, 3.25f, 100.0f, -0.125f};
  for (uint8_t c = 0; c < kCodecs; ++c) {
    seeds.add("structured_" + std::to_string(c), structured_seed(c, c % 2 ? 0x10 : 0x00, 37, mixed));
  }
  seeds.add("structured_ramp", structured_seed(2, 0x20, 600, {}));
  seeds.add("structured_nonfinite", structured_seed(5, 0x00, 9, {1.0f, __builtin_inff(), -__builtin_nanf(""), 2.0f}));
  // Raw payloads: the encodings of a few values, as they would arrive.
  for (uint8_t c : {0, 3, 8, 12}) {
    std::vector<float> x(20);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f - 3.0f;
    const auto& codec = codecs()[c];
    std::vector<uint8_t> payload(codec->encoded_bytes(20));
    codec->encode(x.data(), 20, payload.data(), {7, 9}, 0);
    std::vector<uint8_t> input{c, 0x00};
    put<uint16_t>(input, 20);
    input.insert(input.end(), payload.begin(), payload.end());
    seeds.add("raw_" + std::to_string(c), input);
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const size_t which = in.take<uint8_t>() % kCodecs;
  const DenseCodec& codec = *codecs()[which];
  const auto mode = in.take<uint8_t>();
  int64_t n = 0;
  switch (mode & 3) {
    case 0: n = in.take<uint16_t>(); break;
    case 1: n = in.take<uint8_t>(); break;
    case 2: n = in.take<int64_t>(); break;
    default: n = in.take<uint32_t>(); break;
  }
  const bool structured = (mode & 4) != 0;
  if (structured) n = (n < 0 ? -(n + 1) : n) % (kMaxStructured + 1);

  gradcomm::fuzz::GuardedFloats out(static_cast<uint64_t>(n < 0 ? 0 : std::min(n, kMaxBuffer)));
  auto attempt = [&](std::span<const uint8_t> payload, bool add, float* dst) {
    try {
      if (add) {
        codec.decode_add(payload, n, dst);
      } else {
        codec.decode(payload, n, dst);
      }
      return true;
    } catch (const gradcomm::CorruptPayload&) {
    } catch (const gradcomm::InvalidArgument&) {
    }
    return false;
  };

  if (!structured) {
    const std::vector<uint8_t> payload(in.rest(), in.rest() + in.remaining());  // exact-size heap copy
    attempt(payload, (mode & 8) != 0, out.data());
    return 0;
  }

  // Structured: encode n inputs at `first`, corrupt, decode.
  const size_t given = in.take<uint16_t>();
  std::vector<float> values;
  for (size_t j = 0; j < given && in.remaining() >= 4; ++j) values.push_back(in.take<float>());
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = values.empty() ? static_cast<float>(i % 97) * 0.25f - 12.0f : values[i % values.size()];
  }
  const int64_t first = codec.alignment() * ((mode >> 4) & 7);
  const gradcomm::detail::PhiloxStream rng{0x5EED, 42};
  std::vector<uint8_t> payload(codec.encoded_bytes(n));
  try {
    codec.encode(x.data(), n, payload.data(), rng, first);
  } catch (const gradcomm::InvalidArgument&) {
    return 0;  // e.g. inputs a codec refuses to encode
  }
  bool mutated = false;
  while (in.remaining() >= 3 && !payload.empty()) {
    const size_t pos = in.take<uint16_t>() % payload.size();
    const uint8_t flip = in.take<uint8_t>();
    payload[pos] ^= flip;
    mutated = mutated || flip != 0;
  }
  const bool decoded = attempt(payload, false, out.data());
  if (mutated) return 0;

  GRADCOMM_FUZZ_CHECK(decoded, "%s could not decode its own encoding of %lld values (first %lld)",
                      kSpecs[which], static_cast<long long>(n), static_cast<long long>(first));
  std::vector<float> added(x.size(), 0.0f);
  GRADCOMM_FUZZ_CHECK(attempt(payload, true, added.data()), "%s: decode_add refused what decode took",
                      kSpecs[which]);
  for (size_t i = 0; i < x.size(); ++i) {
    GRADCOMM_FUZZ_CHECK(gradcomm::fuzz::same_float(added[i], out.data()[i]), "%s: element %zu: decode %a, "
                        "decode_add onto 0 %a", kSpecs[which], i, out.data()[i], added[i]);
  }
  std::vector<uint8_t> again(payload.size());
  codec.encode(x.data(), n, again.data(), rng, first);
  GRADCOMM_FUZZ_CHECK(again == payload, "%s: encoding is not deterministic", kSpecs[which]);
  return 0;
}
