#include "caracal/mqueue/rdma.hpp"

#include "caracal/mqueue/layout.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace caracal::mqueue {
namespace {

using Clock = std::chrono::steady_clock;

std::string errno_text(int e) {
  return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")";
}

std::string address_text(const sockaddr* sa) {
  if (sa == nullptr) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

int64_t remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max<int64_t>(left.count(), 0);
}

// An rdma_cm event channel and an RC (RDMA_PS_TCP) id on it, for the connecting side and the
// listening side alike. On failure the caller's destructor releases what was made.
Status open_cm(rdma_event_channel*& channel, rdma_cm_id*& id, const std::string& where) {
  channel = rdma_create_event_channel();
  if (channel == nullptr) {
    return Status(StatusCode::kUnavailable,
                  where + ": no rdma_cm (rdma_create_event_channel: " + errno_text(errno) +
                      "; is the rdma_ucm module loaded?)");
  }
  if (rdma_create_id(channel, &id, nullptr, RDMA_PS_TCP) != 0) {
    return Status(StatusCode::kUnavailable, where + ": rdma_create_id: " + errno_text(errno));
  }
  return Status::ok_status();
}

Status set_nonblocking(int fd, const std::string& what) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Status(StatusCode::kIoError, what +
                                            ": cannot make the rdma_cm event channel "
                                            "non-blocking: " +
                                            errno_text(errno));
  }
  return Status::ok_status();
}

struct CmEvent {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
  int status = 0;
};

// Waits for the next event on a blocking channel until `deadline`; acknowledges it.
Result<CmEvent> next_cm_event(rdma_event_channel* channel, Clock::time_point deadline,
                              const std::string& what) {
  pollfd p{channel->fd, POLLIN, 0};
  for (;;) {
    const int n = ::poll(&p, 1, static_cast<int>(remaining_ms(deadline)));
    if (n > 0) break;
    if (n == 0) return Status(StatusCode::kUnavailable, what + ": timed out");
    if (errno != EINTR) {
      return Status(StatusCode::kIoError, what + ": poll failed: " + errno_text(errno));
    }
  }
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(channel, &event) != 0) {
    return Status(StatusCode::kIoError, what + ": rdma_get_cm_event failed: " + errno_text(errno));
  }
  CmEvent out{event->event, event->status};
  rdma_ack_cm_event(event);
  return out;
}

// A clear message for an event that is not the one a setup step waited for.
std::string unexpected_event(const CmEvent& e, rdma_cm_event_type wanted) {
  std::string m;
  if (e.type == RDMA_CM_EVENT_REJECTED) {
    m = "connection rejected (status " + std::to_string(e.status) + ")";
    // IB CM reject reason 8 (invalid service ID): no rdma_cm listener on that port.
    if (e.status == 8) m += ": nobody listens on that port";
    return m;
  }
  if (e.type == RDMA_CM_EVENT_ADDR_ERROR) {
    return "address resolution failed (status " + std::to_string(e.status) +
           "): no RDMA device reaches that address";
  }
  if (e.type == RDMA_CM_EVENT_UNREACHABLE) {
    return "peer unreachable (status " + std::to_string(e.status) + ")";
  }
  return std::string("got ") + rdma_event_str(e.type) + " (status " + std::to_string(e.status) +
         ") while waiting for " + rdma_event_str(wanted);
}

Status expect_cm_event(rdma_event_channel* channel, rdma_cm_event_type wanted,
                       Clock::time_point deadline, const std::string& what) {
  Result<CmEvent> e = next_cm_event(channel, deadline, what);
  if (!e.ok()) return e.status();
  if (e->type != wanted) {
    const StatusCode code = e->type == RDMA_CM_EVENT_REJECTED || e->type == RDMA_CM_EVENT_ADDR_ERROR
                                ? StatusCode::kUnavailable
                                : StatusCode::kIoError;
    return Status(code, what + ": " + unexpected_event(*e, wanted));
  }
  return Status::ok_status();
}

const char* op_name(uint8_t kind) {
  switch (kind) {
    case 0:
      return "RDMA WRITE";
    case 1:
      return "RDMA READ";
    default:
      return "index RDMA WRITE";
  }
}

}  // namespace

// =============================================================================================
// RdmaTransport

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

uint64_t RdmaTransport::publish_index(uint64_t offset, uint32_t value) {
  if (offset <= region_.bytes && sizeof(uint32_t) <= region_.bytes - offset) {
    std::memcpy(staging_ + offset, &value, sizeof(value));  // what load_index reports
  }
  return enqueue(Op{OpKind::kIndex, offset, sizeof(uint32_t), value});
}

