// The ring protocol for the SmartNIC, which reaches rings in the accelerator's memory through a
// Transport: it produces into RX rings and consumes from TX rings, for server and client
// queues alike. Same protocol as ring.hpp, with these differences:
//  - entries are written into the transport's staging image and posted as writes (header and
//    payload only, not whole slots); publish() then posts the tail with publish_index, which
//    the transport orders after those writes;
//  - the shadow of the peer's index is refreshed by posted reads that complete later, so no
//    call here blocks: when credits run out, reserve() posts a read of the consumer's head and
//    returns nullptr until it has completed (the manager calls Transport::progress meanwhile);
//  - TX tails are not read per queue: RemoteRegion fetches them all at once and hands each
//    consumer its tail with observe_tail(), which posts the read of the new entries' slots;
//  - with RX lines (layout.hpp), the producer also writes every entry's line after its slots
//    and posts it as one more write, which the transport places after the slots' (shm: the
//    release store of the line's first word; rdma: WRITEs on one queue pair are placed in order);
//  - with TX lines, a consumer over a transport whose staging is the region itself (shm) may
//    also take the next entry from its line (next_by_line), before the tail that covers it.
// The accelerator is not trusted further than check_entry: a corrupt TX entry stops that ring
// with PollResult::kCorrupt and a reason.
#pragma once

#include <cstdint>
#include <cstring>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/transport.hpp"

namespace caracal::mqueue {

// Offsets in the remote region of one ring and its two index words.
struct RemoteRingAddress {
  uint64_t ring_offset = 0;
  uint64_t tail_offset = 0;
  uint64_t head_offset = 0;
  uint64_t lines_offset = 0;  // the ring's lines (RX or TX, as the ring is); 0: none
};

template <Transport T>
class RemoteRingProducer {
 public:
  RemoteRingProducer() = default;
  // `tail` and `head` are the ring's index values when the SmartNIC takes it over, `entries`
  // the producer's entry count (with RX lines).
  RemoteRingProducer(T* transport, const RemoteRingAddress& address, const RingGeometry& g,
                     uint32_t tail, uint32_t head, uint32_t entries = 0)
      : t_(transport),
        address_(address),
        geometry_(g),
        tail_(tail),
        published_tail_(tail),
        head_shadow_(head),
        entries_(entries),
        published_entries_(entries) {}

  // Room for an entry of up to `max_payload` bytes in staging, or nullptr: too long for the
  // ring, or no credits yet (a read of the consumer's head is then in flight; call again after
  // Transport::progress).
  std::byte* reserve(uint32_t max_payload) {
    if (max_payload > geometry_.max_message_bytes) return nullptr;
    const uint32_t slots = slots_for(max_payload, geometry_.slot_bytes);
    const Placement p = place_entry(tail_, slots, geometry_.capacity);
    if (free_slots(tail_, head_shadow_, geometry_.capacity) < p.total(slots)) {
      poll_credits();
      if (free_slots(tail_, head_shadow_, geometry_.capacity) < p.total(slots)) return nullptr;
    }
    if (p.skip != 0) {
      write_header(tail_ & (geometry_.capacity - 1), 0, kSlotSkip, p.skip, 0);
      tail_ += p.skip;
    }
    reserved_position_ = p.position;
    reserved_slots_ = slots;
    return slot(p.position) + kSlotHeaderBytes;
  }

  // Completes the reservation (see RingProducer::commit) and posts the entry's write.
  bool commit(uint32_t length, uint64_t token, uint16_t flags = 0) {
    const uint32_t slots = slots_for(length, geometry_.slot_bytes);
    if (reserved_slots_ == 0 || slots > reserved_slots_) return false;
    write_header(reserved_position_, length, flags, slots, token);
    t_->post_write(slot_offset(reserved_position_), kSlotHeaderBytes + length);
    write_line(reserved_position_, length);
    tail_ += slots;
    reserved_slots_ = 0;
    return true;
  }

  // reserve + copy + commit.
  bool push(const void* payload, uint32_t length, uint64_t token, uint16_t flags = 0) {
    std::byte* dst = reserve(length);
    if (dst == nullptr) return false;
    if (length != 0) std::memcpy(dst, payload, length);
    return commit(length, token, flags);
  }

