// The choice of peer (--peer NAME).
#include "bench/pushpull/peer.h"

namespace bitpush::bench::pushpull {

std::unique_ptr<Peer> MakePeer(const Options& opt, uint64_t tensor_bytes) {
  if (opt.peer == "pslite") return MakePslitePeer(opt, tensor_bytes);
  if (opt.peer == "ddp") return MakeDdpPeer(opt);
  return nullptr;
}

}  // namespace bitpush::bench::pushpull
