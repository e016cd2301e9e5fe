// The agent configuration: every setting parsed, and each bad line refused with its file, line,
// column and key.
#include "caracal/agent/config.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "caracal/agent/accelerator.hpp"
#include "caracal/mqueue/validate.hpp"

namespace caracal::agent {
namespace {

const char* kValid = R"(agent: echo-1
server: 127.0.0.1:7100
secret: change-me-0123456789
accelerator: cpu
transport: shm
log_level: debug
cpu: { workers: 2, cpus: [0, 1], burst: 16, idle_rounds_before_yield: 0 }
reconnect_interval_ms: 50
services:
  - name: echo
    queues: 2
    ring_capacity: 256
    slot_bytes: 256
    max_message_bytes: 1024
  - name: kv
    max_message_bytes: 200
    client_queues:
      - { destination: memcached }
      - destination: redis
)";

// A handler for the backends of an agent built by a host compiler: CPU only.
struct Nop {
  void operator()(const accel::Request&, accel::Response& resp, accel::Context&) const {
    resp.size = 0;
  }
};

// What agent_main checks accelerator settings with.
Status cpu_only_check(const AcceleratorSetting& a) {
  return check_accelerator_available(a, make_backends(Nop{}));
}

AgentConfig parse(const std::string& text) {
  return parse_agent_config(config::load_yaml_text(text, "agent.yaml"), cpu_only_check);
}

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return "";
}

// kValid with one piece replaced.
std::string with(const std::string& from, const std::string& to) {
  std::string s = kValid;
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

// The error starts with "agent.yaml:LINE:COL: " and mentions every needle.
void expect_error(const std::string& text, const std::string& where,
                  std::initializer_list<const char*> needles) {
  const std::string e = error_of(text);
  ASSERT_FALSE(e.empty()) << "accepted:\n" << text;
  EXPECT_EQ(e.rfind("agent.yaml:" + where + ": ", 0), 0u) << e;
  for (const char* n : needles)
    EXPECT_NE(e.find(n), std::string::npos) << "'" << n << "' not in: " << e;
}

TEST(AgentConfig, ParsesEverySetting) {
  const AgentConfig c = parse(kValid);
  EXPECT_EQ(c.agent, "echo-1");
  EXPECT_EQ(c.server.host, "127.0.0.1");
  EXPECT_EQ(c.server.port, 7100);
  EXPECT_EQ(c.secret, "change-me-0123456789");
  EXPECT_EQ(c.accelerator.kind, AcceleratorKind::kCpu);
  EXPECT_EQ(c.transport, TransportKind::kShm);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.cpu.workers, 2u);
  EXPECT_EQ(c.cpu.cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.cpu.burst, 16u);
  EXPECT_EQ(c.cpu.idle_rounds_before_yield, 0u);
  EXPECT_EQ(c.reconnect_interval_ms, 50u);
  ASSERT_EQ(c.services.size(), 2u);
  const mqueue::RegionGeometry g = c.services[0].geometry();
  EXPECT_EQ(g.server_queue_count, 2u);
  EXPECT_EQ(g.client_queue_count, 0u);
  EXPECT_EQ(g.ring_capacity, 256u);
  EXPECT_EQ(g.slot_bytes, 256u);
  EXPECT_EQ(g.max_message_bytes, 1024u);
  const ServiceConfig& kv = c.services[1];
  EXPECT_EQ(kv.queues, 1u);  // defaults
  EXPECT_EQ(kv.ring_capacity, 256u);
  EXPECT_EQ(kv.slot_bytes, 256u);
  EXPECT_EQ(kv.geometry().client_queue_count, 2u);
  EXPECT_EQ(kv.destinations(), (std::vector<std::string>{"memcached", "redis"}));
}

