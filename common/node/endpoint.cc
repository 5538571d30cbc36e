#include "common/node/endpoint.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <utility>

#include "common/logging.h"
#include "common/node/authorization.h"

namespace bitpush::node {

namespace {

using std::chrono::milliseconds;

size_t Index(Plane p) {
  return p == Plane::kControl ? 0 : 1;
}

std::string DefaultLabel(const NodeIdentity& self) {
  if (self.role == v1::ROLE_SCHEDULER) return "scheduler";
  return fmt::format("{} {}", RoleName(self.role), self.rank);
}

std::string PeerIdOf(const NodeIdentity& self) {
  return self.role == v1::ROLE_SCHEDULER ? std::string(kSchedulerPeerId)
                                         : NodePeerId(self.role, self.rank);
}

}  // namespace

std::string_view PlaneName(Plane plane) {
  return plane == Plane::kControl ? "control" : "data";
}

StatusOr<std::unique_ptr<NodeEndpoint>> NodeEndpoint::Create(
    NodeEndpointOptions options, std::unique_ptr<transport::Transport> transport,
    std::unique_ptr<transport::Transport> data_transport) {
  const NodeIdentity& self = options.self;
  if (self.role != v1::ROLE_SCHEDULER && self.role != v1::ROLE_SERVER &&
      self.role != v1::ROLE_WORKER) {
    return InvalidArgumentError(
        "NodeEndpointOptions::self needs a role (scheduler, server or "
        "worker)");
  }
  if (options.idle_wait.count() <= 0) {
    return InvalidArgumentError("NodeEndpointOptions::idle_wait must be > 0");
  }
  const std::string name = PeerIdOf(self);
  // Both transports of a node: its name, security and limits; the address (and backend) differ.
  auto transport_options = [&](const std::string& listen_address) {
    transport::TransportOptions t;
    t.name = name;
    t.listen_address = listen_address;
    t.inproc_hub = options.inproc_hub;
    t.security = options.security;
    t.max_message_bytes = options.max_message_bytes;
    t.max_connections = options.max_connections;
    return t;
  };
  if (data_transport != nullptr) {
    if (self.role == v1::ROLE_SCHEDULER) {
      return InvalidArgumentError("an injected data transport: the scheduler has no data plane");
    }
    if (data_transport->name() != name) {
      return InvalidArgumentError(
          fmt::format("the injected data transport is named '{}', but this node's PeerId is '{}'",
                      data_transport->name(), name));
    }
  } else if (!options.data_listen_address.empty()) {
    if (self.role == v1::ROLE_SCHEDULER) {
      return InvalidArgumentError(
          "NodeEndpointOptions::data_listen_address: the scheduler has no data plane");
    }
    transport::TransportOptions t = transport_options(options.data_listen_address);
    t.ucx_config = options.data_ucx_config;
    StatusOr<std::unique_ptr<transport::Transport>> made = transport::CreateTransport(t);
    if (!made.ok()) {
      return made.status().WithContext(fmt::format(
          "{}: cannot listen for the data plane at {}",
          options.label.empty() ? DefaultLabel(self) : options.label, options.data_listen_address));
    }
    data_transport = std::move(made).value();
  }
  if (transport == nullptr) {
    transport::TransportOptions t = transport_options(options.listen_address);
    t.backend = options.backend;
    BP_ASSIGN_OR_RETURN(transport, transport::CreateTransport(t));
  } else if (transport->name() != name) {
    return InvalidArgumentError(
        fmt::format("the injected transport is named '{}', but this node's PeerId is '{}'",
                    transport->name(), name));
  }
  return std::unique_ptr<NodeEndpoint>(
      new NodeEndpoint(std::move(options), std::move(transport), std::move(data_transport)));
}

NodeEndpoint::NodeEndpoint(NodeEndpointOptions options,
                           std::unique_ptr<transport::Transport> transport,
                           std::unique_ptr<transport::Transport> data_transport)
    : options_(std::move(options)),
      label_(options_.label.empty() ? DefaultLabel(options_.self) : options_.label),
      clock_(options_.clock ? options_.clock : SystemClock()),
      transport_(std::move(transport)),
      data_transport_(std::move(data_transport)) {}

NodeEndpoint::~NodeEndpoint() {
  Close();
}

const transport::PeerId& NodeEndpoint::name() const {
  return transport_->name();
}

std::string NodeEndpoint::address() const {
  return transport_->address();
}

std::string NodeEndpoint::data_address() const {
  return data_transport_ ? data_transport_->address() : std::string();
}

// ---- registration ----

void NodeEndpoint::OnControl(v1::ControlMessage::BodyCase kind, ControlHandler handler) {
  const MessageRule* rule = FindControlRule(options_.self.role, kind);
  BP_CHECK(rule != nullptr, "NodeEndpoint: no authorization rule for control message {} at a {}",
           static_cast<int>(kind), RoleName(options_.self.role));
  OnControl(kind, rule->senders, std::move(handler));
}

void NodeEndpoint::OnData(v1::DataHeader::Op op, DataHandler handler) {
  const MessageRule* rule = FindDataRule(options_.self.role, op);
  BP_CHECK(rule != nullptr, "NodeEndpoint: no authorization rule for data op {} at a {}",
           v1::DataHeader::Op_Name(op), RoleName(options_.self.role));
  OnData(op, rule->senders, std::move(handler));
}

void NodeEndpoint::OnControl(v1::ControlMessage::BodyCase kind, RoleSet senders,
                             ControlHandler handler) {
  BP_CHECK(!started_, "NodeEndpoint: handlers are registered before the loop starts");
  const bool fresh =
      control_routes_.emplace(static_cast<int>(kind), ControlRoute{senders, std::move(handler)})
          .second;
  BP_CHECK(fresh, "NodeEndpoint: two handlers for one control message type");
}

void NodeEndpoint::OnData(v1::DataHeader::Op op, RoleSet senders, DataHandler handler) {
  BP_CHECK(!started_, "NodeEndpoint: handlers are registered before the loop starts");
  const bool fresh =
      data_routes_.emplace(static_cast<int>(op), DataRoute{senders, std::move(handler)}).second;
  BP_CHECK(fresh, "NodeEndpoint: two handlers for one data op");
}

void NodeEndpoint::OnUnhandledControl(ControlHandler handler) {
  BP_CHECK(!started_, "NodeEndpoint: handlers are registered before the loop starts");
  unhandled_control_ = std::move(handler);
}

void NodeEndpoint::OnUnhandledData(DataHandler handler) {
  BP_CHECK(!started_, "NodeEndpoint: handlers are registered before the loop starts");
  unhandled_data_ = std::move(handler);
}

void NodeEndpoint::OnRejected(Plane plane, RejectHandler handler) {
  BP_CHECK(!started_, "NodeEndpoint: handlers are registered before the loop starts");
  rejected_[Index(plane)] = std::move(handler);
}

void NodeEndpoint::OnEvent(Plane plane, EventHandler handler) {
  BP_CHECK(!started_, "NodeEndpoint: handlers are registered before the loop starts");
  events_[Index(plane)] = std::move(handler);
}

void NodeEndpoint::AddTimer(Timer timer) {
  BP_CHECK(!started_, "NodeEndpoint: timers are registered before the loop starts");
  timers_.push_back(std::move(timer));
}

void NodeEndpoint::OnFailure(FailureHandler handler) {
  BP_CHECK(!started_, "NodeEndpoint: handlers are registered before the loop starts");
  failure_handlers_.push_back(std::move(handler));
}

void NodeEndpoint::HoldPlane(Plane plane) {
  std::lock_guard<std::mutex> lock(dispatch_mu_);
  held_[Index(plane)] = true;
}

// ---- the loop ----

void NodeEndpoint::Start() {
  BP_CHECK(!started_.exchange(true), "NodeEndpoint::Start called twice");
  StartDataLoop();
  io_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "bp-io");
    Loop();
  });
}

