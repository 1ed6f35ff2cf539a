// Issue 29 asks: is the compressed ring's per-hop re-quantization worth replacing by a
// reduce-scatter and a quantized allgather, for the same bytes? This answers it for one
// step of one tensor, with the library's own codecs, without a network.
//
// Per rank, both schedules move the same payloads: N - 1 segment payloads out in the
// reduce-scatter phase and N - 1 in the allgather phase, each a segment of n / N elements
// under the same codec. They also do the same codec work per rank: N segment encodes (n
// elements) and 2N - 1 segment decodes. What differs is what gets quantized:
//   ring    (compressed_ring.cc) segment s starts at rank s as Q(g_s); each hop adds its
//           rank's values to the decoded partial sum and quantizes the sum again; the final
//           owner quantizes the full sum once more for the allgather: N quantizations in a
//           chain, of partial sums that grow with the hop;
//   direct  every rank quantizes its own values of segment s once and sends them straight
//           to its owner (an all-to-all of the same payloads), which adds the N - 1 decoded
//           ones to its own exact values and quantizes the sum once for the allgather: N - 1
//           independent quantizations of single gradients, then one of the sum.
// The difference is the error (this program) and the message pattern: the ring pipelines
// along one neighbour link; the direct schedule sends to every peer at once, which a
// switched network carries at the same per-rank rate (N - 1 messages of n / N each).
//
//   bench_requant_error [n] [trials]    default 1048576 elements, 5 trials
// Prints, per codec and N, the relative RMS error ||out - exact|| / ||exact|| of both
// schedules (mean over trials; each trial draws new gradients and Philox streams), and
// their ratio. The gradients are independent N(0, 1) per rank, the case where partial sums
// grow fastest (as sqrt(hops)).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "compressors/codec.h"
#include "compressors/philox.h"
#include "compressors/spec.h"

namespace gradcomm::detail {
namespace {

struct Codec {
  const DenseCodec& c;
  // Quantizes x[b, e) (a segment: bucket-aligned b) with `rng` and returns the decoded values.
  std::vector<float> round_trip(const float* x, int64_t b, int64_t e, const PhiloxStream& rng) const {
    std::vector<uint8_t> payload(c.encoded_bytes(e - b));
    c.encode(x + b, e - b, payload.data(), rng, b);
    std::vector<float> out(static_cast<size_t>(e - b));
    c.decode(payload, e - b, out.data());
    return out;
  }
};

// Segment boundaries on bucket multiples, as the ring's plan cuts them.
std::vector<int64_t> segments(int64_t n, int ranks, int64_t align) {
  std::vector<int64_t> cut(static_cast<size_t>(ranks) + 1);
  const int64_t buckets = (n + align - 1) / align;
  for (int s = 0; s <= ranks; ++s) cut[static_cast<size_t>(s)] = std::min(n, buckets * s / ranks * align);
  return cut;
}

PhiloxStream stream(uint64_t trial, int rank, int hop) {
  return PhiloxStream{0x5EED + trial, philox_stream_id(0xC0FFEE + trial, static_cast<uint64_t>(hop), rank)};
}

double relative_error(const std::vector<float>& out, const std::vector<double>& exact) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    err += (out[i] - exact[i]) * (out[i] - exact[i]);
    norm += exact[i] * exact[i];
  }
  return std::sqrt(err / norm);
}

