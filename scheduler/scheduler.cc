#include "scheduler/scheduler.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"
#include "common/node/identity.h"
#include "common/trace/recorder.h"
#include "common/transport/protocol.h"
#include "config/key_mapping.h"
#include "config/node_security.h"
#include "fmt/format.h"

namespace bitpush::scheduler {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

// Longest single wait of the event loop: bounds how late Stop() is noticed.
constexpr milliseconds kMaxLoopWait{50};

// Refusals are answered through a private peer name: "refused:<name>#<incarnation>".
constexpr char kRefusedAliasPrefix[] = "refused:";

int64_t Ms(std::chrono::steady_clock::duration d) {
  return duration_cast<milliseconds>(d).count();
}

// Compares without an early exit, so the time taken does not reveal how much of a guessed
// token was right.
bool TokensEqual(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace

StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    SchedulerOptions options, std::unique_ptr<transport::Transport> transport) {
  BP_RETURN_IF_ERROR(config::ValidateClusterConfig(options.cluster));
  if (options.shutdown_ack_timeout.count() < 0) {
    return InvalidArgumentError("SchedulerOptions::shutdown_ack_timeout is negative");
  }
  if (transport != nullptr && transport->name() != node::kSchedulerPeerId) {
    return InvalidArgumentError(
        fmt::format("scheduler: the injected transport is named '{}', "
                    "not '{}'",
                    transport->name(), node::kSchedulerPeerId));
  }
  const bool injected = transport != nullptr;
  node::NodeEndpointOptions e;
  e.self = node::NodeIdentity{v1::ROLE_SCHEDULER, 0};
  e.listen_address = options.cluster.scheduler_address;
  e.backend = options.cluster.transport;
  e.inproc_hub = options.inproc_hub;
  BP_RETURN_IF_ERROR(config::ConfigureNodeEndpoint(options.cluster, &e));
  e.clock = options.clock;
  StatusOr<std::unique_ptr<node::NodeEndpoint>> endpoint =
      node::NodeEndpoint::Create(std::move(e), std::move(transport));
  if (!endpoint.ok()) {
    if (injected) return endpoint.status();
    return endpoint.status().WithContext(
        fmt::format("scheduler: cannot listen at {}", options.cluster.scheduler_address));
  }
  if (std::string warning = config::InsecureModeWarning(options.cluster); !warning.empty()) {
    BP_LOG_WARN("scheduler: {}", warning);
  }
  if (options.cluster.security.mode == config::SecurityMode::kCurve &&
      options.cluster.transport != "inproc") {
    BP_LOG_INFO(
        "scheduler: security.mode curve: every connection is authenticated and encrypted "
        "with the keys of {} nodes",
        options.cluster.num_nodes() + 1);
  }
  std::unique_ptr<Scheduler> s(new Scheduler(std::move(options), std::move(endpoint).value()));
  s->RegisterHandlers();
  return s;
}

Scheduler::Scheduler(SchedulerOptions options, std::unique_ptr<node::NodeEndpoint> endpoint)
    : options_(std::move(options)),
      cluster_(options_.cluster),
      clock_(options_.clock ? options_.clock : SystemClock()),
      endpoint_(std::move(endpoint)) {
  config_fields_ = config::ConfigFields(cluster_);
  config_hash_ = config::ConfigHash(config_fields_);
  for (v1::Role role : {v1::ROLE_SERVER, v1::ROLE_WORKER}) {
    const auto& list = role == v1::ROLE_SERVER ? cluster_.servers : cluster_.workers;
    for (uint32_t rank = 0; rank < list.size(); ++rank) {
      Slot s;
      s.role = role;
      s.rank = rank;
      s.name = node::NodePeerId(role, rank);
      s.address = list[rank];
      s.data_address = cluster_.DataAddress(role, rank);
      slot_by_name_[s.name] = slots_.size();
      slots_.push_back(std::move(s));
    }
  }
  for (v1::Group g : {v1::GROUP_WORKERS, v1::GROUP_SERVERS, v1::GROUP_ALL}) {
    barriers_[g].arrived.assign(slots_.size(), false);
  }
}

Scheduler::~Scheduler() {
  if (endpoint_) endpoint_->Close();
}

std::string Scheduler::address() const {
  return endpoint_->address();
}

void Scheduler::Stop() {
  stop_requested_.store(true);
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.nodes_expected = cluster_.servers.size() + cluster_.workers.size();
  s.nodes_registered = stat_registered_.load(std::memory_order_relaxed);
  s.nodes_dead = stat_dead_.load(std::memory_order_relaxed);
  s.workers_done = stat_done_.load(std::memory_order_relaxed);
  s.registrations_refused = stat_refused_.load(std::memory_order_relaxed);
  s.barriers_released = stat_barriers_.load(std::memory_order_relaxed);
  s.heartbeat_rounds = stat_heartbeats_.load(std::memory_order_relaxed);
  s.endpoint = endpoint_->stats();
  return s;
}

Status Scheduler::SendTo(const std::string& peer, const v1::ControlMessage& msg) {
  return endpoint_->SendControl(peer, msg);
}

Scheduler::Slot* Scheduler::FindSlot(const std::string& peer) {
  auto it = slot_by_name_.find(peer);
  return it == slot_by_name_.end() ? nullptr : &slots_[it->second];
}

v1::NodeInfo Scheduler::InfoOf(const Slot& slot) const {
  v1::NodeInfo n;
  n.set_role(slot.role);
  n.set_rank(slot.rank);
  n.set_address(slot.address);
  n.set_data_address(slot.data_address);
  n.set_name(slot.name);
  return n;
}

bool Scheduler::IsMember(const Slot& slot, v1::Group group) const {
  switch (group) {
    case v1::GROUP_WORKERS: return slot.role == v1::ROLE_WORKER;
    case v1::GROUP_SERVERS: return slot.role == v1::ROLE_SERVER;
    case v1::GROUP_ALL: return true;
    default: return false;
  }
}

Status Scheduler::Run() {
  BP_CHECK(!ran_, "Scheduler::Run called twice");
  ran_ = true;
  start_ = clock_->Now();
  BP_LOG_INFO("bitpush-scheduler {}.{} listening at {}; effective config:\n{}", kProtocolMajor,
              kProtocolMinor, endpoint_->address(), config::DescribeClusterConfig(cluster_));
  BP_LOG_INFO("waiting up to {} ms for {} servers and {} workers", cluster_.startup_timeout.count(),
              cluster_.servers.size(), cluster_.workers.size());
  time_point next_heartbeat = start_ + cluster_.heartbeat_interval;

  while (!finished_) {
    if (stop_requested_.load()) {
      BP_LOG_WARN("scheduler interrupted: shutting the cluster down");
      ShutdownNodes("scheduler interrupted");
      return CancelledError("scheduler interrupted");
    }
    time_point now = clock_->Now();
    if (now >= next_heartbeat) {
      SendHeartbeats();
      next_heartbeat += cluster_.heartbeat_interval;
      if (next_heartbeat <= now) next_heartbeat = now + cluster_.heartbeat_interval;
    }
    if (!assigned_ && now - start_ >= cluster_.startup_timeout) return StartupTimeout();
    if (std::optional<Status> dead = CheckDeadNodes(now)) return *dead;
    if (std::optional<Status> gone = CheckRejoinDeadlines(now)) return *gone;

    time_point wake = std::min(next_heartbeat, now + kMaxLoopWait);
    if (!assigned_) wake = std::min(wake, start_ + cluster_.startup_timeout);
    const milliseconds wait =
        std::max(milliseconds(1), std::chrono::ceil<milliseconds>(wake - now));
    // Stop() is noticed within kMaxLoopWait whatever the clock says.
    if (Status s = endpoint_->Poll(std::min(kMaxLoopWait, clock_->BlockFor(wait))); !s.ok()) {
      // The endpoint itself is gone (closed under us): nothing can be sent any more.
      BP_LOG_ERROR("scheduler: transport failed: {}", s.ToString());
      return s.WithContext("scheduler transport");
    }
  }
  const Status finished = finished_.value_or(Status::Ok());
  if (finished.ok()) {
    BP_LOG_INFO("every worker is done: shutting the cluster down cleanly");
    ShutdownNodes("");
  }
  return finished;
}

void Scheduler::RegisterHandlers() {
  using node::Plane;
  using node::Sender;
  endpoint_->OnEvent(Plane::kControl,
                     [this](const Sender&, const transport::TransportEvent& ev) { OnEvent(ev); });
  endpoint_->OnRejected(
      Plane::kControl, [this](const Sender& from, const transport::Message&,
                              node::NodeEndpoint::Rejection why, std::string_view) {
        if (draining_) return;
        if (why == node::NodeEndpoint::Rejection::kMalformed) {
          BP_LOG_WARN("scheduler: dropped a malformed control message from '{}'", from.peer);
        } else {
          BP_LOG_DEBUG("scheduler: dropped a message from unregistered peer '{}'", from.peer);
        }
      });
  // Anyone may ask to register (HandleRegister checks who it is); everything else comes from
  // registered nodes.
  endpoint_->OnControl(v1::ControlMessage::kRegisterRequest,
                       [this](const Sender& from, const v1::ControlMessage& m) {
                         if (!draining_) HandleRegister(from.peer, m.register_request());
                       });
  endpoint_->OnControl(v1::ControlMessage::kHeartbeat,
                       [this](const Sender& from, const v1::ControlMessage& m) {
                         if (draining_) return;
                         Slot* slot = HeardFrom(from);
                         if (slot != nullptr && m.heartbeat().sent_ns() != 0) {
                           slot->heartbeat_sent_ns = m.heartbeat().sent_ns();
                           slot->heartbeat_received_ns = trace::NowNs();
                         }
                       });
  endpoint_->OnControl(v1::ControlMessage::kBarrierRequest,
                       [this](const Sender& from, const v1::ControlMessage& m) {
                         if (draining_) return;
                         if (Slot* slot = HeardFrom(from))
                           HandleBarrier(*slot, m.barrier_request());
                       });
  endpoint_->OnControl(v1::ControlMessage::kDone,
                       [this](const Sender& from, const v1::ControlMessage& m) {
                         if (draining_) return;
                         if (Slot* slot = HeardFrom(from)) HandleDone(*slot, m.done());
                       });
  endpoint_->OnControl(v1::ControlMessage::kShutdownAck,
                       [this](const Sender& from, const v1::ControlMessage&) {
                         if (draining_) {
                           // Any node the shutdown was sent to may acknowledge it.
                           if (Slot* s = FindSlot(from.peer)) s->shutdown_acked = true;
                           return;
                         }
                         if (Slot* slot = HeardFrom(from)) slot->shutdown_acked = true;
                       });
  endpoint_->OnUnhandledControl([this](const Sender& from, const v1::ControlMessage& m) {
    if (draining_) return;
    if (Slot* slot = HeardFrom(from)) {
      BP_LOG_WARN("scheduler: unexpected control message (case {}) from {}",
                  static_cast<int>(m.body_case()), slot->name);
    }
  });
}

Scheduler::Slot* Scheduler::HeardFrom(const node::Sender& sender) {
  Slot* slot = FindSlot(sender.peer);
  if (slot == nullptr || !slot->registered || slot->dead) {
    BP_LOG_DEBUG("scheduler: dropped a message from unregistered peer '{}'", sender.peer);
    return nullptr;
  }
  slot->last_heard = clock_->Now();
  slot->disconnected = false;
  return slot;
}

void Scheduler::OnEvent(const transport::TransportEvent& ev) {
  if (draining_) {
    // A node whose endpoint is gone has nothing left to acknowledge.
    if (ev.kind == transport::TransportEvent::Kind::kPeerDisconnected) {
      if (Slot* s = FindSlot(ev.peer)) {
        s->shutdown_acked = true;
        s->disconnected = true;
      }
    }
    return;
  }
  const char* what = ev.kind == transport::TransportEvent::Kind::kPeerConnected ? "connected"
                     : ev.kind == transport::TransportEvent::Kind::kPeerDisconnected
                         ? "disconnected"
                         : "send failed";
  // Verdicts come from heartbeats only (a transport may reconnect); events are logged.
  BP_LOG_INFO("scheduler: transport event: {} {}{}", ev.peer, what,
              ev.status.ok() ? "" : " (" + ev.status.message() + ")");
  if (Slot* slot = FindSlot(ev.peer)) {
    slot->disconnected = ev.kind == transport::TransportEvent::Kind::kPeerDisconnected;
  } else if (ev.kind == transport::TransportEvent::Kind::kPeerDisconnected &&
             ev.peer.rfind(kRefusedAliasPrefix, 0) == 0) {
    endpoint_->Disconnect(ev.peer);  // the refused node is gone: forget its alias
  }
}

void Scheduler::Refuse(const std::string& from, const v1::RegisterRequest& req, Slot* slot,
                       const std::string& error) {
  BP_LOG_WARN("scheduler: refused registration from '{}' at {} ({}:{}): {}", from, req.address(),
              req.host(), req.pid(), error);
  if (slot != nullptr) slot->last_refusal = error;
  stat_refused_.fetch_add(1, std::memory_order_relaxed);
  v1::ControlMessage m;
  m.mutable_register_refused()->set_error(error);
  m.mutable_register_refused()->mutable_scheduler_version()->set_major(kProtocolMajor);
  m.mutable_register_refused()->mutable_scheduler_version()->set_minor(kProtocolMinor);
  // Answer through a private alias: the requester may claim a name (and slot) that belongs
  // to a registered node, whose connection must stay untouched.
  const std::string alias = fmt::format("{}{}#{:x}", kRefusedAliasPrefix, from, req.incarnation());
  StatusOr<std::string> addr = config::NormalizeAddress(req.address(), cluster_.transport);
  if (!addr.ok()) {
    BP_LOG_WARN("scheduler: cannot answer '{}': {}", from, addr.status().message());
    return;
  }
  Status s = endpoint_->Connect(alias, *addr, from);
  if (s.ok()) s = SendTo(alias, m);
  if (!s.ok()) BP_LOG_WARN("scheduler: cannot send the refusal to '{}': {}", from, s.ToString());
}

void Scheduler::HandleRegister(const std::string& from, const v1::RegisterRequest& req) {
  // Order: version (nothing else can be trusted across majors), token (tell nothing more to
  // an unauthenticated peer), identity, duplicate, config.
  if (req.version().major() != kProtocolMajor) {
    Refuse(
        from, req, nullptr,
        fmt::format("protocol version mismatch: this node speaks {}.{}, the scheduler speaks "
                    "{}.{}",
                    req.version().major(), req.version().minor(), kProtocolMajor, kProtocolMinor));
    return;
  }
  if (!TokensEqual(req.cluster_token(), cluster_.token)) {
    std::string detail = cluster_.token.empty() ? "the node sends a token, the scheduler has none"
                         : req.cluster_token().empty()
                             ? "the node sends no token, the scheduler requires one"
                             : "the node's token differs from the scheduler's";
    Refuse(from, req, nullptr,
           fmt::format("cluster token mismatch ({}; check cluster.token / cluster.token_file)",
                       detail));
    return;
  }
  if (req.role() != v1::ROLE_SERVER && req.role() != v1::ROLE_WORKER) {
    Refuse(from, req, nullptr,
           fmt::format("unknown node: role {} (expected server or worker)",
                       static_cast<int>(req.role())));
    return;
  }
  const std::string role = std::string(node::RoleName(req.role()));
  const std::string expected_address = cluster_.NodeAddress(req.role(), req.rank());
  if (expected_address.empty()) {
    Refuse(from, req, nullptr,
           fmt::format(
               "unknown node: {} rank {} at {} is not in the cluster (cluster.{}s has "
               "{} entries)",
               role, req.rank(), req.address(), role,
               req.role() == v1::ROLE_SERVER ? cluster_.servers.size() : cluster_.workers.size()));
    return;
  }
  Slot& slot = *FindSlot(node::NodePeerId(req.role(), req.rank()));
  if (from != slot.name) {
    Refuse(from, req, &slot,
           fmt::format("node named '{}' registers as {} rank {} (whose name is '{}')", from, role,
                       req.rank(), slot.name));
    return;
  }
  StatusOr<std::string> addr = config::NormalizeAddress(req.address(), cluster_.transport);
  if (!addr.ok() || *addr != slot.address) {
    Refuse(from, req, &slot,
           fmt::format("unknown node: {} {} registers from {} but the cluster YAML has {} at that "
                       "rank",
                       role, req.rank(), req.address(), slot.address));
    return;
  }
  if (req.data_address() != slot.data_address) {
    Refuse(from, req, &slot,
           slot.data_address.empty()
               ? fmt::format("unknown node: {} {} registers a data address {} but the cluster "
                             "YAML gives it none (cluster.transport is {})",
                             role, req.rank(), req.data_address(), cluster_.transport)
               : fmt::format("unknown node: {} {} registers its data plane at {} but the cluster "
                             "YAML implies {} (its address {} + cluster.ucx.port_offset {})",
                             role, req.rank(),
                             req.data_address().empty() ? "no address" : req.data_address(),
                             slot.data_address, slot.address, cluster_.ucx.port_offset));
    return;
  }
  // A new process of a live server (it restarted before its silence was noticed): under
  // cluster.server_rejoin_timeout_s the old one is gone; the new one rejoins below once the
  // config agrees.
  const bool restarted = slot.registered && !slot.rejoining && !slot.dead &&
                         slot.incarnation != req.incarnation() && MayRejoin(slot);
  if (slot.registered && !slot.rejoining && !restarted && slot.incarnation != req.incarnation()) {
    Refuse(from, req, nullptr,
           fmt::format("duplicate registration for {} {} at {} (already registered by {}:{})", role,
                       req.rank(), slot.address, slot.host, slot.pid));
    return;
  }
  std::vector<v1::ConfigField> fields(req.config_fields().begin(), req.config_fields().end());
  std::string diff = config::DescribeConfigDifference(fields, config_fields_);
  if (diff.empty() && req.config_hash() != config_hash_) {
    diff = fmt::format(
        "config hash differs from the scheduler's ({:016x} here, {:016x} on the "
        "scheduler) although every field agrees: the two builds hash differently",
        req.config_hash(), config_hash_);
  }
  if (!diff.empty()) {
    Refuse(from, req, &slot, diff);
    return;
  }
  if (restarted) {
    stat_dead_.fetch_add(1, std::memory_order_relaxed);
    LoseServer(slot,
               fmt::format("a new process of it registered from {}:{} (the old one, {}:{}, is "
                           "gone)",
                           req.host(), req.pid(), slot.host, slot.pid),
               clock_->Now());
  }
  if (slot.rejoining) {
    if (slot.incarnation != req.incarnation()) HandleRejoin(slot, req);
    return;  // the dead process's own retries: nothing to answer
  }

  const bool retry = slot.registered;
  if (!retry) {
    Status c = endpoint_->Connect(slot.name, slot.address);
    if (!c.ok()) {
      // Nothing can be answered; the node retries and the startup timeout bounds it.
      BP_LOG_WARN("scheduler: cannot connect to {} at {}: {}", slot.name, slot.address,
                  c.ToString());
      return;
    }
    slot.registered = true;
    slot.incarnation = req.incarnation();
    slot.host = req.host();
    slot.pid = req.pid();
    slot.last_refusal.clear();
    ++registered_;
    stat_registered_.store(registered_, std::memory_order_relaxed);
    BP_LOG_INFO("scheduler: {} {} registered from {} ({}:{}) [{}/{}]", role, req.rank(),
                slot.address, slot.host, slot.pid, registered_, slots_.size());
  }
  slot.last_heard = clock_->Now();
  v1::ControlMessage m = RegisterAcceptedMessage();
  v1::RegisterAccepted* a = m.mutable_register_accepted();
  const Clock::duration left = start_ + cluster_.startup_timeout - clock_->Now();
  a->set_startup_remaining_ms(assigned_ ? 0
                                        : static_cast<uint32_t>(std::max<int64_t>(0, Ms(left))));
  Status s = SendTo(slot.name, m);
  if (!s.ok()) BP_LOG_WARN("scheduler: cannot answer {}: {}", slot.name, s.ToString());
  if (assigned_) {
    // A retry after the assignment went out (its answer was lost): send it again.
    v1::ControlMessage am;
    *am.mutable_assignment() = AssignmentFor(slot);
    (void)SendTo(slot.name, am);
  } else if (registered_ == slots_.size()) {
    SendAssignments();
  }
}

v1::ControlMessage Scheduler::RegisterAcceptedMessage() const {
  v1::ControlMessage m;
  v1::RegisterAccepted* a = m.mutable_register_accepted();
  a->set_registered(static_cast<uint32_t>(registered_));
  a->set_expected(static_cast<uint32_t>(slots_.size()));
  a->set_heartbeat_interval_ms(static_cast<uint32_t>(cluster_.heartbeat_interval.count()));
  a->set_heartbeat_timeout_ms(static_cast<uint32_t>(cluster_.heartbeat_timeout.count()));
  return m;
}

bool Scheduler::MayRejoin(const Slot& s) const {
  return assigned_ && s.role == v1::ROLE_SERVER && cluster_.server_rejoin_timeout.count() > 0 &&
         !finished_;
}

void Scheduler::LoseServer(Slot& s, const std::string& reason, time_point now) {
  s.dead = true;
  s.rejoining = true;
  s.rejoin_deadline = now + cluster_.server_rejoin_timeout;
  ++generation_;
  BP_LOG_ERROR(
      "scheduler: {} {} at {} failed: {}; waiting up to {} ms for it to register again "
      "(generation {})",
      node::RoleName(s.role), s.rank, s.address, reason, cluster_.server_rejoin_timeout.count(),
      generation_);
  v1::ControlMessage m;
  *m.mutable_node_failed()->mutable_node() = InfoOf(s);
  m.mutable_node_failed()->set_reason(reason);
  m.mutable_node_failed()->set_rejoin_deadline_ms(
      static_cast<uint64_t>(cluster_.server_rejoin_timeout.count()));
  m.mutable_node_failed()->set_generation(generation_);
  for (const Slot& other : slots_) {
    if (!other.registered || other.dead) continue;
    Status st = SendTo(other.name, m);
    if (!st.ok()) BP_LOG_WARN("scheduler: cannot tell {}: {}", other.name, st.ToString());
  }
}

void Scheduler::HandleRejoin(Slot& slot, const v1::RegisterRequest& req) {
  // The config agreement and identity checks above passed; the old process is gone.
  endpoint_->Disconnect(slot.name);
  if (Status c = endpoint_->Connect(slot.name, slot.address); !c.ok()) {
    BP_LOG_WARN("scheduler: cannot connect to the rejoining {} at {}: {}", slot.name, slot.address,
                c.ToString());
    return;  // it retries; its window bounds it
  }
  slot.rejoining = false;
  slot.dead = false;
  slot.disconnected = false;
  slot.incarnation = req.incarnation();
  slot.host = req.host();
  slot.pid = req.pid();
  slot.last_refusal.clear();
  slot.last_heard = clock_->Now();
  BP_LOG_WARN(
      "scheduler: {} {} rejoined from {} ({}:{}); the data plane continues in generation {}",
      node::RoleName(slot.role), slot.rank, slot.address, slot.host, slot.pid, generation_);
  (void)SendTo(slot.name, RegisterAcceptedMessage());  // startup_remaining_ms 0: assigned
  v1::ControlMessage am;
  *am.mutable_assignment() = AssignmentFor(slot);
  (void)SendTo(slot.name, am);
  v1::ControlMessage r;
  *r.mutable_node_rejoined()->mutable_node() = InfoOf(slot);
  r.mutable_node_rejoined()->set_generation(generation_);
  for (const Slot& other : slots_) {
    if (!other.registered || other.dead) continue;
    if (Status st = SendTo(other.name, r); !st.ok()) {
      BP_LOG_WARN("scheduler: cannot tell {}: {}", other.name, st.ToString());
    }
  }
}

std::optional<Status> Scheduler::CheckRejoinDeadlines(time_point now) {
  for (const Slot& s : slots_) {
    if (!s.rejoining || now < s.rejoin_deadline) continue;
    const std::string error = fmt::format(
        "{} {} at {} failed and did not register again within {} ms "
        "(cluster.server_rejoin_timeout_s)",
        node::RoleName(s.role), s.rank, s.address, cluster_.server_rejoin_timeout.count());
    BP_LOG_ERROR("scheduler: {}", error);
    ShutdownNodes(error);
    return UnavailableError(error);
  }
  return std::nullopt;
}

v1::Assignment Scheduler::AssignmentFor(const Slot& slot) const {
  v1::Assignment a;
  *a.mutable_self() = InfoOf(slot);
  for (const Slot& s : slots_) {
    *(s.role == v1::ROLE_SERVER ? a.add_servers() : a.add_workers()) = InfoOf(s);
  }
  *a.mutable_key_mapping() = config::MakeKeyMapping(static_cast<uint32_t>(cluster_.servers.size()));
  a.set_heartbeat_interval_ms(static_cast<uint32_t>(cluster_.heartbeat_interval.count()));
  a.set_heartbeat_timeout_ms(static_cast<uint32_t>(cluster_.heartbeat_timeout.count()));
  return a;
}

void Scheduler::SendAssignments() {
  assigned_ = true;
  BP_LOG_INFO("scheduler: all {} nodes registered after {} ms; sending assignments", slots_.size(),
              Ms(clock_->Now() - start_));
  for (const Slot& s : slots_) {
    v1::ControlMessage m;
    *m.mutable_assignment() = AssignmentFor(s);
    Status st = SendTo(s.name, m);
    if (!st.ok())
      BP_LOG_WARN("scheduler: cannot send the assignment to {}: {}", s.name, st.ToString());
  }
}

void Scheduler::HandleBarrier(Slot& slot, const v1::BarrierRequest& req) {
  const v1::Group group = req.group();
  if (!assigned_) {
    BP_LOG_WARN("scheduler: {} asked for a barrier before the assignment; ignored", slot.name);
    return;
  }
  if (!IsMember(slot, group)) {
    BP_LOG_WARN("scheduler: {} asked for barrier {} of group {}, which it is not in; ignored",
                slot.name, req.barrier_id(), config::GroupName(group));
    return;
  }
  BarrierState& b = barriers_[group];
  if (req.barrier_id() != b.next_id) {
    BP_LOG_WARN(
        "scheduler: {} asked for barrier {} of group {}, but that group is at barrier {}; "
        "ignored",
        slot.name, req.barrier_id(), config::GroupName(group), b.next_id);
    return;
  }
  const size_t index = slot_by_name_[slot.name];
  if (!b.arrived[index]) {
    b.arrived[index] = true;
    ++b.count;
  }
  size_t members = 0;
  for (const Slot& s : slots_) members += IsMember(s, group) ? 1 : 0;
  if (b.count < members) return;
  BP_LOG_DEBUG("scheduler: releasing barrier {} of group {}", b.next_id, config::GroupName(group));
  v1::ControlMessage m;
  m.mutable_barrier_release()->set_group(group);
  m.mutable_barrier_release()->set_barrier_id(b.next_id);
  for (const Slot& s : slots_) {
    if (!IsMember(s, group)) continue;
    Status st = SendTo(s.name, m);
    if (!st.ok()) BP_LOG_WARN("scheduler: cannot release {}: {}", s.name, st.ToString());
  }
  ++b.next_id;
  stat_barriers_.fetch_add(1, std::memory_order_relaxed);
  b.count = 0;
  std::fill(b.arrived.begin(), b.arrived.end(), false);
}

void Scheduler::HandleDone(Slot& slot, const v1::Done& done) {
  if (slot.role != v1::ROLE_WORKER) {
    BP_LOG_WARN("scheduler: {} sent Done, but only workers do; ignored", slot.name);
    return;
  }
  if (!assigned_) {
    BP_LOG_WARN("scheduler: {} sent Done before the assignment; ignored", slot.name);
    return;
  }
  if (slot.done) return;
  slot.done = true;
  ++workers_done_;
  stat_done_.store(workers_done_, std::memory_order_relaxed);
  BP_LOG_INFO("scheduler: {} is done [{}/{} workers]", slot.name, workers_done_,
              cluster_.workers.size());
  if (workers_done_ == cluster_.workers.size()) {
    finished_ = Status::Ok();
    return;
  }
  if (done.rounds().empty())
    return;  // the worker's rounds are unknown (it failed, or pushed nothing)
  v1::ControlMessage m;
  *m.mutable_worker_finished()->mutable_node() = InfoOf(slot);
  *m.mutable_worker_finished()->mutable_rounds() = done.rounds();
  for (const Slot& other : slots_) {
    if (other.role != v1::ROLE_WORKER || !other.registered || other.dead || other.done) continue;
    Status st = SendTo(other.name, m);
    if (!st.ok()) BP_LOG_DEBUG("scheduler: cannot tell {}: {}", other.name, st.ToString());
  }
}

void Scheduler::SendHeartbeats() {
  v1::ControlMessage m;
  m.mutable_heartbeat()->set_seq(++heartbeat_seq_);
  stat_heartbeats_.fetch_add(1, std::memory_order_relaxed);
  v1::Heartbeat* hb = m.mutable_heartbeat();
  for (Slot& s : slots_) {
    if (!s.registered || s.dead) continue;
    // Each heartbeat echoes the node's latest one, once (docs/observability.md).
    hb->set_echo_sent_ns(std::exchange(s.heartbeat_sent_ns, 0));
    hb->set_echo_received_ns(std::exchange(s.heartbeat_received_ns, 0));
    hb->set_sent_ns(trace::NowNs());
    Status st = SendTo(s.name, m);
    if (!st.ok()) BP_LOG_DEBUG("scheduler: heartbeat to {} failed: {}", s.name, st.ToString());
  }
}

std::optional<Status> Scheduler::CheckDeadNodes(time_point now) {
  std::vector<size_t> dead;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.registered && !s.dead && now - s.last_heard > cluster_.heartbeat_timeout) {
      dead.push_back(i);
    }
  }
  if (dead.empty()) return std::nullopt;
  std::string error;
  for (size_t i : dead) {
    Slot& s = slots_[i];
    s.dead = true;
    stat_dead_.fetch_add(1, std::memory_order_relaxed);
    const std::string reason =
        fmt::format("no heartbeat for {} ms (heartbeat timeout {} ms)", Ms(now - s.last_heard),
                    cluster_.heartbeat_timeout.count());
    const std::string line =
        fmt::format("{} {} at {} failed: {}", node::RoleName(s.role), s.rank, s.address, reason);
    // A server may come back (cluster.server_rejoin_timeout_s): the job rolls back instead.
    if (MayRejoin(s)) {
      LoseServer(s, reason, now);
      continue;
    }
    BP_LOG_ERROR("scheduler: {}", line);
    error += (error.empty() ? "" : "; ") + line;
    v1::ControlMessage m;
    *m.mutable_node_failed()->mutable_node() = InfoOf(s);
    m.mutable_node_failed()->set_reason(reason);
    for (const Slot& other : slots_) {
      if (!other.registered || other.dead) continue;
      Status st = SendTo(other.name, m);
      if (!st.ok()) BP_LOG_WARN("scheduler: cannot tell {}: {}", other.name, st.ToString());
    }
  }
  if (error.empty()) return std::nullopt;
  ShutdownNodes(error);
  return UnavailableError(error);
}

