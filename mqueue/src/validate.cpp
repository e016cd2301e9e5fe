#include "caracal/mqueue/validate.hpp"

#include <string>

namespace caracal::mqueue {
namespace {

Status bad_field(const char* field, uint64_t value, const std::string& expected) {
  return invalid_argument("region field '" + std::string(field) + "' = " + std::to_string(value) +
                          ": " + expected);
}

Status check_geometry(const char* slot_field, uint32_t slot_bytes, const char* capacity_field,
                      uint32_t capacity, uint32_t server_queues, uint32_t client_queues,
                      uint32_t max_message_bytes) {
  if (!is_power_of_two(slot_bytes) || slot_bytes < kMinSlotBytes || slot_bytes > kMaxSlotBytes) {
    return bad_field(slot_field, slot_bytes,
                     "must be a power of two between " + std::to_string(kMinSlotBytes) + " and " +
                         std::to_string(kMaxSlotBytes));
  }
  if (!is_power_of_two(capacity) || capacity < kMinRingCapacity || capacity > kMaxRingCapacity) {
    return bad_field(capacity_field, capacity,
                     "must be a power of two between " + std::to_string(kMinRingCapacity) +
                         " and " + std::to_string(kMaxRingCapacity));
  }
  // The SmartNIC reads the slots a tail uncovers with one transport read, whose length is 32
  // bits (rdma), so a ring must be shorter than 4 GiB.
  if (uint64_t{slot_bytes} * capacity > UINT32_MAX) {
    return bad_field(capacity_field, capacity,
                     "with " + std::to_string(slot_bytes) + "-byte slots the ring is " +
                         std::to_string(uint64_t{slot_bytes} * capacity) +
                         " bytes; a ring must be shorter than 4 GiB");
  }
  if (server_queues == 0 || server_queues > kMaxQueues) {
    return bad_field("server_queue_count", server_queues,
                     "must be between 1 and " + std::to_string(kMaxQueues));
  }
  if (uint64_t{server_queues} + client_queues > kMaxQueues) {
    return bad_field("client_queue_count", client_queues,
                     "server and client queues together exceed " + std::to_string(kMaxQueues) +
                         " (server_queue_count is " + std::to_string(server_queues) + ")");
  }
  // At most half the ring. An entry of s slots that does not fit before the ring's end at
  // position p needs capacity - p skip slots plus s, more than the whole ring when s > p; with
  // s > capacity / 2 some such p exists, and a producer whose tail is there waits forever, even
  // on an empty ring.
  const uint32_t half = capacity / 2;
  const uint32_t max_slots = half < kMaxMessageSlots ? half : kMaxMessageSlots;
  const uint64_t limit = uint64_t{max_slots} * slot_bytes - kSlotHeaderBytes;
  if (max_message_bytes == 0 || max_message_bytes > limit) {
    return bad_field("max_message_bytes", max_message_bytes,
                     "must be between 1 and " + std::to_string(limit) + " (" +
                         std::to_string(max_slots) + " slots of " + std::to_string(slot_bytes) +
                         " bytes, half the ring at most, less the " +
                         std::to_string(kSlotHeaderBytes) + "-byte slot header)");
  }
  return Status::ok_status();
}

}  // namespace

Status validate_geometry(const RegionGeometry& g) {
  return check_geometry("slot_bytes", g.slot_bytes, "ring_capacity", g.ring_capacity,
                        g.server_queue_count, g.client_queue_count, g.max_message_bytes);
}

Status validate_region(const RegionHeader& h, uint64_t mapped_bytes) {
  if (h.magic != kRegionMagic) {
    return invalid_argument("region field 'magic' = " + hex(h.magic) + ": expected " +
                            hex(kRegionMagic) + " (not a Caracal queue region)");
  }
  if (h.layout_version != kLayoutVersion) {
    return bad_field("layout_version", h.layout_version,
                     "this build speaks layout version " + std::to_string(kLayoutVersion));
  }
  if (h.header_bytes != kPageBytes) {
    return bad_field("header_bytes", h.header_bytes, "must be " + std::to_string(kPageBytes));
  }
  if (h.control_line_bytes != kControlLineBytes) {
    return bad_field("control_line_bytes", h.control_line_bytes,
                     "must be " + std::to_string(kControlLineBytes));
  }
  CARACAL_RETURN_IF_ERROR(check_geometry("slot_bytes", h.slot_bytes, "ring_capacity",
                                         h.ring_capacity, h.server_queue_count,
                                         h.client_queue_count, h.max_message_bytes));
  if (h.region_bytes > mapped_bytes) {
    return bad_field("region_bytes", h.region_bytes,
                     "larger than the " + std::to_string(mapped_bytes) + " bytes mapped");
  }
  if (h.region_bytes < h.header_bytes) {
    return bad_field("region_bytes", h.region_bytes,
                     "smaller than the " + std::to_string(h.header_bytes) + "-byte header page");
  }
  const uint64_t queues = queue_count(h);
  if (h.control_offset < h.header_bytes || h.control_offset % kPageBytes != 0 ||
      h.control_offset > h.region_bytes) {
    return bad_field("control_offset", h.control_offset,
                     "must be page-aligned, after the header and inside the region");
  }
  const uint64_t control_needed = (kControlPreambleLines + 4 * queues) * kControlLineBytes;
  if (h.control_bytes < control_needed) {
    return bad_field("control_bytes", h.control_bytes,
                     "too small for " + std::to_string(queues) + " queues (needs " +
                         std::to_string(control_needed) + ")");
  }
  // The SmartNIC reads the control area with one transport read, whose length is 32 bits.
  if (h.control_bytes > UINT32_MAX) {
    return bad_field("control_bytes", h.control_bytes,
                     "must be less than 4 GiB (the control area is read at once)");
  }
  // control_offset <= region_bytes here; subtract instead of adding to rule out overflow.
  if (h.control_bytes > h.region_bytes - h.control_offset) {
    return bad_field("control_bytes", h.control_bytes,
                     "control area ends past region_bytes " + std::to_string(h.region_bytes));
  }
  if (h.rings_offset > h.region_bytes) {
    return bad_field("rings_offset", h.rings_offset,
                     "past region_bytes " + std::to_string(h.region_bytes));
  }
  if (h.rings_offset % kPageBytes != 0 || h.rings_offset < h.control_offset + h.control_bytes) {
    return bad_field("rings_offset", h.rings_offset,
                     "must be page-aligned and after the control area (which ends at " +
                         std::to_string(h.control_offset + h.control_bytes) + ")");
  }
  const uint64_t ring_bytes = uint64_t{h.slot_bytes} * h.ring_capacity;
  if (h.ring_stride < ring_bytes || h.ring_stride % kPageBytes != 0) {
    return bad_field("ring_stride", h.ring_stride,
                     "must be page-aligned and at least slot_bytes * ring_capacity = " +
                         std::to_string(ring_bytes));
  }
  // rings_offset <= region_bytes here; divide instead of multiplying to rule out overflow.
  if ((h.region_bytes - h.rings_offset) / h.ring_stride < 2 * queues) {
    return bad_field("region_bytes", h.region_bytes,
                     "too small for " + std::to_string(2 * queues) + " rings of " +
                         std::to_string(h.ring_stride) + " bytes from offset " +
                         std::to_string(h.rings_offset));
  }
  if ((h.features & ~kKnownFeatures) != 0) {
    return invalid_argument("region field 'features' = " + hex(h.features) +
                            ": unknown feature bits " + hex(h.features & ~kKnownFeatures));
  }
  if (!has_rx_lines(h) && !has_tx_lines(h)) {
    const char* const no_lines = "must be 0 without RX or TX lines (features has neither)";
    if (h.line_bytes != 0) return bad_field("line_bytes", h.line_bytes, no_lines);
    if (h.lines_offset != 0) return bad_field("lines_offset", h.lines_offset, no_lines);
    if (h.line_stride != 0) return bad_field("line_stride", h.line_stride, no_lines);
    return Status::ok_status();
  }
  if (h.line_bytes != kLineBytes) {
    return bad_field("line_bytes", h.line_bytes,
                     "must be " + std::to_string(kLineBytes) + " with RX or TX lines");
  }
  const uint64_t rings_end = h.rings_offset + 2 * queues * h.ring_stride;  // fits: checked above
  if (h.lines_offset > h.region_bytes) {
    return bad_field("lines_offset", h.lines_offset,
                     "past region_bytes " + std::to_string(h.region_bytes));
  }
  if (h.lines_offset % kPageBytes != 0 || h.lines_offset < rings_end) {
    return bad_field("lines_offset", h.lines_offset,
                     "must be page-aligned and after the rings (which end at " +
                         std::to_string(rings_end) + ")");
  }
  // One page-aligned block of ring_capacity lines per direction that has them.
  const uint64_t lines_bytes = (has_rx_lines(h) && has_tx_lines(h) ? 2 : 1) * line_block_bytes(h);
  if (h.line_stride < lines_bytes || h.line_stride % kPageBytes != 0) {
    return bad_field("line_stride", h.line_stride,
                     "must be page-aligned and at least " + std::to_string(lines_bytes) +
                         " (ring_capacity lines of line_bytes, a page-aligned block for each of "
                         "RX and TX that has them)");
  }
  // lines_offset <= region_bytes here; divide instead of multiplying to rule out overflow.
  if ((h.region_bytes - h.lines_offset) / h.line_stride < queues) {
    return bad_field("region_bytes", h.region_bytes,
                     "too small for " + std::to_string(queues) + " queues' lines of " +
                         std::to_string(h.line_stride) + " bytes from offset " +
                         std::to_string(h.lines_offset));
  }
  return Status::ok_status();
}

}  // namespace caracal::mqueue
