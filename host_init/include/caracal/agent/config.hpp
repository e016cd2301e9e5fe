// An agent's configuration: what `AGENT --config FILE` reads. Parsing validates every setting
// and reports the first bad one as "FILE:LINE:COL: PATH: message"; unknown keys are refused.
//
//   agent: echo-1                  # this agent's name: 1-64 of A-Z a-z 0-9 - _ .
//   server: 127.0.0.1:7100         # the server's control endpoint (its control.listen)
//   secret: change-me-0123456789   # or `secret_file: PATH`; one of the two, >= 16 characters
//   accelerator: auto              # auto (the best one present), cpu, gpu:N
//   transport: shm                 # shm (default; `auto` means shm) or rdma
//   rdma:                          # transport rdma only (the agent must be built with rdma-core)
//     bind_address: 192.0.2.1      # required: the IP of an RDMA device (its netdev's address),
//                                  # which the server connects to; it is announced as is
//     port: 0                      # 0 (default): the system picks one per service
//     max_connections: 8           # SmartNIC connections per region at once (default 8)
//     region_memory: host          # host (default) or gpu: the regions in the GPU's memory,
//                                  # written by the NIC with GPUDirect RDMA (accelerator gpu:N)
//   log_level: info                # trace, debug, info, warn, error, off
//   cpu: { workers: 1, cpus: [1], burst: 32, idle_rounds_before_yield: 256,   # optional
//          idle_spin_us: 200, idle_sleep_max_us: 1000 }
//   gpu: { workers: 0, block_threads: 128, burst: 32, busy_polls: 2048,        # optional
//          idle_sleep_max_ns: 4096, stop_timeout_ms: 5000 }
//   reconnect_interval_ms: 200     # between connection attempts while the server is away
//   services:
//     - name: echo                 # a service of the server's config
//       queues: auto               # server queues, or auto (default): the CPU's workers, or
//                                  # on a GPU gpu.workers when set, else an eighth of its SMs
//                                  # rounded down to a power of two (16 on a 132-SM H200)
//       ring_capacity: auto        # slots per ring, power of two, or auto (default): room for
//                                  # 32 messages of max_message_bytes in 128 KiB or less (but two
//                                  # at least), at least 256 slots
//       slot_bytes: 256            # power of two (default 256)
//       max_message_bytes: 1024    # largest request or reply; at most half a ring
//       rx_lines: auto             # auto (default), on or off: announce every request in an LL
//                                  # line that the accelerator polls (mqueue/layout.hpp); auto
//                                  # is on for a GPU polling a region in host memory
//       tx_lines: auto             # auto (default), on or off: the accelerator announces short
//                                  # replies in LL lines that the server polls; auto is on for a
//                                  # GPU writing a region in host memory over shm
//       client_queues:             # optional; client queue c calls client_queues[c]
//         - { destination: memcached }               # one client queue
//         - { destination: store, count: per_queue }  # one per server queue, so that every
//                                  # worker owns one (count: N, N of them; default 1)
//       handler:                   # optional: the handler's own settings, as it declares
//         dictionary: words.tsv    # them (settings.hpp); checked by agent_main, not here
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/gpu/options.hpp"
#include "caracal/config/yaml.hpp"
#include "caracal/core/status.hpp"
#include "caracal/mqueue/layout.hpp"