void NodeEndpoint::StartDataLoop() {
  if (data_transport_ == nullptr) return;
  std::lock_guard<std::mutex> lock(data_thread_mu_);
  if (data_loop_started_ || closed_.load()) return;
  data_loop_started_ = true;
  data_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "bp-io-data");
    DataLoop();
  });
}

void NodeEndpoint::DataLoop() {
  while (!closed_.load()) {
    StatusOr<transport::Received> r = data_transport_->Receive(options_.idle_wait);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kTimeout || closed_.load()) continue;
      const Status failure = r.status().WithContext(
          fmt::format("{}: the data transport at {} failed", label_, data_transport_->address()));
      std::lock_guard<std::mutex> lock(dispatch_mu_);
      FailLocked(failure);
      return;
    }
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    DispatchLocked(*r, /*on_data=*/true);
  }
}

void NodeEndpoint::FailLocked(const Status& failure) {
  if (failed_) return;
  failed_ = true;
  for (const FailureHandler& f : failure_handlers_) f(failure);
}

void NodeEndpoint::Loop() {
  while (!closed_.load()) {
    milliseconds wait;
    {
      std::lock_guard<std::mutex> lock(dispatch_mu_);
      const Clock::time_point now = clock_->Now();
      Clock::time_point wake = now + options_.idle_wait;
      for (const Timer& t : timers_) wake = std::min(wake, t(now));
      // Rounded up, so a timer is never woken a little early (and asked again at once).
      wait = std::max(milliseconds(1), std::chrono::ceil<milliseconds>(wake - now));
    }
    Status s = Poll(clock_->BlockFor(wait));
    if (s.ok() || closed_.load()) continue;
    const Status failure = s.WithContext(label_ + ": endpoint failed");
    std::lock_guard<std::mutex> lock(dispatch_mu_);
    FailLocked(failure);
    return;
  }
}

