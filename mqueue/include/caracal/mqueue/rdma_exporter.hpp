// The agent side of the `rdma` transport: RdmaRegionExporter registers the region (host memory
// with ibv_reg_mr; GPU memory with ibv_reg_dmabuf_mr, or ibv_reg_mr on the device pointer where
// the peer-memory driver is loaded) and accepts rdma_cm connections, one RC queue pair per
// SmartNIC connection. Its CPU does nothing on the data path; poll() only services connection
// events.
//
// Implemented in src/rdma/exporter.cpp. Built only with CARACAL_HAVE_RDMA.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "caracal/core/status.hpp"
#include "caracal/mqueue/rdma_region_address.hpp"

namespace caracal::mqueue {

struct RdmaExportOptions {
  // The local address to listen on: an IP address of an RDMA device (its netdev's address).
  // Empty means any address; the region is then registered on the first RDMA device.
  std::string bind_address;
  uint16_t port = 0;  // 0: the system picks one (see RdmaRegionExporter::port)
  // Connections served at once (one queue pair each); more are rejected.
  uint32_t max_connections = 8;
  // Incoming RDMA READs one connection may have outstanding (clamped to the device's maximum).
  uint32_t responder_resources = 16;
};

// Where the memory of a region lives and how to register it.
struct RdmaMemory {
  enum class Kind {
    kHost,        // ibv_reg_mr on a host virtual address
    kGpuDmabuf,   // ibv_reg_dmabuf_mr on a dma-buf fd (CUDA: cuMemGetHandleForAddressRange),
                  // falling back to ibv_reg_mr on the device pointer (peer memory)
    kGpuPeerMem,  // ibv_reg_mr on the device pointer (nvidia-peermem) only
  };
  Kind kind = Kind::kHost;
  std::byte* base = nullptr;  // host address, or device pointer (also the iova announced)
  uint64_t bytes = 0;
  int dmabuf_fd = -1;          // kGpuDmabuf: the dma-buf of the allocation holding base
  uint64_t dmabuf_offset = 0;  // kGpuDmabuf: base's offset in that dma-buf
};

// The agent side: a registered region and a listener that accepts SmartNIC connections.
// Non-blocking: call poll() when event_fd() is readable (or now and then) to accept
// connections and to clean up after disconnects; a SmartNIC that disconnects may connect again.
// Not thread-safe: one thread owns an exporter.
class RdmaRegionExporter {
 public:
  static Result<std::unique_ptr<RdmaRegionExporter>> listen(const RdmaExportOptions& options,
                                                            const RdmaMemory& memory);
  RdmaRegionExporter(const RdmaRegionExporter&) = delete;
  RdmaRegionExporter& operator=(const RdmaRegionExporter&) = delete;
  ~RdmaRegionExporter();

  RdmaRegionAddress exported() const { return exported_; }
  uint16_t port() const { return port_; }
  // The address it listens on, as given (or "0.0.0.0").
  const std::string& bind_address() const { return bind_address_; }
  // Readable when poll() has connection events to service.
  int event_fd() const;
  // Services every pending connection event without blocking. A failure to set up one
  // connection rejects that connection and is returned; the exporter keeps serving the others.
  Status poll();
  // Connections established and not yet disconnected.
  uint32_t connections() const;
  // Connections accepted over the exporter's life.
  uint64_t accepted_total() const { return accepted_total_; }
  // How the region was registered: "host memory (ibv_reg_mr)", "GPU memory (dma-buf)", ...
  const std::string& registration() const { return registration_; }
  // The RDMA device the region is registered on.
  std::string device_name() const;

 private:
  struct Connection {
    rdma_cm_id* id = nullptr;
    bool established = false;
  };
  RdmaRegionExporter() = default;
  Status accept(rdma_cm_id* id, const rdma_conn_param* requested);
  void drop(rdma_cm_id* id);

  std::string bind_address_;
  uint16_t port_ = 0;
  uint32_t max_connections_ = 0;
  uint32_t responder_resources_ = 0;
  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* listen_id_ = nullptr;
  ibv_context* verbs_ = nullptr;
  ibv_context** device_list_ = nullptr;  // rdma_get_devices, when bound to any address
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;  // shared by every connection's queue pair; nothing is posted on them
  ibv_mr* mr_ = nullptr;
  RdmaRegionAddress exported_{};
  std::string registration_;
  std::vector<Connection> connections_;
  uint64_t accepted_total_ = 0;
};

}  // namespace caracal::mqueue
