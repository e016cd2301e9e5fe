// The report of the engine profile (profile.hpp): built with CARACAL_ENGINE_PROFILE only.
#include "profile.hpp"

#ifdef CARACAL_ENGINE_PROFILE
#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <cstdio>

namespace caracal::server {

namespace engine_profile {
namespace {

constexpr const char* kStageNames[kStageCount] = {
    "round",      "serve",        "inbox_take", "rx_write", "rx_copy", "request_free",
    "rx_reserve", "rx_commit",    "rx_publish", "tx_fetch", "tx_next", "route",
    "deliver",    "answer_other", "tx_release", "flush",    "idle"};

thread_local std::chrono::steady_clock::time_point started;
thread_local rusage usage_at_start;
thread_local timespec cpu_at_start;

}  // namespace

void thread_begin() {
  totals = Totals{};
  started = std::chrono::steady_clock::now();
  getrusage(RUSAGE_THREAD, &usage_at_start);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_at_start);
}

void thread_end() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  timespec cpu{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double cpu_s = static_cast<double>(cpu.tv_sec - cpu_at_start.tv_sec) +
                       static_cast<double>(cpu.tv_nsec - cpu_at_start.tv_nsec) * 1e-9;
  const double user_s =
      static_cast<double>(u.ru_utime.tv_sec - usage_at_start.ru_utime.tv_sec) +
      static_cast<double>(u.ru_utime.tv_usec - usage_at_start.ru_utime.tv_usec) * 1e-6;
  const double sys_s =
      static_cast<double>(u.ru_stime.tv_sec - usage_at_start.ru_stime.tv_sec) +
      static_cast<double>(u.ru_stime.tv_usec - usage_at_start.ru_stime.tv_usec) * 1e-6;
  std::fprintf(stderr,
               "engine profile: wall %.3f s, thread cpu %.3f s (user %.3f, sys %.3f), minor "
               "faults %ld, major %ld, voluntary switches %ld, involuntary %ld\n",
               wall_s, cpu_s, user_s, sys_s, u.ru_minflt - usage_at_start.ru_minflt,
               u.ru_majflt - usage_at_start.ru_majflt, u.ru_nvcsw - usage_at_start.ru_nvcsw,
               u.ru_nivcsw - usage_at_start.ru_nivcsw);
  for (uint32_t i = 0; i < kStageCount; ++i) {
    if (totals.count[i] == 0) continue;
    std::fprintf(stderr, "engine profile: %-13s %10.3f ms %10llu x %9.1f ns\n", kStageNames[i],
                 static_cast<double>(totals.ns[i]) * 1e-6,
                 static_cast<unsigned long long>(totals.count[i]),
                 static_cast<double>(totals.ns[i]) / static_cast<double>(totals.count[i]));
  }
}

}  // namespace engine_profile

}  // namespace caracal::server
#endif