Status NodeEndpoint::Poll(milliseconds timeout) {
  started_.store(true);
  StartDataLoop();
  StatusOr<transport::Received> r = transport_->Receive(timeout);
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kTimeout) return Status::Ok();
    return r.status();
  }
  std::lock_guard<std::mutex> lock(dispatch_mu_);
  DispatchLocked(*r);
  return Status::Ok();
}

void NodeEndpoint::ReleasePlane(Plane plane) {
  std::lock_guard<std::mutex> lock(dispatch_mu_);
  const size_t i = Index(plane);
  held_[i] = false;
  std::deque<transport::Received> held = std::move(held_msgs_[i]);
  held_msgs_[i].clear();
  // Held messages passed the plane check when they arrived: a data-plane message came on the
  // data transport when there is one. Re-dispatched as such (not as the main transport's,
  // which would refuse a worker's held declaration as misrouted).
  const bool on_data = plane == Plane::kData && data_transport_ != nullptr;
  for (transport::Received& r : held) DispatchLocked(r, on_data);
}

Plane NodeEndpoint::PlaneOf(const Sender& sender) const {
  if (options_.self.role == v1::ROLE_SCHEDULER || sender.Is(v1::ROLE_SCHEDULER)) {
    return Plane::kControl;
  }
  return Plane::kData;
}

transport::Transport& NodeEndpoint::TransportFor(const transport::PeerId& peer) const {
  if (data_transport_ == nullptr) return *transport_;
  const std::optional<NodeIdentity> node = ParseNodePeerId(peer);
  const bool data_peer =
      node.has_value() && (node->role == v1::ROLE_SERVER || node->role == v1::ROLE_WORKER);
  return data_peer ? *data_transport_ : *transport_;
}

bool NodeEndpoint::May(RoleSet senders, const Sender& sender) {
  return senders.Contains(sender.node ? sender.node->role : v1::ROLE_UNSPECIFIED);
}

