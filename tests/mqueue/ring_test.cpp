// The ring protocol on a ring in local memory: RingProducer and RingConsumer, directly and
// through a RegionView.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/validate.hpp"
#include "test_support.hpp"

namespace caracal::mqueue {
namespace {

using test::LocalRegion;
using test::LocalRing;
using test::Message;
using test::numbered_bytes;
using test::pop_message;
using test::push_message;

// 8 slots of 64 bytes; messages up to 4 slots (half the ring).
constexpr RingGeometry kSmall{64, 8, 4 * 64 - kSlotHeaderBytes};
constexpr uint32_t kOneSlot = 64 - kSlotHeaderBytes;  // the largest single-slot payload

TEST(RingArithmetic, IndexDifferencesSurviveWrapAround) {
  EXPECT_EQ(used_slots(5, 5), 0u);
  EXPECT_EQ(used_slots(8, 0), 8u);
  EXPECT_EQ(used_slots(2, UINT32_MAX - 1), 4u);  // tail wrapped past zero, head did not
  EXPECT_EQ(free_slots(2, UINT32_MAX - 1, 8), 4u);
  EXPECT_EQ(free_slots(UINT32_MAX, UINT32_MAX, 8), 8u);
  EXPECT_EQ(free_slots(3, UINT32_MAX - 4, 8), 0u);  // full across the wrap
}

TEST(RingArithmetic, PlaceEntryFillsTheRingEndWithASkip) {
  // Fits before the end: no skip.
  EXPECT_EQ(place_entry(5, 3, 8).skip, 0u);
  EXPECT_EQ(place_entry(5, 3, 8).position, 5u);
  EXPECT_EQ(place_entry(0, 8, 8).skip, 0u);
  // Does not fit: skip to the end, start at 0.
  EXPECT_EQ(place_entry(6, 3, 8).skip, 2u);
  EXPECT_EQ(place_entry(6, 3, 8).position, 0u);
  EXPECT_EQ(place_entry(6, 3, 8).total(3), 5u);
  // Positions come from the masked free-running index.
  EXPECT_EQ(place_entry(UINT32_MAX, 1, 8).position, 7u);
  EXPECT_EQ(place_entry(UINT32_MAX, 1, 8).skip, 0u);
  EXPECT_EQ(place_entry(UINT32_MAX, 2, 8).skip, 1u);
  EXPECT_EQ(place_entry(UINT32_MAX, 2, 8).position, 0u);
}

// Most ring tests run from several starting indexes: zero, mid-ring, and just short of the
// 32-bit wrap so that the free-running indexes cross zero during the test.
class RingTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  uint32_t start() const { return GetParam(); }
  uint32_t position(uint32_t index) const { return index & (kSmall.capacity - 1); }
};

INSTANTIATE_TEST_SUITE_P(StartIndexes, RingTest,
                         ::testing::Values(0u, 5u, UINT32_MAX - 3, UINT32_MAX),
                         [](const ::testing::TestParamInfo<uint32_t>& info) {
                           return "Start" + std::to_string(info.param);
                         });

TEST_P(RingTest, EmptyRingReturnsEmpty) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  Entry e;
  EXPECT_EQ(c.next(e), PollResult::kEmpty);
  EXPECT_EQ(c.pending_slots(), 0u);
  EXPECT_EQ(p.credits(), kSmall.capacity);
  EXPECT_EQ(p.tail(), start());
  EXPECT_FALSE(p.has_unpublished());
  // Publishing nothing writes nothing.
  p.publish();
  c.publish();
  EXPECT_EQ(ring.tail_word(), start());
  EXPECT_EQ(ring.head_word(), start());
}

