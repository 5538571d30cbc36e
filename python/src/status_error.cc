#include "python/src/status_error.h"

#include <Python.h>

namespace bitpush::python {
namespace {

// Owned by the module (m.attr) after registration; a borrowed pointer for the translator.
PyObject* g_bitpush_error = nullptr;

}  // namespace

void RegisterStatusError(pybind11::module_& m) {
  namespace py = pybind11;
  py::dict attrs;
  attrs["__doc__"] =
      "A bitpush engine error. str(e) is the engine's message (it names the tensor, peer or "
      "limit); e.code is the status code name: InvalidArgument, NotFound, OutOfRange, Timeout, "
      "Unavailable, RemoteError, Cancelled, DataLoss, FailedPrecondition, Internal, "
      "Unimplemented.";
  attrs["code"] = "Unknown";
  attrs["__module__"] = "bitpush";
  g_bitpush_error = PyErr_NewException("bitpush.BitpushError", PyExc_RuntimeError, attrs.ptr());
  if (g_bitpush_error == nullptr) throw py::error_already_set();
  m.attr("BitpushError") = py::reinterpret_steal<py::object>(g_bitpush_error);

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object type = py::reinterpret_borrow<py::object>(g_bitpush_error);
      py::object err = type(py::str(e.status().message()));
      err.attr("code") = py::str(std::string(StatusCodeName(e.status().code())));
      PyErr_SetObject(g_bitpush_error, err.ptr());
    }
  });
}

}  // namespace bitpush::python
