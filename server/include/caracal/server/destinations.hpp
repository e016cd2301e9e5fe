// The other end of client queues: servers (memcached, say) that handlers call through the
// SmartNIC. Each client queue of a region gets its own TCP connection to its destination,
// opened on first use and again after a failure; requests leave in ring order and replies
// come back in the same order (the destination's protocol answers in order), so each reply
// is matched to the token of the oldest request waiting. A failed connection answers every
// request waiting on it with an error entry (kSlotError), which the handler sees as
// CallStatus::kRemoteError.
#pragma once

#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <string>

#include "caracal/server/config.hpp"
#include "caracal/server/io_pool.hpp"
#include "caracal/server/metrics/metrics.hpp"
#include "caracal/server/mqueue_manager/engine.hpp"

namespace caracal::server {

class Destinations {
 public:
  // Links are spread over the pool's I/O threads, a connection each in turn: on one thread,
  // every call's write, read and reply of every client queue is one serial stage.
  Destinations(IoPool& io, const std::vector<DestinationConfig>& config, Engine& engine,
               Registry& metrics);

  bool has(const std::string& name) const { return config_.count(name) != 0; }
  std::string names() const;
  // A link for one client queue; `inbox` is where the replies go (the client queue's RX).
  std::shared_ptr<ClientLink> make_link(const std::string& name, std::shared_ptr<QueueInbox> inbox);

 private:
  IoPool& io_;
  std::map<std::string, DestinationConfig> config_;
  Engine& engine_;
  Registry& metrics_;
};

}  // namespace caracal::server
