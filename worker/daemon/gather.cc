// The daemon's gather: checking and keeping each process's LocalPushPull of a round (its
// shared-memory slices), handing the round to the round executor once every process handed it
// in, and failing rounds not gathered within the bound. Poll loop.
// (Members of worker::Daemon, worker/daemon.h; the shared state is worker/daemon/daemon_state.h.)
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "common/logging.h"
#include "common/vector_ops.h"
#include "worker/daemon.h"
#include "worker/daemon/daemon_state.h"
#include "worker/ipc/local_protocol.h"

namespace bitpush::worker {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

}  // namespace

void Daemon::SendDone(ipc::Channel& ch, uint32_t tensor, uint64_t round, const Status& s,
                      uint64_t bytes_pushed, uint64_t bytes_pulled) {
  v1::LocalMessage m;
  v1::LocalPushPullDone* d = m.mutable_push_pull_done();
  d->set_tensor(tensor);
  d->set_round(round);
  d->set_status_code(static_cast<uint32_t>(s.code()));
  d->set_message(s.message());
  d->set_bytes_pushed(bytes_pushed);
  d->set_bytes_pulled(bytes_pulled);
  const Status sent = ipc::SendLocalMessage(ch, m);
  if (!sent.ok()) BP_LOG_DEBUG("{}: {}", label_, sent.ToString());
}

void Daemon::OnPushPull(Conn& c, const v1::LocalPushPull& p) {
  auto refuse = [&](const Status& s) { SendDone(*c.channel, p.tensor(), p.round(), s); };
  if (p.tensor() >= tensors_.size() || !tensors_[p.tensor()]->decided) {
    refuse(FailedPreconditionError(fmt::format(
        "{}: push_pull of tensor #{} before every local process declared it", label_, p.tensor())));
    return;
  }
  TensorState& t = *tensors_[p.tensor()];
  if (!t.verdict.ok()) return refuse(t.verdict);
  if (!t.error.ok()) return refuse(t.error);
  if (c.next_round.size() <= t.index) c.next_round.resize(t.index + 1, 0);
  if (p.round() != c.next_round[t.index]) {
    return refuse(InvalidArgumentError(
        fmt::format("{}: {} handed in round {} of tensor '{}', "
                    "expected round {}",
                    label_, c.who, p.round(), t.first.name(), c.next_round[t.index])));
  }
  Slot slot;
  slot.channel = c.channel;
  slot.who = c.who;
  if (t.cuda != p.has_gpu()) {
    return refuse(InvalidArgumentError(
        fmt::format("{}: {} handed in tensor '{}' {} but it was declared {}", label_, c.who,
                    t.first.name(), p.has_gpu() ? "in GPU memory" : "in shared memory",
                    t.cuda ? "on a GPU" : "in host memory")));
  }
  if (t.cuda) {
    const v1::GpuSlice& g = p.gpu();
    if (g.bytes() != t.bytes || g.ipc_handle().size() != sizeof(gpu::GpuIpcHandle::bytes)) {
      return refuse(InvalidArgumentError(fmt::format(
          "{}: {}: GPU slice of tensor '{}' has {} bytes and a {}-byte handle, expected {} and {}",
          label_, c.who, t.first.name(), g.bytes(), g.ipc_handle().size(), t.bytes,
          sizeof(gpu::GpuIpcHandle::bytes))));
    }
    std::shared_ptr<gpu::IpcMapping>& map = c.gpu_maps[g.ipc_handle()];
    if (!map) {
      StatusOr<int> device = gpu::DeviceFromPciBusId(g.pci_bus_id());
      gpu::GpuIpcHandle h;
      std::memcpy(h.bytes.data(), g.ipc_handle().data(), h.bytes.size());
      StatusOr<gpu::IpcMapping> opened = device.ok() ? gpu::IpcMapping::Open(h, *device)
                                                     : StatusOr<gpu::IpcMapping>(device.status());
      if (!opened.ok()) {
        c.gpu_maps.erase(g.ipc_handle());
        return refuse(opened.status().WithContext(
            fmt::format("{}: GPU buffer of {} for tensor '{}'", label_, c.who, t.first.name())));
      }
      map = std::make_shared<gpu::IpcMapping>(std::move(opened).value());
    }
    slot.gpu = map;
  }
  for (int k = 0; k < 2 && !t.cuda; ++k) {
    const v1::ShmSlice& s = k == 0 ? p.input() : p.output();
    StatusOr<std::shared_ptr<ipc::ShmSegment>> seg =
        MapSlice(c, s, t.bytes, k == 0 ? "input" : "output");
    if (!seg.ok()) return refuse(seg.status());
    (k == 0 ? slot.in : slot.out) = *seg;
    (k == 0 ? slot.in_offset : slot.out_offset) = s.offset();
  }
  if (t.handed == 0) {
    t.round = p.round();
    t.deadline = Clock::now() + gather_timeout_;
  } else if (p.round() != t.round) {
    return refuse(InvalidArgumentError(
        fmt::format("{}: {} handed in round {} of tensor '{}' while round {} is being gathered",
                    label_, c.who, p.round(), t.first.name(), t.round)));
  }
  ++c.next_round[t.index];
  t.present[c.local_rank] = true;
  t.slots[c.local_rank] = std::move(slot);
  ++t.handed;
  MaybeDispatch(t);
}