uint64_t RdmaTransport::enqueue(const Op& op) {
  const uint64_t ticket = ++posted_;
  if (!error_.ok()) return ticket;  // never completes; progress() reports the failure
  if (op.offset > region_.bytes || op.length > region_.bytes - op.offset) {
    fail(invalid_argument(describe(op, ticket) + " is outside the region of " +
                          std::to_string(region_.bytes) + " bytes"));
    return ticket;
  }
  waiting_.push_back(op);
  if (waiting() >= post_batch_) flush();
  return ticket;
}

void RdmaTransport::flush() {
  while (error_.ok() && waiting() != 0) {
    // Requests on the send queue and not known complete hold its slots (unsignalled ones until
    // a later signalled completion retires them).
    const uint64_t room = sq_depth_ - (submitted_ - completed_);
    if (room == 0) return;  // progress() retries once completions have made room
    const uint32_t n = static_cast<uint32_t>(
        std::min<uint64_t>({uint64_t{waiting()}, room, uint64_t{post_batch_}}));
    for (uint32_t i = 0; i < n; ++i) {
      const Op& op = waiting_[waiting_head_ + i];
      const uint64_t ticket = submitted_ + 1 + i;
      const uint32_t slot = static_cast<uint32_t>(ticket % sq_depth_);
      in_flight_[slot] = op;
      ibv_sge& sge = sges_[i];
      ibv_send_wr& wr = wrs_[i];
      wr = ibv_send_wr{};
      wr.wr_id = ticket;
      wr.next = i + 1 < n ? &wrs_[i + 1] : nullptr;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.wr.rdma.remote_addr = region_.address + op.offset;
      wr.wr.rdma.rkey = region_.rkey;
      if (op.kind == OpKind::kIndex) {
        // The cell of this ticket is free: the ticket sq_depth_ before it has completed, or
        // there would be no room on the send queue.
        cells_[slot] = op.value;
        sge.addr = reinterpret_cast<uintptr_t>(&cells_[slot]);
        sge.length = sizeof(uint32_t);
        sge.lkey = cells_mr_->lkey;
        wr.opcode = IBV_WR_RDMA_WRITE;
      } else {
        sge.addr = reinterpret_cast<uintptr_t>(staging_ + op.offset);
        sge.length = op.length;
        sge.lkey = staging_mr_->lkey;
        wr.opcode = op.kind == OpKind::kRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      }
      // The last of every post list is signalled, so every ticket on the send queue has a
      // signalled completion at or after it and completed() never stalls short of it.
      if (++unsignalled_ >= signal_every_ || i + 1 == n) {
        wr.send_flags = IBV_SEND_SIGNALED;
        unsignalled_ = 0;
      }
    }
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(id_->qp, wrs_.data(), &bad); rc != 0) {
      const uint64_t ticket = bad != nullptr ? bad->wr_id : submitted_ + 1;
      fail(Status(StatusCode::kIoError, "rdma transport to " + peer_ + ": ibv_post_send refused " +
                                            describe(in_flight_[ticket % sq_depth_], ticket) +
                                            ": " + errno_text(rc)));
      return;
    }
    submitted_ += n;
    waiting_head_ += n;
  }
  if (waiting_head_ == waiting_.size()) {
    waiting_.clear();
    waiting_head_ = 0;
  } else if (waiting_head_ > 4096 && waiting_head_ * 2 > waiting_.size()) {
    waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(waiting_head_));
    waiting_head_ = 0;
  }
}

Status RdmaTransport::progress() {
  if (!error_.ok()) return error_;
  ibv_wc wc[16];
  for (;;) {
    const int n = ibv_poll_cq(cq_, 16, wc);
    if (n < 0) {
      fail(Status(StatusCode::kIoError, "rdma transport to " + peer_ + ": ibv_poll_cq failed"));
      return error_;
    }
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        // Completions come in order: the first error is the request that failed; the flushed
        // requests behind it only repeat it.
        const uint64_t ticket = wc[i].wr_id;
        fail(Status(StatusCode::kUnavailable, "rdma transport to " + peer_ + ": " +
                                                  describe(in_flight_[ticket % sq_depth_], ticket) +
                                                  " failed: " + ibv_wc_status_str(wc[i].status) +
                                                  " (wc status " +
                                                  std::to_string(static_cast<int>(wc[i].status)) +
                                                  ", vendor error " + hex(wc[i].vendor_err) + ")"));
        return error_;
      }
      completed_ = std::max<uint64_t>(completed_, wc[i].wr_id);
    }
    if (n < 16) break;
  }
  flush();
  // A disconnect is seen here even while nothing is posted; a syscall, so not every call.
  if (++progress_calls_ % 64 == 0) poll_cm_events();
  return error_;
}

