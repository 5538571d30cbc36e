#include "scheduler/scheduler_client.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "common/counter_rng.h"
#include "common/logging.h"
#include "common/trace/recorder.h"
#include "config/key_mapping.h"
#include "config/node_security.h"
#include "fmt/format.h"

namespace bitpush::scheduler {

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

// Longest I/O-thread wait while no timer is due (Close() wakes it through the transport).
constexpr milliseconds kIdleWait{1000};

int64_t Ms(std::chrono::steady_clock::duration d) {
  return duration_cast<milliseconds>(d).count();
}

uint64_t NewIncarnation() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const uint64_t t =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return Mix64(r ^ Mix64(t) ^ (static_cast<uint64_t>(getpid()) << 40)) | 1;
}

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace

Status SchedulerClient::Validate(const SchedulerClientOptions& options) {
  BP_RETURN_IF_ERROR(config::ValidateClusterConfig(options.cluster));
  if (options.role != v1::ROLE_SERVER && options.role != v1::ROLE_WORKER) {
    return InvalidArgumentError("SchedulerClientOptions::role must be ROLE_SERVER or ROLE_WORKER");
  }
  const std::string address = options.cluster.NodeAddress(options.role, options.rank);
  if (address.empty()) {
    const size_t n = options.role == v1::ROLE_SERVER ? options.cluster.servers.size()
                                                     : options.cluster.workers.size();
    return InvalidArgumentError(
        fmt::format("{} rank {} is not in the cluster: cluster.{}s in {} "
                    "has {} entries (ranks 0..{})",
                    node::RoleName(options.role), options.rank, node::RoleName(options.role),
                    options.cluster.source, n, n - 1));
  }
  if (options.initial_backoff.count() <= 0 || options.max_backoff < options.initial_backoff) {
    return InvalidArgumentError("SchedulerClientOptions: need 0 < initial_backoff <= max_backoff");
  }
  if (options.barrier_timeout.count() <= 0) {
    return InvalidArgumentError("SchedulerClientOptions::barrier_timeout must be > 0");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Create(SchedulerClientOptions options,
                                                                   node::NodeEndpoint* endpoint) {
  BP_RETURN_IF_ERROR(Validate(options));
  if (endpoint == nullptr) return InvalidArgumentError("SchedulerClient: no endpoint");
  const node::NodeIdentity self{options.role, options.rank};
  if (!(endpoint->self() == self)) {
    return InvalidArgumentError(
        fmt::format("SchedulerClient for {} {} attached to the endpoint of '{}'",
                    node::RoleName(options.role), options.rank, endpoint->name()));
  }
  std::unique_ptr<SchedulerClient> c(new SchedulerClient(std::move(options), endpoint, nullptr));
  c->Attach();
  return c;
}

StatusOr<std::unique_ptr<SchedulerClient>> SchedulerClient::Create(
    SchedulerClientOptions options, std::unique_ptr<transport::Transport> transport) {
  BP_RETURN_IF_ERROR(Validate(options));
  const std::string address = options.cluster.NodeAddress(options.role, options.rank);
  node::NodeEndpointOptions e;
  e.self = node::NodeIdentity{options.role, options.rank};
  e.listen_address = address;
  e.backend = options.cluster.transport;
  e.inproc_hub = options.inproc_hub;
  BP_RETURN_IF_ERROR(config::ConfigureNodeEndpoint(options.cluster, &e));
  e.clock = options.clock;
  const bool injected = transport != nullptr;
  StatusOr<std::unique_ptr<node::NodeEndpoint>> made =
      node::NodeEndpoint::Create(std::move(e), std::move(transport));
  if (!made.ok()) {
    if (injected) return made.status();
    return made.status().WithContext(fmt::format(
        "{} {}: cannot listen at {}", node::RoleName(options.role), options.rank, address));
  }
  node::NodeEndpoint* endpoint = made->get();
  std::unique_ptr<SchedulerClient> c(
      new SchedulerClient(std::move(options), endpoint, std::move(made).value()));
  c->Attach();
  endpoint->Start();
  return c;
}

SchedulerClient::SchedulerClient(SchedulerClientOptions options, node::NodeEndpoint* endpoint,
                                 std::unique_ptr<node::NodeEndpoint> owned)
    : options_(std::move(options)),
      name_(node::NodePeerId(options_.role, options_.rank)),
      address_(options_.cluster.NodeAddress(options_.role, options_.rank)),
      label_(fmt::format("{} {}", node::RoleName(options_.role), options_.rank)),
      incarnation_(NewIncarnation()),
      endpoint_(endpoint),
      owned_endpoint_(std::move(owned)),
      clock_(options_.clock ? options_.clock : endpoint->clock()),
      heartbeat_interval_(options_.cluster.heartbeat_interval),
      heartbeat_timeout_(options_.cluster.heartbeat_timeout),
      assignment_wait_(options_.cluster.startup_timeout + options_.cluster.heartbeat_timeout) {
  next_heartbeat_ = clock_->Now();
}

void SchedulerClient::Attach() {
  using node::Plane;
  using node::Sender;
  for (v1::ControlMessage::BodyCase kind :
       {v1::ControlMessage::kHeartbeat, v1::ControlMessage::kRegisterAccepted,
        v1::ControlMessage::kRegisterRefused, v1::ControlMessage::kAssignment,
        v1::ControlMessage::kBarrierRelease, v1::ControlMessage::kNodeFailed,
        v1::ControlMessage::kShutdown, v1::ControlMessage::kWorkerFinished,
        v1::ControlMessage::kNodeRejoined}) {
    endpoint_->OnControl(
        kind, [this](const Sender&, const v1::ControlMessage& m) { HandleFromScheduler(m); });
  }
  endpoint_->OnUnhandledControl([this](const Sender& from, const v1::ControlMessage& m) {
    if (from.Is(v1::ROLE_SCHEDULER)) HandleFromScheduler(m);  // a newer scheduler's type
  });
  endpoint_->OnRejected(Plane::kControl, [this](const Sender&, const transport::Message&,
                                                node::NodeEndpoint::Rejection, std::string_view) {
    BP_LOG_WARN("{}: dropped a malformed control message from the scheduler", label_);
  });
  endpoint_->OnEvent(Plane::kControl, [this](const Sender&, const transport::TransportEvent& ev) {
    BP_LOG_DEBUG("{}: transport event about the scheduler: {}", label_,
                 ev.status.ok() ? std::string("connected") : ev.status.message());
  });
  endpoint_->AddTimer([this](time_point now) { return Tick(now); });
  endpoint_->OnFailure([this](const Status& s) {
    bool closing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing = closed_;
    }
    if (!closing) Fail(s);
  });
}

SchedulerClient::~SchedulerClient() {
  Close();
}

void SchedulerClient::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  cv_.notify_all();
  if (owned_endpoint_) owned_endpoint_->Close();
}

