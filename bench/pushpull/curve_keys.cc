#include "bench/pushpull/curve_keys.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "bench/pushpull/host_tools.h"
#include "bench/pushpull/signal_cleanup.h"
#include "common/security/keys.h"
#include "config/cluster_config.h"
#include "config/node_security.h"

namespace bitpush::bench::pushpull {

Status CurveKeys::Create(int servers, int workers) {
  std::string dir = "/tmp/bp-bench-keys-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    return InternalError(std::string("cannot create the keys directory under /tmp: ") +
                         std::strerror(errno));
  }
  dir_ = dir;
  RemoveDirOnSignal(FindTool("rm"), dir_);
  config::ClusterConfig shape;
  shape.servers.resize(static_cast<size_t>(servers));
  shape.workers.resize(static_cast<size_t>(workers));
  StatusOr<std::vector<std::string>> written =
      security::WriteClusterKeys(dir_, config::ClusterNodeNames(shape), /*overwrite=*/false);
  if (!written.ok()) return written.status().WithContext("--security curve");
  return Status::Ok();
}

void CurveKeys::Remove() {
  if (dir_.empty()) return;
  ForgetDirOnSignal();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
  dir_.clear();
}

}  // namespace bitpush::bench::pushpull
