// The ucx endpoint's connections (ucx_transport.h), on the progress thread: a client endpoint
// per Connect()ed peer (connected, reconnected with back-off, reported up and down), the
// connections the listener accepts, and endpoints being closed.
#include <algorithm>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/transport/ucx/ucx_transport.h"
#include "fmt/format.h"

namespace bitpush::transport::ucx_backend {
namespace {

void EpErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status) {
  static_cast<UcxTransport*>(arg)->OnEpError(ep, status);
}

}  // namespace

void UcxTransport::ApplyCommands(std::deque<Command>* commands) {
  for (Command& c : *commands) {
    auto it = io_peers_.find(c.peer);
    if (it != io_peers_.end()) {
      if (c.kind == Command::Kind::kRemove && it->second.shared != c.shared) continue;
      DropIoPeer(&it->second, /*force=*/false);
      io_peers_.erase(it);
    }
    if (c.kind == Command::Kind::kAdd) {
      IoPeer& p = io_peers_[c.peer];
      p.shared = c.shared;
      StartConnect(c.peer, &p);
    }
  }
}

void UcxTransport::DropIoPeer(IoPeer* p, bool force) {
  if (p->ep == nullptr) return;
  out_by_ep_.erase(p->ep);
  CloseEp(p->ep, force);
  p->ep = nullptr;
}

void UcxTransport::StartConnect(const PeerId& name, IoPeer* p) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = p->shared->sockaddr.Addr();
  ep.sockaddr.addrlen = p->shared->sockaddr.length;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &EpErrorCallback;
  ep.err_handler.arg = this;
  p->welcomed = false;
  p->credits = 0;
  p->next_seq = 0;
  const ucs_status_t s = ucp_ep_create(worker_, &ep, &p->ep);
  if (s != UCS_OK) {
    p->ep = nullptr;
    p->retry_at = Clock::now() + p->backoff;
    p->backoff = std::min(2 * p->backoff, kRetryMax);
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("connect:" + name, &suppressed)) {
      BP_LOG_WARN("{}connecting to '{}' at {}: {}; retrying", Prefix(), name, p->shared->address,
                  ucs_status_string(s));
    }
    return;
  }
  out_by_ep_[p->ep] = name;
  // The first message on every connection names this endpoint (and under kCurve proves it).
  p->hello_sent = false;
  SendControl(p->ep, AmType::kHello, 0,
              EncodeHello(HelloPayload{options_.name, p->shared->hello_token}), /*hello=*/true);
}

void UcxTransport::ReconnectDue(Clock::time_point now, milliseconds* wait) {
  for (auto& [name, p] : io_peers_) {
    if (p.ep != nullptr) continue;
    if (p.retry_at <= now) {
      StartConnect(name, &p);
    } else {
      *wait = std::min(*wait, std::chrono::ceil<milliseconds>(p.retry_at - now));
    }
  }
}

void UcxTransport::CloseEp(ucp_ep_h ep, bool force) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.emplace_back(r, ep);
}

void UcxTransport::PollClosing() {
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(it->first) == UCS_INPROGRESS) {
      ++it;
      continue;
    }
    ucp_request_free(it->first);
    it = closing_.erase(it);
  }
}

void UcxTransport::CloseInConn(uint64_t id, bool force) {
  auto it = in_conns_.find(id);
  if (it == in_conns_.end()) return;
  in_by_ep_.erase(it->second.ep);
  CloseEp(it->second.ep, force);
  gapped_.erase(it->first);
  in_conns_.erase(it);  // slots still receiving: their RecvOps find no connection and drop
  inbox_.RemoveConnection(id);
}

void UcxTransport::AcceptConnection(ucp_conn_request_h request) {
  if (in_conns_.size() >= options_.max_connections) {
    ucp_listener_reject(listener_, request);
    connections_refused_.fetch_add(1, std::memory_order_relaxed);
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("connections", &suppressed)) {
      BP_LOG_WARN("{}refused a connection: {} are open, the limit is {}{}", Prefix(),
                  in_conns_.size(), options_.max_connections,
                  suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
    return;
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.conn_request = request;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &EpErrorCallback;
  ep.err_handler.arg = this;
  ucp_ep_h handle = nullptr;
  const ucs_status_t s = ucp_ep_create(worker_, &ep, &handle);
  if (s != UCS_OK) {
    BP_LOG_WARN("{}accepting a connection: {}", Prefix(), ucs_status_string(s));
    return;
  }
  const uint64_t id = next_conn_id_++;
  InConn& c = in_conns_[id];
  c.id = id;
  c.ep = handle;
  in_by_ep_[handle] = id;
  inbox_.AddConnection(id);
}

void UcxTransport::HandleEpError(ucp_ep_h ep, ucs_status_t status) {
  if (auto in = in_by_ep_.find(ep); in != in_by_ep_.end()) {
    const uint64_t id = in->second;
    BP_LOG_DEBUG("{}the connection from '{}' ended: {}", Prefix(), in_conns_.at(id).name,
                 ucs_status_string(status));
    CloseInConn(id, /*force=*/true);
    return;
  }
  auto out = out_by_ep_.find(ep);
  if (out == out_by_ep_.end()) return;  // already closed by us
  const PeerId name = out->second;
  IoPeer& p = io_peers_.at(name);
  const bool was_up = p.welcomed;
  if (!was_up && p.hello_sent) {
    uint64_t suppressed = 0;
    if (log_limiter_.Allow("closed-before-welcome:" + name, &suppressed)) {
      const std::string hint =
          auth_ ? fmt::format(
                      "does '{}' run security mode curve and list this node's public key "
                      "under the name '{}'?",
                      p.shared->key_owner, options_.name)
                : fmt::format("does '{}' run security mode none too?", p.shared->key_owner);
      BP_LOG_WARN(
          "{}'{}' at {} closed the connection after its HELLO, before accepting it ({}): "
          "refused? ({}) Retrying{}",
          Prefix(), name, p.shared->address, ucs_status_string(status), hint,
          suppressed ? fmt::format(" ({} more since the last report)", suppressed) : "");
    }
  }
  p.hello_sent = false;
  DropIoPeer(&p, /*force=*/true);
  p.welcomed = false;
  p.credits = 0;
  p.retry_at = Clock::now() + p.backoff;
  p.backoff = std::min(2 * p.backoff, kRetryMax);
  if (was_up) PeerDown(name, &p, status);
}

void UcxTransport::PeerUp(const PeerId& name, IoPeer* p) {
  p->welcomed = true;
  p->am_over_shm = AmOverSharedMemory(p->ep);
  p->backoff = kRetryMin;
  bool reconnected = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reconnected = p->shared->state == PeerState::kDisconnected;
    p->shared->state = PeerState::kConnected;
    p->shared->last_error = Status::Ok();
    space_.notify_all();
  }
  if (reconnected) PushEvent(name, TransportEvent::Kind::kPeerConnected, Status::Ok());
}

void UcxTransport::PeerDown(const PeerId& name, IoPeer* p, ucs_status_t why) {
  const Status status =
      UnavailableError(Prefix() + fmt::format("peer '{}' at {} disconnected: {}", name,
                                              p->shared->address, ucs_status_string(why)));
  std::deque<Message> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    p->shared->state = PeerState::kDisconnected;
    p->shared->last_error = status;
    dropped.swap(p->shared->outbox);
    space_.notify_all();
  }
  PushEvent(name, TransportEvent::Kind::kPeerDisconnected, status);
}

}  // namespace bitpush::transport::ucx_backend
