// Compressed calls on float16 and bfloat16 host tensors (compressors/family.h, compresses_16bit):
// no float32 copy of the tensor. The tensor is compressed in float32 pieces, each widened
// into one scratch buffer that every piece reuses, compressed as a piece of the whole
// tensor (CompressedCall::offset / whole: the residual and the selection at their place,
// k and min_numel counting the whole, the codec's buckets the whole tensor's), and
// rounded back to the tensor's type (round to nearest even: half.h, half_bulk.h).
//
// What differs from compressing a float32 copy of the whole tensor: each piece is its own
// collective (a ring, or a top-k exchange, per piece: top-k selects each piece's share of
// k within the piece), and the result is rounded to 16 bits once, at the end, as the copy's
// was. The residual stays float32 (error feedback's state, kept per key whatever the call).
#include <algorithm>
#include <cstring>
#include <vector>

#include "compression.h"
#include "compressors/family.h"
#include "half_bulk.h"
#include "hierarchy.h"
#include "op.h"

namespace gradcomm::detail {
namespace {

// Elements of a piece: 4 MiB of float32 scratch, a few of the ring's chunks. Large enough
// that a piece's own ring costs little beside its bytes; small enough to stay a fraction
// of a bucket.
constexpr int64_t kPieceElems = int64_t{1} << 20;

void widen(const void* in, DType dtype, float* out, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(in);
  if (dtype == DType::kBFloat16) {
    bf16s_to_floats(h, out, static_cast<size_t>(n));
  } else {
    halves_to_floats(h, out, static_cast<size_t>(n), /*add=*/false);
  }
}

void narrow(const float* in, DType dtype, void* out, int64_t n) {
  auto* h = static_cast<uint16_t*>(out);
  if (dtype == DType::kBFloat16) {
    floats_to_bf16s(in, h, static_cast<size_t>(n));
  } else {
    floats_to_halves(in, h, static_cast<size_t>(n));
  }
}

uint8_t* at(void* base, int64_t element) { return static_cast<uint8_t*>(base) + element * 2; }
const uint8_t* at(const void* base, int64_t element) { return static_cast<const uint8_t*>(base) + element * 2; }

}  // namespace

void HostCompression::allreduce_16bit(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                                      const CompressorSpec& spec, KeyState* key, uint64_t key_hash) {
  const int64_t align = piece_alignment(spec);
  const int64_t piece = std::max(align, kPieceElems / align * align);  // pieces keep the codec's buckets whole
  std::vector<float> scratch;
  // [begin, end) of the tensor, piece by piece; `op` applied by each piece's call.
  const auto pieces = [&](int64_t begin, int64_t end, ReduceOp piece_op) {
    scratch.resize(static_cast<size_t>(std::min(piece, end - begin)));
    for (int64_t b = begin; b < end; b += piece) {
      const int64_t e = std::min(end, b + piece);
      widen(at(data, b), dtype, scratch.data(), e - b);
      compress_piece(op, scratch.data(), b, e, numel, spec, key, key_hash, piece_op);
      narrow(scratch.data(), dtype, at(data, b), e - b);
    }
  };
  if (key != nullptr) key->sent.clear();  // the pieces add theirs (keep_selection)
  if (op.two_levels()) {
    // Inside the nodes in the tensor's type (dense, as the uncompressed call); across, the
    // pieces of this rank's segment (kSum: the levels apply the average).
    detail::two_level_allreduce(op, data, numel, dtype, reduce_op, align, 0,
                                [&](int64_t b, int64_t e) { pieces(b, e, ReduceOp::kSum); });
    return;
  }
  pieces(0, numel, reduce_op);
}

void HostCompression::reduce_scatter_16bit(Op& op, const void* in, void* out, int64_t count, DType dtype,
                                           ReduceOp reduce_op, const CompressorSpec& spec, KeyState* key,
                                           uint64_t key_hash) {
  const int n = op.size();
  const int64_t numel = static_cast<int64_t>(n) * count;
  if (op.two_levels()) {  // the two-level reduce-scatter works on the whole tensor: widened
    std::vector<float> work(static_cast<size_t>(numel));
    widen(in, dtype, work.data(), numel);
    reduce_scatter(op, work.data(), numel, reduce_op, spec, key, key_hash);
    narrow(work.data() + static_cast<size_t>(op.rank()) * static_cast<size_t>(count), dtype, out, count);
    return;
  }
  // Piece p0..p0+len of every rank's segment, side by side: a reduce-scatter of n x len
  // elements gives this rank its own len. The residual is laid out piece by piece (the
  // piece's n x len elements at n x p0), the same every call for a key of this size.
  const int64_t most = std::max<int64_t>(1, kPieceElems / n);
  std::vector<float> scratch(static_cast<size_t>(n) * static_cast<size_t>(std::min(most, count)));
  if (key != nullptr) key->sent.clear();
  for (int64_t p0 = 0; p0 < count; p0 += most) {
    const int64_t len = std::min(most, count - p0);
    for (int s = 0; s < n; ++s) widen(at(in, s * count + p0), dtype, scratch.data() + s * len, len);
    const size_t kept = key != nullptr ? key->sent.size() : 0;
    compress_piece(op, scratch.data(), n * p0, n * (p0 + len), numel, spec, key, key_hash, reduce_op,
                   Piece::kReduceScatter);
    if (key != nullptr) {  // a selection's indices back at their place in the tensor
      for (size_t j = kept; j < key->sent.size(); ++j) {
        const auto q = static_cast<int64_t>(key->sent[j]) - n * p0;
        key->sent[j] = static_cast<uint64_t>((q / len) * count + p0 + q % len);
      }
    }
    narrow(scratch.data() + static_cast<size_t>(op.rank()) * static_cast<size_t>(len), dtype, at(out, p0), len);
  }
}

}  // namespace gradcomm::detail
