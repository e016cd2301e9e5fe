// The ring protocol, written once for both sides of a ring.
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
//  - The producer's publish stores `tail` after the entries' payloads and headers with release
//    (LocalProducerAccess::publish_index; through a transport, an index write ordered after the
//    entries' writes); pairs with the load_acquire of `tail` in RingConsumer::refresh_tail.
//  - The consumer's publish stores `head` after its last read of the released entries with
//    release (LocalConsumerAccess::publish_index); pairs with the load_acquire of `head` in
//    RingProducer::refresh_credits (LocalProducerAccess::read_peer_index), so the producer
//    never overwrites a slot that is still being read.
//
// With RX lines (layout.hpp), a consumer may also find the next entry through its line: a group
// of threads (or next_by_line) loads the line, each word vouched for by its own flag, and hands
// the decoded image to next(). Reads of the entry's slots are ordered after the line by an
// acquire (the first word's load, or a fence after relaxed loads) that pairs with the release
// store of the line's first word in BasicRingProducer::store_line. Without an image the
// consumer goes by the tail, which the producer still publishes, so bursts cost one read of it.
//
// With TX lines (layout.hpp), the producer may also announce a short entry in its line
// (committed_entry_line(), or write_line() from one thread), before the fence that publishes the
// tail: a consumer that polls the line takes the entry without waiting for the tail. The line needs
// no fence of its own, since its words carry the whole entry; it is written after commit() and
// counts entries like the RX side (the second word of the tx_tail line).
//
// One protocol, two ways to reach memory (as NCCL's primitives and DPDK's rte_ring do it): the
// protocol is BasicRingProducer and BasicRingConsumer, templates over an access policy that
// says how the ring's memory is reached. All of it is inline; there are no virtual calls.
//  - LocalProducerAccess, LocalConsumerAccess (here): the ring is in this side's own memory
//    (the accelerator, device code included). Slots are written and read in place, indexes
//    stored with release and loaded with acquire (platform.hpp).
//  - TransportProducerAccess, TransportConsumerAccess (remote_ring.hpp): the ring is in the
//    peer's memory (the SmartNIC). Slots are written into the transport's staging image and
//    posted as writes, indexes posted after them, and the peer's index comes from a posted read
//    that completes later.
// RingProducer, RingConsumer (here) and RemoteRingProducer, RemoteRingConsumer (remote_ring.hpp)
// are the templates over those policies, each with its constructor and what only that side does.
//
// Shared: placement and skip markers, free-slot arithmetic and the guard on a peer's head, slot
// headers, entry checks, entry counts and the line encoding, and when to publish what. Apart,
// and why:
//  - How a consumer learns that slots are readable (the policy's refill()). In place, one acquire
//    load of the tail makes every slot up to it readable; a stale tail is judged against the read
//    position (LocalConsumerAccess::refresh_tail). Through a transport, a tail first posts reads
//    of the slots it uncovers into staging, and they become readable when those reads complete;
//    a tail must then never go back, since it is where the next read starts
//    (TransportConsumerAccess::observe_tail).
//  - How a line is read. A GPU group loads an RX line a word a lane and hands next() the image
//    (RingConsumer); the SmartNIC reads a TX line in its staging word by word and copies the
//    payload out (RemoteRingConsumer::next_by_line).
//  - Which entries have lines (LineAnnounce): the SmartNIC announces every RX entry as it writes
//    it; the accelerator announces short TX entries when the caller asks.
//
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