void RdmaTransport::poll_cm_events() {
  for (;;) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(channel_, &event) != 0) return;  // EAGAIN: none pending
    const rdma_cm_event_type type = event->event;
    const int status = event->status;
    rdma_ack_cm_event(event);
    if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL ||
        type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
      connected_ = false;
      fail(Status(StatusCode::kUnavailable, "rdma transport to " + peer_ + ": " +
                                                rdma_event_str(type) + " (status " +
                                                std::to_string(status) + "): the peer is gone"));
      return;
    }
  }
}

void RdmaTransport::fail(Status status) {
  if (error_.ok()) error_ = std::move(status);
}

std::string RdmaTransport::describe(const Op& op, uint64_t ticket) const {
  return std::string(op_name(static_cast<uint8_t>(op.kind))) + " of " + std::to_string(op.length) +
         " bytes at region offset " + std::to_string(op.offset) + " (remote address " +
         hex(region_.address + op.offset) + ", rkey " + hex(region_.rkey) + ", ticket " +
         std::to_string(ticket) + ")";
}

// =============================================================================================
// RdmaRegionExporter

Result<std::unique_ptr<RdmaRegionExporter>> RdmaRegionExporter::listen(const RdmaExportOptions& o,
                                                                       const RdmaMemory& memory) {
  const std::string bind = o.bind_address.empty() ? "0.0.0.0" : o.bind_address;
  const std::string where = "rdma exporter on " + bind + ":" + std::to_string(o.port);
  if (memory.base == nullptr) return invalid_argument(where + ": region address is null");
  if (memory.bytes == 0) return invalid_argument(where + ": region of 0 bytes");
  if (o.max_connections == 0) return invalid_argument(where + ": max_connections 0");
  if (memory.kind == RdmaMemory::Kind::kGpuDmabuf && memory.dmabuf_fd < 0) {
    return invalid_argument(where + ": GPU dma-buf registration without a dma-buf fd");
  }
  std::unique_ptr<RdmaRegionExporter> x(new RdmaRegionExporter);
  x->bind_address_ = bind;
  x->max_connections_ = o.max_connections;

  int devices = 0;
  x->device_list_ = rdma_get_devices(&devices);
  if (x->device_list_ == nullptr || devices == 0) {
    return Status(StatusCode::kUnavailable,
                  where +
                      ": no RDMA device (load a driver, e.g. `modprobe rdma_rxe` and "
                      "`rdma link add rxe0 type rxe netdev IF` for Soft-RoCE)");
  }
  CARACAL_RETURN_IF_ERROR(open_cm(x->channel_, x->listen_id_, where));
  sockaddr_storage ss{};
  if (o.bind_address.empty()) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_ANY);
    in->sin_port = htons(o.port);
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_flags = AI_PASSIVE;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* ai = nullptr;
    const std::string port_text = std::to_string(o.port);
    if (int rc = getaddrinfo(o.bind_address.c_str(), port_text.c_str(), &hints, &ai); rc != 0) {
      return Status(StatusCode::kInvalidArgument,
                    where + ": cannot resolve '" + o.bind_address + "': " + gai_strerror(rc));
    }
    std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
  }
  if (rdma_bind_addr(x->listen_id_, reinterpret_cast<sockaddr*>(&ss)) != 0) {
    return Status(StatusCode::kUnavailable,
                  where + ": rdma_bind_addr: " + errno_text(errno) +
                      (errno == EADDRNOTAVAIL || errno == ENODEV
                           ? " (is it the address of an RDMA device's network interface?)"
                           : ""));
  }
  if (rdma_listen(x->listen_id_, static_cast<int>(o.max_connections)) != 0) {
    return Status(StatusCode::kUnavailable, where + ": rdma_listen: " + errno_text(errno));
  }
  x->port_ = ntohs(rdma_get_src_port(x->listen_id_));
  // Bound to an address, the listener knows its device; bound to any, connections may come
  // through any device, and the region can be registered on one only: the first.
  x->verbs_ = x->listen_id_->verbs != nullptr ? x->listen_id_->verbs : x->device_list_[0];
  const std::string device = x->device_name();
  const std::string at = "region at " + hex(reinterpret_cast<uintptr_t>(memory.base)) + " of " +
                         std::to_string(memory.bytes) + " bytes on " + device;

  ibv_device_attr attr{};
  if (int rc = ibv_query_device(x->verbs_, &attr); rc != 0) {
    return Status(StatusCode::kIoError,
                  where + ": ibv_query_device(" + device + "): " + errno_text(rc));
  }
  if (memory.bytes > attr.max_mr_size) {
    return invalid_argument(where + ": " + at + " exceeds the device's largest memory region (" +
                            std::to_string(attr.max_mr_size) + " bytes)");
  }
  x->responder_resources_ =
      std::min<uint32_t>(o.responder_resources, static_cast<uint32_t>(attr.max_qp_rd_atom));
  x->pd_ = ibv_alloc_pd(x->verbs_);
  if (x->pd_ == nullptr) {
    return Status(StatusCode::kUnavailable,
                  where + ": ibv_alloc_pd(" + device + "): " + errno_text(errno));
  }
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  const uint64_t iova = reinterpret_cast<uintptr_t>(memory.base);
  switch (memory.kind) {
    case RdmaMemory::Kind::kHost:
      x->mr_ = ibv_reg_mr(x->pd_, memory.base, memory.bytes, access);
      if (x->mr_ == nullptr) {
        return Status(StatusCode::kUnavailable, where + ": cannot register host memory: " + at +
                                                    ": " + errno_text(errno) +
                                                    " (unmapped address, or RLIMIT_MEMLOCK?)");
      }
      x->registration_ = "host memory (ibv_reg_mr)";
      break;
    case RdmaMemory::Kind::kGpuDmabuf: {
      // The dma-buf path needs no out-of-tree kernel module (kernel 5.12+, rdma-core 34+, a
      // driver that supports it); the iova is the device pointer, so the SmartNIC addresses the
      // region by the pointer the agent announces either way.
      x->mr_ = ibv_reg_dmabuf_mr(x->pd_, memory.dmabuf_offset, memory.bytes, iova, memory.dmabuf_fd,
                                 access);
      if (x->mr_ != nullptr) {
        x->registration_ = "GPU memory (dma-buf, ibv_reg_dmabuf_mr)";
        break;
      }
      const int dmabuf_errno = errno;
      x->mr_ = ibv_reg_mr(x->pd_, memory.base, memory.bytes, access);
      if (x->mr_ == nullptr) {
        return Status(StatusCode::kUnavailable,
                      where + ": cannot register GPU memory: " + at + ": ibv_reg_dmabuf_mr(fd " +
                          std::to_string(memory.dmabuf_fd) + "): " + errno_text(dmabuf_errno) +
                          "; peer memory (ibv_reg_mr): " + errno_text(errno) +
                          " (is nvidia-peermem loaded?)");
      }
      x->registration_ =
          "GPU memory (peer memory, ibv_reg_mr; dma-buf refused: " + errno_text(dmabuf_errno) + ")";
      break;
    }
    case RdmaMemory::Kind::kGpuPeerMem:
      x->mr_ = ibv_reg_mr(x->pd_, memory.base, memory.bytes, access);
      if (x->mr_ == nullptr) {
        return Status(StatusCode::kUnavailable,
                      where + ": cannot register GPU memory: " + at +
                          " (peer memory, ibv_reg_mr): " + errno_text(errno) +
                          " (is nvidia-peermem loaded?)");
      }
      x->registration_ = "GPU memory (peer memory, ibv_reg_mr)";
      break;
  }
  x->exported_ = RdmaRegionAddress{iova, x->mr_->rkey, memory.bytes};
  x->cq_ = ibv_create_cq(x->verbs_, static_cast<int>(2 * o.max_connections), nullptr, nullptr, 0);
  if (x->cq_ == nullptr) {
    return Status(StatusCode::kUnavailable,
                  where + ": ibv_create_cq(" + device + "): " + errno_text(errno));
  }
  CARACAL_RETURN_IF_ERROR(set_nonblocking(x->channel_->fd, where));
  return x;
}

