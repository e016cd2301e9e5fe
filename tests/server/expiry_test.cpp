// The bookkeeping behind reply timeouts and outlier ejection, without an engine: the per-queue
// flights with their deadline FIFO (mqueue_manager/flights.hpp), and one agent's ejection periods
// (ejection.hpp). What the engine and the service do with them is in engine_test.cpp and
// dispatch_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "ejection.hpp"
#include "mqueue_manager/flights.hpp"
#include "reply_routing.hpp"
#include "tunables.hpp"

namespace caracal::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using Expired = std::vector<std::pair<uint64_t, Clock::time_point>>;

// Expires what is due at `now` with `bound`; returns what expired, in order.
Expired expire(QueueFlights& f, Clock::time_point now, Clock::duration bound) {
  Expired out;
  const uint32_t n = f.expire(now, bound, [&](uint64_t token, Clock::time_point submitted) {
    out.emplace_back(token, submitted);
  });
  EXPECT_EQ(n, out.size());
  return out;
}

TEST(QueueFlights, AnswersInOrderKeepTheFifoAsShortAsTheRequestsInFlight) {
  QueueFlights f;
  const Clock::time_point t0 = Clock::now();
  for (uint64_t token = 1; token <= 100; ++token)
    f.add(token, t0 + std::chrono::microseconds(token), true);
  EXPECT_EQ(f.live(), 100u);
  EXPECT_EQ(f.queued_deadlines(), 100u);
  for (uint64_t token = 1; token <= 100; ++token) {
    Clock::time_point submitted;
    ASSERT_EQ(f.take(token, submitted), QueueFlights::Answer::kLive) << token;
    EXPECT_EQ(submitted, t0 + std::chrono::microseconds(token));
    EXPECT_EQ(f.queued_deadlines(), 100 - token) << "the answered front is dropped at once";
  }
  EXPECT_EQ(f.live(), 0u);
  EXPECT_TRUE(expire(f, t0 + 1h, 1ms).empty());
}

TEST(QueueFlights, ExpiresWhatIsPastItsDeadlineOldestFirstAndStopsAtTheFirstInTime) {
  QueueFlights f;
  const Clock::time_point t0 = Clock::now();
  for (uint64_t i = 0; i < 5; ++i)
    f.add(100 + i, t0 + i * 10ms, true);
  // Deadlines t0+20, +30, +40, +50, +60 ms.
  EXPECT_TRUE(expire(f, t0 + 19ms, 20ms).empty());
  EXPECT_EQ(expire(f, t0 + 20ms, 20ms), (Expired{{100, t0}}));
  EXPECT_EQ(expire(f, t0 + 45ms, 20ms), (Expired{{101, t0 + 10ms}, {102, t0 + 20ms}}));
  EXPECT_EQ(f.live(), 2u);
  EXPECT_EQ(f.late(), 3u);
  EXPECT_EQ(f.queued_deadlines(), 2u);
}

TEST(QueueFlights, AnsweredRequestsNeverExpireAndAreDroppedFromTheFifoLazily) {
  QueueFlights f;
  const Clock::time_point t0 = Clock::now();
  f.add(1, t0, true);
  f.add(2, t0 + 1ms, true);
  f.add(3, t0 + 2ms, true);
  Clock::time_point submitted;
  ASSERT_EQ(f.take(2, submitted), QueueFlights::Answer::kLive);  // not the front
  EXPECT_EQ(f.queued_deadlines(), 3u) << "an answer out of order searches nothing";
  EXPECT_EQ(expire(f, t0 + 1s, 10ms), (Expired{{1, t0}, {3, t0 + 2ms}}));
  EXPECT_EQ(f.queued_deadlines(), 0u);
  EXPECT_EQ(f.live(), 0u);
}

TEST(QueueFlights, ALateAnswerIsToldFromAnUnknownToken) {
  QueueFlights f;
  const Clock::time_point t0 = Clock::now();
  f.add(7, t0, true);
  ASSERT_EQ(expire(f, t0 + 1s, 100ms).size(), 1u);
  Clock::time_point submitted;
  EXPECT_EQ(f.take(7, submitted), QueueFlights::Answer::kLate);
  EXPECT_EQ(f.take(7, submitted), QueueFlights::Answer::kUnknown) << "answered once only";
  EXPECT_EQ(f.take(8, submitted), QueueFlights::Answer::kUnknown);
  EXPECT_EQ(f.late(), 0u);
  EXPECT_EQ(f.live(), 0u);
}