// 32 bits, like everything else in a ring's state: the GPU accelerator copies that state
// between device memory and registers every round, and a narrower field costs a load of its own
// for it and for its padding.
enum class EntryCheck : uint32_t {
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

// Where a consumer stood before an entry it read: release_to() gives back the entries before
// that point and keeps it and those after it, for a consumer that holds some entries in place
// while it reads on (the overlapped handlers of accel/overlap.hpp).
struct ReadMark {
  uint32_t position = 0;
  uint32_t entries = 0;  // the entry count there (with lines)
};

// One entry's line (layout.hpp, RX and TX lines): its kLineWords words, and the flag each word
// carries once written. W is const on the consumer's side; words is nullptr where there is no
// line to use.
template <class W>
struct LineRef {
  W* words;
  uint32_t flag;
};

// A slot header stored into / loaded from the first slot of an entry (slots are 64-byte
// aligned, so the header is too).
CARACAL_INLINE void store_slot_header(std::byte* slot, const SlotHeader& h) {
#if defined(__CUDA_ARCH__)
  // One 16-byte store: across PCIe, one write instead of four.
  uint4 v;
  memcpy(&v, &h, sizeof(v));
  *reinterpret_cast<uint4*>(slot) = v;
#else
  std::memcpy(slot, &h, sizeof(h));
#endif
}
CARACAL_INLINE SlotHeader load_slot_header(const std::byte* slot) {
  // Field by field through the aligned header: each field is loaded as it is needed, where a
  // copy of the whole header would go through the stack (host) or byte by byte (GPU).
  const SlotHeader& h = *reinterpret_cast<const SlotHeader*>(slot);
  return SlotHeader{h.length, h.flags, h.slots, h.token};
}

// Which entries a producer announces in lines (layout.hpp), and so how it stores them.
enum class LineAnnounce : uint8_t {
  // RX lines: every entry, skip markers included, as it is written. A consumer may read a long
  // entry's payload from its slots once it has seen the line, so the line's first word is
  // stored with release.
  kEveryEntry,
  // TX lines: only entries that fit in a line, and only when the caller writes the line
  // (RingProducer::committed_entry_line, write_line). The words carry the whole entry, so none
  // of them orders anything else.
  kOnRequest,
};

// ---------------------------------------------------------------------------------------------
// Access policies. A policy is a small value type; every member is inline.
//
// A producer's (LocalProducerAccess below, TransportProducerAccess in remote_ring.hpp):
//  - kLineAnnounce: which entries have lines.
//  - slot(offset): where the producer writes the ring's bytes at `offset` from its first slot;
//    post_slot(offset, bytes) sends what it wrote there on to the ring.
//  - has_lines(), line(index): the words of line `index` (a ring position of lines), written
//    like slots; post_line(index) sends them on, after every slot posted before.
//  - publish_entries(count), publish_index(tail): make the entry count, then the tail, visible
//    to the consumer, ordered after everything posted before them.
//  - read_peer_index(head): the consumer's head, with acquire semantics, when a read of it is at
//    hand; false while it is not (a transport's read still in flight).
// A consumer's (LocalConsumerAccess, TransportConsumerAccess):
//  - slot(offset), has_lines(), line(index): where the consumer reads the ring's bytes.
//  - refill(readable, read, geometry, refresh): moves `readable`, the end of the slots that may
//    be read now, past `read` when it can (see "Apart" at the top of the file).
//  - publish_entries(count), publish_index(head): give the slots before `head` back, after every
//    read of them.
template <class A>
concept RingProducerAccess = requires(A& a, uint64_t offset, uint32_t n, uint32_t& index) {
  A::kLineAnnounce;
  a.slot(offset);
  a.post_slot(offset, n);
  a.has_lines();
  a.line(n);
  a.post_line(n);
  a.publish_entries(n);
  a.publish_index(n);
  a.read_peer_index(index);
};
template <class A>
concept RingConsumerAccess = requires(A& a, uint64_t offset, uint32_t n, uint32_t& readable,
                                      const RingGeometry& g) {
  a.slot(offset);
  a.has_lines();
  a.line(n);
  a.refill(readable, n, g, true);
  a.publish_entries(n);
  a.publish_index(n);
};

// ---------------------------------------------------------------------------------------------
// The producing side of a ring: the accelerator's TX rings (RingProducer), the SmartNIC's RX
// rings (RemoteRingProducer).
template <RingProducerAccess Access>
class BasicRingProducer {
 public:
  CARACAL_POLICY_INLINE BasicRingProducer() {}
  // `tail` and `head`: the ring's indexes where this producer takes it over; `entries`: the
  // producer's entry count (with lines; 0 without).
  CARACAL_POLICY_INLINE BasicRingProducer(const Access& access, const RingGeometry& g,
                                          uint32_t tail, uint32_t head, uint32_t entries)
      : geometry_(g),
        tail_(tail),
        access_(access),
        published_tail_(tail),
        head_shadow_(head),
        entries_(entries),
        published_entries_(entries) {}

  // Reserves room for an entry of up to `max_payload` bytes and returns where its payload
  // goes, or nullptr when the entry could never fit or the ring has no room even after
  // refresh_credits() (the caller backs off and retries; through a transport the head's read
  // is then in flight, and a call after Transport::progress may find room). A skip marker the
  // ring's end forces is written here. A later reserve() abandons an uncommitted reservation.
  CARACAL_POLICY_INLINE std::byte* reserve(uint32_t max_payload) {
    if (max_payload > geometry_.max_message_bytes) return nullptr;
    const uint32_t slots = slots_for(max_payload, geometry_.slot_bytes);
    const Placement p = place_entry(tail_, slots, geometry_.capacity);
    if (free_slots(tail_, head_shadow_, geometry_.capacity) < p.total(slots)) {
      refresh_credits();
      if (free_slots(tail_, head_shadow_, geometry_.capacity) < p.total(slots)) return nullptr;
    }
    if (p.skip != 0) {
      write_entry(tail_ & (geometry_.capacity - 1),
                  SlotHeader{0, kSlotSkip, static_cast<uint16_t>(p.skip), 0});
      tail_ += p.skip;
    }
    reserved_position_ = p.position;
    reserved_slots_ = slots;
    return slot(p.position) + kSlotHeaderBytes;
  }

