// decode_add_sparse and decode_sum_sparse (compressors/sparse/sparse.h) on arbitrary payloads and sizes.
//
// Input: id u8 (any byte, so foreign ids are probed too) | mode u8 | numel | rest.
//   mode bits 0-1 pick how numel is read: 0: u16, 1: u8, 2: u32, 3: 2^32 + u16
//                 (the u64-index layout);
//   mode bit 2:   negative numel (-1 - u8), which must be refused;
//   mode bit 3:   structured: the rest builds a valid payload (count u8, then per
//                 entry an index gap u16 and an fp32 value) through encode_sparse
//                 with fp16 values if mode bit 4, bf16 if bit 5 (and not 4),
//                 Elias–Fano coded indices if bit 6, then (pos u16, xor u8) triples
//                 corrupt it. Unmutated, it must decode to exactly its entries.
//   otherwise:    the rest is the payload, as received off the wire.
// The output buffer has exactly numel floats and ends at a guard page; only
// CorruptPayload and InvalidArgument may escape, and a refused payload must leave
// the output untouched. decode_sum_sparse then gets the payload twice (for numel up
// to 2^16: it writes all of numel) and must agree with a zeroed output plus two
// decode_add_sparse calls: the same verdict, and bit for bit the same floats.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "compressors/codec.h"
#include "compressors/sparse/sparse_code.h"
#include "compressors/sparse/sparse.h"
#include "fuzz_util.h"
#include "gradcomm/errors.h"
#include "half.h"

using gradcomm::detail::CompressorId;
using gradcomm::fuzz::ByteReader;
using gradcomm::fuzz::put;

namespace {

constexpr int64_t kU32Limit = int64_t{1} << 32;

std::vector<uint8_t> structured_seed(CompressorId id, uint8_t mode, uint16_t n, std::vector<uint16_t> gaps) {
  std::vector<uint8_t> input{static_cast<uint8_t>(id), mode};
  put<uint16_t>(input, n);
  input.push_back(static_cast<uint8_t>(gaps.size()));
  float v = 0.5f;
  for (uint16_t gap : gaps) {
    put<uint16_t>(input, gap);
    put<float>(input, v);
    v = -2.0f * v;
  }
  return input;
}

}  // namespace

