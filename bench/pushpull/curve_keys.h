// --security curve: the nodes' keys of `bitpush-bench pushpull`'s curve clusters.
//
// A key pair per node of the benchmark's clusters (scheduler, server:0.., worker:0..) and the
// public_keys listing them (security::WriteClusterKeys), in a private temporary directory
// (mkdtemp: mode 0700) that Remove() / the destructor delete, and the signal handler if the run
// is interrupted (signal_cleanup.h). Every curve cluster of the run uses them (the YAML's
// security.keys_dir): node names do not depend on the addresses.
//
// Owned by the driver. Thread-safety: none; the driver's thread.
#pragma once

#include <string>

#include "common/status.h"

namespace bitpush::bench::pushpull {

class CurveKeys {
 public:
  CurveKeys() = default;
  CurveKeys(const CurveKeys&) = delete;
  CurveKeys& operator=(const CurveKeys&) = delete;
  ~CurveKeys() { Remove(); }

  Status Create(int servers, int workers);

  // The directory ("" before Create and after Remove).
  const std::string& Dir() const { return dir_; }

  void Remove();

 private:
  std::string dir_;
};

}  // namespace bitpush::bench::pushpull
