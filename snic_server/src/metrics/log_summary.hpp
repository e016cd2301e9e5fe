// Repeated log lines summarised: a spdlog sink in front of the real ones that lets through the
// first few warnings and errors from one place in the code in each second and counts the rest,
// then writes one line for them: "N more like this in the last 1.0 s; the last: ...".
//
// A fault under load (an agent killed while thousands of connections wait on it) makes the
// same warning once per connection or request; the counters in /metrics carry those totals,
// and the log stays readable. Lines are told apart by where they were logged (the source
// location that SPDLOG_WARN and SPDLOG_ERROR record), so two different warnings never hide each
// other. Lines below warn, and lines with no source location, always pass.
//
// The summary of a window is written by the next line from the same place after the window
// ends, or by flush(), which spdlog::flush_every() calls from its own thread every
// tunables::kLogFlushPeriod;
// summarise_now() writes every pending summary (at exit).
#pragma once

#include <spdlog/details/log_msg.h>
#include <spdlog/sinks/dist_sink.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "tunables.hpp"

namespace caracal::server {

class RepeatSummarySink : public spdlog::sinks::dist_sink<std::mutex> {
 public:
  // At most `burst` lines from one place in each `window`; the rest are counted and summarised.
  explicit RepeatSummarySink(uint32_t burst = tunables::kLogRepeatBurst,
                             std::chrono::milliseconds window = tunables::kLogRepeatWindow);

  // Writes the summary of every place with suppressed lines, whatever its window.
  void summarise_now();
  // Lines suppressed so far (each one counted in a summary).
  uint64_t suppressed() const { return suppressed_total_.load(std::memory_order_relaxed); }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override;

 private:
  struct Place {
    spdlog::log_clock::time_point window_start;
    uint32_t passed = 0;      // lines let through in this window
    uint64_t suppressed = 0;  // lines counted in this window
    spdlog::level::level_enum level = spdlog::level::warn;
    std::string logger_name;
    std::string last;  // the text of the last suppressed line
  };
  void summarise_locked(Place& p, spdlog::log_clock::time_point now);

  const uint32_t burst_;
  const std::chrono::milliseconds window_;
  // Keyed by (file, line) of the call: __FILE__ is one string per source file.
  std::map<std::pair<const char*, int>, Place> places_;
  std::atomic<uint64_t> suppressed_total_{0};  // written under the sink's lock
};

}  // namespace caracal::server
