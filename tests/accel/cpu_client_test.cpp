// Handlers that call out through client queues. The test's SmartNIC side plays both the
// dispatcher (server queues) and the destination: it reads what handlers send from each client
// queue's TX ring and answers into its RX ring with the handler's token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "caracal/accel/client.hpp"
#include "caracal/accel/cpu.hpp"
#include "caracal/accel/handler.hpp"
#include "snic_driver.hpp"

namespace caracal::accel::test {
namespace {

using PendingRequest = SnicDriver::PendingRequest;

mqueue::RegionGeometry client_geometry(uint32_t server_queues, uint32_t client_queues) {
  mqueue::RegionGeometry g;
  g.server_queue_count = server_queues;
  g.client_queue_count = client_queues;
  g.slot_bytes = 64;
  g.ring_capacity = 16;
  g.max_message_bytes = 4 * 64 - mqueue::kSlotHeaderBytes;  // 240
  return g;
}

// Tokens a handler chooses for its calls: the worker in the high bits, so they are unique.
constexpr uint64_t call_token(uint32_t worker, uint64_t n) {
  return (uint64_t{worker} << 48) | n;
}

// Forwards each request through the worker's first client queue with call(); the response is
// the call's status in one byte, then the reply.
struct CallThrough {
  uint64_t calls = 0;  // per worker: each worker runs its own copy

