// ManualClock: a Clock (common/clock.h) that only moves when the test says so, for tests of
// timing rules (heartbeat verdicts, op timeouts, registration back-off): the test advances it
// past a deadline and checks the verdict, instead of sleeping and hoping the machine was fast.
//
// Waits on a ManualClock re-check their condition and the clock every millisecond of real
// time, so a component blocked on it notices Advance() within about a millisecond. It starts
// at the real steady_clock time of its construction (any value works; this one keeps logged
// durations readable).
//
// Owned by a test and shared (shared_ptr) with the components it drives. Thread-safety: every
// method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "common/clock.h"

namespace bitpush::testing {

class ManualClock final : public Clock {
 public:
  ManualClock() : now_ns_(std::chrono::steady_clock::now().time_since_epoch().count()) {}

  time_point Now() const override { return time_point(duration(now_ns_.load())); }

  // Moves the clock forward by `d` (>= 0).
  void Advance(duration d) { now_ns_.fetch_add(d.count()); }

  bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 time_point deadline, const std::function<bool()>& pred) const override {
    while (!pred()) {
      if (Now() >= deadline) return false;
      cv.wait_for(lock, kPoll);
    }
    return true;
  }

  void WaitOnce(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                time_point deadline) const override {
    if (Now() < deadline) cv.wait_for(lock, kPoll);
  }

  std::chrono::milliseconds BlockFor(std::chrono::milliseconds wanted) const override {
    return std::min(wanted, std::chrono::duration_cast<std::chrono::milliseconds>(kPoll));
  }

 private:
  static constexpr std::chrono::milliseconds kPoll{1};
  std::atomic<duration::rep> now_ns_;
};

}  // namespace bitpush::testing
