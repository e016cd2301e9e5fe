// The requests of one server queue that are in its agent's RX ring, by token, with their reply
// deadlines (ServiceConfig::reply_timeout_ms). One per server queue, owned by the engine thread
// that serves the queue (datapath.cpp): no locks, no atomics.
//
// Nothing here allocates per request. The flights are an open-addressing table (linear probing,
// deletion by backward shift, so no tombstones) and the FIFOs are rings, all sized up front for
// a ring's worth of requests (the queue's RX ring capacity) and doubled only when that is
// outgrown: by late tokens piling up behind an agent that stopped answering, or a ring larger
// than the size given. A request's add() and take() touch one or two adjacent table entries.
//
// Expiry is cheap on the data path. A queue's answers come back in about the order its requests
// were written (on either accelerator one worker serves a queue, in ring order), so besides the
// token map the flights keep a FIFO of (token, submitted) in write order, and expire() looks only
// at its front: it drops entries whose request was answered meanwhile (lazy removal: an answer
// costs no search of the FIFO, and an answer to the front request pops it at once) and expires
// those past their deadline, stopping at the first live request still in time. So the FIFO holds
// about as many entries as requests are in flight; only while an old request stays unanswered
// and later ones are answered does it hold what was written behind it, for at most one bound.
//
// An expired request is remembered as late (up to tunables::kLateRepliesRemembered per queue,
// the oldest forgotten first), so that an answer that comes for it afterwards is told from a
// token the queue was never given: take() says kLate, and the caller drops the answer. Either
// way an expired request is answered once, by its timeout: its token is no longer live.
#pragma once

#include <bit>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "tunables.hpp"

namespace caracal::server {

// A FIFO in a ring of a power-of-two size that doubles when full (never shrinks): after the
// first requests of a queue, push and pop allocate nothing.
template <typename T>
class GrowingFifo {
 public:
  explicit GrowingFifo(size_t capacity = 16) : items_(std::bit_ceil(capacity < 2 ? 2 : capacity)) {}

  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  T& front() { return items_[head_]; }
  void push_back(const T& v) {
    if (count_ == items_.size()) grow();
    items_[(head_ + count_) & (items_.size() - 1)] = v;
    ++count_;
  }
  void pop_front() {
    head_ = (head_ + 1) & (items_.size() - 1);
    --count_;
  }
  void clear() { head_ = count_ = 0; }

 private:
  void grow() {
    std::vector<T> bigger(items_.size() * 2);
    for (size_t i = 0; i < count_; ++i)
      bigger[i] = items_[(head_ + i) & (items_.size() - 1)];
    items_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> items_;
  size_t head_ = 0;
  size_t count_ = 0;
};

class QueueFlights {
 public:
  using Clock = std::chrono::steady_clock;

  enum class Answer : uint8_t {
    kLive,     // in flight: route the answer
    kLate,     // expired before it came: drop it (DropReason::kLate)
    kUnknown,  // never given to this queue, or already answered (DropReason::kUnknownToken)
  };

  // `ring_slots`: the requests the queue's ring holds at once, which the table and the deadline
  // FIFO are sized for.
  explicit QueueFlights(size_t ring_slots = 256)
      : table_(std::bit_ceil(2 * (ring_slots < 8 ? 8 : ring_slots))),
        order_(ring_slots),
        late_order_(ring_slots) {}

  // A request written into the ring; `deadline`: whether it has one (its service has a reply
  // bound; without one nothing enters the FIFO, and expire() finds nothing). A token already
  // live stays as it was (a duplicate is the agent's problem, not a second request); one
  // remembered as late becomes live again.
  void add(uint64_t token, Clock::time_point submitted, bool deadline) {
    Flight* f = find(token);
    if (f != nullptr) {
      if (!f->late) return;
      f->submitted = submitted;
      f->late = false;
      --late_;
    } else {
      insert(Flight{token, submitted, false});
    }
    if (deadline) order_.push_back({token, submitted});
  }

  // An answer with `token`: kLive (`submitted` set, the request is no longer in flight), kLate
  // or kUnknown.
  Answer take(uint64_t token, Clock::time_point& submitted) {
    Flight* f = find(token);
    if (f == nullptr) return Answer::kUnknown;
    if (f->late) {
      erase(f);
      --late_;
      return Answer::kLate;
    }
    submitted = f->submitted;
    erase(f);
    // The usual case: the oldest request answered first. Popping it now keeps the FIFO as
    // short as the requests in flight without a lookup per entry in expire().
    if (!order_.empty() && order_.front().first == token) order_.pop_front();
    return Answer::kLive;
  }

