// The region layout: compute_layout, the offset helpers and slots_for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/validate.hpp"

namespace caracal::mqueue {
namespace {

// The layout is constexpr so device code and static_asserts can use it.
static_assert(compute_layout(RegionGeometry{}, 1).control_offset == kPageBytes);
static_assert(compute_layout(RegionGeometry{}, 1).rings_offset == 2 * kPageBytes);
static_assert(slots_for(0, 64) == 1);

struct GeometryCase {
  const char* name;
  RegionGeometry geometry;
};

void PrintTo(const GeometryCase& c, std::ostream* os) {
  *os << c.name;
}

class LayoutTest : public ::testing::TestWithParam<GeometryCase> {};

constexpr IndexArray kArrays[] = {IndexArray::kRxTail, IndexArray::kRxHead, IndexArray::kTxHead,
                                  IndexArray::kTxTail};

TEST_P(LayoutTest, HeaderIdentifiesTheRegion) {
  const RegionGeometry& g = GetParam().geometry;
  ASSERT_TRUE(validate_geometry(g).ok()) << validate_geometry(g).message();
  const RegionHeader h = compute_layout(g, 0xABCD);
  EXPECT_EQ(h.magic, kRegionMagic);
  EXPECT_EQ(h.layout_version, kLayoutVersion);
  EXPECT_EQ(h.header_bytes, kPageBytes);
  EXPECT_EQ(h.agent_epoch, 0xABCDu);
  EXPECT_EQ(h.server_queue_count, g.server_queue_count);
  EXPECT_EQ(h.client_queue_count, g.client_queue_count);
  EXPECT_EQ(h.slot_bytes, g.slot_bytes);
  EXPECT_EQ(h.ring_capacity, g.ring_capacity);
  EXPECT_EQ(h.max_message_bytes, g.max_message_bytes);
  EXPECT_EQ(h.control_line_bytes, kControlLineBytes);
  EXPECT_EQ(queue_count(h), g.server_queue_count + g.client_queue_count);
  // The canonical layout passes its own validation, with exactly region_bytes mapped.
  const Status s = validate_region(h, h.region_bytes);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST_P(LayoutTest, PartsArePageAligned) {
  const RegionHeader h = compute_layout(GetParam().geometry, 1);
  EXPECT_EQ(h.control_offset % kPageBytes, 0u);
  EXPECT_GE(h.control_offset, uint64_t{h.header_bytes});
  EXPECT_EQ(h.control_bytes % kPageBytes, 0u);
  EXPECT_EQ(h.rings_offset % kPageBytes, 0u);
  EXPECT_GE(h.rings_offset, h.control_offset + h.control_bytes);
  EXPECT_EQ(h.ring_stride % kPageBytes, 0u);
  EXPECT_GE(h.ring_stride, uint64_t{h.slot_bytes} * h.ring_capacity);
  EXPECT_EQ(h.region_bytes % kPageBytes, 0u);
  for (uint32_t q = 0; q < queue_count(h); ++q) {
    EXPECT_EQ(rx_ring_offset(h, q) % kPageBytes, 0u) << "queue " << q;
    EXPECT_EQ(tx_ring_offset(h, q) % kPageBytes, 0u) << "queue " << q;
  }
}

TEST_P(LayoutTest, ControlWordsHaveALineEach) {
  const RegionHeader h = compute_layout(GetParam().geometry, 1);
  const uint32_t queues = queue_count(h);
  std::vector<uint64_t> words{stop_word_offset(h)};
  for (IndexArray a : kArrays) {
    for (uint32_t q = 0; q < queues; ++q) {
      words.push_back(index_offset(h, a, q));
    }
  }
  for (uint64_t w : words) {
    EXPECT_EQ(w % kControlLineBytes, 0u);
    EXPECT_GE(w, h.control_offset);
    EXPECT_LE(w + kControlLineBytes, h.control_offset + h.control_bytes);
  }
  std::sort(words.begin(), words.end());
  for (size_t i = 1; i < words.size(); ++i) {
    EXPECT_GE(words[i] - words[i - 1], uint64_t{kControlLineBytes})
        << "control words at " << words[i - 1] << " and " << words[i] << " share a line";
  }
  // Within each array, consecutive queues are one line apart.
  for (IndexArray a : kArrays) {
    for (uint32_t q = 1; q < queues; ++q) {
      EXPECT_EQ(index_offset(h, a, q) - index_offset(h, a, q - 1), uint64_t{kControlLineBytes});
    }
  }
}

TEST_P(LayoutTest, OneReadCoversEveryTxTailAndNothingElse) {
  const RegionHeader h = compute_layout(GetParam().geometry, 1);
  const uint32_t queues = queue_count(h);
  // The read RemoteRegion::fetch_tx_tails posts.
  const uint64_t begin = index_offset(h, IndexArray::kTxTail, 0);
  const uint64_t end = begin + uint64_t{queues} * h.control_line_bytes;
  EXPECT_LE(end, h.control_offset + h.control_bytes);
  for (uint32_t q = 0; q < queues; ++q) {
    const uint64_t w = index_offset(h, IndexArray::kTxTail, q);
    EXPECT_GE(w, begin);
    EXPECT_LE(w + sizeof(uint32_t), end);
    for (IndexArray a : {IndexArray::kRxTail, IndexArray::kRxHead, IndexArray::kTxHead}) {
      const uint64_t other = index_offset(h, a, q);
      EXPECT_TRUE(other + kControlLineBytes <= begin || other >= end)
          << "index array " << static_cast<uint32_t>(a) << " of queue " << q
          << " lies inside the TX tail read";
    }
  }
  EXPECT_TRUE(stop_word_offset(h) + kControlLineBytes <= begin || stop_word_offset(h) >= end);
}

TEST_P(LayoutTest, RingsDoNotOverlapAndFitTheRegion) {
  const RegionHeader h = compute_layout(GetParam().geometry, 1);
  const uint64_t ring_bytes = uint64_t{h.slot_bytes} * h.ring_capacity;
  std::vector<std::pair<uint64_t, uint64_t>> parts;  // [begin, end)
  parts.emplace_back(0, h.header_bytes);
  parts.emplace_back(h.control_offset, h.control_offset + h.control_bytes);
  uint64_t last_end = 0;
  for (uint32_t q = 0; q < queue_count(h); ++q) {
    parts.emplace_back(rx_ring_offset(h, q), rx_ring_offset(h, q) + ring_bytes);
    parts.emplace_back(tx_ring_offset(h, q), tx_ring_offset(h, q) + ring_bytes);
    last_end = std::max(last_end, tx_ring_offset(h, q) + ring_bytes);
    EXPECT_GE(rx_ring_offset(h, q), h.rings_offset);
  }
  std::sort(parts.begin(), parts.end());
  for (size_t i = 1; i < parts.size(); ++i) {
    EXPECT_LE(parts[i - 1].second, parts[i].first)
        << "[" << parts[i - 1].first << ", " << parts[i - 1].second << ") overlaps ["
        << parts[i].first << ", " << parts[i].second << ")";
  }
  EXPECT_LE(parts.back().second, h.region_bytes);
  EXPECT_LE(last_end, h.region_bytes);
  // Nothing is wasted past the last ring but its page padding.
  EXPECT_EQ(h.region_bytes, h.rings_offset + 2 * uint64_t{queue_count(h)} * h.ring_stride);
  EXPECT_LT(h.region_bytes - last_end, uint64_t{kPageBytes});
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, LayoutTest,
    ::testing::Values(GeometryCase{"Default", RegionGeometry{}},
                      GeometryCase{"SmallestRing", RegionGeometry{1, 0, 64, 2, 48}},
                      GeometryCase{"ServerAndClient", RegionGeometry{3, 2, 128, 1024, 4000}},
                      GeometryCase{"RingBelowAPage", RegionGeometry{5, 0, 64, 16, 100}},
                      GeometryCase{"HugeSlots", RegionGeometry{2, 1, 65536, 4, 100000}},
                      GeometryCase{"MaxQueues", RegionGeometry{1000, 24, 64, 4, 48}},
                      GeometryCase{"ControlPastOnePage", RegionGeometry{20, 0, 256, 256, 240}}),
    [](const ::testing::TestParamInfo<GeometryCase>& info) { return info.param.name; });

// Exact values for one geometry, worked out by hand from the layout described in layout.hpp.
TEST(LayoutValues, OffsetsOfTwoServerQueuesAndOneClientQueue) {
  const RegionHeader h = compute_layout(RegionGeometry{2, 1, 256, 256, 240}, 9);
  ASSERT_EQ(queue_count(h), 3u);
  EXPECT_EQ(h.control_offset, 4096u);
  EXPECT_EQ(h.control_bytes, 4096u);  // (1 + 4 * 3) lines = 832 bytes, one page
  EXPECT_EQ(h.rings_offset, 8192u);
  EXPECT_EQ(h.ring_stride, 65536u);  // 256 slots of 256 bytes
  EXPECT_EQ(h.region_bytes, 8192u + 6 * 65536u);

  EXPECT_EQ(stop_word_offset(h), 4096u);
  EXPECT_EQ(index_offset(h, IndexArray::kRxTail, 0), 4096u + 64 * 1);
  EXPECT_EQ(index_offset(h, IndexArray::kRxTail, 2), 4096u + 64 * 3);
  EXPECT_EQ(index_offset(h, IndexArray::kRxHead, 0), 4096u + 64 * 4);
  EXPECT_EQ(index_offset(h, IndexArray::kTxHead, 2), 4096u + 64 * 9);
  EXPECT_EQ(index_offset(h, IndexArray::kTxTail, 0), 4096u + 64 * 10);
  EXPECT_EQ(index_offset(h, IndexArray::kTxTail, 1), 4096u + 64 * 11);
  EXPECT_EQ(index_offset(h, IndexArray::kTxTail, 2), 4096u + 64 * 12);

  EXPECT_EQ(rx_ring_offset(h, 0), 8192u);
  EXPECT_EQ(tx_ring_offset(h, 0), 8192u + 65536u);
  EXPECT_EQ(rx_ring_offset(h, 1), 8192u + 2 * 65536u);
  EXPECT_EQ(tx_ring_offset(h, 2), 8192u + 5 * 65536u);
  EXPECT_EQ(client_queue_index(h, 0), 2u);
}

TEST(LayoutValues, ControlAreaGrowsByPages) {
  // 1 + 4 * 16 = 65 lines = 4160 bytes: two pages.
  const RegionHeader h16 = compute_layout(RegionGeometry{16, 0, 64, 2, 48}, 1);
  EXPECT_EQ(h16.control_bytes, 2u * kPageBytes);
  // 1 + 4 * 15 = 61 lines = 3904 bytes: one page.
  const RegionHeader h15 = compute_layout(RegionGeometry{15, 0, 64, 2, 48}, 1);
  EXPECT_EQ(h15.control_bytes, uint64_t{kPageBytes});
  // 1024 queues: 4097 lines = 262208 bytes, 65 pages.
  const RegionHeader hmax = compute_layout(RegionGeometry{1000, 24, 64, 2, 48}, 1);
  EXPECT_EQ(hmax.control_bytes, 65u * kPageBytes);
  EXPECT_EQ(hmax.rings_offset, kPageBytes + 65u * kPageBytes);
  // A ring smaller than a page still takes a page of its own.
  EXPECT_EQ(hmax.ring_stride, uint64_t{kPageBytes});
}

TEST(LayoutValues, EpochOnlyChangesTheEpoch) {
  RegionHeader a = compute_layout(RegionGeometry{}, 1);
  RegionHeader b = compute_layout(RegionGeometry{}, 2);
  EXPECT_NE(a.agent_epoch, b.agent_epoch);
  b.agent_epoch = a.agent_epoch;
  EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0);
}

TEST(SlotsFor, CountsTheHeaderAndRoundsUp) {
  EXPECT_EQ(slots_for(0, 64), 1u);
  EXPECT_EQ(slots_for(1, 64), 1u);
  EXPECT_EQ(slots_for(48, 64), 1u);  // 48 + 16-byte header = one full slot
  EXPECT_EQ(slots_for(49, 64), 2u);
  EXPECT_EQ(slots_for(112, 64), 2u);
  EXPECT_EQ(slots_for(113, 64), 3u);
  EXPECT_EQ(slots_for(240, 256), 1u);
  EXPECT_EQ(slots_for(241, 256), 2u);
  EXPECT_EQ(slots_for(65520, 65536), 1u);
  EXPECT_EQ(slots_for(65521, 65536), 2u);
  // No 32-bit overflow on the largest length: (2^32 - 1 + 16) / 64 rounded up.
  EXPECT_EQ(slots_for(UINT32_MAX, 64), 67108865u);
  EXPECT_EQ(slots_for(UINT32_MAX, 65536), 65537u);
}

TEST(SlotsFor, MatchesTheBytesAnEntryNeeds) {
  for (uint32_t slot_bytes : {64u, 128u, 4096u}) {
    for (uint32_t length = 0; length < 3 * slot_bytes; ++length) {
      const uint32_t slots = slots_for(length, slot_bytes);
      ASSERT_GE(uint64_t{slots} * slot_bytes, uint64_t{length} + kSlotHeaderBytes)
          << length << " bytes in slots of " << slot_bytes;
      ASSERT_LT(uint64_t{slots - 1} * slot_bytes, uint64_t{length} + kSlotHeaderBytes)
          << length << " bytes in slots of " << slot_bytes;
    }
  }
}

}  // namespace
}  // namespace caracal::mqueue