void NodeEndpoint::DispatchLocked(transport::Received& received, bool on_data) {
  Sender sender;
  sender.peer = received.is_message() ? received.from : received.event().peer;
  if (sender.peer.empty()) sender.peer = received.from;
  sender.node = ParseNodePeerId(sender.peer);
  const Plane plane = PlaneOf(sender);
  const size_t i = Index(plane);
  // The data transport carries worker <-> server messages only, and a node that has one takes
  // them there only (the peers of its cluster all have one: the scheduler admits none without
  // its data address); the control plane (and the scheduler) use the main transport. A message
  // on the other plane's transport is refused and counted (events are not refused).
  const bool misrouted =
      on_data ? plane == Plane::kControl : data_transport_ != nullptr && plane == Plane::kData;
  if (misrouted && !received.is_message()) {
    if (on_data) {
      BP_LOG_DEBUG("{}: data transport event about '{}' ignored", label_, sender.peer);
      return;
    }
  } else if (misrouted) {
    ++refused_;
    uint64_t suppressed = 0;
    const std::string came_on = on_data ? "data" : "main";
    if (reject_limiter_.Allow(sender.peer + "/" + came_on + "-transport", &suppressed)) {
      BP_LOG_WARN(
          "{}: refused a {}-plane message from '{}' on the {} transport at {} (the {} plane "
          "uses {}; {} more since the last report)",
          label_, PlaneName(plane), sender.peer, came_on,
          (on_data ? data_transport_ : transport_)->address(), PlaneName(plane),
          (on_data ? transport_ : data_transport_)->address(), suppressed);
    }
    return;
  }
  if (held_[i]) {
    held_msgs_[i].push_back(std::move(received));
    return;
  }
  if (!received.is_message()) {
    ++events_count_;
    const transport::TransportEvent& ev = received.event();
    if (events_[i]) {
      events_[i](sender, ev);
    } else {
      BP_LOG_DEBUG("{}: transport event about '{}': {}", label_, sender.peer,
                   ev.status.ok() ? std::string("connected") : ev.status.ToString());
    }
    return;
  }
  if (plane == Plane::kControl) {
    DispatchControlLocked(sender, received.message());
  } else {
    DispatchDataLocked(sender, received.message());
  }
}

void NodeEndpoint::DispatchControlLocked(const Sender& sender, transport::Message& message) {
  v1::ControlMessage msg;
  if (!msg.ParseFromString(message.header)) {
    ++malformed_;
    RejectLocked(Plane::kControl, sender, message, Rejection::kMalformed, "control message");
    return;
  }
  auto it = control_routes_.find(static_cast<int>(msg.body_case()));
  if (it == control_routes_.end()) {
    ++unhandled_;
    if (unhandled_control_) {
      unhandled_control_(sender, msg);
    } else {
      uint64_t suppressed = 0;
      if (reject_limiter_.Allow(sender.peer + "/unhandled", &suppressed)) {
        BP_LOG_WARN(
            "{}: unexpected control message (case {}) from '{}' ({} more since the last report)",
            label_, static_cast<int>(msg.body_case()), sender.peer, suppressed);
      }
    }
    return;
  }
  if (!May(it->second.senders, sender)) {
    ++refused_;
    RejectLocked(Plane::kControl, sender, message, Rejection::kRefusedSender,
                 fmt::format("control message (case {})", static_cast<int>(msg.body_case())));
    return;
  }
  ++dispatched_;
  it->second.handler(sender, msg);
}