  // Completes the last reservation with the actual payload length. Refuses (false, nothing
  // written) when there is no reservation or `length` needs more slots than were reserved.
  // Not visible to the consumer until publish(), or, with lines, until its line is written
  // (RX lines: here; TX lines: by the caller).
  CARACAL_POLICY_INLINE bool commit(uint32_t length, uint64_t token, uint16_t flags = 0) {
    const uint32_t slots = slots_for(length, geometry_.slot_bytes);
    if (reserved_slots_ == 0 || slots > reserved_slots_) return false;
    // The header goes to the slot from registers: read back from committed_ just after it is
    // stored, it would wait for the store (a 16-byte load over two 8-byte stores is not
    // forwarded on x86).
    const SlotHeader h{length, flags, static_cast<uint16_t>(slots), token};
    committed_ = h;
    committed_position_ = reserved_position_;
    committed_line_ = entries_;
    write_entry(reserved_position_, h);
    tail_ += slots;
    reserved_slots_ = 0;
    return true;
  }

  // reserve + copy + commit.
  CARACAL_POLICY_INLINE bool push(const void* payload, uint32_t length, uint64_t token,
                                  uint16_t flags = 0) {
    std::byte* dst = reserve(length);
    if (dst == nullptr) return false;
    if (length != 0) memcpy(dst, payload, length);
    return commit(length, token, flags);
  }

  // Makes every committed entry visible: the tail once per burst, after the entries (in place:
  // a release store; through a transport: an index write the transport orders after the
  // entries' writes). With lines the entry count goes first, ordered before the tail: the
  // consumer keeps its own count, so only a producer that takes the ring over reads it back.
  CARACAL_POLICY_INLINE void publish() {
    if (tail_ != published_tail_) {
      publish_entries();
      // Pairs with the consumer's acquire of the tail (RingConsumer::refresh_tail; the
      // SmartNIC's load_index of a TX tail).
      access_.publish_index(tail_);
      published_tail_ = tail_;
    }
  }

  // Re-reads the consumer's head. Its acquire pairs with the consumer's publish(), so the
  // consumer's reads of the slots it gave back are complete. Through a transport the read is
  // posted, and a later call that finds it complete folds it in. A head that cannot follow the
  // known one is ignored (head_can_follow, and RingConsumer::refresh_tail).
  CARACAL_POLICY_INLINE void refresh_credits() {
    uint32_t head = 0;
    if (access_.read_peer_index(head) && head_can_follow(head, head_shadow_, tail_)) {
      head_shadow_ = head;
    }
  }

  CARACAL_POLICY_INLINE uint32_t credits() const {
    return free_slots(tail_, head_shadow_, geometry_.capacity);
  }
  // Slots the consumer has not yet given back, by the shadow head.
  CARACAL_POLICY_INLINE uint32_t outstanding_slots() const { return tail_ - head_shadow_; }
  CARACAL_POLICY_INLINE uint32_t tail() const { return tail_; }
  CARACAL_POLICY_INLINE uint32_t entries() const { return entries_; }
  CARACAL_POLICY_INLINE bool has_unpublished() const { return tail_ != published_tail_; }
  CARACAL_POLICY_INLINE bool has_lines() const { return access_.has_lines(); }
  CARACAL_POLICY_INLINE const RingGeometry& geometry() const { return geometry_; }

 protected:
  CARACAL_POLICY_INLINE uint64_t slot_offset(uint32_t position) const {
    return uint64_t{position} * geometry_.slot_bytes;
  }
  CARACAL_POLICY_INLINE std::byte* slot(uint32_t position) {
    return access_.slot(slot_offset(position));
  }

  // Writes the header of an entry whose payload is in its slots already, sends header and
  // payload on (not whole slots), and counts the entry for lines: every entry has a line
  // number, skip markers included, whether or not its line is written.
  CARACAL_POLICY_INLINE void write_entry(uint32_t position, const SlotHeader& h) {
    store_slot_header(slot(position), h);
    access_.post_slot(slot_offset(position), kSlotHeaderBytes + h.length);
    if (access_.has_lines()) {
      if constexpr (Access::kLineAnnounce == LineAnnounce::kEveryEntry) {
        store_line(position, h.length, entries_);
      }
      ++entries_;
    }
  }

