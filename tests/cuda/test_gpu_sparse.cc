// The GPU sparse compressors (compressors/sparse/gpu_sparse.h) against the CPU
// reference (compressors/codec.h): top-k exact and sample selections, fused error
// feedback keeping the values' rounding, payload bytes and decode-add bit for bit in
// every format (fp32/fp16/bf16 values x raw/coded indices); every kind of corrupt
// payload records its fault and leaves the output untouched; random-k indices;
// count-sketch estimate and recovery bit for bit, accumulate within the fp32
// reordering bound. Every test skips on machines without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compressors/codec.h"
#include "compressors/payload.h"
#include "compressors/sketch/sketch_hash.h"
#include "compressors/sparse/gpu_sparse.h"
#include "compressors/sparse/sparse_code.h"
#include "compressors/randomk/gpu_randomk.h"
#include "compressors/randomk/randomk.h"
#include "compressors/sketch/gpu_sketch.h"
#include "compressors/sketch/sketch.h"
#include "compressors/sparse/sparse.h"
#include "cuda/buffer.h"
#include "cuda/check.h"
#include "cuda/device.h"
#include "cuda/device_status.h"
#include "gradcomm/errors.h"
#include "half.h"

#include "cuda_test_util.h"

namespace gradcomm::detail {
namespace {

constexpr int64_t kSizes[] = {1, 7, 1000, 1000003, (int64_t{1} << 22) + 5};
const SparseFormat kFormats[] = {{ValueType::kFp32, false}, {ValueType::kFp16, false}, {ValueType::kBf16, false},
                                 {ValueType::kFp32, true},  {ValueType::kFp16, true},  {ValueType::kBf16, true}};

// What error feedback leaves at a sent index whose accumulator was x (sparse_code.h).
float kept_rounding(float x, ValueType t) { return sparse_rounding_residual(x, sparse_round(x, t)); }

// ---- host <-> device ---------------------------------------------------------------------
template <class T>
DeviceBuffer upload(const std::vector<T>& v, size_t extra_bytes = 0) {
  DeviceBuffer d(std::max<size_t>(v.size() * sizeof(T) + extra_bytes, 1));
  gradcomm::testing::copy_to_device(d.data(), v.data(), v.size() * sizeof(T));
  return d;
}
template <class T>
std::vector<T> download(const void* p, size_t count) {
  std::vector<T> v(count);
  gradcomm::testing::copy_to_host(v.data(), p, count * sizeof(T));
  return v;
}

// Inputs: 0 gaussian, 1 values from a tiny set (heavy ties), 2 gaussian with NaN,
// infinities, signed zeros and denormals mixed in.
std::vector<float> make_input(int64_t n, int kind, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    if (kind == 1) {
      v = static_cast<float>(static_cast<int>(gen() % 5) - 2) * 0.5f;
    } else if (kind == 2 && gen() % 8 == 0) {
      const uint64_t r = gen() % 4;
      v = r == 0 ? std::numeric_limits<float>::quiet_NaN()
          : r == 1 ? -std::numeric_limits<float>::infinity()
          : r == 2 ? -0.0f
                   : std::numeric_limits<float>::denorm_min() * 3.0f;
    } else {
      v = normal(gen);
    }
  }
  return x;
}

// Bitwise, except that two NaNs match: arithmetic on NaN (the EF fold) yields the
// canonical NaN on the GPU and a propagated payload on the CPU.
bool same_value(float a, float b) {
  return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b));
}

void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!same_value(got[i], want[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << " (0x" << std::hex << float_bits(got[i])
                    << "), expected " << want[i] << " (0x" << float_bits(want[i]) << ")" << std::dec;
      return;
    }
  }
}

