// The ring protocol, for the side that holds a ring in its own memory (the accelerator).
//
// A ring is `capacity` slots of `slot_bytes` plus two free-running 32-bit indexes, counted in
// slots and masked on use: the producer owns `tail`, the consumer owns `head`; the ring is full
// when `tail - head == capacity`, so every slot is usable. An entry starts with a SlotHeader and
// occupies `slots` consecutive slots; an entry never wraps: when it does not fit before the end,
// the producer fills the rest with a skip marker and starts again at slot 0.
//
// Each side keeps a shadow of the other's index and re-reads it only when it must: the producer
// when its credits (free slots by the shadow head) run out, the consumer when it has read every
// entry up to its shadow tail. Each side publishes its own index once per burst.
//
// Ordering (every release names the acquire it pairs with):
//  - RingProducer::publish stores `tail` with release after the entries' payloads and headers;
//    pairs with the load_acquire of `tail` in RingConsumer::refresh_tail.
//  - RingConsumer::publish stores `head` with release after the consumer's last read of the
//    released entries; pairs with the load_acquire of `head` in RingProducer::refresh_credits,
//    so the producer never overwrites a slot that is still being read.
//
// With RX lines (layout.hpp), a consumer may also find the next entry through its line: a group
// of threads (or next_by_line) loads the line, each word vouched for by its own flag, and hands
// the decoded image to next(). Reads of the entry's slots are ordered after the line by an
// acquire (the first word's load, or a fence after relaxed loads) that pairs with the release
// store of the line's first word in RemoteRingProducer::write_line. Without an image the
// consumer goes by the tail, which the producer still publishes, so bursts cost one read of it.
//
// With TX lines (layout.hpp), the producer may also announce a short entry in its line (line(),
// or write_line() from one thread), before the fence that publishes the tail: a consumer that
// polls the line takes the entry without waiting for the tail. The line needs no fence of its
// own, since its words carry the whole entry; it is written after commit() and counts entries
// like the RX side (the second word of the tx_tail line).
//
// The SmartNIC-side counterparts, which reach a ring through a transport, are in remote_ring.hpp.
// These classes are not thread-safe: one thread (or one elected lane) owns each side of a ring.
#pragma once

#include <cstdint>
#include <cstring>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/platform.hpp"