TEST(AgentConfig, DefaultsAndAuto) {
  const AgentConfig c = parse(R"(agent: a
server: "[::1]:7100"
secret: 0123456789abcdef
services: [{ name: echo, max_message_bytes: 100 }]
)");
  EXPECT_EQ(c.server.host, "::1");
  EXPECT_EQ(c.accelerator.kind, AcceleratorKind::kAuto);
  EXPECT_EQ(c.transport, TransportKind::kShm);
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(c.cpu.workers, 1u);
  EXPECT_EQ(c.reconnect_interval_ms, 200u);
  EXPECT_EQ(c.gpu.workers, 0u);
  EXPECT_EQ(c.gpu.block_threads, 128u);
  // auto runs on the CPU in an agent without the CUDA backend.
  Result<AcceleratorChoice> choice = resolve_accelerator(c.accelerator, make_backends(Nop{}));
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->kind, AcceleratorKind::kCpu);
  EXPECT_EQ(choice->str(), "cpu");
}

// What the configuration leaves out the agent sizes: queues for the accelerator it finds, rings
// for the message size, a client queue per server queue where asked; and it says what it chose.
AgentConfig sized(const std::string& services, const AcceleratorFacts& facts,
                  const std::string& extra = "") {
  AgentConfig c = parse("agent: a\nserver: 127.0.0.1:7100\nsecret: 0123456789abcdef\n" + extra +
                        "services:\n" + services);
  size_services(c, facts);
  return c;
}

const AcceleratorFacts kCpu{AcceleratorKind::kCpu, "cpu", 0};
const AcceleratorFacts kH200{AcceleratorKind::kGpu, "gpu:0", 132};

TEST(AgentConfig, AutoRingHoldsThirtyTwoMessagesIn128KiBAtMost) {
  EXPECT_EQ(auto_ring_capacity(100, 256), 256u);   // 1 slot each: the floor
  EXPECT_EQ(auto_ring_capacity(1024, 256), 256u);  // 5 slots: 160
  EXPECT_EQ(auto_ring_capacity(4104, 256), 512u);  // 17 slots: 544, but 128 KiB is 512
  EXPECT_EQ(auto_ring_capacity(8192, 256), 512u);  // 33 slots: 15 of them
  // 257 slots: two of them are more than 128 KiB.
  EXPECT_EQ(auto_ring_capacity(65536, 256), 1024u);
  // 1 MiB messages (4,097 slots): two of them, whatever the bytes.
  EXPECT_EQ(auto_ring_capacity(1 << 20, 256), 16384u);
  // What it picks always passes the geometry's rules.
  for (uint32_t max : {1u, 200u, 4000u, 60000u, 1u << 20, 8u << 20}) {
    mqueue::RegionGeometry g;
    g.max_message_bytes = max;
    g.ring_capacity = auto_ring_capacity(max, 256);
    EXPECT_TRUE(mqueue::validate_geometry(g).ok()) << max;
  }
}

TEST(AgentConfig, QueuesAndRingsAreSizedForTheAccelerator) {
  const std::string face =
      "  - { name: face, max_message_bytes: 8192,\n"
      "      client_queues: [ { destination: memcached, count: per_queue } ] }\n";
  AgentConfig gpu = sized(face, kH200);
  const ServiceConfig& g = gpu.services[0];
  EXPECT_TRUE(g.queues_auto && g.ring_auto);
  EXPECT_EQ(g.queues, 16u);  // 132 / 8 = 16.5, down to a power of two
  EXPECT_EQ(g.ring_capacity, 512u);
  EXPECT_EQ(g.client_queues.size(), 16u);
  EXPECT_TRUE(configuration_warnings(gpu, AcceleratorKind::kGpu).empty());
  // The CPU: a queue per worker.
  AgentConfig cpu = sized(face, kCpu, "cpu: { workers: 3 }\n");
  EXPECT_EQ(cpu.services[0].queues, 3u);
  EXPECT_EQ(cpu.services[0].client_queues.size(), 3u);
  EXPECT_TRUE(configuration_warnings(cpu, AcceleratorKind::kCpu).empty());
  // gpu.workers, when set, is the count; a small GPU gets one queue.
  EXPECT_EQ(sized(face, kH200, "gpu: { workers: 6 }\n").services[0].queues, 6u);
  EXPECT_EQ(sized(face, {AcceleratorKind::kGpu, "gpu:1", 3}).services[0].queues, 1u);
  // Said, with the reason.
  AgentConfig c = parse(
      "agent: a\nserver: 127.0.0.1:7100\nsecret: 0123456789abcdef\n"
      "services:\n" +
      face);
  const std::vector<std::string> lines = size_services(c, kH200);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "service 'face': 16 queue(s) (auto: an eighth of gpu:0's 132 SMs, rounded down to a "
            "power of two), rings of 512 slots of 256 B (auto: room for 15 messages of 8192 B), 16 "
            "client queue(s)");
}

