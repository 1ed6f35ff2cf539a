// The ring schedule every ring shares (src/collectives/ring_schedule.h) against its
// definition; the compressed ring's plan (compressed_ring_plan.h), on the host: its
// layout invariants, and -- executed unit by unit on N simulated
// ranks with the CPU codecs, exactly as nccl_compressed_ring.cc orders encodes,
// transfers and decodes -- the CPU path's result bit for bit (the communicator's
// compressed allreduce over in-process threads, with error feedback across steps).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/compressed_ring_plan.h"
#include "collectives/ring_schedule.h"
#include "compressors/codec.h"
#include "compressors/philox.h"
#include "compressors/spec.h"
#include "state.h"
#include "test_util.h"

namespace gradcomm {
namespace {

using detail::CompressedRingPlan;
using detail::RingSchedule;

// The one ring schedule (ring_schedule.h) against its definition, written out here
// independently: segment s of U = ceil(numel/A) units starts at min(numel,
// floor(U*s/N)*A) (for A = 1, the dense ring's balanced split numel*s/N); chunk j of
// a segment of V units starts floor(V*j/C)*A in; reduce-scatter step k sends segment
// r-k and receives r-k-1, allgather step k sends r+1-k and receives r-k; every chunk
// fits max_chunk_elems().
TEST(RingSchedule, SegmentsChunksAndUnitsFollowTheirDefinition) {
  for (int n : {1, 2, 3, 7}) {
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1000}, int64_t{65537}}) {
      for (int64_t align : {int64_t{1}, int64_t{64}}) {
        for (int64_t chunk_elems : {int64_t{1}, int64_t{100}, int64_t{1} << 20}) {
          SCOPED_TRACE(::testing::Message() << "n " << n << " numel " << numel << " align " << align << " chunk "
                                            << chunk_elems);
          const int64_t U = (numel + align - 1) / align;
          auto seg = [&](int s) { return std::min<int64_t>(numel, U * s / n * align); };
          for (int r = 0; r < n; ++r) {
            const RingSchedule plan(n, r, numel, align, chunk_elems, 1 << 20);
            const int64_t C = plan.chunks();
            ASSERT_GE(C, 1);
            ASSERT_EQ(plan.units(), 2 * int64_t{n - 1} * C);
            for (int s = 0; s <= n; ++s) ASSERT_EQ(plan.segment_begin(s), seg(s)) << "segment " << s;
            for (int s = 0; s < n; ++s) {
              const int64_t V = (seg(s + 1) - seg(s) + align - 1) / align;
              for (int64_t j = 0; j < C; ++j) {
                const auto [b, e] = plan.chunk(s, j);
                ASSERT_EQ(b, std::min(seg(s + 1), seg(s) + V * j / C * align));
                ASSERT_EQ(e, std::min(seg(s + 1), seg(s) + V * (j + 1) / C * align));
                ASSERT_LE(e - b, plan.max_chunk_elems());
              }
            }
            const auto mod = [n](int64_t v) { return static_cast<int>(((v % n) + n) % n); };
            for (int64_t u = 0; u < plan.units(); ++u) {
              const bool rs = u < int64_t{n - 1} * C;
              const int64_t k = (rs ? u : u - int64_t{n - 1} * C) / C;
              ASSERT_EQ(plan.reduce_scatter(u), rs);
              ASSERT_EQ(plan.last_reduce_step(u), rs && k == n - 2);
              ASSERT_EQ(plan.send_range(u), plan.chunk(rs ? mod(r - k) : mod(r + 1 - k), u % C));
              ASSERT_EQ(plan.recv_range(u), plan.chunk(rs ? mod(r - k - 1) : mod(r - k), u % C));
            }
          }
        }
      }
    }
  }
}

