// The CUDA sparse codec's per-thread logic (compressors/sparse/sparse_code_kernels.h),
// run on the CPU in the kernels' decomposition (gpu_sparse_payload.cu): encode as a
// loop over "threads" (header, one entry each, one 32-bit word of each coded section
// each) into a buffer of garbage; decode as the header check, per-word popcounts, their
// exclusive scan, per-word emit with the total check, per-index checks. Held byte for
// byte to encode_sparse and decode_sparse (compressors/sparse/sparse.h) for every format,
// counts from 1 to n, L = 0 to 62, n >= 2^32; every single-bit corruption of small
// coded payloads is accepted or refused exactly as the CPU decoder does. Runs
// everywhere; tests/cuda/test_gpu_sparse.cc runs the kernels where a GPU exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/sparse/sparse_code.h"
#include "compressors/sparse/sparse_code_kernels.h"
#include "compressors/sparse/sparse.h"
#include "gradcomm/errors.h"
#include "half.h"

namespace gradcomm::detail {
namespace {

namespace sk = sparse_kernels;

constexpr CompressorId kId = CompressorId::kTopk;
const SparseFormat kFormats[] = {{ValueType::kFp32, false}, {ValueType::kFp16, false}, {ValueType::kBf16, false},
                                 {ValueType::kFp32, true},  {ValueType::kFp16, true},  {ValueType::kBf16, true}};

std::string describe(uint64_t n, uint64_t count, SparseFormat f) {
  return "n=" + std::to_string(n) + " count=" + std::to_string(count) + " values=" +
         std::to_string(static_cast<int>(f.values)) + " coded=" + std::to_string(f.coded);
}

// ---- the encode kernel, thread by thread ----------------------------------------------------
// `out` holds sparse_payload_bytes at the capacity, prefilled with `fill`; the bytes
// past the payload must stay as they were.
std::vector<uint8_t> emulate_encode(uint64_t n, const SparseVector& v, SparseFormat f, uint64_t capacity,
                                    uint8_t fill) {
  const uint64_t c = v.indices.size();
  std::vector<uint8_t> out(sparse_payload_bytes(static_cast<int64_t>(n), static_cast<int64_t>(capacity), f), fill);
  const SparseLayout lay = sparse_layout(n, c, f.values, f.coded);
  EXPECT_LE(lay.total, out.size()) << "the capacity's size must bound the count's";
  if (lay.total > out.size()) return {};
  sk::write_sparse_header(out.data(), static_cast<uint8_t>(kId), n, c, f.values, f.coded);  // thread 0
  uint8_t* val = out.data() + lay.values_offset;
  uint8_t* idx = out.data() + lay.indices_offset;
  for (uint64_t j = 0; j < c; ++j) {  // one entry per thread
    sk::store_le(val + j * lay.value_bytes, sk::value_bits(v.values[j], f.values), lay.value_bytes);
    if (!f.coded) sk::store_le(idx + j * lay.index_bytes, v.indices[j], lay.index_bytes);
  }
  if (f.coded) {
    const unsigned L = lay.ef.low_bits;
    // Threads in reverse order: each word is independent of the others.
    for (uint64_t w = sk::section_words(lay.ef.low_bytes); w-- > 0;) {
      sk::store_section_word(idx, lay.ef.low_bytes, w, sk::ef_low_word(v.indices.data(), c, L, w));
    }
    uint8_t* high = out.data() + lay.high_offset;
    for (uint64_t w = sk::section_words(lay.ef.high_bytes); w-- > 0;) {
      sk::store_section_word(high, lay.ef.high_bytes, w, sk::ef_high_word(v.indices.data(), c, L, w));
    }
  }
  for (size_t b = lay.total; b < out.size(); ++b) {
    if (out[b] != fill) {
      ADD_FAILURE() << "byte " << b << " past the payload was written";
      break;
    }
  }
  out.resize(lay.total);
  return out;
}

// ---- the decode kernels, thread by thread -----------------------------------------------------
struct Decoded {
  sk::SparseFaultRecord fault{sk::SparseFault::kNone, 0, 0};
  SparseVector entries;
};

Decoded emulate_decode(const std::vector<uint8_t>& payload, uint64_t n, SparseFormat f) {
  Decoded d;
  const uint8_t* p = payload.data();
  d.fault = sk::check_sparse_header(p, payload.size(), static_cast<uint8_t>(kId), n, f.values, f.coded);
  if (d.fault.fault != sk::SparseFault::kNone) return d;
  // The launcher's bounds, from the length alone.
  const uint64_t body = payload.size() - 24;
  const uint64_t max_count = std::min<uint64_t>(body / sparse_value_bytes(f.values), n);
  const uint64_t count = sk::header_count(p);
  const SparseLayout lay = sparse_layout(n, count, f.values, f.coded);
  EXPECT_LE(count, max_count);
  std::vector<uint64_t> decoded(max_count, 0xDEADBEEFull);
  if (f.coded && max_count > 0) {
    const uint64_t bound = sk::ef_high_words_bound(max_count);
    const uint64_t words = sk::ef_high_words(lay.ef);
    EXPECT_LE(words, bound) << "the scratch bound must hold the high section";
    const uint8_t* high = p + lay.high_offset;
    std::vector<uint64_t> counts(bound), ranks(bound);
    for (uint64_t w = 0; w < bound; ++w) {  // count kernel
      counts[w] = w < words ? sk::popcount64(sk::ef_load_high_word(high, lay.ef.high_bytes, w)) : 0;
    }
    for (uint64_t w = 0, sum = 0; w < bound; ++w) {  // CUB's exclusive sum
      ranks[w] = sum;
      sum += counts[w];
    }
    for (uint64_t w = std::min(words, bound); w-- > 0;) {  // emit kernel, threads in reverse order
      sk::ef_emit_word(sk::ef_load_high_word(high, lay.ef.high_bytes, w), w, ranks[w], p + lay.indices_offset,
                       lay.ef.low_bits, count, decoded.data());
      if (w + 1 == std::min(words, bound)) {
        const sk::SparseFaultRecord r = sk::ef_check_total(ranks[w] + counts[w], count);
        if (r.fault != sk::SparseFault::kNone) d.fault = r;
      }
    }
    if (d.fault.fault != sk::SparseFault::kNone) return d;
  }
  auto index = [&](uint64_t j) {
    return f.coded ? decoded[j] : sk::load_le(p + lay.indices_offset + j * lay.index_bytes, lay.index_bytes);
  };
  for (uint64_t j = 0; j < count; ++j) {  // check kernel (the GPU keeps whichever fault wins)
    const sk::SparseFaultRecord r = sk::check_index(index(j), j, j > 0 ? index(j - 1) : 0, n);
    if (r.fault != sk::SparseFault::kNone) {
      d.fault = r;
      return d;
    }
  }
  for (uint64_t j = 0; j < count; ++j) {  // apply kernel's reads
    d.entries.indices.push_back(index(j));
    d.entries.values.push_back(sk::value_from_bits(
        static_cast<uint32_t>(sk::load_le(p + lay.values_offset + j * lay.value_bytes, lay.value_bytes)), f.values));
  }
  return d;
}

bool same_entries(const SparseVector& a, const SparseVector& b) {
  if (a.indices != b.indices || a.values.size() != b.values.size()) return false;
  for (size_t j = 0; j < a.values.size(); ++j) {
    if (float_bits(a.values[j]) != float_bits(b.values[j])) return false;
  }
  return true;
}

// Values with everything the narrowing meets: normals, ties, overflow to inf in fp16,
// denormals, signed zeros, infinities, NaN.
float value_for(uint64_t j, std::mt19937_64& gen) {
  static const float specials[] = {0.0f,        -0.0f,      std::numeric_limits<float>::infinity(),
                                   -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                                   1e-40f,      -3e-39f,    70000.0f,  -65520.0f, 1.00390625f, 3.0e38f};
  if (j % 7 == 3) return specials[gen() % (sizeof specials / sizeof specials[0])];
  return std::ldexp(static_cast<float>(static_cast<int64_t>(gen() % 2000001) - 1000000) / 1e6f,
                    static_cast<int>(gen() % 40) - 20);
}

// `count` distinct indices below n, increasing, in one of a few shapes.
std::vector<uint64_t> make_indices(uint64_t n, uint64_t count, int shape, std::mt19937_64& gen) {
  std::vector<uint64_t> x;
  if (count >= n) {
    for (uint64_t i = 0; i < n; ++i) x.push_back(i);
    return x;
  }
  switch (shape) {
    case 0:  // the first count
      for (uint64_t i = 0; i < count; ++i) x.push_back(i);
      break;
    case 1:  // the last count
      for (uint64_t i = n - count; i < n; ++i) x.push_back(i);
      break;
    case 2:  // evenly spread
      for (uint64_t i = 0; i < count; ++i) {
        x.push_back(static_cast<uint64_t>(static_cast<unsigned __int128>(i) * n / count));
      }
      break;
    default: {  // random
      std::vector<uint64_t> pool;
      if (n <= 4 * count + 64) {
        for (uint64_t i = 0; i < n; ++i) pool.push_back(i);
        std::shuffle(pool.begin(), pool.end(), gen);
        pool.resize(count);
      } else {
        while (pool.size() < count) {
          pool.push_back(gen() % n);
          if (pool.size() == count) {
            std::sort(pool.begin(), pool.end());
            pool.erase(std::unique(pool.begin(), pool.end()), pool.end());
          }
        }
      }
      x = pool;
      std::sort(x.begin(), x.end());
    }
  }
  return x;
}

// One selection through both emulations against the CPU codec.
void check_round_trip(uint64_t n, const std::vector<uint64_t>& indices, SparseFormat f, std::mt19937_64& gen) {
  SCOPED_TRACE(describe(n, indices.size(), f));
  SparseVector v;
  v.indices = indices;
  for (uint64_t j = 0; j < indices.size(); ++j) v.values.push_back(value_for(j, gen));
  const std::vector<uint8_t> want = encode_sparse(kId, static_cast<int64_t>(n), v, f);
  // Capacity above the count (select=sample's bound), and two fills: every byte of the
  // payload is written, whatever the buffer held.
  const uint64_t capacity = std::min<uint64_t>(n, 2 * indices.size() + 1);
  ASSERT_EQ(emulate_encode(n, v, f, capacity, 0x00), want);
  ASSERT_EQ(emulate_encode(n, v, f, capacity, 0xFF), want);
  const Decoded d = emulate_decode(want, n, f);
  ASSERT_EQ(d.fault.fault, sk::SparseFault::kNone) << "a = " << d.fault.a << " b = " << d.fault.b;
  EXPECT_TRUE(same_entries(d.entries, decode_sparse(kId, want, static_cast<int64_t>(n))));
}

// ---- tests -----------------------------------------------------------------------------------
TEST(SparseCodeKernels, EncodeAndDecodeMatchTheCpuCodecForEveryFormat) {
  std::mt19937_64 gen(17);
  const uint64_t sizes[] = {1, 2, 3, 5, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 255, 256, 1000, 4097, 65537};
  for (uint64_t n : sizes) {
    std::vector<uint64_t> counts = {1, 2, 3, n / 1000, n / 100, n / 7, n / 3, n / 2, n / 2 + 1, n - 1, n};
    std::sort(counts.begin(), counts.end());
    counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    for (uint64_t count : counts) {
      if (count == 0 || count > n) continue;
      for (int shape = 0; shape < 4; ++shape) {
        const std::vector<uint64_t> x = make_indices(n, count, shape, gen);
        for (const SparseFormat& f : kFormats) check_round_trip(n, x, f, gen);
      }
    }
  }
  // A million elements: many threads' worth of words in every section.
  const uint64_t n = 1000003;
  for (uint64_t count : {n / 100, n / 2 + 1, n}) {
    const std::vector<uint64_t> x = make_indices(n, count, 3, gen);
    for (const SparseFormat& f : kFormats) check_round_trip(n, x, f, gen);
  }
}

// L from 0 (count > n/2) up to 62 (n near 2^63, one index), u64 raw indices from 2^32.
TEST(SparseCodeKernels, HugeNumelAndLargeLowParts) {
  std::mt19937_64 gen(29);
  const uint64_t sizes[] = {(uint64_t{1} << 32) - 1, uint64_t{1} << 32, (uint64_t{1} << 32) + 10,
                            (uint64_t{1} << 40) + 3, (uint64_t{1} << 62) + 12345,
                            static_cast<uint64_t>(std::numeric_limits<int64_t>::max())};
  for (uint64_t n : sizes) {
    for (uint64_t count : {1, 2, 3, 17, 1000}) {
      for (int shape = 0; shape < 4; ++shape) {
        const std::vector<uint64_t> x = make_indices(n, count, shape, gen);
        for (const SparseFormat& f : kFormats) check_round_trip(n, x, f, gen);
      }
    }
  }
  const EliasFanoLayout ef = elias_fano_layout(static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), 1);
  EXPECT_EQ(ef.low_bits, 62u);
  std::vector<uint64_t> extremes = {0, static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - 1};
  for (const SparseFormat& f : kFormats) {
    check_round_trip(static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), extremes, f, gen);
  }
}