RdmaRegionExporter::~RdmaRegionExporter() {
  for (Connection& c : connections_) {
    if (c.established) rdma_disconnect(c.id);
    rdma_destroy_qp(c.id);
    rdma_destroy_id(c.id);
  }
  if (listen_id_ != nullptr) rdma_destroy_id(listen_id_);
  if (mr_ != nullptr) ibv_dereg_mr(mr_);
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  if (pd_ != nullptr) ibv_dealloc_pd(pd_);
  if (channel_ != nullptr) rdma_destroy_event_channel(channel_);
  if (device_list_ != nullptr) rdma_free_devices(device_list_);
}

int RdmaRegionExporter::event_fd() const {
  return channel_->fd;
}

std::string RdmaRegionExporter::device_name() const {
  return verbs_ != nullptr ? ibv_get_device_name(verbs_->device) : "?";
}

uint32_t RdmaRegionExporter::connections() const {
  uint32_t n = 0;
  for (const Connection& c : connections_) {
    n += c.established ? 1 : 0;
  }
  return n;
}

Status RdmaRegionExporter::poll() {
  Status first;
  for (;;) {
    rdma_cm_event* event = nullptr;
    if (rdma_get_cm_event(channel_, &event) != 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return Status(StatusCode::kIoError, "rdma exporter on " + bind_address_ + ":" +
                                              std::to_string(port_) +
                                              ": rdma_get_cm_event: " + errno_text(errno));
    }
    rdma_cm_id* id = event->id;
    const rdma_cm_event_type type = event->event;
    const int status = event->status;
    const rdma_conn_param requested = event->param.conn;
    rdma_ack_cm_event(event);
    Status s;
    switch (type) {
      case RDMA_CM_EVENT_CONNECT_REQUEST:
        s = accept(id, &requested);
        break;
      case RDMA_CM_EVENT_ESTABLISHED:
        for (Connection& c : connections_) {
          if (c.id == id) {
            c.established = true;
            ++accepted_total_;
          }
        }
        break;
      case RDMA_CM_EVENT_DISCONNECTED:
      case RDMA_CM_EVENT_REJECTED:
      case RDMA_CM_EVENT_CONNECT_ERROR:
      case RDMA_CM_EVENT_UNREACHABLE:
        drop(id);
        break;
      case RDMA_CM_EVENT_DEVICE_REMOVAL:
        s = Status(StatusCode::kUnavailable, "rdma exporter: device " + device_name() +
                                                 " removed (status " + std::to_string(status) +
                                                 ")");
        if (id != listen_id_) drop(id);
        break;
      default:
        break;
    }
    if (!s.ok() && first.ok()) first = std::move(s);
  }
  return first;
}