TEST(CompressedRingPlan, RangesTileSegmentsAlignedAndRingNeighboursAgree) {
  for (int n : {2, 3, 5, 8}) {
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
      for (int64_t align : {int64_t{1}, int64_t{128}}) {
        auto bytes = [](int64_t m) { return static_cast<size_t>(24 + 3 * m); };
        std::vector<CompressedRingPlan> plans;
        for (int r = 0; r < n; ++r) plans.emplace_back(n, r, numel, align, 300, 4, bytes);
        const CompressedRingPlan& p = plans[0];
        SCOPED_TRACE(::testing::Message() << "n=" << n << " numel=" << numel << " align=" << align);
        // Segments: consecutive, cover [0, numel), start aligned; chunks tile each segment.
        EXPECT_EQ(p.segment_begin(0), 0);
        EXPECT_EQ(p.segment_begin(n), numel);
        for (int s = 0; s < n; ++s) {
          EXPECT_LE(p.segment_begin(s), p.segment_begin(s + 1));
          EXPECT_TRUE(p.segment_begin(s) % align == 0 || p.segment_begin(s) == numel);
          int64_t at = p.segment_begin(s);
          for (int64_t j = 0; j < p.chunks(); ++j) {
            const auto [b, e] = p.chunk(s, j);
            EXPECT_EQ(b, at);
            EXPECT_TRUE(b % align == 0 || b == numel);
            at = e;
          }
          EXPECT_EQ(at, p.segment_begin(s + 1));
        }
        // Rank r receives at unit u what its left neighbour sends, with the same size.
        for (int r = 0; r < n; ++r) {
          const CompressedRingPlan& me = plans[r];
          const CompressedRingPlan& left = plans[(r + n - 1) % n];
          ASSERT_EQ(me.units(), 2 * int64_t{n - 1} * me.chunks());
          for (int64_t u = 0; u < me.units(); ++u) {
            EXPECT_EQ(me.recv_range(u), left.send_range(u)) << "rank " << r << " unit " << u;
            EXPECT_EQ(me.recv_bytes(u), left.send_bytes(u));
            const auto [b, e] = me.recv_range(u);
            EXPECT_EQ(me.recv_bytes(u), bytes(e - b));
            EXPECT_LE(me.recv_offset(u) + me.recv_bytes(u), me.buffer_bytes());
            EXPECT_EQ(me.recv_offset(u) % 16, 0u);
            EXPECT_LE(me.send_offset(u) + me.send_bytes(u), me.buffer_bytes());
          }
          // Receive regions never overlap one another or an encode's region.
          std::vector<std::pair<size_t, size_t>> regions;
          for (int64_t u = 0; u < me.units(); ++u) regions.emplace_back(me.recv_offset(u), me.recv_bytes(u));
          for (int64_t u = 0; u < me.encoded_units(); ++u) regions.emplace_back(me.send_offset(u), me.send_bytes(u));
          std::sort(regions.begin(), regions.end());
          for (size_t i = 1; i < regions.size(); ++i) {
            EXPECT_LE(regions[i - 1].first + regions[i - 1].second, regions[i].first);
          }
        }
      }
    }
  }
}

TEST(CompressedRingPlan, BadArgumentsAreInvalid) {
  auto bytes = [](int64_t m) { return static_cast<size_t>(m); };
  EXPECT_THROW(CompressedRingPlan(1, 0, 10, 1, 4, 4, bytes), InvalidArgument);
  EXPECT_THROW(CompressedRingPlan(2, 2, 10, 1, 4, 4, bytes), InvalidArgument);
  EXPECT_THROW(CompressedRingPlan(2, 0, -1, 1, 4, 4, bytes), InvalidArgument);
  EXPECT_THROW(CompressedRingPlan(2, 0, 10, 0, 4, 4, bytes), InvalidArgument);
}

// Runs the plan on n simulated ranks with the CPU codec, in the order the GPU ring
// enqueues its work (per rank: encode own chunks; per unit: transfer, decode, encode).
void simulate(const detail::DenseCodec& codec, std::vector<std::vector<float>>& data,
              std::vector<std::vector<float>>& residual, const std::vector<detail::PhiloxStream>& rng,
              int64_t chunk_elems) {
  const int n = static_cast<int>(data.size());
  const int64_t numel = static_cast<int64_t>(data[0].size());
  std::vector<CompressedRingPlan> plans;
  std::vector<std::vector<uint8_t>> block(n);
  for (int r = 0; r < n; ++r) {
    plans.emplace_back(n, r, numel, codec.alignment(), chunk_elems, 8,
                       [&](int64_t m) { return codec.encoded_bytes(m); });
    block[r].assign(plans[r].buffer_bytes(), 0);
  }
  auto encode = [&](int r, int64_t u) {
    const auto [b, e] = plans[r].send_range(u);
    uint8_t* out = block[r].data() + plans[r].send_offset(u);
    codec.encode(data[r].data() + b, e - b, out, rng[r], b);
    std::vector<float> decoded(static_cast<size_t>(e - b));
    codec.decode(std::span<const uint8_t>(out, plans[r].send_bytes(u)), e - b, decoded.data());
    for (int64_t i = 0; i < e - b; ++i) {  // ResidualMode::kAccumulate, decoded = in for the final encode
      residual[r][b + i] += data[r][b + i] - decoded[i];
      if (plans[r].final_encode(u)) data[r][b + i] = decoded[i];
    }
  };
  for (int r = 0; r < n; ++r) {
    for (int64_t j = 0; j < plans[r].chunks(); ++j) encode(r, j);
  }
  for (int64_t u = 0; u < plans[0].units(); ++u) {
    for (int r = 0; r < n; ++r) {  // the group: every rank's send lands in its right neighbour
      const int left = (r + n - 1) % n;
      ASSERT_EQ(plans[r].recv_bytes(u), plans[left].send_bytes(u));
      std::memcpy(block[r].data() + plans[r].recv_offset(u), block[left].data() + plans[left].send_offset(u),
                  plans[r].recv_bytes(u));
    }
    for (int r = 0; r < n; ++r) {
      const auto [b, e] = plans[r].recv_range(u);
      const std::span<const uint8_t> in(block[r].data() + plans[r].recv_offset(u), plans[r].recv_bytes(u));
      if (plans[r].reduce_scatter(u)) {
        codec.decode_add(in, e - b, data[r].data() + b);
        encode(r, u + plans[r].chunks());
      } else {
        codec.decode(in, e - b, data[r].data() + b);
      }
    }
  }
}

