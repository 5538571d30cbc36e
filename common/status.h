// Status and StatusOr<T>: how every bitpush function reports a recoverable error.
//
// A Status is either OK or carries one code from a small fixed set plus a message that names
// the problem (which field, which peer, which limit). Exceptions never cross module or thread
// boundaries; invariant violations use BP_CHECK (common/logging.h). See docs/errors.md.
//
// Thread-safety: value types; distinct objects may be used from distinct threads freely.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace bitpush {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,     // the caller passed something wrong (spec, size, config value)
  kNotFound = 2,            // a named thing does not exist (key, compressor name)
  kOutOfRange = 3,          // a value or index outside its valid range
  kTimeout = 4,             // a bounded wait expired; the message names whom we waited for
  kUnavailable = 5,         // a peer or resource is gone or not reachable (retry may help)
  kRemoteError = 6,         // a peer reported an error; the message carries it
  kCancelled = 7,           // the operation was stopped (shutdown, Ctrl-C)
  kDataLoss = 8,            // bytes are malformed, truncated or inconsistent (never trusted)
  kFailedPrecondition = 9,  // the system is not in a state to do this (e.g. ISA not supported)
  kInternal = 10,           // a bug or an unexpected system error
  kUnimplemented = 11,      // a requested feature is not built in (e.g. CUDA off)
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  const std::string& message() const;
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>" (OK stays OK).
  Status WithContext(std::string_view context) const;

  bool operator==(const Status& other) const {
    return code() == other.code() && message() == other.message();
  }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null when OK: an OK status costs one pointer
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status OutOfRangeError(std::string message);
Status TimeoutError(std::string message);
Status UnavailableError(std::string message);
Status RemoteError(std::string message);
Status CancelledError(std::string message);
Status DataLossError(std::string message);
Status FailedPreconditionError(std::string message);
Status InternalError(std::string message);
Status UnimplementedError(std::string message);

// Either a value of T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT(google-explicit-constructor)
    if (status_.ok()) status_ = InternalError("StatusOr constructed from an OK status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // Precondition: ok(). Checked: calling these on an error aborts with the status. (value_
  // holds a value whenever status_ is OK, which clang-tidy cannot see through CheckOk.)
  T& value() & {
    CheckOk();
    return *value_;  // NOLINT(bugprone-unchecked-optional-access)
  }
  const T& value() const& {
    CheckOk();
    return *value_;  // NOLINT(bugprone-unchecked-optional-access)
  }
  T&& value() && {
    CheckOk();
    return std::move(*value_);  // NOLINT(bugprone-unchecked-optional-access)
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const;
  Status status_;
  std::optional<T> value_;
};

namespace internal {
[[noreturn]] void DieOnBadStatusAccess(const Status& status);
}  // namespace internal

template <typename T>
void StatusOr<T>::CheckOk() const {
  if (!status_.ok()) internal::DieOnBadStatusAccess(status_);
}

}  // namespace bitpush

#define BP_STATUS_CONCAT_INNER(a, b) a##b
#define BP_STATUS_CONCAT(a, b) BP_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define BP_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::bitpush::Status bp_status_tmp_ = (expr);       \
    if (!bp_status_tmp_.ok()) return bp_status_tmp_; \
  } while (0)

// `lhs = value of expr` where expr is a StatusOr; returns the error otherwise. `lhs` may be a
// declaration (`auto x`), so it cannot be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define BP_ASSIGN_OR_RETURN(lhs, expr) \
  BP_ASSIGN_OR_RETURN_IMPL(BP_STATUS_CONCAT(bp_statusor_, __LINE__), lhs, expr)
#define BP_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
