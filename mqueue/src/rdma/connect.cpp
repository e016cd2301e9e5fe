// RdmaTransport's setup and teardown (the SmartNIC side): resolving the exporter's address and
// route, the RC queue pair, the registered staging image and index cells, and the connection.
// The data path is in datapath.cpp.
#include <netdb.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/rdma_transport.hpp"
#include "cm.hpp"

namespace caracal::mqueue {

using rdma_detail::Clock;
using rdma_detail::errno_text;
using rdma_detail::expect_cm_event;
using rdma_detail::open_cm;
using rdma_detail::remaining_ms;
using rdma_detail::set_nonblocking;

Result<std::unique_ptr<RdmaTransport>> RdmaTransport::connect(const RdmaConnectOptions& o) {
  const std::string where = "rdma transport to " + o.host + ":" + std::to_string(o.port);
  if (o.host.empty()) return invalid_argument("rdma transport: no host to connect to");
  if (o.port == 0) return invalid_argument(where + ": port 0");
  if (o.region.bytes == 0) return invalid_argument(where + ": region of 0 bytes");
  if (o.send_queue_depth < 2) {
    return invalid_argument(where + ": send_queue_depth " + std::to_string(o.send_queue_depth) +
                            " (at least 2)");
  }
  if (o.signal_every == 0 || o.post_batch == 0) {
    return invalid_argument(where + ": signal_every and post_batch must be at least 1");
  }
  if (o.ack_timeout > 31 || o.retry_count > 7) {
    return invalid_argument(where + ": ack_timeout " + std::to_string(o.ack_timeout) +
                            " (0-31) or retry_count " + std::to_string(o.retry_count) +
                            " (0-7) out of range");
  }
  const Clock::time_point deadline = Clock::now() + o.timeout;
  std::unique_ptr<RdmaTransport> t(new RdmaTransport);
  t->region_ = o.region;
  t->peer_ = o.host + ":" + std::to_string(o.port);

  CARACAL_RETURN_IF_ERROR(open_cm(t->channel_, t->id_, where));

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* ai = nullptr;
  const std::string port_text = std::to_string(o.port);
  if (int rc = getaddrinfo(o.host.c_str(), port_text.c_str(), &hints, &ai); rc != 0) {
    return Status(StatusCode::kInvalidArgument,
                  where + ": cannot resolve '" + o.host + "': " + gai_strerror(rc));
  }
  const int resolved = rdma_resolve_addr(
      t->id_, nullptr, ai->ai_addr, static_cast<int>(std::max<int64_t>(remaining_ms(deadline), 1)));
  const int resolve_errno = errno;
  freeaddrinfo(ai);
  if (resolved != 0) {
    return Status(StatusCode::kUnavailable,
                  where + ": rdma_resolve_addr: " + errno_text(resolve_errno) +
                      " (no RDMA device reaches that address?)");
  }
  CARACAL_RETURN_IF_ERROR(expect_cm_event(t->channel_, RDMA_CM_EVENT_ADDR_RESOLVED, deadline,
                                          where + ": resolving the address"));
  if (rdma_resolve_route(t->id_, static_cast<int>(std::max<int64_t>(remaining_ms(deadline), 1))) !=
      0) {
    return Status(StatusCode::kUnavailable, where + ": rdma_resolve_route: " + errno_text(errno));
  }
  CARACAL_RETURN_IF_ERROR(expect_cm_event(t->channel_, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline,
                                          where + ": resolving the route"));

  ibv_context* verbs = t->id_->verbs;
  const std::string device = ibv_get_device_name(verbs->device);
  ibv_device_attr attr{};
  if (int rc = ibv_query_device(verbs, &attr); rc != 0) {
    return Status(StatusCode::kIoError,
                  where + ": ibv_query_device(" + device + "): " + errno_text(rc));
  }
  if (o.region.bytes > attr.max_mr_size) {
    return invalid_argument(where + ": region of " + std::to_string(o.region.bytes) +
                            " bytes exceeds the largest memory region of " + device + " (" +
                            std::to_string(attr.max_mr_size) + " bytes)");
  }
  t->sq_depth_ = std::min<uint32_t>(o.send_queue_depth, static_cast<uint32_t>(attr.max_qp_wr));
  t->signal_every_ = o.signal_every;
  t->post_batch_ = std::min(o.post_batch, t->sq_depth_);

  t->pd_ = ibv_alloc_pd(verbs);
  if (t->pd_ == nullptr) {
    return Status(StatusCode::kUnavailable,
                  where + ": ibv_alloc_pd(" + device + "): " + errno_text(errno));
  }
  // One CQE per signalled request at most, and at most sq_depth_ requests outstanding (error
  // completions of unsignalled requests included).
  t->cq_ = ibv_create_cq(verbs, static_cast<int>(t->sq_depth_) + 1, nullptr, nullptr, 0);
  if (t->cq_ == nullptr) {
    return Status(StatusCode::kUnavailable,
                  where + ": ibv_create_cq(" + device + "): " + errno_text(errno));
  }
  const uint64_t staging_bytes = round_up(o.region.bytes, 4096);
  t->staging_ = static_cast<std::byte*>(std::aligned_alloc(4096, staging_bytes));
  if (t->staging_ == nullptr) {
    return Status(StatusCode::kUnavailable,
                  where + ": cannot allocate " + std::to_string(staging_bytes) + " staging bytes");
  }
  std::memset(t->staging_, 0, staging_bytes);
  t->staging_mr_ = ibv_reg_mr(t->pd_, t->staging_, o.region.bytes, IBV_ACCESS_LOCAL_WRITE);
  if (t->staging_mr_ == nullptr) {
    return Status(StatusCode::kUnavailable, where + ": cannot register " +
                                                std::to_string(o.region.bytes) +
                                                " staging bytes on " + device + ": " +
                                                errno_text(errno) + " (RLIMIT_MEMLOCK?)");
  }
  const uint64_t cell_bytes = round_up(uint64_t{t->sq_depth_} * sizeof(uint32_t), 64);
  t->cells_ = static_cast<uint32_t*>(std::aligned_alloc(64, cell_bytes));
  if (t->cells_ == nullptr) {
    return Status(StatusCode::kUnavailable, where + ": cannot allocate index cells");
  }
  std::memset(t->cells_, 0, cell_bytes);
  t->cells_mr_ = ibv_reg_mr(t->pd_, t->cells_, cell_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (t->cells_mr_ == nullptr) {
    return Status(StatusCode::kUnavailable,
                  where + ": cannot register index cells on " + device + ": " + errno_text(errno));
  }

  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.send_cq = t->cq_;
  qa.recv_cq = t->cq_;
  qa.cap.max_send_wr = t->sq_depth_;
  qa.cap.max_recv_wr = 1;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.sq_sig_all = 0;
  if (rdma_create_qp(t->id_, t->pd_, &qa) != 0) {
    return Status(StatusCode::kUnavailable, where + ": rdma_create_qp(" + device + ", " +
                                                std::to_string(t->sq_depth_) +
                                                " send requests): " + errno_text(errno));
  }
  t->qp_created_ = true;
  // See RdmaConnectOptions::ack_timeout.
  uint8_t ack_timeout = o.ack_timeout;
  (void)rdma_set_option(t->id_, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout,
                        sizeof(ack_timeout));

  rdma_conn_param param{};
  param.initiator_depth = static_cast<uint8_t>(std::min(16, attr.max_qp_init_rd_atom));
  param.responder_resources = 0;  // the exporter never reads from us
  param.retry_count = o.retry_count;
  param.rnr_retry_count = 7;
  if (rdma_connect(t->id_, &param) != 0) {
    return Status(StatusCode::kUnavailable, where + ": rdma_connect: " + errno_text(errno));
  }
  CARACAL_RETURN_IF_ERROR(
      expect_cm_event(t->channel_, RDMA_CM_EVENT_ESTABLISHED, deadline, where + ": connecting"));
  t->connected_ = true;
  t->peer_ += " qp " + std::to_string(t->id_->qp->qp_num);
  CARACAL_RETURN_IF_ERROR(set_nonblocking(t->channel_->fd, where));

  t->in_flight_.resize(t->sq_depth_);
  t->wrs_.resize(t->post_batch_);
  t->sges_.resize(t->post_batch_);
  t->waiting_.reserve(t->sq_depth_);
  return t;
}

RdmaTransport::~RdmaTransport() {
  if (connected_) rdma_disconnect(id_);
  if (qp_created_) rdma_destroy_qp(id_);
  if (staging_mr_ != nullptr) ibv_dereg_mr(staging_mr_);
  if (cells_mr_ != nullptr) ibv_dereg_mr(cells_mr_);
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (id_ != nullptr) rdma_destroy_id(id_);
  if (channel_ != nullptr) rdma_destroy_event_channel(channel_);
  std::free(staging_);
  std::free(cells_);
}

uint32_t RdmaTransport::qp_num() const {
  return qp_created_ ? id_->qp->qp_num : 0;
}

}  // namespace caracal::mqueue