TEST_P(RingTest, EverySlotIsUsableAndFullIsTailMinusHeadEqualsCapacity) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  for (uint32_t i = 0; i < kSmall.capacity; ++i) {
    ASSERT_TRUE(push_message(p, numbered_bytes(kOneSlot, i), 100 + i)) << "slot " << i;
  }
  EXPECT_EQ(p.credits(), 0u);
  EXPECT_EQ(p.reserve(0), nullptr);  // full, even after re-reading the head
  p.publish();
  EXPECT_EQ(ring.tail_word() - ring.head_word(), kSmall.capacity);
  EXPECT_EQ(ring.tail_word(), start() + kSmall.capacity);

  for (uint32_t i = 0; i < kSmall.capacity; ++i) {
    std::optional<Message> m = pop_message(c);
    ASSERT_TRUE(m.has_value()) << "entry " << i;
    EXPECT_EQ(m->token, 100u + i);
    EXPECT_EQ(m->payload, numbered_bytes(kOneSlot, i));
  }
  Entry e;
  EXPECT_EQ(c.next(e), PollResult::kEmpty);
  // Read but not given back: the producer still has no room.
  EXPECT_EQ(p.reserve(0), nullptr);
  c.release();
  EXPECT_EQ(p.reserve(0), nullptr);  // released locally, not yet published
  c.publish();
  EXPECT_EQ(ring.head_word(), start() + kSmall.capacity);
  EXPECT_NE(p.reserve(0), nullptr);
  EXPECT_EQ(p.credits(), kSmall.capacity);
}

TEST_P(RingTest, BatchIsInvisibleUntilPublished) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(push_message(p, numbered_bytes(10, i), i));
  }
  EXPECT_TRUE(p.has_unpublished());
  EXPECT_EQ(ring.tail_word(), start());
  Entry e;
  EXPECT_EQ(c.next(e), PollResult::kEmpty);

  p.publish();  // one store for the whole batch
  EXPECT_FALSE(p.has_unpublished());
  EXPECT_EQ(ring.tail_word(), start() + 3);
  for (uint32_t i = 0; i < 3; ++i) {
    std::optional<Message> m = pop_message(c);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->token, i);
    EXPECT_EQ(m->payload, numbered_bytes(10, i));
  }
  EXPECT_EQ(c.next(e), PollResult::kEmpty);

  // The consumer's head moves in the same way: once per publish.
  c.release();
  EXPECT_EQ(ring.head_word(), start());
  c.publish();
  EXPECT_EQ(ring.head_word(), start() + 3);
}

TEST_P(RingTest, MultiSlotMessageIsContiguous) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  // Move to slot 0 of the ring first, so that the 4-slot message fits without a skip.
  const uint32_t to_zero = (kSmall.capacity - position(start())) % kSmall.capacity;
  for (uint32_t i = 0; i < to_zero; ++i) {
    ASSERT_TRUE(push_message(p, {}, i));
  }
  p.publish();
  for (uint32_t i = 0; i < to_zero; ++i) {
    ASSERT_TRUE(pop_message(c).has_value());
  }
  c.release();
  c.publish();

  const std::vector<std::byte> payload = numbered_bytes(200, 7);  // 216 bytes: 4 slots
  ASSERT_EQ(slots_for(200, 64), 4u);
  std::byte* dst = p.reserve(200);
  ASSERT_EQ(dst, ring.slot(0) + kSlotHeaderBytes);
  std::memcpy(dst, payload.data(), payload.size());
  ASSERT_TRUE(p.commit(200, 77, kSlotNoReply));
  EXPECT_EQ(p.tail(), start() + to_zero + 4);
  p.publish();

  const SlotHeader h = ring.header_at(0);
  EXPECT_EQ(h.length, 200u);
  EXPECT_EQ(h.slots, 4u);
  EXPECT_EQ(h.flags, kSlotNoReply);
  EXPECT_EQ(h.token, 77u);

  Entry e;
  ASSERT_EQ(c.next(e), PollResult::kReady);
  EXPECT_EQ(e.payload, ring.slot(0) + kSlotHeaderBytes);  // in place, no copy
  EXPECT_EQ(e.length, 200u);
  EXPECT_EQ(e.flags, kSlotNoReply);
  EXPECT_EQ(e.token, 77u);
  EXPECT_EQ(std::vector<std::byte>(e.payload, e.payload + e.length), payload);
  EXPECT_EQ(c.read_position(), start() + to_zero + 4);
}

