// snic_server's configuration: what `snic_server --config FILE` reads. Parsing validates
// every setting and reports the first bad one with its file, line and column.
//
//   io_threads: 2                  # Asio I/O threads (default: 2), 1-256
//   engine_threads: 0              # mqueue engine threads, 0-256. 0 (the default): no engine
//                                  # threads of their own; each I/O thread runs one between its
//                                  # socket handlers, and under load keeps what it reads on its
//                                  # own queues. 1-256: threads of their own. Either way an
//                                  # shm region's server queues are dealt among the engine
//                                  # threads, one after another from where the last region's
//                                  # ended; rdma regions and client queues stay on the first.
//                                  # Each thread polls a core while it has work.
//   log_level: info                # trace, debug, info, warn, error
//   control:                       # where agents register
//     listen: 127.0.0.1:7100       # the default: loopback only
//     secret_file: /etc/caracal/secret   # or `secret: TEXT`; one of the two is required
//     heartbeat_interval_ms: 100
//     agent_timeout_ms: 1000
//     auth_failures: 5                 # failed hellos from one address (0: no throttling)
//     auth_window_ms: 60000            #   before a penalty, no gap this long between them
//     auth_penalty_ms: 1000            # the first penalty, doubling per failure after it
//     auth_penalty_max_ms: 60000       #   up to this
//     auth_tracked_addresses: 4096     # addresses whose failures are remembered
//     max_region_bytes: 4294967296     # the largest region an agent may register
//     rdma_connect_timeout_ms: 2000    # connecting to an rdma agent's region (see below)
//     rdma_reconnect_max_ms: 5000      # longest wait between reconnects to an rdma region
//     rdma_ack_timeout: 18             # queue pairs to rdma regions: ACK timeout 4.096 us * 2^n
//     rdma_retry_count: 6              # and retries before a lost agent fails the queue pair
//   metrics:                       # optional Prometheus endpoint
//     listen: 127.0.0.1:9100       # the default: loopback only
//   services:
//     - name: echo
//       max_message_bytes: 1024
//       dispatch: round_robin      # round_robin, least_loaded, flow_affinity
//       reply_timeout_ms: 10000    # a request unanswered this long gets an error reply; 0: none
//       eject_after_timeouts: 3    # timeouts in a row on one queue that eject its agent; 0: never
//       eject_ms: 5000             # an ejection's length, doubled when repeated,
//       eject_max_ms: 60000        # up to this
//       listeners:
//         - { protocol: udp, listen: 0.0.0.0:7000 }
//         - { protocol: udp, kind: dpdk, listen: 192.0.2.2:7000 }
//         - protocol: tcp
//           listen: 0.0.0.0:7001
//           framing: { kind: length_prefixed, prefix_bytes: 4, byte_order: big }
//           error_reply: "ERROR {reason}"   # optional, see ListenerConfig
//           max_pipeline: 4096              # optional, and the keys below (TCP only)
//           max_connections: 16384          # open at once on this listener
//           max_connections_per_address: 0  # from one client address; 0: no limit
//           idle_timeout_ms: 300000         # nothing in flight and no request: closed
//           request_timeout_ms: 30000       # from a request's first byte to its last
//           max_queued_reply_bytes: 1048576 # unsent replies past which reading stops
//           send_timeout_ms: 60000          # replies not taken by the client: closed
//         - { protocol: udp, listen: 0.0.0.0:7002, socket_buffer_bytes: 8388608 }  # optional
//   dpdk:                          # optional: the DPDK port that `kind: dpdk` listeners use
//     eal_args: [--no-huge, -m, "256", "--vdev=net_af_packet0,iface=veth0", -l, "0-1"]
//     port: net_af_packet0         # the ethdev's name; default: the only port there is
//     ipv4: 192.0.2.2              # the port's address (it answers ARP for it)
//     queues: 1                    # RX/TX queue pairs, one worker lcore each
//   destinations:                  # what client queues call
//     - name: memcached
//       connect: 127.0.0.1:11211
//       framing: { kind: memcached }
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "auth_throttle.hpp"
#include "caracal/config/yaml.hpp"
#include "framing.hpp"