std::optional<Status> SchedulerClient::StopReasonLocked() const {
  if (!error_.ok()) return error_;
  if (closed_) return CancelledError(label_ + ": the scheduler client is closed");
  if (shutdown_) return CancelledError(label_ + ": the cluster has shut down");
  return std::nullopt;
}

void SchedulerClient::Fail(const Status& error) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok() && !error_reported_) {
      error_ = error;
      error_reported_ = true;
      first = true;
    }
  }
  if (!first) return;
  cv_.notify_all();
  BP_LOG_ERROR("{}: {}", label_, error.ToString());
  if (options_.on_error) options_.on_error(error);
}

Status SchedulerClient::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

bool SchedulerClient::shut_down() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutdown_;
}

const v1::Assignment& SchedulerClient::assignment() const {
  std::lock_guard<std::mutex> lock(mu_);
  BP_CHECK(assigned_, "SchedulerClient::assignment() before Register() succeeded");
  return assignment_;  // immutable once assigned_
}

uint32_t SchedulerClient::ServerForKey(uint64_t key) const {
  return config::ServerForKey(key, assignment().key_mapping());
}

Status SchedulerClient::SendToScheduler(const v1::ControlMessage& msg) {
  return endpoint_->SendControl(node::kSchedulerPeerId, msg);
}