StatusOr<std::shared_ptr<ipc::ShmSegment>> Daemon::MapSlice(Conn& c, const v1::ShmSlice& s,
                                                            uint64_t expected_bytes,
                                                            std::string_view what) {
  BP_RETURN_IF_ERROR(ipc::ValidateSlice(s, c.pid, expected_bytes, what));
  std::shared_ptr<ipc::ShmSegment>& seg = c.segments[s.segment()];
  if (!seg) {
    StatusOr<ipc::ShmSegment> opened = ipc::ShmSegment::Open(s.segment(), s.segment_bytes());
    if (!opened.ok()) {
      c.segments.erase(s.segment());
      return opened.status();
    }
    seg = std::make_shared<ipc::ShmSegment>(std::move(opened).value());
  } else if (seg->size() != s.segment_bytes()) {
    return InvalidArgumentError(fmt::format("{}: segment {} is {} bytes, not {}", label_,
                                            s.segment(), seg->size(), s.segment_bytes()));
  }
  BP_RETURN_IF_ERROR(seg->CheckSize());
  return seg;
}

void Daemon::MaybeDispatch(TensorState& t) {
  if (ended_ || t.in_flight || local_size_ == 0 || t.handed < local_size_) return;
  auto job = std::make_unique<RoundJob>();
  job->tensor = &t;
  job->round = t.round;
  job->slots = std::move(t.slots);
  t.slots.assign(local_size_, Slot());
  t.present.assign(local_size_, false);
  t.handed = 0;
  t.in_flight = true;
  t.flight_round = job->round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_queue_.push_back(std::move(job));
  }
  round_cv_.notify_one();
}

void Daemon::CheckGatherDeadlines() {
  const Clock::time_point now = Clock::now();
  for (const auto& tp : tensors_) {
    TensorState& t = *tp;
    if (t.handed == 0 || t.handed >= local_size_ || now < t.deadline) continue;
    std::string missing;
    for (uint32_t r = 0; r < local_size_; ++r) {
      if (t.present[r]) continue;
      std::string who = fmt::format("local rank {}", r);
      for (const auto& c : conns_) {
        if (c->hello && c->local_rank == r) who = c->who;
      }
      missing += (missing.empty() ? "" : ", ") + who;
    }
    t.error = TimeoutError(
        fmt::format("{}: round {} of tensor '{}' incomplete after {} ms: no push_pull from {}",
                    label_, t.round, t.first.name(), gather_timeout_.count(), missing));
    BP_LOG_ERROR("{}", t.error.message());
    for (uint32_t r = 0; r < local_size_; ++r) {
      if (t.present[r]) SendDone(*t.slots[r].channel, t.index, t.round, t.error);
    }
    t.slots.assign(local_size_, Slot());
    t.present.assign(local_size_, false);
    t.handed = 0;
  }
}

}  // namespace bitpush::worker
