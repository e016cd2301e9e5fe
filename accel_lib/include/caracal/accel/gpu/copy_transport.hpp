// A Transport (mqueue/transport.hpp) that reaches a region in device memory with the GPU's copy
// engines, from a non-blocking stream of this process. Writes and reads land in device memory
// as DMA while the persistent kernel runs, the way a NIC's RDMA WRITEs and READs arrive: it is
// how the GPU tests and benchmarks prove the device-memory placement of the `rdma` transport on
// a machine without an RDMA NIC.
//
// Like an RC queue pair, operations execute in the order they were posted (one stream). The
// staging image is pinned host memory, read by a write when the copy engine gets to it (not
// when it is posted), which is the RDMA contract too: the ring code never rewrites staged bytes
// before the write that carries them has completed. Index words are the exception, since a
// ring publishes its tail again while the previous publish may still be queued: each
// publish_index carries its value in a cell of its own, captured when it is posted (an RDMA
// transport sends them inline for the same reason).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "caracal/core/status.hpp"
#include "caracal/mqueue/transport.hpp"

namespace caracal::accel::gpu {

class CopyEngineTransport {
 public:
  // `device_base` is a region of `bytes` in device memory (the current device's).
  static Result<CopyEngineTransport> create(std::byte* device_base, uint64_t bytes);

  CopyEngineTransport() = default;
  CopyEngineTransport(CopyEngineTransport&& o) noexcept { *this = std::move(o); }
  CopyEngineTransport& operator=(CopyEngineTransport&& o) noexcept;
  CopyEngineTransport(const CopyEngineTransport&) = delete;
  CopyEngineTransport& operator=(const CopyEngineTransport&) = delete;
  ~CopyEngineTransport();

  std::byte* staging(uint64_t offset) { return staging_ + offset; }
  uint64_t post_write(uint64_t offset, uint32_t length);
  uint64_t post_read(uint64_t offset, uint32_t length);
  uint64_t publish_index(uint64_t offset, uint32_t value);
  uint32_t load_index(uint64_t offset) {
    uint32_t v;
    std::memcpy(&v, staging_ + offset, sizeof(v));
    return v;
  }
  Status progress();
  uint64_t completed() const { return completed_; }
  uint64_t region_bytes() const { return bytes_; }
  const char* name() const { return "copy-engine"; }
  // The first failure of a copy, sticky (progress() returns it too).
  const Status& error() const { return error_; }

 private:
  static constexpr uint32_t kIndexCells = 1024;

  uint64_t track(const char* what);  // records an event for the op just queued
  void release();

  std::byte* device_ = nullptr;
  uint64_t bytes_ = 0;
  std::byte* staging_ = nullptr;       // pinned host image of the region
  uint32_t* cells_ = nullptr;          // pinned, kIndexCells index values in flight
  std::vector<uint64_t> cell_ticket_;  // the publish each cell last carried
  uint32_t next_cell_ = 0;
  cudaStream_t stream_ = nullptr;
  std::deque<std::pair<uint64_t, cudaEvent_t>> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
  uint64_t posted_ = 0;
  uint64_t completed_ = 0;
  Status error_;
};
static_assert(mqueue::Transport<CopyEngineTransport>);

}  // namespace caracal::accel::gpu
