// TX lines (kFeatureTxLines, layout.hpp): the accelerator may announce a short TX entry in an LL
// line before it publishes the tail, and the SmartNIC takes it from there (next_by_line) or by
// the tail, whichever it meets first. The accelerator side is RingProducer, the SmartNIC side
// RemoteRingConsumer over ShmTransport, on one region in local memory.
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
using test::pop_message;
using test::push_message;

RegionGeometry tx_lines_geometry(bool rx_lines = false) {
  return test::small_lines_geometry(rx_lines, /*tx_lines=*/true);
}

std::optional<Message> pop_line(RemoteRingConsumer<ShmTransport>& c) {
  return test::pop_tx_line(c);
}

class TxLinesTest : public ::testing::Test, public test::ShmPair {
 protected:
  TxLinesTest() : ShmPair(tx_lines_geometry()) {}

  uint64_t* line(uint32_t queue, uint32_t index) const {
    return region_.view().tx_lines(queue) + size_t{index} * kLineWords;
  }
  // Pushes `payload` and announces it in its line when it fits.
  static bool push_with_line(RingProducer& p, const std::vector<std::byte>& payload, uint64_t token,
                             uint16_t flags = 0) {
    if (!push_message(p, payload, token, flags)) return false;
    p.write_line();
    return true;
  }
};

TEST(TxLinesLayout, TxLinesFollowTheRxLinesOfTheirQueue) {
  const RegionHeader tx = compute_layout(tx_lines_geometry(), 1);
  ASSERT_TRUE(validate_region(tx, tx.region_bytes).ok());
  EXPECT_EQ(tx.features, kFeatureTxLines);
  EXPECT_EQ(tx.line_bytes, kLineBytes);
  EXPECT_EQ(tx.line_stride, line_block_bytes(tx));
  EXPECT_EQ(tx_lines_offset(tx, 0), tx.lines_offset);
  EXPECT_EQ(tx_lines_offset(tx, 2), tx.lines_offset + 2 * tx.line_stride);
  EXPECT_STREQ(lines_suffix(tx), ", TX lines");

  const RegionHeader both = compute_layout(tx_lines_geometry(/*rx_lines=*/true), 1);
  ASSERT_TRUE(validate_region(both, both.region_bytes).ok());
  EXPECT_EQ(both.features, kFeatureRxLines | kFeatureTxLines);
  EXPECT_EQ(both.line_stride, 2 * line_block_bytes(both));
  EXPECT_EQ(rx_lines_offset(both, 1), both.lines_offset + both.line_stride);
  EXPECT_EQ(tx_lines_offset(both, 1), rx_lines_offset(both, 1) + line_block_bytes(both));
  EXPECT_EQ(both.region_bytes, tx.region_bytes + 3 * line_block_bytes(both));
  EXPECT_STREQ(lines_suffix(both), ", RX and TX lines");

  LocalRegion plain(test::small_lines_geometry(false, false));
  EXPECT_EQ(plain.view().tx_lines(0), nullptr);
  EXPECT_FALSE(plain.view().tx_producer(0).has_lines());
}

TEST(TxLinesLayout, ValidateRefusesAStrideWithRoomForOneDirectionOnly) {
  RegionHeader h = compute_layout(tx_lines_geometry(/*rx_lines=*/true), 1);
  h.line_stride = line_block_bytes(h);
  const Status s = validate_region(h, h.region_bytes);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'line_stride'"), std::string::npos) << s.message();
}