Status RdmaRegionExporter::accept(rdma_cm_id* id, const rdma_conn_param* requested) {
  const std::string from = address_text(rdma_get_peer_addr(id));
  const std::string where = "rdma exporter on " + bind_address_ + ":" + std::to_string(port_) +
                            ": connection from " + from;
  auto refuse = [&](StatusCode code, std::string why) {
    rdma_reject(id, nullptr, 0);
    rdma_destroy_id(id);
    return Status(code, where + " rejected: " + std::move(why));
  };
  if (id->verbs != verbs_) {
    return refuse(StatusCode::kUnavailable, std::string("it arrived on device ") +
                                                ibv_get_device_name(id->verbs->device) +
                                                ", the region is registered on " + device_name() +
                                                " (bind the exporter to that device's address)");
  }
  if (connections_.size() >= max_connections_) {
    return refuse(StatusCode::kUnavailable, "already " + std::to_string(connections_.size()) +
                                                " connections (max_connections)");
  }
  // The agent posts nothing: its queue pair only answers the SmartNIC's one-sided requests.
  ibv_qp_init_attr qa{};
  qa.qp_type = IBV_QPT_RC;
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.cap.max_send_wr = 1;
  qa.cap.max_recv_wr = 1;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id, pd_, &qa) != 0) {
    return refuse(StatusCode::kUnavailable, "rdma_create_qp: " + errno_text(errno));
  }
  rdma_conn_param param{};
  // Incoming READs this queue pair serves at once: what the SmartNIC asks for, within ours. A
  // connect request's parameters are from this side's point of view: its responder_resources
  // is the SmartNIC's initiator depth.
  param.responder_resources = static_cast<uint8_t>(
      std::min<uint32_t>(requested->responder_resources, responder_resources_));
  param.initiator_depth = 0;
  param.rnr_retry_count = 7;
  if (rdma_accept(id, &param) != 0) {
    const int e = errno;
    rdma_destroy_qp(id);
    return refuse(StatusCode::kUnavailable, "rdma_accept: " + errno_text(e));
  }
  connections_.push_back(Connection{id, false});
  return Status::ok_status();
}

void RdmaRegionExporter::drop(rdma_cm_id* id) {
  for (auto it = connections_.begin(); it != connections_.end(); ++it) {
    if (it->id == id) {
      rdma_destroy_qp(id);
      rdma_destroy_id(id);
      connections_.erase(it);
      return;
    }
  }
}

}  // namespace caracal::mqueue