// Brings the producer's tail (and the consumer's head) to ring position `target`.
void advance_to(RingProducer& p, RingConsumer& c, uint32_t target) {
  const uint32_t capacity = p.geometry().capacity;
  const uint32_t steps = (target - (p.tail() & (capacity - 1))) & (capacity - 1);
  for (uint32_t i = 0; i < steps; ++i) {
    ASSERT_TRUE(push_message(p, {}, 0));
  }
  p.publish();
  for (uint32_t i = 0; i < steps; ++i) {
    ASSERT_TRUE(pop_message(c).has_value());
  }
  c.release();
  c.publish();
  ASSERT_EQ(p.tail() & (capacity - 1), target);
}

TEST_P(RingTest, MessageThatDoesNotFitAtTheEndGoesToSlotZeroAfterASkip) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  ASSERT_NO_FATAL_FAILURE(advance_to(p, c, 6));
  const uint32_t before = p.tail();

  // 150 bytes: 3 slots, and only 2 are left before the end.
  const std::vector<std::byte> payload = numbered_bytes(150, 3);
  std::byte* dst = p.reserve(150);
  ASSERT_EQ(dst, ring.slot(0) + kSlotHeaderBytes);
  EXPECT_EQ(p.tail(), before + 2);  // the filler is counted at once
  std::memcpy(dst, payload.data(), payload.size());
  ASSERT_TRUE(p.commit(150, 42));
  EXPECT_EQ(p.tail(), before + 5);
  p.publish();

  const SlotHeader skip = ring.header_at(6);
  EXPECT_EQ(skip.flags, kSlotSkip);
  EXPECT_EQ(skip.slots, 2u);
  EXPECT_EQ(skip.length, 0u);

  std::optional<Message> m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 42u);
  EXPECT_EQ(m->payload, payload);
  EXPECT_EQ(c.read_position(), before + 5);
  Entry e;
  EXPECT_EQ(c.next(e), PollResult::kEmpty);
}

TEST_P(RingTest, MessageThatExactlyFillsTheEndNeedsNoSkip) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  ASSERT_NO_FATAL_FAILURE(advance_to(p, c, 5));
  std::byte* dst = p.reserve(150);  // 3 slots: 5, 6, 7
  ASSERT_EQ(dst, ring.slot(5) + kSlotHeaderBytes);
  ASSERT_TRUE(p.commit(150, 1));
  p.publish();
  EXPECT_EQ(ring.header_at(5).slots, 3u);
  EXPECT_EQ(ring.header_at(5).flags, 0u);
  Entry e;
  ASSERT_EQ(c.next(e), PollResult::kReady);
  EXPECT_EQ(e.payload, ring.slot(5) + kSlotHeaderBytes);
}

TEST_P(RingTest, SkipIsNotWrittenWhenTheMessageHasNoRoom) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  ASSERT_NO_FATAL_FAILURE(advance_to(p, c, 0));
  for (uint32_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(push_message(p, {}, i));
  }
  p.publish();
  // The consumer gives back two slots: 4 free, and the message needs 2 (skip) + 3.
  ASSERT_TRUE(pop_message(c).has_value());
  ASSERT_TRUE(pop_message(c).has_value());
  c.release();
  c.publish();
  const uint32_t tail = p.tail();
  const SlotHeader untouched = ring.header_at(6);
  EXPECT_EQ(p.reserve(150), nullptr);
  EXPECT_EQ(p.tail(), tail);
  EXPECT_FALSE(p.has_unpublished());
  EXPECT_EQ(std::memcmp(&untouched, ring.slot(6), sizeof(SlotHeader)), 0);
  EXPECT_FALSE(p.commit(150, 0));  // there is no reservation to complete
  // A message that fits before the end still goes in.
  EXPECT_TRUE(push_message(p, numbered_bytes(100, 0), 9));  // 2 slots: 6 and 7
  // Once the consumer catches up, the big one goes in at slot 0.
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(pop_message(c).has_value());
  }
  p.publish();
  ASSERT_TRUE(pop_message(c).has_value());
  c.release();
  c.publish();
  EXPECT_EQ(p.reserve(150), ring.slot(0) + kSlotHeaderBytes);
}