  // The line of entry number `entry`, whose header and `length` bytes of payload are in its
  // slot at `position`, in the encoding of layout.hpp, sent on after the slot. Each word is one
  // 8-byte store: over shm staging is the region, and the consumer may be loading the words
  // while they are stored.
  CARACAL_POLICY_INLINE void store_line(uint32_t position, uint32_t length, uint32_t entry) {
    uint32_t data[kLineWords] = {};
    const uint32_t inline_bytes = length < kLineInlineBytes ? length : kLineInlineBytes;
    memcpy(data, slot(position), kSlotHeaderBytes + inline_bytes);
    const uint32_t index = entry & (geometry_.capacity - 1);
    uint64_t* words = access_.line(index);
    const uint32_t flag = line_flag(entry);
    if constexpr (Access::kLineAnnounce == LineAnnounce::kEveryEntry) {
      // The slot's bytes before the line's first word: pairs with the consumer's acquire after
      // it has seen that word (RingConsumer::next_from_line).
      store_release(words, line_word(flag, data[0]));
    } else {
      store_relaxed(words, line_word(flag, data[0]));
    }
    for (uint32_t k = 1; k < kLineWords; ++k) {
      store_relaxed(words + k, line_word(flag, data[k]));
    }
    access_.post_line(index);
  }

  CARACAL_POLICY_INLINE void publish_entries() {
    if (access_.has_lines() && entries_ != published_entries_) {
      access_.publish_entries(entries_);
      published_entries_ = entries_;
    }
  }

  // Ordered to leave no padding: the GPU accelerator copies its rings' state between device
  // memory and registers every round, and padding costs loads of their own.
  RingGeometry geometry_{};
  uint32_t tail_ = 0;
  Access access_{};
  uint32_t published_tail_ = 0;
  uint32_t head_shadow_ = 0;
  uint32_t reserved_position_ = 0;
  uint32_t reserved_slots_ = 0;
  uint32_t committed_position_ = 0;
  uint32_t entries_ = 0;  // entries committed, skip markers included (with lines)
  uint32_t published_entries_ = 0;
  uint32_t committed_line_ = 0;  // the entry number of the last commit() (with lines)
  SlotHeader committed_{};       // the header of the last commit()
};

enum class PollResult : uint8_t { kEmpty, kReady, kCorrupt };

// ---------------------------------------------------------------------------------------------
// The consuming side of a ring: the accelerator's RX rings (RingConsumer), the SmartNIC's TX
// rings (RemoteRingConsumer).
template <RingConsumerAccess Access>
class BasicRingConsumer {
 public:
  CARACAL_POLICY_INLINE BasicRingConsumer() {}
  // `head`: the ring's head where this consumer takes it over; `readable`: the end of the
  // slots it may read at once (a tail it has read, or `head`); `entries`: its entry count
  // (with lines; 0 without).
  CARACAL_POLICY_INLINE BasicRingConsumer(const Access& access, const RingGeometry& g,
                                          uint32_t head, uint32_t readable, uint32_t entries)
      : geometry_(g),
        head_(head),
        access_(access),
        read_(head),
        published_head_(head),
        readable_(readable),
        last_start_(head),
        entries_(entries),
        last_entries_(entries),
        published_entries_(entries),
        head_entries_(entries) {}

  // Gives back every entry read so far (locally; publish() tells the producer).
  CARACAL_POLICY_INLINE void release() {
    head_ = read_;
    head_entries_ = entries_;
    last_start_ = read_;
    last_entries_ = entries_;
  }

  // Where the next entry read will start (mark it before next(), to hold that entry).
  CARACAL_POLICY_INLINE ReadMark mark() const { return {read_, entries_}; }
  // Gives back the entries read before `m` (a mark() taken since the last release) and keeps
  // the rest read for a later release; unread() is unaffected.
  CARACAL_POLICY_INLINE void release_to(const ReadMark& m) {
    head_ = m.position;
    head_entries_ = m.entries;
  }
  // How far `m` lies past the head, in slots: among held entries the smallest is the oldest.
  CARACAL_POLICY_INLINE uint32_t distance(const ReadMark& m) const { return m.position - head_; }

  // The head once per burst, after the entry count (with lines; only a consumer that takes the
  // ring over reads it back). The caller must be done reading the released entries: the head
  // lets the producer write their slots again.
  CARACAL_POLICY_INLINE void publish() {
    if (head_ != published_head_) {
      publish_entries();
      // Pairs with the producer's acquire of the head (BasicRingProducer::refresh_credits).
      access_.publish_index(head_);
      published_head_ = head_;
    }
  }

