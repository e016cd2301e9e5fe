#include "caracal/agent/config.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "caracal/control/protocol.hpp"
#include "caracal/mqueue/validate.hpp"

namespace caracal::agent {
namespace {

using config::Field;

std::string name_of(const Field& f, const char* what) {
  std::string v = f.as_string();
  if (!is_valid_name(v)) {
    f.fail("'" + v + "' is not a valid " + what + " name (1-64 of A-Z a-z 0-9 - _ .)");
  }
  return v;
}

AcceleratorSetting parse_accelerator(const Field& f, const AcceleratorCheck& check) {
  const std::string v = f.as_string();
  AcceleratorSetting a;
  if (v == "auto") {
    a.kind = AcceleratorKind::kAuto;
  } else if (v == "cpu") {
    a.kind = AcceleratorKind::kCpu;
  } else if (v.starts_with("gpu:")) {
    const std::string index = v.substr(4);
    uint32_t n = 0;
    const auto [end, ec] = std::from_chars(index.data(), index.data() + index.size(), n);
    if (index.empty() || ec != std::errc() || end != index.data() + index.size()) {
      f.fail("'" + v + "' is not gpu:N with N a device index (gpu:0, gpu:1, ...)");
    }
    a.kind = AcceleratorKind::kGpu;
    a.gpu = n;
  } else {
    f.fail("'" + v + "' is not one of: auto, cpu, gpu:N");
  }
  if (check) {
    if (Status s = check(a); !s.ok()) f.fail(s.message());
  }
  return a;
}

TransportKind parse_transport(const Field& f) {
  const TransportKind t = f.as_choice<TransportKind>({{"shm", TransportKind::kShm},
                                                      {"auto", TransportKind::kShm},
                                                      {"rdma", TransportKind::kRdma}});
#ifndef CARACAL_HAVE_RDMA
  if (t == TransportKind::kRdma) {
    f.fail(
        "transport 'rdma' is not available: this agent was built without rdma-core (libibverbs, "
        "librdmacm); use 'shm' with a server on this host");
  }
#endif
  return t;
}

// rdma.region_memory: `gpu` only where the GPU accelerator runs, since nothing else can poll
// a region in GPU memory; `auto` is refused too, as it may pick the CPU.
RegionMemory parse_region_memory(const Field& f, const AcceleratorSetting& accelerator) {
  const RegionMemory m =
      f.as_choice<RegionMemory>({{"host", RegionMemory::kHost}, {"gpu", RegionMemory::kGpu}});
  if (m == RegionMemory::kGpu && accelerator.kind != AcceleratorKind::kGpu) {
    f.fail(
        "'gpu' places the regions in a GPU's memory, which only the GPU accelerator can poll, "
        "and accelerator is '" +
        accelerator.str() + "'" +
        (accelerator.kind == AcceleratorKind::kAuto ? " (which may pick the CPU)" : "") +
        ": set 'accelerator: gpu:N', or 'region_memory: host'");
  }
  return m;
}

RdmaAgentConfig parse_rdma(const Field& f, const AcceleratorSetting& accelerator) {
  f.allow_only({"bind_address", "port", "max_connections", "region_memory"});
  RdmaAgentConfig r;
  const Field bind = f.required("bind_address");
  r.bind_address = bind.as_string();
  if (r.bind_address.empty() || r.bind_address == "0.0.0.0" || r.bind_address == "::" ||
      r.bind_address.find_first_of(" \t/") != std::string::npos) {
    bind.fail("'" + r.bind_address +
              "' is not an address the server can connect to: give the IP address of an RDMA "
              "device (its netdev's address)");
  }
  if (auto v = f.optional("port")) r.port = static_cast<uint16_t>(v->as_uint(0, 65535));
  if (auto v = f.optional("max_connections")) {
    r.max_connections = static_cast<uint32_t>(v->as_uint(1, 1024));
  }
  if (auto v = f.optional("region_memory")) r.region_memory = parse_region_memory(*v, accelerator);
  return r;
}

accel::CpuOptions parse_cpu(const Field& f) {
  f.allow_only({"workers", "cpus", "burst", "idle_rounds_before_yield", "idle_spin_us",
                "idle_sleep_max_us"});
  accel::CpuOptions o;
  if (auto v = f.optional("workers")) o.workers = static_cast<uint32_t>(v->as_uint(1, 1024));
  if (auto v = f.optional("cpus")) {
    for (const Field& cpu : v->items())
      o.cpus.push_back(static_cast<int>(cpu.as_uint(0, 65535)));
    if (o.cpus.empty())
      v->fail("the CPU list is empty (leave 'cpus' out to let the OS place workers)");
  }
  if (auto v = f.optional("burst")) o.burst = static_cast<uint32_t>(v->as_uint(1, 65536));
  if (auto v = f.optional("idle_rounds_before_yield")) {
    o.idle_rounds_before_yield = static_cast<uint32_t>(v->as_uint(0, UINT32_MAX));
  }
  if (auto v = f.optional("idle_spin_us")) {
    o.idle_spin_us = static_cast<uint32_t>(v->as_uint(0, 1'000'000));
  }
  // Up to 100 ms: a request that comes while a worker sleeps waits up to this long.
  if (auto v = f.optional("idle_sleep_max_us")) {
    o.idle_sleep_max_us = static_cast<uint32_t>(v->as_uint(0, 100'000));
  }
  return o;
}

accel::GpuOptions parse_gpu(const Field& f) {
  f.allow_only(
      {"workers", "block_threads", "burst", "busy_polls", "idle_sleep_max_ns", "stop_timeout_ms"});
  accel::GpuOptions o;
  if (auto v = f.optional("workers")) o.workers = static_cast<uint32_t>(v->as_uint(0, 1024));
  if (auto v = f.optional("block_threads")) {
    o.block_threads = static_cast<uint32_t>(v->as_uint(32, 1024));
    if (o.block_threads % 32 != 0)
      v->fail(std::to_string(o.block_threads) + " is not a multiple of 32 (a warp)");
  }
  if (auto v = f.optional("burst")) o.burst = static_cast<uint32_t>(v->as_uint(1, 65536));
  if (auto v = f.optional("busy_polls"))
    o.busy_polls = static_cast<uint32_t>(v->as_uint(0, UINT32_MAX));
  // __nanosleep sleeps at most about a millisecond.
  if (auto v = f.optional("idle_sleep_max_ns")) {
    o.idle_sleep_max_ns = static_cast<uint32_t>(v->as_uint(32, 1'000'000));
  }
  if (auto v = f.optional("stop_timeout_ms")) {
    o.stop_timeout_ms = static_cast<uint32_t>(v->as_uint(1, 600'000));
  }
  return o;
}

uint32_t power_of_two(const Field& f, uint32_t min, uint32_t max) {
  const uint64_t v = f.as_uint(min, max);
  if (!mqueue::is_power_of_two(v)) f.fail(std::to_string(v) + " is not a power of two");
  return static_cast<uint32_t>(v);
}

Lines lines_setting(const Field& f) {
  if (f.as_string() == "auto") return Lines::kAuto;
  return f.as_bool() ? Lines::kOn : Lines::kOff;
}

ServiceConfig parse_service(const Field& f) {
  f.allow_only({"name", "queues", "ring_capacity", "slot_bytes", "max_message_bytes", "rx_lines",
                "tx_lines", "client_queues", "handler"});
  ServiceConfig s;
  s.entry = f;
  s.name = name_of(f.required("name"), "service");
  const auto is_auto = [](const std::optional<Field>& v) { return !v || v->as_string() == "auto"; };
  const std::optional<Field> queues = f.optional("queues");
  s.queues_auto = is_auto(queues);
  // Until size_services knows the accelerator, an automatic count is one queue.
  s.queues = s.queues_auto ? 1 : static_cast<uint32_t>(queues->as_uint(1, mqueue::kMaxQueues));
  if (auto v = f.optional("slot_bytes")) {
    s.slot_bytes = power_of_two(*v, mqueue::kMinSlotBytes, mqueue::kMaxSlotBytes);
  }
  const Field max = f.required("max_message_bytes");
  s.max_message_bytes = static_cast<uint32_t>(max.as_uint(1, UINT32_MAX));
  const std::optional<Field> ring = f.optional("ring_capacity");
  s.ring_auto = is_auto(ring);
  s.ring_capacity = s.ring_auto
                        ? auto_ring_capacity(s.max_message_bytes, s.slot_bytes)
                        : power_of_two(*ring, mqueue::kMinRingCapacity, mqueue::kMaxRingCapacity);
  if (auto v = f.optional("rx_lines")) s.rx_lines = lines_setting(*v);
  if (auto v = f.optional("tx_lines")) s.tx_lines = lines_setting(*v);
  if (auto cq = f.optional("client_queues")) {
    for (const Field& item : cq->items()) {
      item.allow_only({"destination", "count"});
      ClientQueueSpec spec;
      spec.destination = name_of(item.required("destination"), "destination");
      if (auto count = item.optional("count")) {
        if (count->as_string() == "per_queue") {
          spec.per_queue = true;
        } else {
          spec.count = static_cast<uint32_t>(count->as_uint(1, mqueue::kMaxQueues));
        }
      }
      s.client_queue_specs.push_back(std::move(spec));
    }
    s.expand_client_queues();
    if (uint64_t{s.queues} + s.client_queues.size() > mqueue::kMaxQueues) {
      cq->fail(std::to_string(s.client_queues.size()) + " client queues and " +
               std::to_string(s.queues) + " server queues exceed the " +
               std::to_string(mqueue::kMaxQueues) + " queues a region can hold");
    }
  }
  if (auto h = f.optional("handler")) {
    if (!h->is_map()) h->fail("expected a mapping of the handler's settings (name: value)");
    s.handler = *h;
  }
  // Every field is in range on its own; what remains is how they fit together, which only the
  // largest message can break: it must fit in half a ring.
  if (Status st = mqueue::validate_geometry(s.geometry()); !st.ok()) {
    max.fail(st.message() + " (ring_capacity " + std::to_string(s.ring_capacity) +
             (s.ring_auto ? " chosen for it" : "") + ", slot_bytes " +
             std::to_string(s.slot_bytes) + ")");
  }
  return s;
}

}  // namespace

std::string AcceleratorSetting::str() const {
  switch (kind) {
    case AcceleratorKind::kAuto:
      return "auto";
    case AcceleratorKind::kCpu:
      return "cpu";
    case AcceleratorKind::kGpu:
      return "gpu:" + std::to_string(gpu);
  }
  return "?";
}

mqueue::RegionGeometry ServiceConfig::geometry(bool gpu_across_pcie, bool shm) const {
  mqueue::RegionGeometry g;
  g.rx_lines = rx_lines == Lines::kOn || (rx_lines == Lines::kAuto && gpu_across_pcie);
  g.tx_lines = tx_lines == Lines::kOn || (tx_lines == Lines::kAuto && gpu_across_pcie && shm);
  g.server_queue_count = queues;
  g.client_queue_count = static_cast<uint32_t>(client_queues.size());
  g.slot_bytes = slot_bytes;
  g.ring_capacity = ring_capacity;
  g.max_message_bytes = max_message_bytes;
  return g;
}

std::vector<std::string> ServiceConfig::destinations() const {
  std::vector<std::string> out;
  for (const ClientQueueConfig& c : client_queues)
    out.push_back(c.destination);
  return out;
}

void ServiceConfig::expand_client_queues() {
  client_queues.clear();
  for (const ClientQueueSpec& spec : client_queue_specs) {
    for (uint32_t i = 0, n = spec.per_queue ? queues : spec.count; i < n; ++i)
      client_queues.push_back(ClientQueueConfig{spec.destination});
  }
}

uint32_t auto_ring_capacity(uint32_t max_message_bytes, uint32_t slot_bytes) {
  const uint64_t per_message = mqueue::slots_for(max_message_bytes, slot_bytes);
  // Room for kAutoRingMessages, but no more than kAutoRingBytes unless two messages (the
  // fewest a ring must hold) need more.
  const uint64_t wanted = std::max(
      std::min(kAutoRingMessages * per_message, kAutoRingBytes / slot_bytes), 2 * per_message);
  uint64_t capacity = 256;
  while (capacity < wanted && capacity < mqueue::kMaxRingCapacity)
    capacity *= 2;
  return static_cast<uint32_t>(capacity);
}

std::vector<std::string> size_services(AgentConfig& config, const AcceleratorFacts& facts) {
  std::vector<std::string> lines;
  for (ServiceConfig& s : config.services) {
    std::string why;
    if (s.queues_auto) {
      uint32_t q = 1;
      if (facts.kind == AcceleratorKind::kGpu && config.gpu.workers != 0) {
        q = config.gpu.workers;
        why = "one per GPU worker (gpu.workers)";
      } else if (facts.kind == AcceleratorKind::kGpu) {
        // A persistent worker per queue. More queues cost the server's threads more polling
        // than they give: face at 4 I/O threads on an H200 served less with 32 queues than
        // with 8 or 16 (bench/results/EXPERIMENTS.md, face-auto-h200).
        const uint32_t eighth = std::max<uint32_t>(1, facts.multiprocessors / 8);
        while (q * 2 <= eighth)
          q *= 2;
        why = "an eighth of " + facts.name + "'s " + std::to_string(facts.multiprocessors) +
              " SMs, rounded down to a power of two";
      } else {
        q = std::max<uint32_t>(1, config.cpu.workers);
        why = "one per CPU worker (cpu.workers)";
      }
      // What a region holds: each per-queue client item adds a client queue per server queue.
      uint64_t fixed = 0, per_queue = 0;
      for (const ClientQueueSpec& c : s.client_queue_specs) {
        if (c.per_queue) {
          ++per_queue;
        } else {
          fixed += c.count;
        }
      }
      // The parser refused client queues that leave no room for one server queue.
      const uint64_t room = (mqueue::kMaxQueues - fixed) / (1 + per_queue);
      if (q > room) {
        q = static_cast<uint32_t>(room);
        why += ", cut to what a region holds with its client queues";
      }
      s.queues = q;
    }
    // Only per-queue items change with the count (client_queues filled in by a program stay).
    if (std::any_of(s.client_queue_specs.begin(), s.client_queue_specs.end(),
                    [](const ClientQueueSpec& c) { return c.per_queue; })) {
      s.expand_client_queues();
    }
    std::string line =
        "service '" + s.name + "': " + std::to_string(s.queues) + " queue(s)" +
        (s.queues_auto ? " (auto: " + why + ")" : "") + ", rings of " +
        std::to_string(s.ring_capacity) + " slots of " + std::to_string(s.slot_bytes) + " B" +
        (s.ring_auto ? " (auto: room for " +
                           std::to_string(s.ring_capacity /
                                          mqueue::slots_for(s.max_message_bytes, s.slot_bytes)) +
                           " messages of " + std::to_string(s.max_message_bytes) + " B)"
                     : "");
    if (!s.client_queues.empty())
      line += ", " + std::to_string(s.client_queues.size()) + " client queue(s)";
    lines.push_back(std::move(line));
  }
  return lines;
}

std::vector<std::string> configuration_warnings(const AgentConfig& config, AcceleratorKind kind) {
  std::vector<std::string> out;
  for (const ServiceConfig& s : config.services) {
    const uint32_t clients = static_cast<uint32_t>(s.client_queues.size());
    if (clients == 0) continue;
    // Worker w owns server queues and client queues whose index is w modulo the workers; the
    // GPU's default (0) is one worker per server queue, no more than the client queues.
    uint32_t workers = config.cpu.workers;
    const char* what = "CPU worker";
    if (kind == AcceleratorKind::kGpu) {
      workers = config.gpu.workers != 0 ? config.gpu.workers : std::min(s.queues, clients);
      what = "GPU worker";
    }
    const uint32_t serving = std::min(workers, s.queues);  // workers that own a server queue
    if (serving <= clients) continue;
    out.push_back("service '" + s.name + "': " + std::to_string(serving) + " " + what +
                  "s serve its " + std::to_string(s.queues) + " queue(s) but it has " +
                  std::to_string(clients) + " client queue(s): worker(s) " +
                  std::to_string(clients) + " to " + std::to_string(serving - 1) +
                  " own none, and their handlers' calls fail; give the service " +
                  std::to_string(serving) + " client queues, or fewer workers");
  }
  return out;
}

bool is_valid_name(std::string_view name) {
  return control::is_valid_name(name);
}

AgentConfig parse_agent_config(const Field& root, const AcceleratorCheck& check) {
  root.allow_only({"agent", "server", "secret", "secret_file", "accelerator", "transport", "rdma",
                   "log_level", "cpu", "gpu", "reconnect_interval_ms", "services"});
  AgentConfig c;
  c.agent = name_of(root.required("agent"), "agent");
  const Field server = root.required("server");
  c.server = config::as_host_port(server);
  if (c.server.port == 0) server.fail("the server's control port cannot be 0");

  c.secret = control::read_secret(root);

  if (auto v = root.optional("accelerator")) c.accelerator = parse_accelerator(*v, check);
  const std::optional<Field> transport = root.optional("transport");
  if (transport) c.transport = parse_transport(*transport);
  const std::optional<Field> rdma = root.optional("rdma");
  if (c.transport == TransportKind::kRdma) {
    if (!rdma) transport->fail("transport 'rdma' needs an 'rdma:' section with bind_address");
    c.rdma = parse_rdma(*rdma, c.accelerator);
  } else if (rdma) {
    if (auto m = rdma->optional("region_memory")) {
      m->fail(
          "region_memory needs 'transport: rdma': with transport shm the region is a shm "
          "object in host memory that the server maps");
    }
    rdma->fail("'rdma' settings need 'transport: rdma'");
  }
  if (auto v = root.optional("log_level")) {
    c.log_level = v->as_string();
    static const std::set<std::string> levels{"trace", "debug", "info", "warn", "error", "off"};
    if (!levels.contains(c.log_level)) {
      v->fail("'" + c.log_level + "' is not one of: trace, debug, info, warn, error, off");
    }
  }
  if (auto v = root.optional("cpu")) c.cpu = parse_cpu(*v);
  if (auto v = root.optional("gpu")) c.gpu = parse_gpu(*v);
  if (auto v = root.optional("reconnect_interval_ms")) {
    c.reconnect_interval_ms = static_cast<uint32_t>(v->as_uint(1, 600'000));
  }

  const Field services = root.required("services");
  const std::vector<Field> items = services.items();
  if (items.empty()) services.fail("at least one service is required");
  std::set<std::string> names;
  for (const Field& s : items) {
    c.services.push_back(parse_service(s));
    if (!names.insert(c.services.back().name).second) {
      s.required("name").fail("duplicate service name '" + c.services.back().name + "'");
    }
  }
  return c;
}

AgentConfig load_agent_config(const std::string& path, const AcceleratorCheck& check) {
  return parse_agent_config(config::load_yaml_file(path), check);
}

}  // namespace caracal::agent
