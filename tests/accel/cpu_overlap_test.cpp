// Overlapped handlers (caracal/accel/overlap.hpp) on the CPU accelerator. The test's SmartNIC
// side plays the dispatcher and the destination, as in cpu_client_test.cpp, and answers the
// calls when and in the order each test chooses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/overlap.hpp"
#include "snic_driver.hpp"

namespace caracal::accel::test {
namespace {

using PendingRequest = SnicDriver::PendingRequest;

mqueue::RegionGeometry overlap_geometry(uint32_t server_queues, uint32_t client_queues,
                                        uint32_t capacity = 64) {
  mqueue::RegionGeometry g;
  g.server_queue_count = server_queues;
  g.client_queue_count = client_queues;
  g.slot_bytes = 64;
  g.ring_capacity = capacity;
  g.max_message_bytes = 4 * 64 - mqueue::kSlotHeaderBytes;  // 240
  return g;
}

void write_text(Response& resp, const std::string& text) {
  const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(text.size()), resp.capacity);
  std::memcpy(resp.data, text.data(), n);
  resp.size = n;
}

// Appends its parts in order (GCC 12 misreads `"literal" + std::string` as an overflow).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(parts), ...);
  return s;
}

std::string text_of(const std::byte* data, uint32_t length) {
  return std::string(reinterpret_cast<const char*>(data), length);
}

// Sends the request through client queue 0; answers "re:" + the reply.
struct Relay {
  static constexpr uint32_t kInFlight = 16;
  struct Pending {
    uint32_t sent;
  };
  void start(const Request& req, Pending& p, Calls& calls, Context&) {
    p.sent = calls.send(0, req.data, req.size) ? 1 : 0;
  }
  void finish(const Request& req, Pending& p, const Replies& replies, Response& resp, Context&) {
    if (p.sent == 0 || replies.count() != 1) return resp.set_error("relay: not sent");
    if (replies[0].status != CallStatus::kOk) return resp.set_error("relay: call failed");
    write_text(resp, cat("re:", text_of(req.data, req.size), "=",
                         text_of(replies[0].data, replies[0].length)));
  }
};

// The destination answers each call with its own text reversed.
std::string answer_for(const std::string& call) {
  return std::string(call.rbegin(), call.rend());
}

// Requests "r0", "r1", ... on queue 0.
std::vector<std::vector<PendingRequest>> numbered_requests(uint32_t n) {
  std::vector<std::vector<PendingRequest>> requests(1);
  for (uint32_t i = 0; i < n; ++i)
    requests[0].push_back(
        PendingRequest{to_bytes(cat("r", std::to_string(i))), request_token(0, i)});
  return requests;
}

TEST(OverlapTest, AWorkerKeepsManyRequestsOpenAndFinishesThemAsRepliesLand) {
  constexpr uint32_t kRequests = 200;
  SnicDriver snic(overlap_geometry(1, 1));
  const std::vector<std::vector<PendingRequest>> requests = numbered_requests(kRequests);
  CpuAccelerator<Relay> acc(snic.region(), Relay{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());

  // The destination holds the calls until 16 are open at once (kInFlight: a worker that held
  // its queue for each call would never have more than one), then answers them newest first.
  std::vector<TxEntry> held;
  std::vector<TxEntry> batch;
  size_t most_open = 0;
  size_t answered = 0;
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies, 0, [&] {
    batch.clear();
    snic.take_client_requests(0, batch);
    for (TxEntry& e : batch)
      held.push_back(std::move(e));
    most_open = std::max(most_open, held.size());
    if (held.size() >= Relay::kInFlight || answered + held.size() == kRequests) {
      for (auto it = held.rbegin(); it != held.rend(); ++it)
        ASSERT_TRUE(snic.answer(0, it->token, to_bytes(answer_for(it->text()))));
      answered += held.size();
      held.clear();
    }
  }));
  stop_within(acc);
  EXPECT_EQ(most_open, Relay::kInFlight);
  ASSERT_EQ(replies[0].size(), kRequests);
  // Replies go out in the order requests finish: newest first within each group of calls.
  std::sort(replies[0].begin(), replies[0].end(),
            [](const TxEntry& a, const TxEntry& b) { return a.token < b.token; });
  for (uint32_t i = 0; i < kRequests; ++i) {
    const std::string r = cat("r", std::to_string(i));
    EXPECT_EQ(replies[0][i].token, request_token(0, i));
    EXPECT_EQ(replies[0][i].text(), cat("re:", r, "=", answer_for(r)));
  }
  EXPECT_EQ(sum_stat(acc, &WorkerStats::requests), kRequests);
  EXPECT_EQ(sum_stat(acc, &WorkerStats::stale_replies), 0u);
}

