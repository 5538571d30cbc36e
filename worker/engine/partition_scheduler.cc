#include "worker/engine/partition_scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>

#include "common/logging.h"

namespace bitpush::worker {

namespace {

// Partitions listed by name in a timeout message; the rest are counted.
constexpr size_t kListedPartitions = 8;
// worker.server_window_bytes auto: at least this many partitions per server.
constexpr uint64_t kAutoWindowPartitions = 4;

}  // namespace

PartitionScheduler::PartitionScheduler(EngineState& state, StartJob start_job)
    : state_(state), start_job_(std::move(start_job)) {}

void PartitionScheduler::Start() {
  dispatcher_ = std::thread([this] { DispatchLoop(); });
}

void PartitionScheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    stop_ = true;
  }
  dispatch_cv_.notify_all();
  if (dispatcher_.joinable()) dispatcher_.join();
}

void PartitionScheduler::EnqueueLocked(Tensor& t, const std::shared_ptr<OpState>& op) {
  op->deadline = state_.clock->Now() + state_.cluster.worker.op_timeout;
  op->remaining = t.partitions.size();
  t.op = op;
  deadlines_.insert({op->deadline, t.index});
  const uint64_t seq = next_op_seq_++;
  for (Partition& p : t.partitions) {
    p.stage = Stage::kQueued;
    p.seq = seq;
    active_.insert({seq, t.index, p.range.index});
    ready_.push(Ready{t.options.priority, t.index, p.range.index});
  }
  dispatch_cv_.notify_one();
}

void PartitionScheduler::FillStatsLocked(ClientStats* s) const {
  s->bytes_in_flight = in_flight_bytes_;
  s->partitions_queued = ready_.size();
}

// ---------------------------------------------------------------------------------------------
// Dispatcher

void PartitionScheduler::DispatchLoop() {
  std::unique_lock<std::mutex> lock(state_.mu);
  while (!stop_) {
    DispatchReadyLocked();
    const Clock::time_point now = state_.clock->Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const uint32_t ti = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      Tensor& t = *state_.tensors[ti];
      if (t.op && !t.op->failed) {
        std::shared_ptr<OpState> op = t.op;
        FailOpLocked(t, op, TimeoutStatusLocked(t, *op));
        MaybeFinishLocked(t, op);
      }
    }
    if (stop_) break;
    if (deadlines_.empty()) {
      dispatch_cv_.wait(lock);
    } else {
      // A copy: the set's element may be erased while the lock is released.
      const Clock::time_point next = deadlines_.begin()->first;
      state_.clock->WaitOnce(lock, dispatch_cv_, next);
    }
  }
}

void PartitionScheduler::DispatchReadyLocked() {
  if (stop_) return;
  const uint64_t credit = state_.cluster.worker.credit_bytes;
  const uint64_t window = state_.cluster.worker.ServerWindowBytes();
  const size_t servers = std::max<size_t>(1, state_.cluster.servers.size());
  std::vector<Ready>& waiting = waiting_;
  std::vector<bool>& full = full_;
  full.assign(servers, false);
  size_t full_servers = 0;
  while (!ready_.empty()) {
    const Ready top = ready_.top();
    Tensor& t = *state_.tensors[top.tensor];
    Partition& p = t.partitions[top.partition];
    if (!t.op || t.op->failed || p.stage != Stage::kQueued) {
      ready_.pop();  // left by an op that failed
      continue;
    }
    if (in_flight_bytes_ > 0 && in_flight_bytes_ + p.bytes > credit) break;
    if (!t.compressed && !FitsServerWindowLocked(p, window)) {
      // This server waits; the next partitions (other servers) may go.
      waiting.push_back(top);
      ready_.pop();
      if (p.server >= full.size()) full.resize(p.server + 1, false);
      if (!full[p.server]) {
        full[p.server] = true;
        if (++full_servers >= servers) break;  // every server waits
      }
      continue;
    }
    ready_.pop();
    StartLocked(t, top.partition);
  }
  for (const Ready& r : waiting) ready_.push(r);
  waiting.clear();
  // The first partition in posting order always goes (see "Credit without deadlock").
  if (!active_.empty()) {
    const auto [seq, ti, j] = *active_.begin();
    Tensor& t = *state_.tensors[ti];
    if (t.partitions[j].stage == Stage::kQueued && t.op && !t.op->failed) StartLocked(t, j);
  }
}

void PartitionScheduler::StartLocked(Tensor& t, uint32_t j) {
  Partition& p = t.partitions[j];
  in_flight_bytes_ += p.bytes;
  if (!t.compressed) {
    uint64_t& at = RawBytesAt(p.server);
    at += p.bytes;
    state_.stats.peak_server_window_bytes = std::max(state_.stats.peak_server_window_bytes, at);
  }
  state_.stats.peak_bytes_in_flight = std::max(state_.stats.peak_bytes_in_flight, in_flight_bytes_);
  p.stage = Stage::kCompressing;
  p.round = p.next_round++;
  std::shared_ptr<OpState> op = t.op;
  ++op->active_jobs;
  if (!start_job_(&t, j, op, p.round)) {
    SetIdleLocked(t, p);
    FailOpLocked(t, op, CancelledError(state_.label + ": the engine is stopping"));
    JobDoneLocked(t, op);
  }
}

uint64_t& PartitionScheduler::RawBytesAt(uint32_t server) {
  if (server >= raw_by_server_.size()) raw_by_server_.resize(server + 1, 0);
  return raw_by_server_[server];
}

