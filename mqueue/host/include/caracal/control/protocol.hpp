// The control channel between an agent and snic_server (connection.hpp runs it over TCP).
//
// A TCP connection from the agent to the server's `control.listen`. Every message is a frame:
// a 4-byte big-endian length, then that many bytes of YAML holding one mapping with a `type`
// (so a human can read a capture, and the server validates it with the same line-accurate
// errors as its config). Frames are at most kMaxFrameBytes.
//
//   agent                                   server
//   hello {protocol, secret, agent, epoch} ->
//                                          <- welcome {heartbeat_interval_ms, agent_timeout_ms}
//                                             or refused {message}, then close; a refusal
//                                             with retry_after_ms is for that long only
//                                             (the agent's address is throttled)
//   region {service, transport,            ->    (one per service the agent serves)
//           region_bytes, destinations,
//           shm: shm_name
//           rdma: rdma_host, rdma_port,
//                 rdma_address, rdma_rkey}
//                                          <- attached {service} or refused {service, message}
//   heartbeat                              ->    (every heartbeat_interval_ms)
//                                          <- heartbeat (answer, so the agent sees a lost server)
//   bye                                    ->    (clean detach: the server stops dispatching,
//                                          <- bye     waits for replies in flight, unmaps)
//
// The server trusts nothing in a region message until it has checked it field by field and
// read the region's header through the transport (validate_region); the header's epoch must be
// the epoch of the agent's hello. An agent whose connection closes or whose heartbeats stop
// for agent_timeout_ms is lost: removed from dispatch, its requests in flight failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "caracal/config/yaml.hpp"
#include "caracal/core/status.hpp"

namespace caracal::control {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr uint32_t kFramePrefixBytes = 4;
inline constexpr uint32_t kMaxFrameBytes = 64 * 1024;
inline constexpr size_t kMinSecretBytes = 16;

struct Hello {
  uint32_t protocol = kProtocolVersion;
  std::string secret;
  std::string agent;        // a name for logs and metrics; one live registration per name
  uint64_t epoch = 0;       // new every time the agent (re)creates its regions
  std::string accelerator;  // what serves the regions ("cpu", "gpu:0"), for logs
};

struct Welcome {
  uint32_t heartbeat_interval_ms = 0;
  uint32_t agent_timeout_ms = 0;
};

// One region, serving one service.
struct RegionAnnounce {
  std::string service;
  std::string transport;  // "shm" or "rdma"
  std::string shm_name;   // shm: POSIX shared memory object, "/name"
  uint64_t region_bytes = 0;
  // Client queue c of the region calls destinations[c] (a destination in the server config).
  std::vector<std::string> destinations;
  // rdma: where the agent's exporter listens, and the region's remote address and key.
  std::string rdma_host;
  uint16_t rdma_port = 0;
  uint64_t rdma_address = 0;
  uint32_t rdma_rkey = 0;
};

struct Attached {
  std::string service;
};

struct Heartbeat {};
struct Bye {};

struct Refused {
  std::string service;  // empty: the registration as a whole
  std::string message;
  // Nonzero: the refusal is for now, not for good. The server throttles the agent's address
  // after repeated failed hellos from it and names how long is left; the agent tries again
  // after that long instead of giving up. Older agents read a refusal with this key as a
  // malformed frame, which they also retry.
  uint32_t retry_after_ms = 0;
};

using Message = std::variant<Hello, Welcome, RegionAnnounce, Attached, Heartbeat, Bye, Refused>;

// The whole frame (prefix included).
std::string encode(const Message& message);

// The length in a frame's prefix, or an error when it is zero or over kMaxFrameBytes.
Result<uint32_t> frame_length(const std::byte* prefix);

// Parses a frame's payload. `origin` names the peer in errors
// ("control 127.0.0.1:51234: region.region_bytes: ...").
Result<Message> decode(std::string_view payload, const std::string& origin);

const char* type_name(const Message& message);

// Names of agents, services and destinations: 1 to 64 of A-Z a-z 0-9 - _ . (they go into logs
// and metric labels as they are).
bool is_valid_name(std::string_view name);

// Whether this build can serve `transport: rdma` (built with rdma-core).
bool rdma_available();

// The secret of the example configurations, which the server accepts only on a loopback control
// address.
inline constexpr std::string_view kExampleSecret = "change-me-0123456789";

// The shared secret of a config mapping (server `control:` or an agent's top level): `secret:
// TEXT` or `secret_file: PATH` (trailing newlines dropped), exactly one of the two, at least
// kMinSecretBytes long; a file that other users may read, write or search is refused. Throws
// config::ConfigError at the offending line.
std::string read_secret(const config::Field& mapping);

// The refusal of a hello of another protocol version. decode() accepts any version, so that the
// server can tell this refusal from a malformed frame.
std::string unsupported_protocol(uint32_t version);

// Compares two secrets in time that depends only on their lengths, not on where they differ.
bool secrets_equal(std::string_view a, std::string_view b);

}  // namespace caracal::control