TEST(SparseCodeKernels, EmptySelectionIsTheHeaderAlone) {
  std::mt19937_64 gen(3);
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, uint64_t{1} << 33}) {
    for (const SparseFormat& f : kFormats) check_round_trip(n, {}, f, gen);
  }
}

// The launcher sizes the output at the capacity and the decode scratch by the length:
// the payload size must grow with the count, and the high section fit the bound.
TEST(SparseCodeKernels, PayloadSizeGrowsWithCountAndScratchBoundsHold) {
  auto check = [](uint64_t n, uint64_t c) {
    for (const SparseFormat& f : kFormats) {
      const uint64_t a = sparse_layout(n, c, f.values, f.coded).total;
      const uint64_t b = sparse_layout(n, c + 1, f.values, f.coded).total;
      ASSERT_LT(a, b) << describe(n, c, f);
    }
    const EliasFanoLayout ef = elias_fano_layout(n, c + 1);
    ASSERT_LE(sk::ef_high_words(ef), sk::ef_high_words_bound(c + 1)) << "n=" << n << " count=" << c + 1;
  };
  for (uint64_t n = 1; n <= 700; ++n) {
    for (uint64_t c = 0; c < n; ++c) check(n, c);
  }
  // Around every change of L for large n (counts whose payload bytes fit in 64 bits).
  for (uint64_t n : {uint64_t{1000003}, (uint64_t{1} << 32) + 7, (uint64_t{1} << 45) - 1,
                     static_cast<uint64_t>(std::numeric_limits<int64_t>::max())}) {
    for (unsigned L = 0; L < 63; ++L) {
      const uint64_t edge = n >> L;
      for (uint64_t c = edge > 4 ? edge - 4 : 0; c <= edge + 4 && c < n && c < (uint64_t{1} << 58); ++c) check(n, c);
    }
  }
}