TEST_F(TxLinesTest, AShortEntryIsTakenFromItsLineBeforeTheTailIsPublished) {
  RemoteRegion<ShmTransport> nic = attach();
  RingProducer tx = region_.view().tx_producer(1);
  ASSERT_TRUE(tx.has_lines());
  const std::vector<std::byte> reply = numbered_bytes(kLineInlineBytes, 3);
  ASSERT_TRUE(push_with_line(tx, reply, 41, kSlotError));

  // No tail yet: the tail path finds nothing, the line has the whole entry.
  nic.observe_tx_tail(1);
  EXPECT_FALSE(pop_message(nic.tx(1)).has_value());
  const std::optional<Message> m = pop_line(nic.tx(1));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, reply);
  EXPECT_EQ(m->token, 41u);
  EXPECT_EQ(m->flags, kSlotError);
  EXPECT_EQ(nic.tx(1).entries(), 1u);
  EXPECT_FALSE(pop_line(nic.tx(1)).has_value());  // the next line is not written

  // The tail that covers the entry comes later and uncovers nothing more.
  tx.publish();
  nic.observe_tx_tail(1);
  EXPECT_FALSE(pop_message(nic.tx(1)).has_value());
  EXPECT_EQ(nic.tx(1).pending_slots(), 0u);

  // The head and the entry count go back to the accelerator.
  nic.tx(1).release();
  nic.tx(1).publish();
  EXPECT_EQ(word(IndexArray::kTxHead, 1), slots_for(kLineInlineBytes, header().slot_bytes));
  EXPECT_EQ(word(IndexArray::kTxHead, 1, kEntriesWordOffset), 1u);
  EXPECT_EQ(word(IndexArray::kTxTail, 1, kEntriesWordOffset), 1u);
  tx.refresh_credits();
  EXPECT_EQ(tx.credits(), header().ring_capacity);
}

TEST_F(TxLinesTest, LongEntriesSkipMarkersAndUnannouncedEntriesGoByTheTailInStep) {
  RemoteRegion<ShmTransport> nic = attach();
  RingProducer tx = region_.view().tx_producer(0);
  RemoteRingConsumer<ShmTransport>& c = nic.tx(0);
  // Slots of 64 bytes, 8 a ring. Entry 0: short, in its line (1 slot). Entry 1: long, no line
  // (3 slots). Entry 2: short, committed without a line (1 slot). Then 3 slots are left
  // before the ring's end, so a 4-slot entry puts a skip marker (entry 3) first and is entry 4.
  const std::vector<std::byte> a = numbered_bytes(40, 1);
  const std::vector<std::byte> b = numbered_bytes(kLineInlineBytes + 1, 2);
  const std::vector<std::byte> d = numbered_bytes(8, 3);
  ASSERT_TRUE(push_with_line(tx, a, 1));
  ASSERT_TRUE(push_with_line(tx, b, 2));  // too long: write_line writes nothing
  EXPECT_EQ(tx.committed_entry_line().words, nullptr);
  ASSERT_TRUE(push_message(tx, d, 3));
  tx.publish();

  std::optional<Message> m = pop_line(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 1u);
  EXPECT_FALSE(pop_line(c).has_value());  // entry 1 has no line
  nic.observe_tx_tail(0);
  m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, b);
  m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, d);
  EXPECT_EQ(c.entries(), 3u);
  c.release();
  c.publish();
  tx.refresh_credits();

  const std::vector<std::byte> e = numbered_bytes(3 * 64, 4);  // 4 slots: past the ring's end
  ASSERT_TRUE(push_with_line(tx, e, 5));
  const std::vector<std::byte> f = numbered_bytes(16, 5);
  ASSERT_TRUE(push_with_line(tx, f, 6));
  EXPECT_EQ(tx.entries(), 6u);  // the skip marker counts
  // Entry 5 is in its line, but entries 3 (the skip) and 4 come first: only the tail has them.
  EXPECT_FALSE(pop_line(c).has_value());
  tx.publish();
  nic.observe_tx_tail(0);
  m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, e);
  EXPECT_EQ(c.entries(), 5u);
  // The tail covers entry 5 too; next() takes it, and its line is passed over.
  m = pop_message(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, f);
  EXPECT_FALSE(pop_line(c).has_value());
  EXPECT_EQ(c.entries(), 6u);
}

