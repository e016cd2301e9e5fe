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

#include "config.hpp"
#include "io_pool.hpp"
#include "metrics/metrics.hpp"
#include "mqueue_manager/engine.hpp"

namespace caracal::server {

class Destinations {
 public:
  // `engine_hosted`: the engine threads run in the I/O threads (snic_server's `engine_threads:
  // 0`), engine thread i in I/O thread i.
  Destinations(IoPool& io, const std::vector<DestinationConfig>& config, Engine& engine,
               Registry& metrics, bool engine_hosted);
  bool has(const std::string& name) const { return config_.count(name) != 0; }
  std::string names() const;
  // A link for one client queue; `inbox` is where the replies go (the client queue's RX), and
  // `engine_thread` the engine thread that serves the queue (Engine::thread_of), woken for each
  // reply. The connection lives on that engine thread's I/O thread when the engine is hosted
  // and `colocate` (the region's queues are dealt among the threads): a reply is then read,
  // put in the inbox and written to the RX ring by one thread, with no wake-up between. Else
  // the connections go to the I/O threads in turn: on one thread, every call's write, read and
  // reply of every client queue would be one serial stage.
  std::shared_ptr<ClientLink> make_link(const std::string& name, std::shared_ptr<QueueInbox> inbox,
                                        uint32_t engine_thread, bool colocate);

 private:
  IoPool& io_;
  std::map<std::string, DestinationConfig> config_;
  Engine& engine_;
  Registry& metrics_;
  bool engine_hosted_;
};

}  // namespace caracal::server
