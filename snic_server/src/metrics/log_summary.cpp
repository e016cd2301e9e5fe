#include "metrics/log_summary.hpp"

#include <fmt/format.h>

namespace caracal::server {

RepeatSummarySink::RepeatSummarySink(uint32_t burst, std::chrono::milliseconds window)
    : burst_(burst), window_(window) {}

void RepeatSummarySink::sink_it_(const spdlog::details::log_msg& msg) {
  if (msg.level < spdlog::level::warn || msg.source.empty()) {
    dist_sink::sink_it_(msg);
    return;
  }
  Place& p = places_[{msg.source.filename, msg.source.line}];
  if (msg.time - p.window_start >= window_) {
    summarise_locked(p, msg.time);
    p.window_start = msg.time;
    p.passed = 0;
  }
  if (p.passed < burst_) {
    ++p.passed;
    dist_sink::sink_it_(msg);
    return;
  }
  ++p.suppressed;
  suppressed_total_.fetch_add(1, std::memory_order_relaxed);
  p.level = msg.level;
  p.logger_name.assign(msg.logger_name.data(), msg.logger_name.size());
  p.last.assign(msg.payload.data(), msg.payload.size());
}

void RepeatSummarySink::summarise_locked(Place& p, spdlog::log_clock::time_point now) {
  if (p.suppressed == 0) return;
  const double seconds = std::chrono::duration<double>(now - p.window_start).count();
  const std::string text = fmt::format("{} more like this in the last {:.1f} s; the last: {}",
                                       p.suppressed, seconds, p.last);
  spdlog::details::log_msg summary(p.logger_name, p.level, text);
  dist_sink::sink_it_(summary);
  p.suppressed = 0;
}

void RepeatSummarySink::flush_() {
  const auto now = spdlog::log_clock::now();
  for (auto& [where, p] : places_) {
    if (p.suppressed != 0 && now - p.window_start >= window_) {
      summarise_locked(p, now);
      // A new window starts with the next line from this place.
      p.window_start = {};
    }
  }
  dist_sink::flush_();
}

void RepeatSummarySink::summarise_now() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = spdlog::log_clock::now();
  for (auto& [where, p] : places_)
    summarise_locked(p, now);
  dist_sink::flush_();
}

}  // namespace caracal::server