std::vector<int64_t> ks_for(int64_t n) {
  std::vector<int64_t> ks = {0, 1, 2, n / 1000, n / 100, n / 3, n - 1, n, n + 5};
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

// One GPU selection against topk_select, with or without error feedback (whose
// residual keeps the rounding of values sent as `vt`).
void check_topk(const std::vector<float>& grad, int64_t k, TopkSelect mode, bool ef, ValueType vt,
                GpuSparseWorkspace& ws, cudaStream_t stream) {
  const auto n = static_cast<int64_t>(grad.size());
  const PhiloxStream rng{static_cast<uint64_t>(k) * 31 + 7, static_cast<uint64_t>(n)};
  std::vector<float> residual = ef ? make_input(n, 0, static_cast<uint64_t>(k + 1)) : std::vector<float>();
  std::vector<float> acc = grad;
  if (ef) {
    for (int64_t i = 0; i < n; ++i) acc[static_cast<size_t>(i)] += residual[static_cast<size_t>(i)];
  }
  const SparseVector want = topk_select(acc.data(), n, k, mode, rng);

  DeviceBuffer d_grad = upload(grad), d_res = upload(residual);
  gpu_topk_select(d_grad.as<float>(), ef ? d_res.as<float>() : nullptr, n, k, mode, rng, vt, ws, stream);
  const int64_t count = ws.read_count(stream);
  ASSERT_EQ(count, static_cast<int64_t>(want.indices.size()));
  ASSERT_LE(count, ws.capacity());
  EXPECT_EQ(download<uint64_t>(ws.indices(), static_cast<size_t>(count)), want.indices);
  const std::vector<float> values = download<float>(ws.values(), static_cast<size_t>(count));
  if (ef) {
    expect_same_floats(values, want.values, "values");
    std::vector<float> want_res = acc;
    for (size_t j = 0; j < want.indices.size(); ++j) want_res[want.indices[j]] = kept_rounding(want.values[j], vt);
    expect_same_floats(download<float>(d_res.data(), static_cast<size_t>(n)), want_res, "residual");
  } else {
    EXPECT_EQ(0, std::memcmp(values.data(), want.values.data(), values.size() * sizeof(float))) << "values bits";
  }
}

class GpuSparse : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_F(GpuSparse, TopkExactMatchesCpuSelection) {
  Stream stream;
  GpuSparseWorkspace ws;  // reused across sizes: grow-only
  for (int64_t n : kSizes) {
    for (int kind = 0; kind < 3; ++kind) {
      const std::vector<float> grad = make_input(n, kind, static_cast<uint64_t>(n + kind));
      for (int64_t k : ks_for(n)) {
        // Without EF the value type plays no part in the selection.
        for (auto [ef, vt] : {std::pair{false, ValueType::kFp32}, std::pair{true, ValueType::kFp32},
                              std::pair{true, ValueType::kBf16}}) {
          SCOPED_TRACE(::testing::Message() << "n=" << n << " kind=" << kind << " k=" << k << " ef=" << ef
                                            << " values=" << static_cast<int>(vt));
          check_topk(grad, k, TopkSelect::kExact, ef, vt, ws, stream.get());
        }
      }
    }
  }
}

TEST_F(GpuSparse, TopkSampleMatchesCpuSelection) {
  Stream stream;
  GpuSparseWorkspace ws;
  for (int64_t n : kSizes) {
    for (int kind = 0; kind < 3; ++kind) {
      const std::vector<float> grad = make_input(n, kind, static_cast<uint64_t>(3 * n + kind));
      for (int64_t k : ks_for(n)) {
        for (bool ef : {false, true}) {
          const ValueType vt = kind == 1 ? ValueType::kFp16 : ValueType::kBf16;
          SCOPED_TRACE(::testing::Message() << "n=" << n << " kind=" << kind << " k=" << k << " ef=" << ef);
          check_topk(grad, k, TopkSelect::kSample, ef, vt, ws, stream.get());
        }
      }
    }
  }
}

// ---- payloads ----------------------------------------------------------------------------
TEST_F(GpuSparse, EncodeIsByteIdenticalToEncodeSparse) {
  Stream stream;
  StatusBuffer status;
  GpuSparseWorkspace ws;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000003}}) {
    const std::vector<float> grad = make_input(n, 2, static_cast<uint64_t>(n));
    for (int64_t k : {int64_t{1}, std::max<int64_t>(n / 100, 1), n}) {
      const SparseVector want = topk_select(grad.data(), n, k, TopkSelect::kExact, {});
      DeviceBuffer d_grad = upload(grad);
      gpu_topk_select(d_grad.as<float>(), nullptr, n, k, TopkSelect::kExact, {}, ValueType::kFp32, ws, stream.get());
      for (const SparseFormat& f : kFormats) {
        const std::vector<uint8_t> bytes = encode_sparse(CompressorId::kTopk, n, want, f);
        // Garbage in the buffer: the encoder writes every byte, padding included.
        DeviceBuffer out = upload(std::vector<uint8_t>(sparse_payload_bytes(n, ws.capacity(), f), 0xA5));
        DeviceBuffer out_bytes(sizeof(uint64_t));
        status.reset(stream.get());
        gpu_encode_sparse(CompressorId::kTopk, n, ws.indices(), ws.values(), ws.count(), ws.capacity(), f,
                          out.as<uint8_t>(), out_bytes.as<uint64_t>(), status.device(), stream.get());
        EXPECT_EQ(status.read(stream.get()).fault, 0u);
        EXPECT_EQ(download<uint64_t>(out_bytes.data(), 1)[0], bytes.size());
        EXPECT_EQ(download<uint8_t>(out.data(), bytes.size()), bytes)
            << "n=" << n << " k=" << k << " values=" << static_cast<int>(f.values) << " coded=" << f.coded;
      }
    }
  }
}

