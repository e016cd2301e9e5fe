// The ring protocol for the SmartNIC, which reaches rings in the accelerator's memory through a
// Transport: it produces into RX rings and consumes from TX rings, for server and client
// queues alike. The protocol itself is ring.hpp's (BasicRingProducer, BasicRingConsumer); this
// file is how it reaches memory through a transport, and what only this side does:
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

// The peer's index word of a ring, read through a transport: a read is posted when the ring
// needs the value and none is in flight, and the value is taken by the first call that finds
// the read complete. Nothing blocks: the caller polls again after Transport::progress.
template <Transport T>
class PeerIndexRead {
 public:
  // The word's value when a read of it has completed (and then a new one may be posted);
  // false while the read is in flight. load_index is the transport's acquire of the word (shm:
  // a load_acquire of the live word; rdma: the READ has completed into staging).
  bool read(T* t, uint64_t offset, uint32_t& value) {
    if (ticket_ == 0) ticket_ = t->post_read(offset, sizeof(uint32_t));
    if (t->completed() < ticket_) return false;
    ticket_ = 0;
    value = t->load_index(offset);
    return true;
  }

 private:
  uint64_t ticket_ = 0;
};

// A producer's access to a ring through a transport (the SmartNIC's RX rings).
template <Transport T>
class TransportProducerAccess {
 public:
  // The SmartNIC writes every RX entry's line with the entry (see LineAnnounce).
  static constexpr LineAnnounce kLineAnnounce = LineAnnounce::kEveryEntry;

  TransportProducerAccess() = default;
  TransportProducerAccess(T* transport, const RemoteRingAddress& address)
      : t_(transport), address_(address) {}

  std::byte* slot(uint64_t offset) { return t_->staging(address_.ring_offset + offset); }
  void post_slot(uint64_t offset, uint32_t bytes) {
    t_->post_write(address_.ring_offset + offset, bytes);
  }
  bool has_lines() const { return address_.lines_offset != 0; }
  uint64_t* line(uint32_t index) {
    return reinterpret_cast<uint64_t*>(t_->staging(line_offset(index)));
  }
  // After the slot's write on the same transport, which places it after.
  void post_line(uint32_t index) { t_->post_write(line_offset(index), kLineBytes); }
  void publish_entries(uint32_t count) {
    t_->publish_index(address_.tail_offset + kEntriesWordOffset, count);
  }
  // The transport orders the index after every write posted before it (shm: a release store;
  // rdma: an index WRITE after the data WRITEs on one queue pair). Pairs with the accelerator's
  // load_acquire of the tail (RingConsumer::refresh_tail).
  void publish_index(uint32_t tail) { t_->publish_index(address_.tail_offset, tail); }
  // The consumer's head, by a posted read (see PeerIndexRead); the accelerator released it in
  // RingConsumer::publish.
  bool read_peer_index(uint32_t& head) { return head_read_.read(t_, address_.head_offset, head); }

 private:
  uint64_t line_offset(uint32_t index) const {
    return address_.lines_offset + uint64_t{index} * kLineBytes;
  }

  T* t_ = nullptr;
  RemoteRingAddress address_{};
  PeerIndexRead<T> head_read_;
};

// A consumer's access to a ring through a transport (the SmartNIC's TX rings). Entries are read
// in staging, where they are readable only once the posted reads of their slots have completed:
// a tail the SmartNIC observes posts those reads, and refill() makes the slots readable when the
// last of them completes.
template <Transport T>
class TransportConsumerAccess {
 public:
  TransportConsumerAccess() = default;
  // `head`: where the consumer takes the ring over; nothing past it is observed yet.
  TransportConsumerAccess(T* transport, const RemoteRingAddress& address, uint32_t head)
      : t_(transport), address_(address), observed_(head) {}

