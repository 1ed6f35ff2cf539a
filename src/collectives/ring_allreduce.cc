// Ring allreduce (Patarasuk & Yuan 2009; Baidu's ring allreduce), pipelined.
//
// The buffer is cut into N segments, balanced to within one element. Rank r
// sends to r+1 and receives from r-1 (mod N).
//   Reduce-scatter, step k = 0..N-2: send segment r-k; receive segment r-k-1 and
//     reduce it into ours. After N-1 steps rank r holds segment r+1 fully reduced.
//   Allgather, step k = 0..N-2: send segment r+1-k; receive segment r-k and store
//     it. After N-1 steps every rank holds every reduced segment.
// Each rank sends 2(N-1)/N of the buffer, the lower bound for allreduce.
//
// Pipelining. Every segment is cut into the same number C of chunks, and one
// (step, chunk) pair is one message, a "unit": u = step*C + chunk, numbered
// through the reduce-scatter and then the allgather (RingSchedule, ring_schedule.h,
// the one schedule of every ring here). The loop is the ring driver's (ring_driver.h,
// the one loop of every ring here): chunk j goes out again (as unit u+C) the moment it
// has arrived and been reduced, NCCL's recvReduceSend, recvReduceCopySend, then
// recvCopySend, so chunk j+1 is on the wire while chunk j is being reduced. This file
// holds the dense ring's steps (sum, then forward) and runs them over the host channel
// (host_ring_channel.h: receives posted depth units ahead).
//
// Buffers. Reduce-scatter receives land in staging slots (unit u in slot u mod depth,
// free again once u is reduced); allgather receives land straight in the caller's
// buffer, posted only after the reduce-scatter send that read the same region has
// completed (unit u - (N-1)C: allgather step k overwrites segment r-k, which
// reduce-scatter step k sent).
//
// Determinism. For kAvg the owner of a segment divides by N in its last reduce,
// before the segment travels the allgather; every rank then stores the same bytes,
// so the results are bitwise identical on all ranks.
//
// Reduce-scatter alone (ring_reduce_scatter) is the first phase of the same loop, with
// the schedule's ranks shifted by one: schedule rank r-1 ends holding segment r, the
// segment that reduce_scatter's rank r must return. Ranks keep their real neighbours
// (the shift is the same on every rank, so schedule rank v+1 is still the right one).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/collectives.h"
#include "hierarchy.h"
#include "collectives/host_ring_channel.h"
#include "collectives/ring_driver.h"
#include "collectives/ring_schedule.h"
#include "env.h"
#include "reduce.h"

namespace gradcomm::detail {

int64_t chunk_bytes(int64_t fallback) {
  // GRADCOMM_CHUNK_BYTES: pipeline chunk size of the ring algorithms. Smaller
  // chunks overlap better; larger ones pay less per-message overhead. Each ring
  // passes its default; 256K beat 512K for two ranks on emulated links (128K was
  // erratic): bench/results/tuning-notes-2026-11-27.md#chunk-bytes.
  return env_bytes("GRADCOMM_CHUNK_BYTES", fallback, 64, int64_t{1} << 30);
}

int64_t dense_ring_chunk_bytes(int world_size) {
  // The dense ring's default: 256K for two ranks, 1M above. With more than two
  // ranks each connection carries one direction of the ring, and a chunk larger
  // than UCX's TCP receive segment (1M there, see ucx_transport.cc) is read mostly
  // straight into the destination instead of through that segment and a copy. Two
  // ranks share one connection both ways, and larger chunks lost there. Measured on
  // emulated links: bench/results/tuning-notes-2026-11-27.md#dense-ring-chunk-bytes.
  return chunk_bytes(world_size == 2 ? int64_t{256} << 10 : int64_t{1} << 20);
}

int pipeline_depth() {
  // GRADCOMM_PIPELINE_DEPTH: receives posted ahead of the one being consumed. The
  // ring allreduce stages its reduce-scatter receives, depth * chunk bytes.
  return static_cast<int>(env_int("GRADCOMM_PIPELINE_DEPTH", 8, 1, 1024));
}

namespace {

// The dense ring's steps: sum (recvReduceSend) through the reduce-scatter, forward
// (recvCopySend) through the allgather. Every message is a range of the caller's buffer,
// sent where it lies; reduce-scatter receives land in staging slots (unit u in slot
// u mod depth, free again once u is folded, which the host channel's posting order
// guarantees); allgather receives land in place, after the send that read the region.
class SumSteps {
 public:
  SumSteps(Op& op, const RingSchedule& ring, uint8_t* data, DType dtype, ReduceOp reduce_op, int depth)
      : op_(op), ring_(ring), base_(data), dtype_(dtype), reduce_op_(reduce_op), elem_(dtype_size(dtype)),
        depth_(depth), divisor_(reduce_op == ReduceOp::kAvg ? ring.size() : 1),
        slot_bytes_(static_cast<size_t>(ring.max_chunk_elems()) * elem_),
        staging_(std::make_unique_for_overwrite<uint8_t[]>(slot_bytes_ *
                                                           std::min<int64_t>(depth, ring.rs_units()))) {}

  RingMessage send_message(int64_t u) const { return range(ring_.send_range(u)); }
  RingMessage recv_message(int64_t u) const {
    if (!ring_.reduce_scatter(u)) return range(ring_.recv_range(u));
    const auto [b, e] = ring_.recv_range(u);
    return {staging_.get() + (u % depth_) * slot_bytes_, static_cast<size_t>(e - b) * elem_};
  }
  int64_t recv_overwrites(int64_t u) const { return ring_.reduce_scatter(u) ? -1 : u - ring_.rs_units(); }
  int64_t recv_reuses(int64_t u) const { return ring_.reduce_scatter(u) && u >= depth_ ? u - depth_ : -1; }
  bool absorbs(int64_t u) const { return ring_.reduce_scatter(u); }

