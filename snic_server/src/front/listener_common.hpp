// What every listener kind shares (private to snic_server): its counters, its name in logs and
// metrics, the flow a UDP peer is hashed to, the address it listens on, and the factory of
// each Asio kind (tcp.cpp, udp.cpp) that make_listener() calls.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/udp.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "caracal/core/status.hpp"
#include "config.hpp"
#include "dispatch.hpp"
#include "front/listeners.hpp"
#include "metrics/drops.hpp"
#include "metrics/metrics.hpp"

namespace caracal::server {

// A listener's host: an IP address, or localhost (taken as 127.0.0.1).
Result<boost::asio::ip::address> parse_address(const config::HostPort& hp);

// The Asio listener kinds. Throws std::invalid_argument for a configuration the kind cannot
// serve (a TCP framing that does not make a codec).
std::unique_ptr<Listener> make_tcp_listener(const ListenerConfig& config, const ListenerDeps& deps);
std::unique_ptr<Listener> make_udp_listener(const ListenerConfig& config, const ListenerDeps& deps);

// Counters of one listener.
struct ListenerStats {
  ListenerStats(Registry& registry, const std::string& service, const std::string& listener)
      : labels{{"service", service}, {"listener", listener}},
        requests(registry.counter("caracal_listener_requests_total",
                                  "Requests the listener received", labels)),
        replies(registry.counter("caracal_listener_replies_total",
                                 "Replies the listener sent (error replies included)", labels)),
        connections(registry.gauge("caracal_listener_connections",
                                   "Open TCP connections of the listener", labels)),
        drops(registry, "caracal_listener_drops_total",
              "Requests dropped by the listener, by reason", labels) {}

  void drop(DropReason reason) { drops.inc(reason); }

  Labels labels;
  Counter& requests;
  Counter& replies;
  Gauge& connections;
  DropCounters drops;
};

// "udp/0.0.0.0:7000", "tcp/127.0.0.1:0", "dpdk/192.0.2.2:7000".
inline std::string listener_name(const ListenerConfig& c) {
  if (c.kind == ListenerKind::kDpdk) return "dpdk/" + c.listen.str();
  return std::string(c.protocol == Protocol::kUdp ? "udp/" : "tcp/") + c.listen.str();
}

// A UDP peer's flow for flow_affinity: its address and port, hashed without formatting them
// (flow_key() spreads the hash's bits, which the multiplications leave in the high ones).
inline uint64_t flow_of(const boost::asio::ip::udp::endpoint& peer) {
  uint64_t h = peer.port();
  const auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001B3ULL; };
  if (peer.address().is_v4()) {
    mix(peer.address().to_v4().to_uint());
  } else {
    for (const unsigned char b : peer.address().to_v6().to_bytes())
      mix(b);
  }
  return flow_key(h);
}

}  // namespace caracal::server