TEST_P(RingTest, ReserveRefusesMessagesLongerThanTheMaximum) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  EXPECT_EQ(p.reserve(kSmall.max_message_bytes + 1), nullptr);
  EXPECT_EQ(p.reserve(UINT32_MAX), nullptr);
  EXPECT_FALSE(p.commit(0, 0));  // a refused reserve leaves no reservation
  EXPECT_EQ(p.tail(), start());
  EXPECT_EQ(p.credits(), kSmall.capacity);
  EXPECT_NE(p.reserve(kSmall.max_message_bytes), nullptr);
}

TEST_P(RingTest, CommitRefusesMoreThanWasReserved) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  EXPECT_FALSE(p.commit(0, 0));                  // nothing reserved
  ASSERT_NO_FATAL_FAILURE(advance_to(p, c, 0));  // no skips below
  const uint32_t base = p.tail();

  ASSERT_NE(p.reserve(10), nullptr);        // one slot
  EXPECT_FALSE(p.commit(kOneSlot + 1, 0));  // would need two
  EXPECT_EQ(p.tail(), base);
  EXPECT_TRUE(p.commit(kOneSlot, 5));  // the reservation survives a refused commit
  EXPECT_EQ(p.tail(), base + 1);
  EXPECT_FALSE(p.commit(kOneSlot, 5));  // and is used up by a successful one

  // Committing less than was reserved takes only the slots the length needs.
  ASSERT_NE(p.reserve(200), nullptr);  // four slots
  EXPECT_TRUE(p.commit(3, 6));
  EXPECT_EQ(p.tail(), base + 2);

  // A later reserve abandons the previous reservation.
  ASSERT_NE(p.reserve(200), nullptr);
  std::byte* dst = p.reserve(5);
  ASSERT_NE(dst, nullptr);
  std::memcpy(dst, "hello", 5);
  EXPECT_TRUE(p.commit(5, 7));
  p.publish();

  std::optional<Message> m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 5u);
  EXPECT_EQ(m->payload.size(), kOneSlot);
  m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 6u);
  EXPECT_EQ(m->payload.size(), 3u);
  m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 7u);
  EXPECT_EQ(m->payload, test::bytes_of("hello"));
  EXPECT_FALSE(pop_message(c).has_value());
}

TEST_P(RingTest, UnreadReturnsTheSameEntryAgain) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  // Entry A, then B placed after a skip so unread must not land on the filler.
  ASSERT_NO_FATAL_FAILURE(advance_to(p, c, 6));
  ASSERT_TRUE(push_message(p, numbered_bytes(10, 1), 1));   // slot 6
  ASSERT_TRUE(push_message(p, numbered_bytes(100, 2), 2));  // 2 slots: skip 7, then 0-1
  p.publish();

  std::optional<Message> a = pop_message(c);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->token, 1u);
  c.unread();
  a = pop_message(c);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->token, 1u);

  std::optional<Message> b = pop_message(c);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->token, 2u);
  const uint32_t after_b = c.read_position();
  c.unread();
  EXPECT_EQ(c.read_position(), after_b - 2);  // back to B itself, not to the skip before it
  b = pop_message(c);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->token, 2u);
  EXPECT_EQ(b->payload, numbered_bytes(100, 2));

  // Nothing before a release comes back.
  c.release();
  c.unread();
  EXPECT_FALSE(pop_message(c).has_value());
  EXPECT_EQ(c.head(), after_b);
}

TEST_P(RingTest, ReleaseToGivesBackOnlyTheEntriesBeforeTheMark) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  for (uint64_t token = 1; token <= 4; ++token)
    ASSERT_TRUE(push_message(p, numbered_bytes(kOneSlot, token), token));
  p.publish();
  ASSERT_TRUE(pop_message(c).has_value());
  const ReadMark before_second = c.mark();
  ASSERT_TRUE(pop_message(c).has_value());
  const ReadMark before_third = c.mark();
  ASSERT_TRUE(pop_message(c).has_value());
  EXPECT_EQ(c.distance(before_second), 1u);
  EXPECT_EQ(c.distance(before_third), 2u);
  // Entry 2 is held: only entry 1 goes back, though 3 was read too.
  c.release_to(before_second);
  c.publish();
  EXPECT_EQ(c.head(), start() + 1);
  p.refresh_credits();
  EXPECT_EQ(p.credits(), 5u);
  // Reading goes on past what is held; a full release gives back everything read.
  const std::optional<Message> fourth = pop_message(c);
  ASSERT_TRUE(fourth.has_value());
  EXPECT_EQ(fourth->token, 4u);
  EXPECT_EQ(fourth->payload, numbered_bytes(kOneSlot, 4));
  c.release();
  c.publish();
  p.refresh_credits();
  EXPECT_EQ(p.credits(), 8u);
}

