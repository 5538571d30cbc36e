// LogLimiter: "at most one log line per interval per key" for messages that an outsider can
// provoke (refused connections, refused messages), so that nobody can grow a node's log by
// sending garbage. Each key (a peer, an address) may log once per interval; the next line it
// logs says how many were suppressed meanwhile. At most `max_keys` keys are remembered (the
// least recently logged one is forgotten first), so the limiter's own memory is bounded too;
// beyond that, one shared key ("others") limits the rest.
//
// Thread-safety: not thread-safe; one owner (a loop thread) calls it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace bitpush {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(10),
                      size_t max_keys = 256)
      : interval_(interval), max_keys_(max_keys) {}

  // True when a line about `key` may be logged now; then *suppressed is how many lines about
  // it were refused since the last one (0 the first time). False otherwise (counted).
  bool Allow(const std::string& key, uint64_t* suppressed, Clock::time_point now = Clock::now()) {
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      if (entries_.size() >= max_keys_) {
        Forget(now);
        if (entries_.size() >= max_keys_) {
          return key == kOthers ? false : Allow(kOthers, suppressed, now);
        }
      }
      entries_.emplace(key, Entry{now, 0});
      *suppressed = 0;
      return true;
    }
    Entry& e = it->second;
    if (now - e.last < interval_) {
      ++e.suppressed;
      return false;
    }
    *suppressed = e.suppressed;
    e.last = now;
    e.suppressed = 0;
    return true;
  }

 private:
  static constexpr const char* kOthers = "(others)";
  struct Entry {
    Clock::time_point last;
    uint64_t suppressed = 0;
  };
  // Drops the entries whose interval has passed; if none has, the oldest one.
  void Forget(Clock::time_point now) {
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->first != kOthers && now - it->second.last >= interval_) {
        it = entries_.erase(it);
        continue;
      }
      if (it->first != kOthers &&
          (oldest == entries_.end() || it->second.last < oldest->second.last)) {
        oldest = it;
      }
      ++it;
    }
    if (entries_.size() >= max_keys_ && oldest != entries_.end()) entries_.erase(oldest);
  }

  const std::chrono::milliseconds interval_;
  const size_t max_keys_;
  std::map<std::string, Entry> entries_;
};

}  // namespace bitpush