  // Posts the tail once per burst; the transport orders it after the entries' writes. With RX
  // lines the entry count goes first: the consumer never reads it (it keeps its own count),
  // it is for a producer that takes the ring over later.
  void publish() {
    if (tail_ != published_tail_) {
      if (has_lines() && entries_ != published_entries_) {
        t_->publish_index(address_.tail_offset + kEntriesWordOffset, entries_);
        published_entries_ = entries_;
      }
      t_->publish_index(address_.tail_offset, tail_);
      published_tail_ = tail_;
    }
  }

  // Folds in a completed read of the consumer's head, or posts one if none is in flight.
  void poll_credits() {
    if (credit_ticket_ == 0) {
      credit_ticket_ = t_->post_read(address_.head_offset, sizeof(uint32_t));
    }
    if (t_->completed() >= credit_ticket_) {
      const uint32_t head = t_->load_index(address_.head_offset);
      // Never overwrite unread entries on the word of a head that cannot follow the known one.
      if (head_can_follow(head, head_shadow_, tail_)) head_shadow_ = head;
      credit_ticket_ = 0;
    }
  }

  uint32_t credits() const { return free_slots(tail_, head_shadow_, geometry_.capacity); }
  // Slots the accelerator has not yet given back, by the shadow head.
  uint32_t outstanding_slots() const { return tail_ - head_shadow_; }
  uint32_t tail() const { return tail_; }
  uint32_t entries() const { return entries_; }
  bool has_lines() const { return address_.lines_offset != 0; }
  const RingGeometry& geometry() const { return geometry_; }

 private:
  uint64_t slot_offset(uint32_t position) const {
    return address_.ring_offset + uint64_t{position} * geometry_.slot_bytes;
  }
  std::byte* slot(uint32_t position) const { return t_->staging(slot_offset(position)); }
  void write_header(uint32_t position, uint32_t length, uint16_t flags, uint32_t slots,
                    uint64_t token) {
    const SlotHeader h{length, flags, static_cast<uint16_t>(slots), token};
    std::memcpy(slot(position), &h, sizeof(h));
    if ((flags & kSlotSkip) != 0) {
      t_->post_write(slot_offset(position), kSlotHeaderBytes);
      write_line(position, 0);
    }
  }

  // With RX lines: the line of the entry whose header (and `length` bytes of payload) are in
  // its slot at `position`, in the LL encoding of layout.hpp, posted after the slot's write.
  // Each word is one 8-byte store: in `shm` staging is the region, and the accelerator may be
  // loading the words while they are stored.
  void write_line(uint32_t position, uint32_t length) {
    if (!has_lines()) return;
    uint32_t data[kLineWords] = {};
    const uint32_t inline_bytes = length < kLineInlineBytes ? length : kLineInlineBytes;
    std::memcpy(data, slot(position), kSlotHeaderBytes + inline_bytes);
    const uint64_t offset =
        address_.lines_offset + uint64_t{entries_ & (geometry_.capacity - 1)} * kLineBytes;
    auto* words = reinterpret_cast<uint64_t*>(t_->staging(offset));
    const uint32_t flag = line_flag(entries_);
    // The slot's bytes before the line's first word: pairs with the consumer's acquire after
    // it has seen that word (RingConsumer::next_from_line).
    store_release(words, line_word(flag, data[0]));
    for (uint32_t k = 1; k < kLineWords; ++k)
      store_relaxed(words + k, line_word(flag, data[k]));
    t_->post_write(offset, kLineBytes);
    ++entries_;
  }