TEST_P(RingTest, ProducerRereadsTheHeadOnlyWhenCreditsRunOut) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(push_message(p, {}, i));
  }
  p.publish();
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(pop_message(c).has_value());
  }
  c.release();
  c.publish();
  EXPECT_EQ(ring.head_word(), start() + 4);

  // The shadow head is stale, and stays so while the credits it gives suffice.
  EXPECT_EQ(p.credits(), 4u);
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(push_message(p, {}, i));
  }
  EXPECT_EQ(p.credits(), 0u);
  // Out of credits: this reserve re-reads the head and finds 4 more.
  ASSERT_TRUE(push_message(p, {}, 0));
  EXPECT_EQ(p.credits(), 3u);
  // An explicit refresh does the same.
  p.publish();
  for (uint32_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(pop_message(c).has_value());
  }
  c.release();
  c.publish();
  EXPECT_EQ(p.credits(), 3u);
  p.refresh_credits();
  EXPECT_EQ(p.credits(), 8u);
}

TEST_P(RingTest, ConsumerRereadsTheTailOnlyWhenItHasReadEverything) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  ASSERT_TRUE(push_message(p, {}, 1));
  ASSERT_TRUE(push_message(p, {}, 2));
  p.publish();
  std::optional<Message> m = pop_message(c);  // re-reads the tail: two entries
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 1u);
  EXPECT_EQ(c.pending_slots(), 1u);

  ASSERT_TRUE(push_message(p, {}, 3));
  ASSERT_TRUE(push_message(p, {}, 4));
  p.publish();
  EXPECT_EQ(c.pending_slots(), 1u);  // the shadow tail is not re-read while entries remain
  m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 2u);
  EXPECT_EQ(c.pending_slots(), 0u);
  m = pop_message(c);  // now it re-reads
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 3u);
  EXPECT_EQ(c.pending_slots(), 1u);
  c.refresh_tail();
  EXPECT_EQ(c.pending_slots(), 1u);
}

TEST_P(RingTest, WithoutRefreshTheConsumerStopsAtTheTailItKnows) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  ASSERT_TRUE(push_message(p, {}, 1));
  p.publish();
  Entry e;
  ASSERT_EQ(c.next(e), PollResult::kReady);  // reads the tail
  ASSERT_TRUE(push_message(p, {}, 2));
  p.publish();
  EXPECT_EQ(c.next(e, false), PollResult::kEmpty);  // published, but not known yet
  ASSERT_EQ(c.next(e, true), PollResult::kReady);
  EXPECT_EQ(e.token, 2u);
}

// An old index write can land after newer ones (it happens under Soft-RoCE): the tail word
// then goes backwards. A consumer that took it would read past the producer's entries into
// stale slots; it keeps the tail it knows instead, and takes the next valid one.
TEST_P(RingTest, ATailBehindWhatWasReadIsIgnored) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(push_message(p, {}, 10 + i));
  }
  p.publish();
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(pop_message(c).has_value());
  }
  ring.tail_word() = start() + 1;  // an old publication lands late
  Entry e;
  EXPECT_EQ(c.next(e), PollResult::kEmpty);
  EXPECT_EQ(c.pending_slots(), 0u);
  ring.tail_word() = start() - 5 * kSmall.capacity;  // far behind: a huge unsigned distance
  EXPECT_EQ(c.next(e), PollResult::kEmpty);
  ASSERT_TRUE(push_message(p, {}, 13));
  p.publish();
  std::optional<Message> m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 13u);
}

