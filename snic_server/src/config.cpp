#include "config.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <fstream>
#include <set>
#include <sstream>

#include "caracal/control/protocol.hpp"
#include "caracal/mqueue/layout.hpp"
#include "reply_routing.hpp"
#include "tunables.hpp"

namespace caracal::server {
namespace {

using config::Field;

ControlConfig parse_control(const Field& f) {
  f.allow_only({"listen", "secret", "secret_file", "heartbeat_interval_ms", "agent_timeout_ms",
                "rdma_connect_timeout_ms", "rdma_reconnect_max_ms", "rdma_ack_timeout",
                "rdma_retry_count", "auth_failures", "auth_window_ms", "auth_penalty_ms",
                "auth_penalty_max_ms", "auth_tracked_addresses", "max_region_bytes"});
  ControlConfig c;
  if (auto v = f.optional("listen")) c.listen = config::as_host_port(*v);
  c.secret = control::read_secret(f);
  if (c.secret == control::kExampleSecret && !is_loopback_host(c.listen.host)) {
    f.required(f.optional("secret") ? "secret" : "secret_file")
        .fail("the example secret on a control endpoint that is not loopback (" + c.listen.str() +
              "): anyone who has read the examples could register an agent; " +
              "give your own, in a secret_file");
  }
  if (auto v = f.optional("heartbeat_interval_ms")) {
    c.heartbeat_interval_ms = static_cast<uint32_t>(v->as_uint(1, 60'000));
  }
  if (auto v = f.optional("agent_timeout_ms")) {
    c.agent_timeout_ms = static_cast<uint32_t>(v->as_uint(1, 600'000));
  }
  if (auto v = f.optional("rdma_connect_timeout_ms")) {
    c.rdma_connect_timeout_ms = static_cast<uint32_t>(v->as_uint(10, 60'000));
  }
  if (auto v = f.optional("rdma_reconnect_max_ms")) {
    // Not below the first wait (tunables::kRdmaReconnectFirst), which it caps.
    c.rdma_reconnect_max_ms = static_cast<uint32_t>(
        v->as_uint(static_cast<uint64_t>(tunables::kRdmaReconnectFirst.count()), 600'000));
  }
  if (auto v = f.optional("rdma_ack_timeout")) {
    c.rdma_ack_timeout = static_cast<uint8_t>(v->as_uint(1, 31));
  }
  if (auto v = f.optional("rdma_retry_count")) {
    c.rdma_retry_count = static_cast<uint8_t>(v->as_uint(0, 7));
  }
  if (auto v = f.optional("auth_failures"))
    c.auth.failures = static_cast<uint32_t>(v->as_uint(0, 1000));
  if (auto v = f.optional("auth_window_ms")) {
    c.auth.window = std::chrono::milliseconds(v->as_uint(1, 86'400'000));
  }
  if (auto v = f.optional("auth_penalty_ms")) {
    c.auth.penalty = std::chrono::milliseconds(v->as_uint(1, 3'600'000));
  }
  if (auto v = f.optional("auth_penalty_max_ms")) {
    c.auth.max_penalty = std::chrono::milliseconds(v->as_uint(1, 3'600'000));
  }
  if (c.auth.max_penalty < c.auth.penalty) {
    f.required(f.optional("auth_penalty_max_ms") ? "auth_penalty_max_ms" : "auth_penalty_ms")
        .fail("auth_penalty_max_ms (" + std::to_string(c.auth.max_penalty.count()) +
              ") must be at least auth_penalty_ms (" + std::to_string(c.auth.penalty.count()) +
              ")");
  }
  if (auto v = f.optional("auth_tracked_addresses")) {
    c.auth.max_addresses = static_cast<uint32_t>(v->as_uint(1, 1'000'000));
  }
  if (auto v = f.optional("max_region_bytes")) {
    c.max_region_bytes = v->as_uint(mqueue::kPageBytes, uint64_t{1} << 40);
  }
  if (c.agent_timeout_ms <= c.heartbeat_interval_ms) {
    f.fail("agent_timeout_ms (" + std::to_string(c.agent_timeout_ms) +
           ") must exceed heartbeat_interval_ms (" + std::to_string(c.heartbeat_interval_ms) + ")");
  }
  return c;
}

constexpr const char* kNoDpdk =
    "this snic_server was built without DPDK (CARACAL_HAVE_DPDK is not set; install "
    "libdpdk-dev and rebuild)";

// The keys that bound a TCP listener's connections: their number, their timeouts, their unsent
// replies. Refused on UDP listeners, which have no connections.
void parse_tcp_connection_keys(const Field& f, ListenerConfig& l) {
  const auto tcp_only = [&](const char* key) -> std::optional<Field> {
    auto v = f.optional(key);
    if (v && l.protocol != Protocol::kTcp) {
      v->fail(std::string(key) + " applies to TCP listeners only (UDP has no connections)");
    }
    return v;
  };
  constexpr uint64_t kMaxConnections = 1u << 20;
  if (auto v = tcp_only("max_connections")) {
    l.max_connections = static_cast<uint32_t>(v->as_uint(1, kMaxConnections));
  }
  if (auto v = tcp_only("max_connections_per_address")) {
    l.max_connections_per_address = static_cast<uint32_t>(v->as_uint(0, kMaxConnections));
    if (l.max_connections_per_address > l.max_connections) {
      v->fail("max_connections_per_address (" + std::to_string(l.max_connections_per_address) +
              ") is above the listener's max_connections (" + std::to_string(l.max_connections) +
              "): it would never be reached");
    }
  }
  constexpr uint64_t kDayMs = 86'400'000;
  if (auto v = tcp_only("idle_timeout_ms")) {
    l.idle_timeout_ms = static_cast<uint32_t>(v->as_uint(0, kDayMs));
  }
  if (auto v = tcp_only("request_timeout_ms")) {
    l.request_timeout_ms = static_cast<uint32_t>(v->as_uint(0, kDayMs));
  }
  if (auto v = tcp_only("max_queued_reply_bytes")) {
    l.max_queued_reply_bytes = static_cast<uint32_t>(v->as_uint(1024, 1u << 30));
  }
  if (auto v = tcp_only("send_timeout_ms")) {
    l.send_timeout_ms = static_cast<uint32_t>(v->as_uint(0, kDayMs));
  }
}

ListenerConfig parse_listener(const Field& f, uint32_t max_message_bytes) {
  f.allow_only({"protocol", "kind", "listen", "framing", "error_reply", "max_pipeline",
                "socket_buffer_bytes", "max_connections", "max_connections_per_address",
                "idle_timeout_ms", "request_timeout_ms", "max_queued_reply_bytes",
                "send_timeout_ms", "spread"});
  ListenerConfig l;
  l.protocol = f.required("protocol")
                   .as_choice<Protocol>({{"udp", Protocol::kUdp}, {"tcp", Protocol::kTcp}});
  if (auto k = f.optional("kind")) {
    l.kind =
        k->as_choice<ListenerKind>({{"asio", ListenerKind::kAsio}, {"dpdk", ListenerKind::kDpdk}});
    if (l.kind == ListenerKind::kDpdk) {
      if (l.protocol != Protocol::kUdp) k->fail("the DPDK port serves UDP only");
      if (!dpdk_available()) {
        std::string why = "a dpdk listener cannot run: ";
        why += kNoDpdk;  // not operator+ on a temporary: GCC 12 warns there (-Warray-bounds)
        k->fail(why);
      }
    }
  }
  l.listen = config::as_host_port(f.required("listen"));
  if (l.kind == ListenerKind::kDpdk) {
    in_addr a{};
    if (inet_pton(AF_INET, l.listen.host.c_str(), &a) != 1) {
      f.required("listen").fail(
          "a dpdk listener listens on an IPv4 address (the dpdk section's "
          "ipv4, or 0.0.0.0), not '" +
          l.listen.host + "'");
    }
    if (l.listen.port == 0) {
      f.required("listen").fail("a dpdk listener needs a port other than 0 (no OS picks one)");
    }
  }
  if (auto e = f.optional("error_reply")) {
    l.error_reply = e->as_string();
    if (l.error_reply->find("{reason}") == std::string::npos) {
      e->fail("an error reply must contain {reason} (where the error text goes)");
    }
  }
  if (auto p = f.optional("max_pipeline")) {
    l.max_pipeline = static_cast<uint32_t>(p->as_uint(1, 1u << 20));
  }
  if (auto b = f.optional("socket_buffer_bytes")) {
    if (l.protocol != Protocol::kUdp || l.kind != ListenerKind::kAsio) {
      b->fail(
          "socket_buffer_bytes sizes the sockets of an Asio UDP listener (TCP sizes its own "
          "buffers; a dpdk listener has no socket)");
    }
    l.socket_buffer_bytes = static_cast<uint32_t>(b->as_uint(4096, 1u << 30));
    l.socket_buffer_set = true;
  }
  if (auto v = f.optional("spread")) {
    if (l.protocol != Protocol::kUdp || l.kind != ListenerKind::kAsio) {
      v->fail(
          "spread deals datagrams among the sockets of an Asio UDP listener (TCP deals "
          "connections among the I/O threads; a dpdk listener has its own workers)");
    }
    l.spread =
        v->as_choice<ListenerConfig::Spread>({{"flows", ListenerConfig::Spread::kFlows},
                                              {"datagrams", ListenerConfig::Spread::kDatagrams}});
  }
  parse_tcp_connection_keys(f, l);
  const auto framing = f.optional("framing");
  if (l.protocol == Protocol::kUdp) {
    if (framing) framing->fail("UDP listeners take no framing: one datagram is one message");
  } else {
    if (!framing) f.fail("missing required setting 'framing' for a TCP listener");
    l.framing = parse_framing(*framing, max_message_bytes);
  }
  return l;
}

ServiceConfig parse_service(const Field& f) {
  f.allow_only({"name", "max_message_bytes", "dispatch", "listeners", "reply_timeout_ms",
                "eject_after_timeouts", "eject_ms", "eject_max_ms"});
  ServiceConfig s;
  s.name = f.required("name").as_string();
  if (s.name.empty()) f.required("name").fail("service name is empty");
  s.max_message_bytes =
      static_cast<uint32_t>(f.required("max_message_bytes").as_uint(1, 64u << 20));
  if (auto d = f.optional("dispatch")) {
    s.dispatch = d->as_choice<DispatchPolicy>({{"round_robin", DispatchPolicy::kRoundRobin},
                                               {"least_loaded", DispatchPolicy::kLeastLoaded},
                                               {"flow_affinity", DispatchPolicy::kFlowAffinity}});
  }
  constexpr uint64_t kDayMs = 86'400'000;
  if (auto v = f.optional("reply_timeout_ms")) {
    s.reply_timeout_ms = static_cast<uint32_t>(v->as_uint(0, kDayMs));
  }
  if (auto v = f.optional("eject_after_timeouts")) {
    s.eject_after_timeouts = static_cast<uint32_t>(v->as_uint(0, 1'000'000));
  }
  if (auto v = f.optional("eject_ms")) s.eject_ms = static_cast<uint32_t>(v->as_uint(1, kDayMs));
  if (auto v = f.optional("eject_max_ms")) {
    s.eject_max_ms = static_cast<uint32_t>(v->as_uint(1, kDayMs));
  } else {
    s.eject_max_ms = std::max(s.eject_max_ms, s.eject_ms);  // the default never caps below it
  }
  if (s.eject_max_ms < s.eject_ms) {
    f.required("eject_max_ms")
        .fail("eject_max_ms (" + std::to_string(s.eject_max_ms) + ") is below eject_ms (" +
              std::to_string(s.eject_ms) + "), the first ejection's length");
  }
  const std::vector<Field> listeners = f.required("listeners").items();
  if (listeners.empty()) f.required("listeners").fail("a service needs at least one listener");
  for (const Field& l : listeners)
    s.listeners.push_back(parse_listener(l, s.max_message_bytes));
  return s;
}

DpdkConfig parse_dpdk(const Field& f) {
  if (!dpdk_available()) f.fail(kNoDpdk);
  f.allow_only({"eal_args", "port", "ipv4", "queues", "burst", "rx_descriptors", "tx_descriptors",
                "mbufs", "mbuf_cache", "checksum_offload", "idle_sleep_us"});
  DpdkConfig d;
  if (auto a = f.optional("eal_args")) {
    for (const Field& arg : a->items())
      d.eal_args.push_back(arg.as_string());
  }
  if (auto p = f.optional("port")) {
    d.port = p->as_string();
    if (d.port.empty()) p->fail("the port name is empty");
  }
  const Field ip = f.required("ipv4");
  d.ipv4 = ip.as_string();
  in_addr a{};
  if (inet_pton(AF_INET, d.ipv4.c_str(), &a) != 1)
    ip.fail("'" + d.ipv4 + "' is not an IPv4 address");
  const uint32_t host_order = ntohl(a.s_addr);
  if (host_order == 0 || host_order == 0xFFFFFFFFu || (host_order >> 28) == 0xE) {
    ip.fail("'" + d.ipv4 + "' cannot be a port's address (unspecified, broadcast or multicast)");
  }
  d.ipv4_be = a.s_addr;
  if (auto v = f.optional("queues")) d.queues = static_cast<uint16_t>(v->as_uint(1, 128));
  if (auto v = f.optional("burst")) d.burst = static_cast<uint16_t>(v->as_uint(1, 512));
  if (auto v = f.optional("rx_descriptors")) {
    d.rx_descriptors = static_cast<uint16_t>(v->as_uint(32, 32768));
  }
  if (auto v = f.optional("tx_descriptors")) {
    d.tx_descriptors = static_cast<uint16_t>(v->as_uint(32, 32768));
  }
  if (auto v = f.optional("mbufs")) d.mbufs = static_cast<uint32_t>(v->as_uint(63, 1u << 24));
  if (auto v = f.optional("mbuf_cache")) d.mbuf_cache = static_cast<uint32_t>(v->as_uint(0, 512));
  if (auto v = f.optional("checksum_offload")) d.checksum_offload = v->as_bool();
  if (auto v = f.optional("idle_sleep_us")) {
    d.idle_sleep_us = static_cast<uint32_t>(v->as_uint(0, 100'000));
  }
  // Every RX descriptor may hold an mbuf, and each worker keeps a burst in hand and a cache.
  const uint64_t need =
      uint64_t{d.queues} * (d.rx_descriptors + d.tx_descriptors + d.burst * 2u + d.mbuf_cache);
  if (d.mbufs < need) {
    f.fail("mbufs (" + std::to_string(d.mbufs) + ") must be at least " + std::to_string(need) +
           ": queues x (rx_descriptors + tx_descriptors + 2 x burst + mbuf_cache)");
  }
  if (d.mbuf_cache * 3ull > d.mbufs * 2ull) {
    f.fail("mbuf_cache (" + std::to_string(d.mbuf_cache) +
           ") must be at most mbufs / 1.5 (a DPDK mempool rule)");
  }
  return d;
}

DestinationConfig parse_destination(const Field& f) {
  f.allow_only({"name", "connect", "framing", "max_message_bytes", "timeout_ms"});
  DestinationConfig d;
  d.name = f.required("name").as_string();
  d.connect = config::as_host_port(f.required("connect"));
  uint32_t max = 1u << 20;
  if (auto m = f.optional("max_message_bytes")) {
    max = static_cast<uint32_t>(m->as_uint(1, 64u << 20));
  }
  d.framing = parse_framing(f.required("framing"), max);
  if (auto t = f.optional("timeout_ms"))
    d.timeout_ms = static_cast<uint32_t>(t->as_uint(0, 600000));
  return d;
}

}  // namespace

FramingConfig parse_framing(const Field& f, uint32_t max_message_bytes) {
  f.allow_only({"kind", "size", "prefix_bytes", "byte_order", "prefix_counts_itself", "delimiter"});
  FramingConfig c;
  c.max_message_bytes = max_message_bytes;
  c.kind =
      f.required("kind").as_choice<FramingKind>({{"fixed", FramingKind::kFixed},
                                                 {"length_prefixed", FramingKind::kLengthPrefixed},
                                                 {"line", FramingKind::kLine},
                                                 {"memcached", FramingKind::kMemcached}});
  const auto size = f.optional("size");
  const auto prefix = f.optional("prefix_bytes");
  const auto order = f.optional("byte_order");
  const auto counts = f.optional("prefix_counts_itself");
  const auto delimiter = f.optional("delimiter");
  const auto only_for = [](const std::optional<Field>& field, const char* kind) {
    if (field) field->fail(std::string("only applies to framing kind '") + kind + "'");
  };
  switch (c.kind) {
    case FramingKind::kFixed:
      if (!size) f.fail("missing required setting 'size' for fixed framing");
      c.fixed_bytes = static_cast<uint32_t>(size->as_uint(1, max_message_bytes));
      only_for(prefix, "length_prefixed");
      only_for(order, "length_prefixed");
      only_for(counts, "length_prefixed");
      only_for(delimiter, "line");
      break;
    case FramingKind::kLengthPrefixed:
      if (prefix) {
        c.prefix_bytes = static_cast<uint32_t>(prefix->as_uint(1, 8));
        if (c.prefix_bytes != 1 && c.prefix_bytes != 2 && c.prefix_bytes != 4 &&
            c.prefix_bytes != 8) {
          prefix->fail("prefix_bytes must be 1, 2, 4 or 8");
        }
      }
      if (order) {
        c.byte_order =
            order->as_choice<ByteOrder>({{"big", ByteOrder::kBig}, {"little", ByteOrder::kLittle}});
      }
      if (counts) c.prefix_counts_itself = counts->as_bool();
      only_for(size, "fixed");
      only_for(delimiter, "line");
      break;
    case FramingKind::kLine:
      if (delimiter) {
        c.delimiter = delimiter->as_string();
        if (c.delimiter.empty()) delimiter->fail("the line delimiter is empty");
      }
      only_for(size, "fixed");
      only_for(prefix, "length_prefixed");
      only_for(order, "length_prefixed");
      only_for(counts, "length_prefixed");
      break;
    case FramingKind::kMemcached:
      only_for(size, "fixed");
      only_for(prefix, "length_prefixed");
      only_for(order, "length_prefixed");
      only_for(counts, "length_prefixed");
      only_for(delimiter, "line");
      break;
  }
  if (Result<Codec> codec = Codec::make(c); !codec.ok()) f.fail(codec.status().message());
  return c;
}

ServerConfig parse_server_config(const Field& root) {
  root.allow_only({"io_threads", "engine_threads", "log_level", "control", "metrics", "services",
                   "destinations", "dpdk"});
  ServerConfig c;
  if (auto v = root.optional("io_threads"))
    c.io_threads = static_cast<uint32_t>(v->as_uint(1, tunables::kMaxIoThreads));
  // Without the key: the engine in the I/O threads, whatever their number. It takes fewer cores
  // and less latency than engine threads of their own, for less small-message throughput over
  // TCP (bench/results/EXPERIMENTS.md, engine-default-h200); and a few engine threads of their
  // own behind many I/O threads are the stage every request waits for
  // (bench/results/EXPERIMENTS.md, io-threads-h100x2).
  c.engine_threads = 0;
  if (auto v = root.optional("engine_threads"))
    c.engine_threads = static_cast<uint32_t>(v->as_uint(0, tunables::kMaxEngineThreads));
  if (auto v = root.optional("log_level")) {
    c.log_level = v->as_string();
    static const std::set<std::string> levels{"trace", "debug", "info", "warn", "error", "off"};
    if (!levels.contains(c.log_level)) {
      v->fail("'" + c.log_level + "' is not one of: trace, debug, info, warn, error, off");
    }
  }
  c.control = parse_control(root.required("control"));
  if (auto m = root.optional("metrics")) {
    m->allow_only({"listen"});
    c.metrics_listen = kDefaultMetricsListen;
    if (auto l = m->optional("listen")) c.metrics_listen = config::as_host_port(*l);
  }
  const std::vector<Field> services = root.required("services").items();
  if (services.empty()) root.required("services").fail("at least one service is required");
  std::set<std::string> names;
  for (const Field& s : services) {
    c.services.push_back(parse_service(s));
    if (!names.insert(c.services.back().name).second) {
      s.required("name").fail("duplicate service name '" + c.services.back().name + "'");
    }
  }
  if (auto dests = root.optional("destinations")) {
    std::set<std::string> dnames;
    for (const Field& d : dests->items()) {
      c.destinations.push_back(parse_destination(d));
      if (!dnames.insert(c.destinations.back().name).second) {
        d.required("name").fail("duplicate destination name '" + c.destinations.back().name + "'");
      }
    }
  }
  if (auto d = root.optional("dpdk")) c.dpdk = parse_dpdk(*d);
  // Two listeners on one address and protocol would fight over the port. DPDK listeners share
  // the port's one address, so among them the UDP port alone must differ; they do not clash
  // with the kernel's sockets.
  std::set<std::pair<int, std::string>> bound;
  std::set<uint16_t> dpdk_ports;
  bool any_dpdk = false;
  for (size_t i = 0; i < c.services.size(); ++i) {
    for (size_t j = 0; j < c.services[i].listeners.size(); ++j) {
      const ListenerConfig& l = c.services[i].listeners[j];
      const Field lf = services[i].required("listeners").items()[j];
      if (l.kind == ListenerKind::kDpdk) {
        any_dpdk = true;
        if (!c.dpdk) lf.required("kind").fail("a dpdk listener needs the top-level 'dpdk' section");
        if (l.listen.host != "0.0.0.0" && l.listen.host != c.dpdk->ipv4) {
          lf.required("listen").fail("a dpdk listener listens on the dpdk port's address " +
                                     c.dpdk->ipv4 + " (or 0.0.0.0), not " + l.listen.host);
        }
        if (!dpdk_ports.insert(l.listen.port).second) {
          lf.required("listen").fail("UDP port " + std::to_string(l.listen.port) +
                                     " is already used by another dpdk listener");
        }
        continue;
      }
      if (l.listen.port != 0 &&
          !bound.insert({static_cast<int>(l.protocol), l.listen.str()}).second) {
        lf.required("listen").fail("address " + l.listen.str() +
                                   " is already used by another listener");
      }
    }
  }
  if (c.dpdk && !any_dpdk) root.required("dpdk").fail("no listener has kind: dpdk");
  return c;
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(host, ec);
  return !ec && address.is_loopback();
}

bool dpdk_available() {
#ifdef CARACAL_HAVE_DPDK
  return true;
#else
  return false;
#endif
}

ServerConfig load_server_config(const std::string& path) {
  return parse_server_config(config::load_yaml_file(path));
}

}  // namespace caracal::server
