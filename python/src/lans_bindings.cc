// Python bindings of the LANS/CLAN update kernel (optimizers/lans.h): `LansOptions`,
// `lans_step` (CPU buffers), `lans_step_cuda` (device buffers, on a given stream) and
// `lans_kernel_name`. Buffers are passed as raw addresses (tensor.data_ptr()); the caller
// (bitpush/torch/optimizer.py) checks sizes, dtype (fp32), contiguity and device. The GIL is
// released during the update. Without the bitpush_optimizers target in the build, the functions
// raise BitpushError (code Unimplemented) and `HAVE_LANS` is False.
//
// Thread-safety: as optimizers/lans.h (pure apart from the given buffers).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "python/src/bindings.h"
#include "python/src/status_error.h"

#ifdef BITPUSH_PY_HAVE_LANS
#include "optimizers/lans.h"
#endif

namespace bitpush::python {

namespace py = pybind11;

#ifdef BITPUSH_PY_HAVE_LANS

void BindLans(py::module_& m) {
  using optimizers::EpsMode;
  using optimizers::LansOptions;
  m.attr("HAVE_LANS") = true;
  py::class_<LansOptions>(m, "LansOptions", "optimizers/lans.h LansOptions (defaults as there).")
      .def(py::init<>())
      .def_readwrite("beta1", &LansOptions::beta1)
      .def_readwrite("beta2", &LansOptions::beta2)
      .def_readwrite("eps", &LansOptions::eps)
      .def_readwrite("weight_decay", &LansOptions::weight_decay)
      .def_property(
          "eps_inside_sqrt",
          [](const LansOptions& o) { return o.eps_mode == EpsMode::kInsideSqrt; },
          [](LansOptions& o, bool inside) {
            o.eps_mode = inside ? EpsMode::kInsideSqrt : EpsMode::kOutsideSqrt;
          },
          "True: den = sqrt(v^ + eps) (Algorithm 2 as printed); False (default): sqrt(v^) + eps.")
      .def_readwrite("normalize_grad", &LansOptions::normalize_grad)
      .def_readwrite("trust_ratio_fallback", &LansOptions::trust_ratio_fallback)
      .def_readwrite("phi_lower", &LansOptions::phi_lower)
      .def_readwrite("phi_upper", &LansOptions::phi_upper)
      .def(
          "validate", [](const LansOptions& o) { ThrowIfError(o.Validate()); },
          "Raises BitpushError (InvalidArgument) naming a field out of range.");

  m.def(
      "lans_step",
      [](const LansOptions& o, float lr, uint64_t step, uintptr_t x, uintptr_t mm, uintptr_t v,
         uintptr_t g, size_t n) {
        Status s;
        {
          py::gil_scoped_release nogil;
          s = optimizers::LansStep(o, lr, step, Span<float>(reinterpret_cast<float*>(x), n),
                                   Span<float>(reinterpret_cast<float*>(mm), n),
                                   Span<float>(reinterpret_cast<float*>(v), n),
                                   Span<const float>(reinterpret_cast<const float*>(g), n));
        }
        ThrowIfError(s);
      },
      py::arg("options"), py::arg("lr"), py::arg("step"), py::arg("x_ptr"), py::arg("m_ptr"),
      py::arg("v_ptr"), py::arg("g_ptr"), py::arg("n"),
      "One LANS update of one block of n fp32 elements in CPU memory, in place on x, m, v.");
  m.def(
      "lans_step_cuda",
      [](const LansOptions& o, float lr, uint64_t step, uintptr_t x, uintptr_t mm, uintptr_t v,
         uintptr_t g, size_t n, uintptr_t stream) {
        Status s;
        {
          py::gil_scoped_release nogil;
          s = optimizers::LansStepCuda(o, lr, step, reinterpret_cast<float*>(x),
                                       reinterpret_cast<float*>(mm), reinterpret_cast<float*>(v),
                                       reinterpret_cast<const float*>(g), n,
                                       reinterpret_cast<void*>(stream));
        }
        ThrowIfError(s);
      },
      py::arg("options"), py::arg("lr"), py::arg("step"), py::arg("x_ptr"), py::arg("m_ptr"),
      py::arg("v_ptr"), py::arg("g_ptr"), py::arg("n"), py::arg("stream_ptr") = 0,
      "The update on CUDA device buffers, enqueued on stream_ptr (0 = the legacy default "
      "stream) and synchronised. BitpushError (Unimplemented) in builds without CUDA.");
  m.def(
      "lans_kernel_name", [] { return std::string(optimizers::LansKernelName()); },
      "The CPU kernel lans_step uses here: 'avx512', 'avx2' or 'scalar'.");
}

#else  // !BITPUSH_PY_HAVE_LANS

void BindLans(py::module_& m) {
  m.attr("HAVE_LANS") = false;
  auto missing = [](py::args, py::kwargs) {
    throw StatusError(UnimplementedError(
        "this build of bitpush has no LANS kernel (the bitpush_optimizers target was missing "
        "when python/ was configured)"));
  };
  m.def("lans_step", missing);
  m.def("lans_step_cuda", missing);
  m.def("lans_kernel_name", missing);
}

#endif

}  // namespace bitpush::python
