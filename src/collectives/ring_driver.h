// The ring's one loop: every ring the library runs (dense and compressed, over the host
// transport and over NCCL, allreduce and reduce-scatter) is drive_ring() with a channel
// that moves messages and a step policy that says what a message carries and what
// becomes of it. NCCL's runRing, over our RingSchedule (ring_schedule.h):
//
//   send own chunks                     u < C: the segment this rank starts
//   for every unit u:
//     receive u                         the left neighbour's message of unit u
//     absorb u                          sum: fold it into ours (recvReduceSend);
//                                       decode-add-re-encode: decode it onto ours;
//                                       forward: store it / decode it (recvCopySend)
//     prepare and send u + C            what unit u just completed goes on: the folded
//                                       partial sum, its re-encode, the owner's final
//                                       encode, or the received bytes unchanged
//
// Chunk j of a segment goes out again (as unit u + C) the moment it has arrived and been
// absorbed, so chunk j+1 is on the wire while chunk j is being reduced.
//
// Channels (host_ring_channel.h, nccl_ring_channel.h):
//   void send(u, RingMessage)      host: post the send now; NCCL: nothing yet (the
//                                  group of unit u carries it)
//   void receive(u, steps)         host: post receives up to `depth` units ahead, wait
//                                  for u; NCCL: enqueue the group {send u, receive u}
//   void absorbed(u, steps)        NCCL: mark iteration u's side-stream work done
//   void finish()                  host: wait for the sends; NCCL: join the streams
// Step policies (ring_allreduce.cc: sum + forward; compressed_ring.cc: decode-add-re-
// encode + forward; their NCCL forms in nccl_ring_allreduce.cc, nccl_compressed_ring.cc):
//   RingMessage send_message(u)    what unit u sends (valid after prepare(u))
//   RingMessage recv_message(u)    where unit u lands
//   void prepare(u)                make unit u's message
//   void absorb(u)                 use unit u's arrival
//   bool absorbs(u)                absorb(u) or prepare(u + C) does work (NCCL: on the
//                                  side stream, which then waits for the arrival)
//   int64_t recv_overwrites(u)     the earlier unit whose send reads the memory unit u
//                                  lands in, or -1 (host: that send completes first)
//   int64_t recv_reuses(u)         the earlier unit whose absorb last read that memory,
//                                  or -1 (NCCL: its side work completes first)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "collectives/ring_schedule.h"  // RingShape


namespace gradcomm::detail {

// One message of a unit: where it is read from or lands, and its length.
struct RingMessage {
  void* data = nullptr;
  size_t bytes = 0;
};

// Runs units [0, units) of `ring`: 2 rs_units for an allreduce, rs_units for a
// reduce-scatter alone, (N-1) C for an allgather.
template <class Channel, class Steps>
void drive_ring(const RingShape& ring, int64_t units, Channel& channel, Steps& steps) {
  const int64_t C = ring.chunks;
  for (int64_t j = 0; j < std::min(C, units); ++j) {  // step 0: our own segment
    steps.prepare(j);
    channel.send(j, steps.send_message(j));
  }
  for (int64_t u = 0; u < units; ++u) {
    channel.receive(u, steps);
    steps.absorb(u);
    if (u + C < units) {
      steps.prepare(u + C);
      channel.send(u + C, steps.send_message(u + C));
    }
    channel.absorbed(u, steps);
  }
  channel.finish();
}

}  // namespace gradcomm::detail
