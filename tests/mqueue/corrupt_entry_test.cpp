// Entries a consumer must refuse: check_entry itself, and RingConsumer / RemoteRingConsumer
// stopping at a hand-crafted bad SlotHeader with the right reason.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/shm.hpp"
#include "test_support.hpp"

namespace caracal::mqueue {
namespace {

using test::LocalRegion;
using test::LocalRing;

// 8 slots of 64 bytes; messages up to 240 bytes (4 slots).
constexpr RingGeometry kGeometry{64, 8, 4 * 64 - kSlotHeaderBytes};

TEST(CheckEntry, AcceptsWellFormedEntries) {
  EXPECT_EQ(check_entry(SlotHeader{0, 0, 1, 0}, 0, 1, kGeometry), EntryCheck::kOk);
  EXPECT_EQ(check_entry(SlotHeader{48, 0, 1, 0}, 7, 1, kGeometry), EntryCheck::kOk);
  EXPECT_EQ(check_entry(SlotHeader{240, kSlotError | kSlotNoReply, 4, 0}, 4, 4, kGeometry),
            EntryCheck::kOk);
  // A skip marker's length means nothing; it may run to the ring's end.
  EXPECT_EQ(check_entry(SlotHeader{999, kSlotSkip, 3, 0}, 5, 3, kGeometry), EntryCheck::kOk);
}

TEST(CheckEntry, NamesEachDefect) {
  EXPECT_EQ(check_entry(SlotHeader{0, 0, 0, 0}, 0, 8, kGeometry), EntryCheck::kZeroSlots);
  EXPECT_EQ(check_entry(SlotHeader{150, 0, 3, 0}, 6, 8, kGeometry), EntryCheck::kPastRingEnd);
  EXPECT_EQ(check_entry(SlotHeader{100, 0, 2, 0}, 0, 1, kGeometry), EntryCheck::kPastTail);
  EXPECT_EQ(check_entry(SlotHeader{10, 0, 2, 0}, 0, 8, kGeometry), EntryCheck::kLengthMismatch);
  EXPECT_EQ(check_entry(SlotHeader{100, 0, 1, 0}, 0, 8, kGeometry), EntryCheck::kLengthMismatch);
  EXPECT_EQ(check_entry(SlotHeader{241, 0, 5, 0}, 0, 8, kGeometry), EntryCheck::kTooLong);
  EXPECT_EQ(check_entry(SlotHeader{10, 1u << 3, 1, 0}, 0, 8, kGeometry), EntryCheck::kUnknownFlags);
  EXPECT_EQ(check_entry(SlotHeader{0, kSlotSkip, 0, 0}, 0, 8, kGeometry), EntryCheck::kZeroSlots);
  EXPECT_EQ(check_entry(SlotHeader{0, kSlotSkip, 3, 0}, 6, 8, kGeometry), EntryCheck::kPastRingEnd);
  EXPECT_EQ(check_entry(SlotHeader{0, kSlotSkip, 2, 0}, 6, 1, kGeometry), EntryCheck::kPastTail);
  // 16-bit slot counts far past the ring.
  EXPECT_EQ(check_entry(SlotHeader{0, 0, 0xFFFF, 0}, 0, 8, kGeometry), EntryCheck::kPastRingEnd);
  // A length near 2^32 is refused without overflowing.
  EXPECT_EQ(check_entry(SlotHeader{UINT32_MAX, 0, 1, 0}, 0, 8, kGeometry), EntryCheck::kTooLong);
}

TEST(CheckEntry, EveryCheckHasAName) {
  for (EntryCheck c :
       {EntryCheck::kOk, EntryCheck::kZeroSlots, EntryCheck::kPastRingEnd, EntryCheck::kPastTail,
        EntryCheck::kLengthMismatch, EntryCheck::kTooLong, EntryCheck::kUnknownFlags}) {
    EXPECT_STRNE(entry_check_name(c), "?") << static_cast<int>(c);
  }
}

// A ring written by hand: entries at ring positions, and the tail the "producer" published.
struct CorruptCase {
  const char* name;
  uint32_t start;  // head and tail before the entries; the first entry is at start's position
  std::vector<std::pair<uint32_t, SlotHeader>> entries;  // (position, header)
  uint32_t published_slots;                              // tail = start + this
  uint32_t good_entries;                                 // entries read before the bad one
  EntryCheck expected;
};

void PrintTo(const CorruptCase& c, std::ostream* os) {
  *os << c.name;
}

const CorruptCase kCases[] = {
    {"ZeroSlots", 0, {{0, {0, 0, 0, 0}}}, 1, 0, EntryCheck::kZeroSlots},
    {"PastRingEnd", 6, {{6, {150, 0, 3, 0}}}, 3, 0, EntryCheck::kPastRingEnd},
    {"PastTail", 0, {{0, {100, 0, 2, 0}}}, 1, 0, EntryCheck::kPastTail},
    {"TooManySlotsForLength", 0, {{0, {10, 0, 2, 0}}}, 2, 0, EntryCheck::kLengthMismatch},
    {"TooFewSlotsForLength", 0, {{0, {100, 0, 1, 0}}}, 1, 0, EntryCheck::kLengthMismatch},
    {"TooLong", 0, {{0, {241, 0, 5, 0}}}, 5, 0, EntryCheck::kTooLong},
    {"UnknownFlags", 0, {{0, {10, 1u << 3, 1, 0}}}, 1, 0, EntryCheck::kUnknownFlags},
    {"SkipWithZeroSlots", 0, {{0, {0, kSlotSkip, 0, 0}}}, 1, 0, EntryCheck::kZeroSlots},
    {"SkipPastRingEnd", 6, {{6, {0, kSlotSkip, 3, 0}}}, 3, 0, EntryCheck::kPastRingEnd},
    {"SkipPastTail", 6, {{6, {0, kSlotSkip, 2, 0}}}, 1, 0, EntryCheck::kPastTail},
    {"AfterAGoodEntry", 0, {{0, {10, 0, 1, 7}}, {1, {0, 0, 0, 0}}}, 2, 1, EntryCheck::kZeroSlots},
    {"AfterASkip",
     6,
     {{6, {0, kSlotSkip, 2, 0}}, {0, {100, 0, 1, 0}}},
     3,
     0,
     EntryCheck::kLengthMismatch},
    {"AcrossTheIndexWrap",
     UINT32_MAX,
     {{7, {10, 0, 1, 7}}, {0, {10, 0, 1, 8}}, {1, {0, 0, 9, 0}}},
     3,
     2,
     EntryCheck::kPastRingEnd},
};

class CorruptEntryTest : public ::testing::TestWithParam<CorruptCase> {};

INSTANTIATE_TEST_SUITE_P(Cases, CorruptEntryTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<CorruptCase>& info) {
                           return info.param.name;
                         });

TEST_P(CorruptEntryTest, RingConsumerStopsWithTheReason) {
  const CorruptCase& c = GetParam();
  LocalRing ring(kGeometry, c.start);
  for (const auto& [position, header] : c.entries) {
    ring.write_header(position, header);
  }
  ring.tail_word() = c.start + c.published_slots;
  RingConsumer consumer = ring.consumer();
  Entry e;
  for (uint32_t i = 0; i < c.good_entries; ++i) {
    ASSERT_EQ(consumer.next(e), PollResult::kReady) << "good entry " << i;
    EXPECT_EQ(consumer.last_check(), EntryCheck::kOk);
  }
  EXPECT_EQ(consumer.next(e), PollResult::kCorrupt);
  EXPECT_EQ(consumer.last_check(), c.expected) << entry_check_name(consumer.last_check());
  // The ring stays stopped at the bad entry; it is not skipped over.
  const uint32_t stopped_at = consumer.read_position();
  EXPECT_EQ(consumer.next(e), PollResult::kCorrupt);
  EXPECT_EQ(consumer.last_check(), c.expected);
  EXPECT_EQ(consumer.read_position(), stopped_at);
}

TEST_P(CorruptEntryTest, RemoteRingConsumerStopsWithTheReason) {
  const CorruptCase& c = GetParam();
  // Queue 1's TX ring of a two-queue region, read through the shm transport.
  LocalRegion region(
      RegionGeometry{2, 0, kGeometry.slot_bytes, kGeometry.capacity, kGeometry.max_message_bytes});
  const RegionHeader& h = region.header();
  auto set_word = [&](IndexArray a, uint32_t v) {
    std::memcpy(region.base() + index_offset(h, a, 1), &v, sizeof(v));
  };
  set_word(IndexArray::kTxHead, c.start);
  set_word(IndexArray::kTxTail, c.start);
  ShmTransport transport(region.base(), h.region_bytes);
  Result<RemoteRegion<ShmTransport>> remote = RemoteRegion<ShmTransport>::attach(&transport);
  ASSERT_TRUE(remote.ok()) << remote.status().message();
  RemoteRingConsumer<ShmTransport>& consumer = remote->tx(1);
  EXPECT_EQ(consumer.head(), c.start);

  for (const auto& [position, header] : c.entries) {
    std::memcpy(region.base() + tx_ring_offset(h, 1) + uint64_t{position} * h.slot_bytes, &header,
                sizeof(header));
  }
  set_word(IndexArray::kTxTail, c.start + c.published_slots);
  remote->fetch_tx_tails();
  ASSERT_TRUE(remote->deliver_tx_tails());

  Entry e;
  for (uint32_t i = 0; i < c.good_entries; ++i) {
    ASSERT_EQ(consumer.next(e), PollResult::kReady) << "good entry " << i;
  }
  EXPECT_EQ(consumer.next(e), PollResult::kCorrupt);
  EXPECT_EQ(consumer.last_check(), c.expected) << entry_check_name(consumer.last_check());
  EXPECT_EQ(consumer.next(e), PollResult::kCorrupt);
  EXPECT_EQ(consumer.last_check(), c.expected);
  // The other queue is unaffected.
  EXPECT_EQ(remote->tx(0).next(e), PollResult::kEmpty);
  EXPECT_EQ(remote->tx(0).last_check(), EntryCheck::kOk);
}

}  // namespace
}  // namespace caracal::mqueue
