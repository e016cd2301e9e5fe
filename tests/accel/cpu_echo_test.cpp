// The CPU accelerator serving single-request handlers: echo of random sizes over several queues
// and worker counts, warp- and block-granular handlers, kMaxResponseBytes, no_reply().
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/handler.hpp"
#include "snic_driver.hpp"

namespace caracal::accel::test {
namespace {

using PendingRequest = SnicDriver::PendingRequest;

// Copies the request with a strided loop over the group, as a warp- or block-granular handler
// would; refuses a request the runtime handed it from a queue the token does not name.
struct Echo {
  void operator()(const Request& req, Response& resp, Context& ctx) {
    if (req.queue != token_queue(req.token)) {
      resp.set_error("request delivered on the wrong queue");
      return;
    }
    for (uint32_t i = ctx.group().rank(); i < req.size; i += ctx.group().size()) {
      resp.data[i] = req.data[i];
    }
    resp.size = req.size;
  }
};
static_assert(Handler<Echo>);
static_assert(granularity_of<Echo>() == Granularity::kThread);

// A geometry whose largest message spans 16 slots, so entries of random size exercise
// multi-slot entries and skip markers at the ring's end.
mqueue::RegionGeometry multi_slot_geometry(uint32_t server_queues) {
  mqueue::RegionGeometry g;
  g.server_queue_count = server_queues;
  g.slot_bytes = 64;
  g.ring_capacity = 64;
  g.max_message_bytes = 16 * 64 - mqueue::kSlotHeaderBytes;  // 1008
  return g;
}

// `per_queue` requests for each queue: the first ones at the edges (empty, largest, one slot
// exactly, one byte more), then random sizes, small ones as often as large ones.
std::vector<std::vector<PendingRequest>> random_workload(uint32_t queues, uint32_t per_queue,
                                                         uint32_t max_bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> small(0, 100);
  std::uniform_int_distribution<uint32_t> any(0, max_bytes);
  const uint32_t edges[] = {0, max_bytes, 64 - mqueue::kSlotHeaderBytes,
                            64 - mqueue::kSlotHeaderBytes + 1};
  std::vector<std::vector<PendingRequest>> out(queues);
  for (uint32_t q = 0; q < queues; ++q) {
    for (uint32_t i = 0; i < per_queue; ++i) {
      uint32_t size = i < std::size(edges) ? edges[i] : (rng() % 2 == 0 ? small(rng) : any(rng));
      if (i == per_queue - 1) size = max_bytes;  // and once more where the ring has wrapped
      out[q].push_back(PendingRequest{random_bytes(rng, size), request_token(q, i)});
    }
  }
  return out;
}

// Each queue's replies match its requests one for one, in order, transformed by `expect`.
template <class Expect>
void expect_replies(const std::vector<std::vector<PendingRequest>>& requests,
                    const std::vector<std::vector<TxEntry>>& replies, Expect expect) {
  ASSERT_EQ(replies.size(), requests.size());
  for (size_t q = 0; q < requests.size(); ++q) {
    ASSERT_EQ(replies[q].size(), requests[q].size()) << "queue " << q;
    for (size_t i = 0; i < requests[q].size(); ++i) {
      const TxEntry& r = replies[q][i];
      ASSERT_EQ(r.token, requests[q][i].token) << "queue " << q << " reply " << i;
      ASSERT_EQ(r.flags, 0) << "queue " << q << " reply " << i << ": " << r.text();
      ASSERT_EQ(r.data, expect(requests[q][i].payload)) << "queue " << q << " reply " << i;
    }
  }
}

std::vector<std::byte> same(const std::vector<std::byte>& b) {
  return b;
}
std::vector<std::byte> reversed(const std::vector<std::byte>& b) {
  return std::vector<std::byte>(b.rbegin(), b.rend());
}

class EchoTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(EchoTest, RandomSizesOverSeveralQueuesComeBackInOrder) {
  const uint32_t workers = GetParam();
  constexpr uint32_t kQueues = 5;
  constexpr uint32_t kPerQueue = 300;
  SnicDriver snic(multi_slot_geometry(kQueues));
  const uint32_t max_bytes = snic.header().max_message_bytes;
  const auto requests = random_workload(kQueues, kPerQueue, max_bytes, 1234 + workers);

  CpuAccelerator<Echo> acc(snic.region(), Echo{}, workers_options(workers));
  ASSERT_TRUE(acc.start().ok());
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies)) << "timed out waiting for replies";
  stop_within(acc);

