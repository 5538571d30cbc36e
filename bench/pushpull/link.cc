// The loopback link (both sides on 127.0.0.1) and the choice of link kind.
#include "bench/pushpull/link.h"

#include <cstdlib>

namespace bitpush::bench::pushpull {
namespace {

class LoopbackLink : public Link {
 public:
  Status Create(NetPlan* /*net*/) override { return Status::Ok(); }
  void Remove() override {}
  std::string Describe(const NetPlan& /*net*/) const override { return ""; }
};

}  // namespace

std::string UcxNetDevices(const NetPlan& net) {
  return std::getenv("UCX_NET_DEVICES") != nullptr ? "" : net.ucx_net_devices;
}

std::unique_ptr<Link> MakeLink(const Options& opt) {
  if (opt.link_gbit > 0) return MakeEmulatedLink(opt.link_gbit);
  return MakeLoopbackLink();
}

std::unique_ptr<Link> MakeLoopbackLink() {
  return std::make_unique<LoopbackLink>();
}

}  // namespace bitpush::bench::pushpull