Status Scheduler::StartupTimeout() {
  std::vector<std::string> missing;
  for (const Slot& s : slots_) {
    if (s.registered) continue;
    std::string m = fmt::format("{} rank {} at {}", node::RoleName(s.role), s.rank, s.address);
    if (!s.last_refusal.empty()) m += " (its registration was refused: " + s.last_refusal + ")";
    missing.push_back(std::move(m));
  }
  std::string list;
  for (size_t i = 0; i < missing.size(); ++i) list += (i ? "; " : "") + missing[i];
  const std::string error =
      fmt::format("startup timeout: {} of {} nodes did not register within {} ms: {}",
                  missing.size(), slots_.size(), cluster_.startup_timeout.count(), list);
  BP_LOG_ERROR("scheduler: {}", error);
  ShutdownNodes(error);
  return TimeoutError(error);
}

void Scheduler::ShutdownNodes(const std::string& error) {
  // Workers first, servers once the workers acknowledged (or half the bound passed): a worker in
  // the middle of a round then fails naming the shutdown, not a server that vanished under it.
  const milliseconds bound = options_.shutdown_ack_timeout.count() > 0
                                 ? options_.shutdown_ack_timeout
                                 : cluster_.heartbeat_timeout;
  const time_point start = clock_->Now();
  draining_ = true;
  std::vector<std::pair<std::string, Status>> gone;
  ShutdownRole(v1::ROLE_WORKER, error, start + bound / 2, bound, &gone);
  ShutdownRole(v1::ROLE_SERVER, error, start + bound, bound, &gone);
  draining_ = false;
  // A teardown often follows nodes that went away (one died, or the launcher is stopping them
  // all): that their Shutdown could not be sent is expected, said once, not warned per node.
  if (!gone.empty()) {
    std::string names;
    for (const auto& [name, why] : gone) names += (names.empty() ? "" : ", ") + name;
    BP_LOG_INFO(
        "scheduler: Shutdown not sent to {} node(s) no longer reachable: {} (the first: {})",
        gone.size(), names, gone.front().second.message());
  }
}

