// Where agents register (control/protocol.hpp has the messages). Each agent connection is a
// session: hello with the shared secret (compared in constant time), then one region per
// service, each validated before the server touches it, then heartbeats. A session whose
// connection closes or whose heartbeats stop is lost: its regions leave dispatch and their
// requests in flight fail visibly. A later hello with the same agent name and a new epoch
// replaces a registration that is still there (the agent restarted before we noticed).
//
// Every refusal is counted by its reason (caracal_control_refusals_total{reason}). The refusals
// before a successful hello (a wrong secret, a malformed or unexpected first frame, another
// protocol version) are failures of the peer's address (AuthThrottle): after
// control.auth_failures of them its connections are refused unread, with a retry_after_ms, for
// a penalty that doubles with each failure after it. That costs other addresses nothing: a
// refusal is a lookup under the endpoint's lock, and no thread ever waits out a penalty.
//
// transport rdma: connecting to the agent's exporter and attaching block (up to the
// control.rdma_connect_timeout_ms of the config, per step), so they run on the endpoint's own
// connect thread, one at a time, and the result is posted back to the session. When an rdma
// region's transport fails (the engine drops it and fails its requests in flight) while its
// agent is still registered, the session reconnects with backoff (tunables::kRdmaReconnectFirst
// doubling up to control.rdma_reconnect_max_ms) and re-admits the region once connect and attach
// succeed.
#pragma once

#include <array>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "auth_throttle.hpp"
#include "caracal/core/status.hpp"
#include "config.hpp"
#include "destinations.hpp"
#include "dispatch.hpp"
#include "metrics/metrics.hpp"
#include "mqueue_manager/engine.hpp"

namespace caracal::server {

class ControlSession;
class BlockingWorker;

// Why the control endpoint refused a hello, a region or a session: the `reason` label of
// caracal_control_refusals_total.
enum class Refusal : uint8_t {
  kWrongSecret,
  kMalformed,          // a frame that does not decode
  kProtocolVersion,    // a hello of a protocol version this server does not speak
  kNotHello,           // a first message other than hello
  kDuplicateAgent,     // the name and epoch of a live registration
  kReplaced,           // a live registration, replaced by one of its name with a new epoch
  kUnexpectedMessage,  // after hello, a message an agent does not send
  kUnknownService,
  kAlreadyServed,       // this agent already serves the service
  kRdmaUnavailable,     // transport rdma on a server built without it
  kUnknownDestination,  // a destination not in the config
  kRegionSize,          // region_bytes below a header page or over control.max_region_bytes
  kRegionUnreachable,   // the shm object did not open, the rdma exporter did not answer
  kBadRegion,           // size or header refused (validate_region)
  kEpochMismatch,       // the header's epoch is not the hello's
  kClientQueues,        // client queues and destinations differ in number
  kServiceRefused,      // the service refused the region (its messages are too small)
  kCount,
};
const char* refusal_name(Refusal r);

class ControlEndpoint {
 public:
  ControlEndpoint(boost::asio::io_context& io, const ServerConfig& config, Engine& engine,
                  std::map<std::string, Service*> services, Destinations& destinations,
                  Registry& metrics);
  ~ControlEndpoint();

  Status listen();
  uint16_t port() const { return port_; }
  // Stops accepting and drops every session (their regions are failed).
  void stop();

  size_t agent_count() const;

 private:
  friend class ControlSession;
  void accept();
  // Registers `session` as the live one for its agent name; the previous one is lost.
  std::shared_ptr<ControlSession> take_name(const std::string& agent,
                                            const std::shared_ptr<ControlSession>& session);
  void forget(const std::string& agent, const ControlSession* session);
  void publish_agent_count_locked();  // caller holds m_
  void count(Refusal r) { refusals_[static_cast<size_t>(r)]->inc(); }
  // AuthThrottle under m_, with its logging and counting.
  AuthThrottle::Check throttle_check(const boost::asio::ip::address& peer);
  void throttle_fail(const boost::asio::ip::address& peer, Refusal why);
  void throttle_succeed(const boost::asio::ip::address& peer);

  boost::asio::io_context& io_;
  const ServerConfig& config_;
  Engine& engine_;
  std::map<std::string, Service*> services_;
  Destinations& destinations_;
  Registry& metrics_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  Gauge& agents_gauge_;
  Counter& rdma_reconnects_;
  Counter& rdma_reconnect_failures_;
  std::array<Counter*, static_cast<size_t>(Refusal::kCount)> refusals_{};
  Counter& throttled_;
  Counter& penalties_;
  Gauge& throttle_tracked_;
  std::unique_ptr<BlockingWorker> worker_;  // rdma connects

  mutable std::mutex m_;
  std::map<std::string, std::weak_ptr<ControlSession>> agents_;
  std::vector<std::weak_ptr<ControlSession>> sessions_;
  AuthThrottle throttle_;  // under m_
};

}  // namespace caracal::server
