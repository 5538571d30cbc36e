// The ucx endpoint's worker (ucx_transport.h): Start builds the UCP worker, its Active Message
// handler and the listener; the progress thread's loop sleeps on the worker's event fd and the
// wake-up eventfd, progresses UCX and runs the connection, send and receive steps; Shutdown
// flushes and closes every endpoint.
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/transport/ucx/ucx_transport.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {
namespace {

// The longest the progress thread sleeps without a wake-up (a bound, not a poll interval: UCX
// and Send wake it through its file descriptors).
constexpr milliseconds kIdleWait{200};
// How long Close (and the end of a Disconnect) lets UCX flush what was already handed to it.
constexpr milliseconds kCloseFlush{1000};

ucs_status_t AmCallback(void* arg, const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<UcxTransport*>(arg)->OnAm(header, header_length, data, length, param);
}

void ConnRequestCallback(ucp_conn_request_h request, void* arg) {
  static_cast<UcxTransport*>(arg)->OnConnRequest(request);
}

}  // namespace

Status UcxTransport::Start() {
  if (options_.security.mode == TransportSecurity::Mode::kCurve) {
    StatusOr<HelloAuth> auth = HelloAuth::Create(options_.name, options_.security);
    if (!auth.ok()) return Status(auth.status().code(), Prefix() + auth.status().message());
    auth_ = std::move(auth).value();
  }
  StatusOr<SockAddr> listen = ParseAddress(options_.listen_address);
  if (!listen.ok()) return Status(listen.status().code(), Prefix() + listen.status().message());
  StatusOr<ucp_context_h> context = NewContext(options_.ucx_config, ContextUse::kEndpoint);
  if (!context.ok()) return Status(context.status().code(), Prefix() + context.status().message());
  context_ = *context;

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread uses the worker at a time: Start here, then only the progress thread.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) return UnavailableError(Prefix() + "ucp_worker_create: " + ucs_status_string(s));

  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                  UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kAmId;
  am.flags = UCP_AM_FLAG_WHOLE_MSG;
  am.cb = &AmCallback;
  am.arg = this;
  s = ucp_worker_set_am_recv_handler(worker_, &am);
  if (s != UCS_OK)
    return InternalError(Prefix() + "ucp_worker_set_am_recv_handler: " + ucs_status_string(s));

  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = listen->Addr();
  lp.sockaddr.addrlen = listen->length;
  lp.conn_handler.cb = &ConnRequestCallback;
  lp.conn_handler.arg = this;
  s = ucp_listener_create(worker_, &lp, &listener_);
  if (s == UCS_ERR_BUSY) {
    return UnavailableError(Prefix() +
                            fmt::format("address {} is in use", options_.listen_address));
  }
  if (s != UCS_OK) {
    return UnavailableError(Prefix() + fmt::format("cannot listen on '{}': {}",
                                                   options_.listen_address, ucs_status_string(s)));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener_, &attr);
  if (s != UCS_OK) return InternalError(Prefix() + "ucp_listener_query: " + ucs_status_string(s));
  address_ = FormatAddress(attr.sockaddr);

  int worker_fd = -1;
  s = ucp_worker_get_efd(worker_, &worker_fd);
  if (s != UCS_OK) return InternalError(Prefix() + "ucp_worker_get_efd: " + ucs_status_string(s));
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) {
    return InternalError(Prefix() + "eventfd/epoll: " + std::strerror(errno));
  }
  for (int fd : {worker_fd, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return InternalError(Prefix() + "epoll_ctl: " + std::strerror(errno));
    }
  }
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "bp-ucx");
    Loop();
  });
  return Status::Ok();
}

void UcxTransport::Progress() {
  while (ucp_worker_progress(worker_) != 0) {
  }
  HandleDeferred();
  PollClosing();
}

