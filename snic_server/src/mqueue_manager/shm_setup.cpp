#include <memory>
#include <string>
#include <utility>

#include "caracal/mqueue/shm.hpp"
#include "datapath.hpp"
#include "mqueue_manager/region_setup.hpp"

namespace caracal::server {

Result<std::unique_ptr<RegionBinding>> bind_shm_region(const std::string& shm_name,
                                                       uint64_t region_bytes) {
  Result<mqueue::ShmMapping> m = mqueue::ShmMapping::open_named(shm_name);
  if (!m.ok()) return m.status();
  auto mapping = std::make_shared<mqueue::ShmMapping>(std::move(m).value());
  if (mapping->size() != region_bytes) {
    return invalid_argument("region_bytes: the agent announced " + std::to_string(region_bytes) +
                            " bytes but shm '" + shm_name + "' holds " +
                            std::to_string(mapping->size()));
  }
  auto transport = std::make_unique<mqueue::ShmTransport>(mapping->data(), mapping->size());
  Result<mqueue::RemoteRegion<mqueue::ShmTransport>> region =
      mqueue::RemoteRegion<mqueue::ShmTransport>::attach(transport.get());
  if (!region.ok()) return region.status();
  return make_transport_binding(std::move(transport), std::move(region).value(),
                                std::shared_ptr<void>(std::move(mapping)));
}

}  // namespace caracal::server