TEST(AgentConfig, GivenSizesAreKept) {
  AgentConfig c = sized(
      "  - { name: face, queues: 4, ring_capacity: 512, max_message_bytes: 4104,\n"
      "      client_queues: [ { destination: memcached, count: per_queue },\n"
      "                       { destination: redis, count: 2 }, { destination: log } ] }\n",
      kH200);
  const ServiceConfig& s = c.services[0];
  EXPECT_FALSE(s.queues_auto || s.ring_auto);
  EXPECT_EQ(s.queues, 4u);
  EXPECT_EQ(s.ring_capacity, 512u);
  // Per-queue ones first in their order: worker w of 4 owns memcached's w-th.
  EXPECT_EQ(s.destinations(), (std::vector<std::string>{"memcached", "memcached", "memcached",
                                                        "memcached", "redis", "redis", "log"}));
  expect_error(
      "agent: a\nserver: 127.0.0.1:7100\nsecret: 0123456789abcdef\nservices:\n"
      "  - { name: f, max_message_bytes: 100, client_queues: [ { destination: m, count: "
      "lots } ] }\n",
      "5:82", {"services[0].client_queues[0].count"});
  expect_error(
      "agent: a\nserver: 127.0.0.1:7100\nsecret: 0123456789abcdef\nservices:\n"
      "  - { name: f, queues: many, max_message_bytes: 100 }\n",
      "5:24", {"services[0].queues"});
}

TEST(AgentConfig, AutoQueuesStopAtWhatARegionHolds) {
  // Two per-queue destinations: each server queue brings two client queues, 1,024 in all.
  AgentConfig c = sized(
      "  - { name: f, max_message_bytes: 100,\n"
      "      client_queues: [ { destination: a, count: per_queue },\n"
      "                       { destination: b, count: per_queue } ] }\n",
      kCpu, "cpu: { workers: 1000 }\n");
  EXPECT_EQ(c.services[0].queues, 341u);
  EXPECT_EQ(c.services[0].client_queues.size(), 682u);
  // Given counts that overflow once per-queue ones are expanded are refused where they are.
  expect_error(
      "agent: a\nserver: 127.0.0.1:7100\nsecret: 0123456789abcdef\nservices:\n"
      "  - { name: f, queues: 600, max_message_bytes: 100,\n"
      "      client_queues: [ { destination: a, count: per_queue } ] }\n",
      "6:22", {"services[0].client_queues", "600 client queues and 600 server queues"});
}

// Workers that own server queues but no client queue are named, on either accelerator.
TEST(AgentConfig, WorkersWithoutAClientQueueAreWarnedAbout) {
  const auto config = [](const std::string& cpu, const std::string& clients) {
    return parse("agent: a\nserver: 127.0.0.1:7100\nsecret: 0123456789abcdef\n" + cpu +
                 "services:\n  - { name: face, queues: 4, max_message_bytes: 100, "
                 "client_queues: [" +
                 clients + "] }\n");
  };
  const std::string one = "{ destination: memcached }";
  const std::string two = one + ", " + one;
  std::vector<std::string> w =
      configuration_warnings(config("cpu: { workers: 2 }\n", one), AcceleratorKind::kCpu);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0],
            "service 'face': 2 CPU workers serve its 4 queue(s) but it has 1 client queue(s): "
            "worker(s) 1 to 1 own none, and their handlers' calls fail; give the service 2 "
            "client queues, or fewer workers");
  EXPECT_TRUE(
      configuration_warnings(config("cpu: { workers: 2 }\n", two), AcceleratorKind::kCpu).empty());
  // One worker, or no client queues at all: nothing to say.
  EXPECT_TRUE(configuration_warnings(config("", one), AcceleratorKind::kCpu).empty());
  // The GPU's default workers follow the client queues; explicit ones may not.
  EXPECT_TRUE(configuration_warnings(config("", one), AcceleratorKind::kGpu).empty());
  w = configuration_warnings(config("gpu: { workers: 8 }\n", two), AcceleratorKind::kGpu);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("4 GPU workers serve its 4 queue(s) but it has 2"), std::string::npos);
}

