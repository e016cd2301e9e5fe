// A handler with state on the GPU accelerator (setup.hpp): the runtime runs its setup with the
// GPU chosen, the table goes into device memory (SetupContext::upload), the persistent
// kernel's threads read it through the view each copies and count what they served in device
// memory with atomics, and the teardown reads the counts back after the kernel has stopped.
// Skipped where no CUDA device is present.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/agent/runtime.hpp"
#include "caracal/agent/setup.hpp"
#include "caracal/mqueue/platform.hpp"
#include "fake_server.hpp"

namespace caracal::agent {
namespace {

using test::FakeControlServer;
using test::RegionPeer;

struct DeviceLookup {
  const uint32_t* table = nullptr;
  uint32_t rows = 0;
  uint64_t* served = nullptr;  // one counter shared by every thread of the kernel

  CARACAL_HOST_DEVICE void operator()(const accel::Request& req, accel::Response& resp,
                                      accel::Context&) const {
    if (req.size != 4) return resp.set_error("a row is 4 bytes");
    uint32_t row = 0;
    for (uint32_t i = 0; i < 4; ++i)
      row |= static_cast<uint32_t>(static_cast<uint8_t>(req.data[i])) << (8 * i);
    if (row >= rows) return resp.set_error("no such row");
    const uint32_t v = table[row];
    for (uint32_t i = 0; i < 4; ++i)
      resp.data[i] = static_cast<std::byte>(v >> (8 * i));
    resp.size = 4;
    mqueue::SystemAtomicRef<uint64_t>(*served).fetch_add(1, mqueue::mo::memory_order_relaxed);
  }
};

struct Seen {
  std::mutex m;
  std::string accelerator;
  bool on_gpu = false;
  uint64_t served_at_teardown = 0;
  int teardowns = 0;
};
Seen& seen() {
  static Seen s;
  return s;
}

class DeviceTable {
 public:
  static DeviceTable setup(SetupContext& ctx) {
    std::vector<uint32_t> rows(256);
    for (uint32_t r = 0; r < rows.size(); ++r)
      rows[r] = r * 7 + 1;
    DeviceTable t;
    t.view_.table = ctx.upload(rows, "table");
    t.view_.rows = static_cast<uint32_t>(rows.size());
    t.view_.served = ctx.allocate<uint64_t>(1, "served counter");
    // The memory is the device's: the host cannot read it in place.
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, t.view_.table) != cudaSuccess ||
        attributes.type != cudaMemoryTypeDevice) {
      throw SetupError("the table is not in device memory");
    }
    std::lock_guard lock(seen().m);
    seen().accelerator = ctx.accelerator().str();
    seen().on_gpu = ctx.on_gpu();
    return t;
  }
  DeviceLookup handler() const { return view_; }
  void teardown(SetupContext& ctx) {
    uint64_t served = 0;
    ctx.copy_to_host(std::span<uint64_t>(&served, 1), view_.served, "served counter");
    std::lock_guard lock(seen().m);
    seen().served_at_teardown = served;
    ++seen().teardowns;
  }

 private:
  DeviceLookup view_;
};
static_assert(StatefulHandler<DeviceTable>);

TEST(GpuHandlerState, ATableInDeviceMemoryIsReadByTheKernelAndTornDownAfterIt) {
  if (accel::gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  FakeControlServer server;
  AgentConfig c;
  c.agent = "gpu-state-test";
  c.server = config::HostPort{"127.0.0.1", server.port()};
  c.secret = "0123456789abcdef-secret";
  c.accelerator = AcceleratorSetting{AcceleratorKind::kGpu, 0};
  c.reconnect_interval_ms = 20;
  ServiceConfig s;
  s.name = "table";
  s.queues = 2;
  s.ring_capacity = 64;
  s.slot_bytes = 128;
  s.max_message_bytes = 256;
  c.services.push_back(s);
  HandlerBackends b = make_stateful_backends<DeviceTable>();
  configure_services(c, b, {});
  RuntimeOptions o;
  o.bye_timeout = std::chrono::milliseconds(5000);
  AgentRuntime runtime(c, std::move(b), o);
  Status status;
  std::thread thread([&] { status = runtime.run(); });

  ASSERT_TRUE(server.accept_agent());
  server.expect<control::Hello>();
  server.send(control::Welcome{50, 10000});
  const auto region = server.expect<control::RegionAnnounce>();
  RegionPeer peer(region.shm_name);
  server.send(control::Attached{region.service});

  std::vector<std::vector<std::byte>> requests;
  for (uint32_t i = 0; i < 500; ++i) {
    const uint32_t row = (i * 13) % 256;
    std::vector<std::byte> p(4);
    std::memcpy(p.data(), &row, 4);
    requests.push_back(std::move(p));
  }
  const auto replies = peer.exchange(requests);
  ASSERT_EQ(replies.size(), requests.size());
  for (const auto& [token, reply] : replies) {
    uint32_t row = 0;
    uint32_t got = 0;
    std::memcpy(&row, requests[token].data(), 4);
    ASSERT_EQ(reply.data.size(), 4u) << "token " << token;
    std::memcpy(&got, reply.data.data(), 4);
    EXPECT_EQ(got, row * 7 + 1) << "token " << token;
  }

  runtime.request_stop();
  server.expect<control::Bye>();
  server.send(control::Bye{});
  accel::test::finish_within("AgentRuntime::run()", [&] { thread.join(); });
  EXPECT_TRUE(status.ok()) << status.message();
  std::lock_guard lock(seen().m);
  EXPECT_EQ(seen().accelerator, "gpu:0");
  EXPECT_TRUE(seen().on_gpu);
  EXPECT_EQ(seen().teardowns, 1);
  EXPECT_EQ(seen().served_at_teardown, 500u);
}

}  // namespace
}  // namespace caracal::agent