// u64 indices (n >= 2^32), at the header level: nothing of size n is touched.
TEST_F(GpuSparse, WideIndexPayloadsMatchCpu) {
  Stream stream;
  StatusBuffer status;
  const int64_t n = (int64_t{1} << 32) + 10;
  SparseVector v{{0, 3, 9}, {1.5f, -2.0f, 0.25f}};
  GpuSparseWorkspace ws;
  for (const SparseFormat& f : kFormats) {
    const std::vector<uint8_t> bytes = encode_sparse(CompressorId::kRandomk, n, v, f);
    DeviceBuffer idx = upload(v.indices), val = upload(v.values), count = upload(std::vector<uint64_t>{3});
    DeviceBuffer out(sparse_payload_bytes(n, 3, f));
    status.reset(stream.get());
    gpu_encode_sparse(CompressorId::kRandomk, n, idx.as<uint64_t>(), val.as<float>(), count.as<uint64_t>(), 3, f,
                      out.as<uint8_t>(), nullptr, status.device(), stream.get());
    ASSERT_EQ(status.read(stream.get()).fault, 0u);
    EXPECT_EQ(download<uint8_t>(out.data(), bytes.size()), bytes);
    // Decode into a 16-float window: the indices are < 16.
    std::vector<float> want(16, 1.0f);
    decode_add_sparse(CompressorId::kRandomk, bytes, n, want.data());
    DeviceBuffer d_out = upload(std::vector<float>(16, 1.0f));
    gpu_decode_add_sparse(CompressorId::kRandomk, out.as<uint8_t>(), bytes.size(), n, f, d_out.as<float>(), ws,
                          status.device(), stream.get());
    EXPECT_EQ(status.read(stream.get()).fault, 0u);
    EXPECT_EQ(download<float>(d_out.data(), 16), want);
  }
}

