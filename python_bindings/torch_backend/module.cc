// _gradcomm_torch: the pybind11 module that exposes ProcessGroupGradcomm to
// Python as a subclass of torch's own class for backends: on torch 1.13 its
// ProcessGroup (the object the creator returns is the process group that DDP, dist.*
// and new_group take), on torch >= 2 its Backend (torch wraps the object in a
// ProcessGroup that dispatches to it per device; gradcomm.torch finds it again with
// group._get_backend). gradcomm/torch.py registers the creator with
// torch.distributed.Backend.register_backend.
//
// Built with the pybind11 torch was built with (Debian's pybind11 2.10 for Debian's
// torch, the copy in torch/include for a wheel; CMakeLists.txt): torch's
// ProcessGroup, Backend, Store and Work classes are found through the pybind11
// internals the two modules share. `import torch.distributed` must come first.
#include <torch/csrc/jit/python/pybind_utils.h>  // PythonFutureWrapper: torch.futures.Future
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>

#include "process_group.h"
#include "stats_dict.h"  // python_bindings/src

namespace py = pybind11;

namespace gradcomm::torch_backend {

void without_gil(const std::function<void()>& f) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release release;
    f();
  } else {
    f();
  }
}

}  // namespace gradcomm::torch_backend

PYBIND11_MODULE(_gradcomm_torch, m) {
  using gradcomm::torch_backend::CompressionConfig;
  using gradcomm::torch_backend::ProcessGroupGradcomm;
  m.doc() = "gradcomm's torch.distributed backend; use gradcomm.torch, not this module.";
  py::module_::import("torch.distributed");  // registers c10d::ProcessGroup, Store, Work with pybind11

  // A failed op's error where pybind11 raises it (Work.wait(), Future.wait(), an op
  // refused at issue): gradcomm.<kind>, as torch's own handlers raise it (work.h).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (gradcomm::torch_backend::PythonError& e) {
      PyErr_SetString(e.python_type(), e.what());
    }
  });
  // gradcomm.torch's DDP hook fails its Future this way: torch's Future.set_exception
  // stores the exception as the Future's value, which DDP's reducer then tries to
  // cast to a tensor ("Unable to cast ..."), losing the class. `error` is a
  // gradcomm.Error; the Future's callbacks run here, without the GIL.
  m.def(
      "_fail_future",
      [](const std::shared_ptr<torch::jit::PythonFutureWrapper>& future, const py::handle& error) {
        auto failure = std::make_exception_ptr(gradcomm::torch_backend::PythonError(
            py::type::handle_of(error).attr("__name__").cast<std::string>(), py::str(error).cast<std::string>()));
        py::gil_scoped_release release;
        future->fut->setError(std::move(failure));
      },
      py::arg("future"), py::arg("error"));

  py::class_<ProcessGroupGradcomm, gradcomm::torch_backend::BackendBase, c10::intrusive_ptr<ProcessGroupGradcomm>>(
      m, "ProcessGroupGradcomm",
      "A torch.distributed process group over a gradcomm communicator (see gradcomm.torch).")
      // Creation blocks in the rendezvous: without the GIL, so the store (and other
      // Python threads) can run meanwhile.
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& group_name, const std::string& compression,
                       int64_t min_compress_numel) {
             return c10::make_intrusive<ProcessGroupGradcomm>(store, rank, size, timeout, group_name,
                                                              CompressionConfig{compression, min_compress_numel});
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name") = "",
           py::arg("compression") = "none", py::arg("min_compress_numel") = CompressionConfig{}.min_numel,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "set_compression",
          [](ProcessGroupGradcomm& pg, const std::string& spec, int64_t min_compress_numel) {
            pg.set_compression(CompressionConfig{spec, min_compress_numel});
          },
          py::arg("compression"), py::arg("min_compress_numel") = CompressionConfig{}.min_numel, py::call_guard<py::gil_scoped_release>())
      .def("_shutdown", &ProcessGroupGradcomm::shutdown, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("compression", [](const ProcessGroupGradcomm& pg) { return pg.compression().spec; })
      .def("_compression_state_bytes", &ProcessGroupGradcomm::compression_state_bytes,
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("min_compress_numel",
                             [](const ProcessGroupGradcomm& pg) { return pg.compression().min_numel; })
      .def("_next_round", &ProcessGroupGradcomm::next_round, py::call_guard<py::gil_scoped_release>())
      .def("_stats", [](ProcessGroupGradcomm& pg) {
        ProcessGroupGradcomm::GroupStats s;
        {
          py::gil_scoped_release release;
          s = pg.stats();
        }
        py::dict d;
        gradcomm::python::put_counters(d, s.comm);
        d["reductions"] = s.reductions;
        d["compressed_reductions"] = s.compressed;
        d["reduced_bytes"] = s.reduced_bytes;
        d["dense_ring_bytes"] = s.dense_ring_bytes;
        d["gathered_bytes"] = s.gathered_bytes;
        return d;
      });
  m.attr("torch_major") = TORCH_VERSION_MAJOR;
#if GRADCOMM_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
}
