// The sparse-selection collectives (top-k's), and the choice between them.
//
// Sparse allgather: every rank's payload to every rank (ring_allgatherv), each rank sums
// all N payloads in rank order. A rank receives (N-1) payloads of k entries: cheap at
// small N, but it grows with N, and at 1 % density it sends more than the dense ring from
// N of about 25 (raw indices; later with coded ones).
//
// Sparse reduce-scatter (Ok-Topk and SparCML split the index space the same way; the
// re-sparsification is gTop-k's): the index space is cut into N regions, region s =
// [s*n/N, (s+1)*n/N) owned by rank s.
//   1. All-to-all: each rank sends each owner the entries of its selection that fall in
//      the owner's region, one payload per region (sizes first, then the payloads).
//   2. The owner sums its region's N payloads in rank order, onto +0.0: per index, the
//      same additions in the same order as the allgather's decode.
//   3. It keeps at most ceil(k/N) entries of the summed region, the largest by magnitude
//      (the exact top-k rule, ties to the lower index). What it drops, and what rounding a
//      kept sum to the value type loses, it adds to its own error-feedback residual: the
//      sum over ranks of residuals plus outputs stays the sum of the inputs.
//   4. The kept regions are allgathered (ring_allgatherv_bytes) and every rank decodes
//      them, each into its region: bitwise the same result on every rank.
// A rank sends about (N-1)/N of its payload in step 1 and receives N-1 payloads of
// ceil(k/N) entries in step 4: about two payloads' bytes whatever N is, against N-1 for
// the allgather, in 4(N-1) messages against N-1. Where every region keeps every entry
// (its union has at most ceil(k/N) indices) and values are fp32, the output is bitwise
// the allgather's.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <bit>
#include <vector>

#include "collectives/collectives.h"
#include "compressors/payload.h"
#include "compressors/sparse/sparse_code.h"
#include "compressors/sparse/topk_logic.h"

