#include "worker/ipc/local_protocol.h"

#include <unistd.h>

#include "common/dtype.h"
#include "common/logging.h"
#include "worker/ipc/shm_segment.h"

namespace bitpush::worker::ipc {
namespace {

std::string DTypeText(uint32_t raw) {
  if (raw < static_cast<uint32_t>(kNumDTypes)) {
    return std::string(DTypeName(static_cast<DType>(raw)));
  }
  return fmt::format("dtype#{}", raw);
}

std::string VersionText(const v1::ProtocolVersion& v) {
  return fmt::format("{}.{}", v.major(), v.minor());
}

}  // namespace

Status SendLocalMessage(Channel& channel, const v1::LocalMessage& message) {
  std::string bytes;
  if (!message.SerializeToString(&bytes)) {
    return InternalError("cannot serialize a LocalMessage");
  }
  return channel.Send(bytes);
}

StatusOr<v1::LocalMessage> ReceiveLocalMessage(Channel& channel,
                                               std::chrono::milliseconds timeout) {
  BP_ASSIGN_OR_RETURN(std::string bytes, channel.Receive(timeout));
  v1::LocalMessage message;
  if (!message.ParseFromString(bytes)) {
    return DataLossError(fmt::format("a {}-byte frame from {} is not a LocalMessage", bytes.size(),
                                     channel.peer_name()));
  }
  if (message.body_case() == v1::LocalMessage::BODY_NOT_SET) {
    return DataLossError(fmt::format(
        "a {}-byte LocalMessage from {} has no body this version knows (local protocol {}.{})",
        bytes.size(), channel.peer_name(), kLocalProtocolMajor, kLocalProtocolMinor));
  }
  return message;
}

std::string DescribeLocalProcess(uint32_t local_rank, pid_t pid) {
  return fmt::format("local rank {} (pid {})", local_rank, pid);
}

v1::LocalHello MakeHello(uint32_t local_rank, uint32_t local_size) {
  v1::LocalHello h;
  h.mutable_version()->set_major(kLocalProtocolMajor);
  h.mutable_version()->set_minor(kLocalProtocolMinor);
  h.set_local_rank(local_rank);
  h.set_local_size(local_size);
  h.set_pid(static_cast<uint32_t>(getpid()));
  return h;
}

v1::LocalHelloReply JudgeHello(const v1::LocalHello& hello, pid_t peer_pid, uint32_t local_size,
                               const std::map<uint32_t, pid_t>& ranks) {
  v1::LocalHelloReply r;
  r.mutable_version()->set_major(kLocalProtocolMajor);
  r.mutable_version()->set_minor(kLocalProtocolMinor);
  std::string who = fmt::format("training process pid {}", peer_pid);
  if (hello.pid() != 0 && static_cast<pid_t>(hello.pid()) != peer_pid) {
    who += fmt::format(" (says pid {})", hello.pid());
  }
  auto refuse = [&](v1::LocalHelloReply::Refusal code, std::string reason) {
    r.set_refusal(code);
    r.set_reason(std::move(reason));
    return r;
  };
  if (hello.version().major() != kLocalProtocolMajor) {
    return refuse(
        v1::LocalHelloReply::REFUSAL_VERSION_MISMATCH,
        fmt::format("local protocol version mismatch: {} speaks {}, this bitpush-worker "
                    "speaks {}.{}",
                    who, VersionText(hello.version()), kLocalProtocolMajor, kLocalProtocolMinor));
  }
  if (hello.local_size() == 0 || (local_size != 0 && hello.local_size() != local_size)) {
    return refuse(
        v1::LocalHelloReply::REFUSAL_LOCAL_SIZE_MISMATCH,
        fmt::format("{} says the node runs {} training processes, but this "
                    "bitpush-worker serves {}",
                    who, hello.local_size(),
                    local_size == 0 ? std::string("at least 1") : std::to_string(local_size)));
  }
  if (hello.local_rank() >= hello.local_size()) {
    return refuse(v1::LocalHelloReply::REFUSAL_BAD_RANK,
                  fmt::format("{} asked for local rank {}, outside 0..{}", who, hello.local_rank(),
                              hello.local_size() - 1));
  }
  auto held = ranks.find(hello.local_rank());
  if (held != ranks.end()) {
    return refuse(v1::LocalHelloReply::REFUSAL_DUPLICATE_RANK,
                  fmt::format("{} asked for local rank {}, already held by {}", who,
                              hello.local_rank(), DescribeLocalProcess(held->first, held->second)));
  }
  return r;
}

Status HelloReplyStatus(const v1::LocalHelloReply& reply, uint32_t local_rank) {
  if (reply.refusal() == v1::LocalHelloReply::REFUSAL_NONE) return Status::Ok();
  return FailedPreconditionError(fmt::format("the bitpush-worker daemon refused local rank {}: {}",
                                             local_rank, reply.reason()));
}

std::string DescribeDeclaration(const v1::LocalDeclare& d) {
  return fmt::format("'{}' ({} x {}, priority {}, compression '{}', {}{})", d.name(), d.elements(),
                     DTypeText(d.dtype()), d.priority(), d.compression(),
                     d.sum() ? "sum" : "average", d.cuda() ? ", on a GPU" : "");
}

std::optional<std::string> DeclarationDifference(const v1::LocalDeclare& a, std::string_view who_a,
                                                 const v1::LocalDeclare& b,
                                                 std::string_view who_b) {
  const char* field = nullptr;
  if (a.index() != b.index()) {
    field = "index";
  } else if (a.name() != b.name()) {
    field = "name";
  } else if (a.elements() != b.elements()) {
    field = "elements";
  } else if (a.dtype() != b.dtype()) {
    field = "dtype";
  } else if (a.priority() != b.priority()) {
    field = "priority";
  } else if (a.compression() != b.compression()) {
    field = "compression";
  } else if (a.sum() != b.sum()) {
    field = "reduce op";
  } else if (a.cuda() != b.cuda()) {
    field = "device";
  }
  if (field == nullptr) return std::nullopt;
  return fmt::format("tensor #{} differs in {}: {} declared {} but {} declared {}", a.index(),
                     field, who_a, DescribeDeclaration(a), who_b, DescribeDeclaration(b));
}

Status ValidateSlice(const v1::ShmSlice& slice, pid_t peer_pid, uint64_t expected_bytes,
                     std::string_view what) {
  StatusOr<SegmentCreator> creator = ParseSegmentName(slice.segment());
  if (!creator.ok()) {
    return InvalidArgumentError(fmt::format("{}: {}", what, creator.status().message()));
  }
  if (creator->pid != peer_pid || creator->uid != getuid()) {
    return InvalidArgumentError(
        fmt::format("{}: segment {} belongs to pid {} uid {}, not to the sender (pid {} uid {})",
                    what, slice.segment(), creator->pid, creator->uid, peer_pid, getuid()));
  }
  if (slice.bytes() != expected_bytes) {
    return InvalidArgumentError(
        fmt::format("{}: {} bytes, the tensor has {}", what, slice.bytes(), expected_bytes));
  }
  if (slice.offset() > slice.segment_bytes() ||
      slice.bytes() > slice.segment_bytes() - slice.offset()) {
    return InvalidArgumentError(fmt::format("{}: bytes [{}, +{}) outside segment {} of {} bytes",
                                            what, slice.offset(), slice.bytes(), slice.segment(),
                                            slice.segment_bytes()));
  }
  return Status::Ok();
}

}  // namespace bitpush::worker::ipc
