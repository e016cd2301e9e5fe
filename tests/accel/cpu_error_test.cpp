// Failures the CPU accelerator contains: handlers that throw or overrun their response buffer
// (an error reply, and the worker goes on), handlers that fault (that worker stops, and the
// accelerator reports it), and corrupt RX entries (that queue stops, the others go on).
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/handler.hpp"
#include "snic_driver.hpp"

namespace caracal::accel::test {
namespace {

using PendingRequest = SnicDriver::PendingRequest;

mqueue::RegionGeometry small_geometry(uint32_t server_queues) {
  mqueue::RegionGeometry g;
  g.server_queue_count = server_queues;
  g.slot_bytes = 64;
  g.ring_capacity = 64;
  g.max_message_bytes = 2 * 64 - mqueue::kSlotHeaderBytes;  // 112
  return g;
}

std::string_view request_text(const Request& req) {
  return std::string_view(reinterpret_cast<const char*>(req.data), req.size);
}

// Echoes, except on command: "throw:<why>" throws a std::runtime_error, "throw-int" throws
// something that is not a std::exception, "overrun" claims one byte more than the capacity,
// "fault" calls fault().
void misbehave_or_echo(const Request& req, Response& resp) {
  const std::string_view text = request_text(req);
  if (text == "fault") fault("asked to");
  if (text.starts_with("throw:")) throw std::runtime_error("boom " + std::string(text.substr(6)));
  if (text == "throw-int") throw 42;
  if (text == "overrun") {
    resp.size = resp.capacity + 1;
    return;
  }
  std::memcpy(resp.data, req.data, req.size);
  resp.size = req.size;
}

struct Faulty {
  void operator()(const Request& req, Response& resp, Context&) { misbehave_or_echo(req, resp); }
};

// The same, batched: a throw fails the whole batch.
struct BatchFaulty {
  static constexpr uint32_t kBatch = 4;
  void operator()(const Request* reqs, Response* resps, uint32_t count, Context&) {
    for (uint32_t i = 0; i < count; ++i)
      misbehave_or_echo(reqs[i], resps[i]);
  }
};

// What a request should come back as. An exception's text is not the client's to read: the
// reply says only that the handler failed, the worker's note (for the agent's log) says why.
void expect_reply(const TxEntry& r, const std::string& request, uint32_t capacity,
                  const WorkerStats* stats = nullptr) {
  if (request.starts_with("throw")) {
    EXPECT_TRUE(r.is_error()) << request;
    EXPECT_EQ(r.text(), kHandlerFailedReply);
    if (stats != nullptr) {
      const std::string why = stats->last_error.get();
      if (request == "throw-int") {
        EXPECT_NE(why.find("not a std::exception"), std::string::npos) << why;
      } else {
        EXPECT_TRUE(why.ends_with(": boom " + request.substr(6))) << why;
      }
    }
  } else if (request == "overrun") {
    EXPECT_TRUE(r.is_error()) << request;
    // The text says what went wrong in numbers a handler author can act on.
    EXPECT_NE(r.text().find(std::to_string(capacity)), std::string::npos) << r.text();
  } else {
    EXPECT_EQ(r.flags, 0) << request << ": " << r.text();
    EXPECT_EQ(r.text(), request);
  }
}

template <class H>
class HandlerErrorTest : public ::testing::Test {};
using FaultyHandlers = ::testing::Types<Faulty, BatchFaulty>;
TYPED_TEST_SUITE(HandlerErrorTest, FaultyHandlers);

// Each bad request goes alone (its reply awaited before the next request), so a failing batch
// holds only the request that fails it and the count of errors is exact.
TYPED_TEST(HandlerErrorTest, ErrorRepliesAndTheWorkerGoesOn) {
  SnicDriver snic(small_geometry(2));
  const uint32_t capacity = snic.header().max_message_bytes;
  CpuAccelerator<TypeParam> acc(snic.region(), TypeParam{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());

  const std::vector<std::string> script = {
      "hello",     "throw:first", "after first",  "overrun", "after overrun",
      "throw-int", "after int",   "throw:second", "ok 1",    "ok 2"};
  uint64_t bad = 0;
  uint32_t seq = 0;
  for (const std::string& text : script) {
    for (uint32_t q = 0; q < 2; ++q) {
      SCOPED_TRACE(text + " on queue " + std::to_string(q));
      ASSERT_TRUE(snic.push(q, to_bytes(text), request_token(q, seq)));
      std::vector<TxEntry> replies;
      ASSERT_TRUE(snic.collect_replies(1, replies));
      ASSERT_EQ(replies.size(), 1u);
      EXPECT_EQ(replies[0].queue, q);
      EXPECT_EQ(replies[0].token, request_token(q, seq));
      expect_reply(replies[0], text, capacity, &acc.stats(0));
      if (text.starts_with("throw") || text == "overrun") ++bad;
    }
    ++seq;
  }
  // And a burst of good requests after all that.
  std::vector<std::vector<PendingRequest>> requests(2);
  for (uint32_t q = 0; q < 2; ++q) {
    for (uint32_t i = 0; i < 50; ++i) {
      requests[q].push_back(
          PendingRequest{to_bytes("burst " + std::to_string(i)), request_token(q, 1000 + i)});
    }
  }
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies));
  stop_within(acc);
  for (uint32_t q = 0; q < 2; ++q) {
    ASSERT_EQ(replies[q].size(), 50u);
    for (uint32_t i = 0; i < 50; ++i) {
      EXPECT_EQ(replies[q][i].token, request_token(q, 1000 + i));
      expect_reply(replies[q][i], "burst " + std::to_string(i), capacity);
    }
  }
  EXPECT_EQ(acc.stats(0).handler_errors.load(), bad);
  EXPECT_EQ(acc.total_requests(), script.size() * 2 + 100);
}

// A fault is not an error reply: the worker that ran the handler stops, the request that
// faulted and those after it on its queues stay unanswered, the replies made before it still go
// out, the other workers serve on, and health() reports the fault until the end.
TYPED_TEST(HandlerErrorTest, AFaultStopsItsWorkerAndIsReported) {
  SnicDriver snic(small_geometry(2));
  CpuAccelerator<TypeParam> acc(snic.region(), TypeParam{}, workers_options(2));
  ASSERT_TRUE(acc.start().ok());
  ASSERT_TRUE(snic.push(0, to_bytes("before"), request_token(0, 0)));
  std::vector<TxEntry> replies;
  ASSERT_TRUE(snic.collect_replies(1, replies));
  EXPECT_EQ(replies[0].text(), "before");
  EXPECT_TRUE(acc.health().ok());

  // Worker 0 owns queue 0: the fault stops it.
  ASSERT_TRUE(snic.push(0, to_bytes("fault"), request_token(0, 1)));
  ASSERT_TRUE(snic.push(0, to_bytes("after"), request_token(0, 2)));
  ASSERT_TRUE(wait_until([&] { return !acc.health().ok(); })) << "the fault was not reported";
  const Status health = acc.health();
  EXPECT_EQ(health.code(), StatusCode::kAborted);
  EXPECT_EQ(health.message(), "CPU worker 0: handler fault: asked to");

  // Worker 1 serves queue 1 on.
  std::vector<std::vector<PendingRequest>> requests(2);
  for (uint32_t i = 0; i < 20; ++i)
    requests[1].push_back(PendingRequest{to_bytes("q1 " + std::to_string(i)), request_token(1, i)});
  std::vector<std::vector<TxEntry>> answered;
  ASSERT_TRUE(snic.exchange(requests, answered));
  ASSERT_EQ(answered[1].size(), 20u);
  EXPECT_EQ(answered[1][19].text(), "q1 19");
  std::vector<TxEntry> rest;
  snic.poll_replies(rest);
  EXPECT_TRUE(rest.empty()) << "queue 0 answered past its fault";
  stop_within(acc);
  EXPECT_EQ(acc.health().message(), health.message()) << "reported after the stop too";
}

// --- Corrupt RX entries ----------------------------------------------------------------------

struct CorruptCase {
  const char* name;
  mqueue::SlotHeader header;  // written over a committed entry
  uint32_t payload_bytes;     // what was reserved and committed (so: slots published)
  mqueue::EntryCheck expected;
};

// Ring geometry of small_geometry(): 64-byte slots, 64 slots, 112-byte messages.
const CorruptCase kCorruptCases[] = {
    {"ZeroSlots", {0, 0, 0, 7}, 0, mqueue::EntryCheck::kZeroSlots},
    {"PastRingEnd", {0, 0, 0xFFFF, 7}, 0, mqueue::EntryCheck::kPastRingEnd},
    {"PastTail", {10, 0, 5, 7}, 0, mqueue::EntryCheck::kPastTail},
    {"LengthMismatch", {10, 0, 2, 7}, 100, mqueue::EntryCheck::kLengthMismatch},
    {"TooLong", {5000, 0, 1, 7}, 0, mqueue::EntryCheck::kTooLong},
    {"UnknownFlags", {0, 0x80, 1, 7}, 0, mqueue::EntryCheck::kUnknownFlags},
};

void PrintTo(const CorruptCase& c, std::ostream* os) {
  *os << c.name;
}

template <class H>
void run_corrupt_entry(const CorruptCase& c, uint32_t workers) {
  constexpr uint32_t kQueues = 3;
  constexpr uint32_t kBad = 1;
  SnicDriver snic(small_geometry(kQueues));
  CpuAccelerator<H> acc(snic.region(), H{}, workers_options(workers));
  ASSERT_TRUE(acc.start().ok());

  // A round of good requests everywhere first.
  for (uint32_t q = 0; q < kQueues; ++q) {
    ASSERT_TRUE(snic.push(q, to_bytes("before"), request_token(q, 0)));
  }
  std::vector<TxEntry> replies;
  ASSERT_TRUE(snic.collect_replies(kQueues, replies));

  // On the bad queue: a good request (answered), the corrupt entry, another good request.
  ASSERT_TRUE(snic.push(kBad, to_bytes("just before"), request_token(kBad, 1)));
  replies.clear();
  ASSERT_TRUE(snic.collect_replies(1, replies));
  EXPECT_EQ(replies[0].token, request_token(kBad, 1));
  EXPECT_EQ(replies[0].text(), "just before");
  const uint32_t position = snic.push_raw_header(kBad, c.header, c.payload_bytes);
  // The header really is the kind of corruption this case is about.
  ASSERT_EQ(mqueue::check_entry(c.header, position, mqueue::slots_for(c.payload_bytes, 64),
                                mqueue::ring_geometry(snic.header())),
            c.expected);
  ASSERT_TRUE(snic.push(kBad, to_bytes("after"), request_token(kBad, 2)));
  const uint32_t bad_rx_tail = snic.index(mqueue::IndexArray::kRxTail, kBad);

  ASSERT_TRUE(wait_until([&] { return sum_stat(acc, &WorkerStats::corrupt_entries) == 1; }))
      << "corrupt entry not counted";
  // The other queues keep serving.
  std::vector<std::vector<PendingRequest>> more(kQueues);
  for (uint32_t q = 0; q < kQueues; ++q) {
    if (q == kBad) continue;
    for (uint32_t i = 1; i <= 30; ++i) {
      more[q].push_back(PendingRequest{to_bytes("more " + std::to_string(i)), request_token(q, i)});
    }
  }
  std::vector<std::vector<TxEntry>> after;
  ASSERT_TRUE(snic.exchange(more, after));
  // Nothing more from the bad queue.
  std::vector<TxEntry> rest;
  snic.poll_replies(rest);
  for (TxEntry& e : rest)
    after[e.queue].push_back(std::move(e));
  stop_within(acc);

  for (uint32_t q = 0; q < kQueues; ++q) {
    if (q == kBad) continue;
    ASSERT_EQ(after[q].size(), 30u) << "queue " << q;
    for (uint32_t i = 0; i < 30; ++i) {
      EXPECT_EQ(after[q][i].token, request_token(q, i + 1));
      EXPECT_EQ(after[q][i].text(), "more " + std::to_string(i + 1));
    }
  }
  EXPECT_TRUE(after[kBad].empty()) << "the stopped queue answered past the corrupt entry";
  EXPECT_EQ(sum_stat(acc, &WorkerStats::corrupt_entries), 1u);
  // The bad queue's head stopped in front of the corrupt entry: nothing past it was consumed.
  EXPECT_NE(snic.index(mqueue::IndexArray::kRxHead, kBad), bad_rx_tail);
  EXPECT_EQ(snic.index(mqueue::IndexArray::kRxHead, kBad) & 63, position);
}

class CorruptEntryTest : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(CorruptEntryTest, StopsThatQueueOnly) {
  run_corrupt_entry<Faulty>(GetParam(), 1);
}
TEST_P(CorruptEntryTest, StopsThatQueueOnlyTwoWorkers) {
  run_corrupt_entry<Faulty>(GetParam(), 2);
}
TEST_P(CorruptEntryTest, StopsThatQueueOnlyBatched) {
  run_corrupt_entry<BatchFaulty>(GetParam(), 1);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CorruptEntryTest, ::testing::ValuesIn(kCorruptCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace caracal::accel::test
