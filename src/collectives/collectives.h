// The collective algorithms, one per file. Each runs inside an Op (comm_impl.h)
// that has already exchanged call headers; each blocks until its data has moved.
#pragma once

#include <cstdint>
#include <vector>

#include "comm_impl.h"
#include "gradcomm/types.h"

namespace gradcomm::detail {

// Ring allreduce, in place: reduce-scatter then allgather, pipelined in chunks.
void ring_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op);

// Recursive doubling, in place: ceil(log2 N) exchanges of the whole buffer; for
// small tensors, where the ring's 2(N-1) message latencies dominate.
void recursive_doubling_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op);

// Largest tensor (bytes) that takes recursive doubling (GRADCOMM_SMALL_ALLREDUCE_BYTES).
int64_t small_allreduce_bytes();

// Ring allgather of variable blocks: block r (counts[r] elements of `elem_bytes`)
// follows block r-1 in `out`; this rank's own block must already be in place.
// Message units are numbered from `unit_base`, so two rings in one call never
// share tags.
void ring_allgatherv(Op& op, uint8_t* out, const std::vector<int64_t>& counts, size_t elem_bytes,
                     uint32_t unit_base);
constexpr uint32_t kSecondPhaseUnits = 0x80000000u;  // unit_base of a call's second ring

// Pipelined chain from `root` around the ring.
void chain_broadcast(Op& op, void* data, int64_t bytes, int root);

// Dissemination barrier: ceil(log2 N) rounds of zero-byte messages.
void dissemination_barrier(Op& op);

// Pipeline tunables shared by the ring algorithms (GRADCOMM_CHUNK_BYTES).
int64_t chunk_bytes();
constexpr int kPipelineDepth = 4;  // receives posted ahead of the one being consumed

}  // namespace gradcomm::detail
