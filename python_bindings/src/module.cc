// _gradcomm: the pybind11 module under the `gradcomm` Python package. It stays
// thin: the package (gradcomm/__init__.py) turns numpy arrays and torch tensors
// into (pointer, numel, dtype, device, stream) and checks their layout; this file
// converts those to a TensorView, releases the GIL, and calls the C++ API.
//
// One communicator per process lives here (the Python API is module-level, like
// torch.distributed's default group). Calls are issued under a mutex taken after
// the GIL is released, so shutdown() cannot free the communicator under an issuing
// thread; waits hold neither (a Work outlives its communicator: destroying it
// fails the outstanding work, whose wait() then raises).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "communicator_factory.h"
#include "compressors/auto_spec.h"
#include "compressors/family.h"
#include "compressors/spec.h"
#include "gradcomm/gradcomm.h"
#include "ordered_completion.h"
#include "python_store.h"
#include "stats_dict.h"

namespace py = pybind11;

namespace gradcomm::python {
namespace {

struct Session {
  std::mutex mutex;
  std::unique_ptr<Communicator> comm;
};

// Never destroyed: a static destructor would run after the interpreter is gone.
// The package registers shutdown() with atexit, which frees the communicator in time.
Session& session() {
  static Session* s = new Session;
  return *s;
}

// Calling before init() (or after shutdown()) is a usage error of the module, not
// one of the C++ error kinds: it surfaces as gradcomm.Error itself.
class NotInitialized : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- exceptions ------------------------------------------------------------------
// The C++ classes as Python classes, each also under the builtin it resembles, so
// `except ValueError` catches gradcomm.InvalidArgument and so on.
struct PyErrors {
  PyObject* error = nullptr;
  PyObject* by_code[9] = {};  // indexed by ErrorCode (1..8)
};
PyErrors& py_errors() {
  static PyErrors errors;
  return errors;
}

PyObject* new_error(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = fmt::format("gradcomm.{}", name);
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;  // the module keeps a reference; this one is kept for the translator
}

void register_errors(py::module_& m) {
  PyErrors& errors = py_errors();
  errors.error = new_error(m, "Error", PyExc_RuntimeError,
                           "Base of every gradcomm error (a RuntimeError); the message names the rank, the call "
                           "and what was expected versus found.");
  auto with = [&](PyObject* builtin) {
    if (builtin == nullptr) return py::reinterpret_borrow<py::object>(errors.error).release().ptr();
    return py::make_tuple(py::handle(errors.error), py::handle(builtin)).release().ptr();
  };
  struct Spec {
    ErrorCode code;
    const char* name;
    PyObject* builtin;
    const char* doc;
  };
  const Spec specs[] = {
      {ErrorCode::kInvalidArgument, "InvalidArgument", PyExc_ValueError, "A wrong argument (also a ValueError)."},
      {ErrorCode::kUnsupported, "Unsupported", PyExc_NotImplementedError,
       "Valid, but not available in this build or on this machine (also a NotImplementedError)."},
      {ErrorCode::kTimeout, "TimeoutError", PyExc_TimeoutError,
       "A wait passed its deadline (also the builtin TimeoutError)."},
      {ErrorCode::kPeerFailure, "PeerFailure", PyExc_ConnectionError,
       "Another rank died or its connection broke (also a ConnectionError)."},
      {ErrorCode::kMismatch, "MismatchError", nullptr, "Ranks called different collectives; raised on every rank."},
      {ErrorCode::kCorruptPayload, "CorruptPayload", PyExc_ValueError,
       "Bytes failed validation: wire message, payload or state (also a ValueError)."},
      {ErrorCode::kTransport, "TransportError", nullptr, "The transport (UCX, sockets, the store) failed."},
      {ErrorCode::kCuda, "CudaError", nullptr, "A CUDA runtime call failed."},
  };
  for (const Spec& spec : specs) {
    PyObject* bases = with(spec.builtin);
    errors.by_code[static_cast<int>(spec.code)] = new_error(m, spec.name, bases, spec.doc);
    Py_DECREF(bases);
  }
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      const int code = static_cast<int>(e.code());
      PyObject* cls = code >= 1 && code <= 8 ? py_errors().by_code[code] : nullptr;
      PyErr_SetString(cls != nullptr ? cls : py_errors().error, e.what());
    } catch (const NotInitialized& e) {
      PyErr_SetString(py_errors().error, e.what());
    }
  });
}

