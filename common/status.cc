#include "common/status.h"

#include <cstdio>
#include <cstdlib>

namespace bitpush {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kRemoteError: return "RemoteError";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kUnimplemented: return "Unimplemented";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string* const kEmpty = new std::string();
  return rep_ ? rep_->message : *kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code()));
  out += ": ";
  out += message();
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message();
  return Status(code(), std::move(msg));
}

Status InvalidArgumentError(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
Status NotFoundError(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
Status OutOfRangeError(std::string m) {
  return {StatusCode::kOutOfRange, std::move(m)};
}
Status TimeoutError(std::string m) {
  return {StatusCode::kTimeout, std::move(m)};
}
Status UnavailableError(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}
Status RemoteError(std::string m) {
  return {StatusCode::kRemoteError, std::move(m)};
}
Status CancelledError(std::string m) {
  return {StatusCode::kCancelled, std::move(m)};
}
Status DataLossError(std::string m) {
  return {StatusCode::kDataLoss, std::move(m)};
}
Status FailedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
Status InternalError(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}
Status UnimplementedError(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}

namespace internal {
void DieOnBadStatusAccess(const Status& status) {
  std::fprintf(stderr, "bitpush: value() called on an error StatusOr: %s\n",
               status.ToString().c_str());
  std::abort();
}
}  // namespace internal

}  // namespace bitpush
