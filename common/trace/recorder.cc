#include "common/trace/recorder.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "common/logging.h"
#include "fmt/format.h"

namespace bitpush::trace {

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

Status MakeDirs(const std::string& dir) {
  std::string path;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    path = dir.substr(0, pos);
    if (path.empty()) continue;
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return UnavailableError(
          fmt::format("trace.dir: cannot create '{}': {}", path, std::strerror(errno)));
    }
  }
  return Status::Ok();
}

std::atomic<uint32_t> g_file_number{0};  // distinct files of one process (pid-<n>)

}  // namespace

const char* SpanName(SpanKind kind) {
  switch (kind) {
    case SpanKind::kDeclare: return "declare";
    case SpanKind::kPartition: return "partition";
    case SpanKind::kCompress: return "compress";
    case SpanKind::kPush: return "push";
    case SpanKind::kNetwork: return "network";
    case SpanKind::kDecompress: return "decompress";
    case SpanKind::kOptimizer: return "optimizer";
    case SpanKind::kLocalReduce: return "local_reduce";
    case SpanKind::kPushReceived: return "push_received";
    case SpanKind::kQueued: return "queued";
    case SpanKind::kSum: return "sum";
    case SpanKind::kReplySent: return "reply_sent";
  }
  return "unknown";
}

StatusOr<std::unique_ptr<Recorder>> Recorder::Open(RecorderOptions options) {
  if (options.dir.empty()) return std::unique_ptr<Recorder>();
  if (options.buffer_spans == 0) {
    return InvalidArgumentError("trace.buffer_spans must be at least 1");
  }
  BP_RETURN_IF_ERROR(MakeDirs(options.dir));
  const std::string path = fmt::format("{}/{}-{}-{}.jsonl", options.dir, options.role, getpid(),
                                       g_file_number.fetch_add(1));
  std::FILE* file = std::fopen(path.c_str(), "we");
  if (file == nullptr) {
    return UnavailableError(
        fmt::format("trace.dir: cannot write '{}': {}", path, std::strerror(errno)));
  }
  return std::unique_ptr<Recorder>(new Recorder(std::move(options), file, path));
}

Recorder::Recorder(RecorderOptions options, std::FILE* file, std::string path)
    : options_(std::move(options)), path_(std::move(path)), file_(file) {
  ring_.reserve(options_.buffer_spans);
  scratch_.reserve(options_.buffer_spans);
  writer_ = std::thread([this] { WriterLoop(); });
}

Recorder::~Recorder() {
  // Formatting cannot fail on these records (integers and strings), but a destructor must not
  // let an exception out in any case.
  try {
    Close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trace: closing '%s': %s\n", path_.c_str(), e.what());
  }
}

void Recorder::SetRank(uint32_t rank) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string line = fmt::format(
      "{{\"type\":\"process\",\"role\":{},\"rank\":{},\"node\":{},\"process\":{},\"pid\":{},"
      "\"host\":{},\"steps\":{},\"version\":1}}",
      JsonString(options_.role), rank,
      JsonString(fmt::format("{} {}", options_.role == "server" ? "server" : "worker", rank)),
      JsonString(options_.process), getpid(), JsonString(host),
      JsonString(options_.steps.ToString()));
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) lines_.push_back(std::move(line));
}

uint32_t Recorder::TidLocked() {
  const std::thread::id me = std::this_thread::get_id();
  auto it = tids_.find(me);
  if (it != tids_.end()) return it->second;
  const auto tid = static_cast<uint32_t>(tids_.size());
  tids_.emplace(me, tid);
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  lines_.push_back(
      fmt::format("{{\"type\":\"thread\",\"tid\":{},\"name\":{}}}", tid, JsonString(name)));
  return tid;
}

void Recorder::Span(SpanKind kind, int64_t start_ns, int64_t end_ns, uint64_t key, uint64_t round,
                    uint64_t bytes, int32_t worker, int32_t server, int32_t local_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  if (ring_.size() >= options_.buffer_spans) {
    ++dropped_;
    return;
  }
  ++recorded_;
  ring_.push_back(
      Record{start_ns, end_ns, key, round, bytes, worker, server, local_rank, TidLocked(), kind});
}

void Recorder::Tensor(const std::string& name, const std::vector<uint64_t>& keys) {
  std::string list;
  for (const uint64_t k : keys) list += (list.empty() ? "" : ",") + std::to_string(k);
  std::string line =
      fmt::format("{{\"type\":\"tensor\",\"name\":{},\"keys\":[{}]}}", JsonString(name), list);
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) lines_.push_back(std::move(line));
}

void Recorder::Clock(int64_t t0, int64_t t1, int64_t t2, int64_t t3) {
  std::string line =
      fmt::format("{{\"type\":\"clock\",\"t0\":{},\"t1\":{},\"t2\":{},\"t3\":{}}}", t0, t1, t2, t3);
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) lines_.push_back(std::move(line));
}

uint64_t Recorder::recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_;
}

uint64_t Recorder::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Recorder::WriterLoop() {
  pthread_setname_np(pthread_self(), "bp-trace");
  std::unique_lock<std::mutex> lock(mu_);
  while (!closing_) {
    wake_.wait_for(lock, kFlushInterval, [&] { return closing_; });
    lock.unlock();
    Drain();
    lock.lock();
  }
}

void Recorder::Drain() {
  std::lock_guard<std::mutex> write_lock(write_mu_);
  std::vector<std::string> lines;
  uint64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    scratch_.swap(ring_);
    lines.swap(lines_);
    if (dropped_ != dropped_written_) dropped = dropped_written_ = dropped_;
  }
  // Other records first: a tensor or thread record precedes the spans that name it.
  for (const std::string& line : lines) {
    std::fputs(line.c_str(), file_);
    std::fputc('\n', file_);
  }
  fmt::memory_buffer out;
  for (const Record& r : scratch_) {
    fmt::format_to(std::back_inserter(out),
                   "{{\"type\":\"span\",\"name\":\"{}\",\"ts\":{},\"dur\":{},\"tid\":{},"
                   "\"key\":{},\"round\":{},\"bytes\":{}",
                   SpanName(r.kind), r.start_ns, r.end_ns - r.start_ns, r.tid, r.key, r.round,
                   r.bytes);
    if (r.worker >= 0) fmt::format_to(std::back_inserter(out), ",\"worker\":{}", r.worker);
    if (r.server >= 0) fmt::format_to(std::back_inserter(out), ",\"server\":{}", r.server);
    if (r.local_rank >= 0) {
      fmt::format_to(std::back_inserter(out), ",\"local_rank\":{}", r.local_rank);
    }
    out.append(std::string_view("}\n"));
  }
  scratch_.clear();
  if (dropped != 0) {
    fmt::format_to(std::back_inserter(out), "{{\"type\":\"dropped\",\"count\":{}}}\n", dropped);
  }
  if (out.size() != 0) std::fwrite(out.data(), 1, out.size(), file_);
  std::fflush(file_);
}

void Recorder::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    closing_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
  Drain();
  uint64_t recorded, dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    recorded = recorded_;
    dropped = dropped_;
  }
  std::fprintf(file_, "{\"type\":\"end\",\"spans\":%llu,\"dropped\":%llu}\n",
               static_cast<unsigned long long>(recorded), static_cast<unsigned long long>(dropped));
  if (std::fclose(file_) != 0) {
    BP_LOG_WARN("trace: closing '{}': {}", path_, std::strerror(errno));
  }
}

}  // namespace bitpush::trace