  CARACAL_POLICY_INLINE EntryCheck last_check() const { return last_check_; }
  CARACAL_POLICY_INLINE uint32_t head() const { return head_; }
  CARACAL_POLICY_INLINE uint32_t read_position() const { return read_; }
  CARACAL_POLICY_INLINE uint32_t entries() const { return entries_; }
  CARACAL_POLICY_INLINE bool has_lines() const { return access_.has_lines(); }
  CARACAL_POLICY_INLINE const RingGeometry& geometry() const { return geometry_; }

 protected:
  CARACAL_POLICY_INLINE const std::byte* slot(uint32_t position) {
    return access_.slot(uint64_t{position} * geometry_.slot_bytes);
  }

  // Whether the readable end covers an entry past what was read. Entries taken from lines can
  // put the read position past it, which then covers nothing.
  CARACAL_POLICY_INLINE bool has_readable() const {
    const uint32_t pending = readable_ - read_;
    return pending != 0 && pending <= geometry_.capacity;
  }

  // The next entry up to the readable end, skipping fillers; when every readable entry is
  // read, the policy's refill() is asked for more first (`refresh`: whether it may read the
  // producer's tail again). `image`, when given, is a copy of the first unread slot made after
  // the end that covers it was read; that slot's header is taken from the copy.
  CARACAL_POLICY_INLINE PollResult next_readable(Entry& out, bool refresh, const std::byte* image) {
    for (;;) {
      if (!has_readable()) {
        access_.refill(readable_, read_, geometry_, refresh);
        if (!has_readable()) return PollResult::kEmpty;
      }
      const uint32_t position = read_ & (geometry_.capacity - 1);
      const SlotHeader h = load_slot_header(image != nullptr ? image : slot(position));
      image = nullptr;  // only the first slot has a copy
      last_check_ = check_entry(h, position, readable_ - read_, geometry_);
      if (last_check_ != EntryCheck::kOk) return PollResult::kCorrupt;
      take(h);
      if ((h.flags & kSlotSkip) != 0) continue;
      out = entry_at(position, h);
      return PollResult::kReady;
    }
  }

  // Checks the entry a line announces (header `h`, decoded from the line) at the read
  // position. No tail need cover it, but it cannot reach past head + capacity: the producer
  // had no credits beyond.
  CARACAL_POLICY_INLINE bool check_line_entry(const SlotHeader& h) {
    last_check_ = check_entry(h, read_ & (geometry_.capacity - 1),
                              geometry_.capacity - (read_ - head_), geometry_);
    return last_check_ == EntryCheck::kOk;
  }

  // Moves past the checked entry at the read position and returns its ring position. Every
  // entry counts for lines, whether it was found by its line or by the tail.
  CARACAL_POLICY_INLINE uint32_t take(const SlotHeader& h) {
    const uint32_t position = read_ & (geometry_.capacity - 1);
    last_start_ = read_;
    last_entries_ = entries_;
    if (access_.has_lines()) ++entries_;
    read_ += h.slots;
    return position;
  }

  CARACAL_POLICY_INLINE Entry entry_at(uint32_t position, const SlotHeader& h) {
    return Entry{slot(position) + kSlotHeaderBytes, h.length, h.flags, h.token};
  }

  // The entry count at the head: what a consumer that takes the ring over resumes with.
  CARACAL_POLICY_INLINE void publish_entries() {
    if (access_.has_lines() && head_entries_ != published_entries_) {
      access_.publish_entries(head_entries_);
      published_entries_ = head_entries_;
    }
  }

  // Ordered to leave no padding (see BasicRingProducer).
  RingGeometry geometry_{};
  uint32_t head_ = 0;
  Access access_{};
  uint32_t read_ = 0;
  uint32_t published_head_ = 0;
  uint32_t readable_ = 0;  // slots before it may be read (see has_readable)
  uint32_t last_start_ = 0;
  uint32_t entries_ = 0;  // entries read, skip markers included (with lines)
  uint32_t last_entries_ = 0;
  uint32_t published_entries_ = 0;
  uint32_t head_entries_ = 0;  // the entry count at head_ (with lines)
  EntryCheck last_check_ = EntryCheck::kOk;
};

// ---------------------------------------------------------------------------------------------
// Local memory: the accelerator's side.

// A producer's access to a ring in its own memory: slots and lines are written in place, so
// nothing is posted; indexes are stored and loaded with the orders of platform.hpp.
class LocalProducerAccess {
 public:
  static constexpr LineAnnounce kLineAnnounce = LineAnnounce::kOnRequest;

  CARACAL_HOST_DEVICE LocalProducerAccess() {}
  CARACAL_HOST_DEVICE LocalProducerAccess(std::byte* slots, uint32_t* tail_word,
                                          uint32_t* head_word, uint64_t* lines)
      : slots_(slots), tail_word_(tail_word), head_word_(head_word), lines_(lines) {}