namespace caracal::mqueue {

struct RingGeometry {
  uint32_t slot_bytes = 0;
  uint32_t capacity = 0;
  uint32_t max_message_bytes = 0;
};

CARACAL_INLINE constexpr RingGeometry ring_geometry(const RegionHeader& h) {
  return RingGeometry{h.slot_bytes, h.ring_capacity, h.max_message_bytes};
}

// Free-running index arithmetic. Unsigned wrap-around makes every difference exact as long as
// the distance between the indexes never exceeds 2^32 - 1 slots, which capacity bounds.
CARACAL_INLINE constexpr uint32_t used_slots(uint32_t tail, uint32_t head) {
  return tail - head;
}
CARACAL_INLINE constexpr uint32_t free_slots(uint32_t tail, uint32_t head, uint32_t capacity) {
  return capacity - (tail - head);
}
// Whether `head`, read from the consumer, can follow the head the producer knows: it lies in
// [known, tail]. Anything else (an old index write landing late, or a peer bug) must be
// ignored, or the producer would count slots as free that the consumer still reads.
CARACAL_INLINE constexpr bool head_can_follow(uint32_t head, uint32_t known, uint32_t tail) {
  return head - known <= tail - known;
}

// Where an entry of `slots` slots goes when the producer's tail is `tail`: `skip` filler slots
// first (0 when it fits before the ring's end), then the entry at ring position `position`.
struct Placement {
  uint32_t skip;
  uint32_t position;
  CARACAL_INLINE constexpr uint32_t total(uint32_t slots) const { return skip + slots; }
};

CARACAL_INLINE constexpr Placement place_entry(uint32_t tail, uint32_t slots, uint32_t capacity) {
  const uint32_t position = tail & (capacity - 1);
  if (position + slots > capacity) return Placement{capacity - position, 0};
  return Placement{0, position};
}

enum class EntryCheck : uint8_t {
  kOk = 0,
  kZeroSlots,       // header says the entry occupies no slot
  kPastRingEnd,     // the entry would run past the ring's end (entries never wrap)
  kPastTail,        // the entry claims slots the producer has not published
  kLengthMismatch,  // `slots` does not match `length`
  kTooLong,         // longer than the ring's max_message_bytes
  kUnknownFlags,    // flags outside kKnownSlotFlags
  kNotInLine,       // a TX line announces a skip marker or an entry longer than a line holds
};

CARACAL_INLINE constexpr const char* entry_check_name(EntryCheck c) {
  switch (c) {
    case EntryCheck::kOk:
      return "ok";
    case EntryCheck::kZeroSlots:
      return "entry occupies zero slots";
    case EntryCheck::kPastRingEnd:
      return "entry runs past the end of the ring";
    case EntryCheck::kPastTail:
      return "entry runs past the published tail";
    case EntryCheck::kLengthMismatch:
      return "slot count does not match length";
    case EntryCheck::kTooLong:
      return "length exceeds max_message_bytes";
    case EntryCheck::kUnknownFlags:
      return "unknown flags";
    case EntryCheck::kNotInLine:
      return "TX line announces an entry that does not fit in a line";
  }
  return "?";
}

// Checks an entry header read at ring position `position` with `available` published slots
// from there on. A consumer never trusts a peer's header further than this.
CARACAL_INLINE constexpr EntryCheck check_entry(const SlotHeader& e, uint32_t position,
                                                uint32_t available, const RingGeometry& g) {
  if ((e.flags & ~kKnownSlotFlags) != 0) return EntryCheck::kUnknownFlags;
  if (e.slots == 0) return EntryCheck::kZeroSlots;
  if (uint64_t{position} + e.slots > g.capacity) return EntryCheck::kPastRingEnd;
  if (e.slots > available) return EntryCheck::kPastTail;
  if ((e.flags & kSlotSkip) != 0) return EntryCheck::kOk;
  if (e.length > g.max_message_bytes) return EntryCheck::kTooLong;
  if (e.slots != slots_for(e.length, g.slot_bytes)) return EntryCheck::kLengthMismatch;
  return EntryCheck::kOk;
}

// A message as the consumer sees it, in place in the ring. Valid until the consumer publishes
// a head past it.
struct Entry {
  const std::byte* payload = nullptr;
  uint32_t length = 0;
  uint16_t flags = 0;
  uint64_t token = 0;
};

// The producing side of a ring in local memory (the accelerator's TX rings).
// One entry's line (layout.hpp, RX and TX lines): its kLineWords words, and the flag each word
// carries once written. W is const on the consumer's side; words is nullptr where there is no
// line to use.
template <class W>
struct LineRef {
  W* words;
  uint32_t flag;
};

class RingProducer {
 public:
  CARACAL_HOST_DEVICE RingProducer() {}
  // `lines`: the ring's TX lines when the region has them (kFeatureTxLines), else nullptr.
  CARACAL_HOST_DEVICE RingProducer(std::byte* slots, const RingGeometry& g, uint32_t* tail_word,
                                   uint32_t* head_word, uint64_t* lines = nullptr)
      : slots_(slots), geometry_(g), tail_word_(tail_word), head_word_(head_word), lines_(lines) {
    // The producer owns tail: a relaxed read recovers it (the region starts zeroed).
    tail_ = load_relaxed(tail_word_);
    published_tail_ = tail_;
    head_shadow_ = load_acquire(head_word_);  // pairs with RingConsumer::publish
    if (lines_ != nullptr) {
      entries_ = load_relaxed(entries_word());  // the producer owns its entry count too
      published_entries_ = entries_;
    }
  }

