// The ring driver's stream channel (ring_driver.h), for rings whose messages and steps
// are enqueued on GPU streams and never waited for by the host (the NCCL rings). Free of
// CUDA: the streams are a template parameter, NCCL's in nccl_ring_channel.h and a host
// simulation in tests/unit/test_stream_ring_channel.cc, which runs this very ordering.
//
// Unit u is one group {send u right, receive u from the left} on the caller's stream.
// Step work (reduce kernels, encodes, decodes) runs on a side stream, so the step of
// chunk j runs while chunk j+1 is on the wire. Events order the two:
//   caller:  wait the side work that made u's send  -> group u -> `arrival`
//   side:    wait `arrival` -> absorb u, prepare u + C -> record done[u mod E]
// A send of unit v >= C carries what iteration v - C made when that was a reduce-scatter
// unit (a folded partial sum, a re-encode, the owner's final encode); an allgather unit's
// send is bytes that arrived in an earlier group, already ordered on the caller's stream.
// The first C sends wait for the initial prepares (our own segment's encodes), and a
// receive into memory an earlier unit's step still reads (Steps::recv_reuses: a reduce
// slot) waits for that step. Event slots cycle every E = max(C, reuse distance) + 1
// units: a slot is re-recorded only after every wait on its previous record was enqueued
// (a wait captures the record that precedes it, so the cycle is safe).
//
// Streams (the template parameter):
//   void join_side()                     the side stream waits for the caller's stream
//   void record(int slot)                event `slot` recorded on the side stream
//   void wait(int slot)                  the caller's stream waits for event `slot`
//   void exchange(u, send, recv, rs)     group u on the caller's stream
//   void side_waits_arrival()            the side stream waits for the last group
//   void join_caller()                   the caller's stream waits for the side stream
//   void finish()                        the ring is enqueued (NCCL: its bytes to Stats)
#pragma once

#include <algorithm>
#include <cstdint>

#include "collectives/ring_driver.h"

namespace gradcomm::detail {

template <class Streams>
class StreamRingChannel {
 public:
  // `max_reuse`: the largest u - recv_reuses(u) of the steps (0 when nothing is reused).
  // `side_work`: the steps use the side stream at all (an allgather's forwards do not:
  // then nothing but the groups is enqueued).
  StreamRingChannel(Streams& streams, const RingShape& ring, int64_t max_reuse, bool side_work = true)
      : streams_(streams), ring_(ring), slots_(std::max(ring.chunks, max_reuse) + 1), side_work_(side_work) {
    if (side_work_) streams_.join_side();  // the side stream starts where the caller's is (the input is ready)
  }

  // Events the channel records: slots 0..slots()-1 cycle over iterations; slots() is the
  // initial prepares' event.
  static int64_t events_needed(const RingShape& ring, int64_t max_reuse) {
    return std::max(ring.chunks, max_reuse) + 2;
  }

  void send(int64_t v, const RingMessage&) {
    if (side_work_ && v < ring_.chunks) streams_.record(initial());  // the last record covers every initial prepare
  }

  template <class Steps>
  void receive(int64_t u, Steps& steps) {
    const int64_t C = ring_.chunks;
    if (side_work_ && u == 0) streams_.wait(initial());
    if (u >= C && ring_.reduce_scatter(u - C)) streams_.wait(slot(u - C));  // what u sends was made there
    const int64_t reused = steps.recv_reuses(u);
    if (reused >= 0) streams_.wait(slot(reused));  // u lands where that step read
    streams_.exchange(u, steps.send_message(u), steps.recv_message(u), ring_.reduce_scatter(u));
    if (steps.absorbs(u)) streams_.side_waits_arrival();
  }

  template <class Steps>
  void absorbed(int64_t u, Steps& steps) {
    if (steps.absorbs(u)) streams_.record(slot(u));
  }

  void finish() {
    if (side_work_) streams_.join_caller();
    streams_.finish();
  }

 private:
  int slot(int64_t u) const { return static_cast<int>(u % slots_); }
  int initial() const { return static_cast<int>(slots_); }

  Streams& streams_;
  const RingShape ring_;
  const int64_t slots_;
  const bool side_work_;
};

}  // namespace gradcomm::detail
