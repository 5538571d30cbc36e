// The local protocol between training processes and the node's bitpush-worker daemon
// (proto/bitpush/v1/local.proto, docs/local-ipc.md): its version, sending and receiving one
// LocalMessage per Channel frame, and the pure checks both sides apply — the daemon's verdict
// on a LocalHello, the first difference between two local processes' declarations, and the
// validation of a shared-memory slice named by a client.
//
// Ownership: functions only; the Channel is the caller's.
// Thread-safety: pure functions; SendLocalMessage/ReceiveLocalMessage follow Channel's rules.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "proto/bitpush/v1/local.pb.h"
#include "worker/ipc/channel.h"

namespace bitpush::worker::ipc {

inline constexpr uint32_t kLocalProtocolMajor = 1;
// Minor versions: 1 LocalBarrier; 2 GPU tensors; 3 LocalErrorFeedback; 4 LocalOptimizerSpan and
// LocalHelloReply.tracing; 5 LocalErrorFeedback's `state` (the servers' residual and the
// rounds); 6 LocalBarrier's wait_for_servers. A client checks the daemon's minor before sending
// a message or field it added (kLocalMinorErrorFeedback, kLocalMinorOptimizerSpan,
// kLocalMinorJobState, kLocalMinorWaitForServers).
inline constexpr uint32_t kLocalProtocolMinor = 6;
inline constexpr uint32_t kLocalMinorErrorFeedback = 3;
inline constexpr uint32_t kLocalMinorOptimizerSpan = 4;
inline constexpr uint32_t kLocalMinorJobState = 5;
inline constexpr uint32_t kLocalMinorWaitForServers = 6;

// Serializes `message` into one frame.
Status SendLocalMessage(Channel& channel, const v1::LocalMessage& message);
// Receives one frame and parses it: DataLoss naming the peer when the bytes are not a
// LocalMessage or carry no body (a newer peer's message type: docs/local-ipc.md).
StatusOr<v1::LocalMessage> ReceiveLocalMessage(Channel& channel, std::chrono::milliseconds timeout);

// "local rank 2 (pid 1234)".
std::string DescribeLocalProcess(uint32_t local_rank, pid_t pid);

// The Hello a client sends (this build's version, getpid()).
v1::LocalHello MakeHello(uint32_t local_rank, uint32_t local_size);

// The daemon's verdict on `hello` from the process with kernel-reported pid `peer_pid`.
// `local_size`: what the node runs (0 = not known yet: the first accepted Hello sets it);
// `ranks`: the local ranks held by live connections and their pids. Refusals, checked in this
// order: major version, local_size, rank range, duplicate rank; the reason names both sides.
// Only `refusal`, `reason` and `version` are set; the daemon fills in the rest.
v1::LocalHelloReply JudgeHello(const v1::LocalHello& hello, pid_t peer_pid, uint32_t local_size,
                               const std::map<uint32_t, pid_t>& ranks);

// The client's view of a reply: OK, or FailedPrecondition "the bitpush-worker daemon refused
// local rank R: <reason>".
Status HelloReplyStatus(const v1::LocalHelloReply& reply, uint32_t local_rank);

// "'fc.weight' (4096 x float32, priority 0, compression 'onebit', average)".
std::string DescribeDeclaration(const v1::LocalDeclare& d);

// nullopt when `a` (declared by `who_a`) and `b` (by `who_b`) agree on every field; otherwise
// the first difference, e.g. "tensor #3 differs in elements: local rank 0 (pid 11) declared
// 'fc' (4096 x float32, ...) but local rank 1 (pid 12) declared 'fc' (4095 x float32, ...)".
std::optional<std::string> DeclarationDifference(const v1::LocalDeclare& a, std::string_view who_a,
                                                 const v1::LocalDeclare& b, std::string_view who_b);

// Checks a slice a client named: the segment was created by `peer_pid` of this user (its
// name, shm_segment.h), offset + bytes fit segment_bytes without overflow, and bytes equals
// `expected_bytes` (the tensor's size). InvalidArgument naming the field otherwise.
Status ValidateSlice(const v1::ShmSlice& slice, pid_t peer_pid, uint64_t expected_bytes,
                     std::string_view what);

}  // namespace bitpush::worker::ipc