  // Reserves room for an entry of up to `max_payload` bytes and returns where its payload
  // goes, or nullptr when the ring has no room even after re-reading the consumer's head (the
  // caller backs off and retries) or the entry could never fit. A later reserve() abandons an
  // uncommitted reservation.
  CARACAL_INLINE std::byte* reserve(uint32_t max_payload) {
    if (max_payload > geometry_.max_message_bytes) return nullptr;
    const uint32_t slots = slots_for(max_payload, geometry_.slot_bytes);
    Placement p = place_entry(tail_, slots, geometry_.capacity);
    if (free_slots(tail_, head_shadow_, geometry_.capacity) < p.total(slots)) {
      refresh_credits();
      if (free_slots(tail_, head_shadow_, geometry_.capacity) < p.total(slots)) return nullptr;
    }
    if (p.skip != 0) {
      write_header(tail_ & (geometry_.capacity - 1), 0, kSlotSkip, p.skip, 0);
      tail_ += p.skip;
      if (lines_ != nullptr) ++entries_;  // a skip marker has no line; it counts all the same
    }
    reserved_position_ = p.position;
    reserved_slots_ = slots;
    return slot(p.position) + kSlotHeaderBytes;
  }

  // Completes the last reservation with the actual payload length. Refuses (false, nothing
  // written) when there is no reservation or `length` needs more slots than were reserved.
  // Not visible to the consumer until publish(), or, with TX lines, until its line is written.
  CARACAL_INLINE bool commit(uint32_t length, uint64_t token, uint16_t flags = 0) {
    const uint32_t slots = slots_for(length, geometry_.slot_bytes);
    if (reserved_slots_ == 0 || slots > reserved_slots_) return false;
    write_header(reserved_position_, length, flags, slots, token);
    tail_ += slots;
    reserved_slots_ = 0;
    committed_ = SlotHeader{length, flags, static_cast<uint16_t>(slots), token};
    committed_position_ = reserved_position_;
    if (lines_ != nullptr) {
      committed_line_ = entries_;
      ++entries_;
    }
    return true;
  }

  // With TX lines: the line of the entry the last commit() completed and the flag its words
  // carry; no words when the region has no TX lines or the entry is too long for one. A group
  // of threads may store the words (one each, store_relaxed, in the encoding of layout.hpp:
  // committed_header() and then the payload, zero-padded) any time after the payload is final;
  // no fence is needed before them. They must be stored before the publish of the entry's
  // burst: its fence orders them before the stores of the line's next lap.
  CARACAL_INLINE LineRef<uint64_t> committed_entry_line() const {
    if (lines_ == nullptr || committed_.length > kLineInlineBytes) return {nullptr, 0};
    return {lines_ + static_cast<uint64_t>(committed_line_ & (geometry_.capacity - 1)) * kLineWords,
            line_flag(committed_line_)};
  }
  CARACAL_INLINE const SlotHeader& committed_header() const { return committed_; }
  CARACAL_INLINE bool has_lines() const { return lines_ != nullptr; }

  // committed_entry_line() for one thread where the slots are local memory (host producers,
  // tests): writes the line of the last committed entry from its slot, one 8-byte store a word.
  // Does nothing when there is no line.
  CARACAL_INLINE void write_line() {
    const LineRef<uint64_t> line = committed_entry_line();
    uint64_t* words = line.words;
    const uint32_t flag = line.flag;
    if (words == nullptr) return;
    uint32_t data[kLineWords] = {};
    memcpy(data, slot(committed_position_), kSlotHeaderBytes + committed_.length);
    for (uint32_t k = 0; k < kLineWords; ++k)
      store_relaxed(words + k, line_word(flag, data[k]));
  }