  CARACAL_INLINE std::byte* slot(uint64_t offset) const { return slots_ + offset; }
  CARACAL_INLINE void post_slot(uint64_t, uint32_t) const {}  // the slot is the ring
  CARACAL_INLINE bool has_lines() const { return lines_ != nullptr; }
  CARACAL_INLINE uint64_t* line(uint32_t index) const {
    return lines_ + static_cast<uint64_t>(index) * kLineWords;
  }
  CARACAL_INLINE void post_line(uint32_t) const {}
  // Ordered before the tail by the tail's release (or the caller's fence).
  CARACAL_INLINE void publish_entries(uint32_t count) const {
    store_relaxed(entries_word(), count);
  }
  // Release: the entries' payloads and headers before the tail. Pairs with the load_acquire of
  // `tail` in RingConsumer::refresh_tail.
  CARACAL_INLINE void publish_index(uint32_t tail) const { store_release(tail_word_, tail); }
  // For a caller that has called fence_release() after writing the entries: a relaxed store,
  // ordered by that fence, which pairs with RingConsumer::refresh_tail's acquire like the
  // release store would.
  CARACAL_INLINE void publish_index_after_fence(uint32_t tail) const {
    store_relaxed(tail_word_, tail);
  }
  // Acquire: pairs with the store_release of `head` in RingConsumer::publish.
  CARACAL_INLINE bool read_peer_index(uint32_t& head) const {
    head = load_acquire(head_word_);
    return true;
  }

  // Where the producer resumes the ring: it owns the tail and the entry count, so relaxed loads
  // recover them (the region starts zeroed).
  CARACAL_INLINE uint32_t own_tail() const { return load_relaxed(tail_word_); }
  CARACAL_INLINE uint32_t own_entries() const {
    return lines_ != nullptr ? load_relaxed(entries_word()) : 0;
  }

 private:
  CARACAL_INLINE uint32_t* entries_word() const {
    return tail_word_ + kEntriesWordOffset / sizeof(uint32_t);
  }

  std::byte* slots_ = nullptr;
  uint32_t* tail_word_ = nullptr;
  uint32_t* head_word_ = nullptr;
  uint64_t* lines_ = nullptr;  // TX lines, or nullptr
};
static_assert(RingProducerAccess<LocalProducerAccess>);

// A consumer's access to a ring in its own memory: slots and lines are read in place, so one
// acquire load of the tail makes every slot up to it readable.
class LocalConsumerAccess {
 public:
  CARACAL_HOST_DEVICE LocalConsumerAccess() {}
  CARACAL_HOST_DEVICE LocalConsumerAccess(const std::byte* slots, uint32_t* tail_word,
                                          uint32_t* head_word, const uint64_t* lines)
      : slots_(slots), tail_word_(tail_word), head_word_(head_word), lines_(lines) {}

  CARACAL_INLINE const std::byte* slot(uint64_t offset) const { return slots_ + offset; }
  CARACAL_INLINE bool has_lines() const { return lines_ != nullptr; }
  CARACAL_INLINE const uint64_t* line(uint32_t index) const {
    return lines_ + static_cast<uint64_t>(index) * kLineWords;
  }
  // Ordered before the head by the head's release (or the caller's fence).
  CARACAL_INLINE void publish_entries(uint32_t count) const {
    store_relaxed(entries_word(), count);
  }
  // Release: the consumer's reads of the released slots before the head. Pairs with the
  // load_acquire of `head` in RingProducer::refresh_credits (LocalProducerAccess::
  // read_peer_index), so the producer never overwrites a slot that is still being read.
  CARACAL_INLINE void publish_index(uint32_t head) const { store_release(head_word_, head); }
  // For a caller that has called fence_release() after its last read of the released
  // entries: a relaxed store ordered by that fence (pairs with RingProducer::refresh_credits's
  // acquire like the release store would).
  CARACAL_INLINE void publish_index_after_fence(uint32_t head) const {
    store_relaxed(head_word_, head);
  }

  // Without a tail in hand: re-reads the producer's tail, or with `refresh` false takes the one
  // load_tail_hint() loaded, if any.
  CARACAL_INLINE void refill(uint32_t& readable, uint32_t read, const RingGeometry& g,
                             bool refresh) {
    if (refresh) {
      refresh_tail(readable, read, g);
    } else {
      take_tail_hint(readable, read, g);
    }
  }

