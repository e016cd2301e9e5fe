// Outlier ejection (after Envoy's outlier detection, reduced to one signal: consecutive reply
// timeouts). An agent whose requests on one of its queues time out `after_timeouts` times in a
// row (ServiceConfig::reply_timeout_ms) leaves its service's dispatch for a while, so that the
// service's other agents take its share instead of every client waiting out the bound on it. It
// returns when the period ends, or earlier when it answers a request in time.
//
// This file is the policy alone, one agent's state in one service, with no locks and no clock of
// its own: Service (dispatch.hpp) keeps one per region, under its membership lock, and decides
// what the rule below leaves to it (never ejecting the last agent it dispatches to).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>

#include "config.hpp"

namespace caracal::server {

struct EjectionPolicy {
  uint32_t after_timeouts = 3;  // timeouts in a row on one queue; 0: never eject
  std::chrono::milliseconds period{5000};
  std::chrono::milliseconds max_period{60000};

  static EjectionPolicy of(const ServiceConfig& c) {
    return EjectionPolicy{c.eject_after_timeouts, std::chrono::milliseconds(c.eject_ms),
                          std::chrono::milliseconds(std::max(c.eject_max_ms, c.eject_ms))};
  }
  // Whether `in_a_row` timeouts call for an ejection.
  bool due(uint32_t in_a_row) const { return after_timeouts != 0 && in_a_row >= after_timeouts; }
};

// One agent's region in one service.
class Ejection {
 public:
  using Clock = std::chrono::steady_clock;

  bool ejected() const { return ejected_; }
  // The end of the current ejection (meaningful while ejected()).
  Clock::time_point until() const { return until_; }
  // Ejections in a row: 1 for a first one, n when each of the last n came within one period
  // of the agent's return from the one before.
  uint32_t streak() const { return streak_; }

  // Ejects the agent at `now` and returns for how long. The period is policy.period, doubled
  // for each ejection of the streak (an ejection that comes within the last period of the
  // agent's return from the previous one), and at most policy.max_period. An agent that stayed
  // in dispatch for a whole period since it returned starts again from policy.period.
  std::chrono::milliseconds eject(Clock::time_point now, const EjectionPolicy& policy) {
    const bool repeat = returned_ && now - *returned_ < last_period_;
    streak_ = repeat ? streak_ + 1 : 1;
    last_period_ = repeat ? std::min(last_period_ * 2, policy.max_period)
                          : std::min(policy.period, policy.max_period);
    ejected_ = true;
    until_ = now + last_period_;
    return last_period_;
  }

  // Back in dispatch at `now` (the period ended, or the agent answered in time).
  void readmit(Clock::time_point now) {
    ejected_ = false;
    returned_ = now;
  }

 private:
  bool ejected_ = false;
  Clock::time_point until_{};
  std::chrono::milliseconds last_period_{0};
  std::optional<Clock::time_point> returned_;  // when it last came back
  uint32_t streak_ = 0;
};

}  // namespace caracal::server
