// The parts of the `bitpush._C` extension, each registered by module.cc in this order:
// BitpushError (status_error.h), the worker client (client_bindings.cc), the LANS kernel
// (lans_bindings.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace bitpush::python {

void BindClient(pybind11::module_& m);
void BindLans(pybind11::module_& m);

}  // namespace bitpush::python
