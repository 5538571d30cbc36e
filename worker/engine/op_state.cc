#include "worker/engine/op_state.h"

#include <utility>

namespace bitpush::worker {

void OpState::Complete(Status s) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    done = true;
    status = std::move(s);
  }
  cv.notify_all();
}

}  // namespace bitpush::worker
