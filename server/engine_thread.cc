#include "server/engine_thread.h"

#include <pthread.h>
#include <time.h>

#include <chrono>
#include <utility>

#include "common/logging.h"

namespace bitpush::server {

namespace {

using Clock = std::chrono::steady_clock;
using v1::DataHeader;

// The calling thread's CPU time (ns).
uint64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

EngineThread::EngineThread(uint32_t rank, std::optional<CpuSlot> slot, WorkerPeers* workers,
                           trace::Recorder* trace, ServerCounters* counters)
    : rank_(rank), counters_(counters), key_table_(rank, workers, counters, trace) {
  if (slot) {
    slot_ = *slot;
    pin_ = true;
  }
}

void EngineThread::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void EngineThread::Enqueue(DataTask task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void EngineThread::DropKeys() {
  load_ = 0;
  keys_ = 0;
  Enqueue(DataTask{});  // op OP_UNSPECIFIED: drop every key of this engine
}

void EngineThread::RequestStop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
}

void EngineThread::Join() {
  if (thread_.joinable()) thread_.join();
}

EngineThreadInfo EngineThread::Info() const {
  EngineThreadInfo info;
  if (pin_) {
    info.cpu = slot_.cpu;
    info.numa_node = slot_.numa_node;
  }
  info.keys = keys_.load();
  info.load = load_.load();
  {
    std::lock_guard<std::mutex> lock(mu_);
    info.queued = queue_.size();
  }
  return info;
}

void EngineThread::Loop() {
  pthread_setname_np(pthread_self(), "bp-sengine");  // top, perf and the timeline's rows
  if (pin_) {
    const Status pinned = PinCurrentThread(slot_.cpu);
    if (!pinned.ok()) {
      BP_LOG_WARN("server {}: {}", rank_, pinned.ToString());
      pin_ = false;
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    DataTask task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    const Clock::time_point start = Clock::now();
    const uint64_t cpu_start = ThreadCpuNs();
    if (task.header.op() == DataHeader::OP_UNSPECIFIED) {  // DropKeys
      key_table_.Clear();
    } else if (task.header.op() == DataHeader::OP_INIT_KEY) {
      key_table_.Init(task);
    } else if (task.header.op() == DataHeader::OP_STATE_READ ||
               task.header.op() == DataHeader::OP_STATE_WRITE) {
      key_table_.State(task);
    } else {
      key_table_.Push(task);
    }
    counters_->engine_busy_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    counters_->engine_cpu_ns += ThreadCpuNs() - cpu_start;
    lock.lock();
  }
}

}  // namespace bitpush::server