  // Re-reads the producer's tail (acquire: pairs with the store_release of `tail` in
  // RingProducer::publish, so the entries up to it are fully written).
  //
  // A tail behind what was already read is stale and ignored: a valid tail is never more than
  // a ring ahead of the head, so `tail - read` is at most the capacity, and a tail that went
  // backwards shows as a huge unsigned distance. The protocol never writes one, but a transport
  // may land an old index write after newer ones (Soft-RoCE does: mqueue/README.md, "Index words
  // that go backwards under Soft-RoCE"). Taken as is, such a tail would send the consumer past
  // the producer's entries into stale slots.
  CARACAL_INLINE void refresh_tail(uint32_t& readable, uint32_t read, const RingGeometry& g) {
    const uint32_t tail = load_acquire(tail_word_);
    if (tail - read <= g.capacity) readable = tail;
  }

  // Loads the producer's tail relaxed, to be taken by a later refill() without refresh.
  CARACAL_INLINE void load_tail_hint() {
    tail_hint_ = load_relaxed(tail_word_);
    has_tail_hint_ = 1;
  }
  // Takes the tail of load_tail_hint() when it covers more than was read: an acquire fence, then
  // the relaxed load's value (the fence pairs with the producer's release of that tail in
  // RingProducer::publish).
  CARACAL_INLINE void take_tail_hint(uint32_t& readable, uint32_t read, const RingGeometry& g) {
    if (has_tail_hint_ == 0) return;
    has_tail_hint_ = 0;
    const uint32_t pending = tail_hint_ - read;
    if (pending == 0 || pending > g.capacity) return;
    fence_acquire();
    readable = tail_hint_;
  }

  // Where the consumer resumes the ring: it owns the head and the entry count (relaxed), and
  // the tail it starts from is read with acquire (pairs with RingProducer::publish).
  CARACAL_INLINE uint32_t own_head() const { return load_relaxed(head_word_); }
  CARACAL_INLINE uint32_t own_entries() const {
    return lines_ != nullptr ? load_relaxed(entries_word()) : 0;
  }
  CARACAL_INLINE uint32_t peer_tail() const { return load_acquire(tail_word_); }

 private:
  CARACAL_INLINE uint32_t* entries_word() const {
    return head_word_ + kEntriesWordOffset / sizeof(uint32_t);
  }

  const std::byte* slots_ = nullptr;
  uint32_t* tail_word_ = nullptr;
  uint32_t* head_word_ = nullptr;
  const uint64_t* lines_ = nullptr;  // RX lines, or nullptr
  uint32_t tail_hint_ = 0;           // load_tail_hint()
  uint32_t has_tail_hint_ = 0;       // 0 or 1, a word like the rest (see EntryCheck)
};
static_assert(RingConsumerAccess<LocalConsumerAccess>);

// The producing side of a ring in local memory (the accelerator's TX rings), with TX lines
// written on request.
class RingProducer : public BasicRingProducer<LocalProducerAccess> {
 public:
  CARACAL_HOST_DEVICE RingProducer() {}
  // `lines`: the ring's TX lines when the region has them (kFeatureTxLines), else nullptr.
  CARACAL_HOST_DEVICE RingProducer(std::byte* slots, const RingGeometry& g, uint32_t* tail_word,
                                   uint32_t* head_word, uint64_t* lines = nullptr)
      : RingProducer(LocalProducerAccess(slots, tail_word, head_word, lines), g) {}

  // With TX lines: the line of the entry the last commit() completed and the flag its words
  // carry; no words when the region has no TX lines or the entry is too long for one. A group
  // of threads may store the words (one each, store_relaxed, in the encoding of layout.hpp:
  // committed_header() and then the payload, zero-padded) any time after the payload is final;
  // no fence is needed before them. They must be stored before the publish of the entry's
  // burst: its fence orders them before the stores of the line's next lap.
  CARACAL_INLINE LineRef<uint64_t> committed_entry_line() const {
    if (!access_.has_lines() || committed_.length > kLineInlineBytes) return {nullptr, 0};
    return {access_.line(committed_line_ & (geometry_.capacity - 1)), line_flag(committed_line_)};
  }
  CARACAL_INLINE const SlotHeader& committed_header() const { return committed_; }

  // committed_entry_line() for one thread where the slots are local memory (host producers,
  // tests): writes the line of the last committed entry from its slot, one 8-byte store a word.
  // Does nothing when there is no line.
  CARACAL_INLINE void write_line() {
    if (committed_entry_line().words == nullptr) return;
    store_line(committed_position_, committed_.length, committed_line_);
  }

  // publish() for a caller that has called fence_release() after writing the entries (and
  // their lines): lets one fence publish a TX tail and an RX head together.
  CARACAL_INLINE void publish_after_fence() {
    if (tail_ != published_tail_) {
      publish_entries();
      access_.publish_index_after_fence(tail_);
      published_tail_ = tail_;
    }
  }