void write_seeds(gradcomm::fuzz::SeedWriter& seeds) {
  seeds.add("topk_fp32", structured_seed(CompressorId::kTopk, 0x08, 1000, {3, 1, 500, 7}));
  seeds.add("randomk_fp16", structured_seed(CompressorId::kRandomk, 0x18, 64, {0, 1, 2, 3, 4}));
  seeds.add("sketch_empty", structured_seed(CompressorId::kSketch, 0x08, 0, {}));
  seeds.add("topk_u64_indices", structured_seed(CompressorId::kTopk, 0x0B, 10, {0, 9}));
  seeds.add("topk_coded_bf16", structured_seed(CompressorId::kTopk, 0x68, 1000, {3, 1, 500, 7, 0, 0, 90}));
  seeds.add("topk_coded_fp16_dense", structured_seed(CompressorId::kTopk, 0x58, 6, {0, 0, 0, 0, 0, 0}));
  seeds.add("topk_coded_u64", structured_seed(CompressorId::kTopk, 0x4B, 10, {0, 9}));
  // A raw payload as it would arrive: encode_sparse's bytes after the control fields.
  gradcomm::detail::SparseVector v{{2, 5, 9}, {1.0f, -3.5f, 0.25f}};
  std::vector<uint8_t> raw{static_cast<uint8_t>(CompressorId::kTopk), 0x00};
  put<uint16_t>(raw, 16);
  const auto payload = gradcomm::detail::encode_sparse(CompressorId::kTopk, 16, v, gradcomm::detail::SparseFormat{});
  raw.insert(raw.end(), payload.begin(), payload.end());
  seeds.add("topk_raw", raw);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const auto id = static_cast<CompressorId>(in.take<uint8_t>());
  const auto mode = in.take<uint8_t>();
  int64_t n = 0;
  switch (mode & 3) {
    case 0: n = in.take<uint16_t>(); break;
    case 1: n = in.take<uint8_t>(); break;
    case 2: n = in.take<uint32_t>(); break;
    default: n = kU32Limit + in.take<uint16_t>(); break;
  }
  if (mode & 4) n = -1 - in.take<uint8_t>();

  std::vector<uint8_t> payload;
  std::vector<uint64_t> indices;
  std::vector<float> expected;
  bool expect_valid = false;  // a structured payload nothing corrupted
  if ((mode & 8) != 0 && n >= 0) {
    gradcomm::detail::SparseVector v;
    const unsigned count = in.take<uint8_t>();
    uint64_t next = 0;
    for (unsigned j = 0; j < count; ++j) {
      next += in.take<uint16_t>();
      const float value = in.take<float>();
      if (next >= static_cast<uint64_t>(n)) break;
      v.indices.push_back(next);
      v.values.push_back(value);
      ++next;
    }
    using gradcomm::detail::ValueType;
    const ValueType type = (mode & 16) != 0 ? ValueType::kFp16 : (mode & 32) != 0 ? ValueType::kBf16 : ValueType::kFp32;
    payload = gradcomm::detail::encode_sparse(id, n, v, gradcomm::detail::SparseFormat{type, (mode & 64) != 0});
    indices = v.indices;
    for (float value : v.values) expected.push_back(gradcomm::detail::sparse_round(value, type));
    bool mutated = false;
    while (in.remaining() >= 3 && !payload.empty()) {
      const size_t pos = in.take<uint16_t>() % payload.size();
      const uint8_t flip = in.take<uint8_t>();
      payload[pos] ^= flip;
      mutated = mutated || flip != 0;
    }
    expect_valid = !mutated;
  } else {
    payload.assign(in.rest(), in.rest() + in.remaining());
  }

  // numel floats (none when numel is negative), zero-filled, guard page after.
  gradcomm::fuzz::GuardedFloats out(n > 0 ? static_cast<uint64_t>(n) : 0);
  bool decoded = false;
  try {
    gradcomm::detail::decode_add_sparse(id, payload, n, out.data());
    decoded = true;
  } catch (const gradcomm::CorruptPayload&) {
  } catch (const gradcomm::InvalidArgument&) {
  }
  if (expect_valid) {
    GRADCOMM_FUZZ_CHECK(decoded, "a valid payload of %zu entries (numel %lld) was refused", indices.size(),
                        static_cast<long long>(n));
    for (size_t j = 0; j < indices.size(); ++j) {
      GRADCOMM_FUZZ_CHECK(gradcomm::fuzz::same_float(out.data()[indices[j]], 0.0f + expected[j]),
                          "entry %zu (index %llu) decoded wrong", j, static_cast<unsigned long long>(indices[j]));
    }
  }
  if (!decoded && n > 0 && n <= (1 << 16)) {
    // A refused payload leaves the output untouched (decode validates first).
    for (int64_t i = 0; i < n; ++i) {
      GRADCOMM_FUZZ_CHECK(out.data()[i] == 0.0f, "refused payload wrote element %lld", static_cast<long long>(i));
    }
  }

  if (n >= 0 && n <= (1 << 16)) {
    const auto un = static_cast<uint64_t>(n);
    gradcomm::fuzz::GuardedFloats twice(un), summed(un);
    for (uint64_t i = 0; i < un; ++i) summed.data()[i] = 7.0f;  // must all be overwritten, or all kept
    bool added = true, sum_ok = true;
    try {
      gradcomm::detail::decode_add_sparse(id, payload, n, twice.data());
      gradcomm::detail::decode_add_sparse(id, payload, n, twice.data());
    } catch (const gradcomm::CorruptPayload&) {
      added = false;
    } catch (const gradcomm::InvalidArgument&) {
      added = false;
    }
    const std::span<const uint8_t> both[2] = {payload, payload};
    try {
      gradcomm::detail::decode_sum_sparse(id, both, n, summed.data());
    } catch (const gradcomm::CorruptPayload&) {
      sum_ok = false;
    } catch (const gradcomm::InvalidArgument&) {
      sum_ok = false;
    }
    GRADCOMM_FUZZ_CHECK(added == sum_ok, "decode_add_sparse %s the payload, decode_sum_sparse %s it",
                        added ? "accepted" : "refused", sum_ok ? "accepted" : "refused");
    for (uint64_t i = 0; i < un; ++i) {
      if (sum_ok) {
        GRADCOMM_FUZZ_CHECK(std::memcmp(&summed.data()[i], &twice.data()[i], sizeof(float)) == 0,
                            "decode_sum_sparse element %llu differs from two decode_add_sparse calls",
                            static_cast<unsigned long long>(i));
      } else {
        GRADCOMM_FUZZ_CHECK(summed.data()[i] == 7.0f, "refused payloads: decode_sum_sparse wrote element %llu",
                            static_cast<unsigned long long>(i));
      }
    }
  }
  return 0;
}