TEST_F(GpuSparse, DecodeAddInRankOrderMatchesCpu) {
  Stream stream;
  StatusBuffer status;
  GpuSparseWorkspace ws;
  for (int64_t n : {int64_t{7}, int64_t{1000}, int64_t{1000003}}) {
    for (const SparseFormat& f : kFormats) {
      std::vector<float> want = make_input(n, 0, 5);
      DeviceBuffer d_out = upload(want);
      status.reset(stream.get());
      for (int rank = 0; rank < 4; ++rank) {
        const std::vector<float> x = make_input(n, rank % 3, static_cast<uint64_t>(rank + 10));
        const SparseVector sel = topk_select(x.data(), n, std::max<int64_t>(n / (rank + 2), 1), TopkSelect::kExact, {});
        const std::vector<uint8_t> bytes = encode_sparse(CompressorId::kTopk, n, sel, f);
        decode_add_sparse(CompressorId::kTopk, bytes, n, want.data());
        // Misaligned on purpose for odd ranks: payloads sit anywhere in an allgather buffer.
        const size_t offset = rank % 2 == 0 ? 0 : static_cast<size_t>(rank);
        std::vector<uint8_t> shifted(offset, 0xEE);
        shifted.insert(shifted.end(), bytes.begin(), bytes.end());
        DeviceBuffer d_payload = upload(shifted);
        gpu_decode_add_sparse(CompressorId::kTopk, d_payload.as<uint8_t>() + offset, bytes.size(), n, f,
                              d_out.as<float>(), ws, status.device(), stream.get());
      }
      EXPECT_EQ(status.read(stream.get()).fault, 0u);
      expect_same_floats(download<float>(d_out.data(), static_cast<size_t>(n)), want, "decoded sum");
    }
  }
}

