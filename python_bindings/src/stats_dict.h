// gradcomm::Stats's counters as entries of a Python dict, for both extension modules:
// gradcomm.stats() (module.cc) and the torch backend's ProcessGroup._stats()
// (torch_backend/module.cc), so that the two name every counter alike.
#pragma once

#include <pybind11/pybind11.h>

#include "gradcomm/communicator.h"

namespace gradcomm::python {

inline void put_counters(pybind11::dict& d, const Stats& s) {
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["messages_sent"] = s.messages_sent;
  d["ops"] = s.ops;
  d["fused_calls"] = s.fused_calls;
  d["node_shm_ops"] = s.node_shm_ops;
  d["inline_ops"] = s.inline_ops;
  d["node_shm_bytes"] = s.node_shm_bytes;
  d["total_s"] = s.total_s;
  d["reduce_s"] = s.reduce_s;
  d["encode_s"] = s.encode_s;
  d["decode_s"] = s.decode_s;
  d["comm_s"] = s.comm_s();
  d["engine_cpu_s"] = s.engine_cpu_s;
}

}  // namespace gradcomm::python
