// validate_region and validate_geometry: every bad field is refused with a message that names
// it, and valid layouts other than the canonical one are accepted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/validate.hpp"

namespace caracal::mqueue {
namespace {

using ::testing::HasSubstr;

// Two server queues and one client queue of 64 slots of 256 bytes: a 16 KiB ring per page
// group, messages up to 32 slots.
constexpr RegionGeometry kBase{2, 1, 256, 64, 1000};
constexpr uint64_t kTop = uint64_t{1} << 63;

struct RegionCase {
  const char* name;
  std::function<void(RegionHeader&, uint64_t& mapped)> corrupt;
  const char* field;  // the message must contain 'field', quotes included
};

void PrintTo(const RegionCase& c, std::ostream* os) {
  *os << c.name;
}

const RegionCase kRegionCases[] = {
    {"Magic", [](RegionHeader& h, uint64_t&) { h.magic ^= 1; }, "magic"},
    {"MagicZero", [](RegionHeader& h, uint64_t&) { h.magic = 0; }, "magic"},
    {"LayoutVersion", [](RegionHeader& h, uint64_t&) { h.layout_version = kLayoutVersion + 1; },
     "layout_version"},
    {"HeaderBytes", [](RegionHeader& h, uint64_t&) { h.header_bytes = 2 * kPageBytes; },
     "header_bytes"},
    {"ControlLineBytes", [](RegionHeader& h, uint64_t&) { h.control_line_bytes = 128; },
     "control_line_bytes"},
    {"SlotBytesNotPowerOfTwo", [](RegionHeader& h, uint64_t&) { h.slot_bytes = 384; },
     "slot_bytes"},
    {"SlotBytesZero", [](RegionHeader& h, uint64_t&) { h.slot_bytes = 0; }, "slot_bytes"},
    {"SlotBytesTooSmall", [](RegionHeader& h, uint64_t&) { h.slot_bytes = kMinSlotBytes / 2; },
     "slot_bytes"},
    {"SlotBytesTooLarge", [](RegionHeader& h, uint64_t&) { h.slot_bytes = kMaxSlotBytes * 2; },
     "slot_bytes"},
    {"RingCapacityNotPowerOfTwo", [](RegionHeader& h, uint64_t&) { h.ring_capacity = 48; },
     "ring_capacity"},
    {"RingCapacityZero", [](RegionHeader& h, uint64_t&) { h.ring_capacity = 0; }, "ring_capacity"},
    {"RingCapacityTooSmall", [](RegionHeader& h, uint64_t&) { h.ring_capacity = 1; },
     "ring_capacity"},
    {"RingCapacityTooLarge",
     [](RegionHeader& h, uint64_t&) { h.ring_capacity = kMaxRingCapacity * 2; }, "ring_capacity"},
    {"NoServerQueue", [](RegionHeader& h, uint64_t&) { h.server_queue_count = 0; },
     "server_queue_count"},
    {"TooManyQueues",
     [](RegionHeader& h, uint64_t&) {
       h.server_queue_count = 1000;
       h.client_queue_count = 25;
     },
     "client_queue_count"},
    {"QueueCountsOverflow32Bits",
     [](RegionHeader& h, uint64_t&) {
       h.server_queue_count = kMaxQueues;
       h.client_queue_count = UINT32_MAX - kMaxQueues + 2;  // the 32-bit sum is 1
     },
     "client_queue_count"},
    {"MaxMessageBytesZero", [](RegionHeader& h, uint64_t&) { h.max_message_bytes = 0; },
     "max_message_bytes"},
    {"MaxMessageBytesLargerThanTheRing",
     [](RegionHeader& h, uint64_t&) {
       h.max_message_bytes = h.slot_bytes * h.ring_capacity - kSlotHeaderBytes + 1;
     },
     "max_message_bytes"},
    {"MaxMessageBytesHuge", [](RegionHeader& h, uint64_t&) { h.max_message_bytes = UINT32_MAX; },
     "max_message_bytes"},
    {"RegionBytesLargerThanMapped",
     [](RegionHeader& h, uint64_t& mapped) { mapped = h.region_bytes - 1; }, "region_bytes"},
    {"ControlOffsetInsideTheHeader", [](RegionHeader& h, uint64_t&) { h.control_offset = 0; },
     "control_offset"},
    {"ControlOffsetNotPageAligned", [](RegionHeader& h, uint64_t&) { h.control_offset += 64; },
     "control_offset"},
    {"ControlOffsetPastTheRegion", [](RegionHeader& h, uint64_t&) { h.control_offset = kTop; },
     "control_offset"},
    {"ControlBytesTooSmallForTheQueues",
     [](RegionHeader& h, uint64_t&) { h.control_bytes = (1 + 4 * 3) * kControlLineBytes - 1; },
     "control_bytes"},
    {"ControlBytesPastTheRegion",
     [](RegionHeader& h, uint64_t&) { h.control_bytes = h.region_bytes; }, "control_bytes"},
    // control_offset + control_bytes wraps to a small number: must not pass as in bounds.
    {"ControlBytesOverflowingTheOffset",
     [](RegionHeader& h, uint64_t&) { h.control_bytes = 0 - h.control_offset; }, "control_bytes"},
    // In bounds of a huge mapping, but longer than one 32-bit read (as the fuzz input
    // tests/fuzz/regressions/region_header/control-bytes-past-one-read has it).
    {"ControlBytesPastOneRead",
     [](RegionHeader& h, uint64_t& mapped) {
       h.control_bytes = uint64_t{1} << 36;
       h.rings_offset = h.control_offset + h.control_bytes;
       h.region_bytes = h.rings_offset + 6 * h.ring_stride;
       mapped = h.region_bytes;
     },
     "control_bytes"},
    {"RingPastOneRead",
     [](RegionHeader& h, uint64_t& mapped) {
       h.slot_bytes = kMaxSlotBytes;
       h.ring_capacity = kMaxRingCapacity;
       h.ring_stride = uint64_t{h.slot_bytes} * h.ring_capacity;
       h.region_bytes = h.rings_offset + 6 * h.ring_stride;
       mapped = h.region_bytes;
     },
     "ring_capacity"},
    {"ControlAreaWrappingFromFarOut",
     [](RegionHeader& h, uint64_t&) {
       h.control_offset = kTop;
       h.control_bytes = kTop;
     },
     "control_offset"},
    {"RingsOffsetNotPageAligned", [](RegionHeader& h, uint64_t&) { h.rings_offset += 64; },
     "rings_offset"},
    {"RingsOffsetInsideTheControlArea",
     [](RegionHeader& h, uint64_t&) { h.rings_offset = h.control_offset; }, "rings_offset"},
    {"RingStrideZero", [](RegionHeader& h, uint64_t&) { h.ring_stride = 0; }, "ring_stride"},
    {"RingStrideSmallerThanARing",
     [](RegionHeader& h, uint64_t&) {
       h.ring_stride = uint64_t{h.slot_bytes} * h.ring_capacity - kPageBytes;
     },
     "ring_stride"},
    {"RingStrideNotPageAligned", [](RegionHeader& h, uint64_t&) { h.ring_stride += 64; },
     "ring_stride"},
    {"RegionTooSmallForTheRings", [](RegionHeader& h, uint64_t&) { h.region_bytes -= kPageBytes; },
     "region_bytes"},
    {"RingsOffsetPastTheRegion",
     [](RegionHeader& h, uint64_t&) { h.rings_offset = h.region_bytes + kPageBytes; },
     "rings_offset"},
    {"RingStrideOverflowing", [](RegionHeader& h, uint64_t&) { h.ring_stride = kTop; },
     "region_bytes"},
    // Every other field at its hostile extremes: zero, the top of its width, and values whose
    // sums or products wrap 32 or 64 bits.
    {"HeaderBytesZero", [](RegionHeader& h, uint64_t&) { h.header_bytes = 0; }, "header_bytes"},
    {"HeaderBytesMax", [](RegionHeader& h, uint64_t&) { h.header_bytes = UINT32_MAX; },
     "header_bytes"},
    {"RegionBytesZero", [](RegionHeader& h, uint64_t&) { h.region_bytes = 0; }, "region_bytes"},
    {"RegionBytesInsideTheHeader", [](RegionHeader& h, uint64_t&) { h.region_bytes = 112; },
     "region_bytes"},
    {"RegionBytesMax", [](RegionHeader& h, uint64_t&) { h.region_bytes = UINT64_MAX; },
     "region_bytes"},
    // A hostile header claims the whole address space is mapped: everything must still fit
    // what the header itself says.
    {"RegionBytesAndMappedMax",
     [](RegionHeader& h, uint64_t& mapped) {
       h.region_bytes = UINT64_MAX;
       mapped = UINT64_MAX;
       h.rings_offset = UINT64_MAX - kPageBytes + 1;
     },
     "region_bytes"},
    {"ServerQueueCountMax", [](RegionHeader& h, uint64_t&) { h.server_queue_count = UINT32_MAX; },
     "server_queue_count"},
    {"ServerQueueCountPastTheLimit",
     [](RegionHeader& h, uint64_t&) { h.server_queue_count = kMaxQueues + 1; },
     "server_queue_count"},
    {"ClientQueueCountMax", [](RegionHeader& h, uint64_t&) { h.client_queue_count = UINT32_MAX; },
     "client_queue_count"},
    // More queues than the control area and rings were laid out for (within the limit).
    {"ClientQueueCountBeyondTheLayout",
     [](RegionHeader& h, uint64_t&) { h.client_queue_count = 100; }, "control_bytes"},
    {"SlotBytesTopBit", [](RegionHeader& h, uint64_t&) { h.slot_bytes = 1u << 31; }, "slot_bytes"},
    {"RingCapacityTopBit", [](RegionHeader& h, uint64_t&) { h.ring_capacity = 1u << 31; },
     "ring_capacity"},
    {"MaxMessageBytesJustOverHalfTheRing",
     [](RegionHeader& h, uint64_t&) {
       h.max_message_bytes = h.ring_capacity / 2 * h.slot_bytes - kSlotHeaderBytes + 1;
     },
     "max_message_bytes"},
    {"ControlLineBytesZero", [](RegionHeader& h, uint64_t&) { h.control_line_bytes = 0; },
     "control_line_bytes"},
    {"ControlOffsetMax", [](RegionHeader& h, uint64_t&) { h.control_offset = UINT64_MAX; },
     "control_offset"},
    {"ControlBytesZero", [](RegionHeader& h, uint64_t&) { h.control_bytes = 0; }, "control_bytes"},
    {"ControlBytesMax", [](RegionHeader& h, uint64_t&) { h.control_bytes = UINT64_MAX; },
     "control_bytes"},
    {"RingsOffsetMax",
     [](RegionHeader& h, uint64_t&) { h.rings_offset = UINT64_MAX - kPageBytes + 1; },
     "rings_offset"},
    // rings_offset + 2 * queues * ring_stride wraps 64 bits to a small number.
    {"RingsWrapping64Bits",
     [](RegionHeader& h, uint64_t&) {
       h.ring_stride = (UINT64_MAX / 6 + 1 + kPageBytes) & ~uint64_t{kPageBytes - 1};
     },
     "region_bytes"},
    {"FeaturesUnknownBit", [](RegionHeader& h, uint64_t&) { h.features = 1u << 7; }, "features"},
    {"FeaturesAllBits", [](RegionHeader& h, uint64_t&) { h.features = UINT32_MAX; }, "features"},
    {"LineBytesWithoutLines", [](RegionHeader& h, uint64_t&) { h.line_bytes = kLineBytes; },
     "line_bytes"},
    {"LinesOffsetWithoutLines", [](RegionHeader& h, uint64_t&) { h.lines_offset = h.region_bytes; },
     "lines_offset"},
    {"LineStrideWithoutLines", [](RegionHeader& h, uint64_t&) { h.line_stride = kPageBytes; },
     "line_stride"},
};

// The same, from a region with RX and TX lines: the fields that place the lines.
constexpr RegionGeometry kBaseLines{2, 1, 256, 64, 1000, true, true};

const RegionCase kLinesCases[] = {
    {"LineBytesZero", [](RegionHeader& h, uint64_t&) { h.line_bytes = 0; }, "line_bytes"},
    {"LineBytesHalf", [](RegionHeader& h, uint64_t&) { h.line_bytes = kLineBytes / 2; },
     "line_bytes"},
    {"LineBytesMax", [](RegionHeader& h, uint64_t&) { h.line_bytes = UINT32_MAX; }, "line_bytes"},
    {"LinesOffsetZero", [](RegionHeader& h, uint64_t&) { h.lines_offset = 0; }, "lines_offset"},
    {"LinesOffsetNotPageAligned", [](RegionHeader& h, uint64_t&) { h.lines_offset += 64; },
     "lines_offset"},
    {"LinesOffsetInsideTheRings",
     [](RegionHeader& h, uint64_t&) { h.lines_offset = h.rings_offset; }, "lines_offset"},
    {"LinesOffsetInsideTheControlArea",
     [](RegionHeader& h, uint64_t&) { h.lines_offset = h.control_offset; }, "lines_offset"},
    {"LinesOffsetPastTheRegion",
     [](RegionHeader& h, uint64_t&) { h.lines_offset = h.region_bytes + kPageBytes; },
     "lines_offset"},
    {"LinesOffsetMax",
     [](RegionHeader& h, uint64_t&) { h.lines_offset = UINT64_MAX - kPageBytes + 1; },
     "lines_offset"},
    {"LineStrideZero", [](RegionHeader& h, uint64_t&) { h.line_stride = 0; }, "line_stride"},
    // Room for one direction's lines where both are on: RX and TX lines would overlap.
    {"LineStrideOneDirectionOnly",
     [](RegionHeader& h, uint64_t&) { h.line_stride = line_block_bytes(h); }, "line_stride"},
    {"LineStrideNotPageAligned", [](RegionHeader& h, uint64_t&) { h.line_stride += 64; },
     "line_stride"},
    {"LineStrideOverflowing", [](RegionHeader& h, uint64_t&) { h.line_stride = kTop; },
     "region_bytes"},
    // lines_offset + queues * line_stride wraps 64 bits to a small number.
    {"LinesWrapping64Bits",
     [](RegionHeader& h, uint64_t&) {
       h.line_stride = (UINT64_MAX / 3 + 1 + kPageBytes) & ~uint64_t{kPageBytes - 1};
     },
     "region_bytes"},
    {"RegionTooSmallForTheLines", [](RegionHeader& h, uint64_t&) { h.region_bytes -= kPageBytes; },
     "region_bytes"},
    {"MappedTooSmallForTheLines", [](RegionHeader&, uint64_t& mapped) { mapped -= kPageBytes; },
     "region_bytes"},
    // Lines dropped from the features, their fields left behind.
    {"FeaturesWithoutLinesButLineFields", [](RegionHeader& h, uint64_t&) { h.features = 0; },
     "line_bytes"},
    // A ring capacity whose lines need more than the stride gives them.
    {"RingCapacityBeyondTheLines",
     [](RegionHeader& h, uint64_t& mapped) {
       h.ring_capacity *= 2;
       h.ring_stride *= 2;
       h.region_bytes = h.rings_offset + 6 * h.ring_stride;
       h.lines_offset = h.region_bytes;
       h.region_bytes += 3 * h.line_stride;
       mapped = h.region_bytes;
     },
     "line_stride"},
};

class ValidateRegionTest : public ::testing::TestWithParam<RegionCase> {};
class ValidateLinesTest : public ::testing::TestWithParam<RegionCase> {};

INSTANTIATE_TEST_SUITE_P(BadFields, ValidateRegionTest, ::testing::ValuesIn(kRegionCases),
                         [](const ::testing::TestParamInfo<RegionCase>& info) {
                           return info.param.name;
                         });

TEST_P(ValidateRegionTest, RefusesAndNamesTheField) {
  RegionHeader h = compute_layout(kBase, 5);
  uint64_t mapped = h.region_bytes;
  ASSERT_TRUE(validate_region(h, mapped).ok());
  GetParam().corrupt(h, mapped);
  const Status s = validate_region(h, mapped);
  ASSERT_FALSE(s.ok()) << GetParam().name << " was accepted";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'" + std::string(GetParam().field) + "'"));
}

INSTANTIATE_TEST_SUITE_P(BadFields, ValidateLinesTest, ::testing::ValuesIn(kLinesCases),
                         [](const ::testing::TestParamInfo<RegionCase>& info) {
                           return info.param.name;
                         });

TEST_P(ValidateLinesTest, RefusesAndNamesTheField) {
  RegionHeader h = compute_layout(kBaseLines, 5);
  uint64_t mapped = h.region_bytes;
  ASSERT_TRUE(validate_region(h, mapped).ok());
  GetParam().corrupt(h, mapped);
  const Status s = validate_region(h, mapped);
  ASSERT_FALSE(s.ok()) << GetParam().name << " was accepted";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'" + std::string(GetParam().field) + "'"));
}

TEST(ValidateRegion, LinesLayoutsAreAccepted) {
  for (const auto& [rx, tx] : {std::pair{true, false}, {false, true}, {true, true}}) {
    RegionGeometry g = kBaseLines;
    g.rx_lines = rx;
    g.tx_lines = tx;
    const RegionHeader h = compute_layout(g, 1);
    const Status s = validate_region(h, h.region_bytes);
    EXPECT_TRUE(s.ok()) << rx << tx << ": " << s.message();
  }
}

TEST(ValidateRegion, AcceptsAnyAlignedOrderedInBoundsLayout) {
  RegionHeader h = compute_layout(kBase, 5);
  // Larger control area, a gap before the rings, twice the stride, spare room at the end, and
  // more memory mapped than the region claims.
  h.control_bytes += kPageBytes;
  h.rings_offset = h.control_offset + h.control_bytes + 3 * kPageBytes;
  h.ring_stride *= 2;
  h.region_bytes = h.rings_offset + 2 * 3 * h.ring_stride + 5 * kPageBytes;
  const Status s = validate_region(h, h.region_bytes + 12345);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(ValidateRegion, BoundaryValuesAreAccepted) {
  for (const RegionGeometry& g :
       {RegionGeometry{1, 0, kMinSlotBytes, kMinRingCapacity, kMinSlotBytes - kSlotHeaderBytes},
        RegionGeometry{1, kMaxQueues - 1, 64, 2, 48},
        RegionGeometry{1, 0, kMaxSlotBytes, 2, kMaxSlotBytes - kSlotHeaderBytes}}) {
    const RegionHeader h = compute_layout(g, 1);
    const Status s = validate_region(h, h.region_bytes);
    EXPECT_TRUE(s.ok()) << s.message();
  }
}

TEST(ValidateRegion, MessageSaysWhatWasExpected) {
  RegionHeader h = compute_layout(kBase, 5);
  h.slot_bytes = 100;
  const Status s = validate_region(h, h.region_bytes);
  EXPECT_THAT(s.message(), HasSubstr("100"));
  EXPECT_THAT(s.message(), HasSubstr("power of two"));
}

struct GeometryCase {
  const char* name;
  RegionGeometry geometry;
  const char* field;
};

void PrintTo(const GeometryCase& c, std::ostream* os) {
  *os << c.name;
}

const GeometryCase kGeometryCases[] = {
    {"SlotBytesNotPowerOfTwo", {1, 0, 100, 256, 48}, "slot_bytes"},
    {"SlotBytesTooSmall", {1, 0, 32, 256, 16}, "slot_bytes"},
    {"SlotBytesTooLarge", {1, 0, 128 * 1024, 256, 48}, "slot_bytes"},
    {"RingCapacityNotPowerOfTwo", {1, 0, 256, 100, 48}, "ring_capacity"},
    {"RingCapacityTooSmall", {1, 0, 256, 1, 48}, "ring_capacity"},
    {"RingCapacityTooLarge", {1, 0, 64, kMaxRingCapacity * 2, 48}, "ring_capacity"},
    {"NoServerQueue", {0, 4, 256, 256, 48}, "server_queue_count"},
    {"TooManyQueues", {kMaxQueues, 1, 256, 256, 48}, "client_queue_count"},
    {"MaxMessageBytesZero", {1, 0, 256, 256, 0}, "max_message_bytes"},
    {"MaxMessageBytesLargerThanTheRing",
     {1, 0, 64, 4, 4 * 64 - kSlotHeaderBytes + 1},
     "max_message_bytes"},
    {"MaxMessageBytesPastTheSlotCountField",
     {1, 0, 64, 1u << 20, kMaxMessageSlots * 64 - kSlotHeaderBytes + 1},
     "max_message_bytes"},
    // More than half a ring could never be placed after some skip markers (see RingLiveness).
    {"MaxMessageBytesMoreThanHalfTheRing",
     {1, 0, 64, 8, 4 * 64 - kSlotHeaderBytes + 1},
     "max_message_bytes"},
};

class ValidateGeometryTest : public ::testing::TestWithParam<GeometryCase> {};

INSTANTIATE_TEST_SUITE_P(BadFields, ValidateGeometryTest, ::testing::ValuesIn(kGeometryCases),
                         [](const ::testing::TestParamInfo<GeometryCase>& info) {
                           return info.param.name;
                         });

TEST_P(ValidateGeometryTest, RefusesAndNamesTheField) {
  const Status s = validate_geometry(GetParam().geometry);
  ASSERT_FALSE(s.ok()) << GetParam().name << " was accepted";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'" + std::string(GetParam().field) + "'"));
}

TEST(ValidateGeometry, AcceptsSensibleGeometries) {
  for (const RegionGeometry& g :
       {RegionGeometry{}, kBase, RegionGeometry{1, 0, 64, 2, 48},
        RegionGeometry{1, 0, 64, 8, 4 * 64 - kSlotHeaderBytes},
        RegionGeometry{1, 0, 64, 1u << 20, kMaxMessageSlots * 64 - kSlotHeaderBytes},
        RegionGeometry{kMaxQueues - 8, 8, 4096, 16, 100}}) {
    const Status s = validate_geometry(g);
    EXPECT_TRUE(s.ok()) << s.message();
  }
}

}  // namespace
}  // namespace caracal::mqueue