// The same for the producer: a head outside [the head it knows, its tail] would count slots as
// free that the consumer still reads.
TEST_P(RingTest, AHeadOutsideTheKnownHeadAndTheTailIsIgnored) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  for (uint32_t i = 0; i < kSmall.capacity; ++i) {
    ASSERT_TRUE(push_message(p, {}, i));
  }
  p.publish();
  for (uint32_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(pop_message(c).has_value());
  }
  c.release();
  c.publish();
  p.refresh_credits();
  ASSERT_EQ(p.credits(), 2u);
  ring.head_word() = start() + 1;  // behind the head the producer knows
  p.refresh_credits();
  EXPECT_EQ(p.credits(), 2u);
  ring.head_word() = start() - kSmall.capacity;  // a full ring behind: would read as all free
  p.refresh_credits();
  EXPECT_EQ(p.credits(), 2u);
  ring.head_word() = start() + kSmall.capacity + 1;  // past the tail
  p.refresh_credits();
  EXPECT_EQ(p.credits(), 2u);
  ring.head_word() = start() + 3;  // valid again
  p.refresh_credits();
  EXPECT_EQ(p.credits(), 3u);
}

TEST_P(RingTest, PeekGivesTheFirstUnreadSlotAndTheSlotsPublishedUpToTheEnd) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  uint32_t contiguous = 99;
  EXPECT_EQ(c.peek(contiguous), nullptr);
  EXPECT_EQ(contiguous, 0u);
  ASSERT_TRUE(push_message(p, numbered_bytes(kOneSlot + 1, 1), 7));  // two slots
  ASSERT_TRUE(push_message(p, {}, 8));
  p.publish();
  const std::byte* first = c.peek(contiguous);
  ASSERT_EQ(first, ring.slot(position(start())));
  const uint32_t to_end = kSmall.capacity - position(start());
  EXPECT_EQ(contiguous, std::min(3u, to_end));
}

TEST_P(RingTest, NextTakesTheFirstHeaderFromTheImage) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  ASSERT_TRUE(push_message(p, numbered_bytes(10, 1), 5));
  ASSERT_TRUE(push_message(p, numbered_bytes(3, 2), 6));
  p.publish();
  uint32_t contiguous = 0;
  const std::byte* first = c.peek(contiguous);
  ASSERT_NE(first, nullptr);
  std::vector<std::byte> image(first, first + kSmall.slot_bytes);
  // The ring's own copy changes after the image was taken: the first entry comes from the image
  // (token 5), the next one from the ring.
  SlotHeader changed = ring.header_at(position(start()));
  changed.token = 99;
  ring.write_header(position(start()), changed);
  Entry e;
  ASSERT_EQ(c.next(e, false, image.data()), PollResult::kReady);
  EXPECT_EQ(e.token, 5u);
  EXPECT_EQ(e.length, 10u);
  EXPECT_EQ(e.payload, first + kSlotHeaderBytes);  // the payload pointer is into the ring
  ASSERT_EQ(c.next(e, false), PollResult::kReady);
  EXPECT_EQ(e.token, 6u);
  EXPECT_EQ(c.next(e, false), PollResult::kEmpty);
}

TEST_P(RingTest, AnImageOfACorruptHeaderIsRefused) {
  LocalRing ring(kSmall, start());
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  ASSERT_TRUE(push_message(p, {}, 1));
  p.publish();
  uint32_t contiguous = 0;
  const std::byte* first = c.peek(contiguous);
  ASSERT_NE(first, nullptr);
  std::vector<std::byte> image(first, first + kSmall.slot_bytes);
  SlotHeader bad{};
  bad.length = 0;
  bad.slots = 5;  // more than were published
  std::memcpy(image.data(), &bad, sizeof(bad));
  Entry e;
  EXPECT_EQ(c.next(e, false, image.data()), PollResult::kCorrupt);
}

