// ShmSegment: one POSIX shared-memory segment (shm_open + mmap) through which a training
// process hands tensors to its node's bitpush-worker daemon (docs/local-ipc.md), plus the
// process-wide list that unlinks the segments this process created on every exit path.
//
// Ownership: the process that Create()s a segment owns its name: the ShmSegment object
// unlinks it when destroyed (or in Unlink()). The other side Open()s it by name and only
// unmaps. Segment names are `/<prefix>-<uid>-<pid>-<counter>` (NextSegmentName), so the
// creator of every segment can be read from its name: the daemon refuses names of another
// process and frees a dead client's segments, and SweepStaleSegments removes the leftovers of
// crashed processes.
//
// Exit paths: every created name is also entered in a fixed-size, lock-free cleanup list
// *before* the segment exists, and leaves it after the owner unlinked it. The list is
// emptied (every name unlinked) by the owners' destructors, by an atexit handler (exit()
// without unwinding), and by UnlinkAllSegments(), which is async-signal-safe: call it from a
// SIGTERM/SIGINT handler (InstallShmCleanupSignalHandlers does exactly that) or from a
// sigwait thread. SIGKILL and crashes leave segments behind: SweepStaleSegments is for them.
// The list is the one process-wide object here because signal dispositions are process-wide;
// entries carry the creating pid, so a forked child never unlinks its parent's segments.
//
// Size checks: Create reserves the memory (posix_fallocate), so a full /dev/shm is an error
// naming the segment instead of a SIGBUS at first touch; Open compares the size (fstat) with
// what the caller expects, so a truncated segment is a DataLoss naming it. CheckSize() re-reads
// the size of an open segment (the daemon calls it per request: a client that shrinks its
// segment afterwards would otherwise turn the daemon's next access into a SIGBUS).
//
// Thread-safety: a ShmSegment is a move-only value; one object is used by one thread at a
// time (the mapped bytes are shared memory: the protocol decides who writes when).
// NextSegmentName, the cleanup list and SweepStaleSegments may be used from any thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace bitpush::worker::ipc {

inline constexpr std::string_view kDefaultShmPrefix = "bitpush";
// Capacity of the cleanup list: segments one process may have created and not yet unlinked.
inline constexpr int kMaxLiveSegments = 1024;

class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creates a new segment of `bytes` (> 0) bytes, zero-filled, read-write; fails if `name`
  // exists (O_EXCL). `name` is "/" + at most 250 characters without another "/" (use
  // NextSegmentName). The name is unlinked when the returned object is destroyed.
  static StatusOr<ShmSegment> Create(const std::string& name, size_t bytes);
  // Create(NextSegmentName(prefix), bytes).
  static StatusOr<ShmSegment> Create(size_t bytes, std::string_view prefix = kDefaultShmPrefix);

  // Maps an existing segment read-write. Its size must be exactly `bytes`: a smaller one is
  // DataLoss ("... truncated ..."), a larger one InvalidArgument; a missing one NotFound.
  static StatusOr<ShmSegment> Open(const std::string& name, size_t bytes);

  // DataLoss naming the segment if its size changed since it was created or opened.
  Status CheckSize() const;

  // Unlinks the name now (owner only; the mapping stays valid). Idempotent.
  Status Unlink();

  bool valid() const { return data_ != nullptr; }
  bool owner() const { return slot_ >= 0; }
  const std::string& name() const { return name_; }
  size_t size() const { return size_; }
  void* data() const { return data_; }

 private:
  ShmSegment(std::string name, int fd, int slot) : name_(std::move(name)), fd_(fd), slot_(slot) {}
  // Create, reporting a failed shm_open's errno so Create(bytes) can skip a name that exists.
  static StatusOr<ShmSegment> CreateInternal(const std::string& name, size_t bytes,
                                             int* open_errno);
  void Reset();  // unmaps, closes, unlinks if owner

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
  int slot_ = -1;  // cleanup-list entry while this object owns the name
};

// "/<prefix>-<uid>-<pid>-<counter>", unique within this process (the counter is atomic).
std::string NextSegmentName(std::string_view prefix = kDefaultShmPrefix);

// The creator encoded in a segment name made by NextSegmentName with `prefix` (with or
// without the leading "/"). InvalidArgument if the name is not of that form.
struct SegmentCreator {
  uid_t uid = 0;
  pid_t pid = 0;
};
StatusOr<SegmentCreator> ParseSegmentName(std::string_view name,
                                          std::string_view prefix = kDefaultShmPrefix);

// Unlinks every segment this process (getpid()) created and has not unlinked yet.
// Async-signal-safe (atomics and unlink(2) only; Linux: segments live in /dev/shm). The
// ShmSegment objects stay mapped; their later destruction finds the name gone and is quiet.
void UnlinkAllSegments() noexcept;

// Installs a handler for each signal (default SIGTERM and SIGINT) that calls
// UnlinkAllSegments, restores the default disposition and re-raises the signal, so the
// process still dies of it (the parent sees WIFSIGNALED). For processes that do not
// handle these signals otherwise; a daemon with a sigwait thread calls UnlinkAllSegments
// there instead.
Status InstallShmCleanupSignalHandlers(const std::vector<int>& signals = {});

// Unlinks a segment by name (the daemon frees a dead client's segments with it). A name
// that is already gone is OK.
Status UnlinkSegment(const std::string& name);

// The names (without "/") in the cleanup list of this process, for tests and diagnostics.
std::vector<std::string> LiveSegmentNames();

// Unlinks /dev/shm/<prefix>-<uid>-<pid>-* of this user whose pid no longer exists (leftovers
// of crashed processes) and returns their names. A pid that was reused by a new process
// keeps its segments (conservative). Segments of other users are never touched.
StatusOr<std::vector<std::string>> SweepStaleSegments(std::string_view prefix = kDefaultShmPrefix);

}  // namespace bitpush::worker::ipc