void NodeEndpoint::DispatchDataLocked(const Sender& sender, transport::Message& message) {
  v1::DataHeader header;
  if (!header.ParseFromString(message.header)) {
    ++malformed_;
    RejectLocked(Plane::kData, sender, message, Rejection::kMalformed, "data message");
    return;
  }
  auto it = data_routes_.find(static_cast<int>(header.op()));
  if (it == data_routes_.end()) {
    ++unhandled_;
    if (unhandled_data_) {
      unhandled_data_(sender, header, message);
    } else {
      uint64_t suppressed = 0;
      if (reject_limiter_.Allow(sender.peer + "/unhandled", &suppressed)) {
        BP_LOG_WARN(
            "{}: dropped an unexpected data message (op {}) from '{}' ({} more since the last "
            "report)",
            label_, static_cast<int>(header.op()), sender.peer, suppressed);
      }
    }
    return;
  }
  if (!May(it->second.senders, sender)) {
    ++refused_;
    RejectLocked(Plane::kData, sender, message, Rejection::kRefusedSender,
                 fmt::format("data message {}", v1::DataHeader::Op_Name(header.op())));
    return;
  }
  ++dispatched_;
  it->second.handler(sender, header, message);
}

void NodeEndpoint::RejectLocked(Plane plane, const Sender& sender,
                                const transport::Message& message, Rejection why,
                                std::string_view detail) {
  // Counted always (stats), reported at most once per interval per sender and reason.
  uint64_t suppressed = 0;
  if (!reject_limiter_.Allow(fmt::format("{}/{}/{}", sender.peer, Index(plane),
                                         why == Rejection::kMalformed ? "m" : "r"),
                             &suppressed)) {
    return;
  }
  if (const RejectHandler& h = rejected_[Index(plane)]) {
    h(sender, message, why, detail);
    return;
  }
  if (why == Rejection::kMalformed) {
    BP_LOG_WARN("{}: dropped a malformed {} from '{}'", label_, detail, sender.peer);
  } else {
    BP_LOG_WARN("{}: dropped a {} from '{}', which may not send it", label_, detail, sender.peer);
  }
}

// ---- sending ----

Status NodeEndpoint::Connect(const transport::PeerId& peer, const std::string& address) {
  return TransportFor(peer).Connect(peer, address);
}

Status NodeEndpoint::Connect(const transport::PeerId& peer, const std::string& address,
                             const transport::PeerId& key_owner) {
  return TransportFor(peer).Connect(peer, address, key_owner);
}

void NodeEndpoint::Disconnect(const transport::PeerId& peer) {
  TransportFor(peer).Disconnect(peer);
}

Status NodeEndpoint::Send(const transport::PeerId& peer, transport::Message message) {
  return TransportFor(peer).Send(peer, std::move(message));
}

Status NodeEndpoint::SendControl(const transport::PeerId& peer, const v1::ControlMessage& message) {
  transport::Message m;
  if (!message.SerializeToString(&m.header)) {
    return InternalError("cannot serialize a control message");
  }
  return TransportFor(peer).Send(peer, std::move(m));
}

Status NodeEndpoint::SendData(const transport::PeerId& peer, const v1::DataHeader& header,
                              std::vector<transport::Buffer> frames) {
  transport::Message m;
  if (!header.SerializeToString(&m.header)) return InternalError("cannot serialize a data header");
  m.frames = std::move(frames);
  return TransportFor(peer).Send(peer, std::move(m));
}

void NodeEndpoint::Close() {
  if (closed_.exchange(true)) return;
  transport_->Close();
  if (data_transport_) data_transport_->Close();
  // Closed from a handler: that loop ends when the handler returns.
  auto join = [](std::thread& t) {
    if (!t.joinable()) return;
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();
    } else {
      t.join();
    }
  };
  join(io_thread_);
  std::lock_guard<std::mutex> lock(data_thread_mu_);
  join(data_thread_);
}

EndpointStats NodeEndpoint::stats() const {
  EndpointStats s;
  s.dispatched = dispatched_.load();
  s.unhandled = unhandled_.load();
  s.refused = refused_.load();
  s.malformed = malformed_.load();
  s.events = events_count_.load();
  s.transport = transport_->stats();
  if (data_transport_) s.data_transport = data_transport_->stats();
  return s;
}

}  // namespace bitpush::node
