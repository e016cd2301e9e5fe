// RdmaRegionExporter (the agent side): registering the region, listening with rdma_cm, and
// accepting or dropping SmartNIC connections. Nothing here is on the data path.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "caracal/mqueue/rdma_exporter.hpp"
#include "cm.hpp"

namespace caracal::mqueue {

using rdma_detail::address_text;
using rdma_detail::errno_text;
using rdma_detail::open_cm;
using rdma_detail::set_nonblocking;

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