  T* t_ = nullptr;
  RemoteRingAddress address_{};
  RingGeometry geometry_{};
  uint32_t tail_ = 0;
  uint32_t published_tail_ = 0;
  uint32_t head_shadow_ = 0;
  uint64_t credit_ticket_ = 0;
  uint32_t reserved_position_ = 0;
  uint32_t reserved_slots_ = 0;
  uint32_t entries_ = 0;  // entries written (RX lines)
  uint32_t published_entries_ = 0;
};

template <Transport T>
class RemoteRingConsumer {
 public:
  RemoteRingConsumer() = default;
  // `head` is the ring's head when the SmartNIC takes it over, `entries` the consumer's entry
  // count (with TX lines).
  RemoteRingConsumer(T* transport, const RemoteRingAddress& address, const RingGeometry& g,
                     uint32_t head, uint32_t entries = 0)
      : t_(transport),
        address_(address),
        geometry_(g),
        head_(head),
        read_(head),
        published_head_(head),
        tail_shadow_(head),
        fetched_(head),
        fetch_target_(head),
        entries_(entries),
        published_entries_(entries) {}

  // Hands over a freshly read value of the producer's tail and posts reads of the slots it
  // uncovers (at most two ranges: the ring may wrap between the old and the new tail). A tail
  // that moves backwards or past capacity is a peer bug and is ignored.
  void observe_tail(uint32_t tail) {
    if (tail == tail_shadow_ || tail - head_ > geometry_.capacity ||
        tail - head_ < tail_shadow_ - head_) {
      return;
    }
    const uint32_t mask = geometry_.capacity - 1;
    const uint32_t from = tail_shadow_ & mask;
    const uint32_t count = tail - tail_shadow_;
    const uint32_t first = count < geometry_.capacity - from ? count : geometry_.capacity - from;
    fetch_ticket_ = t_->post_read(slot_offset(from), first * geometry_.slot_bytes);
    if (first < count) {
      fetch_ticket_ = t_->post_read(slot_offset(0), (count - first) * geometry_.slot_bytes);
    }
    tail_shadow_ = tail;
    fetch_target_ = tail;
  }

  // Reads the tail of this ring alone: folds in a completed read, or posts one if none is in
  // flight (like RemoteRingProducer::poll_credits; call again after Transport::progress).
  // RemoteRegion's fetch_tx_tails does all rings in one read instead.
  void refresh_tail() {
    if (tail_ticket_ == 0) tail_ticket_ = t_->post_read(address_.tail_offset, sizeof(uint32_t));
    if (t_->completed() >= tail_ticket_) {
      tail_ticket_ = 0;
      observe_tail(t_->load_index(address_.tail_offset));
    }
  }

  // The next entry whose slots have arrived in staging, skipping fillers.
  PollResult next(Entry& out) {
    for (;;) {
      if (read_ == fetched_) {
        if (fetch_target_ == fetched_ || t_->completed() < fetch_ticket_) {
          return PollResult::kEmpty;
        }
        fetched_ = fetch_target_;
      }
      const uint32_t position = read_ & (geometry_.capacity - 1);
      SlotHeader h;
      std::memcpy(&h, slot(position), sizeof(h));
      last_check_ = check_entry(h, position, fetched_ - read_, geometry_);
      if (last_check_ != EntryCheck::kOk) return PollResult::kCorrupt;
      read_ += h.slots;
      if (has_lines()) ++entries_;  // the entry's line, if it has one, is passed over
      if ((h.flags & kSlotSkip) != 0) continue;
      out = Entry{slot(position) + kSlotHeaderBytes, h.length, h.flags, h.token};
      return PollResult::kReady;
    }
  }

