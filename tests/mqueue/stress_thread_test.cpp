// Stress across threads: the test thread is the SmartNIC (RemoteRingProducer into RX,
// RemoteRingConsumer out of TX, over ShmTransport), a second thread is the accelerator
// (RingConsumer RX -> RingProducer TX echo). See stress_protocol.hpp for the traffic and checks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "stress_protocol.hpp"
#include "test_support.hpp"

namespace caracal::mqueue {
namespace {

struct StressCase {
  const char* name;
  RegionGeometry geometry;
};

void PrintTo(const StressCase& c, std::ostream* os) {
  *os << c.name;
}

class ThreadStressTest : public ::testing::TestWithParam<StressCase> {};

INSTANTIATE_TEST_SUITE_P(
    Geometries, ThreadStressTest,
    ::testing::Values(
        // Many small slots: long multi-slot entries and frequent skips.
        StressCase{"SmallSlots", stress::stress_geometry()},
        // Messages of exactly half the ring, the largest validate_geometry allows: the worst
        // case for skips (see RingLiveness).
        StressCase{"HalfRingMessages", RegionGeometry{2, 1, 128, 16, 8 * 128 - kSlotHeaderBytes}},
        // The same small slots with RX lines: the accelerator finds entries through the lines
        // (short ones inline, long ones and skips announced there), never through the tail.
        StressCase{"SmallSlotsRxLines",
                   [] {
                     RegionGeometry g = stress::stress_geometry();
                     g.rx_lines = true;
                     return g;
                   }()},
        // With TX lines as well: the SmartNIC takes short replies from their lines (where the
        // accelerator wrote one) or by the tail, whichever it meets first.
        StressCase{"SmallSlotsRxAndTxLines",
                   [] {
                     RegionGeometry g = stress::stress_geometry();
                     g.rx_lines = true;
                     g.tx_lines = true;
                     return g;
                   }()}),
    [](const ::testing::TestParamInfo<StressCase>& info) { return info.param.name; });

TEST_P(ThreadStressTest, EchoWithoutLossDuplicationOrReordering) {
  const RegionGeometry& g = GetParam().geometry;
  Result<ShmMapping> mapping = create_shm_region(g, 1, "caracal-thread-stress");
  ASSERT_TRUE(mapping.ok()) << mapping.status().message();
  // Both sides use the same mapping, so ThreadSanitizer sees every access at one address and
  // can check the acquire/release pairs; shm_test covers two mappings of one memfd.
  ShmTransport transport(mapping->data(), mapping->size());
  Result<RemoteRegion<ShmTransport>> remote = RemoteRegion<ShmTransport>::attach(&transport);
  ASSERT_TRUE(remote.ok()) << remote.status().message();
  const RegionView view(mapping->data());

  const uint64_t total = test::stress_messages();
  const std::vector<uint64_t> expected =
      stress::split_messages(total, g.server_queue_count + g.client_queue_count);
  const auto started = stress::Clock::now();
  const auto deadline = started + std::chrono::seconds(test::stress_timeout_s());

  std::string accelerator_error;
  std::atomic<bool> accelerator_done{false};
  std::thread accelerator([&] {
    accelerator_error = stress::run_echo_accelerator(view, expected, deadline);
    // Pairs with the acquire in peer_running: the SmartNIC's last pass sees every publish.
    accelerator_done.store(true, std::memory_order_release);
  });
  const std::string smartnic_error = stress::run_smartnic(*remote, expected, deadline, [&] {
    return !accelerator_done.load(std::memory_order_acquire);
  });
  if (!smartnic_error.empty()) view.request_stop();  // let the accelerator give up at once
  accelerator.join();

  const double seconds = std::chrono::duration<double>(stress::Clock::now() - started).count();
  EXPECT_EQ(accelerator_error, "");
  EXPECT_EQ(smartnic_error, "");
  RecordProperty("messages", std::to_string(total));
  RecordProperty("seconds", std::to_string(seconds));
  std::printf("[ stress   ] %llu messages over %zu queues in %.2f s\n",
              static_cast<unsigned long long>(total), expected.size(), seconds);
}

}  // namespace
}  // namespace caracal::mqueue
