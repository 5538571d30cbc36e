// StatusError: how a non-OK bitpush::Status leaves C++ in the Python extension.
//
// Binding code calls ThrowIfError(status) (or ValueOrThrow(statusor)) with the GIL held or not;
// the C++ exception is turned into `bitpush.BitpushError` (a RuntimeError subclass defined by
// this extension, with the engine's message and a `.code` string such as "Unavailable") by a
// pybind11 exception translator registered in RegisterStatusError. The exception never leaves
// the binding layer: the engine itself reports errors only as Status values (docs/errors.md).
//
// Thread-safety: stateless apart from the exception type registered once at module import.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <utility>

#include "common/status.h"

namespace bitpush::python {

class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)), what_(status_.ToString()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T ValueOrThrow(StatusOr<T>&& s) {
  if (!s.ok()) throw StatusError(s.status());
  return std::move(s).value();
}

// Creates `BitpushError` in module `m` and installs the translator.
void RegisterStatusError(pybind11::module_& m);

}  // namespace bitpush::python