Communicator& communicator(const char* call) {
  Session& s = session();
  if (!s.comm) {
    throw NotInitialized(fmt::format("gradcomm.{}: gradcomm is not initialized; call gradcomm.init() first (after "
                                     "gradcomm.shutdown(), init() again)",
                                     call));
  }
  return *s.comm;
}

// Runs f(communicator) with the GIL released and the session locked, in that order, as
// every entry point must (init() holds the mutex while its store callbacks wait for the
// GIL). `call` names the entry point in NotInitialized. f returns C++ values only: no
// Python object may be made without the GIL.
template <class F>
auto with_communicator(const char* call, F&& f) {
  py::gil_scoped_release release;
  std::lock_guard lock(session().mutex);
  return f(communicator(call));
}

// ---- conversions -------------------------------------------------------------------

DType parse_dtype(const std::string& name) {
  static constexpr DType kAll[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                                   DType::kInt32,   DType::kInt64,   DType::kUInt8};
  for (DType d : kAll) {
    if (name == dtype_name(d)) return d;
  }
  throw InvalidArgument(fmt::format("dtype '{}' is not supported; accepted: float32, float16, bfloat16, float64, "
                                    "int32, int64, uint8",
                                    name));
}

ReduceOp parse_op(const std::string& name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "avg" || name == "mean") return ReduceOp::kAvg;
  if (name == "min") return ReduceOp::kMin;
  if (name == "max") return ReduceOp::kMax;
  throw InvalidArgument(fmt::format("op '{}' is not a reduce op; accepted: sum, avg, min, max", name));
}

Device parse_device(const std::string& type, int index) {
  if (type == "cpu") return Device{DeviceType::kCpu, 0};
  if (type == "cuda") return Device{DeviceType::kCuda, index};
  throw InvalidArgument(fmt::format("device '{}' is not supported; accepted: cpu, cuda", type));
}

TensorView view(uintptr_t data, int64_t numel, const std::string& dtype, const std::string& device, int index) {
  return TensorView{reinterpret_cast<void*>(data), numel, parse_dtype(dtype), parse_device(device, index)};
}

// ---- the calls -----------------------------------------------------------------------

void init(int rank, int world_size, const std::string& store_url, const std::string& transport, int64_t timeout_ms,
          const std::string& job_token, py::object py_store, const std::string& key_prefix,
          const std::string& store_address) {
  InitOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.store = store_url;
  options.transport = transport;
  if (timeout_ms > 0) options.timeout = std::chrono::milliseconds(timeout_ms);
  options.job_token = job_token;

  std::shared_ptr<PythonStoreLink> link;
  std::unique_ptr<detail::Store> store;
  if (!py_store.is_none()) {
    link = std::make_shared<PythonStoreLink>(py_store);
    store = std::make_unique<PythonStore>(link, key_prefix, store_address);
  }
  {
    py::gil_scoped_release release;
    std::lock_guard lock(session().mutex);
    if (session().comm) {
      throw InvalidArgument(fmt::format("gradcomm.init: already initialized (rank {} of {}); call "
                                        "gradcomm.shutdown() before initializing again",
                                        session().comm->rank(), session().comm->size()));
    }
    try {
      session().comm = detail::create_communicator(options, std::move(store));
    } catch (...) {
      if (link) link->detach();
      throw;
    }
  }
  // Creation is over: nothing calls the store again (see python_store.h).
  if (link) link->detach();
}

// Made at first use, never destroyed: its threads stay for the process's life (a
// static destructor would run after the interpreter is gone). The GIL guards it.
// complete_in_order (the DDP hook's futures) uses it; shutdown() drains it.
OrderedCompleter*& ordered_completer() {
  static OrderedCompleter* completer = nullptr;
  return completer;
}