void UcxTransport::Loop() {
  while (true) {
    std::deque<Command> commands;
    std::vector<std::shared_ptr<EpQuery>> queries;
    bool closing = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands.swap(commands_);
      queries.swap(queries_);
      closing = closed_;
      dirty_ = false;
    }
    ApplyCommands(&commands);
    AnswerQueries(&queries);
    if (closing) break;
    Progress();
    ReturnCredits();
    milliseconds wait = kIdleWait;
    ReconnectDue(Clock::now(), &wait);
    CloseGapped(Clock::now(), &wait);
    ExpireStalledSends(Clock::now(), &wait);
    FlushOutboxes();
    Progress();
    if (!failed_eps_.empty() || !conn_requests_.empty()) continue;
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;  // more to progress
    if (armed != UCS_OK) {
      BP_LOG_ERROR("{}ucp_worker_arm: {}", Prefix(), ucs_status_string(armed));
      wait = milliseconds(10);  // still bounded, never a hot spin
    }
    epoll_event events[2];
    const int n = epoll_wait(epoll_fd_, events, 2, static_cast<int>(wait.count()));
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t count = 0;
        (void)!read(wake_fd_, &count, sizeof(count));
      }
    }
  }
  Shutdown();
}

void UcxTransport::Shutdown() {
  ucp_listener_destroy(listener_);
  listener_ = nullptr;
  // Flush what was handed to UCX (each close flushes its endpoint), then tell the peers.
  for (auto& [name, p] : io_peers_) DropIoPeer(&p, /*force=*/false);
  io_peers_.clear();
  std::vector<uint64_t> ids;
  ids.reserve(in_conns_.size());
  for (const auto& [id, c] : in_conns_) ids.push_back(id);
  for (uint64_t id : ids) CloseInConn(id, /*force=*/false);
  const auto deadline = Clock::now() + kCloseFlush;
  while (!closing_.empty() && Clock::now() < deadline) {
    Progress();
    if (closing_.empty()) break;
    if (ucp_worker_arm(worker_) == UCS_OK) {
      epoll_event events[2];
      epoll_wait(epoll_fd_, events, 2, 10);
    }
  }
  if (!closing_.empty()) {
    BP_LOG_DEBUG("{}{} endpoint(s) did not finish closing within {} ms", Prefix(), closing_.size(),
                 kCloseFlush.count());
  }
  for (const auto& [r, ep] : closing_) ucp_request_free(r);
  closing_.clear();
}

void UcxTransport::AnswerQueries(std::vector<std::shared_ptr<EpQuery>>* queries) {
  for (const std::shared_ptr<EpQuery>& q : *queries) {
    StatusOr<std::string> answer =
        UnavailableError(Prefix() + fmt::format("no established connection to '{}'", q->peer));
    auto it = io_peers_.find(q->peer);
    if (it != io_peers_.end() && it->second.ep != nullptr && it->second.welcomed) {
      std::optional<std::string> info = EpInfo(it->second.ep);
      if (info) {
        answer = std::move(*info);
      } else {
        answer = InternalError(Prefix() + "open_memstream failed");
      }
    }
    std::lock_guard<std::mutex> lock(q->mu);
    q->answer = std::move(answer);
    q->done = true;
    q->cv.notify_all();
  }
}

void UcxTransport::HandleDeferred() {
  while (!failed_eps_.empty() || !conn_requests_.empty() || !refused_.empty()) {
    std::vector<ucp_conn_request_h> requests;
    requests.swap(conn_requests_);
    for (ucp_conn_request_h r : requests) AcceptConnection(r);
    std::vector<std::pair<ucp_ep_h, ucs_status_t>> failed;
    failed.swap(failed_eps_);
    for (const auto& [ep, status] : failed) HandleEpError(ep, status);
    std::vector<std::pair<uint64_t, std::string>> refused;
    refused.swap(refused_);
    for (const auto& [id, why] : refused) CloseInConn(id, /*force=*/true);
  }
}

void UcxTransport::PushEvent(const PeerId& peer, TransportEvent::Kind kind, Status status) {
  inbox_.PushEvent(peer, kind, std::move(status));
}

}  // namespace bitpush::transport::ucx_backend