namespace caracal::agent {

enum class AcceleratorKind : uint8_t { kAuto, kCpu, kGpu };

// What the configuration asks for; resolve_accelerator (accelerator.hpp) turns `auto` into the
// accelerator that will run.
struct AcceleratorSetting {
  AcceleratorKind kind = AcceleratorKind::kAuto;
  uint32_t gpu = 0;  // device index for kGpu
  std::string str() const;
};

enum class TransportKind : uint8_t { kShm, kRdma };

// transport rdma: where the regions live. kGpu (the Lynx placement) puts them in the memory of
// the agent's GPU, so the kernel polls locally and the NIC writes them with GPUDirect RDMA; it
// needs the GPU accelerator named as gpu:N.
enum class RegionMemory : uint8_t { kHost, kGpu };

// transport rdma: where each service's RdmaRegionExporter listens (mqueue/rdma.hpp).
struct RdmaAgentConfig {
  std::string bind_address;
  uint16_t port = 0;  // one exporter per service: a fixed port serves one service only
  uint32_t max_connections = 8;
  RegionMemory region_memory = RegionMemory::kHost;
};

struct ClientQueueConfig {
  std::string destination;  // a destination of the server's config
};

// One item of a service's `client_queues`: `count` client queues to `destination`, or with
// `per_queue` one for each server queue (placed so that worker w of as many workers as server
// queues owns the w-th).
struct ClientQueueSpec {
  std::string destination;
  uint32_t count = 1;
  bool per_queue = false;
};

// Whether a service's region has RX lines, TX lines (mqueue/layout.hpp). RX lines save a GPU
// that polls its rings across PCIe one read per request; a CPU, or a GPU polling its own
// memory, gains nothing and the SmartNIC writes a line more per request. TX lines let the server
// take a GPU's short reply without waiting for the fence that publishes the tail; only a server
// that reads the region in place (shm) polls them.
enum class Lines : uint8_t { kAuto, kOn, kOff };

struct ServiceConfig {
  std::string name;
  uint32_t queues = 1;
  uint32_t ring_capacity = 256;
  uint32_t slot_bytes = 256;
  uint32_t max_message_bytes = 0;
  Lines rx_lines = Lines::kAuto;
  Lines tx_lines = Lines::kAuto;
  // `queues` and `ring_capacity` left to the agent (omitted or `auto`): size_services sets
  // queues once the accelerator is known; the parser sets ring_capacity from the message size.
  bool queues_auto = false;
  bool ring_auto = false;
  // The client queues in client-queue order, `client_queue_specs` expanded for `queues`
  // (expand_client_queues).
  std::vector<ClientQueueConfig> client_queues;
  std::vector<ClientQueueSpec> client_queue_specs;
  // The `handler:` mapping, kept as read: only the handler knows its keys, and its settings are
  // checked against what it declares (Settings, settings.hpp) with these positions.
  std::optional<config::Field> handler;
  // This service's entry in `services`, where a required handler setting is missing.
  std::optional<config::Field> entry;

  // `gpu_across_pcie`: the accelerator that serves the region is a GPU and the region is in
  // host memory, which is what rx_lines `auto` turns lines on for; with `shm` as well, tx_lines
  // `auto` turns them on.
  mqueue::RegionGeometry geometry(bool gpu_across_pcie = false, bool shm = false) const;
  // Client queue destinations in client-queue order, as the region announcement lists them.
  std::vector<std::string> destinations() const;
  // Rebuilds client_queues from client_queue_specs for the current `queues`.
  void expand_client_queues();
};

// Messages of max_message_bytes that an automatic ring holds (a GPU worker's default burst),
// in at most kAutoRingBytes unless two messages need more.
inline constexpr uint64_t kAutoRingMessages = 32;
inline constexpr uint64_t kAutoRingBytes = 128 << 10;
// Slots per ring for `auto`: room for kAutoRingMessages messages of max_message_bytes within
// kAutoRingBytes (but two at least), rounded up to a power of two, at least 256 and at most
// mqueue::kMaxRingCapacity.
uint32_t auto_ring_capacity(uint32_t max_message_bytes, uint32_t slot_bytes);

struct AgentConfig {
  std::string agent;
  config::HostPort server;
  std::string secret;
  AcceleratorSetting accelerator;
  TransportKind transport = TransportKind::kShm;
  RdmaAgentConfig rdma;
  std::string log_level = "info";
  accel::CpuOptions cpu;
  accel::GpuOptions gpu;
  uint32_t reconnect_interval_ms = 200;
  std::vector<ServiceConfig> services;
};

// Whether the agent can run an accelerator setting (check_accelerator_available with the
// agent's backends); its error is reported at the setting's line.
using AcceleratorCheck = std::function<Status(const AcceleratorSetting&)>;

// Throws config::ConfigError naming the file, line, column and key of the first bad setting.
AgentConfig parse_agent_config(const config::Field& root, const AcceleratorCheck& check = {});
AgentConfig load_agent_config(const std::string& path, const AcceleratorCheck& check = {});

// What the accelerator that will run tells the sizing: for a GPU, its multiprocessors.
struct AcceleratorFacts {
  AcceleratorKind kind = AcceleratorKind::kCpu;
  std::string name;              // "cpu", "gpu:0"
  uint32_t multiprocessors = 0;  // a GPU's SMs
};

// Sets every service's `auto` queue count for `facts` (see the format above) and expands its
// client queues, within what a region holds; returns one line per service for the log, what
// was chosen and why. Given counts were checked against the region's limit by the parser.
std::vector<std::string> size_services(AgentConfig& config, const AcceleratorFacts& facts);

// What the configuration allows but will not serve as meant, on `accelerator` (cpu or gpu), one
// line each for the log: workers that own a service's server queues but none of its client
// queues (their handlers' calls fail with kNoClient).
std::vector<std::string> configuration_warnings(const AgentConfig& config, AcceleratorKind kind);

// Agent, service and destination names: what the control protocol accepts, so that they go
// into logs, metric labels and shm names as they are.
bool is_valid_name(std::string_view name);

}  // namespace caracal::agent