TEST(QueueFlights, ATokenGivenAgainAfterItExpiredIsLive) {
  QueueFlights f;
  const Clock::time_point t0 = Clock::now();
  f.add(7, t0, true);
  ASSERT_EQ(expire(f, t0 + 1s, 100ms).size(), 1u);
  f.add(7, t0 + 2s, true);
  EXPECT_EQ(f.live(), 1u);
  EXPECT_EQ(f.late(), 0u);
  // Its old FIFO entry is gone; the new one expires on its own deadline.
  EXPECT_TRUE(expire(f, t0 + 2s + 50ms, 100ms).empty());
  Clock::time_point submitted;
  EXPECT_EQ(f.take(7, submitted), QueueFlights::Answer::kLive);
  EXPECT_EQ(submitted, t0 + 2s);
}

TEST(QueueFlights, ADuplicateOfALiveTokenChangesNothing) {
  QueueFlights f;
  const Clock::time_point t0 = Clock::now();
  f.add(7, t0, true);
  f.add(7, t0 + 1ms, true);
  EXPECT_EQ(f.live(), 1u);
  EXPECT_EQ(expire(f, t0 + 1s, 100ms), (Expired{{7, t0}}));
}

TEST(QueueFlights, LateTokensAreRememberedUpToTheLimitOldestForgottenFirst) {
  QueueFlights f;
  const Clock::time_point t0 = Clock::now();
  const uint64_t n = tunables::kLateRepliesRemembered + 10;
  for (uint64_t token = 0; token < n; ++token)
    f.add(token, t0, true);
  EXPECT_EQ(expire(f, t0 + 1s, 1ms).size(), n);
  EXPECT_EQ(f.late(), tunables::kLateRepliesRemembered);
  Clock::time_point submitted;
  EXPECT_EQ(f.take(0, submitted), QueueFlights::Answer::kUnknown) << "forgotten";
  EXPECT_EQ(f.take(9, submitted), QueueFlights::Answer::kUnknown) << "forgotten";
  EXPECT_EQ(f.take(10, submitted), QueueFlights::Answer::kLate);
  EXPECT_EQ(f.take(n - 1, submitted), QueueFlights::Answer::kLate);
}

TEST(QueueFlights, WithoutADeadlineNothingExpires) {
  QueueFlights f;
  const Clock::time_point t0 = Clock::now();
  f.add(1, t0, false);
  f.add(2, t0, false);
  EXPECT_EQ(f.queued_deadlines(), 0u);
  EXPECT_TRUE(expire(f, t0 + 24h, 1ms).empty());
  EXPECT_EQ(f.live(), 2u);
}

TEST(QueueFlights, TakeAllGivesTheLiveRequestsAndForgetsEverything) {
  QueueFlights f;
  const Clock::time_point t0 = Clock::now();
  f.add(1, t0, true);
  f.add(2, t0 + 1s, true);
  f.add(3, t0 + 2s, true);
  ASSERT_EQ(expire(f, t0 + 500ms, 100ms).size(), 1u);  // 1 has been answered by its timeout
  std::vector<std::pair<uint64_t, Clock::time_point>> out;
  f.take_all(out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (Expired{{2, t0 + 1s}, {3, t0 + 2s}}));
  EXPECT_EQ(f.live(), 0u);
  EXPECT_EQ(f.late(), 0u);
  Clock::time_point submitted;
  EXPECT_EQ(f.take(1, submitted), QueueFlights::Answer::kUnknown);
}