TEST(AgentConfig, WrongAcceleratorIsRefusedAtItsLine) {
  expect_error(with("accelerator: cpu", "accelerator: tpu"), "4:14",
               {"accelerator", "'tpu' is not one of: auto, cpu, gpu:N"});
  expect_error(with("accelerator: cpu", "accelerator: gpu:x"), "4:14", {"accelerator", "gpu:N"});
  // A well-formed GPU setting is refused for what it is: this agent has no GPU backend.
  expect_error(with("accelerator: cpu", "accelerator: gpu:0"), "4:14",
               {"accelerator", "gpu:0", "built without the CUDA accelerator"});
  EXPECT_FALSE(
      resolve_accelerator(AcceleratorSetting{AcceleratorKind::kGpu, 1}, make_backends(Nop{})).ok());
  // Without a check (what the parser alone knows), a well-formed gpu:N passes.
  EXPECT_EQ(parse_agent_config(config::load_yaml_text(
                                   with("accelerator: cpu", "accelerator: gpu:3"), "agent.yaml"))
                .accelerator.gpu,
            3u);
}

// An agent with a GPU backend, on a host with `devices` GPUs (the backend's functions are the
// runtime's only way to the GPU; starting is not exercised here).
HandlerBackends gpu_backends(int devices) {
  HandlerBackends b = make_backends(Nop{});
  GpuBackend g;
  g.device_count = [devices] { return devices; };
  b.gpu = g;
  return b;
}

TEST(AgentConfig, AutoPicksTheGpuWhenTheAgentHasTheBackendAndTheHostADevice) {
  const AcceleratorSetting automatic{AcceleratorKind::kAuto, 0};
  Result<AcceleratorChoice> gpu = resolve_accelerator(automatic, gpu_backends(2));
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->str(), "gpu:0");
  Result<AcceleratorChoice> none = resolve_accelerator(automatic, gpu_backends(0));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->str(), "cpu");
  Result<AcceleratorChoice> second =
      resolve_accelerator(AcceleratorSetting{AcceleratorKind::kGpu, 1}, gpu_backends(2));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->str(), "gpu:1");
  Status missing =
      check_accelerator_available(AcceleratorSetting{AcceleratorKind::kGpu, 2}, gpu_backends(2));
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("has 2 CUDA device(s) (gpu:0 to gpu:1)"), std::string::npos)
      << missing.message();
}

TEST(AgentConfig, GpuSettings) {
  const AgentConfig c = parse(with("reconnect_interval_ms: 50",
                                   "gpu: { workers: 4, block_threads: 256, burst: 8, busy_polls: "
                                   "100, idle_sleep_max_ns: 2000, stop_timeout_ms: 900 }"));
  EXPECT_EQ(c.gpu.workers, 4u);
  EXPECT_EQ(c.gpu.block_threads, 256u);
  EXPECT_EQ(c.gpu.burst, 8u);
  EXPECT_EQ(c.gpu.busy_polls, 100u);
  EXPECT_EQ(c.gpu.idle_sleep_max_ns, 2000u);
  EXPECT_EQ(c.gpu.stop_timeout_ms, 900u);
  expect_error(with("reconnect_interval_ms: 50", "gpu: { block_threads: 100 }"), "8:23",
               {"gpu.block_threads", "not a multiple of 32"});
  expect_error(with("reconnect_interval_ms: 50", "gpu: { idle_sleep_max_ns: 5000000 }"), "8:27",
               {"gpu.idle_sleep_max_ns"});
  expect_error(with("reconnect_interval_ms: 50", "gpu: { blocks: 2 }"), "8:8", {"blocks"});
}