  // Expires every request whose deadline, `submitted + bound`, is at or before `now`, oldest
  // first, calling on_expired(token, submitted) for each. Returns how many expired.
  template <class OnExpired>
  uint32_t expire(Clock::time_point now, Clock::duration bound, OnExpired&& on_expired) {
    uint32_t expired = 0;
    while (!order_.empty()) {
      const auto [token, submitted] = order_.front();
      Flight* f = find(token);
      const bool live = f != nullptr && !f->late && f->submitted == submitted;
      if (live && now - submitted < bound) break;  // the oldest live request is in time
      order_.pop_front();
      if (!live) continue;  // answered since (or a stale entry of a token used again)
      f->late = true;
      ++late_;
      late_order_.push_back(token);
      ++expired;
      on_expired(token, submitted);
      if (late_order_.size() > tunables::kLateRepliesRemembered) forget_oldest_late();
    }
    return expired;
  }

  // Requests in flight (not expired).
  size_t live() const { return used_ - late_; }
  // Expired requests remembered for their late answers.
  size_t late() const { return late_; }
  // Entries in the FIFO, answered ones not yet dropped included (for tests).
  size_t queued_deadlines() const { return order_.size(); }
  // Entries the table has room for before it doubles (for tests).
  size_t table_capacity() const { return table_.size(); }

  // Every request in flight, with its submit time, appended to `out`; then everything is
  // forgotten (the region is being dropped).
  void take_all(std::vector<std::pair<uint64_t, Clock::time_point>>& out) {
    for (Flight& f : table_) {
      if (f.used && !f.late) out.emplace_back(f.token, f.submitted);
      f.used = false;
    }
    used_ = 0;
    order_.clear();
    late_order_.clear();
    late_ = 0;
  }

 private:
  struct Flight {
    uint64_t token = 0;
    Clock::time_point submitted;
    bool late = false;  // expired: answered by its timeout already
    bool used = false;  // holds a flight (the table's empty entries have it false)
    Flight() = default;
    Flight(uint64_t t, Clock::time_point s, bool l) : token(t), submitted(s), late(l), used(true) {}
  };

  // Fibonacci hashing: a token's slot and sequence bits both spread over the table.
  size_t home(uint64_t token) const {
    return static_cast<size_t>((token * 0x9E3779B97F4A7C15ULL) >>
                               (64 - std::countr_zero(table_.size())));
  }
  size_t mask() const { return table_.size() - 1; }

  Flight* find(uint64_t token) {
    for (size_t i = home(token);; i = (i + 1) & mask()) {
      Flight& f = table_[i];
      if (!f.used) return nullptr;
      if (f.token == token) return &f;
    }
  }

  void insert(const Flight& f) {
    // At most half full, so that probes stay short and find() always meets an empty entry.
    if (2 * (used_ + 1) > table_.size()) grow();
    size_t i = home(f.token);
    while (table_[i].used)
      i = (i + 1) & mask();
    table_[i] = f;
    ++used_;
  }

  // Backward-shift deletion: the entries after the hole that probed past it move into it, so
  // every entry stays reachable from its home without tombstones.
  void erase(Flight* f) {
    size_t hole = static_cast<size_t>(f - table_.data());
    for (size_t i = (hole + 1) & mask(); table_[i].used; i = (i + 1) & mask()) {
      const size_t h = home(table_[i].token);
      // Whether i's home lies cyclically in (hole, i]: if not, the entry may fill the hole.
      const bool stays = hole <= i ? (hole < h && h <= i) : (hole < h || h <= i);
      if (stays) continue;
      table_[hole] = table_[i];
      hole = i;
    }
    table_[hole].used = false;
    --used_;
  }

  void grow() {
    std::vector<Flight> previous(table_.size() * 2);
    previous.swap(table_);  // table_ is now the larger one, empty
    used_ = 0;
    for (const Flight& f : previous) {
      if (f.used) insert(f);
    }
  }

  void forget_oldest_late() {
    const uint64_t token = late_order_.front();
    late_order_.pop_front();
    // Answered late already, or live again under the same token: nothing to forget.
    if (Flight* f = find(token); f != nullptr && f->late) {
      erase(f);
      --late_;
    }
  }

  std::vector<Flight> table_;
  size_t used_ = 0;  // entries of table_ in use, late ones included
  GrowingFifo<std::pair<uint64_t, Clock::time_point>> order_;  // write order; see the top
  GrowingFifo<uint64_t> late_order_;  // tokens as they expired, oldest first (may be stale)
  size_t late_ = 0;                   // entries of table_ that are late
};

}  // namespace caracal::server
