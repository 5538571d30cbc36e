// Clock: the time that drives a component's deadlines and timers (heartbeats, silence
// verdicts, registration back-off, op timeouts), injected through its Options so tests can
// run those rules on a clock they control (tests/harness/manual_clock.h) instead of sleeping.
//
// Only deadline logic reads a Clock; measurements (stats, benchmarks) read steady_clock
// directly. A component that blocks does so through the clock: WaitUntil for condition
// variables, BlockFor to bound a blocking call (a transport Receive) that cannot be woken by
// the clock itself.
//
// SystemClock() is steady_clock. It holds no state, so the one instance is shared.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

namespace bitpush {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;

  virtual time_point Now() const = 0;

  // Waits on `cv` (whose mutex `lock` holds) until `pred()` is true or Now() >= deadline.
  // Returns pred(). `pred` is evaluated with the lock held, as for condition_variable.
  virtual bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                         time_point deadline, const std::function<bool()>& pred) const = 0;

  // One wait on `cv` that ends at a notify, spuriously, or by `deadline` on this clock; the
  // caller re-checks its condition (for loops that wake on any notify).
  virtual void WaitOnce(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                        time_point deadline) const = 0;

  // How long a blocking call may block when this clock's next deadline is `wanted` away: the
  // system clock blocks that long; a clock that tests advance by hand blocks briefly so the
  // caller sees the new time soon.
  virtual std::chrono::milliseconds BlockFor(std::chrono::milliseconds wanted) const = 0;
};

// steady_clock.
const std::shared_ptr<const Clock>& SystemClock();

}  // namespace bitpush
