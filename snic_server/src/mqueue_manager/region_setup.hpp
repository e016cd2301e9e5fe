// Setting up the binding of a region an agent announced, one function per transport: shm maps
// the named object (src/mqueue_manager/shm_setup.cpp), rdma connects a queue pair to the
// agent's exporter (src/mqueue_manager/rdma_setup.cpp). Both attach through
// mqueue::RemoteRegion, which checks every header field (validate_region), and hand the
// attached region to the data path (src/mqueue_manager/datapath.cpp). The control endpoint
// calls them; the engine only ever sees the RegionBinding they return.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "caracal/core/status.hpp"
#include "mqueue_manager/region.hpp"

namespace caracal::server {

// Maps the named shm object an agent announced, checks its size against the announcement and
// attaches to the region in it.
Result<std::unique_ptr<RegionBinding>> bind_shm_region(const std::string& shm_name,
                                                       uint64_t region_bytes);

// Where an agent's rdma region is (its region announcement) and how long connecting may take.
struct RdmaRegionTarget {
  std::string host;
  uint16_t port = 0;
  uint64_t address = 0;
  uint32_t rkey = 0;
  uint64_t region_bytes = 0;
  // For the rdma_cm connect, and again for each of attach's two header READs.
  std::chrono::milliseconds timeout{2000};
  // The queue pair's local ACK timeout exponent and retry count (mqueue::RdmaConnectOptions).
  uint8_t ack_timeout = 18;
  uint8_t retry_count = 6;
};

// Connects one RC queue pair to the agent's RdmaRegionExporter and attaches to the region
// through it. Blocks up to about 3x the timeout: call it off the I/O threads. Without rdma-core
// (CARACAL_HAVE_RDMA) it returns kUnavailable.
//
// TX polling over rdma is adaptive: while requests are outstanding the binding fetches every
// TX tail (one RDMA READ) each round; with none outstanding it waits between fetches, from
// tunables::kRdmaIdleFetchMin doubling up to kRdmaIdleFetchMax, so an idle region costs a READ
// per millisecond at most, and a call a client queue makes waits at most that long to be seen.
// The shm binding reads its tails every round (a load, no READ).
Result<std::unique_ptr<RegionBinding>> bind_rdma_region(const RdmaRegionTarget& target);

}  // namespace caracal::server