namespace caracal::server {

enum class Protocol : uint8_t { kUdp, kTcp };
enum class DispatchPolicy : uint8_t { kRoundRobin, kLeastLoaded, kFlowAffinity };
// Which network stack a listener uses: the kernel's through Boost.Asio, or the server's DPDK
// port (UDP only; see DpdkConfig).
enum class ListenerKind : uint8_t { kAsio, kDpdk };

struct ListenerConfig {
  Protocol protocol = Protocol::kUdp;
  ListenerKind kind = ListenerKind::kAsio;
  config::HostPort listen;
  FramingConfig framing;  // TCP only
  // What a client gets when its request fails (handler error, lost agent, no agent, oversize):
  // this text with {reason} replaced, framed like any reply. Without it, a TCP connection
  // sends the replies before the failed request and closes; UDP drops the request, counted.
  std::optional<std::string> error_reply;
  // TCP: requests of one connection read and not yet answered before it stops reading.
  uint32_t max_pipeline = 4096;
  // TCP: connections open at once on this listener, and from one client address (0: no limit
  // per address). A connection past either is closed as it is accepted, logged and counted.
  static constexpr uint32_t kDefaultMaxConnections = 16384;
  uint32_t max_connections = kDefaultMaxConnections;
  uint32_t max_connections_per_address = 0;
  // TCP: a connection with nothing in flight that sends no complete request for this long is
  // closed (0: never).
  uint32_t idle_timeout_ms = 300'000;
  // TCP: a request must be whole within this long of its first byte, or the connection closes
  // (after an error reply, with error_reply). 0: no limit.
  uint32_t request_timeout_ms = 30'000;
  // TCP: replies framed and not yet taken by the kernel, per connection, from which the
  // connection stops reading until they drain below it.
  uint32_t max_queued_reply_bytes = 1u << 20;
  // TCP: a connection whose replies make no progress into the kernel for this long is closed
  // (the client reads nothing). 0: no limit.
  uint32_t send_timeout_ms = 60'000;
  // UDP (Asio): SO_RCVBUF and SO_SNDBUF asked for on each socket. The kernel caps them at
  // net.core.rmem_max and wmem_max; a value set here that the kernel cuts is logged as a warning.
  // The Linux default (about 208 KiB) holds only a dozen 16 KiB datagrams, so a burst of large
  // requests or replies would be dropped by the kernel.
  static constexpr uint32_t kDefaultSocketBufferBytes = 4u << 20;
  uint32_t socket_buffer_bytes = kDefaultSocketBufferBytes;
  bool socket_buffer_set = false;  // given in the config (a cut is then a warning)
  // UDP (Asio): how datagrams are dealt among the listener's sockets, one per I/O thread.
  // kFlows: the kernel's SO_REUSEPORT hash of the sender's address and port, so a client's
  // datagrams all go to one thread, and with few clients some threads get none and others
  // several times an even share, even with as many clients as sockets (the report in
  // bench/results/udp-spread-vm). kDatagrams: each
  // datagram to a socket at random (a classic BPF program on the group), even with one client;
  // UDP promises no order, and requests of one client already answer out of order.
  enum class Spread { kFlows, kDatagrams };
  Spread spread = Spread::kFlows;
};

struct ServiceConfig {
  std::string name;
  uint32_t max_message_bytes = 0;
  DispatchPolicy dispatch = DispatchPolicy::kRoundRobin;
  std::vector<ListenerConfig> listeners;
  // A request handed to an agent (waiting for its RX ring or in it) and not answered within
  // this long gets an error reply naming the agent and the bound; a reply that comes later is
  // dropped, counted as `late`. 0: no bound (a request waits as long as its agent is
  // registered: for handlers that may legitimately take longer than any bound one would set).
  uint32_t reply_timeout_ms = 10'000;
  // Outlier ejection (dispatch.hpp): after this many requests in a row on one of an agent's
  // queues timed out, the agent leaves the service's dispatch for `eject_ms`, doubled for each
  // ejection that follows within one period of the agent's return, up to `eject_max_ms`. It
  // returns early when it answers a request in time. 0: never eject.
  uint32_t eject_after_timeouts = 3;
  uint32_t eject_ms = 5'000;
  uint32_t eject_max_ms = 60'000;
};

struct DestinationConfig {
  std::string name;
  config::HostPort connect;
  FramingConfig framing;
  // A call unanswered for this long fails, with every call waiting on the same connection, and
  // the connection is closed (the next call opens another). 0: calls wait as long as it takes.
  uint32_t timeout_ms = 1000;
};

// The server's one DPDK port. rte_eal_init can run once per process, so a server has at most
// one `dpdk:` section, and every `kind: dpdk` listener shares its port, its IPv4 address and its
// queues (the listeners differ by UDP port).
struct DpdkConfig {
  // Arguments for rte_eal_init, after argv[0] (which is "snic_server"). "--no-pci" is added
  // unless the arguments name a device (-a/--allow, -b/--block) or say --no-pci themselves.
  std::vector<std::string> eal_args;
  std::string port;  // ethdev name (rte_eth_dev_get_port_by_name); empty: the only port
  std::string ipv4;  // dotted quad; the port answers ARP and UDP for it
  uint32_t ipv4_be = 0;
  uint16_t queues = 1;             // RX/TX queue pairs; each needs its own worker lcore
  uint16_t burst = 32;             // packets per rx/tx burst
  uint16_t rx_descriptors = 1024;  // per RX queue
  uint16_t tx_descriptors = 1024;  // per TX queue
  uint32_t mbufs = 8191;           // mbufs in the pool (2^n - 1 is the most efficient)
  uint32_t mbuf_cache = 256;       // per-lcore mempool cache
  bool checksum_offload = true;    // use the PMD's checksum offloads where it has them
  // Worker lcores sleep this long after 1000 empty polls; 0 polls without pause.
  uint32_t idle_sleep_us = 0;
};

// Where the control and metrics endpoints listen when the config does not say: loopback, so
// that neither is reachable from another machine unless asked for.
inline const config::HostPort kDefaultControlListen{"127.0.0.1", 7100};
inline const config::HostPort kDefaultMetricsListen{"127.0.0.1", 9100};

struct ControlConfig {
  config::HostPort listen = kDefaultControlListen;
  std::string secret;
  uint32_t heartbeat_interval_ms = 100;
  uint32_t agent_timeout_ms = 1000;
  // transport rdma: how long connecting to an agent's exporter may take (rdma_cm resolution
  // and handshake; attach's header READs get as long again each). Connects run on a thread of
  // the control endpoint's own, never on an I/O thread.
  uint32_t rdma_connect_timeout_ms = 2000;
  // After an rdma region's transport fails while its agent stays registered, the server
  // reconnects after tunables::kRdmaReconnectFirst, doubling the wait after each failed try up
  // to this.
  uint32_t rdma_reconnect_max_ms = 5000;
  // The RC queue pairs to rdma regions: local ACK timeout (exponent of 4.096 us * 2^n, 1-31)
  // and transport retries (0-7). An agent whose RDMA device stops answering fails its queue
  // pair after (retries + 1) timeouts, about 7.5 s with these. Soft-RoCE takes 7 retries as
  // "retry forever".
  uint8_t rdma_ack_timeout = 18;
  uint8_t rdma_retry_count = 6;
  // Failed hellos (a wrong secret, a malformed or unexpected first frame, another protocol
  // version) per source address, and the penalties that follow (auth_throttle.hpp).
  AuthThrottleConfig auth;
  // The largest region_bytes an agent may announce. The server maps that much (shm) or
  // allocates and registers a staging image of it (rdma) before it can read the header, so a
  // larger announcement is refused first.
  uint64_t max_region_bytes = uint64_t{4} << 30;
};

struct ServerConfig {
  uint32_t io_threads = 2;
  // A program that fills this in gets one engine thread unless it says otherwise; a config
  // file without the key gets 0, the engine in the I/O threads (parse_server_config).
  uint32_t engine_threads = 1;
  std::string log_level = "info";
  ControlConfig control;
  std::optional<config::HostPort> metrics_listen;
  std::vector<ServiceConfig> services;
  std::vector<DestinationConfig> destinations;
  std::optional<DpdkConfig> dpdk;
};

// Whether `host` names this machine only: a loopback address or "localhost".
bool is_loopback_host(const std::string& host);

// Whether this build has the DPDK listener (CARACAL_HAVE_DPDK).
bool dpdk_available();

// Throws config::ConfigError naming the file, line, column and setting.
ServerConfig load_server_config(const std::string& path);
ServerConfig parse_server_config(const config::Field& root);

// A `framing:` mapping; `max_message_bytes` comes from the enclosing service or destination.
FramingConfig parse_framing(const config::Field& f, uint32_t max_message_bytes);

}  // namespace caracal::server