void shutdown() {
  OrderedCompleter* completer = ordered_completer();  // read under the GIL, which guards it
  py::gil_scoped_release release;
  std::unique_ptr<Communicator> comm;
  {
    std::lock_guard lock(session().mutex);
    comm = std::move(session().comm);
  }
  comm.reset();  // UCX teardown: bounded, never waits on a peer forever
  // The DDP hook's futures (of calls just failed, or completing still) are done before
  // the program goes on to its end (ordered_completion.h, "Drain"); a callback blocked
  // on something else holds this up for at most kDrainTimeout. Not when a future
  // callback shuts down: its own completion is one of those.
  constexpr std::chrono::seconds kDrainTimeout{10};
  if (completer != nullptr && !completer->on_completion_thread() && !completer->drain(kDrainTimeout)) {
    std::fprintf(stderr,
                 "gradcomm.shutdown: DDP hook futures still completing after %lld s (a future callback "
                 "blocked?); going on without them\n",
                 static_cast<long long>(kDrainTimeout.count()));
  }
}

// Issues under the session mutex (calls are issued whole and in order); waits
// outside it, with the GIL released, so other Python threads can issue meanwhile.
std::shared_ptr<Work> allreduce_async(uintptr_t data, int64_t numel, const std::string& dtype,
                                      const std::string& device, int index, uintptr_t stream, const std::string& op,
                                      const std::string& compression, const std::string& key,
                                      std::vector<int64_t> shape, std::vector<std::vector<int64_t>> parts) {
  const TensorView t = view(data, numel, dtype, device, index);
  const ReduceOp reduce_op = parse_op(op);
  CompressOptions options;
  options.compressor = compression;
  options.key = key;
  options.stream = reinterpret_cast<void*>(stream);
  options.shape = std::move(shape);
  options.parts = std::move(parts);
  return with_communicator("allreduce", [&](Communicator& c) { return c.allreduce_async(t, reduce_op, options); });
}

std::shared_ptr<Work> allgather_async(uintptr_t in, uintptr_t out, int64_t numel, int64_t out_numel,
                                      const std::string& dtype, const std::string& device, int index) {
  const TensorView tin = view(in, numel, dtype, device, index);
  const TensorView tout = view(out, out_numel, dtype, device, index);
  return with_communicator("allgather", [&](Communicator& c) { return c.allgather_async(tin, tout); });
}

std::shared_ptr<Work> reduce_scatter_async(uintptr_t in, uintptr_t out, int64_t numel, int64_t out_numel,
                                           const std::string& dtype, const std::string& device, int index,
                                           const std::string& op, const std::string& compression,
                                           const std::string& key) {
  const TensorView tin = view(in, numel, dtype, device, index);
  const TensorView tout = view(out, out_numel, dtype, device, index);
  const ReduceOp reduce_op = parse_op(op);
  CompressOptions options;
  options.compressor = compression;
  options.key = key;
  return with_communicator("reduce_scatter",
                           [&](Communicator& c) { return c.reduce_scatter_async(tin, tout, reduce_op, options); });
}

std::shared_ptr<Work> broadcast_async(uintptr_t data, int64_t numel, const std::string& dtype,
                                      const std::string& device, int index, int root) {
  const TensorView t = view(data, numel, dtype, device, index);
  return with_communicator("broadcast", [&](Communicator& c) { return c.broadcast_async(t, root); });
}

// Work.wait(timeout_ms, helper): -1 waits for good; returns False when the time passed.
// helper: the thread waits on the application's behalf (Waiter::kHelper).
bool wait_work(Work& work, int64_t timeout_ms, bool helper) {
  py::gil_scoped_release release;
  const Waiter waiter = helper ? Waiter::kHelper : Waiter::kApplication;
  if (timeout_ms < 0) {
    work.wait(waiter);
    return true;
  }
  return work.wait_for(std::chrono::milliseconds(timeout_ms), waiter);
}

void barrier() {
  with_communicator("barrier", [](Communicator& c) { c.barrier(); });
}

// ---- futures completed in order (the DDP hook's) ---------------------------------------
// gradcomm/torch.py's compression_hook completes a torch future per bucket through
// this process's OrderedCompleter (ordered_completion.h: the protocol, shared with the
// torch backend). An item waits on its work on the waiter as a helper (the hook calls
// needed() where DDP comes to need the result), then calls `done` on a completion
// thread, with the GIL; `done` finds the work complete and marks the future.
class PythonItem final : public OrderedCompleter::Item {
 public:
  PythonItem(std::shared_ptr<Work> work, py::object done) : work_(std::move(work)), done_(std::move(done)) {}
  // Still holding `done` only when complete() never ran or was cut short (a thread
  // ended by the interpreter's exit as it took the GIL): no GIL here, so it is leaked.
  ~PythonItem() override { (void)done_.release(); }

