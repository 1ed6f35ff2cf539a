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
// through the reduce-scatter and then the allgather. The segment received at one
// step is the segment sent at the next, so chunk j goes out again (as unit u+C)
// the moment it has arrived and been reduced: NCCL's recvReduceSend, then
// recvReduceCopySend at the last reduce-scatter step, then recvCopySend. Chunk
// j+1 is on the wire while chunk j is being reduced. The segments, chunks and
// units are RingSchedule's (ring_schedule.h), the one schedule of every ring here.
//
// Buffers. Receives are posted depth units ahead. Reduce-scatter
// receives land in staging slots (unit u in slot u mod depth, free again once u is
// reduced); allgather receives land straight in the caller's buffer, posted only
// after the reduce-scatter send that read the same region has completed (unit
// u - (N-1)C: allgather step k overwrites segment r-k, which reduce-scatter step k sent).
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
#include "collectives/ring_schedule.h"
#include "env.h"
#include "reduce.h"

namespace gradcomm::detail {

int64_t chunk_bytes(int64_t fallback) {
  // GRADCOMM_CHUNK_BYTES: pipeline chunk size of the ring algorithms. Smaller
  // chunks overlap better; larger ones pay less per-message overhead. 256K: a 1 MB
  // allreduce over two ranks on emulated 10 Gbit/s links (bench/cluster/run.sh)
  // took 0.6 ms against 0.87-1.07 ms with 512K (its segment is then two chunks, so
  // the allgather starts before the whole reduce-scatter step has landed); from
  // 4 MB up, and at N = 4, the two were the same within noise; 128K was erratic.
  return env_bytes("GRADCOMM_CHUNK_BYTES", fallback, 64, int64_t{1} << 30);
}

int64_t dense_ring_chunk_bytes(int world_size) {
  // The dense ring's default: 256K for two ranks, 1M above. With more than two
  // ranks each connection carries one direction of the ring, and a chunk larger
  // than UCX's TCP receive segment (1M there, see ucx_transport.cc) is read mostly
  // straight into the destination instead of through that segment and a copy. On
  // emulated links (bench/cluster/run.sh, 2-3 alternating runs), N = 4 at 10 Gbit/s
  // took 38 / 220 / 575 ms at 16 / 100 / 256 MB with 1M chunks against 45 / 237 /
  // 651 with 256K (Gloo 45 / 248 / 575; 4M chunks 58 / 225 / 623), and N = 8 at
  // 25 Gbit/s, 256 MB, 1343 against 1495 ms (Gloo 1389). Two ranks share one
  // connection both ways and lost with 4M chunks (256 MB: 317 against 260 ms).
  return chunk_bytes(world_size == 2 ? int64_t{256} << 10 : int64_t{1} << 20);
}

int pipeline_depth() {
  // GRADCOMM_PIPELINE_DEPTH: receives posted ahead of the one being consumed. The
  // ring allreduce stages its reduce-scatter receives, depth * chunk bytes.
  return static_cast<int>(env_int("GRADCOMM_PIPELINE_DEPTH", 8, 1, 1024));
}

namespace {

void run_ring(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base,
              RingPhases phases) {
  const int n = op.size();
  const int right = (op.rank() + 1) % n;
  const int left = (op.rank() + n - 1) % n;
  const size_t elem = dtype_size(dtype);
  auto* base = static_cast<uint8_t*>(data);

  // ---- plan: chunks per segment, units, staging ----------------------------------
  const int64_t chunk_elems = std::max<int64_t>(1, dense_ring_chunk_bytes(n) / static_cast<int64_t>(elem));
  const int depth = pipeline_depth();
  // Units must fit the 31 bits below the second-phase tag range.
  const bool allgather = phases == RingPhases::kAllreduce;
  const int schedule_rank = allgather ? op.rank() : (op.rank() + n - 1) % n;
  const RingSchedule plan(n, schedule_rank, numel, /*align=*/1, chunk_elems, (int64_t{1} << 30) / (n - 1));
  const int64_t C = plan.chunks();
  const int64_t rs_units = plan.rs_units();
  const int64_t total_units = allgather ? plan.units() : rs_units;
  const int64_t divisor = reduce_op == ReduceOp::kAvg ? n : 1;

  const size_t slot_bytes = static_cast<size_t>(plan.max_chunk_elems()) * elem;
  // Slot u mod depth; a call with fewer reduce-scatter units than that uses only those.
  const auto staging = std::make_unique_for_overwrite<uint8_t[]>(slot_bytes * std::min<int64_t>(depth, rs_units));

  std::vector<RequestPtr> sends(total_units), recvs(total_units);
  std::vector<uint8_t> send_posted(total_units, 0);

  auto send_unit = [&](int64_t u) {
    const auto [b, e] = plan.send_range(u);
    sends[u] = op.send(right, unit_base + static_cast<uint32_t>(u), base + b * elem, static_cast<size_t>(e - b) * elem);
    send_posted[u] = 1;
  };

  // Posts receives for units below `limit`. An allgather receive waits for the
  // reduce-scatter send of the same region; if that send is not even posted yet,
  // posting stops there and resumes on a later call.
  int64_t posted = 0;
  auto post_until = [&](int64_t limit) {
    for (limit = std::min(limit, total_units); posted < limit; ++posted) {
      const auto [b, e] = plan.recv_range(posted);
      const size_t bytes = static_cast<size_t>(e - b) * elem;
      if (posted < rs_units) {
        recvs[posted] = op.recv(left, unit_base + static_cast<uint32_t>(posted), staging.get() + (posted % depth) * slot_bytes,
                                bytes);
        continue;
      }
      const int64_t twin = posted - rs_units;
      if (!send_posted[twin]) break;
      if (sends[twin]) {
        op.wait(*sends[twin], "reduce-scatter send");
        sends[twin].reset();
      }
      recvs[posted] = op.recv(left, unit_base + static_cast<uint32_t>(posted), base + b * elem, bytes);
    }
  };

  // ---- run -----------------------------------------------------------------------
  // Reduce-scatter step 0: send our own segment r.
  for (int64_t j = 0; j < C; ++j) send_unit(j);

  for (int64_t u = 0; u < total_units; ++u) {
    post_until(u + depth);
    const bool reduce_scatter = u < rs_units;
    op.wait(*recvs[u], reduce_scatter ? "reduce-scatter receive" : "allgather receive");
    recvs[u].reset();
    if (reduce_scatter) {
      // recvReduceSend: fold the neighbour's partial sum into ours; the owner's
      // last fold (step N-2) also applies the average's division.
      const auto [b, e] = plan.recv_range(u);
      const bool last_step = plan.last_reduce_step(u);
      Op::PhaseTimer timer(op, &Stats::reduce_s);
      reduce_inplace(base + b * elem, staging.get() + (u % depth) * slot_bytes, e - b, dtype, reduce_op,
                     last_step ? divisor : 1);
    }
    // The chunk just completed is what unit u+C sends: the next reduce-scatter
    // step, the allgather's first step (our own final segment), or the next
    // allgather step.
    if (u + C < total_units) send_unit(u + C);
  }
  for (auto& send : sends) {
    if (send) op.wait(*send, "final send");
  }
}

}  // namespace

void ring_allreduce(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base) {
  run_ring(op, data, numel, dtype, reduce_op, unit_base, RingPhases::kAllreduce);
}

void ring_reduce_scatter(Op& op, void* data, int64_t numel, DType dtype, ReduceOp reduce_op, uint32_t unit_base) {
  run_ring(op, data, numel, dtype, reduce_op, unit_base, RingPhases::kReduceScatter);
}

void dense_reduce_scatter(Op& op, const void* in, void* out, int64_t count, DType dtype, ReduceOp reduce_op) {
  const int n = op.size();
  const size_t segment = static_cast<size_t>(count) * dtype_size(dtype);
  const auto* input = static_cast<const uint8_t*>(in);
  if (n == 1 || count == 0) {  // one rank: its input is the result (an average over one divides by one)
    if (count > 0 && out != input) std::memmove(out, input, segment);
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