// A valid payload of indices 3, 100, ..., 876 (i * 97 + 3, numel 1000), then one
// mutation per kind of corruption. Raw (fp32): values at [24, 64), u32 indices at
// [64, 104). Coded (bf16): values at [24, 44); L = 6, the low section at [44, 52)
// (60 bits), the high section at [52, 56) (25 bits; index j's bit (x_j >> 6) + j:
// 0, 2, 5, 7, 10, 12, 15, 17, 20, 22).
constexpr SparseFormat kRaw{ValueType::kFp32, false};
constexpr SparseFormat kCoded{ValueType::kBf16, true};
struct Corruption {
  const char* name;
  SparseFormat format;
  PayloadFault fault;
  void (*mutate)(std::vector<uint8_t>&);
};
template <class T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}
const Corruption kCorruptions[] = {
    {"truncated header", kRaw, PayloadFault::kBadLength, [](std::vector<uint8_t>& b) { b.resize(20); }},
    {"empty", kRaw, PayloadFault::kBadLength, [](std::vector<uint8_t>& b) { b.clear(); }},
    {"magic", kRaw, PayloadFault::kBadHeader, [](std::vector<uint8_t>& b) { b[0] ^= 1; }},
    {"version", kRaw, PayloadFault::kBadHeader, [](std::vector<uint8_t>& b) { b[4] = 2; }},
    {"compressor id", kRaw, PayloadFault::kBadHeader, [](std::vector<uint8_t>& b) { b[5] = 4; }},
    {"numel", kRaw, PayloadFault::kBadNumel, [](std::vector<uint8_t>& b) { poke<uint64_t>(b, 8, 999); }},
    {"unknown flag", kRaw, PayloadFault::kBadHeader, [](std::vector<uint8_t>& b) { b[6] |= 0x10; }},
    {"u64 flag for small n", kRaw, PayloadFault::kBadHeader, [](std::vector<uint8_t>& b) { b[6] |= 1; }},
    {"fp16 and bf16 flags", kRaw, PayloadFault::kBadHeader, [](std::vector<uint8_t>& b) { b[6] |= 6; }},
    {"coded flag on raw", kRaw, PayloadFault::kBadHeader, [](std::vector<uint8_t>& b) { b[6] |= 8; }},
    {"count above n", kRaw, PayloadFault::kBadLength, [](std::vector<uint8_t>& b) { poke<uint32_t>(b, 16, 1001); }},
    {"count 2^40", kRaw, PayloadFault::kBadLength, [](std::vector<uint8_t>& b) { poke<uint32_t>(b, 20, 256); }},
    {"extra byte", kRaw, PayloadFault::kBadLength, [](std::vector<uint8_t>& b) { b.push_back(0); }},
    {"truncated body", kRaw, PayloadFault::kBadLength, [](std::vector<uint8_t>& b) { b.pop_back(); }},
    {"index out of range", kRaw, PayloadFault::kIndexOutOfRange,
     [](std::vector<uint8_t>& b) { poke<uint32_t>(b, 64 + 4 * 9, 1000); }},
    {"repeated index", kRaw, PayloadFault::kIndexOrder,
     [](std::vector<uint8_t>& b) { std::memcpy(b.data() + 64 + 4 * 5, b.data() + 64 + 4 * 4, 4); }},
    {"decreasing index", kRaw, PayloadFault::kIndexOrder,
     [](std::vector<uint8_t>& b) { poke<uint32_t>(b, 64 + 4 * 3, 0); }},
    {"raw flag on coded", kCoded, PayloadFault::kBadHeader, [](std::vector<uint8_t>& b) { b[6] &= 0xF7; }},
    {"coded count 2^40", kCoded, PayloadFault::kBadLength, [](std::vector<uint8_t>& b) { poke<uint32_t>(b, 20, 256); }},
    {"coded count + 1", kCoded, PayloadFault::kBadLength, [](std::vector<uint8_t>& b) { poke<uint32_t>(b, 16, 11); }},
    {"coded truncated", kCoded, PayloadFault::kBadLength, [](std::vector<uint8_t>& b) { b.pop_back(); }},
    {"low padding", kCoded, PayloadFault::kBadPadding, [](std::vector<uint8_t>& b) { b[44 + 7] |= 0x10; }},
    {"high padding", kCoded, PayloadFault::kBadPadding, [](std::vector<uint8_t>& b) { b[52 + 3] |= 0x02; }},
    {"extra one bit", kCoded, PayloadFault::kBadCode, [](std::vector<uint8_t>& b) { b[52] |= 0x02; }},
    {"missing one bit", kCoded, PayloadFault::kBadCode, [](std::vector<uint8_t>& b) { b[52] &= 0xFE; }},
    {"coded index out of range", kCoded, PayloadFault::kIndexOutOfRange,  // bit 22 -> 24: 15 << 6 | 44 = 1004
     [](std::vector<uint8_t>& b) {
       b[54] &= 0xBF;
       b[55] |= 0x01;
     }},
    {"coded repeated index", kCoded, PayloadFault::kIndexOrder,  // index 1: bit 2 -> 1, low 36 -> 3: 3 again
     [](std::vector<uint8_t>& b) {
       b[52] = static_cast<uint8_t>((b[52] & ~0x04) | 0x02);
       b[44] = static_cast<uint8_t>((b[44] & 0x3F) | 0xC0);
       b[45] = static_cast<uint8_t>(b[45] & ~0x0F);
     }},
};

TEST_F(GpuSparse, CorruptPayloadRecordsFaultAndWritesNothing) {
  Stream stream;
  StatusBuffer status;
  GpuSparseWorkspace ws;
  const int64_t n = 1000;
  SparseVector sel;
  for (uint64_t i = 0; i < 10; ++i) {
    sel.indices.push_back(i * 97 + 3);
    sel.values.push_back(static_cast<float>(i) - 4.5f);
  }
  const std::vector<float> before = make_input(n, 0, 4);
  for (const Corruption& c : kCorruptions) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> good = encode_sparse(CompressorId::kTopk, n, sel, c.format);
    ASSERT_EQ(good.size(), c.format.coded ? 56u : 104u);
    std::vector<uint8_t> bad = good;
    c.mutate(bad);
    std::vector<float> cpu = before;  // the CPU agrees that it is corrupt
    EXPECT_THROW(decode_add_sparse(CompressorId::kTopk, bad, n, cpu.data()), CorruptPayload);
    DeviceBuffer d_out = upload(before);
    DeviceBuffer d_bad = upload(bad);
    DeviceBuffer d_good = upload(good);
    status.reset(stream.get());
    gpu_decode_add_sparse(CompressorId::kTopk, d_bad.as<uint8_t>(), bad.size(), n, c.format, d_out.as<float>(), ws,
                          status.device(), stream.get());
    // A valid payload after a bad one is skipped too: the batch stops at the fault.
    gpu_decode_add_sparse(CompressorId::kTopk, d_good.as<uint8_t>(), good.size(), n, c.format, d_out.as<float>(), ws,
                          status.device(), stream.get());
    EXPECT_EQ(status.read(stream.get()).fault, static_cast<uint32_t>(c.fault));
    const std::vector<float> after = download<float>(d_out.data(), static_cast<size_t>(n));
    EXPECT_EQ(0, std::memcmp(after.data(), before.data(), before.size() * sizeof(float))) << "output was written";
    EXPECT_THROW(status.check(stream.get(), "test"), CorruptPayload);
  }
}

