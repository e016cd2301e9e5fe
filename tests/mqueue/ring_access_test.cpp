// The seam of the ring protocol: BasicRingProducer and BasicRingConsumer are written once, over
// an access policy, and run over local memory on the accelerator (RingProducer, RingConsumer)
// and through a transport on the SmartNIC (RemoteRingProducer, RemoteRingConsumer). The same
// traffic through both directions of one queue must place every entry, skip marker and credit
// alike, leave the same bytes in both rings, and be read back alike by both consumers.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/remote_ring.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/shm.hpp"
#include "test_support.hpp"

namespace caracal::mqueue {
namespace {

using test::numbered_bytes;
using test::ShmPair;

// With lines or without (both directions alike): lines change the entry counts, not placement.
class RingAccessTest : public ::testing::TestWithParam<bool> {};

TEST_P(RingAccessTest, LocalAndTransportPoliciesPlaceAndReadEntriesAlike) {
  // One queue of 8 slots of 64 bytes, messages of up to 4 slots: skip markers are frequent.
  const bool lines = GetParam();
  const RegionGeometry g{1, 0, 64, 8, 4 * 64 - kSlotHeaderBytes, lines, lines};
  ShmPair pair(g);
  const RegionHeader& h = pair.header();
  // Indexes start near the 32-bit wrap, on both rings.
  const uint32_t start = UINT32_MAX - 20;
  for (IndexArray a :
       {IndexArray::kRxTail, IndexArray::kRxHead, IndexArray::kTxHead, IndexArray::kTxTail}) {
    pair.word(a, 0) = start;
  }
  RemoteRegion<ShmTransport> nic = pair.attach();
  const RegionView view = pair.region_.view();
  // TX: the accelerator produces over local memory, the SmartNIC consumes through the transport.
  RingProducer acc_tx = view.tx_producer(0);
  RemoteRingConsumer<ShmTransport>& nic_tx = nic.tx(0);
  // RX: the SmartNIC produces through the transport, the accelerator consumes in place.
  RemoteRingProducer<ShmTransport>& nic_rx = nic.rx(0);
  RingConsumer acc_rx = view.rx_consumer(0);
  ASSERT_EQ(acc_tx.has_lines(), lines);
  ASSERT_EQ(nic_rx.has_lines(), lines);

  const std::byte* tx_ring = pair.region_.base() + tx_ring_offset(h, 0);
  const std::byte* rx_ring = pair.region_.base() + rx_ring_offset(h, 0);
  const size_t ring_bytes = size_t{g.slot_bytes} * g.ring_capacity;

  std::mt19937 rng(20261127);
  uint32_t skips = 0;
  uint32_t refused = 0;
  uint32_t taken = 0;
  for (uint32_t step = 0; step < 5000; ++step) {
    if (rng() % 3 != 0) {
      // Both producers reserve the same room and commit the same entry, possibly shorter.
      const uint32_t reserved = rng() % (g.max_message_bytes + 1);
      const uint32_t length = rng() % 2 == 0 ? reserved : reserved / 2;
      const std::vector<std::byte> payload = numbered_bytes(length, step);
      const uint32_t tail_before = acc_tx.tail();
      std::byte* a = acc_tx.reserve(reserved);
      std::byte* b = nic_rx.reserve(reserved);
      ASSERT_EQ(a == nullptr, b == nullptr) << "step " << step;
      if (a == nullptr) {
        ++refused;
      } else {
        EXPECT_EQ(a - tx_ring, b - rx_ring) << "step " << step;
        if (length != 0) {
          std::memcpy(a, payload.data(), length);
          std::memcpy(b, payload.data(), length);
        }
        ASSERT_TRUE(acc_tx.commit(length, step, 0));
        ASSERT_TRUE(nic_rx.commit(length, step, 0));
        acc_tx.write_line();
        if (acc_tx.tail() - tail_before > slots_for(length, g.slot_bytes)) ++skips;
      }
      ASSERT_EQ(acc_tx.tail(), nic_rx.tail()) << "step " << step;
      ASSERT_EQ(acc_tx.credits(), nic_rx.credits()) << "step " << step;
      ASSERT_EQ(acc_tx.outstanding_slots(), nic_rx.outstanding_slots()) << "step " << step;
      ASSERT_EQ(acc_tx.entries(), nic_rx.entries()) << "step " << step;
      if (rng() % 2 == 0) {
        acc_tx.publish();
        nic_rx.publish();
      }
    } else {
      // Both consumers take the same entries: the accelerator reads the RX tail itself, the
      // SmartNIC is handed the TX tail (over shm its slots are readable at once).
      nic.observe_tx_tail(0);
      for (uint32_t i = rng() % 5; i > 0; --i) {
        Entry ea;
        Entry eb;
        const PollResult ra = acc_rx.next(ea);
        const PollResult rb = nic_tx.next(eb);
        ASSERT_EQ(ra, rb) << "step " << step;
        ASSERT_EQ(acc_rx.read_position(), nic_tx.read_position()) << "step " << step;
        ASSERT_EQ(acc_rx.entries(), nic_tx.entries()) << "step " << step;
        ASSERT_NE(ra, PollResult::kCorrupt) << entry_check_name(acc_rx.last_check());
        if (ra != PollResult::kReady) break;
        ++taken;
        EXPECT_EQ(ea.token, eb.token);
        EXPECT_EQ(ea.flags, eb.flags);
        ASSERT_EQ(ea.length, eb.length);
        EXPECT_EQ(ea.payload - rx_ring, eb.payload - tx_ring);
        if (ea.length > 0) {  // an empty entry's expected bytes have no data() to compare
          EXPECT_EQ(std::memcmp(ea.payload, eb.payload, ea.length), 0);
          const std::vector<std::byte> expected = numbered_bytes(ea.length, ea.token);
          EXPECT_EQ(std::memcmp(ea.payload, expected.data(), ea.length), 0);
        }
      }
      acc_rx.release();
      nic_tx.release();
      acc_rx.publish();
      nic_tx.publish();
      ASSERT_EQ(acc_rx.head(), nic_tx.head());
    }
    ASSERT_EQ(std::memcmp(tx_ring, rx_ring, ring_bytes), 0)
        << "the rings differ after step " << step;
    ASSERT_EQ(pair.word(IndexArray::kTxTail, 0), pair.word(IndexArray::kRxTail, 0));
    ASSERT_EQ(pair.word(IndexArray::kTxHead, 0), pair.word(IndexArray::kRxHead, 0));
    ASSERT_EQ(pair.word(IndexArray::kTxTail, 0, kEntriesWordOffset),
              pair.word(IndexArray::kRxTail, 0, kEntriesWordOffset));
    ASSERT_EQ(pair.word(IndexArray::kTxHead, 0, kEntriesWordOffset),
              pair.word(IndexArray::kRxHead, 0, kEntriesWordOffset));
  }
  // The traffic went through what it was meant to.
  EXPECT_GT(skips, 100u);
  EXPECT_GT(refused, 100u);
  EXPECT_GT(taken, 1000u);
  EXPECT_LT(acc_tx.tail(), start) << "the indexes never wrapped";
}

INSTANTIATE_TEST_SUITE_P(Lines, RingAccessTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("WithLines")
                                             : std::string("WithoutLines");
                         });

}  // namespace
}  // namespace caracal::mqueue