  expect_replies(requests, replies, same);
  EXPECT_EQ(acc.total_requests(), uint64_t{kQueues} * kPerQueue);
  // Worker w serves the queues q with q % workers == w, and nothing else.
  for (uint32_t w = 0; w < workers; ++w) {
    uint64_t owned = 0;
    for (uint32_t q = w; q < kQueues; q += workers)
      owned += kPerQueue;
    EXPECT_EQ(acc.stats(w).requests.load(), owned) << "worker " << w;
  }
  EXPECT_EQ(sum_stat(acc, &WorkerStats::handler_errors), 0u);
  EXPECT_EQ(sum_stat(acc, &WorkerStats::corrupt_entries), 0u);
  // Nothing left over: every RX entry was consumed and every TX slot given back.
  for (uint32_t q = 0; q < kQueues; ++q) {
    EXPECT_EQ(snic.index(mqueue::IndexArray::kRxHead, q),
              snic.index(mqueue::IndexArray::kRxTail, q));
    EXPECT_EQ(snic.index(mqueue::IndexArray::kTxHead, q),
              snic.index(mqueue::IndexArray::kTxTail, q));
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, EchoTest, ::testing::Values(1u, 2u, 3u, 4u),
                         [](const auto& info) { return std::to_string(info.param) + "workers"; });

// More workers than queues: the spare workers own nothing and must not get in the way.
TEST(EchoTest, MoreWorkersThanQueues) {
  SnicDriver snic(multi_slot_geometry(2));
  const auto requests = random_workload(2, 40, snic.header().max_message_bytes, 99);
  CpuAccelerator<Echo> acc(snic.region(), Echo{}, workers_options(4));
  ASSERT_TRUE(acc.start().ok());
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies));
  stop_within(acc);
  expect_replies(requests, replies, same);
  EXPECT_EQ(acc.stats(2).requests.load(), 0u);
  EXPECT_EQ(acc.stats(3).requests.load(), 0u);
}

// --- Warp- and block-granular handlers --------------------------------------------------------

// Written for a group: each rank reverses its share of the bytes, then the leader sets the size.
// On the CPU the group is one thread, so the loops must cover everything with rank 0, size 1.
template <Granularity G>
struct GroupReverse {
  static constexpr Granularity kGranularity = G;
  void operator()(const Request& req, Response& resp, Context& ctx) {
    const Group& g = ctx.group();
    for (uint32_t i = g.rank(); i < req.size; i += g.size()) {
      resp.data[req.size - 1 - i] = req.data[i];
    }
    g.sync();
    if (g.leader()) resp.size = req.size;
  }
};

template <class H>
class GroupHandlerTest : public ::testing::Test {};
using GroupHandlers =
    ::testing::Types<GroupReverse<Granularity::kWarp>, GroupReverse<Granularity::kBlock>>;
TYPED_TEST_SUITE(GroupHandlerTest, GroupHandlers);

TYPED_TEST(GroupHandlerTest, StridedLoopsRunAsGroupOfOne) {
  static_assert(Handler<TypeParam>);
  static_assert(granularity_of<TypeParam>() != Granularity::kThread);
  SnicDriver snic(multi_slot_geometry(3));
  const auto requests = random_workload(3, 60, snic.header().max_message_bytes, 7);
  CpuAccelerator<TypeParam> acc(snic.region(), TypeParam{}, workers_options(2));
  ASSERT_TRUE(acc.start().ok());
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies));
  stop_within(acc);
  expect_replies(requests, replies, reversed);
}

// --- kMaxResponseBytes -----------------------------------------------------------------------

// Writes the capacity it was given, then fills the response to exactly that capacity.
template <uint32_t kMax>
struct FillToCapacity {
  static constexpr uint32_t kMaxResponseBytes = kMax;
  void operator()(const Request&, Response& resp, Context&) {
    std::memcpy(resp.data, &resp.capacity, sizeof(resp.capacity));
    std::memset(resp.data + sizeof(resp.capacity), 0xAB, resp.capacity - sizeof(resp.capacity));
    resp.size = resp.capacity;
  }
};

uint32_t reported_capacity(const TxEntry& e) {
  uint32_t c = 0;
  if (e.data.size() >= sizeof(c)) std::memcpy(&c, e.data.data(), sizeof(c));
  return c;
}