  // Makes every committed entry visible: one release store per burst. With TX lines the entry
  // count goes out first, ordered before the tail by its release: only a producer that resumes
  // the ring reads it back.
  CARACAL_INLINE void publish() {
    if (tail_ != published_tail_) {
      publish_entries();
      store_release(tail_word_, tail_);  // pairs with RingConsumer::refresh_tail
      published_tail_ = tail_;
    }
  }

  // publish() for a caller that has called fence_release() after writing the entries: a
  // relaxed store, ordered by that fence (which pairs with RingConsumer::refresh_tail's acquire
  // like the release store would). Lets one fence publish a TX tail and an RX head together.
  CARACAL_INLINE void publish_after_fence() {
    if (tail_ != published_tail_) {
      publish_entries();
      store_relaxed(tail_word_, tail_);
      published_tail_ = tail_;
    }
  }

  // Re-reads the consumer's head (acquire: its reads of released slots are complete).
  // Re-reads the consumer's head (acquire: pairs with RingConsumer::publish); a head that
  // cannot follow the known one is ignored (head_can_follow, and RingConsumer::refresh_tail).
  CARACAL_INLINE void refresh_credits() {
    const uint32_t head = load_acquire(head_word_);
    if (head_can_follow(head, head_shadow_, tail_)) head_shadow_ = head;
  }

  CARACAL_INLINE uint32_t credits() const {
    return free_slots(tail_, head_shadow_, geometry_.capacity);
  }
  CARACAL_INLINE uint32_t tail() const { return tail_; }
  CARACAL_INLINE uint32_t entries() const { return entries_; }
  CARACAL_INLINE bool has_unpublished() const { return tail_ != published_tail_; }
  CARACAL_INLINE const RingGeometry& geometry() const { return geometry_; }

 private:
  CARACAL_INLINE std::byte* slot(uint32_t position) const {
    return slots_ + static_cast<uint64_t>(position) * geometry_.slot_bytes;
  }
  CARACAL_INLINE uint32_t* entries_word() const {
    return tail_word_ + kEntriesWordOffset / sizeof(uint32_t);
  }
  CARACAL_INLINE void publish_entries() {
    if (lines_ != nullptr && entries_ != published_entries_) {
      store_relaxed(entries_word(), entries_);
      published_entries_ = entries_;
    }
  }
  CARACAL_INLINE void write_header(uint32_t position, uint32_t length, uint16_t flags,
                                   uint32_t slots, uint64_t token) {
    const SlotHeader h{length, flags, static_cast<uint16_t>(slots), token};
#if defined(__CUDA_ARCH__)
    // One 16-byte store (slots are 64-byte aligned): across PCIe, one write instead of four.
    uint4 v;
    memcpy(&v, &h, sizeof(v));
    *reinterpret_cast<uint4*>(slot(position)) = v;
#else
    std::memcpy(slot(position), &h, sizeof(h));
#endif
  }

  std::byte* slots_ = nullptr;
  RingGeometry geometry_{};
  uint32_t* tail_word_ = nullptr;
  uint32_t* head_word_ = nullptr;
  uint32_t tail_ = 0;
  uint32_t published_tail_ = 0;
  uint32_t head_shadow_ = 0;
  uint32_t reserved_position_ = 0;
  uint32_t reserved_slots_ = 0;
  uint64_t* lines_ = nullptr;  // TX lines, or nullptr
  uint32_t entries_ = 0;       // entries committed, skip markers included (TX lines)
  uint32_t published_entries_ = 0;
  uint32_t committed_line_ = 0;  // the entry number of the last commit() (TX lines)
  SlotHeader committed_{};       // the header of the last commit()
  uint32_t committed_position_ = 0;
};

enum class PollResult : uint8_t { kEmpty, kReady, kCorrupt };

// The consuming side of a ring in local memory (the accelerator's RX rings).
class RingConsumer {
 public:
  CARACAL_HOST_DEVICE RingConsumer() {}
  // `lines`: the ring's RX lines when the region has them (kFeatureRxLines), else nullptr.
  CARACAL_HOST_DEVICE RingConsumer(std::byte* slots, const RingGeometry& g, uint32_t* tail_word,
                                   uint32_t* head_word, const uint64_t* lines = nullptr)
      : slots_(slots), geometry_(g), tail_word_(tail_word), head_word_(head_word), lines_(lines) {
    head_ = load_relaxed(head_word_);  // the consumer owns head
    read_ = head_;
    last_start_ = head_;
    published_head_ = head_;
    tail_shadow_ = load_acquire(tail_word_);  // pairs with RingProducer::publish
    if (lines_ != nullptr) {
      entries_ = load_relaxed(entries_word());  // the consumer owns its entry count too
      last_entries_ = entries_;
      published_entries_ = entries_;
    }
  }

