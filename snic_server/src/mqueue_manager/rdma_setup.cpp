#include <memory>
#include <string>
#include <utility>

#include "mqueue_manager/region_setup.hpp"
#ifdef CARACAL_HAVE_RDMA
#include "caracal/mqueue/rdma.hpp"
#include "datapath.hpp"
#endif

namespace caracal::server {

Result<std::unique_ptr<RegionBinding>> bind_rdma_region(const RdmaRegionTarget& target) {
#ifdef CARACAL_HAVE_RDMA
  mqueue::RdmaConnectOptions o;
  o.host = target.host;
  o.port = target.port;
  o.region = mqueue::RdmaRegionAddress{target.address, target.rkey, target.region_bytes};
  o.timeout = target.timeout;
  o.ack_timeout = target.ack_timeout;
  o.retry_count = target.retry_count;
  Result<std::unique_ptr<mqueue::RdmaTransport>> t = mqueue::RdmaTransport::connect(o);
  if (!t.ok()) return t.status();
  std::unique_ptr<mqueue::RdmaTransport> transport = std::move(t).value();
  Result<mqueue::RemoteRegion<mqueue::RdmaTransport>> region =
      mqueue::RemoteRegion<mqueue::RdmaTransport>::attach(transport.get(), target.timeout);
  if (!region.ok()) {
    return Status(region.status().code(),
                  "rdma " + transport->peer() + ": attach: " + region.status().message());
  }
  return make_transport_binding(std::move(transport), std::move(region).value(), nullptr);
#else
  return Status(StatusCode::kUnavailable,
                "transport rdma to " + target.host + ": this server was built without rdma-core");
#endif
}

}  // namespace caracal::server