  const std::byte* slot(uint64_t offset) { return t_->staging(address_.ring_offset + offset); }
  bool has_lines() const { return address_.lines_offset != 0; }
  const uint64_t* line(uint32_t index) {
    return reinterpret_cast<const uint64_t*>(
        t_->staging(address_.lines_offset + uint64_t{index} * kLineBytes));
  }
  // The transport orders the count before the head.
  void publish_entries(uint32_t count) {
    t_->publish_index(address_.head_offset + kEntriesWordOffset, count);
  }
  // Posted only after the reads of the slots it frees have completed (the consumer read them in
  // staging); pairs with the accelerator's load_acquire of the head in
  // RingProducer::refresh_credits.
  void publish_index(uint32_t head) { t_->publish_index(address_.head_offset, head); }

  // The slots of the last observed tail become readable when their reads have completed. Never
  // reads the tail itself (`refresh` has nothing to do here): RemoteRegion fetches every TX
  // tail in one read.
  void refill(uint32_t& readable, uint32_t, const RingGeometry&, bool) {
    if (observed_ != readable && t_->completed() >= fetch_ticket_) readable = observed_;
  }

  // Takes a freshly read value of the producer's tail and posts reads of the slots it uncovers
  // (at most two ranges: the ring may wrap between the old and the new tail). Ignored unless it
  // lies in (the last observed tail, head + capacity]: one that moves backwards or past capacity
  // is a peer bug (or an old index write landing late), and the next read starts at the last
  // observed tail, so it must never go back.
  void observe_tail(uint32_t tail, uint32_t head, const RingGeometry& g) {
    if (tail == observed_ || tail - head > g.capacity || tail - head < observed_ - head) return;
    const uint32_t from = observed_ & (g.capacity - 1);
    const uint32_t count = tail - observed_;
    const uint32_t first = count < g.capacity - from ? count : g.capacity - from;
    fetch_ticket_ = t_->post_read(slot_offset(from, g), first * g.slot_bytes);
    if (first < count) {
      fetch_ticket_ = t_->post_read(slot_offset(0, g), (count - first) * g.slot_bytes);
    }
    observed_ = tail;
  }
  // The producer's tail of this ring alone, by a posted read (see PeerIndexRead); the
  // accelerator released it in RingProducer::publish.
  bool read_peer_index(uint32_t& tail) { return tail_read_.read(t_, address_.tail_offset, tail); }
  // The consumer took entries up to `read` from their lines, ahead of any tail: a tail up to
  // there uncovers nothing more.
  void observed_up_to(uint32_t read) { observed_ = read; }

  uint32_t observed() const { return observed_; }
  T* transport() const { return t_; }

 private:
  uint64_t slot_offset(uint32_t position, const RingGeometry& g) const {
    return address_.ring_offset + uint64_t{position} * g.slot_bytes;
  }

  T* t_ = nullptr;
  RemoteRingAddress address_{};
  uint32_t observed_ = 0;       // newest tail observed: slots before it are read, or being read
  uint64_t fetch_ticket_ = 0;   // ... until this ticket completes
  PeerIndexRead<T> tail_read_;  // refresh_tail's read
};

// The SmartNIC's producer of an RX ring: BasicRingProducer through a transport.
template <Transport T>
class RemoteRingProducer : public BasicRingProducer<TransportProducerAccess<T>> {
  using Base = BasicRingProducer<TransportProducerAccess<T>>;

 public:
  RemoteRingProducer() = default;
  // `tail` and `head` are the ring's index values when the SmartNIC takes it over, `entries`
  // the producer's entry count (with RX lines).
  RemoteRingProducer(T* transport, const RemoteRingAddress& address, const RingGeometry& g,
                     uint32_t tail, uint32_t head, uint32_t entries = 0)
      : Base(TransportProducerAccess<T>(transport, address), g, tail, head, entries) {}
};

// The SmartNIC's consumer of a TX ring: BasicRingConsumer through a transport.
template <Transport T>
class RemoteRingConsumer : public BasicRingConsumer<TransportConsumerAccess<T>> {
  using Base = BasicRingConsumer<TransportConsumerAccess<T>>;
  using Base::access_;
  using Base::entries_;
  using Base::geometry_;
  using Base::head_;
  using Base::read_;
  using Base::readable_;

