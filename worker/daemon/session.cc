// The daemon's session: accepting training processes, reading their messages, the Hello
// handshake, dispatching each message to its piece, recording their optimizer spans, and
// dropping a connection. Poll loop.
// (Members of worker::Daemon, worker/daemon.h; the shared state is worker/daemon/daemon_state.h.)
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "common/logging.h"
#include "common/trace/recorder.h"
#include "common/vector_ops.h"
#include "worker/daemon.h"
#include "worker/daemon/daemon_state.h"
#include "worker/ipc/local_protocol.h"

namespace bitpush::worker {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

}  // namespace

void Daemon::AcceptOne() {
  StatusOr<std::unique_ptr<ipc::Channel>> ch = listener_->Accept(milliseconds(0));
  if (!ch.ok()) {
    const uint64_t refused = listener_->refused();
    if (refused != refused_connections_.load(std::memory_order_relaxed)) {
      // A peer of another user: counted always, logged at most once per interval (anyone may
      // knock at the socket as often as they like).
      refused_connections_.store(refused, std::memory_order_relaxed);
      const Clock::time_point now = Clock::now();
      if (last_refusal_log_ == Clock::time_point{} ||
          now - last_refusal_log_ >= kRefusalLogInterval) {
        last_refusal_log_ = now;
        BP_LOG_WARN("{}: {} ({} connection(s) of other users refused so far)", label_,
                    ch.status().message(), refused);
      }
      return;
    }
    if (ch.status().code() != StatusCode::kTimeout) {
      BP_LOG_WARN("{}: {}", label_, ch.status().ToString());
    }
    return;
  }
  auto c = std::make_unique<Conn>();
  c->channel = std::shared_ptr<ipc::Channel>(std::move(ch).value());
  c->pid = c->channel->peer().pid;
  c->who = fmt::format("pid {}", c->pid);
  conns_.push_back(std::move(c));
}

void Daemon::ReadFrom(Conn& c) {
  for (;;) {
    StatusOr<v1::LocalMessage> m = ipc::ReceiveLocalMessage(*c.channel, milliseconds(0));
    Status s = m.ok() ? Handle(c, *m) : m.status();
    if (m.status().code() == StatusCode::kTimeout) return;  // drained
    if (s.ok()) {
      if (ended_ || c.dead) return;
      continue;
    }
    if (!c.hello || c.goodbye || !decl_error_.ok()) {
      // Refused, never introduced itself, left cleanly, or left a node whose declarations
      // already failed (it was told why; its siblings are told on their own).
      DropConn(c);
      return;
    }
    if (Status cluster = ClusterFailure(); !cluster.ok()) {
      // The cluster ended first and the process left because of it: the cluster is the cause.
      FailNode(cluster, &c);
      return;
    }
    FailNode(UnavailableError(
                 fmt::format("{}: training process {} failed: {}", label_, c.who, s.message())),
             &c);
    return;
  }
}

Status Daemon::Handle(Conn& c, const v1::LocalMessage& m) {
  if (m.has_hello()) {
    if (c.hello) return InvalidArgumentError(fmt::format("{} sent a second Hello", c.who));
    OnHello(c, m.hello());
    return Status::Ok();
  }
  if (!c.hello) {
    return InvalidArgumentError(fmt::format("{} sent a message before its Hello", c.who));
  }
  if (m.has_declare()) {
    if (m.declare().index() != c.next_decl) {
      return InvalidArgumentError(fmt::format("{} declared tensor #{} but #{} was next", c.who,
                                              m.declare().index(), c.next_decl));
    }
    ++c.next_decl;
    OnDeclare(c, m.declare());
    return Status::Ok();
  }
  if (m.has_push_pull()) {
    OnPushPull(c, m.push_pull());
    return Status::Ok();
  }
  if (m.has_error_feedback()) {
    OnErrorFeedback(c, m.error_feedback());
    return Status::Ok();
  }
  if (m.has_barrier()) {
    if (m.barrier().seq() != c.next_barrier) {
      return InvalidArgumentError(fmt::format("{} entered barrier {} but {} was next", c.who,
                                              m.barrier().seq(), c.next_barrier));
    }
    ++c.next_barrier;
    std::optional<milliseconds> wait;
    if (m.barrier().wait_for_servers()) {
      // Bounded like any wait here: a timeout beyond a day is taken as a day.
      constexpr uint64_t kMaxWaitMs = 86400000;
      wait = milliseconds(std::min(m.barrier().wait_timeout_ms(), kMaxWaitMs));
    }
    barrier_->Enter(c.channel, c.who, m.barrier().seq(), local_size_, wait);
    return Status::Ok();
  }
  if (m.has_optimizer_span()) {
    OnOptimizerSpan(c, m.optimizer_span());
    return Status::Ok();
  }
  if (m.has_goodbye()) {
    c.goodbye = true;
    ++goodbyes_;
    return Status::Ok();
  }
  return InvalidArgumentError(
      fmt::format("{} sent a message a training process never sends", c.who));
}