TEST_F(GpuSparse, EncodeRefusesWhatTheDecoderWouldReject) {
  Stream stream;
  StatusBuffer status;
  struct Bad {
    std::vector<uint64_t> indices;
    uint64_t count;
    PayloadFault fault;
  };
  const Bad cases[] = {{{1, 2, 100}, 3, PayloadFault::kIndexOutOfRange},
                       {{1, 5, 5}, 3, PayloadFault::kIndexOrder},
                       {{4, 2, 3}, 3, PayloadFault::kIndexOrder},
                       {{1, 2, 3}, 4, PayloadFault::kBadLength}};
  for (const Bad& b : cases) {
    for (const SparseFormat& f : kFormats) {
      DeviceBuffer idx = upload(b.indices), val = upload(std::vector<float>{1, 2, 3});
      DeviceBuffer count = upload(std::vector<uint64_t>{b.count});
      const std::vector<uint8_t> sentinel(sparse_payload_bytes(100, 3, f), 0xAB);
      DeviceBuffer out = upload(sentinel);
      status.reset(stream.get());
      gpu_encode_sparse(CompressorId::kTopk, 100, idx.as<uint64_t>(), val.as<float>(), count.as<uint64_t>(), 3, f,
                        out.as<uint8_t>(), nullptr, status.device(), stream.get());
      EXPECT_EQ(status.read(stream.get()).fault, static_cast<uint32_t>(b.fault));
      EXPECT_EQ(download<uint8_t>(out.data(), sentinel.size()), sentinel) << "payload was written";
    }
  }
}