  // The next unread entry, skipping fillers. kEmpty when nothing is published past what was
  // read; kCorrupt when the producer wrote an entry that fails check_entry (`last_check()`
  // says how; the ring stays stopped at that entry).
  //
  // The producer's tail is read again only when every entry known so far is read and `refresh`
  // is set: a consumer across PCIe that has an entry in hand answers it rather than pay a
  // round trip for the tail first. `image`, when given, is a copy of the first unread slot
  // (peek()) made after the tail that covers it was read; that slot's header is then taken from
  // the copy instead of being read again.
  //
  // With RX lines, `image` (when given) is instead a decoded copy of the next entry's line
  // (line()) whose flags were all found in place: the entry is taken from it without the tail.
  // Without an image the consumer goes by the tail as above, lines or not; entries taken from
  // lines may have run ahead of the tail it knows, which then counts as nothing published. With
  // `refresh` false it also takes a tail loaded by load_tail_hint(), if that covers more.
  CARACAL_INLINE PollResult next(Entry& out, bool refresh = true,
                                 const std::byte* image = nullptr) {
    if (lines_ != nullptr && image != nullptr) return next_from_line(out, image);
    for (;;) {
      if (!has_published()) {
        if (refresh) {
          refresh_tail();
        } else if (!take_tail_hint()) {
          return PollResult::kEmpty;
        }
        if (!has_published()) return PollResult::kEmpty;
      }
      const uint32_t position = read_ & (geometry_.capacity - 1);
      const SlotHeader& h =
          *reinterpret_cast<const SlotHeader*>(image != nullptr ? image : slot(position));
      image = nullptr;  // only the first slot has a copy
      const SlotHeader copy{h.length, h.flags, h.slots, h.token};
      last_check_ = check_entry(copy, position, tail_shadow_ - read_, geometry_);
      if (last_check_ != EntryCheck::kOk) return PollResult::kCorrupt;
      last_start_ = read_;
      last_entries_ = entries_;
      if (lines_ != nullptr) ++entries_;  // the line of this entry is passed over
      read_ += copy.slots;
      if ((copy.flags & kSlotSkip) != 0) continue;
      out = Entry{slot(position) + kSlotHeaderBytes, copy.length, copy.flags, copy.token};
      return PollResult::kReady;
    }
  }

  // The first unread slot and how many published slots follow it before the ring's end (it
  // included), or nullptr when nothing is published past what was read. Reads the producer's
  // tail again first if every entry known so far is read. Every published byte from the slot
  // on may be copied (up to `contiguous` slots) and the copy handed to next().
  CARACAL_INLINE const std::byte* peek(uint32_t& contiguous) {
    if (!has_published()) refresh_tail();
    const uint32_t position = read_ & (geometry_.capacity - 1);
    const uint32_t published = has_published() ? tail_shadow_ - read_ : 0;
    const uint32_t to_end = geometry_.capacity - position;
    contiguous = published < to_end ? published : to_end;
    return contiguous == 0 ? nullptr : slot(position);
  }

