// The memory layout of a queue region: the contract between the SmartNIC and an accelerator.
//
// A region is one contiguous block in the accelerator's memory (or shared host memory with the
// `shm` transport), laid out as:
//
//   [header page]   RegionHeader: geometry and identity, written once by the agent before the
//                   region is announced, read-only afterwards.
//   [control area]  One cache line per control word: the stop word, then four index arrays of
//                   `queue_count()` lines each (rx_tail, rx_head, tx_head, tx_tail). TX tails are
//                   contiguous so the SmartNIC fetches every one of them with a single read.
//   [rings]         For queue q: its RX ring (SmartNIC -> accelerator) and its TX ring
//                   (accelerator -> SmartNIC), each `ring_capacity` slots of `slot_bytes`, each
//                   starting on a page.
//   [lines]         Only with kFeatureRxLines or kFeatureTxLines: for queue q, a block of
//                   `line_stride` bytes: `ring_capacity` lines of kLineBytes that announce its
//                   RX entries (with kFeatureRxLines), then as many that announce its TX entries
//                   (with kFeatureTxLines), each starting on a page (see "RX lines", "TX lines").
//
// Queues 0..server_queue_count-1 are server queues (RX carries client requests, TX carries
// replies); the following client_queue_count queues are client queues (TX carries a handler's
// outgoing requests, RX carries the replies). Both kinds use the same ring protocol (ring.hpp).
//
// Everything here is plain data with fixed-width fields: it is included by device code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "caracal/mqueue/platform.hpp"

