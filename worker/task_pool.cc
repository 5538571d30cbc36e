#include "worker/task_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <utility>

#include "common/cpu_topology.h"
#include "common/logging.h"

namespace bitpush::worker {

TaskPool::TaskPool(uint32_t threads, const std::string& name, const std::vector<int>& cpus) {
  BP_CHECK(threads >= 1, "TaskPool needs at least one thread");
  threads_.reserve(threads);
  for (uint32_t i = 0; i < threads; ++i) {
    const int cpu = cpus.empty() ? -1 : cpus[i % cpus.size()];
    threads_.emplace_back([this, cpu] { Loop(cpu); });
    const std::string thread_name = (name + std::to_string(i)).substr(0, 15);
    pthread_setname_np(threads_.back().native_handle(), thread_name.c_str());
  }
}

TaskPool::~TaskPool() {
  Shutdown();
}

bool TaskPool::Post(std::function<void()> job, bool urgent) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    (urgent ? urgent_ : normal_).push_back(std::move(job));
  }
  cv_.notify_one();
  return true;
}

void TaskPool::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void TaskPool::Loop(int cpu) {
  if (cpu >= 0) {
    const Status pinned = PinCurrentThread(cpu);
    if (!pinned.ok()) BP_LOG_WARN("{}", pinned.ToString());
  }
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !urgent_.empty() || !normal_.empty(); });
      std::deque<std::function<void()>>& q = !urgent_.empty() ? urgent_ : normal_;
      if (q.empty()) return;  // stopping and drained
      job = std::move(q.front());
      q.pop_front();
    }
    job();
  }
}

uint32_t ResolveCompressThreads(uint32_t configured) {
  if (configured > 0) return configured;
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = 1;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  return static_cast<uint32_t>(std::clamp(cpus, 1, 8));
}

}  // namespace bitpush::worker
