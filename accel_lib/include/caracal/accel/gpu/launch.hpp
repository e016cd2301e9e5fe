// The host side of a GpuAccelerator launch that does not depend on the handler type: where
// the region is, the launch shape, the residency check, the stop word, and what one launch
// owns. Plain C++ (accelerator.cuh has the kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/accel/gpu/options.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/core/status.hpp"
#include "caracal/mqueue/layout.hpp"

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

}  // namespace detail
}  // namespace caracal::accel::gpu
