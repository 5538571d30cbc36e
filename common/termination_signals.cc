#include "common/termination_signals.h"

#include <pthread.h>

#include <utility>

namespace bitpush {

TerminationSignals::TerminationSignals(std::function<void(int)> on_signal) {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  sigaddset(&set_, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  thread_ = std::thread([this, on_signal = std::move(on_signal)] {
    int sig = 0;
    if (sigwait(&set_, &sig) != 0 || sig == SIGUSR1) return;
    received_.store(true);
    on_signal(sig);
  });
}

void TerminationSignals::Stop() {
  if (!thread_.joinable()) return;
  // The thread is either waiting (SIGUSR1 wakes it), inside on_signal, or gone (the signal is
  // then dropped with the finished thread): joining is bounded by on_signal in every case.
  pthread_kill(thread_.native_handle(), SIGUSR1);
  thread_.join();
}

}  // namespace bitpush
