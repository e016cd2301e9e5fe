// Flow control and shutdown of the CPU accelerator: backpressure from a full reply ring back to
// the SmartNIC's RX credits, stop() from the agent and the stop word raised by the SmartNIC.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/handler.hpp"
#include "snic_driver.hpp"

namespace caracal::accel::test {
namespace {

using mqueue::IndexArray;

struct Echo {
  void operator()(const Request& req, Response& resp, Context&) {
    std::memcpy(resp.data, req.data, req.size);
    resp.size = req.size;
  }
};

struct BatchEcho {
  static constexpr uint32_t kBatch = 8;
  void operator()(const Request* reqs, Response* resps, uint32_t count, Context&) {
    for (uint32_t i = 0; i < count; ++i) {
      std::memcpy(resps[i].data, reqs[i].data, reqs[i].size);
      resps[i].size = reqs[i].size;
    }
  }
};

std::string payload_of(uint32_t i) {
  return "request " + std::to_string(i);
}

// --- Backpressure ----------------------------------------------------------------------------

template <class H>
class BackpressureTest : public ::testing::Test {};
using EchoHandlers = ::testing::Types<Echo, BatchEcho>;
TYPED_TEST_SUITE(BackpressureTest, EchoHandlers);

TYPED_TEST(BackpressureTest, FullReplyRingStopsRequestsAndNothingIsLost) {
  constexpr uint32_t kCapacity = 8;
  constexpr uint32_t kTotal = 5 * kCapacity;
  mqueue::RegionGeometry g;
  g.slot_bytes = 64;
  g.ring_capacity = kCapacity;
  g.max_message_bytes = 64 - mqueue::kSlotHeaderBytes;  // every message one slot
  SnicDriver snic(g);
  CpuAccelerator<TypeParam> acc(snic.region(), TypeParam{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());
  auto ring_full_count = [&] { return acc.stats(0).reply_ring_full.load(); };

  // The SmartNIC pushes without reading a single reply: the accelerator answers kCapacity
  // requests into the TX ring, then kCapacity more wait in the RX ring.
  uint32_t pushed = 0;
  ASSERT_TRUE(wait_until([&] {
    while (pushed < 2 * kCapacity && snic.try_push(0, to_bytes(payload_of(pushed)), pushed)) {
      ++pushed;
    }
    snic.publish(0);
    return pushed == 2 * kCapacity;
  })) << "only "
      << pushed << " requests fit";

  // The accelerator stalls on the full TX ring and gives no RX credits back.
  ASSERT_TRUE(wait_until([&] {
    return ring_full_count() > 0 && snic.index(IndexArray::kTxTail, 0) == kCapacity &&
           snic.index(IndexArray::kRxHead, 0) == kCapacity;
  })) << "tx_tail "
      << snic.index(IndexArray::kTxTail, 0) << " rx_head " << snic.index(IndexArray::kRxHead, 0)
      << " reply_ring_full " << ring_full_count();
  // It keeps polling and keeps refusing: the counter moves on, the indexes do not.
  const uint64_t seen = ring_full_count();
  ASSERT_TRUE(wait_until([&] { return ring_full_count() >= seen + 100; }));
  EXPECT_EQ(snic.index(IndexArray::kTxTail, 0), kCapacity);
  EXPECT_EQ(snic.index(IndexArray::kRxHead, 0), kCapacity);
  EXPECT_EQ(acc.total_requests(), kCapacity);
  EXPECT_FALSE(snic.try_push(0, to_bytes(payload_of(pushed)), pushed)) << "RX credits came back";

  // The SmartNIC drains TX; everything completes, in order.
  std::vector<TxEntry> replies;
  ASSERT_TRUE(wait_until([&] {
    while (pushed < kTotal && snic.try_push(0, to_bytes(payload_of(pushed)), pushed))
      ++pushed;
    snic.publish(0);
    snic.poll_replies(replies);
    return replies.size() >= kTotal;
  })) << replies.size()
      << " replies of " << kTotal;
  stop_within(acc);
  ASSERT_EQ(replies.size(), kTotal);
  for (uint32_t i = 0; i < kTotal; ++i) {
    EXPECT_EQ(replies[i].token, i);
    EXPECT_EQ(replies[i].flags, 0);
    EXPECT_EQ(replies[i].text(), payload_of(i));
  }
  EXPECT_EQ(acc.total_requests(), kTotal);
}

// --- Stop ------------------------------------------------------------------------------------

mqueue::RegionGeometry stop_geometry(uint32_t server_queues) {
  mqueue::RegionGeometry g;
  g.server_queue_count = server_queues;
  g.slot_bytes = 128;
  g.ring_capacity = 32;
  g.max_message_bytes = 128 - mqueue::kSlotHeaderBytes;
  return g;
}

// One request per queue and its reply: the workers are up and polling.
void round_trip(SnicDriver& snic, uint32_t queues, uint32_t seq) {
  for (uint32_t q = 0; q < queues; ++q) {
    ASSERT_TRUE(snic.push(q, to_bytes("ping"), request_token(q, seq)));
  }
  std::vector<TxEntry> replies;
  ASSERT_TRUE(snic.collect_replies(queues, replies));
  for (const TxEntry& r : replies)
    EXPECT_EQ(r.text(), "ping");
}

TEST(StopTest, StopReturnsWithIdleWorkers) {
  const size_t baseline = baseline_thread_count();
  SnicDriver snic(stop_geometry(3));
  CpuAccelerator<Echo> acc(snic.region(), Echo{}, workers_options(3));
  ASSERT_TRUE(acc.start().ok());
  round_trip(snic, 3, 0);
  finish_within("CpuAccelerator::stop() with idle workers", [&] { acc.stop(); });
  EXPECT_TRUE(snic.region().stop_requested());
  EXPECT_TRUE(wait_until([&] { return thread_count() == baseline; }))
      << thread_count() << " threads, " << baseline << " before start";
  // Stopping again is harmless.
  stop_within(acc);
}

// Idle workers that never yield their core still see the stop word.
TEST(StopTest, StopReturnsWithSpinningWorkers) {
  SnicDriver snic(stop_geometry(2));
  CpuOptions options = workers_options(2);
  options.idle_rounds_before_yield = 0;
  CpuAccelerator<Echo> acc(snic.region(), Echo{}, options);
  ASSERT_TRUE(acc.start().ok());
  round_trip(snic, 2, 0);
  finish_within("CpuAccelerator::stop() with spinning workers", [&] { acc.stop(); });
}

TEST(StopTest, StopReturnsUnderLoadAndEveryServedRequestWasAnswered) {
  constexpr uint32_t kQueues = 4;
  const size_t baseline = baseline_thread_count();
  SnicDriver snic(stop_geometry(kQueues));
  CpuAccelerator<Echo> acc(snic.region(), Echo{}, workers_options(2));
  ASSERT_TRUE(acc.start().ok());

  // The SmartNIC keeps every queue full and reads replies until told to quit.
  std::atomic<bool> quit{false};
  std::atomic<uint64_t> answered{0};
  std::vector<uint32_t> sent(kQueues, 0);
  std::vector<std::vector<TxEntry>> replies(kQueues);
  std::thread load([&] {
    std::vector<TxEntry> batch;
    while (!quit.load(std::memory_order_acquire)) {
      for (uint32_t q = 0; q < kQueues; ++q) {
        while (snic.try_push(q, to_bytes(payload_of(sent[q])), request_token(q, sent[q]))) {
          ++sent[q];
        }
        snic.publish(q);
      }
      batch.clear();
      snic.poll_replies(batch);
      for (TxEntry& e : batch)
        replies[e.queue].push_back(std::move(e));
      answered.fetch_add(batch.size(), std::memory_order_release);
      std::this_thread::yield();
    }
  });
  const bool loaded = wait_until([&] { return answered.load() >= 2000; });
  finish_within("CpuAccelerator::stop() under load", [&] { acc.stop(); });
  quit.store(true, std::memory_order_release);
  load.join();
  ASSERT_TRUE(loaded) << "the load never got going: " << answered.load() << " replies";
  EXPECT_TRUE(wait_until([&] { return thread_count() == baseline; }));

  // Every request a worker took was answered and published before it returned.
  std::vector<TxEntry> rest;
  snic.poll_replies(rest);
  for (TxEntry& e : rest)
    replies[e.queue].push_back(std::move(e));
  uint64_t total = 0;
  for (uint32_t q = 0; q < kQueues; ++q) {
    SCOPED_TRACE("queue " + std::to_string(q));
    for (size_t i = 0; i < replies[q].size(); ++i) {
      ASSERT_EQ(replies[q][i].token, request_token(q, static_cast<uint32_t>(i)));
      ASSERT_EQ(replies[q][i].text(), payload_of(static_cast<uint32_t>(i)));
    }
    EXPECT_LE(replies[q].size(), sent[q]);
    // RX head: what the workers took. Each taken request has its reply.
    EXPECT_EQ(snic.index(IndexArray::kRxHead, q), replies[q].size());
    total += replies[q].size();
  }
  EXPECT_EQ(acc.total_requests(), total);
}

TEST(StopTest, StopWordFromTheSmartNicEndsWorkers) {
  const size_t baseline = baseline_thread_count();
  SnicDriver snic(stop_geometry(3));
  CpuAccelerator<BatchEcho> acc(snic.region(), BatchEcho{}, workers_options(2));
  ASSERT_TRUE(acc.start().ok());
  round_trip(snic, 3, 0);
  snic.request_stop();
  EXPECT_TRUE(snic.region().stop_requested());  // seen through the agent's own mapping
  finish_within("CpuAccelerator::join() after the SmartNIC raised the stop word",
                [&] { acc.join(); });
  EXPECT_TRUE(wait_until([&] { return thread_count() == baseline; }));
}

// stop() leaves the stop word raised; a second start() clears it and serves again, and the
// counters keep counting across the restart.
TEST(StopTest, StartAgainAfterStopServesAgain) {
  SnicDriver snic(stop_geometry(2));
  CpuAccelerator<Echo> acc(snic.region(), Echo{}, workers_options(2));
  EXPECT_EQ(acc.total_requests(), 0u);  // readable before start()
  ASSERT_TRUE(acc.start().ok());
  round_trip(snic, 2, 0);
  finish_within("first CpuAccelerator::stop()", [&] { acc.stop(); });
  ASSERT_TRUE(snic.region().stop_requested());
  ASSERT_TRUE(acc.start().ok());
  EXPECT_FALSE(snic.region().stop_requested());
  round_trip(snic, 2, 1);
  finish_within("second CpuAccelerator::stop()", [&] { acc.stop(); });
  EXPECT_EQ(acc.total_requests(), 4u);
}

}  // namespace
}  // namespace caracal::accel::test
