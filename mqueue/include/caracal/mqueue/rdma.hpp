// The `rdma` transport (rdma-core: libibverbs + librdmacm), the Lynx deployment: the SmartNIC
// reaches a region in another machine's or device's memory with one-sided RDMA only.
//
//  - RdmaRegionExporter is the agent side. It registers the region (host memory with
//    ibv_reg_mr; GPU memory with ibv_reg_dmabuf_mr, or ibv_reg_mr on the device pointer where
//    the peer-memory driver is loaded) and accepts rdma_cm connections, one RC queue pair per
//    SmartNIC connection. Its CPU does nothing on the data path; poll() only services
//    connection events.
//  - RdmaTransport is the SmartNIC side and satisfies Transport (transport.hpp): one RC queue
//    pair to one exporter, a registered staging image of the whole region, RDMA WRITE for
//    post_write and publish_index, RDMA READ for post_read.
//
// Built only with CARACAL_HAVE_RDMA. Run here only on Soft-RoCE (rdma_rxe) inside the VM of
// scripts/rxe-vm.sh; the GPU-memory registrations compile everywhere but have never run (see
// mqueue/README.md).
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "caracal/core/status.hpp"
#include "caracal/mqueue/transport.hpp"

namespace caracal::mqueue {

// What an agent announces so that a SmartNIC can reach its region: the address of the region's
// first byte as the remote side names it (the registered virtual address, or the iova of a
// dma-buf registration), the region's rkey, and its size.
struct RdmaRegionAddress {
  uint64_t address = 0;
  uint32_t rkey = 0;
  uint64_t bytes = 0;
};

// ---------------------------------------------------------------------------------------------
// SmartNIC side

struct RdmaConnectOptions {
  std::string host;  // the exporter's address (an IP address or a resolvable name)
  uint16_t port = 0;
  RdmaRegionAddress region;
  // For the whole of connect(): address and route resolution and the connection handshake.
  std::chrono::milliseconds timeout{2000};
  // Work requests the send queue holds at once; more posts wait in the transport (see
  // RdmaTransport). Clamped to the device's maximum.
  uint32_t send_queue_depth = 256;
  // One signalled completion in this many work requests (and the last of every post list).
  uint32_t signal_every = 32;
  // Work requests per ibv_post_send call: a post list goes out when it is this long, or at the
  // next progress().
  uint32_t post_batch = 16;
  // Local ACK timeout as the exponent of IB's 4.096 us * 2^n, and retries: a request unanswered
  // for (retries + 1) timeouts fails the queue pair. 18 (1.07 s per try, about 7.5 s in all
  // with 6 retries) is what long-running RDMA users settle on: shorter ones fail healthy
  // connections when the responder stalls for a moment (a loaded or emulated host, a switch
  // buffer). A peer process that exits is seen sooner, by its disconnect.
  // 6, not the IB maximum of 7: Soft-RoCE (rdma_rxe) takes a retry count of 7 as "retry
  // forever", so a lost peer would never fail the queue pair there.
  uint8_t ack_timeout = 18;
  uint8_t retry_count = 6;
};

// The SmartNIC side of one region over one RC queue pair.
//
// Posting. post_write, post_read and publish_index never block and never fail: each returns
// the next ticket and queues a work request in the transport. Queued requests go to the send
// queue as one post list when post_batch of them are waiting, and at every progress(); when
// the send queue is full (send_queue_depth requests not yet known complete), they wait in the
// transport until progress() has polled completions that make room. So a caller that never
// calls progress() sees nothing go out past the first batches, and memory use grows with what
// it posts; the ring code bounds that by its credits.
//
// Completion. Operations complete in order on an RC queue pair, so one signalled completion
// completes every earlier ticket. One request in signal_every is signalled, and so is the last
// request of every post list, so completed() reaches every posted ticket without a signal per
// request and is exact after the progress() that polls the completion.
//
// Staging. A write reads its staging range when the device executes it, not when it is posted
// (the ring code never rewrites staged bytes before the write that carries them completes).
// An index publish carries its value in a registered cell of its own, filled when the request
// goes to the send queue, so a ring may publish its tail again while the last publish is queued.
//
// Ordering. A publish_index is an RDMA WRITE on the same queue pair as the writes before it,
// and an RC responder places WRITEs in order: the index is visible no earlier than the data it
// publishes. The accelerator's acquire load of the index pairs with that order. No fence is
// set on WRITEs after READs: the ring code publishes a consumer head only after the READ of
// the slots it frees has completed.
//
// Failure. A completion with an error status, a disconnect event, or a post the device refuses
// fails the transport: progress() returns a Status that names the operation, its offsets, the
// work completion status and the queue pair, and every later progress() returns it again;
// completed() stops advancing. Not thread-safe: one thread owns a transport.
class RdmaTransport {
 public:
  // Connects to an exporter (blocks up to options.timeout) and registers a staging image of
  // options.region.bytes.
  static Result<std::unique_ptr<RdmaTransport>> connect(const RdmaConnectOptions& options);

