// The host side of a GpuAccelerator that does not depend on the handler type: where the
// region is, the launch shape, the residency check, the stop word, what one launch owns, and
// the Runtime that starts, watches and stops a launch. Plain C++, compiled once into
// caracal::accel_gpu (accelerator.cuh has the kernel and the handler-typed rest).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "caracal/accel/client.hpp"
#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/accel/gpu/options.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/core/status.hpp"
#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/ring.hpp"

namespace caracal::accel::gpu {

// Where the GPU finds a region and how this process reaches it.
struct GpuRegion {
  std::byte* device = nullptr;  // the address kernels use (device memory, or the device alias
                                // of mapped host memory)
  std::byte* host = nullptr;    // the same region in this process, or nullptr when it lives
                                // in device memory (then the stop word is written by a copy)
};

namespace detail {

struct LaunchShape {
  uint32_t workers = 0;
  uint32_t blocks = 0;
  uint32_t threads = 0;       // per block
  uint32_t shared_bytes = 0;  // dynamic shared memory per block (the groups' mailboxes)
};

// Workers laid out for the granularity: a block each, or packed block_threads threads to a
// block. options.workers, at most one per server queue; 0 means one per server queue, but no
// more than there are client queues when the region has any, so that every worker can call out.
// `mailbox_bytes` is the size of one group's mailbox in shared memory.
Result<LaunchShape> launch_shape(Granularity g, uint32_t server_queues, uint32_t client_queues,
                                 const GpuOptions& options, uint32_t block_threads,
                                 uint32_t mailbox_bytes);

// OK when every block of `shape` can be resident on `device` at once. A persistent worker whose
// block waits for a free multiprocessor would never run, and its queues would never be served.
Status check_resident(const void* kernel, const LaunchShape& shape, int device,
                      const std::string& what);

// Writes the region's stop word: a release store where this process maps the region, else a
// copy on `stream` (waited for).
Status write_stop_word(const GpuRegion& region, const mqueue::RegionHeader& h, uint32_t value,
                       cudaStream_t stream);

// The region's header, read where this process can reach it.
Result<mqueue::RegionHeader> read_header(const GpuRegion& region);

const char* granularity_name(Granularity g);

// Everything one launch allocated. Freed after the kernel has returned; deliberately leaked if
// it never does (freeing device memory waits for the kernel, which would hang the caller).
struct LaunchResources {
  DeviceBuffer queues;
  DeviceBuffer channels;
  DeviceBuffer batch;
  DeviceBuffer staging;
  DeviceBuffer channel_stopped;  // overlapped handlers: [workers][channels_per_worker]
  MappedBuffer counters;
  Stream stream;   // the persistent kernel's
  Stream control;  // stop-word writes to a device-memory region
};

// A server queue's ring sides, as its worker keeps them in device memory.
struct QueueState {
  mqueue::RingConsumer rx;
  mqueue::RingProducer tx;
  uint32_t stopped;   // a corrupt RX entry stopped this queue
  uint32_t finished;  // overlapped handlers: requests were answered this round
};

// The persistent kernel's one parameter besides the handler.
struct KernelArgs {
  std::byte* region;
  QueueState* queues;       // [server queues], device memory
  ClientChannel* channels;  // [workers][channels_per_worker], device memory
  uint32_t channels_per_worker;
  WorkerCounters* counters;  // [workers], device alias of mapped host memory
  Request* batch_requests;   // [workers][kBatch] (batched handlers)
  std::byte** batch_out;     // [workers][kBatch]
  uint32_t* batch_sizes;     // [workers][kBatch]
  // [workers][kBatch][staging_stride]: batched handlers' replies; with TX lines, the reply of
  // a warp- or block-granular single-request handler (kBatch 1). nullptr: none.
  std::byte* staging;
  uint32_t staging_stride;
  // Overlapped handlers (overlap.hpp): each worker's table of open requests, kept across
  // launches, and its client queues' stopped flags.
  std::byte* overlap_tables;
  uint32_t* channel_stopped;
  uint32_t workers;
  uint32_t burst;
  uint32_t busy_polls;
  uint32_t idle_sleep_max_ns;
  uint32_t max_response;
};

// What a handler type asks of its launches: GpuAccelerator<H> reads it off H.
struct HandlerNeeds {
  Granularity granularity = Granularity::kThread;
  uint32_t block_threads = 0;  // H::kBlockThreads; 0: GpuOptions::block_threads
  uint32_t batch = 1;          // H::kBatch
  // H::kMaxResponseBytes; the region's max_message_bytes caps it.
  uint32_t max_response_bytes = std::numeric_limits<uint32_t>::max();
  uint32_t mailbox_bytes = 0;        // one group's mailbox in shared memory
  uint64_t overlap_table_bytes = 0;  // one worker's open-request table; 0: not overlapped
};

// One GPU accelerator's host side, whatever its handler: the device, the region's header, the
// launch shape, the memory a launch owns, the stop word, health and counters. start() is
// prepare(), the launch (the handler's template), then launched().
class Runtime {
 public:
  Runtime(GpuRegion region, GpuOptions options, int device, HandlerNeeds needs);
  ~Runtime();  // stop()
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Reads the region, lays the workers out, checks that `kernel` can have all of them resident
  // at once, allocates what the launch owns and fills `args`. On failure nothing is left held.
  Status prepare(const void* kernel, KernelArgs& args);
  // `launch`: cudaGetLastError() right after the kernel was launched with shape() on stream().
  Status launched(cudaError_t launch);
  const LaunchShape& shape() const { return shape_; }
  cudaStream_t stream() const;

  // Raises the region's stop word and waits, up to options.stop_timeout_ms, for the kernel to
  // return. A kernel that does not return is reported (and its memory left allocated: freeing
  // it would wait for the kernel); it ends with the process.
  Status stop();
  // OK while the kernel serves (or after a clean stop); otherwise why it is not serving: it
  // failed (a fault in the handler poisons the CUDA context: only a new process recovers), or
  // it returned because someone else raised the stop word.
  Status health();
  bool running() const { return running_; }
  uint32_t workers() const { return shape_.workers; }
  WorkerCounters counters(uint32_t worker) const;
  uint64_t total_requests() const;
  // "gpu:0 kernel: 4 warp-granular workers in 1 block(s) of 128 threads"
  std::string summary() const;

 private:
  WorkerCounters read_counters(uint32_t worker) const;
  void snapshot_counters();

  GpuRegion region_;
  GpuOptions options_;
  int device_;
  HandlerNeeds needs_;
  mqueue::RegionHeader header_{};
  LaunchShape shape_{};
  std::unique_ptr<LaunchResources> resources_;  // the launch's; prepared_ until launched()
  std::unique_ptr<LaunchResources> prepared_;
  DeviceBuffer overlap_tables_;  // overlapped handlers: outlive a launch (see prepare())
  std::vector<WorkerCounters> last_counters_;
  bool running_ = false;
  bool raised_stop_ = false;
  Status failure_;
};

}  // namespace detail
}  // namespace caracal::accel::gpu
