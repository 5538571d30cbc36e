// The timeline of one component (a worker engine, a server, a worker daemon): spans of work on
// tensor partitions, the clock exchanges with the scheduler, and the tensors' keys, written as
// one JSON-lines span file (docs/observability.md, "Span files") that `bitpush trace merge`
// joins with the other processes' files into one Chrome trace.
//
// The hot path (Span) copies a fixed-size record into a bounded ring under a mutex; a writer
// thread of the recorder's own formats and appends what the ring holds every
// kFlushInterval, so a traced round pays a lock and a copy per span, never a write. When the
// ring is full, new spans are dropped and counted (the file says how many), never waited for.
// Which rounds are traced is the StepFilter's (trace.steps): Wants(round) is the caller's
// cheap test before it reads a clock.
//
// Ownership: each component opens its own (Open; null when tracing is off) and owns it; two
// servers in one process write two files. Close (or the destructor) flushes and writes the
// `end` record; a process that dies leaves a file cut anywhere, which readers take as far as
// it goes.
// Thread-safety: every method may be called from any thread; Close from the owner, once the
// component's threads no longer record (later calls are ignored).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/trace/step_filter.h"

namespace bitpush::trace {

// What a span is (docs/observability.md lists each with its start and end).
enum class SpanKind : uint8_t {
  kDeclare,
  kPartition,
  kCompress,
  kPush,
  kNetwork,
  kDecompress,
  kOptimizer,
  kLocalReduce,
  kPushReceived,
  kQueued,
  kSum,
  kReplySent,
};
const char* SpanName(SpanKind kind);

struct RecorderOptions {
  std::string dir;                // where the file goes (created when missing)
  StepFilter steps;               // trace.steps
  size_t buffer_spans = 1 << 16;  // the ring's capacity
  std::string role;               // "worker", "server", "daemon"
  // The file's `process` record: the node row ("worker 0") and the part of the node.
  std::string process = "engine";
};

// Steady-clock nanoseconds: the clock of every span and clock sample of this process.
inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The same for a steady_clock time point (the engines' and servers' clocks).
inline int64_t ToNs(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

class Recorder {
 public:
  static constexpr std::chrono::milliseconds kFlushInterval{100};

  // Null when options.dir is empty (tracing off). Errors name the directory or file.
  static StatusOr<std::unique_ptr<Recorder>> Open(RecorderOptions options);
  ~Recorder();  // Close()
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Whether round `round` is traced (trace.steps).
  bool Wants(uint64_t round) const { return options_.steps.Wants(round); }
  const std::string& path() const { return path_; }

  // The rank, once known: writes the `process` record (node "<role> <rank>").
  void SetRank(uint32_t rank);

  // One span; `worker` / `server` / `local_rank` < 0: not applicable. `local_rank`: the training
  // process a daemon records a span for (its `optimizer` spans).
  void Span(SpanKind kind, int64_t start_ns, int64_t end_ns, uint64_t key, uint64_t round,
            uint64_t bytes, int32_t worker = -1, int32_t server = -1, int32_t local_rank = -1);
  // A tensor's partitions, in order (worker engines).
  void Tensor(const std::string& name, const std::vector<uint64_t>& keys);
  // One heartbeat exchange with the scheduler (the `clock` record's t0..t3).
  void Clock(int64_t t0, int64_t t1, int64_t t2, int64_t t3);

  // Spans recorded and dropped so far.
  uint64_t recorded() const;
  uint64_t dropped() const;

  // Flushes everything, writes the `end` record and closes the file. Idempotent.
  void Close();

 private:
  struct Record {
    int64_t start_ns;
    int64_t end_ns;
    uint64_t key;
    uint64_t round;
    uint64_t bytes;
    int32_t worker;
    int32_t server;
    int32_t local_rank;
    uint32_t tid;
    SpanKind kind;
  };

  Recorder(RecorderOptions options, std::FILE* file, std::string path);
  void WriterLoop();
  // Appends what waits (the writer thread, and Close after it stopped).
  void Drain();
  uint32_t TidLocked();

  const RecorderOptions options_;
  const std::string path_;
  std::FILE* const file_;  // the writer's (Drain under write_mu_)

  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool closing_ = false;
  bool closed_ = false;
  std::vector<Record> ring_;        // spans waiting for the writer (at most buffer_spans)
  std::vector<std::string> lines_;  // other records waiting (process, tensor, clock, thread)
  std::unordered_map<std::thread::id, uint32_t> tids_;
  uint64_t recorded_ = 0;
  uint64_t dropped_ = 0;
  uint64_t dropped_written_ = 0;

  std::mutex write_mu_;  // the file and the writer's scratch
  std::vector<Record> scratch_;
  std::thread writer_;
};

}  // namespace bitpush::trace
