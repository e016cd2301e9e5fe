// RX lines (kFeatureRxLines, layout.hpp): the SmartNIC announces each RX entry in an LL line
// and the accelerator may find an entry through its line (next_by_line, or a group's image)
// instead of the tail, which it still uses for bursts. The SmartNIC side is RemoteRingProducer
// over ShmTransport, the accelerator side RingConsumer, on one region in local memory.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "caracal/mqueue/validate.hpp"
#include "test_support.hpp"

namespace caracal::mqueue {
namespace {

using test::LocalRegion;
using test::Message;
using test::numbered_bytes;
using test::pop_by_line;
using test::pop_message;
using test::push_message;

RegionGeometry lines_geometry() {
  return test::small_lines_geometry(/*rx_lines=*/true, /*tx_lines=*/false);
}

class RxLinesTest : public ::testing::Test, public test::ShmPair {
 protected:
  RxLinesTest() : ShmPair(lines_geometry()) {}

  const uint64_t* line(uint32_t queue, uint32_t index) const {
    return region_.view().rx_lines(queue) + size_t{index} * kLineWords;
  }
};

TEST(RxLinesLayout, LinesFollowTheRingsOneLineASlot) {
  const RegionHeader h = compute_layout(lines_geometry(), 1);
  EXPECT_EQ(h.features, kFeatureRxLines);
  EXPECT_EQ(h.line_bytes, kLineBytes);
  EXPECT_EQ(h.lines_offset, h.rings_offset + 2 * 3 * h.ring_stride);
  EXPECT_EQ(h.line_stride, kPageBytes);  // 8 lines of 256 bytes, rounded up to a page
  EXPECT_EQ(h.region_bytes, h.lines_offset + 3 * h.line_stride);
  EXPECT_EQ(rx_lines_offset(h, 2), h.lines_offset + 2 * h.line_stride);
  EXPECT_TRUE(validate_region(h, h.region_bytes).ok());

  RegionGeometry plain = lines_geometry();
  plain.rx_lines = false;
  const RegionHeader p = compute_layout(plain, 1);
  EXPECT_EQ(p.features, 0u);
  EXPECT_EQ(p.line_bytes, 0u);
  EXPECT_EQ(p.lines_offset, 0u);
  EXPECT_EQ(p.region_bytes, h.lines_offset);  // the same layout, without the lines
  LocalRegion r(plain);
  EXPECT_EQ(r.view().rx_lines(0), nullptr);
}

TEST(RxLinesLayout, LineWordsCarryDataLowAndFlagHigh) {
  static_assert(kLineWords == 32 && kLineInlineBytes == 112);
  EXPECT_EQ(line_word(7, 0xAABBCCDD), 0x0000'0007'AABB'CCDDULL);
  EXPECT_EQ(line_word_flag(line_word(7, 0xAABBCCDD)), 7u);
  EXPECT_EQ(line_word_data(line_word(7, 0xAABBCCDD)), 0xAABBCCDDu);
  // A zeroed line is no entry of the first lap; the entry count wraps to flag 0 only at the
  // last index, whose line was written a lap earlier.
  EXPECT_EQ(line_flag(0), 1u);
  EXPECT_EQ(line_flag(UINT32_MAX), 0u);
}

TEST_F(RxLinesTest, EntryIsAnnouncedByItsLineWithTheHeaderAndAShortPayloadInline) {
  RemoteRegion<ShmTransport> remote = attach();
  const std::vector<std::byte> payload = numbered_bytes(40, 3);
  ASSERT_TRUE(push_message(remote.rx(0), payload, 0x1234'5678'9ABC'DEF0ULL));

  const uint64_t* l = line(0, 0);
  uint32_t data[kLineWords];
  for (uint32_t k = 0; k < kLineWords; ++k) {
    EXPECT_EQ(line_word_flag(l[k]), line_flag(0)) << "word " << k;
    data[k] = line_word_data(l[k]);
  }
  SlotHeader h;
  std::memcpy(&h, data, sizeof(h));
  EXPECT_EQ(h.length, 40u);
  EXPECT_EQ(h.slots, 1u);
  EXPECT_EQ(h.token, 0x1234'5678'9ABC'DEF0ULL);
  EXPECT_EQ(std::memcmp(reinterpret_cast<std::byte*>(data) + kSlotHeaderBytes, payload.data(), 40),
            0);
  for (uint32_t i = kSlotHeaderBytes + 40; i < kLineDataBytes; ++i)
    EXPECT_EQ(reinterpret_cast<std::byte*>(data)[i], std::byte{0}) << "padding byte " << i;

  // Not published: the tail still says 0. By the tail there is nothing; by the line there is
  // the entry, its payload taken from the line.
  EXPECT_EQ(word(IndexArray::kRxTail, 0), 0u);
  RingConsumer rx = region_.view().rx_consumer(0);
  ASSERT_TRUE(rx.has_lines());
  EXPECT_FALSE(pop_message(rx).has_value());
  const std::optional<Message> m = pop_by_line(rx);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, payload);
  EXPECT_EQ(m->token, 0x1234'5678'9ABC'DEF0ULL);
  EXPECT_FALSE(pop_by_line(rx).has_value());
  // The tail that comes later covers what the line gave: nothing is taken twice.
  remote.rx(0).publish();
  EXPECT_FALSE(pop_message(rx).has_value());
  EXPECT_EQ(rx.pending_slots(), 0u);
}

TEST_F(RxLinesTest, WithoutAnImageTheConsumerGoesByTheTailAndKeepsTheLineCount) {
  RemoteRegion<ShmTransport> remote = attach();
  RingConsumer rx = region_.view().rx_consumer(0);
  ASSERT_TRUE(push_message(remote.rx(0), numbered_bytes(8, 1), 1));
  ASSERT_TRUE(push_message(remote.rx(0), numbered_bytes(200, 2), 2));
  remote.rx(0).publish();
  ASSERT_EQ(pop_message(rx)->token, 1u);
  ASSERT_EQ(pop_message(rx)->token, 2u);
  EXPECT_EQ(rx.entries(), 2u);
  rx.release();
  rx.publish();
  // The next entry's line is the third: a consumer that switches to lines finds it.
  ASSERT_TRUE(push_message(remote.rx(0), numbered_bytes(8, 3), 3));
  const std::optional<Message> m = pop_by_line(rx);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 3u);
}

TEST_F(RxLinesTest, ABurstGoesOnByATailHintAfterTheLinesEntry) {
  RemoteRegion<ShmTransport> remote = attach();
  RingConsumer rx = region_.view().rx_consumer(1);
  for (uint64_t t = 1; t <= 3; ++t)
    ASSERT_TRUE(push_message(remote.rx(1), numbered_bytes(40, static_cast<uint32_t>(t)), t));
  remote.rx(1).publish();
  ASSERT_EQ(pop_by_line(rx)->token, 1u);
  Entry e;
  // Without refresh and without a hint, the consumer does not read the tail.
  EXPECT_EQ(rx.next(e, /*refresh=*/false), PollResult::kEmpty);
  rx.load_tail_hint();  // what a GPU leader loads next to the line
  ASSERT_EQ(rx.next(e, /*refresh=*/false), PollResult::kReady);
  EXPECT_EQ(e.token, 2u);
  ASSERT_EQ(rx.next(e, /*refresh=*/false), PollResult::kReady);
  EXPECT_EQ(e.token, 3u);
  EXPECT_EQ(rx.next(e, /*refresh=*/false), PollResult::kEmpty);
  EXPECT_EQ(rx.entries(), 3u);
  // A hint behind what the lines gave is no entry.
  ASSERT_TRUE(push_message(remote.rx(1), numbered_bytes(40, 4), 4));
  ASSERT_EQ(pop_by_line(rx)->token, 4u);
  rx.load_tail_hint();  // still 3 entries' worth: the fourth is not published
  EXPECT_EQ(rx.next(e, /*refresh=*/false), PollResult::kEmpty);
}

TEST_F(RxLinesTest, AStaleOrHalfWrittenLineIsNotAnEntry) {
  RemoteRegion<ShmTransport> remote = attach();
  RingConsumer rx = region_.view().rx_consumer(0);
  // A whole lap of one-slot entries, read and given back.
  for (uint32_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(push_message(remote.rx(0), numbered_bytes(8, i), i));
    ASSERT_TRUE(pop_by_line(rx).has_value()) << i;
    rx.release();
    rx.publish();
  }
  remote.rx(0).publish();
  // Line 0 still holds entry 0; entry 8 is due there. Its flag is not entry 8's.
  EXPECT_FALSE(pop_by_line(rx).has_value());

  // Entry 8's flag in the first word only: the header is not all there.
  auto* first = const_cast<uint64_t*>(line(0, 0));
  const uint64_t old = first[0];
  first[0] = line_word(line_flag(8), line_word_data(old));
  EXPECT_FALSE(pop_by_line(rx).has_value());
  first[0] = old;

  ASSERT_TRUE(push_message(remote.rx(0), numbered_bytes(8, 8), 8));
  const std::optional<Message> m = pop_by_line(rx);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 8u);
}

TEST_F(RxLinesTest, LongEntriesAndSkipMarkersHaveLinesAndPayloadStaysInTheSlots) {
  RemoteRegion<ShmTransport> remote = attach();
  RingConsumer rx = region_.view().rx_consumer(0);
  // {length, slots}: 8 slots of 64 bytes; an entry takes ceil((length + 16) / 64) slots.
  auto push = [&](uint32_t length, uint64_t token) {
    return push_message(remote.rx(0), numbered_bytes(length, static_cast<uint32_t>(token)), token);
  };
  auto pop_all = [&](std::vector<uint64_t> tokens) {
    for (uint64_t token : tokens) {
      Entry e;
      alignas(16) std::byte image[kLineDataBytes];
      ASSERT_EQ(rx.next_by_line(e, image), PollResult::kReady) << token;
      EXPECT_EQ(e.token, token);
      const std::vector<std::byte> want = numbered_bytes(e.length, static_cast<uint32_t>(token));
      // Longer than a line holds: read in place from the slots, after the line's acquire.
      EXPECT_EQ(std::memcmp(e.payload, want.data(), e.length), 0) << token;
    }
    rx.release();
    rx.publish();
  };
  ASSERT_TRUE(push(200, 0));  // slots 0-3 (entry 0)
  ASSERT_TRUE(push(8, 1));    // slot 4 (entry 1)
  ASSERT_TRUE(push(150, 2));  // slots 5-7 (entry 2)
  pop_all({0, 1, 2});
  ASSERT_TRUE(push(8, 3));    // slot 0 (entry 3)
  ASSERT_TRUE(push(230, 4));  // slots 1-4 (entry 4)
  ASSERT_TRUE(push(8, 5));    // slot 5 (entry 5)
  ASSERT_TRUE(push(8, 6));    // slot 6 (entry 6)
  pop_all({3, 4, 5, 6});
  ASSERT_TRUE(push(100, 8));  // 2 slots do not fit in slot 7: a skip there (entry 7), then 0-1
  const uint64_t* skip_line = line(0, 7);
  uint32_t data[4];
  for (uint32_t k = 0; k < 4; ++k) {
    EXPECT_EQ(line_word_flag(skip_line[k]), line_flag(7));
    data[k] = line_word_data(skip_line[k]);
  }
  SlotHeader skip;
  std::memcpy(&skip, data, sizeof(skip));
  EXPECT_EQ(skip.flags, kSlotSkip);
  EXPECT_EQ(skip.slots, 1u);
  EXPECT_EQ(skip.length, 0u);
  pop_all({8});
  EXPECT_EQ(rx.entries(), 9u);  // eight messages and the skip
  EXPECT_EQ(rx.head(), 18u);    // 8 + 1 + 4 + 1 + 1, the skip's 1, then 2 slots
}

TEST_F(RxLinesTest, UnreadPutsTheEntryAndItsLineBack) {
  RemoteRegion<ShmTransport> remote = attach();
  RingConsumer rx = region_.view().rx_consumer(0);
  ASSERT_TRUE(push_message(remote.rx(0), numbered_bytes(8, 1), 1));
  ASSERT_TRUE(push_message(remote.rx(0), numbered_bytes(8, 2), 2));
  ASSERT_TRUE(pop_by_line(rx).has_value());
  rx.release();
  ASSERT_EQ(pop_by_line(rx)->token, 2u);
  rx.unread();
  EXPECT_EQ(rx.entries(), 1u);
  ASSERT_EQ(pop_by_line(rx)->token, 2u);
  EXPECT_FALSE(pop_by_line(rx).has_value());
}

TEST_F(RxLinesTest, AnImageOfTheLineServesTheEntryWithoutReadingItAgain) {
  RemoteRegion<ShmTransport> remote = attach();
  RingConsumer rx = region_.view().rx_consumer(1);
  const std::vector<std::byte> payload = numbered_bytes(kLineInlineBytes, 5);
  ASSERT_TRUE(push_message(remote.rx(1), payload, 55));

  // What a warp does: one word a lane, every flag checked, the data decoded in word order.
  const LineRef<const uint64_t> line = rx.next_entry_line();
  const uint64_t* words = line.words;
  const uint32_t flag = line.flag;
  EXPECT_EQ(flag, line_flag(0));
  alignas(16) std::byte image[kLineDataBytes];
  for (uint32_t k = 0; k < kLineWords; ++k) {
    const uint64_t w = k == 0 ? load_acquire(words) : load_relaxed(words + k);
    ASSERT_EQ(line_word_flag(w), flag);
    const uint32_t d = line_word_data(w);
    std::memcpy(image + 4 * k, &d, 4);
  }
  Entry e;
  ASSERT_EQ(rx.next(e, /*refresh=*/false, image), PollResult::kReady);
  EXPECT_EQ(e.length, kLineInlineBytes);
  EXPECT_EQ(e.token, 55u);
  EXPECT_EQ(std::memcmp(image + kSlotHeaderBytes, payload.data(), payload.size()), 0);
  // The entry is in its slot too, where e.payload points.
  EXPECT_EQ(std::memcmp(e.payload, payload.data(), payload.size()), 0);
  // Without refresh (and without a tail hint) the consumer stops there; with it, it goes by
  // the tail.
  ASSERT_TRUE(push_message(remote.rx(1), numbered_bytes(8, 6), 56));
  remote.rx(1).publish();
  EXPECT_EQ(rx.next(e, /*refresh=*/false), PollResult::kEmpty);
  EXPECT_EQ(rx.next(e, /*refresh=*/true), PollResult::kReady);
  EXPECT_EQ(e.token, 56u);
}

TEST_F(RxLinesTest, ACorruptHeaderInALineStopsTheRingWithTheReason) {
  RemoteRegion<ShmTransport> remote = attach();
  ASSERT_TRUE(push_message(remote.rx(0), numbered_bytes(8, 1), 1));
  // The header's slot count (upper half of word 1) says 9 slots: past the ring's end.
  auto* l = const_cast<uint64_t*>(line(0, 0));
  l[1] = line_word(line_flag(0), (9u << 16) | 0u);
  RingConsumer rx = region_.view().rx_consumer(0);
  Entry e;
  alignas(16) std::byte image[kLineDataBytes];
  EXPECT_EQ(rx.next_by_line(e, image), PollResult::kCorrupt);
  EXPECT_EQ(rx.last_check(), EntryCheck::kPastRingEnd);
}

TEST_F(RxLinesTest, BothSidesResumeAtTheEntryCountsTheyPublished) {
  {
    RemoteRegion<ShmTransport> remote = attach();
    RingConsumer rx = region_.view().rx_consumer(2);
    for (uint32_t i = 0; i < 5; ++i) {
      ASSERT_TRUE(push_message(remote.rx(2), numbered_bytes(8 + 60 * (i % 2), i), i));
    }
    remote.rx(2).publish();
    for (uint32_t i = 0; i < 3; ++i)
      ASSERT_TRUE(pop_by_line(rx).has_value());
    rx.release();
    rx.publish();
  }
  EXPECT_EQ(word(IndexArray::kRxTail, 2, kEntriesWordOffset), 5u);
  EXPECT_EQ(word(IndexArray::kRxHead, 2, kEntriesWordOffset), 3u);

  // A new SmartNIC and a new consumer take over: entries 3 and 4, then a new one, in order.
  RemoteRegion<ShmTransport> remote = attach();
  EXPECT_EQ(remote.rx(2).entries(), 5u);
  RingConsumer rx = region_.view().rx_consumer(2);
  EXPECT_EQ(rx.entries(), 3u);
  ASSERT_TRUE(push_message(remote.rx(2), numbered_bytes(8, 5), 5));
  for (uint64_t token = 3; token <= 5; ++token) {
    const std::optional<Message> m = pop_by_line(rx);
    ASSERT_TRUE(m.has_value()) << token;
    EXPECT_EQ(m->token, token);
  }
}

// A consumer that holds entries (release_to) publishes the entry count at its head, so one
// that takes over reads the held entries again, by their lines.
TEST_F(RxLinesTest, ATakeoverResumesAtTheOldestHeldEntry) {
  RemoteRegion<ShmTransport> remote = attach();
  {
    RingConsumer rx = region_.view().rx_consumer(1);
    for (uint32_t i = 0; i < 4; ++i)
      ASSERT_TRUE(push_message(remote.rx(1), numbered_bytes(8, i), i));
    remote.rx(1).publish();
    ASSERT_TRUE(pop_by_line(rx).has_value());
    const ReadMark held = rx.mark();
    for (uint32_t i = 1; i < 4; ++i)
      ASSERT_TRUE(pop_by_line(rx).has_value());
    rx.release_to(held);
    rx.publish();
  }
  EXPECT_EQ(word(IndexArray::kRxHead, 1, kEntriesWordOffset), 1u);
  RingConsumer rx = region_.view().rx_consumer(1);
  EXPECT_EQ(rx.entries(), 1u);
  for (uint64_t token = 1; token <= 3; ++token) {
    const std::optional<Message> m = pop_by_line(rx);
    ASSERT_TRUE(m.has_value()) << token;
    EXPECT_EQ(m->token, token);
  }
}

TEST(RxLinesValidate, RefusesLineFieldsThatDoNotMatchTheFeature) {
  const RegionHeader good = compute_layout(lines_geometry(), 1);
  struct Case {
    const char* what;
    void (*damage)(RegionHeader&);
    const char* field;
  };
  const Case cases[] = {
      {"unknown feature", [](RegionHeader& h) { h.features |= 1u << 5; }, "'features'"},
      {"line size", [](RegionHeader& h) { h.line_bytes = 128; }, "'line_bytes'"},
      {"lines inside the rings", [](RegionHeader& h) { h.lines_offset -= kPageBytes; },
       "'lines_offset'"},
      {"short stride", [](RegionHeader& h) { h.line_stride = 0; }, "'line_stride'"},
      {"region too small", [](RegionHeader& h) { h.region_bytes -= kPageBytes; }, "'region_bytes'"},
      {"fields without the feature", [](RegionHeader& h) { h.features = 0; }, "'line_bytes'"},
  };
  for (const Case& c : cases) {
    RegionHeader h = good;
    c.damage(h);
    const Status s = validate_region(h, good.region_bytes);
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << c.what << ": " << s.message();
  }
}

}  // namespace
}  // namespace caracal::mqueue