TEST_P(RingTest, ConstructorsPickUpIndexesAlreadyInTheRing) {
  LocalRing ring(kSmall, start());
  {
    RingProducer p = ring.producer();
    ASSERT_TRUE(push_message(p, numbered_bytes(30, 1), 11));
    ASSERT_TRUE(push_message(p, numbered_bytes(30, 2), 12));
    p.publish();
  }
  {
    RingConsumer c = ring.consumer();
    std::optional<Message> m = pop_message(c);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->token, 11u);
    c.release();
    c.publish();
  }
  // A new pair (say, after a restart of the agent's workers) continues where the old one was.
  RingProducer p = ring.producer();
  RingConsumer c = ring.consumer();
  EXPECT_EQ(p.tail(), start() + 2);
  EXPECT_EQ(c.head(), start() + 1);
  EXPECT_EQ(p.credits(), kSmall.capacity - 1);
  std::optional<Message> m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 12u);
  EXPECT_EQ(m->payload, numbered_bytes(30, 2));
}

// Random traffic across the 32-bit wrap, checked against a model queue.
TEST(RingWrap, RandomTrafficAcrossTheIndexWrap) {
  for (uint32_t start : {UINT32_MAX - 100, UINT32_MAX - 7, UINT32_MAX}) {
    LocalRing ring(kSmall, start);
    RingProducer p = ring.producer();
    RingConsumer c = ring.consumer();
    std::mt19937 rng(start);
    std::deque<Message> model;
    uint64_t token = 0;
    uint32_t popped = 0;
    while (popped < 2000) {
      // A burst of pushes, as many as fit.
      const uint32_t pushes = rng() % 5;
      for (uint32_t i = 0; i < pushes; ++i) {
        const uint32_t length = rng() % (kSmall.max_message_bytes + 1);
        std::vector<std::byte> payload = numbered_bytes(length, static_cast<uint32_t>(token));
        if (!push_message(p, payload, token)) break;
        model.push_back(Message{std::move(payload), token, 0});
        ++token;
      }
      if (rng() % 4 != 0) p.publish();
      // A burst of pops.
      const uint32_t pops = rng() % 5;
      for (uint32_t i = 0; i < pops; ++i) {
        std::optional<Message> m = pop_message(c);
        if (!m.has_value()) break;
        ASSERT_FALSE(model.empty()) << "consumer saw an entry the producer never wrote";
        ASSERT_EQ(m->token, model.front().token) << "start " << start;
        ASSERT_EQ(m->payload, model.front().payload) << "token " << m->token;
        model.pop_front();
        ++popped;
      }
      c.release();
      if (rng() % 3 != 0) c.publish();
      ASSERT_LE(ring.tail_word() - ring.head_word(), kSmall.capacity);
    }
    EXPECT_LT(p.tail(), start) << "the tail index was meant to wrap past zero";
  }
}