namespace caracal::mqueue {

inline constexpr uint64_t kRegionMagic = 0x3151'4D4C'4352'4143ULL;  // "CARCLMQ1", little-endian
inline constexpr uint32_t kLayoutVersion = 2;

// 64 bytes: the coherence unit of the x86 and Arm (BlueField) cores that share these words.
inline constexpr uint32_t kControlLineBytes = 64;
inline constexpr uint32_t kPageBytes = 4096;

inline constexpr uint32_t kMinSlotBytes = 64;
inline constexpr uint32_t kMaxSlotBytes = 64 * 1024;
inline constexpr uint32_t kMinRingCapacity = 2;
inline constexpr uint32_t kMaxRingCapacity = 1u << 20;
inline constexpr uint32_t kMaxQueues = 1024;          // server + client queues of one region
inline constexpr uint32_t kMaxMessageSlots = 0xFFFF;  // SlotHeader::slots is 16 bits

// The header at the start of the first slot of every ring entry. A message's payload follows
// it contiguously through as many consecutive slots as it needs; a message never wraps.
struct SlotHeader {
  uint32_t length;  // payload bytes (0 for a skip marker)
  uint16_t flags;   // SlotFlags
  uint16_t slots;   // slots the entry occupies, this one included (>= 1)
  uint64_t token;   // server queue: the SmartNIC's reply address, echoed by the handler;
                    // client queue: chosen by the handler, echoed by the SmartNIC.
};
static_assert(sizeof(SlotHeader) == 16);
static_assert(offsetof(SlotHeader, length) == 0);
static_assert(offsetof(SlotHeader, flags) == 4);
static_assert(offsetof(SlotHeader, slots) == 6);
static_assert(offsetof(SlotHeader, token) == 8);
inline constexpr uint32_t kSlotHeaderBytes = sizeof(SlotHeader);

enum SlotFlags : uint16_t {
  kSlotSkip = 1u << 0,     // filler up to the ring's end; the consumer jumps over `slots`
  kSlotError = 1u << 1,    // the payload is an error text instead of a message
  kSlotNoReply = 1u << 2,  // (TX of a server queue) the handler sends nothing to the client
};
inline constexpr uint16_t kKnownSlotFlags = kSlotSkip | kSlotError | kSlotNoReply;

// RX lines (kFeatureRxLines). Across PCIe the ring protocol costs the accelerator two reads in
// a row for every burst: the tail, then the entry it covers (the entry may be read only after
// the tail that publishes it). With RX lines, the SmartNIC also announces every RX entry, skip
// markers included, in a line of its own, and a GPU warp polls the next entry's line (with the
// tail, in the same round trip, for what follows it): the line's first read both discovers the
// entry and, for a short one, delivers it.
//  - A line is kLineWords 8-byte words. Each word holds 4 bytes of data in its low half and a
//    4-byte flag in its high half (NCCL's "LL" encoding). An aligned 8-byte store and an aligned
//    8-byte load are single-copy atomic on both sides of PCIe (and for an RDMA WRITE's DMA), so
//    a reader that sees a word's flag sees that word's data, whatever order the words land in.
//  - The words' data, in order, are the entry's SlotHeader and then up to kLineInlineBytes of its
//    payload, zero-padded. The entry is still written in full into its slots, where a consumer
//    may read it in place; the line only adds a copy of a short payload.
//  - Lines are indexed by entry, not slot: entry n (counting every entry and skip marker since
//    the region was created, modulo 2^32) uses line n % ring_capacity, and every word of it
//    carries the flag line_flag(n). Each line is rewritten every ring_capacity entries, so a
//    stale line carries the flag of n - ring_capacity and never passes for entry n; a zeroed
//    line passes for no entry of the first lap. At most ring_capacity entries are unread (each
//    takes at least one slot), so the producer never overwrites a line that is still unread.
//  - Order: the producer writes the entry's slots, then the line's first word with release,
//    then the other words. A consumer that finds every flag it needs in place and reads the
//    payload from the slots orders those reads after the line with an acquire: the first
//    word's load (host), or a fence after the relaxed loads (GPU, where an acquire load would
//    hold the other loads back for a round trip). A short payload taken from the line needs
//    neither. The tail is still published once per burst: a consumer goes on by it after
//    an entry taken from a line, and goes by it alone where lines gain nothing.
//  - The entry counts live in the second word of the rx_tail line (the producer's, published
//    with the tail) and of the rx_head line (the consumer's, published with the head), so each
//    side can resume where the last one stopped.
//
// TX lines (kFeatureTxLines). The same lines in the other direction: the accelerator announces a
// short TX entry (a reply or a handler's outgoing request of up to kLineInlineBytes) in the line
// of its entry, in the same encoding, and the SmartNIC polls the next entry's line as well as the
// tail. What the lines save here is the accelerator's fence: the tail may be published only
// after a system-scope release fence that waits for the entries' writes to land across PCIe,
// while a line's words are each vouched for by their own flag and may be stored before that
// fence (bench/results/EXPERIMENTS.md, tx-lines-h200).
//  - Only an entry whose payload fits in the line may have one, and none has to: long entries,
//    skip markers, and every entry of a producer that writes no lines (a thread-granular GPU
//    worker, a batched handler) are found by the tail alone. A consumer therefore always goes by
//    the tail as well, and takes each entry from whichever it sees first.
//  - Entry n's line is line n % ring_capacity with the flag line_flag(n), as for RX. The entry is
//    written into its slots too, in full, for a consumer that goes by the tail.
//  - The entry counts live in the second word of the tx_tail line (the producer's) and of the
//    tx_head line (the consumer's).
enum RegionFeatures : uint32_t {
  kFeatureRxLines = 1u << 0,
  kFeatureTxLines = 1u << 1,
};
inline constexpr uint32_t kKnownFeatures = kFeatureRxLines | kFeatureTxLines;

inline constexpr uint32_t kLineBytes = 256;
inline constexpr uint32_t kLineWords = kLineBytes / 8;                           // 32
inline constexpr uint32_t kLineDataBytes = kLineWords * 4;                       // 128
inline constexpr uint32_t kLineInlineBytes = kLineDataBytes - kSlotHeaderBytes;  // 112
// Byte offset of the entry count in an index line (rx_tail, rx_head; tx_tail, tx_head).
inline constexpr uint32_t kEntriesWordOffset = 4;

// The flag of every word of entry n's line: never 0 in the first lap, so a zeroed region holds
// no line.
CARACAL_INLINE constexpr uint32_t line_flag(uint32_t entry) {
  return entry + 1;
}
CARACAL_INLINE constexpr uint64_t line_word(uint32_t flag, uint32_t data) {
  return (uint64_t{flag} << 32) | data;
}
CARACAL_INLINE constexpr uint32_t line_word_flag(uint64_t word) {
  return static_cast<uint32_t>(word >> 32);
}
CARACAL_INLINE constexpr uint32_t line_word_data(uint64_t word) {
  return static_cast<uint32_t>(word);
}

// Written once by the agent before it announces the region; never modified afterwards.
struct RegionHeader {
  uint64_t magic;               // kRegionMagic
  uint32_t layout_version;      // kLayoutVersion
  uint32_t header_bytes;        // kPageBytes
  uint64_t region_bytes;        // whole region, header included
  uint64_t agent_epoch;         // changes every time an agent (re)creates the region
  uint32_t server_queue_count;  // >= 1
  uint32_t client_queue_count;
  uint32_t slot_bytes;          // power of two in [kMinSlotBytes, kMaxSlotBytes]
  uint32_t ring_capacity;       // slots per ring; power of two in [kMinRingCapacity, kMax...]
  uint32_t max_message_bytes;   // largest payload; fits in min(capacity/2, kMaxMessageSlots)
                                // slots, so that it fits after any skip marker
  uint32_t control_line_bytes;  // kControlLineBytes
  uint64_t control_offset;      // start of the control area
  uint64_t control_bytes;       // size of the control area
  uint64_t rings_offset;        // start of queue 0's RX ring
  uint64_t ring_stride;         // distance between consecutive rings (>= slot_bytes*capacity)
  uint32_t features;            // RegionFeatures
  uint32_t line_bytes;          // kLineBytes with RX or TX lines, else 0
  uint64_t lines_offset;        // start of queue 0's lines (0 without RX or TX lines)
  uint64_t line_stride;         // distance between consecutive queues' lines (0 without)
};
static_assert(offsetof(RegionHeader, magic) == 0);
static_assert(offsetof(RegionHeader, layout_version) == 8);
static_assert(offsetof(RegionHeader, header_bytes) == 12);
static_assert(offsetof(RegionHeader, region_bytes) == 16);
static_assert(offsetof(RegionHeader, agent_epoch) == 24);
static_assert(offsetof(RegionHeader, server_queue_count) == 32);
static_assert(offsetof(RegionHeader, client_queue_count) == 36);
static_assert(offsetof(RegionHeader, slot_bytes) == 40);
static_assert(offsetof(RegionHeader, ring_capacity) == 44);
static_assert(offsetof(RegionHeader, max_message_bytes) == 48);
static_assert(offsetof(RegionHeader, control_line_bytes) == 52);
static_assert(offsetof(RegionHeader, control_offset) == 56);
static_assert(offsetof(RegionHeader, control_bytes) == 64);
static_assert(offsetof(RegionHeader, rings_offset) == 72);
static_assert(offsetof(RegionHeader, ring_stride) == 80);
static_assert(offsetof(RegionHeader, features) == 88);
static_assert(offsetof(RegionHeader, line_bytes) == 92);
static_assert(offsetof(RegionHeader, lines_offset) == 96);
static_assert(offsetof(RegionHeader, line_stride) == 104);
static_assert(sizeof(RegionHeader) == 112);
static_assert(sizeof(RegionHeader) <= kPageBytes);

// Control words, in the order of their lines in the control area.
//  - stop: nonzero asks every poller of the region to return. Written by the agent (or the
//    SmartNIC, on teardown) with a release store; read with relaxed loads every few thousand
//    spins, since no data is published through it.
//  - rx_tail[q]: written by the SmartNIC (producer), polled by the accelerator (without RX
//    lines). Its second word holds the producer's entry count (with RX lines).
//  - rx_head[q]: written by the accelerator (consumer), read by the SmartNIC for credits. Its
//    second word holds the consumer's entry count (with RX lines).
//  - tx_head[q]: written by the SmartNIC (consumer), read by the accelerator for credits. Its
//    second word holds the consumer's entry count (with TX lines).
//  - tx_tail[q]: written by the accelerator (producer), read by the SmartNIC, all at once. Its
//    second word holds the producer's entry count (with TX lines).
enum class IndexArray : uint32_t { kRxTail = 0, kRxHead = 1, kTxHead = 2, kTxTail = 3 };
inline constexpr uint32_t kControlPreambleLines = 1;  // the stop word's line

CARACAL_INLINE constexpr bool is_power_of_two(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

CARACAL_INLINE constexpr uint64_t round_up(uint64_t v, uint64_t to) {
  return (v + to - 1) / to * to;
}

// Slots a ring entry with `payload_bytes` of payload occupies.
CARACAL_INLINE constexpr uint32_t slots_for(uint32_t payload_bytes, uint32_t slot_bytes) {
  return static_cast<uint32_t>((uint64_t{payload_bytes} + kSlotHeaderBytes + slot_bytes - 1) /
                               slot_bytes);
}

// What an agent asks for; `compute_layout` turns it into a RegionHeader.
struct RegionGeometry {
  uint32_t server_queue_count = 1;
  uint32_t client_queue_count = 0;
  uint32_t slot_bytes = 256;
  uint32_t ring_capacity = 256;
  uint32_t max_message_bytes = 256 - kSlotHeaderBytes;
  bool rx_lines = false;  // kFeatureRxLines
  bool tx_lines = false;  // kFeatureTxLines
};

CARACAL_INLINE constexpr uint32_t queue_count(const RegionHeader& h) {
  return h.server_queue_count + h.client_queue_count;
}

// The canonical layout for a geometry. Does not validate: see validate.hpp.
CARACAL_INLINE constexpr RegionHeader compute_layout(const RegionGeometry& g, uint64_t epoch) {
  RegionHeader h{};
  h.magic = kRegionMagic;
  h.layout_version = kLayoutVersion;
  h.header_bytes = kPageBytes;
  h.agent_epoch = epoch;
  h.server_queue_count = g.server_queue_count;
  h.client_queue_count = g.client_queue_count;
  h.slot_bytes = g.slot_bytes;
  h.ring_capacity = g.ring_capacity;
  h.max_message_bytes = g.max_message_bytes;
  h.control_line_bytes = kControlLineBytes;
  h.control_offset = kPageBytes;
  const uint64_t queues = uint64_t{g.server_queue_count} + g.client_queue_count;
  h.control_bytes = round_up((kControlPreambleLines + 4 * queues) * kControlLineBytes, kPageBytes);
  h.rings_offset = h.control_offset + h.control_bytes;
  h.ring_stride = round_up(uint64_t{g.slot_bytes} * g.ring_capacity, kPageBytes);
  h.region_bytes = h.rings_offset + 2 * queues * h.ring_stride;
  if (g.rx_lines || g.tx_lines) {
    h.features = (g.rx_lines ? kFeatureRxLines : 0u) | (g.tx_lines ? kFeatureTxLines : 0u);
    h.line_bytes = kLineBytes;
    h.lines_offset = h.region_bytes;
    const uint64_t block = round_up(uint64_t{g.ring_capacity} * kLineBytes, kPageBytes);
    h.line_stride = (g.rx_lines && g.tx_lines ? 2 : 1) * block;
    h.region_bytes += queues * h.line_stride;
  }
  return h;
}

CARACAL_INLINE constexpr bool has_rx_lines(const RegionHeader& h) {
  return (h.features & kFeatureRxLines) != 0;
}
CARACAL_INLINE constexpr bool has_tx_lines(const RegionHeader& h) {
  return (h.features & kFeatureTxLines) != 0;
}
// For logs: ", RX lines", ", TX lines", ", RX and TX lines" or "".
CARACAL_INLINE constexpr const char* lines_suffix(const RegionHeader& h) {
  if (has_rx_lines(h) && has_tx_lines(h)) return ", RX and TX lines";
  if (has_rx_lines(h)) return ", RX lines";
  return has_tx_lines(h) ? ", TX lines" : "";
}
// Bytes of one direction's lines of one queue, page-aligned.
CARACAL_INLINE constexpr uint64_t line_block_bytes(const RegionHeader& h) {
  return round_up(uint64_t{h.ring_capacity} * kLineBytes, kPageBytes);
}

// Byte offsets inside a region, from its (validated) header.
CARACAL_INLINE constexpr uint64_t stop_word_offset(const RegionHeader& h) {
  return h.control_offset;
}
CARACAL_INLINE constexpr uint64_t index_offset(const RegionHeader& h, IndexArray array,
                                               uint32_t queue) {
  return h.control_offset +
         (kControlPreambleLines + static_cast<uint64_t>(array) * queue_count(h) + queue) *
             h.control_line_bytes;
}
CARACAL_INLINE constexpr uint64_t rx_ring_offset(const RegionHeader& h, uint32_t queue) {
  return h.rings_offset + (2 * uint64_t{queue}) * h.ring_stride;
}
CARACAL_INLINE constexpr uint64_t tx_ring_offset(const RegionHeader& h, uint32_t queue) {
  return h.rings_offset + (2 * uint64_t{queue} + 1) * h.ring_stride;
}
// The first of queue `queue`'s RX lines (with kFeatureRxLines).
CARACAL_INLINE constexpr uint64_t rx_lines_offset(const RegionHeader& h, uint32_t queue) {
  return h.lines_offset + uint64_t{queue} * h.line_stride;
}
// The first of queue `queue`'s TX lines (with kFeatureTxLines): after its RX lines, if any.
CARACAL_INLINE constexpr uint64_t tx_lines_offset(const RegionHeader& h, uint32_t queue) {
  return h.lines_offset + uint64_t{queue} * h.line_stride +
         (has_rx_lines(h) ? line_block_bytes(h) : 0);
}
// Queue index of client queue `c`.
CARACAL_INLINE constexpr uint32_t client_queue_index(const RegionHeader& h, uint32_t c) {
  return h.server_queue_count + c;
}

}  // namespace caracal::mqueue
