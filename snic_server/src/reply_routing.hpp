// Reply routing: where a reply goes. The server puts a reply address in the token of every
// request it writes into an RX ring, and the handler copies it to its response:
//
//   token = slot (20 bits) | generation (20 bits) | sequence (24 bits)
//
// A slot is a TCP connection or one UDP request in flight. A slot's generation changes every
// time it is released, so a reply that arrives after its connection closed (and the slot was
// given to another client) never matches: it is dropped and counted. The sequence orders the
// replies of one TCP connection.
//
// The mqueue manager routes each answer it takes from a TX ring (or makes for a failed request)
// through the ReplyTable to the ReplySink its slot is bound to: a TCP connection, a UDP
// listener, a DPDK port's queue.
#pragma once

#include <algorithm>
#include <array>
#include <boost/asio/ip/udp.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tunables.hpp"

namespace caracal::server {

inline constexpr uint32_t kTokenSlotBits = 20;
inline constexpr uint32_t kTokenGenerationBits = 20;
inline constexpr uint32_t kTokenSequenceBits = 24;
inline constexpr uint32_t kTokenSequenceMask = (1u << kTokenSequenceBits) - 1;
inline constexpr uint32_t kTokenGenerationMask = (1u << kTokenGenerationBits) - 1;
inline constexpr uint32_t kMaxReplySlots = 1u << kTokenSlotBits;

struct TokenParts {
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t sequence = 0;
};

constexpr uint64_t make_token(uint32_t slot, uint32_t generation, uint32_t sequence) {
  return (uint64_t{slot} << (kTokenGenerationBits + kTokenSequenceBits)) |
         (uint64_t{generation & kTokenGenerationMask} << kTokenSequenceBits) |
         (sequence & kTokenSequenceMask);
}
constexpr TokenParts split_token(uint64_t token) {
  return {static_cast<uint32_t>(token >> (kTokenGenerationBits + kTokenSequenceBits)),
          static_cast<uint32_t>(token >> kTokenSequenceBits) & kTokenGenerationMask,
          static_cast<uint32_t>(token) & kTokenSequenceMask};
}

// What comes back for one request.
struct Reply {
  enum class Kind : uint8_t {
    kData,     // the handler's response
    kNoReply,  // the handler answers nothing (kSlotNoReply)
    kError,    // the handler's error text, or the server's (agent lost, no agent, ...)
  };
  Kind kind = Kind::kData;
  std::string bytes;  // payload, or the error text
};

// What an engine thread hands a sink (ReplySink::deliver()): the bytes are the TX slot's, or an
// error text of the engine's, valid only until deliver() returns, so a sink copies what it keeps.
// The engine copies a reply nowhere itself; a UDP sink copies it once, into a datagram buffer it
// reuses from burst to burst.
struct ReplyView {
  Reply::Kind kind = Reply::Kind::kData;
  std::string_view bytes;
  // An owning copy, for a sink that keeps the reply past deliver().
  Reply owned() const { return Reply{kind, std::string(bytes)}; }
};

// Engine threads a server may run (EngineOptions::threads).
using tunables::kMaxEngineThreads;

static_assert(tunables::kReplySlots <= kMaxReplySlots, "a reply slot must fit in the token");

// A TCP connection, or a UDP listener for its requests. deliver() and end_burst() are called
// from engine threads only, and must not block. `thread` names the engine thread that calls;
// several may deliver to one sink at once, so whatever a sink holds between deliver() and
// end_burst() it keeps per engine thread: a lane each, as many as the engine has threads
// (given at construction, Engine::threads()).
//
// deliver() may hold the reply: an engine thread calls end_burst() on every sink it delivered to
// once it has finished a burst (the replies it read in one round, from every region it serves,
// or the failures of one command), so a sink can hand a whole burst over at once: one
// sendmmsg() for a UDP socket, one post to a TCP connection's strand, instead of one for every
// reply.
class ReplySink {
 public:
  explicit ReplySink(uint32_t engine_threads)
      : lanes_(engine_threads), awaiting_end_burst_(std::make_unique<bool[]>(engine_threads)) {}
  virtual ~ReplySink() = default;
  ReplySink(const ReplySink&) = delete;
  ReplySink& operator=(const ReplySink&) = delete;

  virtual void deliver(uint32_t thread, uint64_t token, const boost::asio::ip::udp::endpoint& peer,
                       ReplyView reply) = 0;
  virtual void end_burst(uint32_t /*thread*/) {}

  // Engine threads that may deliver to it: `thread` is below this.
  uint32_t lanes() const { return lanes_; }
  // Whether engine thread `thread` has this sink on its list for end_burst(). Element i is read
  // and written by engine thread i only (a byte each: no two threads write the same location).
  bool& awaiting_end_burst(uint32_t thread) { return awaiting_end_burst_[thread]; }

 private:
  const uint32_t lanes_;
  std::unique_ptr<bool[]> awaiting_end_burst_;
};

// The slots. acquire/release/route are thread-safe; each slot has its own lock, so the engine
// routing a reply never waits for unrelated connections.
//
// Free slots are kept in shards (thread_shard.hpp), each with its own lock and a fixed range of
// slots: a thread acquires from its own shard first, and a slot goes back to the shard that owns
// it. The I/O threads acquiring a slot for every UDP request, and the engine threads releasing
// them, therefore do not all take one lock.
class ReplyTable {
 public:
  explicit ReplyTable(uint32_t capacity);

  // A free slot bound to `sink` (and, for UDP, the peer to answer). The token base has
  // sequence 0. Empty when every slot is taken. A `one_shot` slot carries one reply (a UDP
  // request): route() releases it as it hands out the route, so nobody calls release() for it
  // after a route (release() before one, for a request that was never dispatched, is fine).
  std::optional<uint64_t> acquire(std::shared_ptr<ReplySink> sink,
                                  const boost::asio::ip::udp::endpoint& peer = {},
                                  bool one_shot = false);
  // Frees the slot of `token` if its generation still matches; later replies to it drop.
  void release(uint64_t token);

  // The sink and peer of a token whose slot is still bound to the same generation. A one-shot
  // slot is released by this call (the route takes over its reference to the sink).
  struct Route {
    std::shared_ptr<ReplySink> sink;
    boost::asio::ip::udp::endpoint peer;
  };
  std::optional<Route> route(uint64_t token);

  uint32_t capacity() const { return static_cast<uint32_t>(slots_.size()); }
  uint32_t in_use() const;

 private:
  struct Slot {
    std::mutex m;
    uint32_t generation = 0;
    bool bound = false;
    bool one_shot = false;
    std::shared_ptr<ReplySink> sink;
    boost::asio::ip::udp::endpoint peer;
  };
  // FIFO of the free slots of [first, first + size): a released slot is reused as late as
  // possible, so generations of one slot wrap only after every other slot of its shard has been
  // used 2^20 times.
  struct alignas(64) Shard {
    std::mutex m;
    uint32_t first = 0;
    std::vector<uint32_t> free;  // ring of `size` entries
    size_t head = 0;
    size_t count = 0;
  };
  Shard& owner(uint32_t slot) {
    return shards_[std::min<size_t>(slot / per_shard_, shard_count_ - 1)];
  }
  void put_free(uint32_t slot);  // takes the owner shard's lock

  std::vector<Slot> slots_;
  size_t shard_count_ = 1;
  uint32_t per_shard_ = 1;  // slots per shard; the last shard also takes the remainder
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace caracal::server
