// TaskPool: a fixed set of threads running short jobs — the worker engine's compression pool
// (compress + push, decompress + complete). Two queues: urgent jobs (decompress: they finish
// partitions and return credit) run before normal ones (compress: they start new work).
//
// Jobs must not throw (exceptions never cross threads, docs/errors.md) and must not block for
// long. Shutdown() stops taking jobs, runs what is queued, and joins the threads; jobs are
// therefore never silently dropped, which lets their owners keep exact accounting.
//
// Owned by the worker Engine. Thread-safety: Post from any thread; Shutdown from one thread
// (not from a job); the destructor calls Shutdown.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace bitpush::worker {

class TaskPool {
 public:
  // Starts `threads` (>= 1) threads named `name` (visible in top/gdb, truncated to 15 chars).
  // With `cpus`, thread i pins itself to cpus[i % cpus.size()] (a failure is logged, the
  // thread runs unpinned).
  TaskPool(uint32_t threads, const std::string& name, const std::vector<int>& cpus = {});
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Queues a job. Returns false (and drops the job) after Shutdown began.
  bool Post(std::function<void()> job, bool urgent = false);

  // Runs every queued job, then joins the threads. Idempotent.
  void Shutdown();

  uint32_t size() const { return static_cast<uint32_t>(threads_.size()); }

 private:
  void Loop(int cpu);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> urgent_;  // guarded by mu_
  std::deque<std::function<void()>> normal_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  std::vector<std::thread> threads_;
};

// Threads of the compression pool for worker.compress_threads: the value itself, or for 0
// ("auto") the CPUs this process may run on, clamped to 1..8.
uint32_t ResolveCompressThreads(uint32_t configured);

}  // namespace bitpush::worker
