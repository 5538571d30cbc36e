#include "worker/ipc/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/logging.h"

namespace bitpush::worker::ipc {
namespace {

// Linux keeps POSIX shared memory in /dev/shm: the signal path unlinks there directly, because
// unlink(2) is async-signal-safe and shm_unlink(3) is not on POSIX's list.
constexpr char kShmDir[] = "/dev/shm/";
constexpr size_t kShmDirLen = sizeof(kShmDir) - 1;
constexpr size_t kMaxNameLen = 250;  // without the leading '/'; NAME_MAX is 255
constexpr size_t kPathCap = kShmDirLen + kMaxNameLen + 1;

// One entry of the cleanup list. States: free -> filling (the registering thread owns the
// path) -> live (the path is published; release/acquire on `state`) -> free.
enum SlotState : int { kFree = 0, kFilling = 1, kLive = 2 };
struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<pid_t> pid{0};
  char path[kPathCap];
};
Slot g_slots[kMaxLiveSegments];
std::atomic<uint64_t> g_name_counter{0};
std::once_flag g_atexit_once;

void AtExitCleanup() {
  UnlinkAllSegments();
}

// Enters "/dev/shm/<name>" (name without '/') in the list; -1 when the list is full.
int RegisterName(std::string_view bare_name) {
  std::call_once(g_atexit_once, [] { std::atexit(AtExitCleanup); });
  for (int i = 0; i < kMaxLiveSegments; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kFilling, std::memory_order_acquire)) {
      continue;
    }
    Slot& s = g_slots[i];
    std::memcpy(s.path, kShmDir, kShmDirLen);
    std::memcpy(s.path + kShmDirLen, bare_name.data(), bare_name.size());
    s.path[kShmDirLen + bare_name.size()] = '\0';
    s.pid.store(getpid(), std::memory_order_relaxed);
    s.state.store(kLive, std::memory_order_release);
    return i;
  }
  return -1;
}

void ReleaseSlot(int slot) {
  if (slot >= 0) g_slots[slot].state.store(kFree, std::memory_order_release);
}

std::string ErrnoText(int err) {
  return std::strerror(err);
}

Status ValidateName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() - 1 > kMaxNameLen) {
    return InvalidArgumentError(fmt::format(
        "shared-memory segment name '{}' must be '/' followed by 1..{} characters without '/'",
        name, kMaxNameLen));
  }
  return Status::Ok();
}

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

StatusOr<ShmSegment> ShmSegment::CreateInternal(const std::string& name, size_t bytes,
                                                int* open_errno) {
  *open_errno = 0;
  BP_RETURN_IF_ERROR(ValidateName(name));
  if (bytes == 0) {
    return InvalidArgumentError(
        fmt::format("shared-memory segment {}: a segment needs at least 1 byte", name));
  }
  // Listed before it exists: a signal between shm_open and the listing cannot leak it.
  int slot = RegisterName(std::string_view(name).substr(1));
  if (slot < 0) {
    return OutOfRangeError(fmt::format(
        "cannot create shared-memory segment {}: this process already has {} live segments", name,
        kMaxLiveSegments));
  }
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    *open_errno = errno;
    ReleaseSlot(slot);  // not ours to unlink (EEXIST) or never created
    return UnavailableError(
        fmt::format("cannot create shared-memory segment {}: {}", name, ErrnoText(*open_errno)));
  }
  // From here on the object owns fd, name and slot: every error return unlinks the name.
  ShmSegment seg(name, fd, slot);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return UnavailableError(fmt::format("cannot size shared-memory segment {} to {} bytes: {}",
                                        name, bytes, ErrnoText(errno)));
  }
  // Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS at first touch.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    return UnavailableError(
        fmt::format("cannot reserve {} bytes for shared-memory segment {} (is /dev/shm full?): {}",
                    bytes, name, ErrnoText(err)));
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return UnavailableError(
        fmt::format("cannot map shared-memory segment {}: {}", name, ErrnoText(errno)));
  }
  seg.data_ = data;
  seg.size_ = bytes;
  return seg;
}