v1::RegisterRequest SchedulerClient::MakeRequest() const {
  v1::RegisterRequest r;
  r.mutable_version()->set_major(options_.protocol_major);
  r.mutable_version()->set_minor(options_.protocol_minor);
  r.set_role(options_.role);
  r.set_rank(options_.rank);
  r.set_address(address_);
  r.set_data_address(options_.cluster.DataAddress(options_.role, options_.rank));
  for (const std::string& c : options_.capabilities) r.add_capabilities(c);
  const std::vector<v1::ConfigField> fields = config::ConfigFields(options_.cluster);
  r.set_config_hash(config::ConfigHash(fields));
  for (const v1::ConfigField& f : fields) *r.add_config_fields() = f;
  r.set_cluster_token(options_.cluster.token);
  r.set_host(HostName());
  r.set_pid(static_cast<uint32_t>(getpid()));
  r.set_incarnation(incarnation_);
  return r;
}

Status SchedulerClient::Register() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.ok()) return error_;
    if (assigned_) return Status::Ok();
    if (closed_) return CancelledError(label_ + ": the scheduler client is closed");
  }
  const std::string& sched = options_.cluster.scheduler_address;
  const time_point start = clock_->Now();
  const time_point deadline = start + options_.cluster.startup_timeout;
  v1::ControlMessage request;
  *request.mutable_register_request() = MakeRequest();
  milliseconds backoff = options_.initial_backoff;
  int attempts = 0;
  std::string last_error;
  BP_LOG_INFO("{}: registering with the scheduler at {} (listening at {})", label_, sched,
              address_);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return error_;
      if (accepted_ || assigned_) break;
      if (std::optional<Status> stop = StopReasonLocked()) return *stop;
    }
    const time_point now = clock_->Now();
    if (now >= deadline) {
      Status e = TimeoutError(fmt::format(
          "{}: no answer from the scheduler at {} after {} registration attempts over {} ms{}; "
          "is bitpush-scheduler running there?",
          label_, sched, attempts, Ms(now - start),
          last_error.empty() ? "" : " (last error: " + last_error + ")"));
      Fail(e);
      return e;
    }
    ++attempts;
    Status s;
    bool connected;
    {
      std::lock_guard<std::mutex> lock(mu_);
      connected = scheduler_connected_;
    }
    if (!connected) {
      s = endpoint_->Connect(node::kSchedulerPeerId, sched);
      if (s.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        scheduler_connected_ = true;
      }
    }
    if (s.ok()) s = SendToScheduler(request);
    if (!s.ok()) {
      last_error = s.message();
      BP_LOG_DEBUG("{}: registration attempt {} failed: {}", label_, attempts, s.ToString());
    }
    std::unique_lock<std::mutex> lock(mu_);
    clock_->WaitUntil(lock, cv_, std::min<time_point>(now + backoff, deadline),
                      [&] { return accepted_ || assigned_ || StopReasonLocked().has_value(); });
    backoff = std::min(backoff * 2, options_.max_backoff);
  }

  // Accepted: the Assignment follows once every node has registered. The wait is bounded by
  // the scheduler's remaining startup time plus a heartbeat timeout, so the scheduler's own
  // startup verdict (naming the missing nodes) arrives first.
  std::unique_lock<std::mutex> lock(mu_);
  const milliseconds assignment_wait = assignment_wait_;
  const time_point assignment_deadline = clock_->Now() + assignment_wait;
  clock_->WaitUntil(lock, cv_, assignment_deadline,
                    [&] { return assigned_ || StopReasonLocked().has_value(); });
  if (!error_.ok()) return error_;
  // Assigned counts even if a clean shutdown followed at once (a fast cluster).
  if (assigned_) return Status::Ok();
  if (std::optional<Status> stop = StopReasonLocked()) return *stop;
  lock.unlock();
  Status e = TimeoutError(fmt::format(
      "{}: registered with the scheduler at {}, but no assignment followed within {} ms (the "
      "scheduler is still waiting for other nodes)",
      label_, sched, assignment_wait.count()));
  Fail(e);
  return e;
}