  RdmaTransport(const RdmaTransport&) = delete;
  RdmaTransport& operator=(const RdmaTransport&) = delete;
  ~RdmaTransport();

  // --- Transport ---
  std::byte* staging(uint64_t offset) { return staging_ + offset; }
  uint64_t post_write(uint64_t offset, uint32_t length) {
    return enqueue(Op{OpKind::kWrite, offset, length, 0});
  }
  uint64_t post_read(uint64_t offset, uint32_t length) {
    return enqueue(Op{OpKind::kRead, offset, length, 0});
  }
  uint64_t publish_index(uint64_t offset, uint32_t value);
  uint32_t load_index(uint64_t offset) {
    uint32_t v;
    std::memcpy(&v, staging_ + offset, sizeof(v));
    return v;
  }
  Status progress();
  uint64_t completed() const { return completed_; }
  uint64_t region_bytes() const { return region_.bytes; }
  const char* name() const { return "rdma"; }

  // --- beyond Transport ---
  // The first failure, sticky; ok while the transport works.
  const Status& error() const { return error_; }
  bool failed() const { return !error_.ok(); }
  // "host:port qp N" for messages.
  const std::string& peer() const { return peer_; }
  uint32_t qp_num() const;
  uint32_t send_queue_depth() const { return sq_depth_; }
  // Tickets posted; requests still waiting in the transport for room in the send queue.
  uint64_t posted() const { return posted_; }
  size_t waiting() const { return waiting_.size() - waiting_head_; }

 private:
  enum class OpKind : uint8_t { kWrite, kRead, kIndex };
  struct Op {
    OpKind kind;
    uint64_t offset;
    uint32_t length;
    uint32_t value;  // kIndex only
  };

  RdmaTransport() = default;
  uint64_t enqueue(const Op& op);
  // Hands waiting requests to the send queue, as many as it has room for, in post lists.
  void flush();
  void poll_cm_events();
  void fail(Status status);
  std::string describe(const Op& op, uint64_t ticket) const;

  RdmaRegionAddress region_{};
  std::string peer_;
  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* staging_mr_ = nullptr;
  ibv_mr* cells_mr_ = nullptr;
  std::byte* staging_ = nullptr;
  uint32_t* cells_ = nullptr;  // sq_depth_ cells; ticket t's index value sits in t % sq_depth_
  bool qp_created_ = false;
  bool connected_ = false;

  uint32_t sq_depth_ = 0;
  uint32_t signal_every_ = 0;
  uint32_t post_batch_ = 0;
  std::vector<Op> waiting_;  // posted, not yet on the send queue (from waiting_head_ on)
  size_t waiting_head_ = 0;
  std::vector<Op> in_flight_;  // on the send queue; ticket t at t % sq_depth_
  std::vector<ibv_send_wr> wrs_;
  std::vector<ibv_sge> sges_;
  uint64_t posted_ = 0;     // tickets handed out
  uint64_t submitted_ = 0;  // tickets on the send queue (or completed)
  uint64_t completed_ = 0;
  uint32_t unsignalled_ = 0;
  uint32_t progress_calls_ = 0;
  Status error_;
};
static_assert(Transport<RdmaTransport>);

// ---------------------------------------------------------------------------------------------
// Agent side

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