TEST_F(TxLinesTest, AStaleOrHalfWrittenLineIsNotAnEntry) {
  RemoteRegion<ShmTransport> nic = attach();
  RingProducer tx = region_.view().tx_producer(0);
  RemoteRingConsumer<ShmTransport>& c = nic.tx(0);
  // A zeroed line is no entry of the first lap.
  EXPECT_FALSE(pop_line(c).has_value());
  const std::vector<std::byte> reply = numbered_bytes(64, 9);
  ASSERT_TRUE(push_with_line(tx, reply, 7));
  uint64_t* words = line(0, 0);
  // One payload word still carries the flag of the line's last lap: the entry is not there yet.
  const uint64_t saved = words[kSlotHeaderBytes / 4 + 3];
  words[kSlotHeaderBytes / 4 + 3] = line_word(line_flag(0) - header().ring_capacity, 0);
  EXPECT_FALSE(pop_line(c).has_value());
  EXPECT_EQ(c.entries(), 0u);
  // A word past the payload is not needed.
  words[kSlotHeaderBytes / 4 + 3] = saved;
  words[kLineWords - 1] = 0;
  const std::optional<Message> m = pop_line(c);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, reply);

  // After a lap every line holds the flag of the entry a ring earlier.
  c.release();
  c.publish();
  tx.refresh_credits();
  for (uint32_t i = 1; i < header().ring_capacity; ++i) {
    ASSERT_TRUE(push_with_line(tx, numbered_bytes(4, i), 100 + i));
    tx.publish();
    nic.observe_tx_tail(0);
    ASSERT_TRUE(pop_message(c).has_value()) << i;
    c.release();
    c.publish();
    tx.refresh_credits();
  }
  EXPECT_EQ(c.entries(), header().ring_capacity);
  EXPECT_FALSE(pop_line(c).has_value());  // line 0 holds entry 0, not entry 8
}

TEST_F(TxLinesTest, ALineThatAnnouncesWhatALineCannotHoldStopsTheRingWithTheReason) {
  RemoteRegion<ShmTransport> nic = attach();
  RemoteRingConsumer<ShmTransport>& c = nic.tx(0);
  auto write = [&](const SlotHeader& h) {
    uint32_t data[kLineWords] = {};
    std::memcpy(data, &h, sizeof(h));
    for (uint32_t k = 0; k < kLineWords; ++k)
      line(0, 0)[k] = line_word(line_flag(0), data[k]);
  };
  write(SlotHeader{kLineInlineBytes + 4, 0, 3, 1});  // valid in the slots, too long for a line
  Entry e;
  EXPECT_EQ(c.next_by_line(e), PollResult::kCorrupt);
  EXPECT_EQ(c.last_check(), EntryCheck::kNotInLine);
  write(SlotHeader{0, kSlotSkip, 2, 0});
  EXPECT_EQ(c.next_by_line(e), PollResult::kCorrupt);
  EXPECT_EQ(c.last_check(), EntryCheck::kNotInLine);
  write(SlotHeader{8, 1u << 9, 1, 0});
  EXPECT_EQ(c.next_by_line(e), PollResult::kCorrupt);
  EXPECT_EQ(c.last_check(), EntryCheck::kUnknownFlags);
  EXPECT_EQ(c.entries(), 0u);
}

TEST_F(TxLinesTest, BothSidesResumeAtTheEntryCountsTheyPublished) {
  {
    RemoteRegion<ShmTransport> nic = attach();
    RingProducer tx = region_.view().tx_producer(2);  // the client queue: lines alike
    for (uint64_t t = 1; t <= 3; ++t)
      ASSERT_TRUE(push_with_line(tx, numbered_bytes(12, static_cast<uint32_t>(t)), t));
    tx.publish();
    for (uint64_t t = 1; t <= 2; ++t)
      ASSERT_TRUE(pop_line(nic.tx(2)).has_value());
    nic.tx(2).release();
    nic.tx(2).publish();
  }
  // A new SmartNIC and a new producer take the ring over where the last ones published.
  RemoteRegion<ShmTransport> nic = attach();
  RingProducer tx = region_.view().tx_producer(2);
  EXPECT_EQ(tx.entries(), 3u);
  EXPECT_EQ(nic.tx(2).entries(), 2u);
  std::optional<Message> m = pop_line(nic.tx(2));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 3u);
  ASSERT_TRUE(push_with_line(tx, numbered_bytes(12, 4), 4));
  m = pop_line(nic.tx(2));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 4u);
}

}  // namespace
}  // namespace caracal::mqueue
