#include "bench/pushpull/ucx_probe.h"

#include <chrono>
#include <memory>
#include <utility>

#include "common/transport/transport.h"
#include "common/transport/ucx/info.h"
#include "common/transport/ucx/transport.h"
#include "tests/harness/child_process.h"

namespace bitpush::bench::pushpull {

Status UcxProbe::Run(const std::string& tls, const NetPlan& net) {
  auto endpoint = [&](const std::string& name) {
    transport::TransportOptions o;
    o.name = name;
    const int port = testing::FreeTcpPort();
    o.listen_address = "ucx://" + net.root_ip + ":" + std::to_string(port);
    if (!tls.empty()) o.ucx_config["TLS"] = tls;
    if (const std::string d = UcxNetDevices(net); !d.empty()) o.ucx_config["NET_DEVICES"] = d;
    return transport::CreateTransport(o);
  };
  BP_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> server, endpoint("server:0"));
  BP_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> worker, endpoint("worker:0"));
  BP_RETURN_IF_ERROR(worker->Connect("server:0", server->address()));
  BP_RETURN_IF_ERROR(server->Connect("worker:0", worker->address()));
  constexpr std::chrono::milliseconds kWait{10000};
  for (transport::Transport* from : {worker.get(), server.get()}) {
    transport::Transport* to = from == worker.get() ? server.get() : worker.get();
    transport::Message probe;
    probe.header = "probe";
    BP_RETURN_IF_ERROR(from->Send(to->name(), std::move(probe)));
    for (;;) {  // events (connected) come first; each Receive is bounded
      BP_ASSIGN_OR_RETURN(transport::Received r, to->Receive(kWait));
      if (r.is_message()) break;
      if (r.event().kind != transport::TransportEvent::Kind::kPeerConnected) {
        return r.event().status.WithContext("the ucx probe");
      }
    }
  }
  BP_ASSIGN_OR_RETURN(std::string info, transport::ucx_backend::DescribePeerEndpoint(
                                            worker.get(), "server:0", kWait));
  lanes = transport::ucx_backend::LaneTransports(transport::ucx_backend::ParseEpLanes(info));
  worker->Close();
  server->Close();
  return Status::Ok();
}

}  // namespace bitpush::bench::pushpull
