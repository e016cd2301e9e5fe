// A small index per thread, for data that many threads update: counters and free lists keep one
// cell per shard, each on its own cache line, and a thread touches the cell of its shard, so
// threads that run at once (I/O threads, engine threads) do not pass one line between their
// cores on every request.
#pragma once

#include <atomic>
#include <cstdint>

#include "tunables.hpp"

namespace caracal::server {

// Cells a sharded structure keeps; threads beyond this many share cells (still correct, only
// no longer free of sharing).
using tunables::kThreadShards;

// This thread's shard in [0, kThreadShards): threads get 0, 1, 2, ... in the order they first
// ask, so the first kThreadShards threads (a server's I/O and engine threads) each have one of
// their own. Stable for the thread's life.
inline uint32_t thread_shard() {
  static std::atomic<uint32_t> next{0};
  // A counter only: the index publishes nothing.
  thread_local const uint32_t shard = next.fetch_add(1, std::memory_order_relaxed) % kThreadShards;
  return shard;
}

}  // namespace caracal::server
