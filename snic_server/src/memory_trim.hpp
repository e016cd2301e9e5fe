// Gives the heap memory of closed connections back to the kernel.
//
// The server keeps freed memory in its arenas (tunables::kMallocTrimThreshold, set in main.cpp):
// requests and replies are allocated by one thread and freed by another at high rates, and
// handing pages back and faulting them in again would cost the engine a large share of its time
// (bench/results/EXPERIMENTS.md, engine-16k-h200). The same setting keeps everything that
// thousands of closed connections held (bench/results/conn-memory). So connections
// report their closes here, and every tunables::kTrimPeriod, if at least
// tunables::kTrimAfterCloses closed since the last look, malloc_trim() releases the free pages of
// every arena. Steady traffic with few closes never trims.
//
// Runs on one io_context (the server's first); note_closed() may be called from any thread.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>

#include "metrics/metrics.hpp"

namespace caracal::server {

class MemoryTrim {
 public:
  MemoryTrim(boost::asio::io_context& io, Registry& metrics);

  // Starts the periodic look; call before the io_context runs. stop() ends it from any thread
  // (on the io_context's thread, if it still runs); the object must outlive the io_context's
  // handlers, or their destruction without running (the server destroys it before its
  // contexts, which it has stopped and joined).
  void start();
  void stop();

  // Any thread: a connection closed and freed its buffers.
  void note_closed() {
    closed_.fetch_add(1, std::memory_order_relaxed);  // a count, read by look(): no ordering
  }

 private:
  void wait();
  void look();

  boost::asio::steady_timer timer_;
  std::atomic<uint64_t> closed_{0};
  uint64_t closed_at_last_trim_ = 0;  // the io_context's thread only, as is what follows
  bool stopped_ = false;
  Counter& trims_;
};

}  // namespace caracal::server