Status SchedulerClient::Barrier(v1::Group group) {
  return Barrier(group, options_.barrier_timeout);
}

Status SchedulerClient::Barrier(v1::Group group, milliseconds timeout) {
  const bool member = group == v1::GROUP_ALL ||
                      (group == v1::GROUP_WORKERS && options_.role == v1::ROLE_WORKER) ||
                      (group == v1::GROUP_SERVERS && options_.role == v1::ROLE_SERVER);
  if (!member) {
    return InvalidArgumentError(fmt::format("{} is not in barrier group {} ({})", label_,
                                            config::GroupName(group), static_cast<int>(group)));
  }
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::optional<Status> stop = StopReasonLocked()) return *stop;
    if (!assigned_) return FailedPreconditionError(label_ + ": Barrier() before Register()");
    id = next_barrier_[group]++;
  }
  v1::ControlMessage m;
  m.mutable_barrier_request()->set_group(group);
  m.mutable_barrier_request()->set_barrier_id(id);
  if (Status s = SendToScheduler(m); !s.ok()) {
    Status e = Status(s.code(), fmt::format("{}: barrier {} of group {}: {}", label_, id,
                                            config::GroupName(group), s.message()));
    Fail(e);
    return e;
  }
  std::unique_lock<std::mutex> lock(mu_);
  clock_->WaitUntil(lock, cv_, clock_->Now() + timeout,
                    [&] { return released_[group] > id || StopReasonLocked().has_value(); });
  if (released_[group] > id) return Status::Ok();
  if (std::optional<Status> stop = StopReasonLocked()) return *stop;
  lock.unlock();
  Status e = TimeoutError(fmt::format(
      "{}: barrier {} of group {} not released by the scheduler at {} within {} ms", label_, id,
      config::GroupName(group), options_.cluster.scheduler_address, timeout.count()));
  Fail(e);
  return e;
}

Status SchedulerClient::Done(const std::vector<uint64_t>& rounds) {
  if (options_.role != v1::ROLE_WORKER) {
    return InvalidArgumentError(fmt::format("{}: only workers send Done", label_));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Idempotent: a repeated Done() is OK even once the clean shutdown it caused has arrived.
    if (done_sent_ && error_.ok()) return Status::Ok();
    if (std::optional<Status> stop = StopReasonLocked()) return *stop;
    if (!assigned_) return FailedPreconditionError(label_ + ": Done() before Register()");
    done_sent_ = true;
  }
  v1::ControlMessage m;
  v1::Done* done = m.mutable_done();
  for (uint64_t r : rounds) done->add_rounds(r);
  if (Status s = SendToScheduler(m); !s.ok()) {
    Status e = Status(s.code(), fmt::format("{}: sending Done: {}", label_, s.message()));
    Fail(e);
    return e;
  }
  return Status::Ok();
}

Status SchedulerClient::WaitForShutdown(milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  clock_->WaitUntil(lock, cv_, clock_->Now() + timeout,
                    [&] { return shutdown_ || !error_.ok() || closed_; });
  if (!error_.ok()) return error_;
  if (shutdown_) return Status::Ok();
  if (closed_) return CancelledError(label_ + ": the scheduler client is closed");
  return TimeoutError(fmt::format("{}: no shutdown from the scheduler at {} within {} ms", label_,
                                  options_.cluster.scheduler_address, timeout.count()));
}