// ---- random-k -------------------------------------------------------------------------------
TEST_F(GpuSparse, RandomkIndicesGatherAndResidualMatchCpu) {
  Stream stream;
  GpuSparseWorkspace ws;
  struct Case {
    int64_t n, k;
  };
  const Case cases[] = {{1, 1},       {7, 3},       {7, 7},           {1000, 1},        {1000, 10},
                        {1000, 999},  {1000003, 10000}, {1000003, 990000}, {(int64_t{1} << 22) + 5, 41943}};
  for (const Case& c : cases) {
    const PhiloxStream rng{99, static_cast<uint64_t>(c.n * 7 + c.k)};
    const std::vector<uint64_t> want = randomk_indices(c.n, c.k, rng);
    gpu_randomk_indices(c.n, c.k, rng, ws, stream.get());
    const int64_t count = ws.read_count(stream.get());
    ASSERT_EQ(count, static_cast<int64_t>(want.size())) << "n=" << c.n << " k=" << c.k;
    ASSERT_EQ(download<uint64_t>(ws.indices(), want.size()), want) << "n=" << c.n << " k=" << c.k;

    // Fused EF for random-k: fold, gather, keep the rounding; scatter back.
    const ValueType vt = c.k % 2 == 0 ? ValueType::kBf16 : ValueType::kFp16;
    const std::vector<float> grad = make_input(c.n, 0, 1), res = make_input(c.n, 0, 2);
    DeviceBuffer d_grad = upload(grad), d_res = upload(res), d_vals(want.size() * sizeof(float) + 4);
    gpu_fold_residual(d_grad.as<float>(), d_res.as<float>(), c.n, stream.get());
    gpu_gather(d_res.as<float>(), ws.indices(), ws.count(), ws.capacity(), d_vals.as<float>(), d_res.as<float>(), vt,
               stream.get());
    std::vector<float> acc(grad.size()), want_vals;
    for (size_t i = 0; i < grad.size(); ++i) acc[i] = grad[i] + res[i];
    for (uint64_t i : want) want_vals.push_back(acc[i]);
    std::vector<float> want_res = acc;
    for (uint64_t i : want) want_res[i] = kept_rounding(acc[i], vt);
    expect_same_floats(download<float>(d_vals.data(), want.size()), want_vals, "gathered values");
    expect_same_floats(download<float>(d_res.data(), grad.size()), want_res, "residual");
    DeviceBuffer d_out = upload(std::vector<float>(grad.size(), 0.0f));
    gpu_scatter(d_out.as<float>(), ws.indices(), d_vals.as<float>(), ws.count(), ws.capacity(), stream.get());
    std::vector<float> want_out(grad.size(), 0.0f);
    for (size_t j = 0; j < want.size(); ++j) want_out[want[j]] = want_vals[j];
    expect_same_floats(download<float>(d_out.data(), grad.size()), want_out, "scattered");
  }
}

// n near 2^63 (no data of size n needed): about half the draws are rejected and
// retried with spare draws, which the GPU must assign in the CPU's order.
TEST_F(GpuSparse, RandomkRejectionFixupMatchesCpu) {
  Stream stream;
  GpuSparseWorkspace ws;
  for (int64_t n : {std::numeric_limits<int64_t>::max() - 5, (int64_t{1} << 62) + 12345}) {
    for (int64_t k : {1, 300, 5000}) {  // 5000 > the 4096-entry list: the scan fallback
      const PhiloxStream rng{3, static_cast<uint64_t>(k)};
      const std::vector<uint64_t> want = randomk_indices(n, k, rng);
      gpu_randomk_indices(n, k, rng, ws, stream.get());
      ASSERT_EQ(ws.read_count(stream.get()), k);
      EXPECT_EQ(download<uint64_t>(ws.indices(), want.size()), want) << "n=" << n << " k=" << k;
    }
  }
}

