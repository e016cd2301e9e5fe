// The CPU accelerator serving batched handlers (kBatch > 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/handler.hpp"
#include "snic_driver.hpp"

namespace caracal::accel::test {
namespace {

using PendingRequest = SnicDriver::PendingRequest;

// The batch sizes a handler saw, across all its per-worker copies.
struct BatchLog {
  std::mutex mu;
  std::vector<uint32_t> sizes;
  bool mixed_queues = false;

  void record(const Request* reqs, uint32_t count) {
    std::lock_guard<std::mutex> lock(mu);
    sizes.push_back(count);
    for (uint32_t i = 1; i < count; ++i)
      mixed_queues |= reqs[i].queue != reqs[0].queue;
  }
  uint32_t largest() {
    std::lock_guard<std::mutex> lock(mu);
    return sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  }
  size_t batches_over(uint32_t n) {
    std::lock_guard<std::mutex> lock(mu);
    return std::count_if(sizes.begin(), sizes.end(), [n](uint32_t s) { return s > n; });
  }
  uint64_t total() {
    std::lock_guard<std::mutex> lock(mu);
    uint64_t t = 0;
    for (uint32_t s : sizes)
      t += s;
    return t;
  }
};

// Adds one to every byte of each request.
struct BatchIncrement {
  static constexpr uint32_t kBatch = 8;
  std::shared_ptr<BatchLog> log;

  void operator()(const Request* reqs, Response* resps, uint32_t count, Context&) {
    log->record(reqs, count);
    for (uint32_t i = 0; i < count; ++i) {
      for (uint32_t b = 0; b < reqs[i].size; ++b) {
        resps[i].data[b] = static_cast<std::byte>(static_cast<uint8_t>(reqs[i].data[b]) + 1);
      }
      resps[i].size = reqs[i].size;
    }
  }
};
static_assert(Handler<BatchIncrement>);
static_assert(batch_of<BatchIncrement>() == 8);

std::vector<std::byte> incremented(const std::vector<std::byte>& b) {
  std::vector<std::byte> out(b);
  for (std::byte& x : out)
    x = static_cast<std::byte>(static_cast<uint8_t>(x) + 1);
  return out;
}

// Replies of up to 4 slots in 64-slot rings: room for a full batch of 8 and then some.
mqueue::RegionGeometry batch_geometry(uint32_t server_queues) {
  mqueue::RegionGeometry g;
  g.server_queue_count = server_queues;
  g.slot_bytes = 64;
  g.ring_capacity = 64;
  g.max_message_bytes = 4 * 64 - mqueue::kSlotHeaderBytes;  // 240
  return g;
}

class BatchTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(BatchTest, QueuedRequestsAreBatchedAndAnsweredInOrder) {
  const uint32_t workers = GetParam();
  constexpr uint32_t kQueues = 3;
  constexpr uint32_t kQueuedBeforeStart = 40;  // one slot each: fits the 64-slot RX ring
  constexpr uint32_t kPerQueue = 200;
  SnicDriver snic(batch_geometry(kQueues));
  const uint32_t max_bytes = snic.header().max_message_bytes;

  std::mt19937 rng(42 + workers);
  std::uniform_int_distribution<uint32_t> any(0, max_bytes);
  std::vector<std::vector<PendingRequest>> requests(kQueues);
  for (uint32_t q = 0; q < kQueues; ++q) {
    for (uint32_t i = 0; i < kPerQueue; ++i) {
      const uint32_t size =
          i < kQueuedBeforeStart ? i % 40 : (i == kPerQueue - 1 ? max_bytes : any(rng));
      requests[q].push_back(PendingRequest{random_bytes(rng, size), request_token(q, i)});
    }
  }
  // Queue the first requests of every queue before the workers exist.
  for (uint32_t q = 0; q < kQueues; ++q) {
    for (uint32_t i = 0; i < kQueuedBeforeStart; ++i) {
      ASSERT_TRUE(snic.try_push(q, requests[q][i].payload, requests[q][i].token));
    }
    snic.publish(q);
  }

  auto log = std::make_shared<BatchLog>();
  CpuAccelerator<BatchIncrement> acc(snic.region(), BatchIncrement{log}, workers_options(workers));
  ASSERT_TRUE(acc.start().ok());
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies, kQueuedBeforeStart)) << "timed out";
  stop_within(acc);

  for (uint32_t q = 0; q < kQueues; ++q) {
    ASSERT_EQ(replies[q].size(), kPerQueue) << "queue " << q;
    for (uint32_t i = 0; i < kPerQueue; ++i) {
      const TxEntry& r = replies[q][i];
      ASSERT_EQ(r.token, requests[q][i].token) << "queue " << q << " reply " << i;
      ASSERT_EQ(r.flags, 0) << "queue " << q << " reply " << i << ": " << r.text();
      ASSERT_EQ(r.data, incremented(requests[q][i].payload)) << "queue " << q << " reply " << i;
    }
  }
  EXPECT_LE(log->largest(), 8u);
  EXPECT_GT(log->batches_over(1), 0u) << "40 queued requests per queue were never batched";
  EXPECT_FALSE(log->mixed_queues) << "a batch held requests of more than one queue";
  EXPECT_EQ(log->total(), uint64_t{kQueues} * kPerQueue);
  EXPECT_EQ(acc.total_requests(), uint64_t{kQueues} * kPerQueue);
}

INSTANTIATE_TEST_SUITE_P(Workers, BatchTest, ::testing::Values(1u, 3u),
                         [](const auto& info) { return std::to_string(info.param) + "workers"; });

// A batched handler with a small kMaxResponseBytes: every response of a batch gets that
// capacity, and replies take only the slots they need.
struct BatchCapacity {
  static constexpr uint32_t kBatch = 4;
  static constexpr uint32_t kMaxResponseBytes = 40;
  void operator()(const Request*, Response* resps, uint32_t count, Context&) {
    for (uint32_t i = 0; i < count; ++i) {
      std::memcpy(resps[i].data, &resps[i].capacity, sizeof(uint32_t));
      std::memset(resps[i].data + 4, 0x5A, resps[i].capacity - 4);
      resps[i].size = resps[i].capacity;
    }
  }
};

TEST(BatchTest, MaxResponseBytesIsEachResponseCapacity) {
  SnicDriver snic(batch_geometry(1));
  constexpr uint32_t kRequests = 64;
  for (uint32_t i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(snic.try_push(0, to_bytes("abc"), request_token(0, i)));
  }
  snic.publish(0);
  CpuAccelerator<BatchCapacity> acc(snic.region(), BatchCapacity{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());
  // Replies of 40 bytes take one slot each: all 64 fit the TX ring before the SmartNIC reads
  // any, which a reservation of max_message_bytes (4 slots) per reply would not allow.
  EXPECT_TRUE(wait_until([&] { return snic.index(mqueue::IndexArray::kRxHead, 0) == kRequests; }))
      << "RX head stuck at " << snic.index(mqueue::IndexArray::kRxHead, 0);
  std::vector<TxEntry> replies;
  ASSERT_TRUE(snic.collect_replies(kRequests, replies));
  stop_within(acc);
  for (uint32_t i = 0; i < kRequests; ++i) {
    EXPECT_EQ(replies[i].token, request_token(0, i));
    ASSERT_EQ(replies[i].data.size(), 40u);
    uint32_t capacity = 0;
    std::memcpy(&capacity, replies[i].data.data(), sizeof(capacity));
    EXPECT_EQ(capacity, 40u);
  }
}

}  // namespace
}  // namespace caracal::accel::test