  // With RX lines: the next entry's line and the flag each of its words carries once the
  // producer has written it. A group of threads may load the words (one each, load_relaxed,
  // then a barrier), check their flags and decode the data (line_word_data, in word order) into
  // an image for next(): a SlotHeader followed by up to kLineInlineBytes of payload. next()
  // fences before the slots are read when the payload is not all in the image.
  CARACAL_INLINE LineRef<const uint64_t> next_entry_line() const {
    return {lines_ + static_cast<uint64_t>(entries_ & (geometry_.capacity - 1)) * kLineWords,
            line_flag(entries_)};
  }
  CARACAL_INLINE bool has_lines() const { return lines_ != nullptr; }

  // What a group's line read is for one thread (host tests and tools): loads the next entry's
  // line (the first word with acquire), and when every flag is in place decodes it into
  // `image` (kLineDataBytes) and takes the entry with next(), going on past skip markers.
  // kEmpty while the line is not all there.
  CARACAL_INLINE PollResult next_by_line(Entry& out, std::byte* image) {
    for (;;) {
      const LineRef<const uint64_t> line = next_entry_line();
      const uint64_t* words = line.words;
      const uint32_t flag = line.flag;
      for (uint32_t k = 0; k < kLineWords; ++k) {
        const uint64_t w = k == 0 ? load_acquire(words) : load_relaxed(words + k);
        if (line_word_flag(w) != flag) return PollResult::kEmpty;
        const uint32_t d = line_word_data(w);
        memcpy(image + 4 * k, &d, 4);
      }
      const uint32_t before = entries_;
      const PollResult r = next(out, false, image);
      if (r != PollResult::kEmpty || entries_ == before) return r;  // past a skip: go on
    }
  }

  // With RX lines: loads the producer's tail relaxed, next to a group's line read (one round
  // trip for both), for next() without refresh to continue a burst past the line's entry. The
  // acquire fence that makes those entries' slots visible is paid only when it does.
  CARACAL_INLINE void load_tail_hint() {
    tail_hint_ = load_relaxed(tail_word_);
    has_tail_hint_ = true;
  }

  // Puts back the entry the last next() returned, so the next call returns it again (for a
  // consumer that finds it cannot take the entry now, say because its reply ring is full).
  CARACAL_INLINE void unread() {
    read_ = last_start_;
    entries_ = last_entries_;
  }

  // Gives back every entry read so far (locally; publish() tells the producer).
  CARACAL_INLINE void release() {
    head_ = read_;
    last_start_ = read_;
    last_entries_ = entries_;
  }

  // One release store per burst. The caller must be done reading the released entries.
  CARACAL_INLINE void publish() {
    if (head_ != published_head_) {
      publish_entries();
      store_release(head_word_, head_);  // pairs with RingProducer::refresh_credits
      published_head_ = head_;
    }
  }

  // publish() for a caller that has called fence_release() after its last read of the
  // released entries: a relaxed store ordered by that fence (pairs with
  // RingProducer::refresh_credits's acquire like the release store would).
  CARACAL_INLINE void publish_after_fence() {
    if (head_ != published_head_) {
      publish_entries();
      store_relaxed(head_word_, head_);
      published_head_ = head_;
    }
  }

  // Re-reads the producer's tail (acquire: the entries up to it are fully written).
  //
  // A tail behind what was already read is stale and ignored: a valid tail is never more than
  // a ring ahead of the head, so `tail - read` is at most the capacity, and a tail that went
  // backwards shows as a huge unsigned distance. The protocol never writes one, but an old index
  // write can land after newer ones: it happens under Soft-RoCE in the test VM, with no
  // retransmission counted, and the cause is not found (see mqueue/README.md). Taken as is, such a
  // tail would send the consumer past the producer's entries into stale slots.
  CARACAL_INLINE void refresh_tail() {
    const uint32_t tail = load_acquire(tail_word_);
    if (tail - read_ <= geometry_.capacity) tail_shadow_ = tail;
  }

