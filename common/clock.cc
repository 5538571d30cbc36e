#include "common/clock.h"

namespace bitpush {

namespace {

class SteadyClock final : public Clock {
 public:
  time_point Now() const override { return std::chrono::steady_clock::now(); }

  bool WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 time_point deadline, const std::function<bool()>& pred) const override {
    return cv.wait_until(lock, deadline, pred);
  }

  void WaitOnce(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                time_point deadline) const override {
    cv.wait_until(lock, deadline);
  }

  std::chrono::milliseconds BlockFor(std::chrono::milliseconds wanted) const override {
    return wanted;
  }
};

}  // namespace

const std::shared_ptr<const Clock>& SystemClock() {
  static const std::shared_ptr<const Clock> clock = std::make_shared<SteadyClock>();
  return clock;
}

}  // namespace bitpush