// "<n>[e]": makes n calls on client queue 0 ("e": the first through client 7, which does not
// exist); answers with each call's status and reply.
struct Fanout {
  static constexpr uint32_t kInFlight = 8;
  static constexpr uint32_t kMaxCalls = 3;
  struct Pending {
    uint32_t asked;
  };
  void start(const Request& req, Pending& p, Calls& calls, Context&) {
    const std::string text = text_of(req.data, req.size);
    if (text == "throw") throw std::runtime_error("start refused the request");
    p.asked = static_cast<uint32_t>(std::stoul(text));
    const bool bad_client = text.ends_with("e");
    for (uint32_t i = 0; i < p.asked; ++i) {
      const std::string call = text + "/" + std::to_string(i);
      const bool sent =
          calls.send(bad_client && i == 0 ? 7 : 0, call.data(), static_cast<uint32_t>(call.size()));
      if (i >= kMaxCalls) {
        EXPECT_FALSE(sent);
      }
    }
  }
  void finish(const Request& req, Pending& p, const Replies& replies, Response& resp, Context&) {
    if (text_of(req.data, req.size) == "9") throw std::runtime_error("finish failed");
    std::string out = std::to_string(p.asked) + ":";
    for (uint32_t i = 0; i < replies.count(); ++i) {
      out += "[" + std::to_string(static_cast<int>(replies[i].status));
      if (replies[i].status == CallStatus::kOk || replies[i].status == CallStatus::kRemoteError)
        out += " " + text_of(replies[i].data, replies[i].length);
      out += "]";
    }
    write_text(resp, out);
  }
};

TEST(OverlapTest, EveryCallGetsAnOutcomeAndStrayRepliesAreDropped) {
  SnicDriver snic(overlap_geometry(1, 1));
  const std::vector<std::string> script = {"0", "1", "3", "4", "2e", "throw", "9", "2"};
  std::vector<std::vector<PendingRequest>> requests(1);
  for (uint32_t i = 0; i < script.size(); ++i)
    requests[0].push_back(PendingRequest{to_bytes(script[i]), request_token(0, i)});
  CpuAccelerator<Fanout> acc(snic.region(), Fanout{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());
  // Calls ending in "/1" fail at the destination; before each answer goes a stray reply (a
  // token no open call has).
  std::vector<TxEntry> batch;
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies, 0, [&] {
    batch.clear();
    snic.take_client_requests(0, batch);
    for (const TxEntry& call : batch) {
      ASSERT_TRUE(snic.answer(0, call.token ^ (uint64_t{1} << 40), to_bytes("stray")));
      const std::string text = call.text();
      if (text.ends_with("/1")) {
        ASSERT_TRUE(snic.answer(0, call.token, to_bytes("down"), mqueue::kSlotError));
      } else {
        ASSERT_TRUE(snic.answer(0, call.token, to_bytes("ok " + text)));
      }
    }
  }));
  stop_within(acc);
  ASSERT_EQ(replies[0].size(), script.size());
  std::vector<std::string> got(script.size());
  for (const TxEntry& r : replies[0])
    got[token_seq(r.token)] = (r.is_error() ? "E " : "") + r.text();
  const auto ok = [](int n) { return "[" + std::to_string(n); };
  EXPECT_EQ(got[0], "0:");
  EXPECT_EQ(got[1], "1:" + ok(0) + " ok 1/0]");
  EXPECT_EQ(got[2], "3:" + ok(0) + " ok 3/0]" + ok(6) + " down]" + ok(0) + " ok 3/2]");
  EXPECT_EQ(got[3], "4:" + ok(0) + " ok 4/0]" + ok(6) + " down]" + ok(0) + " ok 4/2]");
  EXPECT_EQ(got[4], "2:" + ok(7) + "]" + ok(6) + " down]");
  // A client is told only that the handler failed; the agent's log gets the exception's text
  // (the last one noted: "9" finished after "throw" started).
  EXPECT_EQ(got[5], std::string("E ") + kHandlerFailedReply);
  EXPECT_EQ(got[6], std::string("E ") + kHandlerFailedReply);
  EXPECT_EQ(acc.stats(0).last_error.get(), "finish() threw: finish failed");
  EXPECT_EQ(got[7], "2:" + ok(0) + " ok 2/0]" + ok(6) + " down]");
  // One stray reply before each of the 13 calls that went out.
  EXPECT_EQ(sum_stat(acc, &WorkerStats::stale_replies), 13u);
  EXPECT_EQ(sum_stat(acc, &WorkerStats::handler_errors), 2u);
}