// The table against a map that cannot be wrong: random adds, answers and expiries of tokens
// shaped like the server's (a UDP slot's generation moving on, a TCP connection's sequence),
// many more than the table was sized for, so that it doubles and deletes across wrap-arounds.
TEST(QueueFlights, AgreesWithAMapThroughGrowthAndDeletion) {
  QueueFlights f(8);
  const size_t first_capacity = f.table_capacity();
  std::map<uint64_t, Clock::time_point> live;
  std::mt19937_64 rng(7);
  const Clock::time_point t0 = Clock::now();
  std::vector<uint64_t> tokens;
  for (uint32_t slot = 0; slot < 64; ++slot) {
    for (uint32_t seq = 0; seq < 8; ++seq)
      tokens.push_back(make_token(slot, slot % 5, seq));
  }
  for (int step = 0; step < 200000; ++step) {
    const uint64_t token = tokens[rng() % tokens.size()];
    Clock::time_point submitted;
    if (rng() % 2 == 0) {
      const Clock::time_point at = t0 + std::chrono::microseconds(step);
      f.add(token, at, false);
      live.emplace(token, at);  // a live duplicate keeps its first time, as the table does
    } else {
      const auto it = live.find(token);
      const QueueFlights::Answer a = f.take(token, submitted);
      if (it == live.end()) {
        ASSERT_EQ(a, QueueFlights::Answer::kUnknown) << step;
      } else {
        ASSERT_EQ(a, QueueFlights::Answer::kLive) << step;
        ASSERT_EQ(submitted, it->second) << step;
        live.erase(it);
      }
    }
    ASSERT_EQ(f.live(), live.size()) << step;
  }
  EXPECT_GT(f.table_capacity(), first_capacity) << "512 tokens outgrew a table sized for 8";
  std::vector<std::pair<uint64_t, Clock::time_point>> out;
  f.take_all(out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (Expired(live.begin(), live.end())));
}

TEST(QueueFlights, KeepsEveryLateTokenItRemembersPastItsFirstSize) {
  QueueFlights f(8);
  const Clock::time_point t0 = Clock::now();
  for (uint64_t token = 1; token <= 1000; ++token)
    f.add(token, t0, true);
  EXPECT_EQ(expire(f, t0 + 1s, 1ms).size(), 1000u);
  EXPECT_EQ(f.late(), 1000u);
  Clock::time_point submitted;
  for (uint64_t token = 1; token <= 1000; ++token)
    ASSERT_EQ(f.take(token, submitted), QueueFlights::Answer::kLate) << token;
  EXPECT_EQ(f.late(), 0u);
}

TEST(EjectionPolicy, DueAfterSoManyTimeoutsInARowAndNeverWhenOff) {
  EjectionPolicy p;
  p.after_timeouts = 3;
  EXPECT_FALSE(p.due(2));
  EXPECT_TRUE(p.due(3));
  EXPECT_TRUE(p.due(100));
  p.after_timeouts = 0;
  EXPECT_FALSE(p.due(1000000));
}

TEST(EjectionPolicy, OfTheConfigurationNeverCapsBelowTheFirstPeriod) {
  ServiceConfig c;
  c.eject_after_timeouts = 4;
  c.eject_ms = 2000;
  c.eject_max_ms = 1000;  // refused by the parser; a program that sets it gets no lower cap
  const EjectionPolicy p = EjectionPolicy::of(c);
  EXPECT_EQ(p.after_timeouts, 4u);
  EXPECT_EQ(p.period, 2000ms);
  EXPECT_EQ(p.max_period, 2000ms);
}

TEST(Ejection, AnEjectionSoonAfterTheReturnDoublesUpToTheCap) {
  const EjectionPolicy p{3, 100ms, 350ms};
  Ejection e;
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(e.ejected());
  EXPECT_EQ(e.eject(t0, p), 100ms);
  EXPECT_TRUE(e.ejected());
  EXPECT_EQ(e.until(), t0 + 100ms);
  EXPECT_EQ(e.streak(), 1u);
  e.readmit(t0 + 100ms);
  EXPECT_FALSE(e.ejected());
  // Within one period (100 ms) of its return: doubled.
  EXPECT_EQ(e.eject(t0 + 150ms, p), 200ms);
  EXPECT_EQ(e.streak(), 2u);
  e.readmit(t0 + 350ms);
  EXPECT_EQ(e.eject(t0 + 400ms, p), 350ms) << "capped";
  EXPECT_EQ(e.until(), t0 + 750ms);
  e.readmit(t0 + 750ms);
  EXPECT_EQ(e.eject(t0 + 760ms, p), 350ms);
  EXPECT_EQ(e.streak(), 4u);
}

TEST(Ejection, AnAgentThatStayedInDispatchForAWholePeriodStartsAgain) {
  const EjectionPolicy p{3, 100ms, 1000ms};
  Ejection e;
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(e.eject(t0, p), 100ms);
  e.readmit(t0 + 100ms);
  EXPECT_EQ(e.eject(t0 + 150ms, p), 200ms);
  // Returned early (it answered in time) and then stayed 200 ms, its last period.
  e.readmit(t0 + 160ms);
  EXPECT_EQ(e.eject(t0 + 360ms, p), 100ms);
  EXPECT_EQ(e.streak(), 1u);
}

}  // namespace
}  // namespace caracal::server