TEST(AgentConfig, Transport) {
  EXPECT_EQ(parse(with("transport: shm", "transport: auto")).transport, TransportKind::kShm);
  expect_error(with("transport: shm", "transport: tcp"), "5:12",
               {"transport", "'tcp' is not one of: shm, auto, rdma"});
  expect_error(with("transport: shm", "transport: shm\nrdma: { bind_address: 192.0.2.1 }"), "6:7",
               {"rdma", "need 'transport: rdma'"});
  // A region in GPU memory is for rdma only: the key is named, and why.
  expect_error(with("transport: shm", "transport: shm\nrdma: { region_memory: gpu }"), "6:24",
               {"rdma.region_memory", "needs 'transport: rdma'", "host memory"});
}

#ifdef CARACAL_HAVE_RDMA
TEST(AgentConfig, RdmaSettings) {
  const AgentConfig c = parse(
      with("transport: shm",
           "transport: rdma\nrdma: { bind_address: 192.0.2.1, port: 7471, max_connections: 2 }"));
  EXPECT_EQ(c.transport, TransportKind::kRdma);
  EXPECT_EQ(c.rdma.bind_address, "192.0.2.1");
  EXPECT_EQ(c.rdma.port, 7471);
  EXPECT_EQ(c.rdma.max_connections, 2u);
  const AgentConfig d =
      parse(with("transport: shm", "transport: rdma\nrdma:\n  bind_address: 192.0.2.1"));
  EXPECT_EQ(d.rdma.port, 0);
  EXPECT_EQ(d.rdma.max_connections, 8u);

  expect_error(with("transport: shm", "transport: rdma"), "5:12",
               {"transport", "needs an 'rdma:' section"});
  expect_error(with("transport: shm", "transport: rdma\nrdma: { port: 1 }"), "6:7",
               {"rdma", "missing required setting 'bind_address'"});
  expect_error(with("transport: shm", "transport: rdma\nrdma: { bind_address: 0.0.0.0 }"), "6:23",
               {"rdma.bind_address", "an RDMA device"});
  expect_error(with("transport: shm",
                    "transport: rdma\nrdma:\n  bind_address: 192.0.2.1\n"
                    "  port: 65536"),
               "8:9", {"rdma.port"});
  expect_error(with("transport: shm",
                    "transport: rdma\nrdma:\n  bind_address: 192.0.2.1\n"
                    "  max_connections: 0"),
               "8:20", {"rdma.max_connections"});
  expect_error(with("transport: shm", "transport: rdma\nrdma: { bind_address: a, mtu: 4 }"), "6:26",
               {"mtu"});
}

// rdma.region_memory: host by default; gpu only with the GPU accelerator named (gpu:N), since
// nothing else can poll a region in GPU memory.
TEST(AgentConfig, RdmaRegionMemory) {
  EXPECT_EQ(parse(with("transport: shm", "transport: rdma\nrdma: { bind_address: 192.0.2.1 }"))
                .rdma.region_memory,
            RegionMemory::kHost);
  EXPECT_EQ(parse(with("transport: shm",
                       "transport: rdma\nrdma: { bind_address: 192.0.2.1, region_memory: host }"))
                .rdma.region_memory,
            RegionMemory::kHost);
  const std::string gpu_text =
      with("accelerator: cpu\ntransport: shm",
           "accelerator: gpu:1\ntransport: rdma\nrdma: { bind_address: 192.0.2.1, "
           "region_memory: gpu }");
  const AgentConfig g = parse_agent_config(
      config::load_yaml_text(gpu_text, "agent.yaml"),
      [](const AcceleratorSetting& a) { return check_accelerator_available(a, gpu_backends(2)); });
  EXPECT_EQ(g.rdma.region_memory, RegionMemory::kGpu);
  EXPECT_EQ(g.accelerator.kind, AcceleratorKind::kGpu);
  EXPECT_EQ(g.accelerator.gpu, 1u);

  expect_error(with("transport: shm",
                    "transport: rdma\nrdma: { bind_address: 192.0.2.1, region_memory: gpu }"),
               "6:49",
               {"rdma.region_memory", "only the GPU accelerator", "accelerator is 'cpu'", "gpu:N"});
  // auto may pick the CPU: the GPU must be named.
  expect_error(with("accelerator: cpu\ntransport: shm",
                    "transport: rdma\nrdma: { bind_address: 192.0.2.1, region_memory: gpu }"),
               "5:49", {"rdma.region_memory", "accelerator is 'auto'", "may pick the CPU"});
  expect_error(with("transport: shm",
                    "transport: rdma\nrdma: { bind_address: 192.0.2.1, region_memory: device }"),
               "6:49", {"rdma.region_memory", "'device' is not one of: host, gpu"});
}
#else
TEST(AgentConfig, RdmaTransportIsRefusedWithoutRdmaCore) {
  expect_error(with("transport: shm", "transport: rdma\nrdma: { bind_address: 192.0.2.1 }"), "5:12",
               {"transport", "built without rdma-core"});
}
#endif