 public:
  RemoteRingConsumer() = default;
  // `head` is the ring's head when the SmartNIC takes it over, `entries` the consumer's entry
  // count (with TX lines).
  RemoteRingConsumer(T* transport, const RemoteRingAddress& address, const RingGeometry& g,
                     uint32_t head, uint32_t entries = 0)
      : Base(TransportConsumerAccess<T>(transport, address, head), g, head, head, entries) {}

  // Hands over a freshly read value of the producer's tail and posts reads of the slots it
  // uncovers (TransportConsumerAccess::observe_tail; a bogus tail is ignored).
  void observe_tail(uint32_t tail) { access_.observe_tail(tail, head_, geometry_); }

  // Reads the tail of this ring alone: folds in a completed read, or posts one if none is in
  // flight (like RemoteRingProducer::refresh_credits; call again after Transport::progress).
  // RemoteRegion's fetch_tx_tails does all rings in one read instead.
  void refresh_tail() {
    uint32_t tail = 0;
    if (access_.read_peer_index(tail)) observe_tail(tail);
  }

  // The next entry whose slots have arrived in staging, skipping fillers.
  PollResult next(Entry& out) { return this->next_readable(out, true, nullptr); }

  // With TX lines, over a transport whose staging is the region itself (shm): the next entry
  // from its line, when the producer has written one and every entry the tail uncovered has
  // been read (entries come in order). The line's words are loaded one by one, each vouched for
  // by its flag (relaxed: the payload is taken from the line, so nothing else is read after it),
  // and decoded into a buffer of this consumer's; the entry's payload points there, valid until
  // the next call. kEmpty while the line is not all there; kCorrupt when it announces an entry
  // that fails check_entry, or one longer than a line holds (a producer writes lines for short
  // entries only).
  PollResult next_by_line(Entry& out) {
    if (!this->has_lines() || read_ != readable_ || reading()) return PollResult::kEmpty;
    const uint32_t flag = line_flag(entries_);
    const uint64_t* words = access_.line(entries_ & (geometry_.capacity - 1));
    constexpr uint32_t kHeaderWords = kSlotHeaderBytes / 4;
    uint32_t data[kLineWords];
    for (uint32_t k = 0; k < kHeaderWords; ++k) {
      const uint64_t w = load_relaxed(words + k);
      if (line_word_flag(w) != flag) return PollResult::kEmpty;
      data[k] = line_word_data(w);
    }
    SlotHeader h;
    std::memcpy(&h, data, sizeof(h));
    if (this->check_line_entry(h) && ((h.flags & kSlotSkip) != 0 || h.length > kLineInlineBytes)) {
      this->last_check_ = EntryCheck::kNotInLine;
    }
    if (this->last_check_ != EntryCheck::kOk) return PollResult::kCorrupt;
    const uint32_t payload_words = (h.length + 3) / 4;
    for (uint32_t k = kHeaderWords; k < kHeaderWords + payload_words; ++k) {
      const uint64_t w = load_relaxed(words + k);
      if (line_word_flag(w) != flag) return PollResult::kEmpty;  // the rest is still landing
      data[k] = line_word_data(w);
    }
    std::memcpy(line_payload_, data + kHeaderWords, size_t{payload_words} * 4);
    this->take(h);
    // Taken ahead of the tail: a tail up to here uncovers nothing more (observe_tail ignores
    // one that does not go past it).
    if (read_ - head_ > access_.observed() - head_) {
      access_.observed_up_to(read_);
      readable_ = read_;
    }
    out = Entry{line_payload_, h.length, h.flags, h.token};
    return PollResult::kReady;
  }

  // Slots uncovered by the observed tail and not yet read.
  uint32_t pending_slots() const { return access_.observed() - read_; }
  // True while slots uncovered by the last observed tail are still being read into staging
  // (next() reports kEmpty until Transport::progress sees the read complete).
  bool reading() const { return access_.observed() != readable_; }

 private:
  alignas(8) std::byte line_payload_[kLineInlineBytes] = {};  // next_by_line's last entry
};

}  // namespace caracal::mqueue