// ---- count sketch ----------------------------------------------------------------------------
TEST_F(GpuSparse, SketchAccumulateWithinReorderingBoundEstimateAndRecoverExact) {
  Stream stream;
  GpuSparseWorkspace ws;
  struct Case {
    int rows, cols;
    int64_t n;
  };
  // Small tables take the shared-memory path, wide ones the global-atomic path.
  const Case cases[] = {{1, 64, 1000003}, {5, 97, 1000003}, {4, 4000, (int64_t{1} << 22) + 5}, {5, 40000, 1000003},
                        {3, 16, 7}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " cols=" << c.cols << " n=" << c.n);
    const PhiloxStream rng{11, static_cast<uint64_t>(c.cols)};
    const CountSketch cpu(c.rows, c.cols, rng);
    const GpuCountSketch gpu(c.rows, c.cols, rng);
    const std::vector<float> grad = make_input(c.n, 0, 8), res = make_input(c.n, 0, 9);
    std::vector<float> acc(grad.size());
    for (size_t i = 0; i < acc.size(); ++i) acc[i] = grad[i] + res[i];
    const size_t cells = static_cast<size_t>(c.rows) * c.cols;
    std::vector<float> want(cells, 0.0f);
    cpu.accumulate(acc.data(), c.n, want.data());
    DeviceBuffer d_grad = upload(grad), d_res = upload(res), d_table = upload(std::vector<float>(cells, 0.0f));
    gpu.accumulate(d_grad.as<float>(), d_res.as<float>(), c.n, d_table.as<float>(), stream.get());
    const std::vector<float> got = download<float>(d_table.data(), cells);
    expect_same_floats(download<float>(d_res.data(), acc.size()), acc, "folded residual");
    // Per cell: m terms, their exact sum (in double: m < 2^29 terms of 24 bits fit its
    // 53) and sum |terms|. Any fp32 summation order of m terms is within
    // gamma_{m-1} sum |terms| of the exact sum (Higham 2002, eq. 4.4), so each of the GPU's
    // and the CPU's tables is checked against the exact sum, not against each other
    // (gpu_sketch.cu).
    std::vector<double> exact(cells, 0.0), abs_sum(cells, 0.0);
    std::vector<int64_t> terms(cells, 0);
    for (int r = 0; r < c.rows; ++r) {
      const uint64_t salt = sketch::row_salt(rng, r);
      for (int64_t i = 0; i < c.n; ++i) {
        const uint64_t z = sketch::element_hash(salt, static_cast<uint64_t>(i));
        const size_t cell = static_cast<size_t>(r) * c.cols + sketch::column_of(z, static_cast<uint32_t>(c.cols));
        const float a = acc[static_cast<size_t>(i)];
        exact[cell] += (z & 1u) ? -double{a} : double{a};
        abs_sum[cell] += std::fabs(a);
        ++terms[cell];
      }
    }
    int64_t exact_cells = 0, gpu_off = 0, cpu_off = 0;
    for (size_t cell = 0; cell < cells; ++cell) {
      const double mu = static_cast<double>(std::max<int64_t>(terms[cell] - 1, 0)) * std::ldexp(1.0, -24);
      const double bound = mu / (1.0 - mu) * abs_sum[cell];
      const double gpu_err = std::fabs(double{got[cell]} - exact[cell]);
      const double cpu_err = std::fabs(double{want[cell]} - exact[cell]);
      gpu_off += !(gpu_err <= bound);
      cpu_off += !(cpu_err <= bound);
      if (!(gpu_err <= bound) || !(cpu_err <= bound)) {
        ADD_FAILURE() << "cell " << cell << " of " << terms[cell] << " terms: exact " << exact[cell] << ", gpu "
                      << got[cell] << ", cpu " << want[cell] << ", bound " << bound;
        if (gpu_off + cpu_off > 8) break;
      }
      exact_cells += float_bits(got[cell]) == float_bits(want[cell]);
    }
    EXPECT_EQ(gpu_off + cpu_off, 0) << gpu_off << " GPU cells and " << cpu_off << " CPU cells off their exact sums";
    RecordProperty("sketch_cells_bitwise_equal", std::to_string(exact_cells) + "/" + std::to_string(cells));

    // estimate and recover from the CPU's table bits: bitwise the CPU's.
    DeviceBuffer d_cpu_table = upload(want), d_est(static_cast<size_t>(c.n) * sizeof(float));
    gpu.estimate(d_cpu_table.as<float>(), c.n, d_est.as<float>(), stream.get());
    std::vector<float> want_est(static_cast<size_t>(c.n));
    cpu.estimate(want.data(), c.n, want_est.data());
    const std::vector<float> got_est = download<float>(d_est.data(), want_est.size());
    EXPECT_EQ(0, std::memcmp(got_est.data(), want_est.data(), want_est.size() * sizeof(float))) << "estimate bits";
    const int64_t k = std::max<int64_t>(c.n / 100, 1);
    gpu.recover(d_cpu_table.as<float>(), c.n, k, ws, stream.get());
    const std::vector<uint64_t> want_idx = topk_select(want_est.data(), c.n, k, TopkSelect::kExact, rng).indices;
    ASSERT_EQ(ws.read_count(stream.get()), static_cast<int64_t>(want_idx.size()));
    EXPECT_EQ(download<uint64_t>(ws.indices(), want_idx.size()), want_idx);
  }
}

}  // namespace
}  // namespace gradcomm::detail