  CARACAL_INLINE uint32_t pending_slots() const {
    return has_published() ? tail_shadow_ - read_ : 0;
  }
  CARACAL_INLINE EntryCheck last_check() const { return last_check_; }
  CARACAL_INLINE uint32_t head() const { return head_; }
  CARACAL_INLINE uint32_t read_position() const { return read_; }
  CARACAL_INLINE uint32_t entries() const { return entries_; }
  CARACAL_INLINE const RingGeometry& geometry() const { return geometry_; }

 private:
  CARACAL_INLINE const std::byte* slot(uint32_t position) const {
    return slots_ + static_cast<uint64_t>(position) * geometry_.slot_bytes;
  }
  CARACAL_INLINE uint32_t* entries_word() const {
    return head_word_ + kEntriesWordOffset / sizeof(uint32_t);
  }
  // The entry count goes out with the head, ordered before it by the head's release (or the
  // caller's fence); only a consumer that resumes the ring reads it back.
  CARACAL_INLINE void publish_entries() {
    if (lines_ != nullptr && entries_ != published_entries_) {
      store_relaxed(entries_word(), entries_);
      published_entries_ = entries_;
    }
  }

  // Whether the known tail covers an entry past what was read. Entries taken from RX lines can
  // put the read position past the tail, which then covers nothing.
  CARACAL_INLINE bool has_published() const {
    const uint32_t pending = tail_shadow_ - read_;
    return pending != 0 && pending <= geometry_.capacity;
  }
  // Takes the tail of load_tail_hint() when it covers more than was read: an acquire fence, then
  // the relaxed load's value (the fence pairs with the producer's release of that tail).
  CARACAL_INLINE bool take_tail_hint() {
    if (!has_tail_hint_) return false;
    has_tail_hint_ = false;
    const uint32_t pending = tail_hint_ - read_;
    if (pending == 0 || pending > geometry_.capacity) return false;
    fence_acquire();
    tail_shadow_ = tail_hint_;
    return true;
  }

  // next() from an image of the next entry's line (checked by the caller). The entry cannot
  // reach past head + capacity: the producer had no credits beyond it. A payload longer than the
  // line holds is read from the slots, after an acquire fence that pairs with the release store
  // of the line's first word in RemoteRingProducer::write_line (the image's loads were relaxed).
  CARACAL_INLINE PollResult next_from_line(Entry& out, const std::byte* image) {
    SlotHeader h;
    memcpy(&h, image, sizeof(h));
    if ((h.flags & kSlotSkip) == 0 && h.length > kLineInlineBytes) fence_acquire();
    const uint32_t position = read_ & (geometry_.capacity - 1);
    last_check_ = check_entry(h, position, geometry_.capacity - (read_ - head_), geometry_);
    if (last_check_ != EntryCheck::kOk) return PollResult::kCorrupt;
    last_start_ = read_;
    last_entries_ = entries_;
    read_ += h.slots;
    ++entries_;
    // A skip marker's line only moves the consumer on; the next entry needs its own line.
    if ((h.flags & kSlotSkip) != 0) return PollResult::kEmpty;
    out = Entry{slot(position) + kSlotHeaderBytes, h.length, h.flags, h.token};
    return PollResult::kReady;
  }

  std::byte* slots_ = nullptr;
  RingGeometry geometry_{};
  uint32_t* tail_word_ = nullptr;
  uint32_t* head_word_ = nullptr;
  uint32_t head_ = 0;
  uint32_t read_ = 0;
  uint32_t published_head_ = 0;
  uint32_t tail_shadow_ = 0;
  uint32_t last_start_ = 0;
  EntryCheck last_check_ = EntryCheck::kOk;
  const uint64_t* lines_ = nullptr;  // RX lines, or nullptr
  uint32_t entries_ = 0;             // entries read (RX lines)
  uint32_t last_entries_ = 0;
  uint32_t published_entries_ = 0;
  uint32_t tail_hint_ = 0;  // load_tail_hint()
  bool has_tail_hint_ = false;
};

}  // namespace caracal::mqueue