TEST(AgentConfig, BadRingGeometryIsRefusedAtTheField) {
  expect_error(with("ring_capacity: 256", "ring_capacity: 100"), "12:20",
               {"services[0].ring_capacity", "not a power of two"});
  expect_error(with("slot_bytes: 256", "slot_bytes: 32"), "13:17",
               {"services[0].slot_bytes", "out of range"});
  // Each field fine alone, but 1024 bytes do not fit in half of a 4-slot ring of 256 bytes.
  expect_error(with("ring_capacity: 256", "ring_capacity: 4"), "14:24",
               {"services[0].max_message_bytes", "half the ring", "ring_capacity 4"});
  expect_error(with("max_message_bytes: 1024", "max_message_bytes: 0"), "14:24",
               {"services[0].max_message_bytes", "out of range"});
  expect_error(with("queues: 2", "queues: 0"), "11:13", {"services[0].queues", "out of range"});
}

TEST(AgentConfig, RxLines) {
  // auto (the default): on only for a GPU polling its region across PCIe.
  const ServiceConfig echo = parse(kValid).services[0];
  EXPECT_EQ(echo.rx_lines, Lines::kAuto);
  EXPECT_FALSE(echo.geometry().rx_lines);
  EXPECT_TRUE(echo.geometry(/*gpu_across_pcie=*/true).rx_lines);
  const ServiceConfig on = parse(with("queues: 2", "queues: 2\n    rx_lines: on")).services[0];
  EXPECT_EQ(on.rx_lines, Lines::kOn);
  EXPECT_TRUE(on.geometry().rx_lines);
  const ServiceConfig off = parse(with("queues: 2", "queues: 2\n    rx_lines: off")).services[0];
  EXPECT_FALSE(off.geometry(/*gpu_across_pcie=*/true).rx_lines);
  EXPECT_EQ(parse(with("queues: 2", "queues: 2\n    rx_lines: auto")).services[0].rx_lines,
            Lines::kAuto);
  expect_error(with("queues: 2", "queues: 2\n    rx_lines: sometimes"), "12:15",
               {"services[0].rx_lines", "'sometimes' is not a boolean"});
}

TEST(AgentConfig, TxLines) {
  // auto (the default): on only for a GPU writing its region across PCIe, over shm (the server
  // polls TX lines only where it reads the region in place).
  const ServiceConfig echo = parse(kValid).services[0];
  EXPECT_EQ(echo.tx_lines, Lines::kAuto);
  EXPECT_FALSE(echo.geometry().tx_lines);
  EXPECT_FALSE(echo.geometry(/*gpu_across_pcie=*/true, /*shm=*/false).tx_lines);
  EXPECT_FALSE(echo.geometry(/*gpu_across_pcie=*/false, /*shm=*/true).tx_lines);
  EXPECT_TRUE(echo.geometry(/*gpu_across_pcie=*/true, /*shm=*/true).tx_lines);
  const ServiceConfig on = parse(with("queues: 2", "queues: 2\n    tx_lines: on")).services[0];
  EXPECT_EQ(on.tx_lines, Lines::kOn);
  EXPECT_TRUE(on.geometry().tx_lines);
  EXPECT_FALSE(on.geometry().rx_lines);
  const ServiceConfig off = parse(with("queues: 2", "queues: 2\n    tx_lines: off")).services[0];
  EXPECT_FALSE(off.geometry(true, true).tx_lines);
  EXPECT_TRUE(off.geometry(true, true).rx_lines);
  expect_error(with("queues: 2", "queues: 2\n    tx_lines: 3"), "12:15",
               {"services[0].tx_lines", "'3' is not a boolean"});
}