TEST(CompressedRingPlan, ExecutedWithTheCpuCodecsGivesTheCpuPathsBytes) {
  // The CPU path's ring (GRADCOMM_SCHEDULE=auto takes the direct schedule from 3 ranks;
  // the NCCL path runs the ring).
  testing::ScopedEnv ring("GRADCOMM_SCHEDULE", "ring");
  const std::string key = "grad";
  const uint64_t key_hash = detail::fnv1a64(std::span(reinterpret_cast<const uint8_t*>(key.data()), key.size()));
  for (const char* text : {"fp16", "bf16", "sign:bucket=128", "qsgd:levels=16,bucket=512",
                           "quant:bits=4,bucket=256,round=stochastic,ef=1"}) {
    for (int n : {2, 3, 4}) {
      for (int64_t numel : {int64_t{5}, int64_t{4099}}) {
        SCOPED_TRACE(::testing::Message() << text << " n=" << n << " numel=" << numel);
        const detail::CompressorSpec spec = detail::parse_compressor_spec(text);
        const auto codec = detail::make_dense_codec(spec);
        auto input = [&](int r, int step, int64_t i) {
          return std::sin(0.013f * static_cast<float>(i * (r + 2) + 7 * step)) * static_cast<float>(r + 1);
        };
        // Reference: the communicator's CPU path, two steps (EF carries over when on).
        std::vector<std::vector<std::vector<float>>> reference(2, std::vector<std::vector<float>>(n));
        testing::run_ranks(n, [&](Communicator& comm) {
          CompressOptions options;
          options.compressor = text;
          options.key = key;
          for (int step = 0; step < 2; ++step) {
            std::vector<float> x(static_cast<size_t>(numel));
            for (int64_t i = 0; i < numel; ++i) x[i] = input(comm.rank(), step, i);
            comm.allreduce(TensorView::of(x.data(), numel), ReduceOp::kSum, options);
            reference[step][comm.rank()] = x;
          }
        });
        // Simulation: fold, ring (chunk 64 elements: several chunks per segment).
        std::vector<std::vector<float>> residual(n, std::vector<float>(static_cast<size_t>(numel), 0.0f));
        for (int step = 0; step < 2; ++step) {
          std::vector<std::vector<float>> data(n, std::vector<float>(static_cast<size_t>(numel)));
          std::vector<detail::PhiloxStream> rng;
          for (int r = 0; r < n; ++r) {
            for (int64_t i = 0; i < numel; ++i) {
              data[r][i] = input(r, step, i);
              if (spec.ef) data[r][i] += residual[r][i];
            }
            std::fill(residual[r].begin(), residual[r].end(), 0.0f);
            rng.push_back({spec.seed, detail::philox_stream_id(key_hash, static_cast<uint64_t>(step), r)});
          }
          simulate(*codec, data, residual, rng, 64);
          for (int r = 0; r < n; ++r) {
            ASSERT_TRUE(testing::same_bytes(data[r].data(), reference[step][r].data(), numel * sizeof(float)))
                << "step " << step << " rank " << r;
          }
          if (!spec.ef) {
            for (auto& res : residual) std::fill(res.begin(), res.end(), 0.0f);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gradcomm
