#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

#include "reply_routing.hpp"
#include "thread_shard.hpp"

namespace caracal::server {
namespace {

struct Sink : ReplySink {
  Sink() : ReplySink(1) {}
  void deliver(uint32_t, uint64_t, const boost::asio::ip::udp::endpoint&, ReplyView) override {}
};

TEST(Token, PartsRoundTripAndWrap) {
  const uint64_t t = make_token(kMaxReplySlots - 1, kTokenGenerationMask, kTokenSequenceMask);
  const TokenParts p = split_token(t);
  EXPECT_EQ(p.slot, kMaxReplySlots - 1);
  EXPECT_EQ(p.generation, kTokenGenerationMask);
  EXPECT_EQ(p.sequence, kTokenSequenceMask);
  // The sequence of a base token is 0, so base | seq is a valid token for every seq.
  const uint64_t base = make_token(7, 3, 0);
  EXPECT_EQ(split_token(base | 12345).sequence, 12345u);
  EXPECT_EQ(split_token(base | 12345).slot, 7u);
}

TEST(ReplyTable, ReleasedSlotNeverRoutesAnOldToken) {
  ReplyTable table(1);
  auto a = std::make_shared<Sink>();
  auto b = std::make_shared<Sink>();
  const auto first = table.acquire(a);
  ASSERT_TRUE(first);
  ASSERT_TRUE(table.route(*first | 5));
  EXPECT_EQ(table.route(*first | 5)->sink, a);
  table.release(*first);
  EXPECT_FALSE(table.route(*first | 5)) << "a closed connection's late reply must drop";
  const auto second = table.acquire(b);
  ASSERT_TRUE(second);
  EXPECT_EQ(split_token(*second).slot, split_token(*first).slot);
  EXPECT_FALSE(table.route(*first | 5)) << "another client's slot must not take the reply";
  EXPECT_EQ(table.route(*second | 5)->sink, b);
  // A stale release does not free the new owner's slot.
  table.release(*first);
  EXPECT_EQ(table.in_use(), 1u);
  EXPECT_TRUE(table.route(*second));
}

TEST(ReplyTable, FullTableRefusesAndFreedSlotsAreReusedLast) {
  // One slot per shard: this thread takes its own shard's slot first, then the other shards'
  // (a dry shard does not refuse while others have room), and refuses only when all are taken.
  ReplyTable table(kThreadShards);
  auto s = std::make_shared<Sink>();
  std::set<uint32_t> slots;
  for (uint32_t i = 0; i < kThreadShards; ++i) {
    const auto t = table.acquire(s);
    ASSERT_TRUE(t) << "acquire " << i << " of " << kThreadShards;
    slots.insert(split_token(*t).slot);
  }
  EXPECT_EQ(slots.size(), kThreadShards);
  EXPECT_FALSE(table.acquire(s));
  EXPECT_EQ(table.in_use(), kThreadShards);
}

TEST(ReplyTable, FreedSlotsGoBackToTheirShardAndAreReusedLast) {
  // Four slots per shard: this thread's acquires come from its shard in FIFO order.
  ReplyTable table(4 * kThreadShards);
  auto s = std::make_shared<Sink>();
  std::vector<uint64_t> tokens;
  for (int i = 0; i < 4; ++i)
    tokens.push_back(*table.acquire(s));
  const uint32_t first = split_token(tokens[0]).slot;
  EXPECT_EQ(first % 4, 0u) << "a shard owns an aligned range of slots";
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(split_token(tokens[i]).slot, first + i);
  table.release(tokens[2]);
  table.release(tokens[0]);
  // FIFO within the shard: slot 2 comes back first, then slot 0.
  EXPECT_EQ(split_token(*table.acquire(s)).slot, first + 2);
  EXPECT_EQ(split_token(*table.acquire(s)).slot, first);
  // The shard is dry again: the next slot comes from another shard.
  const uint32_t other = split_token(*table.acquire(s)).slot;
  EXPECT_TRUE(other < first || other >= first + 4) << other;
  EXPECT_EQ(table.in_use(), 5u);
}

TEST(ReplyTable, SlotsReleasedOnAnotherThreadReturnToTheirOwner) {
  ReplyTable table(2 * kThreadShards);
  auto s = std::make_shared<Sink>();
  const uint64_t mine = *table.acquire(s);
  // Released on another thread (an engine thread): it goes back to this thread's shard, where
  // this thread finds it again after the shard's other free slot.
  std::thread([&] { table.release(mine); }).join();
  const uint64_t next = *table.acquire(s);
  EXPECT_EQ(split_token(next).slot, split_token(mine).slot + 1);
  EXPECT_EQ(split_token(*table.acquire(s)).slot, split_token(mine).slot);
}

TEST(ReplyTable, OneShotSlotIsReleasedByItsRoute) {
  ReplyTable table(kThreadShards);
  auto a = std::make_shared<Sink>();
  const uint64_t t = *table.acquire(a, {}, true);
  EXPECT_EQ(a.use_count(), 2);
  auto route = table.route(t);
  ASSERT_TRUE(route);
  EXPECT_EQ(route->sink, a);
  EXPECT_EQ(a.use_count(), 2) << "the route took the slot's reference instead of copying it";
  EXPECT_EQ(table.in_use(), 0u);
  EXPECT_FALSE(table.route(t)) << "a second reply to a one-shot token must drop";
  // The slot is free for another request, and a late release of the old token leaves it alone.
  const auto again = table.acquire(a, {}, true);
  ASSERT_TRUE(again);
  table.release(t);
  EXPECT_EQ(table.in_use(), 1u);
  EXPECT_TRUE(table.route(*again));
  // A slot that was not one-shot stays bound after its routes.
  const uint64_t kept = *table.acquire(a);
  EXPECT_TRUE(table.route(kept | 1));
  EXPECT_TRUE(table.route(kept | 2));
  EXPECT_EQ(table.in_use(), 1u);
}

TEST(ReplyTable, GenerationWrapsWithinItsBits) {
  ReplyTable table(1);
  auto s = std::make_shared<Sink>();
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < 10; ++i) {
    const uint64_t t = *table.acquire(s);
    seen.insert(split_token(t).generation);
    table.release(t);
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST(ReplyTable, CapacityIsChecked) {
  EXPECT_THROW(ReplyTable(0), std::invalid_argument);
  EXPECT_THROW(ReplyTable(kMaxReplySlots + 1), std::invalid_argument);
}

}  // namespace
}  // namespace caracal::server
