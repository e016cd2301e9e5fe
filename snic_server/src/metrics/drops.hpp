// Drops, counted by reason: the `reason` label of caracal_listener_drops_total and
// caracal_service_drops_total. Listeners, dispatch and the mqueue manager count what they drop
// here, so that every reason has one name in /metrics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "metrics/metrics.hpp"

namespace caracal::server {

// Why a request or reply was dropped: the `reason` label of the drop counters.
enum class DropReason : uint8_t {
  kConnectionClosed,  // a reply whose connection (or UDP request) is gone
  kMalformed,         // a TCP stream that cannot be framed
  kNoAgent,           // no agent serves the service
  kOversize,          // a datagram, or a TCP line skipped, over max_message_bytes
  kPartialMessage,    // a TCP client closed with half a message sent
  kQueueFull,         // UDP: every queue congested
  kReplySlots,        // every reply slot in use
  kReplyUnframeable,  // a reply the listener's framing cannot carry
  kRequestFailed,     // an error answer the listener cannot send (no error_reply)
  kStaleReply,        // a reply for a request the connection no longer waits for
  kUnknownToken,      // a handler answered with a token it was not given
  kSendBufferFull,    // UDP send would block
  kSendFailed,        // UDP send failed
  kReplyTooLarge,     // DPDK: a reply longer than one frame of the port's MTU carries
  kNoMbufs,           // DPDK: the mbuf pool was empty when a reply was to be sent
  kLate,              // a reply to a request that had timed out (reply_timeout_ms)
  kCount,
};
const char* drop_reason_name(DropReason reason);

// The drop counters of one listener or service: `name{labels..., reason}`. Each reason's series
// is looked up in the registry the first time it is counted and kept, so counting a drop takes
// no lock and allocates nothing (a UDP flood drops at line rate).
class DropCounters {
 public:
  DropCounters(Registry& registry, std::string name, std::string help, Labels labels);
  void inc(DropReason reason);

 private:
  Registry& registry_;
  std::string name_;
  std::string help_;
  Labels labels_;
  // Racing first counts both store the same series (the registry returns one object per
  // name and labels), so a plain release/acquire publication is enough.
  std::array<std::atomic<Counter*>, static_cast<size_t>(DropReason::kCount)> series_{};
};

}  // namespace caracal::server
