// The echo example served the way the agent serves it: a named region from NamedShmRegion, the
// handler started through make_backends<Echo>() (what agent_main uses), and the server's side
// opening the region by name and driving it through RemoteRegion<ShmTransport>.
#include <gtest/gtest.h>
#include <unistd.h>

#include <random>

#include "caracal/agent/accelerator.hpp"
#include "caracal/agent/shm_region.hpp"
#include "echo.hpp"
#include "fake_server.hpp"

namespace caracal::agent {
namespace {

using examples::Echo;
static_assert(accel::Handler<Echo>);

struct Case {
  uint32_t queues;
  uint32_t workers;
  uint32_t slot_bytes;
  uint32_t ring_capacity;
  uint32_t max_message_bytes;
  bool rx_lines = false;
  bool tx_lines = false;
};

void echo_every_size(const Case& c) {
  mqueue::RegionGeometry g;
  g.server_queue_count = c.queues;
  g.slot_bytes = c.slot_bytes;
  g.ring_capacity = c.ring_capacity;
  g.max_message_bytes = c.max_message_bytes;
  g.rx_lines = c.rx_lines;
  g.tx_lines = c.tx_lines;
  const std::string name = region_shm_name("echo-test", getpid(), "echo");
  Result<NamedShmRegion> region = NamedShmRegion::create(name, g, fresh_epoch());
  ASSERT_TRUE(region.ok()) << region.status().message();

  accel::CpuOptions options;
  options.workers = c.workers;
  StartResult serving = make_backends(Echo{}).cpu(region->view(), options);
  ASSERT_TRUE(serving.ok()) << serving.status().message();

  test::RegionPeer peer(name);
  ASSERT_TRUE(region->unlink().ok());  // as after `attached`

  // Every size from empty to the largest message, then random ones.
  std::mt19937 rng(c.queues * 7919 + c.max_message_bytes);
  std::vector<std::vector<std::byte>> payloads;
  for (uint32_t n = 0; n <= c.max_message_bytes; ++n)
    payloads.push_back(accel::test::random_bytes(rng, n));
  for (int i = 0; i < 500; ++i)
    payloads.push_back(accel::test::random_bytes(rng, rng() % (c.max_message_bytes + 1)));

  const auto replies = peer.exchange(payloads);
  ASSERT_EQ(replies.size(), payloads.size());
  for (const auto& [token, reply] : replies) {
    ASSERT_LT(token, payloads.size());
    EXPECT_EQ(reply.flags, 0u) << "token " << token << ": " << reply.text();
    EXPECT_EQ(reply.queue, token % c.queues);
    ASSERT_EQ(reply.data, payloads[token]) << "token " << token;
  }
  // The CPU workers announce every reply that fits in a line; the peer takes whichever of line
  // and tail it meets first, so with TX lines some replies come by line (all of them may not).
  if (c.tx_lines) {
    EXPECT_GT(peer.replies_by_line(), 0u);
  } else {
    EXPECT_EQ(peer.replies_by_line(), 0u);
  }
  accel::test::finish_within("ServingAccelerator::stop()",
                             [&] { EXPECT_TRUE((*serving)->stop().ok()); });
  EXPECT_EQ(peer.stop_word(), 1u);  // what the runtime raised, seen through the server's mapping
}

TEST(AgentEcho, OneQueueOneWorker) {
  echo_every_size({1, 1, 256, 256, 1024});
}

TEST(AgentEcho, ShippedGeometryTwoQueues) {
  echo_every_size({2, 1, 256, 256, 1024});  // configs/echo-agent.yaml
}

TEST(AgentEcho, MultiSlotMessagesTwoWorkers) {
  echo_every_size({3, 2, 64, 32, 16 * 64 - mqueue::kSlotHeaderBytes});
}

// The CPU workers find requests through RX lines: short ones inline, long ones in the slots.
TEST(AgentEcho, RxLinesTwoWorkers) {
  echo_every_size({3, 2, 64, 32, 16 * 64 - mqueue::kSlotHeaderBytes, /*rx_lines=*/true});
}

// The CPU workers announce short replies in TX lines too; the peer takes them from there.
TEST(AgentEcho, RxAndTxLinesTwoWorkers) {
  echo_every_size(
      {3, 2, 64, 32, 16 * 64 - mqueue::kSlotHeaderBytes, /*rx_lines=*/true, /*tx_lines=*/true});
}

}  // namespace
}  // namespace caracal::agent
