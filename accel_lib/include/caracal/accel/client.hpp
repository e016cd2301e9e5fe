// A client queue as a handler sees it: the handler sends requests to a named destination (the
// SmartNIC holds the connection to it) and gets the replies back, each carrying the token the
// handler chose. Host/device code.
//
// On the wire, the SmartNIC frames each request by the destination's `framing` and cuts its
// replies by it (snic_server/README.md, Framing): a length prefix goes before the handler's
// bytes; under `line` the delimiter goes after them, so a handler writes none; a reply arrives
// without its framing, except a `memcached` destination's, which arrives whole, `\r\n`
// included, as the handler writes memcached's requests whole.
//
// Two ways to use it:
//  - call(): send one request and wait for its reply (one call in flight on the channel);
//  - send() / next_reply() / release_replies(): many calls in flight, matched by token.
// Do not mix them on one channel while replies are outstanding. An overlapped handler
// (overlap.hpp) makes its calls through Calls instead, and the runtime matches the replies.
#pragma once

#include <cstdint>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/platform.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/ring.hpp"

namespace caracal::accel {

enum class CallStatus : uint8_t {
  kOk = 0,
  kTooLarge,       // the request exceeds the region's max_message_bytes
  kStopped,        // the region's stop word was raised while waiting
  kCorrupt,        // the reply ring holds an entry that fails validation
  kTokenMismatch,  // a reply for another token arrived (call() mixed with send())
  kReplyTooLarge,  // the reply did not fit the caller's buffer (truncated copy)
  kRemoteError,    // the SmartNIC answered with an error (destination down, timeout, ...)
  // Calls of an overlapped handler (overlap.hpp) that did not go out:
  kNoClient,   // no client queue of that index
  kQueueFull,  // the client queue had no room
};

struct CallResult {
  CallStatus status = CallStatus::kOk;
  uint32_t length = 0;  // reply bytes (the full length, even when truncated)
};

class ClientChannel {
 public:
  CARACAL_HOST_DEVICE ClientChannel() {}
  // Client queue `client` (0-based among the region's client queues).
  CARACAL_HOST_DEVICE ClientChannel(const mqueue::RegionView& region, uint32_t client)
      : region_(region),
        requests_(region.tx_producer(mqueue::client_queue_index(region.header(), client))),
        replies_(region.rx_consumer(mqueue::client_queue_index(region.header(), client))),
        client_(client) {}

  CARACAL_INLINE uint32_t index() const { return client_; }
  // True once the region's stop word is raised: a handler that waits on next_reply() checks it
  // every few thousand spins, as call() does.
  CARACAL_INLINE bool stop_requested() const { return region_.stop_requested(); }

  // Queues a request; false when the ring has no room now (or never could hold it). Not
  // visible to the SmartNIC until flush().
  CARACAL_INLINE bool send(uint64_t token, const void* data, uint32_t length) {
    std::byte* dst = requests_.reserve(length);
    if (dst == nullptr) return false;
    const std::byte* src = static_cast<const std::byte*>(data);
    for (uint32_t i = 0; i < length; ++i)
      dst[i] = src[i];
    return requests_.commit(length, token, 0);
  }
  // Zero-copy form of send(): reserve, write, commit.
  CARACAL_INLINE std::byte* reserve(uint32_t max_length) { return requests_.reserve(max_length); }
  CARACAL_INLINE bool commit(uint32_t length, uint64_t token) {
    return requests_.commit(length, token, 0);
  }
  CARACAL_INLINE void flush() { requests_.publish(); }

  // The next reply, in the order the SmartNIC delivered them; valid until release_replies().
  CARACAL_INLINE mqueue::PollResult next_reply(mqueue::Entry& reply) {
    return replies_.next(reply);
  }
  CARACAL_INLINE void release_replies() {
    replies_.release();
    replies_.publish();
  }
  // For a consumer that holds replies in place while it reads on (overlap.hpp): where the next
  // reply starts, giving back the replies before a mark, and publishing after the caller's
  // fence_release().
  CARACAL_INLINE mqueue::ReadMark reply_mark() const { return replies_.mark(); }
  CARACAL_INLINE uint32_t reply_distance(const mqueue::ReadMark& m) const {
    return replies_.distance(m);
  }
  CARACAL_INLINE void release_replies_to(const mqueue::ReadMark& m) { replies_.release_to(m); }
  CARACAL_INLINE void release_all_replies() { replies_.release(); }
  CARACAL_INLINE void publish_replies_after_fence() { replies_.publish_after_fence(); }
  // The largest request the channel carries (what send() refuses above).
  CARACAL_INLINE uint32_t max_message_bytes() const {
    return requests_.geometry().max_message_bytes;
  }

  // Sends `request` and waits for the reply with `token`, copying up to `out_capacity` bytes
  // of it to `out`. Returns when the reply is in, or the stop word is raised.
  CARACAL_INLINE CallResult call(uint64_t token, const void* request, uint32_t length, void* out,
                                 uint32_t out_capacity) {
    if (length > requests_.geometry().max_message_bytes) return {CallStatus::kTooLarge, 0};
    uint32_t spins = 0;
    while (!send(token, request, length)) {
      if (++spins % 4096 == 0 && region_.stop_requested()) return {CallStatus::kStopped, 0};
      mqueue::spin_pause(100);
    }
    flush();
    mqueue::Entry reply;
    for (;;) {
      const mqueue::PollResult r = replies_.next(reply);
      if (r == mqueue::PollResult::kReady) break;
      if (r == mqueue::PollResult::kCorrupt) return {CallStatus::kCorrupt, 0};
      if (++spins % 4096 == 0 && region_.stop_requested()) return {CallStatus::kStopped, 0};
      mqueue::spin_pause(100);
    }
    CallResult result{CallStatus::kOk, reply.length};
    const uint32_t n = reply.length < out_capacity ? reply.length : out_capacity;
    std::byte* dst = static_cast<std::byte*>(out);
    for (uint32_t i = 0; i < n; ++i)
      dst[i] = reply.payload[i];
    if (reply.token != token) {
      result.status = CallStatus::kTokenMismatch;
    } else if ((reply.flags & mqueue::kSlotError) != 0) {
      result.status = CallStatus::kRemoteError;
    } else if (n < reply.length) {
      result.status = CallStatus::kReplyTooLarge;
    }
    release_replies();
    return result;
  }

 private:
  mqueue::RegionView region_{};
  mqueue::RingProducer requests_{};
  mqueue::RingConsumer replies_{};
  uint32_t client_ = 0;
};

}  // namespace caracal::accel