  void prepare(int64_t) {}  // the chunk is sent where it lies
  void absorb(int64_t u) {
    if (!ring_.reduce_scatter(u)) return;  // forward: it landed in place
    // sum: the neighbour's partial sum into ours; the owner's last fold (step N-2)
    // also applies the average's division.
    const auto [b, e] = ring_.recv_range(u);
    Op::PhaseTimer timer(op_, &Stats::reduce_s);
    reduce_inplace(base_ + b * elem_, staging_.get() + (u % depth_) * slot_bytes_, e - b, dtype_, reduce_op_,
                   ring_.last_reduce_step(u) ? divisor_ : 1);
  }

 private:
  RingMessage range(std::pair<int64_t, int64_t> r) const {
    return {base_ + r.first * elem_, static_cast<size_t>(r.second - r.first) * elem_};
  }

  Op& op_;
  const RingSchedule& ring_;
  uint8_t* base_;
  DType dtype_;
  ReduceOp reduce_op_;
  size_t elem_;
  int depth_;
  int64_t divisor_;
  size_t slot_bytes_;
  std::unique_ptr<uint8_t[]> staging_;
};

void run_ring(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base,
              RingPhases phases, int64_t align = 1) {
  const int n = op.size();
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  const int64_t chunk_elems = std::max<int64_t>(1, dense_ring_chunk_bytes(n) / elem);
  const int depth = pipeline_depth();
  // Units must fit the 31 bits below the second-phase tag range. The reduce-scatter alone
  // shifts the schedule's ranks by one (see the top of this file).
  const bool allgather = phases == RingPhases::kAllreduce;
  const int schedule_rank = allgather ? op.rank() : (op.rank() + n - 1) % n;
  const RingSchedule ring(n, schedule_rank, numel, align, chunk_elems, (int64_t{1} << 30) / (n - 1));
  const int64_t units = allgather ? ring.units() : ring.rs_units();
  SumSteps steps(op, ring, static_cast<uint8_t*>(data), dtype, reduce_op, depth);
  HostRingChannel channel(op, ring.shape(), units, depth, unit_base, "reduce-scatter receive", "allgather receive");
  drive_ring(ring.shape(), units, channel, steps);
}

}  // namespace

void ring_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base) {
  run_ring(op, data, numel, dtype, reduce_op, unit_base, RingPhases::kAllreduce);
}

void ring_reduce_scatter(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base,
                         int64_t align) {
  if (op.size() == 1 || numel == 0) return;
  if (NodeShm* shm = op.node_shm()) {
    const std::vector<int64_t> starts = ring_segments(numel, op.size(), align);
    const int64_t mine = starts[static_cast<size_t>(op.rank())];
    uint8_t* segment = static_cast<uint8_t*>(data) + static_cast<size_t>(mine) * dtype_size(dtype);
    return shm_reduce_scatter(op, *shm, data, segment, starts, dtype, reduce_op);
  }
  run_ring(op, data, numel, dtype, reduce_op, unit_base, RingPhases::kReduceScatter, align);
}

std::vector<int64_t> ring_segments(int64_t numel, int size, int64_t align) {
  const RingSchedule ring(size, 0, numel, align, /*chunk_elems=*/align, /*max_chunks=*/1);
  std::vector<int64_t> starts(static_cast<size_t>(size) + 1);
  for (int s = 0; s <= size; ++s) starts[static_cast<size_t>(s)] = ring.segment_begin(s);
  return starts;
}

void dense_reduce_scatter(Op& op, const void* in, void* out, int64_t count, DType dtype, ReduceOp reduce_op) {
  const int n = op.size();
  const size_t segment = static_cast<size_t>(count) * dtype_size(dtype);
  const auto* input = static_cast<const uint8_t*>(in);
  if (n == 1 || count == 0) {  // one rank: its input is the result (an average over one divides by one)
    if (count > 0 && out != input) std::memmove(out, input, segment);
    return;
  }
  if (NodeShm* shm = op.node_shm()) {  // straight from the input: no copy of it
    std::vector<int64_t> starts(static_cast<size_t>(n) + 1);
    for (int s = 0; s <= n; ++s) starts[static_cast<size_t>(s)] = count * s;
    return shm_reduce_scatter(op, *shm, in, out, starts, dtype, reduce_op);
  }
  if (op.two_levels()) {  // hierarchy.h: inside the nodes, then across them
    const size_t total = segment * static_cast<size_t>(n);
    const auto work = std::make_unique_for_overwrite<uint8_t[]>(total);
    std::memcpy(work.get(), input, total);
    two_level_reduce_scatter(op, work.get(), count, dtype, reduce_op, nullptr);
    std::memcpy(out, work.get() + segment * static_cast<size_t>(op.rank()), segment);
    return;
  }
  // The ring folds partial sums into its buffer; the caller's input stays as given, so
  // the ring runs on a copy (the price of an unchanged input, as NCCL's sendbuff).
  const size_t total = segment * static_cast<size_t>(n);
  const auto work = std::make_unique_for_overwrite<uint8_t[]>(total);
  std::memcpy(work.get(), input, total);
  ring_reduce_scatter(op, work.get(), count * n, dtype, reduce_op);
  std::memcpy(out, work.get() + segment * static_cast<size_t>(op.rank()), segment);
}

}  // namespace gradcomm::detail