void Scheduler::ShutdownRole(v1::Role role, const std::string& error, time_point deadline,
                             milliseconds bound,
                             std::vector<std::pair<std::string, Status>>* gone) {
  v1::ControlMessage m;
  m.mutable_shutdown()->set_error(error);
  size_t waiting = 0;
  for (Slot& s : slots_) {
    if (s.role != role || !s.registered || s.dead) continue;
    Status st = SendTo(s.name, m);
    if (st.ok() && s.disconnected) {
      s.shutdown_acked = true;  // sent in case it comes back, but its endpoint is gone
    } else if (st.ok()) {
      ++waiting;
    } else {
      // Unavailable: the peer is disconnected (transport.h), or stopped taking messages.
      if (st.code() == StatusCode::kUnavailable) {
        gone->emplace_back(s.name, st);
      } else {
        BP_LOG_WARN("scheduler: cannot send Shutdown to {}: {}", s.name, st.ToString());
      }
      s.shutdown_acked = true;  // nothing to wait for
    }
  }
  auto unacked = [&] {
    size_t n = 0;
    for (const Slot& s : slots_) {
      n += (s.role == role && s.registered && !s.dead && !s.shutdown_acked) ? 1 : 0;
    }
    return n;
  };
  while (waiting > 0 && unacked() > 0) {
    const time_point now = clock_->Now();
    if (now >= deadline) {
      std::string names;
      for (const Slot& s : slots_) {
        if (s.role == role && s.registered && !s.dead && !s.shutdown_acked)
          names += (names.empty() ? "" : ", ") + s.name;
      }
      BP_LOG_WARN("scheduler: no shutdown acknowledgement within {} ms from {}", bound.count(),
                  names);
      break;
    }
    const milliseconds wait =
        std::min(kMaxLoopWait, duration_cast<milliseconds>(deadline - now) + milliseconds(1));
    if (!endpoint_->Poll(clock_->BlockFor(wait)).ok()) break;
  }
}

}  // namespace bitpush::scheduler