  void operator()(const Request& req, Response& resp, Context& ctx) {
    if (ctx.client_count() == 0) {
      resp.set_error("no client queue");
      return;
    }
    const CallResult r = ctx.client(0).call(call_token(ctx.worker(), ++calls), req.data, req.size,
                                            resp.data + 1, resp.capacity - 1);
    resp.data[0] = static_cast<std::byte>(r.status);
    resp.size = 1 + std::min(r.length, resp.capacity - 1);
  }
};

CallStatus status_of(const TxEntry& r) {
  return r.data.empty() ? CallStatus::kCorrupt : static_cast<CallStatus>(r.data[0]);
}
std::string body_of(const TxEntry& r) {
  return r.data.empty() ? "" : r.text().substr(1);
}

// The destination: gets the requests each client queue carried since the last call, per client.
using Destination = std::function<void(uint32_t client, std::vector<TxEntry>& requests)>;

// Plays dispatcher and destination until every request has its reply. False on timeout.
bool serve(SnicDriver& snic, const std::vector<std::vector<PendingRequest>>& requests,
           std::vector<std::vector<TxEntry>>& replies, const Destination& destination) {
  replies.assign(requests.size(), {});
  std::vector<TxEntry> batch;
  return snic.exchange(requests, replies, 0, [&] {
    for (uint32_t c = 0; c < snic.header().client_queue_count; ++c) {
      batch.clear();
      snic.take_client_requests(c, batch);
      if (!batch.empty()) destination(c, batch);
    }
  });
}

TEST(ClientQueueTest, CallsGoThroughTheWorkersClientQueue) {
  constexpr uint32_t kQueues = 2;
  constexpr uint32_t kPerQueue = 60;
  SnicDriver snic(client_geometry(kQueues, 2));
  std::vector<std::vector<PendingRequest>> requests(kQueues);
  for (uint32_t q = 0; q < kQueues; ++q) {
    for (uint32_t i = 0; i < kPerQueue; ++i) {
      requests[q].push_back(PendingRequest{to_bytes("q" + std::to_string(q) + " get " +
                                                    std::string(i % 50, 'k') + std::to_string(i)),
                                           request_token(q, i)});
    }
  }
  // The destination answers "c<client>:" + the request; it checks the tokens are fresh.
  std::vector<std::vector<uint64_t>> tokens(2);
  const Destination destination = [&](uint32_t c, std::vector<TxEntry>& calls) {
    for (const TxEntry& call : calls) {
      EXPECT_EQ(call.flags, 0);
      tokens[c].push_back(call.token);
      ASSERT_TRUE(
          snic.answer(c, call.token, to_bytes("c" + std::to_string(c) + ":" + call.text())));
    }
  };
  // Two workers: worker w owns server queue w and client queue w.
  CpuAccelerator<CallThrough> acc(snic.region(), CallThrough{}, workers_options(2));
  ASSERT_TRUE(acc.start().ok());
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(serve(snic, requests, replies, destination));
  stop_within(acc);

  for (uint32_t q = 0; q < kQueues; ++q) {
    ASSERT_EQ(replies[q].size(), kPerQueue);
    for (uint32_t i = 0; i < kPerQueue; ++i) {
      const TxEntry& r = replies[q][i];
      EXPECT_EQ(r.token, request_token(q, i));
      EXPECT_EQ(r.flags, 0) << r.text();
      EXPECT_EQ(status_of(r), CallStatus::kOk);
      EXPECT_EQ(body_of(r), "c" + std::to_string(q) + ":" + to_text(requests[q][i].payload));
    }
    // The handler's tokens, as the destination saw them on client queue q.
    ASSERT_EQ(tokens[q].size(), kPerQueue);
    for (uint32_t i = 0; i < kPerQueue; ++i)
      EXPECT_EQ(tokens[q][i], call_token(q, i + 1));
  }
}

TEST(ClientQueueTest, DestinationErrorsAndWrongTokensReachTheHandler) {
  SnicDriver snic(client_geometry(1, 1));
  const std::vector<std::string> script = {"a", "err:connection refused", "b", "wrong-token", "c"};
  std::vector<std::vector<PendingRequest>> requests(1);
  for (uint32_t i = 0; i < script.size(); ++i) {
    requests[0].push_back(PendingRequest{to_bytes(script[i]), request_token(0, i)});
  }
  const Destination destination = [&](uint32_t c, std::vector<TxEntry>& calls) {
    for (const TxEntry& call : calls) {
      const std::string text = call.text();
      if (text.starts_with("err:")) {
        ASSERT_TRUE(snic.answer(c, call.token, to_bytes(text.substr(4)), mqueue::kSlotError));
      } else if (text == "wrong-token") {
        ASSERT_TRUE(snic.answer(c, call.token + 1000, to_bytes("for someone else")));
      } else {
        ASSERT_TRUE(snic.answer(c, call.token, to_bytes("re:" + text)));
      }
    }
  };
  CpuAccelerator<CallThrough> acc(snic.region(), CallThrough{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(serve(snic, requests, replies, destination));
  stop_within(acc);

  ASSERT_EQ(replies[0].size(), script.size());
  EXPECT_EQ(status_of(replies[0][0]), CallStatus::kOk);
  EXPECT_EQ(body_of(replies[0][0]), "re:a");
  EXPECT_EQ(status_of(replies[0][1]), CallStatus::kRemoteError);
  EXPECT_EQ(body_of(replies[0][1]), "connection refused");
  EXPECT_EQ(status_of(replies[0][2]), CallStatus::kOk);
  EXPECT_EQ(body_of(replies[0][2]), "re:b");
  EXPECT_EQ(status_of(replies[0][3]), CallStatus::kTokenMismatch);
  EXPECT_EQ(status_of(replies[0][4]), CallStatus::kOk);
  EXPECT_EQ(body_of(replies[0][4]), "re:c");
}

// A handler waiting in call() for a destination that never answers returns when the SmartNIC
// raises the stop word, and its worker exits.
TEST(ClientQueueTest, StopWordEndsAWaitingCall) {
  SnicDriver snic(client_geometry(1, 1));
  CpuAccelerator<CallThrough> acc(snic.region(), CallThrough{}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());
  ASSERT_TRUE(snic.push(0, to_bytes("never answered"), request_token(0, 0)));
  std::vector<TxEntry> calls;
  ASSERT_TRUE(wait_until([&] { return snic.take_client_requests(0, calls) > 0; }));
  EXPECT_EQ(calls[0].text(), "never answered");
  snic.request_stop();
  finish_within("join() with a handler waiting in call()", [&] { acc.join(); });
  std::vector<TxEntry> replies;
  snic.poll_replies(replies);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(status_of(replies[0]), CallStatus::kStopped);
}

// --- send() / next_reply(): several calls in flight ------------------------------------------

// Sends kFan calls at once, each with its own token, and assembles the replies in token order
// whatever order they come back in: "<reply 0>|<reply 1>|...".
struct FanOut {
  static constexpr uint32_t kFan = 5;
  mqueue::RegionView region;  // for the stop word while waiting
  uint64_t rounds = 0;

  void operator()(const Request& req, Response& resp, Context& ctx) {
    ClientChannel& ch = ctx.client(0);
    const uint64_t base = call_token(ctx.worker(), ++rounds * 16);
    const std::string text(reinterpret_cast<const char*>(req.data), req.size);
    for (uint32_t i = 0; i < kFan; ++i) {
      const std::string part = text + "#" + std::to_string(i);
      if (!ch.send(base + i, part.data(), static_cast<uint32_t>(part.size()))) {
        resp.set_error("send refused");
        return;
      }
    }
    ch.flush();
    std::string parts[kFan];
    bool seen[kFan] = {};
    uint32_t got = 0;
    uint32_t spins = 0;
    mqueue::Entry reply;
    while (got < kFan) {
      const mqueue::PollResult r = ch.next_reply(reply);
      if (r == mqueue::PollResult::kCorrupt) {
        resp.set_error("corrupt reply");
        return;
      }
      if (r == mqueue::PollResult::kEmpty) {
        if (++spins % 4096 == 0 && region.stop_requested()) {
          resp.set_error("stopped");
          return;
        }
        continue;
      }
      const uint64_t i = reply.token - base;
      if (reply.token < base || i >= kFan || seen[i]) {
        resp.set_error("unexpected reply token");
        return;
      }
      seen[i] = true;
      parts[i].assign(reinterpret_cast<const char*>(reply.payload), reply.length);
      ++got;
    }
    ch.release_replies();
    std::string out;
    for (uint32_t i = 0; i < kFan; ++i)
      out += (i == 0 ? "" : "|") + parts[i];
    if (out.size() > resp.capacity) {
      resp.set_error("response too large");
      return;
    }
    std::memcpy(resp.data, out.data(), out.size());
    resp.size = static_cast<uint32_t>(out.size());
  }
};

TEST(ClientQueueTest, SeveralCallsInFlightMatchedByToken) {
  constexpr uint32_t kRequests = 40;
  SnicDriver snic(client_geometry(1, 1));
  std::vector<std::vector<PendingRequest>> requests(1);
  for (uint32_t i = 0; i < kRequests; ++i) {
    requests[0].push_back(PendingRequest{to_bytes("k" + std::to_string(i)), request_token(0, i)});
  }
  // The destination answers what it has, newest first.
  size_t most_in_flight = 0;
  const Destination destination = [&](uint32_t c, std::vector<TxEntry>& calls) {
    most_in_flight = std::max(most_in_flight, calls.size());
    for (auto it = calls.rbegin(); it != calls.rend(); ++it) {
      ASSERT_TRUE(snic.answer(c, it->token, to_bytes("r(" + it->text() + ")")));
    }
  };
  CpuAccelerator<FanOut> acc(snic.region(), FanOut{snic.region()}, workers_options(1));
  ASSERT_TRUE(acc.start().ok());
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(serve(snic, requests, replies, destination));
  stop_within(acc);

  EXPECT_EQ(most_in_flight, FanOut::kFan) << "the calls were not in flight together";
  ASSERT_EQ(replies[0].size(), kRequests);
  for (uint32_t i = 0; i < kRequests; ++i) {
    std::string expected;
    for (uint32_t p = 0; p < FanOut::kFan; ++p) {
      expected += (p == 0 ? "" : "|") + ("r(k" + std::to_string(i) + "#" + std::to_string(p) + ")");
    }
    EXPECT_EQ(replies[0][i].token, request_token(0, i));
    EXPECT_EQ(replies[0][i].flags, 0) << replies[0][i].text();
    EXPECT_EQ(replies[0][i].text(), expected);
  }
}

}  // namespace
}  // namespace caracal::accel::test