TEST(MaxResponseBytesTest, SmallerLimitIsTheResponseCapacity) {
  using H = FillToCapacity<40>;
  SnicDriver snic(multi_slot_geometry(1));
  ASSERT_EQ(max_response_of<H>(snic.header().max_message_bytes), 40u);
  constexpr uint32_t kRequests = 64;  // the whole RX ring: one slot each
  for (uint32_t i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(snic.try_push(0, to_bytes("x"), request_token(0, i)));
  }
  snic.publish(0);

  CpuAccelerator<H> acc(snic.region(), H{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());
  // The TX ring is not read yet. A 40-byte reply takes one slot, so the accelerator can answer
  // all 64 requests into the 64-slot TX ring; had it reserved max_message_bytes (16 slots) per
  // reply it would stall after 4.
  EXPECT_TRUE(wait_until([&] { return snic.index(mqueue::IndexArray::kRxHead, 0) == kRequests; }))
      << "RX head stuck at " << snic.index(mqueue::IndexArray::kRxHead, 0);
  std::vector<TxEntry> replies;
  ASSERT_TRUE(snic.collect_replies(kRequests, replies));
  stop_within(acc);
  ASSERT_EQ(replies.size(), kRequests);
  for (uint32_t i = 0; i < kRequests; ++i) {
    EXPECT_EQ(replies[i].token, request_token(0, i));
    EXPECT_EQ(replies[i].flags, 0);
    EXPECT_EQ(replies[i].data.size(), 40u);
    EXPECT_EQ(reported_capacity(replies[i]), 40u);
  }
}

TEST(MaxResponseBytesTest, LargerLimitIsClampedToMaxMessageBytes) {
  using H = FillToCapacity<100000>;
  SnicDriver snic(multi_slot_geometry(1));
  const uint32_t max_bytes = snic.header().max_message_bytes;
  CpuAccelerator<H> acc(snic.region(), H{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());
  for (uint32_t i = 0; i < 3; ++i)
    ASSERT_TRUE(snic.push(0, to_bytes("x"), request_token(0, i)));
  std::vector<TxEntry> replies;
  ASSERT_TRUE(snic.collect_replies(3, replies));
  stop_within(acc);
  for (const TxEntry& r : replies) {
    EXPECT_EQ(r.flags, 0);
    EXPECT_EQ(r.data.size(), max_bytes);
    EXPECT_EQ(reported_capacity(r), max_bytes);
  }
}

// --- no_reply() ------------------------------------------------------------------------------

struct SometimesQuiet {
  void operator()(const Request& req, Response& resp, Context&) {
    const std::string_view text(reinterpret_cast<const char*>(req.data), req.size);
    if (text.starts_with("quiet")) {
      resp.no_reply();
      return;
    }
    std::memcpy(resp.data, req.data, req.size);
    resp.size = req.size;
  }
};

TEST(NoReplyTest, TxEntryCarriesNoReplyFlag) {
  SnicDriver snic(multi_slot_geometry(2));
  std::vector<std::vector<PendingRequest>> requests(2);
  for (uint32_t q = 0; q < 2; ++q) {
    for (uint32_t i = 0; i < 30; ++i) {
      const std::string text = (i % 3 == 1 ? "quiet " : "loud ") + std::to_string(i);
      requests[q].push_back(PendingRequest{to_bytes(text), request_token(q, i)});
    }
  }
  CpuAccelerator<SometimesQuiet> acc(snic.region(), SometimesQuiet{}, workers_options(2));
  ASSERT_TRUE(acc.start().ok());
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies));
  stop_within(acc);
  for (uint32_t q = 0; q < 2; ++q) {
    ASSERT_EQ(replies[q].size(), requests[q].size());
    for (size_t i = 0; i < replies[q].size(); ++i) {
      const TxEntry& r = replies[q][i];
      EXPECT_EQ(r.token, requests[q][i].token);
      if (i % 3 == 1) {
        EXPECT_EQ(r.flags, mqueue::kSlotNoReply) << "reply " << i;
        EXPECT_TRUE(r.data.empty());
      } else {
        EXPECT_EQ(r.flags, 0) << "reply " << i;
        EXPECT_EQ(r.data, requests[q][i].payload);
      }
    }
  }
  EXPECT_EQ(sum_stat(acc, &WorkerStats::handler_errors), 0u);
}

}  // namespace
}  // namespace caracal::accel::test
