// The rdma_cm steps both sides share (see cm.hpp).
#include "cm.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace caracal::mqueue::rdma_detail {
namespace {

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

}  // namespace

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

}  // namespace caracal::mqueue::rdma_detail