void SchedulerClient::HandleFromScheduler(const v1::ControlMessage& msg) {
  const std::string& sched = options_.cluster.scheduler_address;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_heard_ = clock_->Now();
  }
  switch (msg.body_case()) {
    case v1::ControlMessage::kHeartbeat: {
      const v1::Heartbeat& hb = msg.heartbeat();
      if (options_.on_clock_sample && hb.echo_sent_ns() != 0 && hb.sent_ns() != 0) {
        options_.on_clock_sample(hb.echo_sent_ns(), hb.echo_received_ns(), hb.sent_ns(),
                                 trace::NowNs());
      }
      return;
    }
    case v1::ControlMessage::kRegisterAccepted: {
      const v1::RegisterAccepted& a = msg.register_accepted();
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!accepted_) {
          first = true;
          accepted_ = true;
          if (a.heartbeat_interval_ms() > 0 && a.heartbeat_timeout_ms() > 0) {
            heartbeat_interval_ = milliseconds(a.heartbeat_interval_ms());
            heartbeat_timeout_ = milliseconds(a.heartbeat_timeout_ms());
          }
          assignment_wait_ = milliseconds(a.startup_remaining_ms()) + heartbeat_timeout_;
        }
      }
      if (first) {
        cv_.notify_all();
        BP_LOG_INFO("{}: registered with the scheduler at {} [{}/{} nodes]", label_, sched,
                    a.registered(), a.expected());
      }
      return;
    }
    case v1::ControlMessage::kRegisterRefused: {
      const v1::RegisterRefused& r = msg.register_refused();
      Fail(RemoteError(fmt::format("the scheduler at {} (protocol {}.{}) refused {}: {}", sched,
                                   r.scheduler_version().major(), r.scheduler_version().minor(),
                                   label_, r.error())));
      return;
    }
    case v1::ControlMessage::kAssignment: {
      const v1::Assignment& a = msg.assignment();
      Status valid = config::ValidateKeyMapping(a.key_mapping());
      if (valid.ok() && (a.self().role() != options_.role || a.self().rank() != options_.rank)) {
        valid = DataLossError(fmt::format("the assignment is for {} {}",
                                          node::RoleName(a.self().role()), a.self().rank()));
      }
      if (valid.ok() && (a.heartbeat_interval_ms() == 0 || a.heartbeat_timeout_ms() == 0)) {
        valid = DataLossError("the assignment has no heartbeat settings");
      }
      if (!valid.ok()) {
        Fail(DataLossError(fmt::format("{}: bad assignment from the scheduler at {}: {}", label_,
                                       sched, valid.message())));
        return;
      }
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!assigned_) {
          first = true;
          assignment_ = a;
          assigned_ = true;
          accepted_ = true;
          heartbeat_interval_ = milliseconds(a.heartbeat_interval_ms());
          heartbeat_timeout_ = milliseconds(a.heartbeat_timeout_ms());
        }
      }
      if (first) {
        cv_.notify_all();
        BP_LOG_INFO("{}: assigned: {} servers, {} workers", label_, a.servers_size(),
                    a.workers_size());
      }
      return;
    }
    case v1::ControlMessage::kBarrierRelease: {
      const v1::BarrierRelease& b = msg.barrier_release();
      {
        std::lock_guard<std::mutex> lock(mu_);
        uint64_t& r = released_[b.group()];
        r = std::max(r, b.barrier_id() + 1);
      }
      cv_.notify_all();
      return;
    }
    case v1::ControlMessage::kNodeFailed: {
      const v1::NodeFailed& f = msg.node_failed();
      if (f.rejoin_deadline_ms() > 0 && f.node().role() == v1::ROLE_SERVER &&
          options_.on_server_lost) {
        options_.on_server_lost(
            f.node().rank(), f.generation(),
            UnavailableError(fmt::format(
                "server {} at {} failed: {} (reported by the scheduler at {}); the job waits up "
                "to {} ms for it to register again (cluster.server_rejoin_timeout_s), then "
                "resumes from its last checkpoint",
                f.node().rank(), f.node().address(), f.reason(), sched, f.rejoin_deadline_ms())));
        return;
      }
      Fail(UnavailableError(fmt::format("{} {} at {} failed: {} (reported by the scheduler at {})",
                                        node::RoleName(f.node().role()), f.node().rank(),
                                        f.node().address(), f.reason(), sched)));
      return;
    }
    case v1::ControlMessage::kNodeRejoined: {
      const v1::NodeRejoined& r = msg.node_rejoined();
      BP_LOG_WARN("{}: server {} rejoined (generation {}; told by the scheduler at {})", label_,
                  r.node().rank(), r.generation(), sched);
      if (options_.on_server_rejoined) options_.on_server_rejoined(r.node().rank(), r.generation());
      return;
    }
    case v1::ControlMessage::kWorkerFinished: {
      const v1::WorkerFinished& f = msg.worker_finished();
      if (options_.role != v1::ROLE_WORKER || f.node().role() != v1::ROLE_WORKER) return;
      BP_LOG_DEBUG("{}: worker {} is done (told by the scheduler at {})", label_, f.node().rank(),
                   sched);
      if (options_.on_worker_finished) {
        options_.on_worker_finished(f.node().rank(),
                                    std::vector<uint64_t>(f.rounds().begin(), f.rounds().end()));
      }
      return;
    }
    case v1::ControlMessage::kShutdown: {
      v1::ControlMessage ack;
      ack.mutable_shutdown_ack();
      (void)SendToScheduler(ack);
      const std::string error = msg.shutdown().error();
      Status verdict;
      if (!error.empty()) {
        verdict =
            RemoteError(fmt::format("the scheduler at {} shut the cluster down: {}", sched, error));
        Fail(verdict);
      } else {
        BP_LOG_INFO("{}: clean shutdown from the scheduler", label_);
        // The scheduler shuts down cleanly only once every worker sent Done (scheduler.h).
        verdict = CancelledError(fmt::format(
            "the scheduler at {} shut the cluster down (clean shutdown: every worker sent Done)",
            sched));
      }
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        first = !shutdown_;
        shutdown_ = true;
      }
      cv_.notify_all();
      if (first && options_.on_shutdown) options_.on_shutdown(verdict);
      return;
    }
    default:
      BP_LOG_WARN("{}: unexpected control message (case {}) from the scheduler", label_,
                  static_cast<int>(msg.body_case()));
  }
}