TEST(RegionViewRings, RingsUseTheirQueuesIndexWordsAndMemory) {
  const RegionGeometry g{2, 1, 128, 16, 8 * 128 - kSlotHeaderBytes};
  LocalRegion region(g);
  const RegionView view = region.view();
  const RegionHeader& h = view.header();
  EXPECT_EQ(std::memcmp(&h, &region.header(), sizeof(h)), 0);
  EXPECT_EQ(view.server_queue_count(), 2u);
  EXPECT_EQ(view.client_queue_count(), 1u);
  const RingGeometry rg = ring_geometry(h);
  EXPECT_EQ(rg.slot_bytes, 128u);
  EXPECT_EQ(rg.capacity, 16u);
  EXPECT_EQ(rg.max_message_bytes, g.max_message_bytes);

  for (uint32_t q = 0; q < 3; ++q) {
    EXPECT_EQ(reinterpret_cast<std::byte*>(view.index_word(IndexArray::kTxTail, q)),
              region.base() + index_offset(h, IndexArray::kTxTail, q));
  }

  // The accelerator replies on queue 1's TX ring; a stand-in for the SmartNIC reads it with a
  // consumer built on the same words.
  RingProducer tx = view.tx_producer(1);
  const std::vector<std::byte> reply = numbered_bytes(300, 1);
  ASSERT_TRUE(push_message(tx, reply, 0xFEED));
  tx.publish();
  auto word = [&](IndexArray a, uint32_t q) {
    uint32_t v;
    std::memcpy(&v, region.base() + index_offset(h, a, q), sizeof(v));
    return v;
  };
  EXPECT_EQ(word(IndexArray::kTxTail, 1), slots_for(300, 128));
  EXPECT_EQ(word(IndexArray::kTxTail, 0), 0u);
  EXPECT_EQ(word(IndexArray::kTxTail, 2), 0u);
  EXPECT_EQ(word(IndexArray::kRxTail, 1), 0u);
  SlotHeader sh;
  std::memcpy(&sh, region.base() + tx_ring_offset(h, 1), sizeof(sh));
  EXPECT_EQ(sh.token, 0xFEEDu);
  EXPECT_EQ(sh.length, 300u);
  EXPECT_EQ(std::memcmp(region.base() + tx_ring_offset(h, 1) + kSlotHeaderBytes, reply.data(),
                        reply.size()),
            0);

  RingConsumer nic_tx(region.base() + tx_ring_offset(h, 1), rg,
                      view.index_word(IndexArray::kTxTail, 1),
                      view.index_word(IndexArray::kTxHead, 1));
  std::optional<Message> m = pop_message(nic_tx);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, reply);
  nic_tx.release();
  nic_tx.publish();
  EXPECT_EQ(word(IndexArray::kTxHead, 1), slots_for(300, 128));

  // The other way: a stand-in SmartNIC produces into client queue 2's RX ring.
  RingProducer nic_rx(region.base() + rx_ring_offset(h, 2), rg,
                      view.index_word(IndexArray::kRxTail, 2),
                      view.index_word(IndexArray::kRxHead, 2));
  ASSERT_TRUE(push_message(nic_rx, test::bytes_of("reply to a client call"), 3));
  nic_rx.publish();
  RingConsumer rx = view.rx_consumer(2);
  RingConsumer rx0 = view.rx_consumer(0);
  EXPECT_FALSE(pop_message(rx0).has_value()) << "queue 0 is empty";
  m = pop_message(rx);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, test::bytes_of("reply to a client call"));
  EXPECT_EQ(m->token, 3u);
  rx.release();
  rx.publish();
  EXPECT_EQ(word(IndexArray::kRxHead, 2), 1u);
}

TEST(RegionViewRings, StopWord) {
  LocalRegion region(RegionGeometry{});
  const RegionView view = region.view();
  EXPECT_FALSE(view.stop_requested());
  view.request_stop();
  EXPECT_TRUE(view.stop_requested());
  uint32_t v;
  std::memcpy(&v, region.base() + stop_word_offset(region.header()), sizeof(v));
  EXPECT_EQ(v, 1u);
  view.clear_stop();
  EXPECT_FALSE(view.stop_requested());
}

// Whatever the tail position, an empty ring takes the largest message its geometry allows:
// otherwise a producer could wait forever on a ring nobody is using. The limit is whatever
// validate_geometry accepts, found by asking it.
TEST(RingLiveness, LargestAllowedMessageFitsAnEmptyRingAtEveryPosition) {
  for (uint32_t capacity : {2u, 4u, 8u, 16u, 64u}) {
    for (uint32_t slot_bytes : {64u, 256u}) {
      RegionGeometry g{1, 0, slot_bytes, capacity, 1};
      uint32_t low = 1;
      uint32_t high = slot_bytes * capacity;  // refused: more than the ring holds
      ASSERT_TRUE(validate_geometry(g).ok());
      while (high - low > 1) {
        g.max_message_bytes = low + (high - low) / 2;
        (validate_geometry(g).ok() ? low : high) = g.max_message_bytes;
      }
      const RingGeometry rg{slot_bytes, capacity, low};
      for (uint32_t start = 0; start < capacity; ++start) {
        LocalRing ring(rg, start);
        RingProducer p = ring.producer();
        EXPECT_NE(p.reserve(low), nullptr)
            << "a " << low << "-byte message (" << slots_for(low, slot_bytes) << " of " << capacity
            << " slots of " << slot_bytes << " bytes) never fits an empty ring "
            << "whose tail is at position " << start;
      }
    }
  }
}

}  // namespace
}  // namespace caracal::mqueue
