// The network front: listeners take requests from clients, hand them to their service's
// dispatch (dispatch.hpp), and send the replies that reply routing brings back to them
// (reply_routing.hpp: each listener, or TCP connection, is a ReplySink). make_listener() makes
// the kind a ListenerConfig asks for: tcp.cpp, udp.cpp, or the DPDK port's (dpdk_port.hpp).
//
// I/O threads: each runs its own io_context (io_pool.hpp), so that a socket's completions run on
// the thread that waited for them, with no hand-off between threads per datagram.
//
// UDP: one datagram is one message; the reply goes to the sender's address from the same
// port. With several I/O threads the listener opens one socket per thread on the same port
// (SO_REUSEPORT), so the kernel spreads datagrams over them; socket i is served by thread i.
// Once a receive completes, the socket's thread takes what else has queued up with recvmmsg(). A
// datagram longer than the service's max_message_bytes, or one that finds every queue congested, is
// dropped and counted.
//
// TCP: per-listener framing (framing.hpp). Each connection keeps its requests in order: it
// numbers them, and replies (which may come back out of order from different queues) leave in
// that order. Accepted connections go to the I/O threads in turn; one past the listener's
// max_connections or max_connections_per_address is closed at accept. A connection stops reading
// when it has max_pipeline requests unanswered, when max_queued_reply_bytes of its replies are
// unsent, or when the service's queues are congested (backpressure), and resumes when there is
// room again. Malformed or oversize input closes that connection, with the reason logged (after
// an error reply if the listener has error_reply); so do a request that takes longer than
// request_timeout_ms, replies the client leaves untaken for send_timeout_ms, and
// idle_timeout_ms with nothing asked.
//
// DPDK (`kind: dpdk`, dpdk_port.hpp): UDP on the server's DPDK port, with the same dispatch,
// replies, counters and drop reasons as the Asio UDP listener.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "caracal/core/status.hpp"
#include "config.hpp"
#include "io_pool.hpp"
#include "metrics/metrics.hpp"
#include "reply_routing.hpp"

namespace caracal::server {

class Service;
class DpdkPort;
class MemoryTrim;

class Listener {
 public:
  virtual ~Listener() = default;
  // Binds and starts serving; the error names the address.
  virtual Status start() = 0;
  // Stops taking new connections and datagrams; connections finish the requests they have.
  virtual void stop() = 0;
  // Closes every connection now.
  virtual void close_all() = 0;
  virtual uint16_t port() const = 0;
  virtual const std::string& name() const = 0;
};

struct ListenerDeps {
  IoPool& io;
  Service& service;
  ReplyTable& replies;
  Registry& metrics;
  DpdkPort* dpdk = nullptr;  // the server's DPDK port, for `kind: dpdk` listeners
  // The engine runs in the I/O threads (engine_threads: 0): an engine thread that sends a burst
  // itself is an I/O thread already, so a UDP listener never hands a burst to another one.
  bool engine_hosted = false;
  // The engine's threads (Engine::threads()): every reply sink has a lane for each.
  uint32_t engine_threads = 1;
  // Told of every TCP connection that closes, to give their memory back (may be null).
  MemoryTrim* memory_trim = nullptr;
};

std::unique_ptr<Listener> make_listener(const ListenerConfig& config, const ListenerDeps& deps);

// Opens, binds (SO_REUSEADDR) and listens on `at` (an IP address or localhost). Returns the
// bound port (port 0 asks the OS for one); the error names `what` and the address.
Result<uint16_t> listen_tcp(boost::asio::ip::tcp::acceptor& acceptor, const config::HostPort& at,
                            const std::string& what);

// The error text a listener sends for a failed request, or nothing if it sends none.
std::optional<std::string> format_error_reply(const ListenerConfig& config,
                                              std::string_view reason);

}  // namespace caracal::server
