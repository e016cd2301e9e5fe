// What an engine thread does after a round that found no work: poll again at once (spin), give
// its core away for a moment (yield), or sleep; and how long it spins before it does either.
//
// Spinning keeps a request's latency down only where the thread has a core to itself. Where
// runnable threads outnumber cores (2 I/O threads and the agent's CPU worker on 2 cores), a
// spinning thread holds the core that the thread it waits for needs, until the scheduler's time
// slice ends: replies then take milliseconds. So a thread looks every
// tunables::kContendedLookRounds rounds without work at how much of its core it kept since it
// last looked, and one that lost a good part of it (at least EngineOptions::contended_lost_min,
// and 1/tunables::kContendedLostShare of the time) spins short for
// EngineOptions::contended_hold. A short preemption (a kernel worker, a client woken on the
// same core) does not count.
//
// The policy only decides; the engine thread carries the step out (engine_thread.cpp), since a
// sleep there is a handshake with the threads that wake it. One policy per engine thread, used
// by that thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

#include "mqueue_manager/engine.hpp"

namespace caracal::server {

class IdlePolicy {
 public:
  enum class Step : uint8_t {
    kSpin,   // poll again at once
    kYield,  // replies are outstanding: poll again after std::this_thread::yield()
    kNap,    // replies are outstanding: sleep EngineOptions::max_poll_sleep (nothing wakes the
             // thread for a reply), then poll
    kSleep,  // nothing in flight: sleep until woken for a request or a command
  };

  explicit IdlePolicy(const EngineOptions& options) : options_(options) {}

  // The step after the `idle_rounds`-th round in a row without work (counted from 1).
  // `in_flight`: requests dispatched to the thread's queues and not yet answered; read only once
  // the spin is over, so that a spinning thread does not read the line every dispatch writes.
  Step next_step(uint32_t idle_rounds, const std::atomic<int64_t>& in_flight);

 private:
  using Clock = std::chrono::steady_clock;
  // Whether other threads had this thread's core for a good part of the time since the last
  // look.
  bool lost_core_since_last_look();

  const EngineOptions& options_;
  // The wall and CPU clocks at the last look; none after a sleep, which is not time lost to
  // another thread.
  struct ClockReading {
    Clock::time_point wall;
    std::chrono::nanoseconds cpu;  // this thread's CPU time
  };
  std::optional<ClockReading> last_look_;
  // Until when the thread spins short, once it found it had lost its core.
  std::optional<Clock::time_point> spin_short_until_;
};

// Time an engine thread spent in rounds without work (spinning, yielding, napping, asleep), for
// caracal_engine_idle_seconds_total: a polling thread's CPU time reads as busy whether it works
// or waits for work, and this tells the two apart. The owner thread marks where a run of rounds
// without work begins, and at the start of every round in the run adds the time since its last
// mark to the total: the rounds before it found no work, so that time was idle. A scrape, on
// any thread, reads only the total. It lags by the round under way (at most a sleep,
// tunables::kIdleSleep, and the handler that ends it) and never holds time that turns out to
// be work: a round that finds work (a hosted thread's host running handlers for seconds under
// a flood) adds nothing. A reading that added the run under way up to the scrape's clock did
// hold it, and a counter cannot take it back.
class IdleTime {
 public:
  using Clock = std::chrono::steady_clock;

  // Owner thread: a round found no work after one that did (or after the start).
  void begin(Clock::time_point now) { since_ = now; }
  // Owner thread, while idle: a round begins; the time since the last mark was idle.
  void mark(Clock::time_point now) {
    // Relaxed: the total is the only thing a scrape reads, and only this thread writes it.
    total_ns_.store(total_ns_.load(std::memory_order_relaxed) + (now - since_).count(),
                    std::memory_order_relaxed);
    since_ = now;
  }
  // Owner thread: the round marked last found work; the run ended where it began.
  void end() { since_ = Clock::time_point{}; }
  // Owner thread. A steady_clock reading is never the epoch once the system is up.
  bool idle() const { return since_ != Clock::time_point{}; }

  // Any thread; never decreases.
  double seconds() const {
    return static_cast<double>(total_ns_.load(std::memory_order_relaxed)) * 1e-9;
  }

 private:
  std::atomic<int64_t> total_ns_{0};  // written by the owner thread only
  Clock::time_point since_{};         // owner thread only: the last mark of the run under way
};

}  // namespace caracal::server