TEST(AgentConfig, UnknownKeysAreRefused) {
  expect_error(with("log_level: debug", "log_levle: debug"), "6:1",
               {"unknown setting 'log_levle'", "log_level"});
  expect_error(with("queues: 2", "queue: 2"), "11:5", {"services[0]", "unknown setting 'queue'"});
  expect_error(with("{ destination: memcached }", "{ destination: memcached, port: 1 }"), "18:35",
               {"services[1].client_queues[0]", "unknown setting 'port'"});
  expect_error(with("burst: 16", "bursts: 16"), "7:34", {"cpu", "unknown setting 'bursts'"});
}

TEST(AgentConfig, SecretIsRequiredAndLongEnough) {
  expect_error(with("secret: change-me-0123456789\n", ""), "1:1",
               {"missing required setting 'secret' or 'secret_file'"});
  expect_error(with("secret: change-me-0123456789", "secret: short"), "3:9",
               {"secret", "at least 16 characters"});
  expect_error(
      with("secret: change-me-0123456789", "secret: change-me-0123456789\nsecret_file: /x"), "4:14",
      {"secret_file", "not both"});
  expect_error(with("secret: change-me-0123456789", "secret_file: /nonexistent/secret"), "3:14",
               {"secret_file", "cannot read secret file '/nonexistent/secret'"});
}

TEST(AgentConfig, SecretFileIsReadWithoutItsNewline) {
  char path[] = "/tmp/caracal-agent-secret-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  { std::ofstream(path) << "0123456789abcdefXYZ\n"; }
  EXPECT_EQ(parse(with("secret: change-me-0123456789", std::string("secret_file: ") + path)).secret,
            "0123456789abcdefXYZ");
  { std::ofstream(path) << "tooshort\n"; }
  expect_error(with("secret: change-me-0123456789", std::string("secret_file: ") + path), "3:14",
               {"secret_file", "at least 16 characters"});
  std::remove(path);
}

TEST(AgentConfig, ClientQueueNeedsADestination) {
  expect_error(with("destination: redis", "{}"), "19:9",
               {"services[1].client_queues[1]", "missing required setting 'destination'"});
  expect_error(with("destination: redis", "destination: 'red is'"), "19:22",
               {"services[1].client_queues[1].destination", "not a valid destination name"});
}

TEST(AgentConfig, NamesAndOtherSettings) {
  expect_error(with("agent: echo-1", "agent: 'echo 1'"), "1:8",
               {"agent", "not a valid agent name"});
  expect_error(with("agent: echo-1", "agent: " + std::string(65, 'a')), "1:8", {"agent"});
  expect_error(with("server: 127.0.0.1:7100", "server: localhost"), "2:9", {"server", "host:port"});
  expect_error(with("server: 127.0.0.1:7100", "server: 127.0.0.1:0"), "2:9",
               {"server", "cannot be 0"});
  expect_error(with("log_level: debug", "log_level: loud"), "6:12", {"log_level", "'loud'"});
  expect_error(with("name: kv", "name: echo"), "15:11", {"services[1].name", "duplicate"});
  expect_error(with("cpus: [0, 1]", "cpus: []"), "7:26", {"cpu.cpus", "empty"});
  expect_error(with("reconnect_interval_ms: 50", "reconnect_interval_ms: 0"), "8:24",
               {"reconnect_interval_ms", "out of range"});
  expect_error("agent: a\nserver: 127.0.0.1:1\nsecret: 0123456789abcdef\nservices: []\n", "4:11",
               {"services", "at least one service"});
  expect_error("agent: a\nserver: 127.0.0.1:1\nsecret: 0123456789abcdef\n", "1:1",
               {"missing required setting 'services'"});
}

TEST(AgentConfig, ShippedConfigIsValid) {
  const AgentConfig c = load_agent_config(CARACAL_CONFIGS_DIR "/echo-agent.yaml");
  EXPECT_EQ(c.server.port, 7100);
  ASSERT_EQ(c.services.size(), 1u);
  EXPECT_EQ(c.services[0].name, "echo");
  EXPECT_EQ(c.services[0].max_message_bytes, 1024u);
}

}  // namespace
}  // namespace caracal::agent
