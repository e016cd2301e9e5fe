// The data path of one region over transport T (eRPC's habit: the transport is a template
// parameter, so the loop over the rings has no virtual call per entry, and the data path is
// apart from the setup that connects and attaches). datapath.cpp defines it for
// mqueue::ShmTransport and, with rdma-core (CARACAL_HAVE_RDMA), mqueue::RdmaTransport; the setup
// files call make_transport_binding() once the region is attached.
#pragma once

#include <memory>

#include "caracal/mqueue/remote_region.hpp"
#include "mqueue_manager/region.hpp"

namespace caracal::server {

// The binding that serves `region` through `transport` (engine thread only after attach).
// `memory` keeps whatever backs the region (the shm mapping) alive as long as the binding, and
// is destroyed after the transport that uses it.
template <mqueue::Transport T>
std::unique_ptr<RegionBinding> make_transport_binding(std::unique_ptr<T> transport,
                                                      mqueue::RemoteRegion<T> region,
                                                      std::shared_ptr<void> memory);

}  // namespace caracal::server
