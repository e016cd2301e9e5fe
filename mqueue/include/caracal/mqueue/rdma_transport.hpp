// The SmartNIC side of the `rdma` transport: RdmaTransport satisfies Transport (transport.hpp)
// with one RC queue pair to one exporter (rdma_exporter.hpp), a registered staging image of the
// whole region, RDMA WRITE for post_write and publish_index, RDMA READ for post_read.
//
// Setup (rdma_cm connect, registration) is in src/rdma/connect.cpp, the data path (post lists,
// completions, failure) in src/rdma/datapath.cpp. Built only with CARACAL_HAVE_RDMA.
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
#include "caracal/mqueue/rdma_region_address.hpp"
#include "caracal/mqueue/transport.hpp"

namespace caracal::mqueue {

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

}  // namespace caracal::mqueue
