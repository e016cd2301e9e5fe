// How a SmartNIC names a region that an agent exports over `rdma`: what the agent announces
// (RdmaRegionExporter::exported, rdma_exporter.hpp) and the SmartNIC connects with
// (RdmaConnectOptions::region, rdma_transport.hpp). Plain data; needs no rdma-core.
#pragma once

#include <cstdint>

namespace caracal::mqueue {

// What an agent announces so that a SmartNIC can reach its region: the address of the region's
// first byte as the remote side names it (the registered virtual address, or the iova of a
// dma-buf registration), the region's rkey, and its size.
struct RdmaRegionAddress {
  uint64_t address = 0;
  uint32_t rkey = 0;
  uint64_t bytes = 0;
};

}  // namespace caracal::mqueue