namespace gradcomm::detail {
namespace {

// Message units of the all-to-all (below ring_allgatherv_bytes' second phase, above any
// unit its first phase uses).
constexpr uint32_t kAllToAllSizes = 0x40000000u;
constexpr uint32_t kAllToAllData = 0x40000001u;

// The α–β constants of the automatic choice. The library cannot see the link, so it
// assumes one: α = 30 µs per message (a small message's one-way time over UCX/TCP on
// loopback and veth) and a 10 Gbit/s link. The owner's work (merge, re-selection, the
// residual's updates) is charged 70 ns per entry it receives, as measured on the
// development VM (bench/results/sparse-2026-11-24.md: the reduce-scatter's decode phase
// against the allgather's, 100 MB at 1 %, N = 2). Fixed, not read from the environment:
// every rank must choose the same algorithm from the same (spec, N, n). `algo=` overrides
// the choice (and is part of the spec every rank's call header carries).
constexpr double kAlphaSeconds = 30e-6;
constexpr double kLinkBytesPerSecond = 10e9 / 8;
constexpr double kOwnerSecondsPerEntry = 70e-9;

// First element of region s of n elements split among `ranks`: floor(n * s / ranks),
// computed without forming n * s.
int64_t region_begin(int64_t n, int s, int ranks) { return (n / ranks) * s + (n % ranks) * s / ranks; }

// Entries an owner keeps of its summed region.
int64_t region_budget(int64_t k, int ranks) { return std::max<int64_t>(1, (k + ranks - 1) / ranks); }

// Largest payload an honest rank sends for a region of `len` elements: at most
// min(len, 2k) entries (select=sample keeps up to 2k), no wider than raw u64 indices and
// fp32 values, plus the coded high section's spare bits. Only a bound on what to accept
// before reading; the decoder validates the exact size.
uint64_t region_payload_bound(int64_t len, int64_t k) {
  const uint64_t entries = static_cast<uint64_t>(std::min<int64_t>(len, 2 * std::max<int64_t>(k, 1)));
  return PayloadHeader::kBytes + entries * 12 + static_cast<uint64_t>(len) / 8 + 16;
}

// The union of sorted selections of a region of `len` elements, each index's values
// added onto +0.0 in list order (rank order): the arithmetic of decode_sum_sparse. Tile by
// tile, as that decoder: the lists add their entries in the tile to a cache-resident
// scratch tile in list order, marking them, and the marked indices come out in order.
SparseVector merge_sum(const std::vector<SparseVector>& lists, int64_t len) {
  constexpr int64_t kTile = 16384;  // 64 KiB of fp32
  std::vector<float> tile(kTile);
  std::vector<uint64_t> marked(kTile / 64);
  std::vector<size_t> at(lists.size(), 0);
  size_t total = 0;
  for (const SparseVector& l : lists) total += l.indices.size();
  SparseVector sum;
  sum.indices.reserve(total);
  sum.values.reserve(total);
  for (int64_t begin = 0; begin < len && sum.indices.size() < total; begin += kTile) {
    const auto end = static_cast<uint64_t>(std::min(len, begin + kTile));
    const auto base = static_cast<uint64_t>(begin);
    bool any = false;
    for (size_t l = 0; l < lists.size(); ++l) {
      const SparseVector& list = lists[l];
      size_t j = at[l];
      for (; j < list.indices.size() && list.indices[j] < end; ++j) {
        const uint64_t i = list.indices[j] - base;
        const uint64_t bit = uint64_t{1} << (i % 64);
        if ((marked[i / 64] & bit) == 0) {
          marked[i / 64] |= bit;
          tile[i] = 0.0f;
        }
        tile[i] += list.values[j];
        any = true;
      }
      at[l] = j;
    }
    if (!any) continue;
    for (size_t w = 0; w < marked.size(); ++w) {
      for (uint64_t bits = marked[w]; bits != 0; bits &= bits - 1) {
        const uint64_t i = w * 64 + static_cast<uint64_t>(std::countr_zero(bits));
        sum.indices.push_back(base + i);
        sum.values.push_back(tile[i]);
      }
      marked[w] = 0;
    }
  }
  return sum;
}

// Which of `values` are the `budget` largest by magnitude (topk_select's key: NaN above
// every number), ties to the lower position: all of them when there are at most budget.
std::vector<bool> top_magnitudes(const std::vector<float>& values, int64_t budget) {
  std::vector<bool> keep(values.size(), true);
  if (static_cast<int64_t>(values.size()) <= budget || budget <= 0) {
    if (budget <= 0) std::fill(keep.begin(), keep.end(), false);
    return keep;
  }
  // The budget-th largest key T: keep every key above it, then keys equal to T from the
  // lowest position until the budget is spent.
  std::vector<uint32_t> keys(values.size());
  for (size_t j = 0; j < values.size(); ++j) keys[j] = topk::magnitude_key(values[j]);
  std::vector<uint32_t> scratch = keys;
  std::nth_element(scratch.begin(), scratch.begin() + (budget - 1), scratch.end(), std::greater<>());
  const uint32_t threshold = scratch[static_cast<size_t>(budget - 1)];
  int64_t above = 0;
  for (uint32_t key : keys) above += key > threshold;
  int64_t equal_left = budget - above;
  for (size_t j = 0; j < keys.size(); ++j) {
    keep[j] = keys[j] > threshold || (keys[j] == threshold && equal_left-- > 0);
  }
  return keep;
}

// The blocks of ring_allgatherv_bytes' output, one per rank.
std::vector<std::span<const uint8_t>> split_blocks(const std::vector<uint8_t>& all, const std::vector<int64_t>& sizes) {
  std::vector<std::span<const uint8_t>> blocks;
  size_t at = 0;
  for (int64_t size : sizes) {
    blocks.push_back(std::span<const uint8_t>(all).subspan(at, static_cast<size_t>(size)));
    at += static_cast<size_t>(size);
  }
  return blocks;
}

}  // namespace

SparseAlgo choose_sparse_algo(const SparseShape& shape, int ranks, int64_t numel) {
  if (shape.algo != SparseAlgo::kAuto) return shape.algo;
  if (ranks <= 2) return SparseAlgo::kAllgather;  // the same bytes, fewer messages
  const int64_t k = std::min(selection_count(shape.ratio, shape.k, numel), numel);
  const SparseFormat format = shape.format;
  const double N = ranks;
  const double payload = static_cast<double>(sparse_payload_bytes(numel, k, format));
  const double kept = static_cast<double>(
      sparse_payload_bytes((numel + ranks - 1) / ranks, std::min(region_budget(k, ranks), numel), format));
  const double allgather = (N - 1) * kAlphaSeconds + (N - 1) * payload / kLinkBytesPerSecond;
  const double reduce_scatter = 4 * (N - 1) * kAlphaSeconds +
                                ((N - 1) / N * payload + (N - 1) * kept) / kLinkBytesPerSecond +
                                static_cast<double>(k) * kOwnerSecondsPerEntry;
  return reduce_scatter < allgather ? SparseAlgo::kReduceScatter : SparseAlgo::kAllgather;
}

void sparse_allgather_allreduce(Op& op, CompressorId id, float* data, int64_t numel, ReduceOp reduce_op,
                                const SparseVector& selected, SparseFormat format, bool fixed_size,
                                SparseOutput output) {
  const int n = op.size();
  std::vector<uint8_t> payload;
  {
    Op::PhaseTimer timer(op, &Stats::encode_s);
    payload = encode_sparse(id, numel, selected, format);
  }
  std::vector<int64_t> sizes;
  std::vector<uint8_t> all;
  if (fixed_size) {
    // Every rank selects exactly k of numel: its payload has this size everywhere, so
    // no sizes are exchanged first (one latency-bound ring fewer). A payload of another
    // size fails its receive (CorruptPayload).
    sizes.assign(static_cast<size_t>(n), static_cast<int64_t>(payload.size()));
    all.resize(payload.size() * static_cast<size_t>(n));
    std::memcpy(all.data() + payload.size() * static_cast<size_t>(op.rank()), payload.data(), payload.size());
    if (n > 1) ring_allgatherv(op, all.data(), sizes, 1, kSecondPhaseUnits);
  } else {
    all = ring_allgatherv_bytes(op, payload, sizes);
  }
  // Every rank decodes every payload in rank order: bitwise identical sums.
  Op::PhaseTimer timer(op, &Stats::decode_s);
  const std::vector<std::span<const uint8_t>> payloads = split_blocks(all, sizes);
  // The average divides each tile as it is written, not in a pass after.
  try {
    decode_sum_sparse(id, payloads, numel, data, reduce_op == ReduceOp::kAvg ? n : 1, output);
  } catch (const CorruptPayload& e) {
    op.fail(ErrorCode::kCorruptPayload, fmt::format("sparse allgather (payload r is rank r's): {}", e.what()));
  }
}

namespace {

// Step 1 of the sparse reduce-scatter: every rank's selection cut into the N regions
// [begin[s], begin[s + 1]) (indices relative to the region), each region's payload sent
// to its owner. Returns this rank's region's N payloads, in rank order (its own among
// them), viewing `own` and the buffers it keeps.
struct RegionPayloads {
  std::vector<uint8_t> outgoing, incoming;
  std::vector<std::span<const uint8_t>> payloads;  // rank s's payload for this rank's region
};

RegionPayloads exchange_regions(Op& op, CompressorId id, const SparseVector& selected, SparseFormat format, int64_t k,
                                const std::vector<int64_t>& begin) {
  const int n = op.size();
  const int r = op.rank();
  auto len = [&](int s) { return begin[s + 1] - begin[s]; };
  RegionPayloads out;
  std::vector<uint64_t> out_offset(static_cast<size_t>(n) + 1, 0);
  {
    Op::PhaseTimer timer(op, &Stats::encode_s);
    std::vector<SparseVector> parts(static_cast<size_t>(n));
    size_t j = 0;
    for (int s = 0; s < n; ++s) {
      const auto end = static_cast<uint64_t>(begin[s + 1]);
      for (; j < selected.indices.size() && selected.indices[j] < end; ++j) {
        parts[s].indices.push_back(selected.indices[j] - static_cast<uint64_t>(begin[s]));
        parts[s].values.push_back(selected.values[j]);
      }
      out_offset[s + 1] =
          out_offset[s] + sparse_payload_bytes(len(s), static_cast<int64_t>(parts[s].indices.size()), format);
    }
    out.outgoing.resize(out_offset[n]);
    for (int s = 0; s < n; ++s) encode_sparse_into(id, len(s), parts[s], format, &out.outgoing[out_offset[s]]);
  }

  // Sizes, then payloads, to and from every peer.
  std::vector<uint64_t> in_size(static_cast<size_t>(n), 0);
  in_size[r] = out_offset[r + 1] - out_offset[r];
  std::vector<uint64_t> out_size(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) out_size[s] = out_offset[s + 1] - out_offset[s];
  std::vector<RequestPtr> sends, recvs;
  for (int s = 0; s < n; ++s) {
    if (s == r) continue;
    recvs.push_back(op.recv(s, kAllToAllSizes, &in_size[s], sizeof(uint64_t)));
    sends.push_back(op.send(s, kAllToAllSizes, &out_size[s], sizeof(uint64_t)));
  }
  op.wait_all(recvs, "sparse reduce-scatter sizes");
  const uint64_t bound = region_payload_bound(len(r), k);
  std::vector<uint64_t> in_offset(static_cast<size_t>(n) + 1, 0);
  for (int s = 0; s < n; ++s) {
    if (s != r && (in_size[s] < PayloadHeader::kBytes || in_size[s] > bound)) {
      op.fail(ErrorCode::kCorruptPayload,
              fmt::format("sparse reduce-scatter: rank {} announced a {}-byte payload for region {} of {} elements "
                          "(k = {}); expected {} to {} bytes",
                          s, in_size[s], r, len(r), k, PayloadHeader::kBytes, bound));
    }
    in_offset[s + 1] = in_offset[s] + (s == r ? 0 : in_size[s]);
  }
  out.incoming.resize(in_offset[n]);
  recvs.clear();
  for (int s = 0; s < n; ++s) {
    if (s == r) continue;
    recvs.push_back(op.recv(s, kAllToAllData, &out.incoming[in_offset[s]], in_size[s]));
    sends.push_back(op.send(s, kAllToAllData, &out.outgoing[out_offset[s]], out_size[s]));
  }
  op.wait_all(recvs, "sparse reduce-scatter receive");
  op.wait_all(sends, "sparse reduce-scatter send");
  for (int s = 0; s < n; ++s) {
    out.payloads.push_back(s == r ? std::span<const uint8_t>(&out.outgoing[out_offset[r]], out_size[r])
                                  : std::span<const uint8_t>(&out.incoming[in_offset[s]], in_size[s]));
  }
  return out;
}

}  // namespace

void sparse_reduce_scatter(Op& op, CompressorId id, float* data, int64_t numel, ReduceOp reduce_op,
                           const SparseVector& selected, SparseFormat format, int64_t k) {
  const int n = op.size();
  const int r = op.rank();
  std::vector<int64_t> begin(static_cast<size_t>(n) + 1);
  for (int s = 0; s <= n; ++s) begin[s] = region_begin(numel, s, n);  // s x count: numel is N x count
  const RegionPayloads got = exchange_regions(op, id, selected, format, k, begin);
  // The owner's segment: the N payloads summed in rank order (bitwise the same sums on
  // any run), divided for the average as each tile is written.
  Op::PhaseTimer timer(op, &Stats::decode_s);
  try {
    decode_sum_sparse(id, got.payloads, begin[r + 1] - begin[r], data + begin[r], reduce_op == ReduceOp::kAvg ? n : 1,
                      SparseOutput::kFill);
  } catch (const CorruptPayload& e) {
    op.fail(ErrorCode::kCorruptPayload, fmt::format("sparse reduce-scatter (payload s is rank s's): {}", e.what()));
  }
}

void sparse_reduce_scatter_allreduce(Op& op, CompressorId id, float* data, int64_t numel, ReduceOp reduce_op,
                                     const SparseVector& selected, SparseFormat format, int64_t k, float* residual,
                                     SparseOutput output) {
  const int n = op.size();
  const int r = op.rank();
  std::vector<int64_t> begin(static_cast<size_t>(n) + 1);
  for (int s = 0; s <= n; ++s) begin[s] = region_begin(numel, s, n);
  auto len = [&](int s) { return begin[s + 1] - begin[s]; };

  // 1. One payload per region, indices relative to the region, to its owner.
  const RegionPayloads region = exchange_regions(op, id, selected, format, k, begin);

  // 2. Sum the region's N payloads, merged by index: each index's sum starts at +0.0 and
  // adds the ranks' values in rank order. 3. Keep the top ceil(k/N) by magnitude; the
  // dropped sums and the kept sums' rounding go to our residual.
  std::vector<uint8_t> kept_payload;
  {
    Op::PhaseTimer timer(op, &Stats::decode_s);
    const int64_t region_len = len(r);
    std::vector<SparseVector> got(static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) {
      try {
        got[s] = decode_sparse(id, region.payloads[s], region_len);
      } catch (const CorruptPayload& e) {
        op.fail(ErrorCode::kCorruptPayload,
                fmt::format("sparse reduce-scatter: rank {}'s payload for region {}: {}", s, r, e.what()));
      }
    }
    const SparseVector sum = merge_sum(got, region_len);
    const std::vector<bool> keep = top_magnitudes(sum.values, region_budget(k, n));
    SparseVector kept;
    float* region_residual = residual != nullptr ? residual + begin[r] : nullptr;
    for (size_t j = 0; j < sum.indices.size(); ++j) {
      const float x = sum.values[j];
      if (keep[j]) {
        kept.indices.push_back(sum.indices[j]);
        kept.values.push_back(x);
        if (region_residual != nullptr) {
          region_residual[sum.indices[j]] += sparse_rounding_residual(x, sparse_round(x, format.values));
        }
      } else if (region_residual != nullptr && std::isfinite(x)) {
        region_residual[sum.indices[j]] += x;
      }
    }
    kept_payload = encode_sparse(id, region_len, kept, format);
  }

  // 4. Every region's kept entries to every rank; each decodes them into its region.
  std::vector<int64_t> sizes;
  const std::vector<uint8_t> all = ring_allgatherv_bytes(op, kept_payload, sizes);
  Op::PhaseTimer timer(op, &Stats::decode_s);
  const std::vector<std::span<const uint8_t>> payloads = split_blocks(all, sizes);
  for (int s = 0; s < n; ++s) {
    try {
      decode_sum_sparse(id, std::span(&payloads[s], 1), len(s), data + begin[s], reduce_op == ReduceOp::kAvg ? n : 1,
                        output);
    } catch (const CorruptPayload& e) {
      op.fail(ErrorCode::kCorruptPayload,
              fmt::format("sparse reduce-scatter: the kept entries of rank {}'s region: {}", s, e.what()));
    }
  }
}

}  // namespace gradcomm::detail