 private:
  // The producer resumes the ring at the words' values; the acquire of the head pairs with
  // RingConsumer::publish.
  CARACAL_HOST_DEVICE RingProducer(const LocalProducerAccess& a, const RingGeometry& g)
      : BasicRingProducer(a, g, a.own_tail(), peer_head(a), a.own_entries()) {}
  CARACAL_INLINE static uint32_t peer_head(const LocalProducerAccess& a) {
    uint32_t head = 0;
    a.read_peer_index(head);
    return head;
  }
};

// The consuming side of a ring in local memory (the accelerator's RX rings), with RX lines
// read by a group of threads (or next_by_line).
class RingConsumer : public BasicRingConsumer<LocalConsumerAccess> {
 public:
  CARACAL_HOST_DEVICE RingConsumer() {}
  // `lines`: the ring's RX lines when the region has them (kFeatureRxLines), else nullptr.
  CARACAL_HOST_DEVICE RingConsumer(std::byte* slots, const RingGeometry& g, uint32_t* tail_word,
                                   uint32_t* head_word, const uint64_t* lines = nullptr)
      : RingConsumer(LocalConsumerAccess(slots, tail_word, head_word, lines), g) {}

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
  // (next_entry_line()) whose flags were all found in place: the entry is taken from it without
  // the tail. Without an image the consumer goes by the tail as above, lines or not; entries
  // taken from lines may have run ahead of the tail it knows, which then counts as nothing
  // published. With `refresh` false it also takes a tail loaded by load_tail_hint(), if that
  // covers more.
  CARACAL_INLINE PollResult next(Entry& out, bool refresh = true,
                                 const std::byte* image = nullptr) {
    if (access_.has_lines() && image != nullptr) return next_from_line(out, image);
    return next_readable(out, refresh, image);
  }

  // The first unread slot and how many published slots follow it before the ring's end (it
  // included), or nullptr when nothing is published past what was read. Reads the producer's
  // tail again first if every entry known so far is read. Every published byte from the slot
  // on may be copied (up to `contiguous` slots) and the copy handed to next().
  CARACAL_INLINE const std::byte* peek(uint32_t& contiguous) {
    if (!has_readable()) refresh_tail();
    const uint32_t position = read_ & (geometry_.capacity - 1);
    const uint32_t published = has_readable() ? readable_ - read_ : 0;
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
    return {access_.line(entries_ & (geometry_.capacity - 1)), line_flag(entries_)};
  }

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
  CARACAL_INLINE void load_tail_hint() { access_.load_tail_hint(); }

  // Re-reads the producer's tail (LocalConsumerAccess::refresh_tail: acquire, and a stale tail
  // is ignored).
  CARACAL_INLINE void refresh_tail() { access_.refresh_tail(readable_, read_, geometry_); }

  // Puts back the entry the last next() returned, so the next call returns it again (for a
  // consumer that finds it cannot take the entry now, say because its reply ring is full).
  CARACAL_INLINE void unread() {
    read_ = last_start_;
    entries_ = last_entries_;
  }

  // publish() for a caller that has called fence_release() after its last read of the
  // released entries: lets one fence publish a TX tail and an RX head together.
  CARACAL_INLINE void publish_after_fence() {
    if (head_ != published_head_) {
      publish_entries();
      access_.publish_index_after_fence(head_);
      published_head_ = head_;
    }
  }

  CARACAL_INLINE uint32_t pending_slots() const { return has_readable() ? readable_ - read_ : 0; }

 private:
  CARACAL_HOST_DEVICE RingConsumer(const LocalConsumerAccess& a, const RingGeometry& g)
      : BasicRingConsumer(a, g, a.own_head(), a.peer_tail(), a.own_entries()) {}

  // next() from an image of the next entry's line (checked by the caller). A payload longer
  // than the line holds is read from the slots, after an acquire fence that pairs with the
  // release store of the line's first word in BasicRingProducer::store_line (the image's loads
  // were relaxed).
  CARACAL_INLINE PollResult next_from_line(Entry& out, const std::byte* image) {
    SlotHeader h;
    memcpy(&h, image, sizeof(h));
    if ((h.flags & kSlotSkip) == 0 && h.length > kLineInlineBytes) fence_acquire();
    if (!check_line_entry(h)) return PollResult::kCorrupt;
    const uint32_t position = take(h);
    // A skip marker's line only moves the consumer on; the next entry needs its own line.
    if ((h.flags & kSlotSkip) != 0) return PollResult::kEmpty;
    out = entry_at(position, h);
    return PollResult::kReady;
  }
};

}  // namespace caracal::mqueue
