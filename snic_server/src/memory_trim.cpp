#include "memory_trim.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <chrono>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "tunables.hpp"

namespace caracal::server {

MemoryTrim::MemoryTrim(boost::asio::io_context& io, Registry& metrics)
    : timer_(io),
      trims_(metrics.counter("caracal_memory_trims_total",
                             "Times the server gave free heap memory back to the kernel after "
                             "a burst of closed connections")) {}

void MemoryTrim::start() {
  wait();
}

void MemoryTrim::stop() {
  // The timer belongs to its io_context's thread: cancel it there.
  boost::asio::post(timer_.get_executor(), [this] {
    stopped_ = true;
    timer_.cancel();
  });
}

void MemoryTrim::wait() {
  timer_.expires_after(tunables::kTrimPeriod);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    look();
    wait();
  });
}

void MemoryTrim::look() {
  const uint64_t closed = closed_.load(std::memory_order_relaxed);  // a count: no ordering
  const uint64_t since = closed - closed_at_last_trim_;
  if (since < tunables::kTrimAfterCloses) return;
  closed_at_last_trim_ = closed;
#ifdef __GLIBC__
  const auto start = std::chrono::steady_clock::now();
  const int released = malloc_trim(0);
  trims_.inc();
  spdlog::debug("memory: {} connection(s) closed since the last trim; malloc_trim {} in {} us",
                since, released ? "released memory" : "found nothing",
                std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::steady_clock::now() - start)
                    .count());
#endif
}

}  // namespace caracal::server
