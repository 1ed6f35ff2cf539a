// Compressed calls on float16 / bfloat16 host tensors (compression_16bit.cc): the tensor is
// compressed in float32 pieces, never copied whole to float32. Against the float32 path as
// the reference: one piece is bit for bit the float32 call on the widened tensor, rounded
// (result and residual); several pieces are each piece's own float32 call; the
// reduce-scatter likewise; two levels stay close to the exact sum. And, with operator new
// counted in this binary, no allocation of a call is as large as a float32 copy of the
// tensor (the float32 reduce-scatter's copy is seen, so the count can fail).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>

#include "half.h"
#include "introspect.h"
#include "test_util.h"

// ---- the largest allocation while counting -------------------------------------------------
namespace {
std::atomic<bool> g_counting{false};
std::atomic<size_t> g_largest{0};

void* counted(size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) {
    size_t seen = g_largest.load(std::memory_order_relaxed);
    while (n > seen && !g_largest.compare_exchange_weak(seen, n)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(size_t n) { return counted(n); }
void* operator new[](size_t n) { return counted(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace gradcomm {
namespace {

using detail::bf16_to_float;
using detail::float_to_bf16;
using detail::float_to_half;
using detail::half_to_float;

std::vector<float> gradient(int rank, int64_t n, uint32_t seed) {
  return testing::normal_gradient(rank, n, seed);
}

// A tensor of 16-bit values and its exact float32 widening.
struct Half16 {
  DType dtype;
  std::vector<uint16_t> bits;
  TensorView view() { return TensorView{bits.data(), static_cast<int64_t>(bits.size()), dtype, {}}; }
  std::vector<float> widened() const {
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      out[i] = dtype == DType::kBFloat16 ? bf16_to_float(bits[i]) : half_to_float(bits[i]);
    }
    return out;
  }
};

uint16_t narrow(float v, DType dtype) { return dtype == DType::kBFloat16 ? float_to_bf16(v) : float_to_half(v); }

Half16 rounded(const std::vector<float>& v, DType dtype) {
  Half16 h{dtype, std::vector<uint16_t>(v.size())};
  for (size_t i = 0; i < v.size(); ++i) h.bits[i] = narrow(v[i], dtype);
  return h;
}

const char* name(DType t) { return t == DType::kBFloat16 ? "bf16" : "fp16"; }

// One piece (numel under a piece): the 16-bit call is the float32 call on the widened
// tensor, rounded once: the same result bits and the same residual, step after step. (Two
// runs, so both calls have the key "k": its name seeds the codecs' random draws.)
TEST(Compression16Bit, OnePieceIsTheFloat32CallOnTheWidenedTensorRounded) {
  const char* specs[] = {"quant:bits=8", "qsgd", "sign", "bf16", "topk:ratio=0.01", "topk:ratio=0.05,values=fp16"};
  const int64_t numel = 50'003;
  const int steps = 3;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const char* spec : specs) {
      for (int n : {2, 3}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          // [rank][step]: result and residual
          std::vector<std::vector<std::vector<float>>> out32(n, std::vector<std::vector<float>>(steps)), res32 = out32;
          testing::run_ranks(n, [&](Communicator& comm) {
            for (int step = 0; step < steps; ++step) {
              std::vector<float> x = rounded(gradient(comm.rank(), numel, step + 1), dtype).widened();
              comm.allreduce(TensorView::of(x.data(), numel), op, CompressOptions{spec, "k", nullptr});
              const auto r = detail::residual_view(comm, "k");
              out32[comm.rank()][step] = x;
              res32[comm.rank()][step].assign(r.begin(), r.end());
            }
          });
          testing::run_ranks(n, [&](Communicator& comm) {
            for (int step = 0; step < steps; ++step) {
              Half16 h = rounded(gradient(comm.rank(), numel, step + 1), dtype);
              comm.allreduce(h.view(), op, CompressOptions{spec, "k", nullptr});
              const auto& ref = out32[comm.rank()][step];
              for (int64_t i = 0; i < numel; ++i) {
                ASSERT_EQ(h.bits[i], narrow(ref[i], dtype))
                    << spec << " " << name(dtype) << " N=" << n << " " << reduce_op_name(op) << " step " << step
                    << " i=" << i;
              }
              const auto r = detail::residual_view(comm, "k");
              ASSERT_EQ(std::vector<float>(r.begin(), r.end()), res32[comm.rank()][step])
                  << spec << " " << name(dtype) << " N=" << n << " step " << step;
            }
          });
        }
      }
    }
  }
}

// Several pieces (2.5M elements: pieces of 2^20): each piece is that piece's own float32
// call (a deterministic codec without state, so a piece's call needs nothing from the rest).
TEST(Compression16Bit, ManyPiecesAreEachPiecesOwnFloat32Call) {
  const std::string spec = "quant:bits=8,round=nearest,ef=0";
  const int64_t numel = 2'500'000, piece = int64_t{1} << 20;
  testing::run_ranks(2, [&](Communicator& comm) {
    Half16 h = rounded(gradient(comm.rank(), numel, 7), DType::kBFloat16);
    std::vector<float> ref = h.widened();
    for (int64_t b = 0; b < numel; b += piece) {
      const int64_t len = std::min(piece, numel - b);
      comm.allreduce(TensorView::of(ref.data() + b, len), ReduceOp::kAvg, CompressOptions{spec, "", nullptr});
    }
    comm.allreduce(h.view(), ReduceOp::kAvg, CompressOptions{spec, "", nullptr});
    for (int64_t i = 0; i < numel; ++i) ASSERT_EQ(h.bits[i], float_to_bf16(ref[i])) << "i=" << i;
  });
}

// The reduce-scatter, one piece: the float32 reduce-scatter of the widened input, rounded;
// the input unchanged. (Two runs, as above, for one key name.)
TEST(Compression16Bit, ReduceScatterOfOnePieceIsTheFloat32OneRounded) {
  const int64_t count = 10'007;
  const int steps = 2;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const char* spec : {"quant:bits=8", "qsgd", "topk:ratio=0.05"}) {
      for (int n : {2, 3}) {
        std::vector<std::vector<std::vector<float>>> out32(n, std::vector<std::vector<float>>(steps));
        testing::run_ranks(n, [&](Communicator& comm) {
          for (int step = 0; step < steps; ++step) {
            std::vector<float> in = rounded(gradient(comm.rank(), n * count, step + 1), dtype).widened();
            std::vector<float> out(static_cast<size_t>(count));
            comm.reduce_scatter(TensorView::of(in.data(), n * count), TensorView::of(out.data(), count),
                                ReduceOp::kAvg, CompressOptions{spec, "k", nullptr});
            out32[comm.rank()][step] = out;
          }
        });
        testing::run_ranks(n, [&](Communicator& comm) {
          for (int step = 0; step < steps; ++step) {
            Half16 in = rounded(gradient(comm.rank(), n * count, step + 1), dtype);
            const Half16 given = in;
            Half16 out{dtype, std::vector<uint16_t>(static_cast<size_t>(count))};
            comm.reduce_scatter(in.view(), out.view(), ReduceOp::kAvg, CompressOptions{spec, "k", nullptr});
            ASSERT_EQ(in.bits, given.bits) << "the input changed";
            const auto& ref = out32[comm.rank()][step];
            for (int64_t i = 0; i < count; ++i) {
              ASSERT_EQ(out.bits[i], narrow(ref[i], dtype))
                  << spec << " " << name(dtype) << " N=" << n << " step " << step << " i=" << i;
            }
          }
        });
      }
    }
  }
}

// The reduce-scatter in several pieces (N = 2, 1.5M elements a share: pieces of 2^19 of
// every segment): each piece is the float32 reduce-scatter of that piece of every segment.
TEST(Compression16Bit, ReduceScatterInPiecesIsEachPiecesOwnFloat32ReduceScatter) {
  const std::string spec = "quant:bits=8,round=nearest,ef=0";
  const int n = 2;
  const int64_t count = 1'500'000, most = (int64_t{1} << 20) / n;
  testing::run_ranks(n, [&](Communicator& comm) {
    Half16 in = rounded(gradient(comm.rank(), n * count, 3), DType::kBFloat16);
    const std::vector<float> wide = in.widened();
    std::vector<float> expected(static_cast<size_t>(count));
    for (int64_t p0 = 0; p0 < count; p0 += most) {
      const int64_t len = std::min(most, count - p0);
      std::vector<float> piece(static_cast<size_t>(n * len)), share(static_cast<size_t>(len));
      for (int s = 0; s < n; ++s) std::copy_n(wide.begin() + s * count + p0, len, piece.begin() + s * len);
      comm.reduce_scatter(TensorView::of(piece.data(), n * len), TensorView::of(share.data(), len), ReduceOp::kSum,
                          CompressOptions{spec, "", nullptr});
      std::copy(share.begin(), share.end(), expected.begin() + p0);
    }
    Half16 out{DType::kBFloat16, std::vector<uint16_t>(static_cast<size_t>(count))};
    comm.reduce_scatter(in.view(), out.view(), ReduceOp::kSum, CompressOptions{spec, "", nullptr});
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(out.bits[i], float_to_bf16(expected[i])) << "i=" << i;
  });
}

// Two levels (two nodes of two): the levels inside in bf16, the pieces across compressed:
// every rank the same bits, within quant:bits=8's error of the exact sum.
TEST(Compression16Bit, TwoLevelsGiveEveryRankTheSameBitsNearTheExactSum) {
  const int64_t numel = 40'000;
  std::vector<std::vector<uint16_t>> out(4);
  auto errors = testing::run_ranks_on_nodes({"a", "a", "b", "b"}, [&](Communicator& comm) {
    Half16 h = rounded(gradient(comm.rank(), numel, 5), DType::kBFloat16);
    comm.allreduce(h.view(), ReduceOp::kSum, CompressOptions{"quant:bits=8", "two", nullptr});
    out[comm.rank()] = h.bits;
  });
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (int r = 1; r < 4; ++r) ASSERT_EQ(out[r], out[0]) << "rank " << r;
  std::vector<std::vector<float>> g(4);
  for (int r = 0; r < 4; ++r) g[r] = rounded(gradient(r, numel, 5), DType::kBFloat16).widened();
  double worst = 0;
  for (int64_t i = 0; i < numel; ++i) {
    const double exact = double{g[0][i]} + g[1][i] + g[2][i] + g[3][i];
    worst = std::max(worst, std::abs(bf16_to_float(out[0][i]) - exact));
  }
  EXPECT_LT(worst, 0.25) << "4 ranks of N(0, 1): 8-bit buckets and bf16 sums stay well inside this";
}

// The largest single allocation of any rank during `call` (every rank makes it; the
// count is process-wide, so rank 0 starts and stops it between barriers).
template <class Call>
size_t largest_allocation(Communicator& comm, Call&& call) {
  comm.barrier();
  if (comm.rank() == 0) {
    g_largest = 0;
    g_counting = true;
  }
  comm.barrier();
  call();
  comm.barrier();
  if (comm.rank() == 0) g_counting = false;
  comm.barrier();
  return g_largest;
}

TEST(Compression16Bit, NoAllocationAsLargeAsAFloat32CopyOfTheTensor) {
  const int n = 2;
  const int64_t numel = int64_t{4} << 20;  // 8 MiB of bf16; a float32 copy: 16 MiB
  const size_t float32_copy = static_cast<size_t>(numel) * sizeof(float);
  size_t allreduce16 = 0, scatter16 = 0, scatter32 = 0;
  testing::run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    Half16 h = rounded(gradient(r, numel, 1), DType::kBFloat16);
    Half16 share{DType::kBFloat16, std::vector<uint16_t>(static_cast<size_t>(numel / n))};
    std::vector<float> in32 = h.widened(), out32(static_cast<size_t>(numel / n));
    const CompressOptions a{"quant:bits=8", "a", nullptr}, s{"quant:bits=8", "s", nullptr},
        s32{"quant:bits=8", "s32", nullptr};
    for (int step = 0; step < 2; ++step) {  // the first call makes each key's residual
      const size_t x = largest_allocation(comm, [&] { comm.allreduce(h.view(), ReduceOp::kAvg, a); });
      const size_t y = largest_allocation(comm, [&] { comm.reduce_scatter(h.view(), share.view(), ReduceOp::kAvg, s); });
      const size_t z = largest_allocation(comm, [&] {
        comm.reduce_scatter(TensorView::of(in32.data(), numel), TensorView::of(out32.data(), numel / n),
                            ReduceOp::kAvg, s32);
      });
      if (r == 0 && step == 1) allreduce16 = x, scatter16 = y, scatter32 = z;
    }
  });
  EXPECT_GE(scatter32, float32_copy) << "the float32 reduce-scatter's copy must be seen";
  EXPECT_LT(allreduce16, float32_copy / 2) << "bf16 allreduce";
  EXPECT_LT(scatter16, float32_copy / 2) << "bf16 reduce-scatter";
  std::printf("largest allocation of a call, %lld bf16 elements (a float32 copy: %zu B): allreduce %zu B, "
              "reduce-scatter %zu B; the float32 reduce-scatter %zu B\n",
              static_cast<long long>(numel), float32_copy, allreduce16, scatter16, scatter32);
}

TEST(Compression16Bit, OtherFamiliesAndGpuTensorsStillTakeFloat32Only) {
  testing::run_ranks(2, [](Communicator& comm) {
    Half16 h = rounded(gradient(comm.rank(), 1000, 1), DType::kBFloat16);
    for (const char* spec : {"randomk:ratio=0.1", "sketch:k=50", "powersgd"}) {
      try {
        comm.allreduce(h.view(), ReduceOp::kSum, CompressOptions{spec, "k", nullptr});
        ADD_FAILURE() << spec << " accepted a bfloat16 tensor";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("takes float32 tensors"), std::string::npos) << e.what();
      }
    }
  });
}

}  // namespace
}  // namespace gradcomm
