// What the rdma sources share (private to mqueue): the rdma_cm steps that the connecting side
// (RdmaTransport::connect, connect.cpp) and the listening side (RdmaRegionExporter::listen,
// exporter.cpp) both take, and the texts their errors are made of. Setup code only: nothing here
// is on the data path.
#pragma once

#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "caracal/core/status.hpp"

namespace caracal::mqueue::rdma_detail {

using Clock = std::chrono::steady_clock;

// "No such device (errno 19)".
std::string errno_text(int e);
// "192.0.2.1:41443" for an IPv4 or IPv6 socket address; "?" for anything else.
std::string address_text(const sockaddr* sa);
// Milliseconds left until `deadline`, at least 0.
int64_t remaining_ms(Clock::time_point deadline);

// An rdma_cm event channel and an RC (RDMA_PS_TCP) id on it, for the connecting side and the
// listening side alike. On failure the caller's destructor releases what was made.
Status open_cm(rdma_event_channel*& channel, rdma_cm_id*& id, const std::string& where);

// Makes an event channel non-blocking once setup is over, so that the owner polls it.
Status set_nonblocking(int fd, const std::string& what);

// Waits (the channel still blocking) until `deadline` for the next event and acknowledges it;
// an error unless it is `wanted`, with the reason a user can act on (no listener on the port,
// no RDMA device reaches the address, ...).
Status expect_cm_event(rdma_event_channel* channel, rdma_cm_event_type wanted,
                       Clock::time_point deadline, const std::string& what);

}  // namespace caracal::mqueue::rdma_detail