ShmSegment::~ShmSegment() {
  Reset();
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(other.data_),
      size_(other.size_),
      fd_(other.fd_),
      slot_(other.slot_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.fd_ = -1;
  other.slot_ = -1;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    data_ = other.data_;
    size_ = other.size_;
    fd_ = other.fd_;
    slot_ = other.slot_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.fd_ = -1;
    other.slot_ = -1;
  }
  return *this;
}

void ShmSegment::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  if (slot_ >= 0) {
    Status s = Unlink();
    if (!s.ok()) BP_LOG_WARN("{}", s.ToString());
  }
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
  slot_ = -1;
}

StatusOr<ShmSegment> ShmSegment::Create(const std::string& name, size_t bytes) {
  int open_errno = 0;
  return CreateInternal(name, bytes, &open_errno);
}

StatusOr<ShmSegment> ShmSegment::Create(size_t bytes, std::string_view prefix) {
  // A name can only exist already if an earlier process with our pid crashed and left it:
  // skip such names rather than touching them (SweepStaleSegments may not have run).
  constexpr int kAttempts = 64;
  Status last;
  for (int i = 0; i < kAttempts; ++i) {
    int open_errno = 0;
    StatusOr<ShmSegment> seg = CreateInternal(NextSegmentName(prefix), bytes, &open_errno);
    if (seg.ok() || open_errno != EEXIST) return seg;
    last = seg.status();
  }
  return last;
}

StatusOr<ShmSegment> ShmSegment::Open(const std::string& name, size_t bytes) {
  BP_RETURN_IF_ERROR(ValidateName(name));
  if (bytes == 0) {
    return InvalidArgumentError(
        fmt::format("shared-memory segment {}: cannot open with an expected size of 0", name));
  }
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      return NotFoundError(fmt::format("shared-memory segment {} does not exist", name));
    }
    return UnavailableError(
        fmt::format("cannot open shared-memory segment {}: {}", name, ErrnoText(err)));
  }
  ShmSegment seg(name, fd, /*slot=*/-1);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return UnavailableError(
        fmt::format("cannot stat shared-memory segment {}: {}", name, ErrnoText(errno)));
  }
  auto actual = static_cast<uint64_t>(st.st_size);
  if (actual < bytes) {
    return DataLossError(fmt::format("shared-memory segment {} is truncated: {} bytes, expected {}",
                                     name, actual, bytes));
  }
  if (actual > bytes) {
    return InvalidArgumentError(
        fmt::format("shared-memory segment {} has {} bytes, expected {}", name, actual, bytes));
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return UnavailableError(
        fmt::format("cannot map shared-memory segment {}: {}", name, ErrnoText(errno)));
  }
  seg.data_ = data;
  seg.size_ = bytes;
  return seg;
}

Status ShmSegment::CheckSize() const {
  if (fd_ < 0) return FailedPreconditionError("CheckSize on an empty ShmSegment");
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    return UnavailableError(
        fmt::format("cannot stat shared-memory segment {}: {}", name_, ErrnoText(errno)));
  }
  if (static_cast<uint64_t>(st.st_size) != size_) {
    return DataLossError(fmt::format(
        "shared-memory segment {} changed size: {} bytes, mapped {}{}", name_, st.st_size, size_,
        static_cast<uint64_t>(st.st_size) < size_ ? " (truncated)" : ""));
  }
  return Status::Ok();
}

Status ShmSegment::Unlink() {
  if (slot_ < 0) {
    if (name_.empty()) return FailedPreconditionError("Unlink on an empty ShmSegment");
    return Status::Ok();  // not the owner, or already unlinked
  }
  Status s = UnlinkSegment(name_);
  ReleaseSlot(slot_);
  slot_ = -1;
  return s;
}

Status UnlinkSegment(const std::string& name) {
  BP_RETURN_IF_ERROR(ValidateName(name));
  if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return UnavailableError(
        fmt::format("cannot unlink shared-memory segment {}: {}", name, ErrnoText(errno)));
  }
  return Status::Ok();
}

std::string NextSegmentName(std::string_view prefix) {
  return fmt::format("/{}-{}-{}-{}", prefix, getuid(), getpid(),
                     g_name_counter.fetch_add(1, std::memory_order_relaxed));
}