// Thousands of requests over two workers, answered in random order and at random times.
TEST(OverlapTest, ThousandsOfCallsAnsweredInAnyOrderEachGetTheirReply) {
  constexpr uint32_t kQueues = 2;
  constexpr uint32_t kPerQueue = 3000;
  SnicDriver snic(overlap_geometry(kQueues, kQueues));
  std::vector<std::vector<PendingRequest>> requests(kQueues);
  for (uint32_t q = 0; q < kQueues; ++q) {
    for (uint32_t i = 0; i < kPerQueue; ++i) {
      requests[q].push_back(PendingRequest{
          to_bytes(cat("q", std::to_string(q), "-", std::string(i % 40, 'x'), std::to_string(i))),
          request_token(q, i)});
    }
  }
  CpuAccelerator<Relay> acc(snic.region(), Relay{}, workers_options(2));
  ASSERT_TRUE(acc.start().ok());
  std::mt19937 rng(7);
  std::vector<std::vector<TxEntry>> held(kQueues);
  std::vector<TxEntry> batch;
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies, 0, [&] {
    for (uint32_t c = 0; c < kQueues; ++c) {
      batch.clear();
      snic.take_client_requests(c, batch);
      for (TxEntry& e : batch)
        held[c].push_back(std::move(e));
      std::shuffle(held[c].begin(), held[c].end(), rng);
      // Answer a random part of what is held; the rest waits for a later round.
      const size_t n = held[c].empty() ? 0 : rng() % (held[c].size() + 1);
      for (size_t i = 0; i < n; ++i)
        ASSERT_TRUE(snic.answer(c, held[c][i].token, to_bytes(answer_for(held[c][i].text()))));
      held[c].erase(held[c].begin(), held[c].begin() + static_cast<std::ptrdiff_t>(n));
    }
  }));
  stop_within(acc);
  for (uint32_t q = 0; q < kQueues; ++q) {
    ASSERT_EQ(replies[q].size(), kPerQueue);
    std::vector<bool> seen(kPerQueue, false);
    for (const TxEntry& r : replies[q]) {
      ASSERT_EQ(token_queue(r.token), q);
      const uint32_t i = token_seq(r.token);
      ASSERT_LT(i, kPerQueue);
      EXPECT_FALSE(seen[i]);
      seen[i] = true;
      const std::string text = to_text(requests[q][i].payload);
      EXPECT_EQ(r.text(), cat("re:", text, "=", answer_for(text)));
    }
  }
  EXPECT_EQ(sum_stat(acc, &WorkerStats::stale_replies), 0u);
}

// A worker stopped with requests open takes them again when it starts: they were never given
// back to the RX ring. The calls made before the stop are answered late and dropped.
TEST(OverlapTest, RequestsOpenAtAStopAreServedAgainAfterTheRestart) {
  constexpr uint32_t kRequests = 6;
  SnicDriver snic(overlap_geometry(1, 1));
  const std::vector<std::vector<PendingRequest>> requests = numbered_requests(kRequests);
  CpuAccelerator<Relay> acc(snic.region(), Relay{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());
  for (const PendingRequest& r : requests[0])
    ASSERT_TRUE(snic.try_push(0, r.payload, r.token));
  snic.publish(0);
  std::vector<TxEntry> first;
  ASSERT_TRUE(wait_until([&] {
    snic.take_client_requests(0, first);
    return first.size() == kRequests;
  }));
  stop_within(acc);
  ASSERT_TRUE(acc.start().ok());
  // The old calls' answers land first: stale. Then the new calls, answered in order.
  for (const TxEntry& call : first)
    ASSERT_TRUE(snic.answer(0, call.token, to_bytes("late")));
  std::vector<TxEntry> batch;
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies, kRequests, [&] {
    batch.clear();
    snic.take_client_requests(0, batch);
    for (const TxEntry& call : batch)
      ASSERT_TRUE(snic.answer(0, call.token, to_bytes(answer_for(call.text()))));
  }));
  stop_within(acc);
  ASSERT_EQ(replies[0].size(), kRequests);
  for (const TxEntry& r : replies[0]) {
    const std::string text = cat("r", std::to_string(token_seq(r.token)));
    EXPECT_EQ(r.text(), cat("re:", text, "=", answer_for(text)));
  }
  EXPECT_EQ(sum_stat(acc, &WorkerStats::stale_replies), kRequests);
}

}  // namespace
}  // namespace caracal::accel::test
