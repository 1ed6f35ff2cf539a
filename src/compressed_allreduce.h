// The compressed allreduce, written once (docs/architecture.md, "Compression"). For a
// spec, a key's step and the tensor's size it decides everything that makes a result:
// dense or compressed this step, which collective (the family's Collective), the order
// of folds, selections and exchanges, the Philox streams, and which steps apply the
// average. The memory it runs on is not its business: `P` supplies the primitives,
// over host memory (HostPrimitives, src/compression.cc) or a GPU's on the NCCL path
// (DevicePrimitives, src/collectives/nccl_compressed_allreduce.cc) -- NCCL's runRing
// over Primitives is the model. Both run this same code, which is why the two paths
// give the same bytes (nccl_compressed.h lists the few summation-order exceptions).
//
// The primitives. `data` is the caller's fp32 tensor, in place; the residual (error
// feedback) and the current selection are the primitives' own, per key.
//
//   fold_and_clear(data, n)               data += residual; residual = 0 (no-op without EF)
//   accumulate_in_residual(data, n)       residual += data; returns acc (the residual, or
//                                         data without EF)
//   dense_allreduce(x, n, op, unit_base)  fp32 allreduce in place; applies op
//   codec_round_trip(data, n, rng)        one rank: acc = data + residual, data = decode(encode(acc)),
//                                         residual = acc - data
//   codec_ring(data, n, rng, divisor)     the compressed ring's sum, divided by divisor (the
//                                         average; 1: none) as each piece becomes final;
//                                         every encode's loss accumulates into the residual
//   sparse_algo(shape, n)                 own selections' exchange (the device refuses
//                                         reduce-scatter)
//   select(data, n, count, rng)           the family's own selection (SparseOps::select), from
//                                         acc = data + residual; the residual becomes acc with
//                                         the sent entries replaced by the rounding their value
//                                         type drops
//   sparse_allreduce(algo, shape, data, n, k, op)
//                                         the selections' sum (or average: applies op) into data
//   sparse_reduce_scatter(shape, data, n, k, op)
//                                         the selections' sum (or average) into this rank's
//                                         segment of data only (reduce-scatter; host only)
//   draw(n, count, rng)                   count indices drawn alike on every rank (SparseOps::draw)
//   table_cells(table)                    a zeroed table of the family's (SparseOps::table)
//   table_accumulate(table, rng, data, n, cells)
//                                         cells += the family's table of acc; returns acc as
//                                         accumulate_in_residual
//   table_recover(table, rng, cells, n, count)
//                                         the selection the summed cells recover
//   gather_sum_scatter(data, acc, n, type, unit_base)
//                                         values = acc at the selection (the residual keeps
//                                         their rounding as `type`), summed across ranks as
//                                         `type`; data = 0 but for the sums at the selection
//   keep_selection()                      the key remembers the selection (sent_mask)
//   low_rank(data, n, op)                 the low-rank step (Family::low_rank); applies op
//   check_payloads(n)                     payload faults found by asynchronous decoders
//   divide(data, n, ranks)                the average
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "collectives/collectives.h"
#include "compressors/family.h"
#include "compressors/philox.h"
#include "compressors/sparse/sparse.h"
#include "compressors/spec.h"
#include "compressors/tensor_part.h"
#include "gradcomm/types.h"
#include "state.h"

namespace gradcomm::detail {

// One compressed allreduce: what the procedure and both primitive sets work from.
struct CompressedCall {
  const CompressorSpec& spec;
  KeyState* key;                             // null for a stateless spec without a key
  uint64_t key_hash;                         // seeds the Philox streams
  const std::vector<TensorPart>* parts;  // the tensor's shapes (Family::reads_shapes); may be null
  int rank;                                  // this rank, of `ranks`
  int ranks;
  // A piece of a tensor (the two-level schedules, hierarchy.h): the call's data are the
  // key's elements [offset, offset + numel) of `whole` (0: the call is the whole tensor).
  // The residual keeps the whole tensor's layout; min_numel and k=K count the whole.
  int64_t offset = 0;
  int64_t whole = 0;