  // With TX lines, over a transport whose staging is the region itself (shm): the next entry
  // from its line, when the producer has written one and every entry the tail uncovered has
  // been read (entries come in order). The line's words are loaded one by one, each vouched for
  // by its flag (relaxed: the payload is taken from the line, so nothing else is read after it),
  // and decoded into a buffer of this consumer's; the entry's payload points there, valid until
  // the next call. kEmpty while the line is not all there; kCorrupt when it announces an entry
  // that fails check_entry, or one longer than a line holds (a producer writes lines for short
  // entries only).
  PollResult next_by_line(Entry& out) {
    if (!has_lines() || read_ != fetched_ || fetch_target_ != fetched_) return PollResult::kEmpty;
    const uint32_t flag = line_flag(entries_);
    const auto* words = reinterpret_cast<const uint64_t*>(t_->staging(
        address_.lines_offset + uint64_t{entries_ & (geometry_.capacity - 1)} * kLineBytes));
    constexpr uint32_t kHeaderWords = kSlotHeaderBytes / 4;
    uint32_t data[kLineWords];
    for (uint32_t k = 0; k < kHeaderWords; ++k) {
      const uint64_t w = load_relaxed(words + k);
      if (line_word_flag(w) != flag) return PollResult::kEmpty;
      data[k] = line_word_data(w);
    }
    SlotHeader h;
    std::memcpy(&h, data, sizeof(h));
    const uint32_t position = read_ & (geometry_.capacity - 1);
    last_check_ = check_entry(h, position, geometry_.capacity - (read_ - head_), geometry_);
    if (last_check_ == EntryCheck::kOk &&
        ((h.flags & kSlotSkip) != 0 || h.length > kLineInlineBytes)) {
      last_check_ = EntryCheck::kNotInLine;
    }
    if (last_check_ != EntryCheck::kOk) return PollResult::kCorrupt;
    const uint32_t payload_words = (h.length + 3) / 4;
    for (uint32_t k = kHeaderWords; k < kHeaderWords + payload_words; ++k) {
      const uint64_t w = load_relaxed(words + k);
      if (line_word_flag(w) != flag) return PollResult::kEmpty;  // the rest is still landing
      data[k] = line_word_data(w);
    }
    std::memcpy(line_payload_, data + kHeaderWords, size_t{payload_words} * 4);
    read_ += h.slots;
    ++entries_;
    // Taken ahead of the tail: a tail up to here uncovers nothing more (observe_tail ignores
    // one that does not go past it).
    if (read_ - head_ > tail_shadow_ - head_) {
      tail_shadow_ = read_;
      fetched_ = read_;
      fetch_target_ = read_;
    }
    out = Entry{line_payload_, h.length, h.flags, h.token};
    return PollResult::kReady;
  }

  void release() { head_ = read_; }

  // Posts the head once per burst: the accelerator may reuse the slots from then on. With TX
  // lines the entry count goes first (the transport orders it before the head): only a
  // consumer that takes the ring over later reads it.
  void publish() {
    if (head_ != published_head_) {
      if (has_lines() && entries_ != published_entries_) {
        t_->publish_index(address_.head_offset + kEntriesWordOffset, entries_);
        published_entries_ = entries_;
      }
      t_->publish_index(address_.head_offset, head_);
      published_head_ = head_;
    }
  }

  EntryCheck last_check() const { return last_check_; }
  uint32_t pending_slots() const { return tail_shadow_ - read_; }
  // True while slots uncovered by the last observed tail are still being read into staging
  // (next() reports kEmpty until Transport::progress sees the read complete).
  bool reading() const { return fetch_target_ != fetched_; }
  uint32_t head() const { return head_; }
  uint32_t entries() const { return entries_; }
  bool has_lines() const { return address_.lines_offset != 0; }
  const RingGeometry& geometry() const { return geometry_; }

 private:
  uint64_t slot_offset(uint32_t position) const {
    return address_.ring_offset + uint64_t{position} * geometry_.slot_bytes;
  }
  const std::byte* slot(uint32_t position) const { return t_->staging(slot_offset(position)); }

  T* t_ = nullptr;
  RemoteRingAddress address_{};
  RingGeometry geometry_{};
  uint32_t head_ = 0;
  uint32_t read_ = 0;
  uint32_t published_head_ = 0;
  uint32_t tail_shadow_ = 0;   // newest tail observed
  uint32_t fetched_ = 0;       // entries up to here are in staging
  uint32_t fetch_target_ = 0;  // ... once fetch_ticket_ completes
  uint64_t fetch_ticket_ = 0;
  uint64_t tail_ticket_ = 0;  // refresh_tail's read, while in flight
  EntryCheck last_check_ = EntryCheck::kOk;
  uint32_t entries_ = 0;  // entries read, skip markers included (TX lines)
  uint32_t published_entries_ = 0;
  alignas(8) std::byte line_payload_[kLineInlineBytes] = {};  // next_by_line's last entry
};

}  // namespace caracal::mqueue