// Every single-bit flip of small coded payloads (and the raw ones, for the shared
// checks): refused exactly when the CPU refuses, decoded to the CPU's entries otherwise.
// The flags must name the expected format on the GPU (the CPU accepts any valid one).
TEST(SparseCodeKernels, EveryBitFlipIsRefusedOrAcceptedAsOnTheCpu) {
  std::mt19937_64 gen(5);
  for (uint64_t n : {1, 5, 40, 64, 200}) {
    for (uint64_t count : {uint64_t{1}, n / 5, n / 2 + 1, n}) {
      if (count == 0) continue;
      for (const SparseFormat& f : kFormats) {
        SCOPED_TRACE(describe(n, count, f));
        SparseVector v;
        v.indices = make_indices(n, count, 3, gen);
        for (uint64_t j = 0; j < count; ++j) v.values.push_back(value_for(j, gen));
        const std::vector<uint8_t> good = encode_sparse(kId, static_cast<int64_t>(n), v, f);
        for (size_t bit = 0; bit < 8 * good.size(); ++bit) {
          std::vector<uint8_t> bad = good;
          bad[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
          const Decoded d = emulate_decode(bad, n, f);
          if (bit / 8 == 6 || bit / 8 == 7) {
            ASSERT_EQ(d.fault.fault, sk::SparseFault::kBadHeader) << "flag bit " << bit - 48;
            continue;
          }
          bool cpu_refuses = false;
          SparseVector cpu;
          try {
            cpu = decode_sparse(kId, bad, static_cast<int64_t>(n));
          } catch (const CorruptPayload&) {
            cpu_refuses = true;
          }
          ASSERT_EQ(d.fault.fault != sk::SparseFault::kNone, cpu_refuses) << "bit " << bit;
          if (!cpu_refuses) ASSERT_TRUE(same_entries(d.entries, cpu)) << "bit " << bit;
        }
        // And truncations and one extra byte.
        for (size_t size : {size_t{0}, size_t{23}, size_t{24}, good.size() - 1, good.size() + 1}) {
          std::vector<uint8_t> bad = good;
          bad.resize(size, 0);
          if (size == good.size()) continue;
          EXPECT_EQ(emulate_decode(bad, n, f).fault.fault, sk::SparseFault::kBadLength) << "size " << size;
        }
      }
    }
  }
}

// The fault each kind of coded corruption records (what the GPU's DeviceStatus shows).
TEST(SparseCodeKernels, CodedCorruptionsRecordTheirFault) {
  const uint64_t n = 1000;
  SparseVector v;
  for (uint64_t i = 0; i < 10; ++i) {
    v.indices.push_back(i * 97 + 3);
    v.values.push_back(static_cast<float>(i));
  }
  const SparseFormat f{ValueType::kBf16, true};
  const std::vector<uint8_t> good = encode_sparse(kId, static_cast<int64_t>(n), v, f);
  const SparseLayout lay = sparse_layout(n, 10, f.values, true);  // L = 6: 60 low bits, 25 high bits
  ASSERT_EQ(lay.ef.low_bits, 6u);
  ASSERT_EQ(lay.ef.high_bits, 25u);
  auto fault_of = [&](auto mutate) {
    std::vector<uint8_t> bad = good;
    mutate(bad);
    EXPECT_THROW(decode_sparse(kId, bad, static_cast<int64_t>(n)), CorruptPayload);
    return emulate_decode(bad, n, f).fault.fault;
  };
  // High bits of indices 3, 100, 197, 294, 391, 488, 585, 682, 779, 876 ((x >> 6) + j):
  // 0, 2, 5, 7, 10, 12, 15, 17, 20, 22.
  // Padding: bit 60 of the low section, bit 25 of the high section.
  EXPECT_EQ(fault_of([&](std::vector<uint8_t>& b) { b[lay.indices_offset + 7] |= 0x10; }),
            sk::SparseFault::kBadPadding);
  EXPECT_EQ(fault_of([&](std::vector<uint8_t>& b) { b[lay.high_offset + 3] |= 0x02; }), sk::SparseFault::kBadPadding);
  // One bit more (bit 1) or less (bit 0) in the high section.
  EXPECT_EQ(fault_of([&](std::vector<uint8_t>& b) { b[lay.high_offset] |= 0x02; }), sk::SparseFault::kBadCode);
  EXPECT_EQ(fault_of([&](std::vector<uint8_t>& b) { b[lay.high_offset] &= 0xFE; }), sk::SparseFault::kBadCode);
  // The last index's bit from 22 to 24: high part 15, 15 << 6 | 44 = 1004 >= n.
  EXPECT_EQ(fault_of([&](std::vector<uint8_t>& b) {
              b[lay.high_offset + 2] &= static_cast<uint8_t>(~(1u << 6));
              b[lay.high_offset + 3] |= 0x01;
            }),
            sk::SparseFault::kIndexOutOfRange);
  // Index 1's bit from 2 to 1 (high part 0) and its low part (bits [6, 12)) from 36 to
  // 3: index 1 = 3 = index 0.
  EXPECT_EQ(fault_of([&](std::vector<uint8_t>& b) {
              b[lay.high_offset] = static_cast<uint8_t>((b[lay.high_offset] & ~0x04) | 0x02);
              b[lay.indices_offset] = static_cast<uint8_t>((b[lay.indices_offset] & 0x3F) | 0xC0);
              b[lay.indices_offset + 1] = static_cast<uint8_t>(b[lay.indices_offset + 1] & ~0x0F);
              EXPECT_EQ(elias_fano_low(b.data() + lay.indices_offset, 1, 6), 3u);
            }),
            sk::SparseFault::kIndexOrder);
  // Another format than the expected one: a header fault on the GPU.
  EXPECT_EQ(emulate_decode(good, n, SparseFormat{ValueType::kFp16, true}).fault.fault, sk::SparseFault::kBadHeader);
  EXPECT_EQ(emulate_decode(good, n, SparseFormat{ValueType::kBf16, false}).fault.fault, sk::SparseFault::kBadHeader);
}

}  // namespace
}  // namespace gradcomm::detail
