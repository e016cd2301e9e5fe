// The agent's path for `transport: rdma` with `rdma.region_memory: gpu`, as far as it runs on a
// machine with a GPU and no RDMA device: the GPU backend the agent gets from
// make_backends<Echo>() checks the device's GPUDirect RDMA attributes, creates the region in
// device memory, serves it from the persistent kernel and exports it as a dma-buf; a
// copy-engine driver stands in for the NIC (the way its RDMA WRITEs and READs arrive), and
// stopping is clean. Then the runtime itself, which stops where the RDMA device is missing.
// Skipped where no CUDA device is present.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "caracal/accel/gpu/copy_transport.hpp"
#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/agent/accelerator.hpp"
#include "caracal/agent/runtime.hpp"
#include "echo.hpp"
#include "fake_server.hpp"

namespace caracal::agent {
namespace {

using accel::test::PendingRequest;
using accel::test::TxEntry;

bool have_gpu() {
  return accel::gpu::device_count() > 0;
}

mqueue::RegionGeometry geometry() {
  mqueue::RegionGeometry g;
  g.server_queue_count = 2;
  g.slot_bytes = 128;
  g.ring_capacity = 64;
  g.max_message_bytes = 1024;  // up to 9 slots
  return g;
}

// The SmartNIC side over the GPU's copy engine, on the region the backend created.
class CopyEngineDriver : public accel::test::RemoteDriver<accel::gpu::CopyEngineTransport> {
 public:
  CopyEngineDriver(std::byte* device, uint64_t bytes) {
    Result<accel::gpu::CopyEngineTransport> t =
        accel::gpu::CopyEngineTransport::create(device, bytes);
    if (!t.ok()) throw std::runtime_error(t.status().message());
    transport_.emplace(std::move(t).value());
    Result<Remote> remote = Remote::attach(&*transport_);
    if (!remote.ok()) throw std::runtime_error("attach: " + remote.status().message());
    remote_.emplace(std::move(remote).value());
  }
};

TEST(GpuAgentDeviceRegion, BackendCreatesExportsServesAndStops) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const HandlerBackends backends = make_backends(examples::Echo{});
  ASSERT_TRUE(backends.gpu.has_value());
  const GpuBackend& gpu = *backends.gpu;

  // What the agent checks first. Whether this GPU passes depends on the machine; either way
  // the answer names the device.
  Result<std::string> caps = gpu.check_rdma_memory(0);
  std::cout << "gpu:0 rdma memory: "
            << (caps.ok() ? "usable: " + *caps : "refused: " + caps.status().message()) << "\n";
  if (!caps.ok()) EXPECT_NE(caps.status().message().find("gpu:0"), std::string::npos);

  const uint64_t epoch = 0x5eed'0000'0001ull;
  Result<std::unique_ptr<DeviceRegionServing>> started =
      gpu.start_in_device_memory(geometry(), epoch, 0, accel::GpuOptions{});
  ASSERT_TRUE(started.ok()) << started.status().message();
  DeviceRegionServing& serving = **started;
  EXPECT_EQ(serving.header().agent_epoch, epoch);
  EXPECT_EQ(serving.header().region_bytes, mqueue::compute_layout(geometry(), epoch).region_bytes);
  ASSERT_NE(serving.region(), nullptr);
  // The region is device memory, not a host mapping.
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, serving.region()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);

  // The dma-buf the exporter would register; where the device claims dma-buf support (the
  // capability check passed), the export must succeed.
  Result<int> fd = serving.export_dma_buf();
  if (fd.ok()) {
    ASSERT_GE(*fd, 0);
    EXPECT_NE(fcntl(*fd, F_GETFD), -1) << "not an open fd";
    std::error_code ec;  // what the fd is, for the log ("/dmabuf:" on Linux)
    const std::filesystem::path target =
        std::filesystem::read_symlink("/proc/self/fd/" + std::to_string(*fd), ec);
    std::cout << "dma-buf fd " << *fd << ": " << (ec ? ec.message() : target.string()) << "\n";
    EXPECT_EQ(close(*fd), 0);
  } else {
    std::cout << "dma-buf export refused: " << fd.status().message() << "\n";
    EXPECT_NE(fd.status().message().find("dma-buf"), std::string::npos) << fd.status().message();
    EXPECT_FALSE(caps.ok()) << "the capabilities say dma-buf, the export failed: "
                            << fd.status().message();
  }

