// The requests of one server queue that are in its agent's RX ring, by token, with their reply
// deadlines (ServiceConfig::reply_timeout_ms). One per server queue, owned by the engine thread
// that serves the queue (datapath.cpp): no locks, no atomics.
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

#include <chrono>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tunables.hpp"

namespace caracal::server {

class QueueFlights {
 public:
  using Clock = std::chrono::steady_clock;

  enum class Answer : uint8_t {
    kLive,     // in flight: route the answer
    kLate,     // expired before it came: drop it (DropReason::kLate)
    kUnknown,  // never given to this queue, or already answered (DropReason::kUnknownToken)
  };

  // A request written into the ring; `deadline`: whether it has one (its service has a reply
  // bound; without one nothing enters the FIFO, and expire() finds nothing). A token already
  // live stays as it was (a duplicate is the agent's problem, not a second request); one
  // remembered as late becomes live again.
  void add(uint64_t token, Clock::time_point submitted, bool deadline) {
    auto [it, inserted] = flights_.try_emplace(token, Flight{submitted, false});
    if (!inserted) {
      if (!it->second.late) return;
      it->second = Flight{submitted, false};
      --late_;
    }
    if (deadline) order_.emplace_back(token, submitted);
  }

  // An answer with `token`: kLive (`submitted` set, the request is no longer in flight), kLate
  // or kUnknown.
  Answer take(uint64_t token, Clock::time_point& submitted) {
    const auto it = flights_.find(token);
    if (it == flights_.end()) return Answer::kUnknown;
    if (it->second.late) {
      flights_.erase(it);
      --late_;
      return Answer::kLate;
    }
    submitted = it->second.submitted;
    flights_.erase(it);
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
      const auto it = flights_.find(token);
      const bool live =
          it != flights_.end() && !it->second.late && it->second.submitted == submitted;
      if (live && now - submitted < bound) break;  // the oldest live request is in time
      order_.pop_front();
      if (!live) continue;  // answered since (or a stale entry of a token used again)
      it->second.late = true;
      ++late_;
      late_order_.push_back(token);
      ++expired;
      on_expired(token, submitted);
      if (late_order_.size() > tunables::kLateRepliesRemembered) forget_oldest_late();
    }
    return expired;
  }

  // Requests in flight (not expired).
  size_t live() const { return flights_.size() - late_; }
  // Expired requests remembered for their late answers.
  size_t late() const { return late_; }
  // Entries in the FIFO, answered ones not yet dropped included (for tests).
  size_t queued_deadlines() const { return order_.size(); }

  // Every request in flight, with its submit time, appended to `out`; then everything is
  // forgotten (the region is being dropped).
  void take_all(std::vector<std::pair<uint64_t, Clock::time_point>>& out) {
    for (const auto& [token, f] : flights_) {
      if (!f.late) out.emplace_back(token, f.submitted);
    }
    flights_.clear();
    order_.clear();
    late_order_.clear();
    late_ = 0;
  }

 private:
  struct Flight {
    Clock::time_point submitted;
    bool late = false;  // expired: answered by its timeout already
  };

  void forget_oldest_late() {
    const uint64_t token = late_order_.front();
    late_order_.pop_front();
    // Answered late already, or live again under the same token: nothing to forget.
    if (const auto it = flights_.find(token); it != flights_.end() && it->second.late) {
      flights_.erase(it);
      --late_;
    }
  }

  std::unordered_map<uint64_t, Flight> flights_;
  std::deque<std::pair<uint64_t, Clock::time_point>> order_;  // write order; see the top
  std::deque<uint64_t> late_order_;  // tokens as they expired, oldest first (may be stale)
  size_t late_ = 0;                  // flights_ entries that are late
};

}  // namespace caracal::server