StatusOr<SegmentCreator> ParseSegmentName(std::string_view name, std::string_view prefix) {
  std::string_view rest = name;
  if (!rest.empty() && rest[0] == '/') rest.remove_prefix(1);
  auto bad = [&] {
    return InvalidArgumentError(fmt::format(
        "'{}' is not a segment name of the form /{}-<uid>-<pid>-<counter>", name, prefix));
  };
  if (rest.size() <= prefix.size() || rest.substr(0, prefix.size()) != prefix ||
      rest[prefix.size()] != '-') {
    return bad();
  }
  rest.remove_prefix(prefix.size() + 1);
  std::string_view parts[3];
  for (int i = 0; i < 3; ++i) {
    size_t dash = i < 2 ? rest.find('-') : rest.size();
    if (dash == std::string_view::npos) return bad();
    parts[i] = rest.substr(0, dash);
    if (!AllDigits(parts[i]) || parts[i].size() > 18) return bad();
    rest.remove_prefix(i < 2 ? dash + 1 : dash);
  }
  SegmentCreator c;
  c.uid = static_cast<uid_t>(std::strtoull(std::string(parts[0]).c_str(), nullptr, 10));
  c.pid = static_cast<pid_t>(std::strtoll(std::string(parts[1]).c_str(), nullptr, 10));
  if (c.pid <= 0) return bad();
  return c;
}

void UnlinkAllSegments() noexcept {
  const pid_t self = getpid();
  for (Slot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != kLive) continue;
    if (s.pid.load(std::memory_order_relaxed) != self) continue;  // a forked parent's entry
    unlink(s.path);  // ENOENT: the owner unlinked it meanwhile
    s.state.store(kFree, std::memory_order_release);
  }
}

namespace {
void CleanupSignalHandler(int sig) {
  const int saved_errno = errno;
  UnlinkAllSegments();
  // SA_RESETHAND restored the default disposition on entry; the signal is blocked until we
  // return, then delivered again and kills the process as it would have without us.
  raise(sig);
  errno = saved_errno;
}
}  // namespace

Status InstallShmCleanupSignalHandlers(const std::vector<int>& signals) {
  std::vector<int> sigs = signals.empty() ? std::vector<int>{SIGTERM, SIGINT} : signals;
  std::call_once(g_atexit_once, [] { std::atexit(AtExitCleanup); });
  for (int sig : sigs) {
    struct sigaction sa {};
    sa.sa_handler = CleanupSignalHandler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    if (sigaction(sig, &sa, nullptr) != 0) {
      return InvalidArgumentError(fmt::format(
          "cannot install the shm cleanup handler for signal {}: {}", sig, ErrnoText(errno)));
    }
  }
  return Status::Ok();
}

std::vector<std::string> LiveSegmentNames() {
  std::vector<std::string> out;
  const pid_t self = getpid();
  for (Slot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != kLive) continue;
    if (s.pid.load(std::memory_order_relaxed) != self) continue;
    out.emplace_back(s.path + kShmDirLen);
  }
  return out;
}

StatusOr<std::vector<std::string>> SweepStaleSegments(std::string_view prefix) {
  DIR* dir = opendir(kShmDir);
  if (dir == nullptr) {
    return UnavailableError(fmt::format("cannot list {}: {}", kShmDir, ErrnoText(errno)));
  }
  std::vector<std::string> removed;
  const uid_t me = getuid();
  while (dirent* e = readdir(dir)) {
    std::string_view name(e->d_name);
    StatusOr<SegmentCreator> c = ParseSegmentName(name, prefix);
    if (!c.ok() || c->uid != me) continue;
    if (kill(c->pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to signal)
    std::string path = std::string(kShmDir) + std::string(name);
    if (unlink(path.c_str()) == 0) {
      removed.emplace_back(name);
    } else if (errno != ENOENT) {
      BP_LOG_WARN("cannot remove stale shared-memory segment {}: {}", path, ErrnoText(errno));
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace bitpush::worker::ipc