SchedulerClient::time_point SchedulerClient::Tick(time_point now) {
  time_point wake = now + kIdleWait;
  bool send_heartbeat = false;
  std::optional<Status> silent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return wake;
    if (accepted_ && !shutdown_ && error_.ok()) {
      if (now - last_heard_ > heartbeat_timeout_) {
        silent = UnavailableError(fmt::format(
            "{}: scheduler at {} silent for {} ms (heartbeat timeout {} ms)", label_,
            options_.cluster.scheduler_address, Ms(now - last_heard_), heartbeat_timeout_.count()));
      } else {
        if (now >= next_heartbeat_) {
          send_heartbeat = true;
          next_heartbeat_ = now + heartbeat_interval_;
        }
        wake = std::min(next_heartbeat_, last_heard_ + heartbeat_timeout_ + milliseconds(1));
      }
    }
  }
  if (silent) {
    Fail(*silent);
    return now;
  }
  if (send_heartbeat) {
    v1::ControlMessage hb;
    hb.mutable_heartbeat()->set_seq(++heartbeat_seq_);
    hb.mutable_heartbeat()->set_sent_ns(trace::NowNs());
    if (Status s = SendToScheduler(hb); !s.ok()) {
      BP_LOG_DEBUG("{}: heartbeat to the scheduler failed: {}", label_, s.ToString());
    }
  }
  return wake;
}

}  // namespace bitpush::scheduler
