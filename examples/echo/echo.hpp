// The echo handler: the reply is the request. Host/device code, so the same type runs on
// every accelerator backend.
//
// It also speaks sockperf's side of the conversation, so `sockperf ping-pong` and
// `sockperf throughput` work against it unmodified. A sockperf message starts with a 14-byte
// header: sequence number (8 bytes), flags (2), total length (4), all big-endian; flag 1 marks
// a client message and flag 2 asks for a reply. A message with that header (and its own
// length in it) is answered the way sockperf's server does: with the client flag cleared when
// a reply is asked for, with nothing otherwise. Every other message is echoed as it is.
#pragma once

#include <cstdint>

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/platform.hpp"

namespace caracal::examples {

struct SockperfHeader {
  static constexpr uint32_t kBytes = 14;
  static constexpr uint16_t kClient = 1;
  static constexpr uint16_t kPongRequest = 2;
  static constexpr uint16_t kKnownFlags = 7;  // client, pong request, warm-up

  // Whether `data` is a sockperf client message; `flags` receives its flags.
  CARACAL_INLINE static bool parse(const std::byte* data, uint32_t size, uint16_t& flags) {
    if (size < kBytes) return false;
    flags = static_cast<uint16_t>((static_cast<uint32_t>(data[8]) << 8) |
                                  static_cast<uint32_t>(data[9]));
    const uint32_t length =
        (static_cast<uint32_t>(data[10]) << 24) | (static_cast<uint32_t>(data[11]) << 16) |
        (static_cast<uint32_t>(data[12]) << 8) | static_cast<uint32_t>(data[13]);
    return length == size && (flags & ~kKnownFlags) == 0 && (flags & kClient) != 0;
  }
};

struct Echo {
  // On a GPU a warp answers each request: its 32 threads copy 16 bytes each per step. On the
  // CPU a group is one thread whatever the granularity.
  static constexpr accel::Granularity kGranularity = accel::Granularity::kWarp;

  CARACAL_HOST_DEVICE void operator()(const accel::Request& req, accel::Response& resp,
                                      accel::Context& ctx) const {
    uint16_t flags = 0;
    const bool sockperf = SockperfHeader::parse(req.data, req.size, flags);
    if (sockperf && (flags & SockperfHeader::kPongRequest) == 0) {
      resp.no_reply();  // throughput mode: sockperf's server answers nothing
      return;
    }
    // The runtime sizes the response for the region's largest message, so any request fits;
    // a group splits the copy by rank (on the CPU the group is one thread).
    accel::group_copy(ctx.group(), resp.data, req.data, req.size);
    ctx.group().sync();
    if (sockperf && ctx.group().leader()) {
      resp.data[9] = static_cast<std::byte>(flags & ~SockperfHeader::kClient);  // from the server
    }
    resp.size = req.size;
  }
};

}  // namespace caracal::examples
