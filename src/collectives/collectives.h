// The collective algorithms, one per file. Each runs inside an Op (op.h)
// that has already exchanged call headers; each blocks until its data has moved.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "collectives/ring_schedule.h"  // RingPhases
#include "op.h"
#include "compressors/codec.h"
#include "compressors/sparse/sparse.h"
#include "gradcomm/types.h"

namespace gradcomm::detail {

class NodeShm;  // node_shm.h

// Message units of a call's second exchange start here, so two exchanges in one
// call never share tags (allgatherv's counts then data; sketch's table then values).
constexpr uint32_t kSecondPhaseUnits = 0x80000000u;

// Ring allreduce, in place: reduce-scatter then allgather, pipelined in chunks.
void ring_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base = 0);

// The ring's reduce-scatter phase alone, in place: rank r ends holding segment r
// reduced, the average divided by N; the other segments hold partial sums. Segment r is
// ring_segments(numel, N, align)'s: on numel = N x count elements with align 1, elements
// [r count, (r + 1) count).
void ring_reduce_scatter(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base = 0,
                         int64_t align = 1);
// Where the ring's segments of numel elements over `size` ranks start (size + 1 entries,
// the last numel): balanced to within one alignment unit, each a multiple of `align`
// (ring_schedule.h).
std::vector<int64_t> ring_segments(int64_t numel, int size, int64_t align);
// The direct reduce-scatter (direct.cc), in place: rank s's copy of segment s
// ([starts[s], starts[s + 1]), N + 1 entries) is reduced with every other rank's, sent to
// it at once; the average divided by N. The other segments are left as they were.
void direct_reduce_scatter(Op& op, void* data, const std::vector<int64_t>& starts, DType dtype, ReduceOp reduce_op,
                           uint32_t unit_base = 0);
// reduce_scatter of a call: `in` (N x count elements, left unchanged) reduced over the
// ranks, this rank's segment into `out` (count elements; it may be that segment of in).
void dense_reduce_scatter(Op& op, const void* in, void* out, int64_t count, DType dtype, ReduceOp reduce_op);

// Recursive doubling, in place: ceil(log2 N) exchanges of the whole buffer; for
// small tensors, where the ring's 2(N-1) message latencies dominate.
void recursive_doubling_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                                  uint32_t unit_base = 0);

// Rabenseifner's recursive halving + doubling (recursive_doubling.cc): the ring's
// bytes in 2 log2(N) messages; folded like recursive doubling for other N.
void halving_doubling_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op,
                                uint32_t unit_base = 0);

// The dense allreduce of a call: recursive doubling up to small_allreduce_bytes(),
// halving + doubling up to halving_doubling_bytes() for N > 2, the ring above;
// nothing to do for one rank or no elements.
void dense_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base = 0);

// Largest tensor (bytes) that takes recursive doubling (GRADCOMM_SMALL_ALLREDUCE_BYTES).
int64_t small_allreduce_bytes();
// Largest tensor (bytes) that takes halving + doubling (GRADCOMM_HALVING_DOUBLING_BYTES).
int64_t halving_doubling_bytes();

// Ring allgather of variable blocks: block r (counts[r] elements of `elem_bytes`)
// follows block r-1 in `out`; this rank's own block must already be in place.
// Message units are numbered from `unit_base`, so two rings in one call never
// share tags.
void ring_allgatherv(Op& op, uint8_t* out, const std::vector<int64_t>& counts, size_t elem_bytes,
                     uint32_t unit_base);


// Every rank's `mine` (any size) to every rank, concatenated in rank order; sizes
// (bytes per rank) are exchanged first. CorruptPayload for absurd announced sizes.
std::vector<uint8_t> ring_allgatherv_bytes(Op& op, std::span<const uint8_t> mine, std::vector<int64_t>& sizes);

// The sparse-selection collectives (sparse_allreduce.cc). Both write the sum (or, for
// kAvg, the average) of every rank's selection into data[0, numel), bitwise the same on
// every rank. Their payloads carry `id`, the family of the call (spec.id); a payload
// with another id is a CorruptPayload saying whose it was.
// The sparse allgather: every payload to every rank (fixed_size: every rank's selection
// has the same count, so no sizes are exchanged). output = kZeroed: data is +0.0 on
// entry (the selection zeroed it), so only the entries are written (decode_sum_sparse).
void sparse_allgather_allreduce(Op& op, CompressorId id, float* data, int64_t numel, ReduceOp reduce_op,
                                const SparseVector& selected, SparseFormat format, bool fixed_size,
                                SparseOutput output = SparseOutput::kFill);
// The sparse reduce-scatter: region owners sum, keep their region's top ceil(k/N), put
// what they drop (and the kept sums' rounding) into `residual` (may be null), allgather.
void sparse_reduce_scatter_allreduce(Op& op, CompressorId id, float* data, int64_t numel, ReduceOp reduce_op,
                                     const SparseVector& selected, SparseFormat format, int64_t k, float* residual,
                                     SparseOutput output = SparseOutput::kFill);
// The sparse reduce-scatter (reduce_scatter with a top-k spec): numel = N x count; each
// rank sends the owner of each segment [s count, (s + 1) count) its selection's entries
// there (sparse_allreduce's step 1: about (N-1)/N of its k entries in all), and each
// owner writes its segment as the N payloads' sum in rank order (divided for kAvg).
void sparse_reduce_scatter(Op& op, CompressorId id, float* data, int64_t numel, ReduceOp reduce_op,
                           const SparseVector& selected, SparseFormat format, int64_t k);
// The shape's algo, or for algo=auto the one the α–β model (constants in
// sparse_allreduce.cc) expects to be faster for this selection, world size and tensor size.
SparseAlgo choose_sparse_algo(const SparseShape& shape, int ranks, int64_t numel);

// Pipelined chain from `root` around the ring.
void chain_broadcast(Op& op, void* data, int64_t bytes, int root);

// Dissemination barrier: ceil(log2 N) rounds of zero-byte messages.
void dissemination_barrier(Op& op);

// The same collectives on the node's shared segment (shm_collectives.cc), for a group that is
// exactly one node's ranks (Op::node_shm): the functions above call them themselves.
// reduce_scatter: segment p of `in` at [starts[p], starts[p + 1]); this rank's, reduced, to
// `out` (which may be that segment of `in`). allgatherv: as ring_allgatherv.
void shm_allreduce(Op& op, NodeShm& shm, void* data, int64_t numel, DType dtype, ReduceOp reduce_op);
void shm_reduce_scatter(Op& op, NodeShm& shm, const void* in, void* out, std::span<const int64_t> starts, DType dtype,
                        ReduceOp reduce_op);
void shm_allgatherv(Op& op, NodeShm& shm, uint8_t* out, const std::vector<int64_t>& counts, size_t elem_bytes);
void shm_broadcast(Op& op, NodeShm& shm, void* data, int64_t bytes, int root);
void shm_barrier(Op& op, NodeShm& shm);
// A round with no data whose digest is the call's header: Op::check_header on a
// one-segment communicator, for a call none of whose rounds carried it.
void shm_check_header(Op& op, NodeShm& shm);

// Pipeline tunables shared by the ring algorithms (GRADCOMM_CHUNK_BYTES).
int64_t chunk_bytes(int64_t fallback = int64_t{256} << 10);
// The dense ring allreduce's chunk: GRADCOMM_CHUNK_BYTES, else 256K for two ranks, 1M above.
int64_t dense_ring_chunk_bytes(int world_size);
// Receives posted ahead of the one being consumed (GRADCOMM_PIPELINE_DEPTH).
int pipeline_depth();

}  // namespace gradcomm::detail