  // The kernel serves the region while the copy engine writes and reads it.
  CopyEngineDriver driver(serving.region(), serving.header().region_bytes);
  EXPECT_EQ(driver.header().agent_epoch, epoch);
  std::vector<std::vector<PendingRequest>> requests(2);
  for (uint32_t q = 0; q < 2; ++q) {
    for (uint32_t i = 0; i < 500; ++i) {
      requests[q].push_back(
          PendingRequest{accel::test::to_bytes("q" + std::to_string(q) + " request " +
                                               std::to_string(i) + std::string(i % 900, 'x')),
                         accel::test::request_token(q, i)});
    }
  }
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(driver.exchange(requests, replies)) << "timed out";
  for (uint32_t q = 0; q < 2; ++q) {
    ASSERT_EQ(replies[q].size(), requests[q].size()) << "queue " << q;
    for (size_t i = 0; i < requests[q].size(); ++i) {
      ASSERT_EQ(replies[q][i].token, requests[q][i].token) << "queue " << q << " reply " << i;
      ASSERT_TRUE(replies[q][i].data == requests[q][i].payload) << "queue " << q << " reply " << i;
    }
  }
  EXPECT_TRUE(serving.health().ok()) << serving.health().message();
  const Status stopped = serving.stop();
  ASSERT_TRUE(stopped.ok()) << stopped.message();
  // The stop word went in by a copy; the driver reads it back from device memory.
  accel::gpu::CopyEngineTransport& t = driver.transport();
  const uint64_t stop_at = mqueue::stop_word_offset(driver.header());
  const Status read =
      mqueue::wait_for(t, t.post_read(stop_at, sizeof(uint32_t)), std::chrono::seconds(10));
  ASSERT_TRUE(read.ok()) << read.message();
  EXPECT_EQ(t.load_index(stop_at), 1u);
}

// The runtime on the same path, against a scripted control endpoint: it goes as far as this
// machine allows. Where the GPU lacks an attribute, the service fails at the check; otherwise
// the region is created, served and exported, and the failure is the missing RDMA device (the
// GPU machine has none). Either way nothing is announced and the agent says bye.
TEST(GpuAgentDeviceRegion, RuntimeGoesAsFarAsTheRdmaDevice) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
#ifndef CARACAL_HAVE_RDMA
  GTEST_SKIP() << "built without rdma-core: the agent has no rdma transport";
#else
  test::FakeControlServer server;
  AgentConfig c;
  c.agent = "gpu-region-test";
  c.server = config::HostPort{"127.0.0.1", server.port()};
  c.secret = "0123456789abcdef-secret";
  c.accelerator = AcceleratorSetting{AcceleratorKind::kGpu, 0};
  c.transport = TransportKind::kRdma;
  c.rdma.bind_address = "127.0.0.1";
  c.rdma.region_memory = RegionMemory::kGpu;
  ServiceConfig s;
  s.name = "echo";
  s.queues = 2;
  s.ring_capacity = 64;
  s.slot_bytes = 128;
  s.max_message_bytes = 1024;
  c.services.push_back(s);
  RuntimeOptions o;
  o.bye_timeout = std::chrono::milliseconds(5000);
  AgentRuntime runtime(c, make_backends(examples::Echo{}), o);
  Status status;
  std::thread agent([&] { status = runtime.run(); });
  // Stops and joins the agent on every way out of the test (bounded: a hang aborts).
  struct Join {
    AgentRuntime& runtime;
    std::thread& agent;
    ~Join() {
      if (!agent.joinable()) return;
      runtime.request_stop();
      accel::test::finish_within("AgentRuntime::run()", [&] { agent.join(); });
    }
  } join{runtime, agent};
  ASSERT_TRUE(server.accept_agent());
  const auto hello = server.expect<control::Hello>();
  EXPECT_EQ(hello.accelerator, "gpu:0");
  server.send(control::Welcome{50, 10000});
  server.expect<control::Bye>();  // no region announced before it
  server.send(control::Bye{});
  accel::test::finish_within("AgentRuntime::run()", [&] { agent.join(); });
  ASSERT_FALSE(status.ok());
  std::cout << "the agent stopped with: " << status.message() << "\n";
  const std::string& m = status.message();
  // Refused by the device's attributes, or everything up to the exporter done (the dma-buf
  // exported, or the driver's reason why not) and the exporter finding no RDMA device.
  const bool at_check =
      m.rfind("service 'echo': cannot place its region in GPU memory: gpu:0", 0) == 0;
  const bool at_rdma = m.rfind("service 'echo': rdma: ", 0) == 0;
  EXPECT_TRUE(at_check || at_rdma) << m;
#endif
}

}  // namespace
}  // namespace caracal::agent