void Daemon::OnHello(Conn& c, const v1::LocalHello& h) {
  // Before the reply: every span the process reports starts after it read the reply.
  c.hello_ns = trace::NowNs();
  std::map<uint32_t, pid_t> ranks;
  for (const auto& o : conns_) {
    if (o->hello && !o->dead) ranks[o->local_rank] = o->pid;
  }
  v1::LocalHelloReply reply = ipc::JudgeHello(h, c.pid, local_size_, ranks);
  if (reply.refusal() == v1::LocalHelloReply::REFUSAL_NONE && ended_) {
    reply.set_refusal(v1::LocalHelloReply::REFUSAL_SHUTTING_DOWN);
    reply.set_reason(fmt::format("{} is shutting down", label_));
  }
  reply.set_node_rank(options_.rank);
  reply.set_num_nodes(static_cast<uint32_t>(options_.cluster.workers.size()));
  reply.set_op_timeout_ms(static_cast<uint64_t>(options_.cluster.worker.op_timeout.count()));
  reply.set_tracing(engine_->trace() != nullptr);
  v1::LocalMessage m;
  *m.mutable_hello_reply() = reply;
  const Status sent = ipc::SendLocalMessage(*c.channel, m);
  if (reply.refusal() != v1::LocalHelloReply::REFUSAL_NONE || !sent.ok()) {
    BP_LOG_WARN("{}: refused {}: {}", label_, c.who, reply.reason());
    DropConn(c);
    return;
  }
  if (local_size_ == 0) local_size_ = h.local_size();
  c.hello = true;
  c.local_rank = h.local_rank();
  joined_.insert(c.local_rank);
  c.who = ipc::DescribeLocalProcess(c.local_rank, c.pid);
  c.channel->set_peer_name(c.who);
  BP_LOG_INFO("{}: {} joined ({} of {})", label_, c.who, ranks.size() + 1, local_size_);
}

void Daemon::OnOptimizerSpan(Conn& c, const v1::LocalOptimizerSpan& s) {
  // Tracing off: a client is told so in the HelloReply and sends none; a stray one is ignored.
  if (engine_->trace() == nullptr) return;
  // Same host, same clock (CLOCK_MONOTONIC): the step began after the process read the reply
  // to its Hello, and ended before this frame was read. Only comparisons: no value can
  // overflow here, and the recorder's end - start is then between 0 and the daemon's uptime.
  const int64_t now = trace::NowNs();
  if (s.start_ns() < c.hello_ns || s.end_ns() < s.start_ns() || s.end_ns() > now) {
    if (!c.span_warned) {
      c.span_warned = true;
      BP_LOG_WARN(
          "{}: dropped an optimizer span of {}: {} .. {} ns is not between its Hello ({} ns) and "
          "now ({} ns) on this host's monotonic clock (a bad value, or a process in another "
          "time namespace); its later bad spans are dropped without a word",
          label_, c.who, s.start_ns(), s.end_ns(), c.hello_ns, now);
    }
    return;
  }
  engine_->TraceStep(trace::SpanKind::kOptimizer, s.start_ns(), s.end_ns(),
                     static_cast<int32_t>(c.local_rank));
}

void Daemon::DropConn(Conn& c) {
  c.dead = true;
  c.channel->Shutdown();
}

}  // namespace bitpush::worker
