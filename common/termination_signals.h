// TerminationSignals: how a bitpush daemon (bitpush-scheduler, bitpush-server, bitpush-worker)
// hears SIGINT and SIGTERM — on one dedicated thread that sigwait()s for them, never in a signal
// handler, so the reaction may take locks, log and close objects.
//
//   int main() {
//     std::atomic<Thing*> running{nullptr};
//     TerminationSignals signals([&](int sig) { if (Thing* t = running.load()) t->Stop(); });
//     ...                       // create the Thing, running = thing, run it
//     signals.Stop();           // before the Thing is destroyed
//   }
//
// Construct it first in main(), before any other thread exists: the constructor blocks SIGINT,
// SIGTERM and SIGUSR1 in the calling thread, and every thread created later inherits that
// mask, so the signals reach only the waiting thread. `on_signal` runs at most once, on that
// thread, with the signal number. SIGUSR1 is only used by Stop() to wake the thread.
//
// Owned by main(). Thread-safety: Stop() and received() from any thread except from inside
// `on_signal` (Stop would join itself).
#pragma once

#include <signal.h>

#include <atomic>
#include <functional>
#include <thread>

namespace bitpush {

class TerminationSignals {
 public:
  explicit TerminationSignals(std::function<void(int)> on_signal);
  ~TerminationSignals() { Stop(); }
  TerminationSignals(const TerminationSignals&) = delete;
  TerminationSignals& operator=(const TerminationSignals&) = delete;

  // Ends the waiting thread (on_signal will not run if no signal came yet) and joins it;
  // waits for a running on_signal to return. Idempotent.
  void Stop();

  // True once SIGINT or SIGTERM arrived.
  bool received() const { return received_.load(); }

 private:
  sigset_t set_;
  std::atomic<bool> received_{false};
  std::thread thread_;
};

}  // namespace bitpush
