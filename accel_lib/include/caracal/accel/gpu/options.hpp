// Settings and counters of the GPU accelerator that host code reads without CUDA headers: the
// agent's configuration holds GpuOptions, and its logs report WorkerCounters.
#pragma once

#include <cstdint>

namespace caracal::accel {

struct GpuOptions {
  // Workers (a thread, a warp or a block each, as the handler's granularity says). Worker w
  // owns server queues q with q % workers == w and client queues c with c % workers == w.
  // 0: one per server queue, but no more than the region's client queues when it has any (so
  // every worker can call out). More workers than server queues are not started.
  uint32_t workers = 0;
  // Threads per block: the block of a block-granular handler (unless it declares
  // kBlockThreads), and how many thread- or warp-granular workers share a block.
  uint32_t block_threads = 128;
  // Requests taken from one queue before publishing and moving to the next queue.
  uint32_t burst = 32;
  // Empty polling rounds at full speed before an idle worker starts to sleep between polls
  // (__nanosleep, doubling up to idle_sleep_max_ns), so that an idle service does not keep
  // reading across PCIe.
  uint32_t busy_polls = 2048;
  uint32_t idle_sleep_max_ns = 4096;
  // How long stop() waits for the kernel to notice the stop word before it reports failure.
  uint32_t stop_timeout_ms = 5000;
};

// What one worker has done so far. Each sits on its own cache line in host memory that the GPU
// writes (one writer: the worker's leader, with relaxed system-scope stores) and the host reads
// (relaxed): the numbers are for reporting, nothing is published through them.
struct alignas(64) WorkerCounters {
  uint64_t requests = 0;
  uint64_t handler_errors = 0;   // responses that claimed more bytes than their buffer holds
  uint64_t reply_ring_full = 0;  // times a burst stopped on a full TX ring
  uint64_t corrupt_entries = 0;  // RX entries that failed validation (that queue stopped)
  uint64_t stale_replies = 0;    // client replies for no open call (overlapped handlers)
};
static_assert(sizeof(WorkerCounters) == 64);

}  // namespace caracal::accel