bool PartitionScheduler::FitsServerWindowLocked(const Partition& p, uint64_t window) {
  const uint64_t at = RawBytesAt(p.server);
  // auto: room for kAutoWindowPartitions of this size at least, so the window never
  // serialises a server's partitions.
  if (state_.cluster.worker.server_window_bytes == 0) {
    window = std::max(window, kAutoWindowPartitions * p.bytes);
  }
  return at == 0 || at + p.bytes <= window;
}

Status PartitionScheduler::TimeoutStatusLocked(const Tensor& t, const OpState& op) const {
  std::set<uint32_t> servers;
  std::string listed;
  size_t missing = 0;
  for (const Partition& p : t.partitions) {
    if (p.stage == Stage::kIdle) continue;  // complete
    ++missing;
    servers.insert(p.server);
    if (missing > kListedPartitions) continue;
    std::string stage;
    switch (p.stage) {
      case Stage::kQueued: stage = "not started (waiting for credit)"; break;
      case Stage::kCompressing: stage = fmt::format("compressing round {}", p.round); break;
      case Stage::kOnWire: stage = fmt::format("pushed round {}, no reply", p.round); break;
      case Stage::kDecompressing: stage = fmt::format("decompressing round {}", p.round); break;
      case Stage::kIdle: break;
    }
    listed += fmt::format("{}partition {} (key {}) on server {}: {}", listed.empty() ? "" : "; ",
                          p.range.index, p.range.key, p.server, stage);
  }
  if (missing > kListedPartitions) {
    listed += fmt::format("; and {} more", missing - kListedPartitions);
  }
  std::string server_list;
  for (uint32_t s : servers) server_list += (server_list.empty() ? "" : ", ") + std::to_string(s);
  return TimeoutError(fmt::format(
      "{}: push_pull of tensor '{}' timed out after {} ms (worker.op_timeout): {} of {} "
      "partitions incomplete, waiting for server(s) {}: {}",
      state_.label, t.name, state_.cluster.worker.op_timeout.count(), missing, t.partitions.size(),
      server_list, listed));
}

// ---------------------------------------------------------------------------------------------
// Bookkeeping (mu held)

void PartitionScheduler::SetIdleLocked(Tensor& t, Partition& p) {
  if (p.stage == Stage::kIdle) return;
  ReleaseLocked(t, p);
  dispatch_cv_.notify_one();
}

void PartitionScheduler::CompleteLocked(Tensor& t, Partition& p,
                                        const std::shared_ptr<OpState>& op) {
  if (p.stage != Stage::kIdle) ReleaseLocked(t, p);
  JobDoneLocked(t, op);
  DispatchReadyLocked();
}

void PartitionScheduler::ReleaseLocked(Tensor& t, Partition& p) {
  if (p.stage != Stage::kQueued) {
    BP_CHECK(in_flight_bytes_ >= p.bytes, "credit accounting underflow");
    in_flight_bytes_ -= p.bytes;
    if (!t.compressed) {
      BP_CHECK(RawBytesAt(p.server) >= p.bytes, "server window accounting underflow");
      RawBytesAt(p.server) -= p.bytes;
    }
  }
  active_.erase({p.seq, t.index, p.range.index});
  p.stage = Stage::kIdle;
}

void PartitionScheduler::FailOpLocked(Tensor& t, const std::shared_ptr<OpState>& op,
                                      const Status& error) {
  if (op->failed || op->finished) return;
  op->failed = true;
  op->error = error;
  // The tensor's rounds are now out of step with the servers' (sticky).
  if (t.error.ok()) t.error = error;
  deadlines_.erase({op->deadline, t.index});
  for (Partition& p : t.partitions) {
    // Queued partitions never started; pushed ones no longer wait for their reply (a late
    // reply is dropped). Compressing/decompressing ones belong to their job, which cleans up.
    if (p.stage == Stage::kQueued || p.stage == Stage::kOnWire) SetIdleLocked(t, p);
  }
  dispatch_cv_.notify_one();
}

void PartitionScheduler::FailAllLocked(const Status& error) {
  for (const auto& tp : state_.tensors) {
    Tensor& t = *tp;
    if (!t.op || t.op->failed) continue;
    std::shared_ptr<OpState> op = t.op;
    FailOpLocked(
        t, op,
        error.WithContext(fmt::format("{}: push_pull of tensor '{}'", state_.label, t.name)));
    MaybeFinishLocked(t, op);
  }
}

void PartitionScheduler::JobDoneLocked(Tensor& t, const std::shared_ptr<OpState>& op) {
  BP_CHECK(op->active_jobs > 0, "job accounting underflow");
  --op->active_jobs;
  MaybeFinishLocked(t, op);
}

void PartitionScheduler::MaybeFinishLocked(Tensor& t, const std::shared_ptr<OpState>& op) {
  if (op->finished || op->active_jobs > 0) return;
  if (!op->failed && op->remaining > 0) return;
  op->finished = true;
  if (t.op == op) t.op.reset();
  deadlines_.erase({op->deadline, t.index});
  ClientStats& stats = state_.stats;
  if (op->failed) {
    ++stats.ops_failed;
  } else {
    ++stats.ops_completed;
    ++t.rounds_done;
    stats.last_push_ns += Ns(op->last_push - op->started);
    stats.first_reply_ns += Ns(op->first_reply - op->started);
    stats.op_ns += Ns(EngineClock::now() - op->started);
  }
  op->Complete(op->failed ? op->error : Status::Ok());
}

}  // namespace bitpush::worker