// One step of each schedule; returns {ring error, direct error}.
std::pair<double, double> trial(const Codec& q, int ranks, int64_t n, uint64_t t) {
  std::mt19937_64 gen(t * 1000 + static_cast<uint64_t>(ranks));
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> g(static_cast<size_t>(ranks), std::vector<float>(static_cast<size_t>(n)));
  std::vector<double> exact(static_cast<size_t>(n), 0.0);
  for (auto& x : g) {
    for (int64_t i = 0; i < n; ++i) {
      x[static_cast<size_t>(i)] = normal(gen);
      exact[static_cast<size_t>(i)] += x[static_cast<size_t>(i)];
    }
  }
  const std::vector<int64_t> cut = segments(n, ranks, q.c.alignment());
  std::vector<float> ring(static_cast<size_t>(n)), direct(static_cast<size_t>(n));
  for (int s = 0; s < ranks; ++s) {
    const int64_t b = cut[static_cast<size_t>(s)], e = cut[static_cast<size_t>(s) + 1];
    if (b == e) continue;
    // Ring: the partial sum travels s, s+1, ..., s+N-1 (the owner), re-quantized at each hop.
    std::vector<float> partial(g[static_cast<size_t>(s)].begin() + b, g[static_cast<size_t>(s)].begin() + e);
    for (int hop = 1; hop < ranks; ++hop) {
      const int from = (s + hop - 1) % ranks, at = (s + hop) % ranks;
      std::vector<float> whole(static_cast<size_t>(n));  // the sender's buffer, segment in place
      std::copy(partial.begin(), partial.end(), whole.begin() + b);
      const std::vector<float> got = q.round_trip(whole.data(), b, e, stream(t, from, hop));
      for (int64_t i = b; i < e; ++i) {
        partial[static_cast<size_t>(i - b)] = g[static_cast<size_t>(at)][static_cast<size_t>(i)] + got[static_cast<size_t>(i - b)];
      }
    }
    // Direct: the owner (the ring's, for the same final encode) adds the others' decoded values.
    const int owner = (s + ranks - 1) % ranks;
    std::vector<float> sum(g[static_cast<size_t>(owner)].begin() + b, g[static_cast<size_t>(owner)].begin() + e);
    for (int r = 0; r < ranks; ++r) {
      if (r == owner) continue;
      const std::vector<float> got = q.round_trip(g[static_cast<size_t>(r)].data(), b, e, stream(t, r, 1000));
      for (int64_t i = b; i < e; ++i) sum[static_cast<size_t>(i - b)] += got[static_cast<size_t>(i - b)];
    }
    // Both: the owner quantizes the full sum once for the allgather.
    for (auto [acc, out] : {std::pair{&partial, &ring}, std::pair{&sum, &direct}}) {
      std::vector<float> whole(static_cast<size_t>(n));
      std::copy(acc->begin(), acc->end(), whole.begin() + b);
      const std::vector<float> got = q.round_trip(whole.data(), b, e, stream(t, owner, 2000));
      std::copy(got.begin(), got.end(), out->begin() + b);
    }
  }
  return {relative_error(ring, exact), relative_error(direct, exact)};
}

int run(int64_t n, int trials) {
  std::printf("# one step, n = %lld, independent N(0,1) gradients per rank, mean over %d trials\n",
              static_cast<long long>(n), trials);
  std::printf("%-28s %3s %14s %14s %12s\n", "codec", "N", "ring rel.err", "direct rel.err", "ring/direct");
  for (const char* spec : {"quant:bits=4", "quant:bits=8", "qsgd:levels=16", "fp16"}) {
    const auto codec = make_dense_codec(parse_compressor_spec(spec));
    const Codec q{*codec};
    for (int ranks : {2, 3, 4, 8, 16}) {
      double ring = 0, direct = 0;
      for (int t = 0; t < trials; ++t) {
        const auto [a, b] = trial(q, ranks, n, static_cast<uint64_t>(t));
        ring += a / trials;
        direct += b / trials;
      }
      std::printf("%-28s %3d %14.6f %14.6f %12.3f\n", spec, ranks, ring, direct, ring / direct);
    }
  }
  return 0;
}

}  // namespace
}  // namespace gradcomm::detail

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : int64_t{1} << 20;
  const int trials = argc > 2 ? std::atoi(argv[2]) : 5;
  if (n < 1 || trials < 1) {
    std::fprintf(stderr, "usage: bench_requant_error [n >= 1] [trials >= 1]\n");
    return 2;
  }
  return gradcomm::detail::run(n, trials);
}
