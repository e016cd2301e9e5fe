#include "idle_policy.hpp"

#include <time.h>

#include <algorithm>
#include <utility>

#include "metrics/metrics.hpp"
#include "tunables.hpp"

namespace caracal::server {

IdlePolicy::Step IdlePolicy::next_step(uint32_t idle_rounds,
                                       const std::atomic<int64_t>& in_flight) {
  const EngineOptions& o = options_;
  uint32_t spin = o.spin_rounds;
  if (spin_short_until_) {
    spin = std::min(spin, o.contended_spin_rounds);
    if (idle_rounds == spin && Clock::now() >= *spin_short_until_) spin_short_until_.reset();
  } else if (idle_rounds % tunables::kContendedLookRounds == 0 && lost_core_since_last_look()) {
    spin_short_until_ = Clock::now() + o.contended_hold;
    if (o.spins_cut != nullptr) o.spins_cut->inc();
    spin = std::min(spin, o.contended_spin_rounds);
  }
  if (idle_rounds < spin) return Step::kSpin;
  // A relaxed read: a hint. A reply that comes meanwhile is found by the next round, at most one
  // nap later.
  if (in_flight.load(std::memory_order_relaxed) > 0) {
    // Replies can arrive at any moment and nothing will wake the thread for them: poll, but give
    // the core away in between (the agent's pollers may share it). A switch that the yield makes
    // is time another thread wanted this core, and counts as lost at the next look.
    if (idle_rounds < o.spin_rounds * 2) return Step::kYield;
    last_look_.reset();  // a sleep is not time lost to another thread
    return Step::kNap;
  }
  last_look_.reset();
  return Step::kSleep;
}

bool IdlePolicy::lost_core_since_last_look() {
  timespec cpu_now{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_now) != 0) return false;
  const ClockReading now{Clock::now(), std::chrono::seconds(cpu_now.tv_sec) +
                                           std::chrono::nanoseconds(cpu_now.tv_nsec)};
  const std::optional<ClockReading> last = std::exchange(last_look_, now);
  if (!last) return false;
  // Wall time in which this thread was runnable but not running: no sleep lies between two
  // looks (every sleep drops the last one), so the difference is time other threads had the
  // core.
  const auto wall = now.wall - last->wall;
  const auto lost = wall - (now.cpu - last->cpu);
  return lost >= options_.contended_lost_min && lost * tunables::kContendedLostShare >= wall;
}

}  // namespace caracal::server
