// AuthThrottle: penalties per address after repeated failed hellos, growing and capped,
// forgiven after a quiet window or a success, other addresses untouched, memory bounded.
#include "auth_throttle.hpp"

#include <gtest/gtest.h>

#include <string>

namespace caracal::server {
namespace {

using std::chrono::milliseconds;
using Address = AuthThrottle::Address;
using boost::asio::ip::make_address;

constexpr AuthThrottleConfig kConfig{.failures = 5,
                                     .window = milliseconds(60'000),
                                     .penalty = milliseconds(1'000),
                                     .max_penalty = milliseconds(60'000),
                                     .max_addresses = 4096};

const Address kA = make_address("192.0.2.1");
const Address kB = make_address("192.0.2.2");

struct AuthThrottleTest : ::testing::Test {
  AuthThrottle t{kConfig};
  AuthThrottle::Clock::time_point now{};  // tests move it by hand
  void at(AuthThrottle::Clock::duration d) { now = AuthThrottle::Clock::time_point{} + d; }
  milliseconds left(const Address& a) { return t.check(a, now).left; }
};

TEST_F(AuthThrottleTest, APenaltyAfterTheFifthFailureOnly) {
  for (uint32_t i = 1; i <= 4; ++i) {
    const AuthThrottle::Failure f = t.fail(kA, now);
    EXPECT_EQ(f.failures, i);
    EXPECT_EQ(f.penalty, milliseconds(0));
    EXPECT_EQ(left(kA), milliseconds(0));
  }
  EXPECT_EQ(t.fail(kA, now).penalty, milliseconds(1'000));
  EXPECT_EQ(left(kA), milliseconds(1'000));
  at(milliseconds(400));
  EXPECT_EQ(left(kA), milliseconds(600));
  at(milliseconds(1'000));
  EXPECT_EQ(left(kA), milliseconds(0)) << "the penalty is over at its end";
}

TEST_F(AuthThrottleTest, EachFailureAfterThePenaltyDoublesItUpToTheCap) {
  for (int i = 0; i < 5; ++i)
    t.fail(kA, now);
  milliseconds expected(1'000);
  for (int round = 0; round < 10; ++round) {
    at(now.time_since_epoch() + left(kA) + milliseconds(1));
    expected = std::min(expected * 2, milliseconds(60'000));
    EXPECT_EQ(t.fail(kA, now).penalty, expected) << "round " << round;
    EXPECT_EQ(left(kA), expected);
  }
  EXPECT_EQ(expected, milliseconds(60'000));
}

TEST_F(AuthThrottleTest, ThePenaltysFirstRefusalIsReportedOnce) {
  for (int i = 0; i < 5; ++i)
    t.fail(kA, now);
  EXPECT_TRUE(t.check(kA, now).first);
  EXPECT_FALSE(t.check(kA, now).first);
  EXPECT_FALSE(t.check(kA, now).first);
  at(milliseconds(1'001));
  t.fail(kA, now);  // the next penalty: reported again
  EXPECT_TRUE(t.check(kA, now).first);
  EXPECT_FALSE(t.check(kA, now).first);
}

TEST_F(AuthThrottleTest, OtherAddressesAreNotTouched) {
  for (int i = 0; i < 5; ++i)
    t.fail(kA, now);
  EXPECT_GT(left(kA), milliseconds(0));
  EXPECT_EQ(left(kB), milliseconds(0));
  EXPECT_EQ(t.fail(kB, now).failures, 1u);
}

TEST_F(AuthThrottleTest, ASuccessForgivesTheAddress) {
  for (int i = 0; i < 4; ++i)
    t.fail(kA, now);
  t.succeed(kA);
  EXPECT_EQ(t.tracked(), 0u);
  EXPECT_EQ(t.fail(kA, now).failures, 1u);
}

TEST_F(AuthThrottleTest, QuietForAWindowAfterThePenaltyIsForgiven) {
  for (int i = 0; i < 5; ++i)
    t.fail(kA, now);  // penalty until 1 s
  // Quiet for less than the window after the penalty: still counted, the next one doubles.
  at(milliseconds(1'000 + 59'000));
  EXPECT_EQ(t.fail(kA, now).penalty, milliseconds(2'000));
  // Quiet for the window after that penalty's end: forgiven, counting from 1 again.
  at(now.time_since_epoch() + milliseconds(2'000 + 60'000));
  EXPECT_EQ(t.fail(kA, now).failures, 1u);
  EXPECT_EQ(left(kA), milliseconds(0));
}

TEST_F(AuthThrottleTest, FailuresSpreadWiderThanTheWindowNeverAddUp) {
  for (int i = 0; i < 20; ++i) {
    at(milliseconds(61'000) * i);
    EXPECT_EQ(t.fail(kA, now).failures, 1u);
  }
}

TEST(AuthThrottle, ZeroFailuresTurnsItOff) {
  AuthThrottleConfig c = kConfig;
  c.failures = 0;
  AuthThrottle t(c);
  EXPECT_FALSE(t.enabled());
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(t.fail(kA, {}).penalty, milliseconds(0));
  EXPECT_EQ(t.check(kA, {}).left, milliseconds(0));
  EXPECT_EQ(t.tracked(), 0u);
}

TEST(AuthThrottle, TrackedAddressesAreCappedLeastRecentlyFailedFirst) {
  AuthThrottleConfig c = kConfig;
  c.max_addresses = 3;
  AuthThrottle t(c);
  const AuthThrottle::Clock::time_point now{};
  for (int i = 0; i < 5; ++i)
    t.fail(kA, now);  // A penalised, and the least recently failed below
  t.fail(make_address("192.0.2.10"), now);
  t.fail(make_address("192.0.2.11"), now);
  EXPECT_EQ(t.tracked(), 3u);
  EXPECT_GT(t.check(kA, now).left, milliseconds(0));
  t.fail(kA, now);  // A is now the most recently failed: .10 goes first
  for (int i = 0; i < 1000; ++i) {
    t.fail(make_address("198.51.100." + std::to_string(i % 250)), now);
    EXPECT_LE(t.tracked(), 3u);
  }
  EXPECT_GT(t.evicted(), 0u);
}

TEST(AuthThrottle, Ipv6IsCountedByItsSlash64AndMappedIpv4AsIpv4) {
  EXPECT_EQ(AuthThrottle::key_of(make_address("2001:db8:1:2:aaaa::1")),
            AuthThrottle::key_of(make_address("2001:db8:1:2:bbbb::9")));
  EXPECT_NE(AuthThrottle::key_of(make_address("2001:db8:1:2::1")),
            AuthThrottle::key_of(make_address("2001:db8:1:3::1")));
  EXPECT_EQ(AuthThrottle::key_of(make_address("::ffff:192.0.2.1")), kA);
  AuthThrottle t(kConfig);
  for (int i = 0; i < 5; ++i)
    t.fail(make_address("2001:db8::" + std::to_string(i + 1)), {});
  EXPECT_GT(t.check(make_address("2001:db8::ffff"), {}).left, milliseconds(0))
      << "one host rotating through its /64 is one address";
}

}  // namespace
}  // namespace caracal::server
