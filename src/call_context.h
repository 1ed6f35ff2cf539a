// The narrow view of a communicator that one call in flight gets.
//
//   CallContext   what one call in flight needs (Op, op.h, and through it every
//                 collective in src/collectives/): the transport, the stats it adds
//                 to, and the failure state it watches and reports to.
//
// CommunicatorImpl (comm_impl.h) implements it; nothing below it includes comm_impl.h, so
// the collectives cannot reach the issuing side, the keys' state or the device path by
// accident. The engine (engine.h) sees its communicator through the CallRunner
// (call_runner.h), the one place calls run.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "gradcomm/communicator.h"
#include "gradcomm/errors.h"
#include "op.h"
#include "topology.h"
#include "transport/transport.h"
#include "wire.h"

namespace gradcomm::detail {

class NodeShm;  // node_shm.h

// After a failure, how long outstanding sends (the abort to the others among them)
// may take before the transport drops them.
inline constexpr auto kAbandonGrace = std::chrono::milliseconds(300);

class CallContext {
 public:
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
  // Which ranks share a node (topology.h): the two-level collectives' groups.
  virtual const NodeMap& nodes() const = 0;
  // Whether this communicator's collectives run over two levels (GRADCOMM_HIERARCHY,
  // hierarchy.h), decided once at creation.
  virtual bool two_levels() const = 0;
  // GRADCOMM_SCHEDULE (hierarchy.h), also read once at creation.
  virtual ScheduleMode schedule_mode() const = 0;
  // This rank's node's shared segment (node_shm.h), or null: the transport carries the
  // node's traffic. Collectives reach it through Op::node_shm.
  virtual NodeShm* node_shm() = 0;
  // Every rank of this communicator shares this rank's node segment: its collectives
  // never need the transport, and headers are checked on the segment (Op).
  virtual bool one_segment() const = 0;
  virtual Transport& transport() = 0;
  virtual Stats& mutable_stats() = 0;

  // Aborts other ranks sent: the first is kept until the call it names (or an
  // earlier call that cannot complete without that rank) raises it.
  virtual std::optional<ControlMessage>& pending_abort() = 0;
  // The communicator is being destroyed: a wait gives up.
  virtual bool stopping() const = 0;
  // A call was refused because threads issued concurrently (Engine::submit): every
  // running and queued call fails with this, on every rank.
  virtual std::optional<std::string> refusal() const = 0;
  // Whether refusal() has one (an atomic load: checked at every wait).
  virtual bool refused() const = 0;
  // A caller is blocked waiting on a call: waits poll before sleeping (src/spin.h).
  virtual bool waited_on() const = 0;

  // Records the first failure; every later call raises it again (thread-safe).
  virtual void mark_failed(ErrorCode code, const std::string& message) = 0;
  // The first failure also goes to every other rank (as an abort naming call `seq`),
  // and what is pending with them is abandoned. Later ones only raise. Returns whether
  // this was the first.
  virtual bool fail_and_tell(ErrorCode code, const std::string& message, uint64_t seq) = 0;
  // Tells the other ranks this one is going away with call `seq` outstanding (once).
  virtual void tell_peers_destroyed(uint64_t seq) = 0;

 protected:
  ~CallContext() = default;
};

}  // namespace gradcomm::detail