  uint64_t step() const { return key != nullptr ? key->step : 0; }
  int64_t whole_numel(int64_t numel) const { return whole > 0 ? whole : numel; }
  // How many elements a sparsifier's selection of `numel` takes: ratio x numel, or for k=K
  // the piece's share of K.
  int64_t selection(const SparseShape& shape, int64_t numel) const {
    if (shape.k > 0 && whole > numel) {
      const int64_t share = static_cast<int64_t>(std::llround(static_cast<double>(shape.k) *
                                                              static_cast<double>(numel) / static_cast<double>(whole)));
      return std::clamp<int64_t>(share, 1, std::max<int64_t>(numel, 1));
    }
    return selection_count(shape.ratio, shape.k, numel);
  }
};

template <class P>
void compressed_allreduce(P& p, const CompressedCall& call, float* data, int64_t numel, ReduceOp reduce_op) {
  const CompressorSpec& spec = call.spec;
  const int ranks = call.ranks;
  const uint64_t step = call.step();
  const Collective collective = family_of(spec.id).collective;
  // Nothing to compress, warm-up steps and small tensors: dense, with what the residual
  // still holds.
  if (runs_dense(spec, step, call.whole_numel(numel))) {
    p.fold_and_clear(data, numel);
    p.dense_allreduce(data, numel, reduce_op, 0);
    return;
  }
  // Draws of this rank alone (encoders' dithering, sampled selection) and draws every
  // rank makes alike (shared indices, the sketch's hashes).
  const PhiloxStream mine{spec.seed, philox_stream_id(call.key_hash, step, call.rank)};
  const PhiloxStream shared{spec.seed, philox_stream_id(call.key_hash, step, -1)};
  switch (collective) {
    case Collective::kCodecRing:
      if (ranks == 1) {  // nothing to exchange, but the output is still what compression keeps
        p.codec_round_trip(data, numel, mine);
      } else {
        p.fold_and_clear(data, numel);  // data holds acc; the ring's encodes refill the residual
        // The average is the ring's own: it divides each chunk while the chunk is in cache.
        p.codec_ring(data, numel, mine, reduce_op == ReduceOp::kAvg ? ranks : 1);
        p.check_payloads(numel);
        return;
      }
      break;
    case Collective::kSparseSelection: {
      const SparseShape shape = sparse_ops(spec).shape(spec);  // once a call: the primitives take it
      const int64_t k = call.selection(shape, numel);
      const SparseAlgo algo = p.sparse_algo(shape, numel);
      p.select(data, numel, k, mine);
      p.sparse_allreduce(algo, shape, data, numel, k, reduce_op);
      p.keep_selection();
      p.check_payloads(numel);
      return;
    }
    case Collective::kSharedIndices: {
      p.draw(numel, call.selection(sparse_ops(spec).shape(spec), numel), shared);
      const float* acc = p.accumulate_in_residual(data, numel);
      p.gather_sum_scatter(data, acc, numel, spec.values, 0);
      p.keep_selection();
      break;
    }
    case Collective::kTableThenValues: {
      const SparseOps& ops = sparse_ops(spec);
      const int64_t k = call.selection(ops.shape(spec), numel);
      const SparseTable table = ops.table(spec, k);
      float* cells = p.table_cells(table);
      const float* acc = p.table_accumulate(table, shared, data, numel, cells);
      p.dense_allreduce(cells, int64_t{table.rows} * table.cols, ReduceOp::kSum, 0);
      // The same summed table on every rank, so the same selection everywhere.
      p.table_recover(table, shared, cells, numel, k);
      p.gather_sum_scatter(data, acc, numel, spec.values, kSecondPhaseUnits);
      p.keep_selection();
      break;
    }
    case Collective::kLowRank:
      p.low_rank(data, numel, reduce_op);  // two dense rings of its own; the average is its own
      return;
    case Collective::kDense:  // runs_dense took it
      return;
  }
  p.check_payloads(numel);
  if (reduce_op == ReduceOp::kAvg) p.divide(data, numel, ranks);
}

// The compressed reduce-scatter: data holds numel = N x count elements, in place; rank r
// ends with its segment r (elements [r count, (r + 1) count)) reduced, divided for kAvg.
// The families reduce_scatter_compresses names (the issuing side refuses the others):
// a codec-ring family runs the compressed ring's reduce-scatter phase, whose encodes
// refill the residual as the allreduce's do (the owner's segment is exact: its own
// values plus the decoded partial sums); an own-selection family (top-k) selects as its allreduce does and sends
// each owner the selected entries in its segment (sparse_reduce_scatter).
// Host primitives only, with two more:
//   dense_reduce_scatter(data, n, op)     the dense ring's reduce-scatter, in place
//   codec_ring(data, n, rng, divisor, RingPhases::kReduceScatter)
template <class P>
void compressed_reduce_scatter(P& p, const CompressedCall& call, float* data, int64_t numel, ReduceOp reduce_op) {
  const CompressorSpec& spec = call.spec;
  const uint64_t step = call.step();
  if (runs_dense(spec, step, call.whole_numel(numel))) {
    p.fold_and_clear(data, numel);
    p.dense_reduce_scatter(data, numel, reduce_op);
    return;
  }
  const PhiloxStream mine{spec.seed, philox_stream_id(call.key_hash, step, call.rank)};
  if (family_of(spec.id).collective == Collective::kSparseSelection) {
    const SparseShape shape = sparse_ops(spec).shape(spec);
    const int64_t k = call.selection(shape, numel);
    p.select(data, numel, k, mine);
    p.sparse_reduce_scatter(shape, data, numel, k, reduce_op);
    p.keep_selection();
    p.check_payloads(numel);
    return;
  }
  if (call.ranks == 1) {  // the output is still what compression keeps; an average over one is itself
    p.codec_round_trip(data, numel, mine);
    return;
  }
  p.fold_and_clear(data, numel);
  p.codec_ring(data, numel, mine, reduce_op == ReduceOp::kAvg ? call.ranks : 1, RingPhases::kReduceScatter);
  p.check_payloads(numel);
}

}  // namespace gradcomm::detail
