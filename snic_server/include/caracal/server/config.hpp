// snic_server's configuration: what `snic_server --config FILE` reads. Parsing validates
// every setting and reports the first bad one with its file, line and column.
//
//   io_threads: 2                  # Asio I/O threads (default: 2)
//   log_level: info                # trace, debug, info, warn, error
//   control:                       # where agents register
//     listen: 127.0.0.1:7100
//     secret_file: /etc/caracal/secret   # or `secret: TEXT`; one of the two is required
//     heartbeat_interval_ms: 100
//     agent_timeout_ms: 1000
//     rdma_connect_timeout_ms: 2000    # connecting to an rdma agent's region (see below)
//     rdma_reconnect_max_ms: 5000      # longest wait between reconnects to an rdma region
//   metrics:                       # optional Prometheus endpoint
//     listen: 127.0.0.1:9100
//   services:
//     - name: echo
//       max_message_bytes: 1024
//       dispatch: round_robin      # round_robin, least_loaded, flow_affinity
//       listeners:
//         - { protocol: udp, listen: 0.0.0.0:7000 }
//         - protocol: tcp
//           listen: 0.0.0.0:7001
//           framing: { kind: length_prefixed, prefix_bytes: 4, byte_order: big }
//           error_reply: "ERROR {reason}"   # optional, see ListenerConfig
//           max_pipeline: 4096              # optional
//   destinations:                  # what client queues call
//     - name: memcached
//       connect: 127.0.0.1:11211
//       framing: { kind: memcached }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "caracal/config/yaml.hpp"
#include "caracal/server/framing.hpp"

namespace caracal::server {

enum class Protocol : uint8_t { kUdp, kTcp };
enum class DispatchPolicy : uint8_t { kRoundRobin, kLeastLoaded, kFlowAffinity };

struct ListenerConfig {
  Protocol protocol = Protocol::kUdp;
  config::HostPort listen;
  FramingConfig framing;  // TCP only
  // What a client gets when its request fails (handler error, lost agent, no agent, oversize):
  // this text with {reason} replaced, framed like any reply. Without it, a TCP connection
  // sends the replies before the failed request and closes; UDP drops the request, counted.
  std::optional<std::string> error_reply;
  // TCP: requests of one connection read and not yet answered before it stops reading.
  uint32_t max_pipeline = 4096;
};

struct ServiceConfig {
  std::string name;
  uint32_t max_message_bytes = 0;
  DispatchPolicy dispatch = DispatchPolicy::kRoundRobin;
  std::vector<ListenerConfig> listeners;
};

struct DestinationConfig {
  std::string name;
  config::HostPort connect;
  FramingConfig framing;
};

struct ControlConfig {
  config::HostPort listen;
  std::string secret;
  uint32_t heartbeat_interval_ms = 100;
  uint32_t agent_timeout_ms = 1000;
  // transport rdma: how long connecting to an agent's exporter may take (rdma_cm resolution
  // and handshake; attach's header READs get as long again each). Connects run on a thread of
  // the control endpoint's own, never on an I/O thread.
  uint32_t rdma_connect_timeout_ms = 2000;
  // After an rdma region's transport fails while its agent stays registered, the server
  // reconnects after 100 ms, doubling the wait after each failed try up to this.
  uint32_t rdma_reconnect_max_ms = 5000;
};

struct ServerConfig {
  uint32_t io_threads = 2;
  std::string log_level = "info";
  ControlConfig control;
  std::optional<config::HostPort> metrics_listen;
  std::vector<ServiceConfig> services;
  std::vector<DestinationConfig> destinations;
};

// Throws config::ConfigError naming the file, line, column and setting.
ServerConfig load_server_config(const std::string& path);
ServerConfig parse_server_config(const config::Field& root);

// A `framing:` mapping; `max_message_bytes` comes from the enclosing service or destination.
FramingConfig parse_framing(const config::Field& f, uint32_t max_message_bytes);

}  // namespace caracal::server
