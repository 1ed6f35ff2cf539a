// read_header and PayloadReader (compressors/payload.h) on arbitrary bytes.
//
// Input: expected id u8 | expected numel u64 | script length u8 | script | payload.
// read_header runs on the payload against the expected (id, numel); a header that
// reads must write back to the same 24 bytes. Then a PayloadReader walks the payload
// by the script: each op byte reads u8/u16/u32/u64 or take()s a size from the next
// script byte (0xFF and 0xFE ask for SIZE_MAX and SIZE_MAX - 3, to probe the bounds
// arithmetic), and must hand out exactly the bytes in order. Only CorruptPayload
// may escape.
#include <cstdint>
#include <cstring>
#include <vector>

#include "compressors/payload.h"
#include "fuzz_util.h"
#include "gradcomm/errors.h"

using gradcomm::detail::CompressorId;
using gradcomm::detail::PayloadHeader;
using gradcomm::fuzz::put;

namespace {

std::vector<uint8_t> seed(CompressorId id, uint64_t numel, std::vector<uint8_t> script, size_t body) {
  std::vector<uint8_t> input{static_cast<uint8_t>(id)};
  put(input, numel);
  input.push_back(static_cast<uint8_t>(script.size()));
  input.insert(input.end(), script.begin(), script.end());
  PayloadHeader h;
  h.id = id;
  h.numel = numel;
  h.flags = 1;
  h.param0 = 7;
  h.param1 = 9;
  uint8_t header[PayloadHeader::kBytes];
  gradcomm::detail::write_header(h, header);
  input.insert(input.end(), header, header + sizeof header);
  for (size_t i = 0; i < body; ++i) input.push_back(static_cast<uint8_t>(i * 37));
  return input;
}

}  // namespace

void write_seeds(gradcomm::fuzz::SeedWriter& seeds) {
  seeds.add("topk_header_only", seed(CompressorId::kTopk, 1000, {2, 2, 3, 3, 2, 2}, 0));
  seeds.add("quant_body", seed(CompressorId::kQuant, 17, {4, 24, 0, 1, 2, 3, 4, 8}, 16));
  seeds.add("sign_huge_take", seed(CompressorId::kSign, uint64_t{1} << 40, {4, 0xFF, 4, 0xFE}, 4));
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gradcomm::fuzz::ByteReader in(data, size);
  const auto id = static_cast<CompressorId>(in.take<uint8_t>());
  const auto numel = in.take<uint64_t>();
  const size_t script_size = std::min<size_t>(in.take<uint8_t>(), in.remaining());
  const std::vector<uint8_t> script(in.rest(), in.rest() + script_size);
  for (size_t i = 0; i < script_size; ++i) in.take<uint8_t>();
  const std::vector<uint8_t> payload(in.rest(), in.rest() + in.remaining());  // exact-size heap copy: ASan bounds

  try {
    const PayloadHeader h = gradcomm::detail::read_header(payload, id, numel);
    GRADCOMM_FUZZ_CHECK(h.id == id && h.numel == numel, "read_header accepted another id or numel");
    uint8_t again[PayloadHeader::kBytes];
    gradcomm::detail::write_header(h, again);
    GRADCOMM_FUZZ_CHECK(std::memcmp(again, payload.data(), sizeof again) == 0, "header does not round-trip");
  } catch (const gradcomm::CorruptPayload&) {
  }

  gradcomm::detail::PayloadReader reader(payload, "fuzz payload");
  size_t offset = 0;
  try {
    for (size_t i = 0; i < script.size(); ++i) {
      GRADCOMM_FUZZ_CHECK(reader.remaining() == payload.size() - offset, "remaining() %zu at offset %zu of %zu",
                          reader.remaining(), offset, payload.size());
      switch (script[i] % 6) {
        case 0: {
          const auto v = reader.get<uint8_t>();
          GRADCOMM_FUZZ_CHECK(v == payload[offset], "get<u8> at %zu", offset);
          offset += 1;
          break;
        }
        case 1: reader.get<uint16_t>(); offset += 2; break;
        case 2: reader.get<uint32_t>(); offset += 4; break;
        case 3: reader.get<uint64_t>(); offset += 8; break;
        case 4: {
          size_t want = i + 1 < script.size() ? script[++i] : 0;
          if (want == 0xFF) want = SIZE_MAX;
          if (want == 0xFE) want = SIZE_MAX - 3;
          const uint8_t* p = reader.take(want);
          GRADCOMM_FUZZ_CHECK(p == payload.data() + offset, "take(%zu) at %zu returned another position", want,
                              offset);
          offset += want;
          break;
        }
        default: reader.expect_end(); GRADCOMM_FUZZ_CHECK(offset == payload.size(), "expect_end passed early");
      }
      GRADCOMM_FUZZ_CHECK(offset <= payload.size(), "reader went past the end (%zu of %zu)", offset, payload.size());
    }
  } catch (const gradcomm::CorruptPayload&) {
  }
  return 0;
}
