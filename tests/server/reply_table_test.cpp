#include <gtest/gtest.h>

#include <set>

#include "caracal/server/reply.hpp"

namespace caracal::server {
namespace {

struct Sink : ReplySink {
  void deliver(uint32_t, uint64_t, const boost::asio::ip::udp::endpoint&, Reply) override {}
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
  ReplyTable table(4);
  auto s = std::make_shared<Sink>();
  std::vector<uint64_t> tokens;
  for (int i = 0; i < 4; ++i)
    tokens.push_back(*table.acquire(s));
  EXPECT_FALSE(table.acquire(s));
  table.release(tokens[2]);
  table.release(tokens[0]);
  // FIFO: slot 2 comes back first, then slot 0.
  EXPECT_EQ(split_token(*table.acquire(s)).slot, split_token(tokens[2]).slot);
  EXPECT_EQ(split_token(*table.acquire(s)).slot, split_token(tokens[0]).slot);
  EXPECT_EQ(table.in_use(), 4u);
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