  void settle() override {
    try {
      work_->wait(Waiter::kHelper);
    } catch (...) {
      // done() sees the error: waiting on the work again rethrows it.
    }
    work_.reset();
  }
  void complete() override {
    py::gil_scoped_acquire gil;
    try {
      done_();
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("gradcomm: completing a future in issue order");
    }
    done_ = py::object();
  }

 private:
  std::shared_ptr<Work> work_;
  py::object done_;
};

void complete_in_order(std::shared_ptr<Work> work, py::object done) {
  OrderedCompleter*& completer = ordered_completer();
  if (completer == nullptr) completer = new OrderedCompleter();
  OrderedCompleter* c = completer;
  auto item = std::make_unique<PythonItem>(std::move(work), std::move(done));
  py::gil_scoped_release release;  // a completion thread takes the GIL with the completer's lock free
  c->push(std::move(item), /*top_level=*/!c->on_completion_thread());
}

}  // namespace
}  // namespace gradcomm::python

PYBIND11_MODULE(_gradcomm, m) {
  using namespace gradcomm;
  using namespace gradcomm::python;
  m.doc() = "gradcomm's C++ core; use the `gradcomm` package, not this module.";
  register_errors(m);
#if defined(GRADCOMM_WITH_CUDA)
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  m.attr("__version__") = GRADCOMM_VERSION_STRING;

  m.def("init", &init, py::arg("rank"), py::arg("world_size"), py::arg("store"), py::arg("transport"),
        py::arg("timeout_ms"), py::arg("job_token"), py::arg("py_store"), py::arg("key_prefix"),
        py::arg("store_address"));
  m.def("shutdown", &shutdown);
  // In a child of fork(): the communicator's engine thread and transport exist only in
  // the parent, as do the ordered completer's threads. Destroying the copies would join
  // threads that are not there; they are forgotten instead (leaked), with whatever they
  // held, and the child starts without them (complete_in_order makes a new completer).
  m.def("forget_after_fork", [] {
    (void)session().comm.release();
    ordered_completer() = nullptr;
  });
  m.def("is_initialized", [] {
    // Release the GIL first, as every entry point does: init() holds the mutex while
    // its store callbacks wait for the GIL.
    py::gil_scoped_release release;
    std::lock_guard lock(session().mutex);
    return static_cast<bool>(session().comm);
  });
  m.def("rank", [] { return with_communicator("rank", [](Communicator& c) { return c.rank(); }); });
  m.def("size", [] { return with_communicator("size", [](Communicator& c) { return c.size(); }); });
  m.def("topology", [] {
    const Topology t = with_communicator("topology", [](Communicator& c) { return c.topology(); });
    py::dict d;
    d["nodes"] = t.nodes;
    d["node"] = t.node;
    d["local_rank"] = t.local_rank;
    d["local_size"] = t.local_size;
    d["node_shm"] = t.node_shm;
    d["node_name"] = t.node_name;
    d["node_of_rank"] = t.node_of_rank;
    return d;
  });
  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("wait", &wait_work, py::arg("timeout_ms") = -1, py::arg("helper") = false)
      .def("needed", &Work::needed)
      .def("is_completed", [](const Work& w) {
        py::gil_scoped_release release;
        return w.is_completed();
      })
      .def("failed", [](const Work& w) { return static_cast<bool>(w.error()); });
  m.def("allreduce_async", &allreduce_async, py::arg("data"), py::arg("numel"), py::arg("dtype"), py::arg("device"),
        py::arg("device_index"), py::arg("stream"), py::arg("op"), py::arg("compression"), py::arg("key"),
        py::arg("shape") = std::vector<int64_t>{}, py::arg("parts") = std::vector<std::vector<int64_t>>{});
  m.def("allgather_async", &allgather_async, py::arg("input"), py::arg("output"), py::arg("numel"),
        py::arg("out_numel"), py::arg("dtype"), py::arg("device"), py::arg("device_index"));
  m.def("reduce_scatter_async", &reduce_scatter_async, py::arg("input"), py::arg("output"), py::arg("numel"),
        py::arg("out_numel"), py::arg("dtype"), py::arg("device"), py::arg("device_index"), py::arg("op"),
        py::arg("compression") = "none", py::arg("key") = "");
  m.def("broadcast_async", &broadcast_async, py::arg("data"), py::arg("numel"), py::arg("dtype"), py::arg("device"),
        py::arg("device_index"), py::arg("root"));
  m.def("barrier", &barrier);
  // Host memory the node's ranks read in place (Communicator::alloc_shared): a buffer for
  // numpy.frombuffer / torch.frombuffer, which keep it alive.
  py::class_<SharedBuffer>(m, "SharedBuffer", py::buffer_protocol())
      .def_buffer([](SharedBuffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {py::ssize_t{1}});
      })
      .def("__len__", &SharedBuffer::size)
      .def_property_readonly("shared", &SharedBuffer::shared);
  m.def("alloc_shared", [](size_t bytes) {
    return with_communicator("alloc_shared", [&](Communicator& c) { return c.alloc_shared(bytes); });
  }, py::arg("nbytes"));
  // Waits on `work` on the completer's waiter, then calls done() on a completion
  // thread: in issue order, one top-level call's done() after the previous one's has
  // returned (ordered_completion.h).
  m.def("complete_in_order", &complete_in_order, py::arg("work"), py::arg("done"));
  m.def("save_state", [] {
    const std::vector<uint8_t> bytes = with_communicator("save_state", [](Communicator& c) { return c.save_state(); });
    return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  });
  m.def("load_state", [](py::bytes data) {
    std::string bytes = data;  // a copy: the GIL is released below
    with_communicator("load_state", [&](Communicator& c) {
      c.load_state(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    });
  });
  // Parses a spec as the engine will at its first compressed call: InvalidArgument
  // (gradcomm.InvalidArgument, a ValueError) naming the problem and what is accepted.
  m.def("check_compression", [](const std::string& spec) { detail::check_compressor_spec(spec); },
        py::arg("spec"));
  // Whether reduce_scatter compresses with `spec` itself (the compressed ring's codecs,
  // top-k) or only an allreduce does (the rest, and auto, which chooses per allreduce).
  m.def("reduce_scatter_compresses", [](const std::string& spec) {
    detail::check_compressor_spec(spec);
    return !detail::is_auto_spec(spec) &&
           detail::reduce_scatter_compresses(detail::family_of(detail::parse_compressor_spec(spec).id).collective);
  }, py::arg("spec"));
  // Whether compressed calls with `spec` take float16/bfloat16 host tensors as they are
  // (the codecs and top-k, in float32 pieces: detail::compresses_16bit) or float32 only.
  m.def("compresses_16bit", [](const std::string& spec) {
    detail::check_compressor_spec(spec);
    return !detail::is_auto_spec(spec) && detail::compresses_16bit(detail::parse_compressor_spec(spec));
  }, py::arg("spec"));
  m.def("stats", [] {
    const Stats st = with_communicator("stats", [](Communicator& c) { return c.stats(); });
    py::dict d;
    python::put_counters(d, st);
    // compressor=auto: per key, the latest choice and the predicted seconds per call of
    // every candidate (None: left out, with the reason in "left_out").
    py::list choices;
    for (const AutoChoice& c : st.auto_choices) {
      py::dict e;
      e["key"] = c.key;
      e["numel"] = c.numel;
      e["chosen"] = c.chosen;
      e["step"] = c.step;
      py::dict predicted, left_out, compute, payload;
      for (size_t i = 0; i < c.candidates.size(); ++i) {
        compute[py::str(c.candidates[i])] = c.compute_s[i];
        payload[py::str(c.candidates[i])] = c.payload_bytes[i];
        if (c.predicted_s[i] >= 0) {
          predicted[py::str(c.candidates[i])] = c.predicted_s[i];
        } else {
          predicted[py::str(c.candidates[i])] = py::none();
          left_out[py::str(c.candidates[i])] = c.left_out[i];
        }
      }
      e["predicted_s"] = predicted;
      e["left_out"] = left_out;
      e["compute_s"] = compute;
      e["payload_bytes"] = payload;
      e["alpha_s"] = c.alpha_s;
      e["bytes_per_s"] = c.bytes_per_s;
      e["overlap_s"] = c.overlap_s;
      choices.append(e);
    }
    d["auto_choices"] = choices;
    return d;
  });
}
