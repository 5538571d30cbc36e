// `bitpush._C`: the compiled half of the bitpush Python package (docs/python.md). The
// pure-Python package (python/bitpush/) is the supported API; this module is its engine room.
#include <pybind11/pybind11.h>

#include "python/src/bindings.h"
#include "python/src/status_error.h"

namespace bitpush::python {
void BindConfig(pybind11::module_& m);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "bitpush C++ core: worker client and LANS kernel (use bitpush / bitpush.torch)";
  bitpush::python::RegisterStatusError(m);
  bitpush::python::BindClient(m);
  bitpush::python::BindLans(m);
  bitpush::python::BindConfig(m);  // config_bindings.cc: load_cluster_config, knobs
}
