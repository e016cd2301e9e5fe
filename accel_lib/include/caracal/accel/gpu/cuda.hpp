// Host-side CUDA pieces of the GPU accelerator, usable from plain C++ (they need the CUDA
// runtime headers, not nvcc): device discovery, owned device and pinned memory, streams, host
// memory registered as mapped memory (the `shm` transport's region), regions in device memory
// (the `rdma` transport's region, with the dma-buf export that RDMA registration takes), the
// device attributes that transport relies on, and the other processes that hold a context on a
// GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "caracal/core/status.hpp"
#include "caracal/mqueue/layout.hpp"

namespace caracal::accel::gpu {

// "WHAT: cudaErrorName: description" as kUnavailable (kOk for cudaSuccess).
Status cuda_status(cudaError_t error, const std::string& what);

// Devices this process can use (0 when there is no driver or no device; never an error).
int device_count();

struct DeviceInfo {
  int index = 0;
  std::string name;
  std::string pci_bus_id;  // "0000:00:06.0"
  int multiprocessors = 0;
  int compute_major = 0;
  int compute_minor = 0;
  bool unified_addressing = false;  // mapped host memory has the same address on the device
  std::string str() const;          // "gpu:0 (NVIDIA H200, sm_90, 132 SMs, 0000:00:06.0)"
};
Result<DeviceInfo> describe_device(int device);

// Makes `device` current for the calling thread, with a clear error for a bad index.
Status use_device(int device);

// Holds one CUDA resource, described by `Handle` (plain data, equal to Handle{} when there is
// none), and frees it with Free on destruction or reset; a move leaves the source empty. The
// owners below keep their resource in one, so their moves are the defaults.
template <class Handle, class Free>
class CudaOwned {
 public:
  CudaOwned() = default;
  explicit CudaOwned(Handle handle) : handle_(handle) {}
  CudaOwned(CudaOwned&& o) noexcept : handle_(std::exchange(o.handle_, Handle{})) {}
  CudaOwned& operator=(CudaOwned&& o) noexcept {
    if (this != &o) {
      reset();
      handle_ = std::exchange(o.handle_, Handle{});
    }
    return *this;
  }
  CudaOwned(const CudaOwned&) = delete;
  CudaOwned& operator=(const CudaOwned&) = delete;
  ~CudaOwned() { reset(); }

  const Handle& get() const { return handle_; }
  // For the owner to complete the handle once the resource is held (a mapping's device alias).
  Handle& get() { return handle_; }
  void reset() {
    if (!(handle_ == Handle{})) Free{}(handle_);
    handle_ = Handle{};
  }
  // Forgets the resource without freeing it.
  void leak() { handle_ = Handle{}; }

 private:
  Handle handle_{};
};

// Host memory and its alias in the device's address space.
struct HostMapping {
  std::byte* host = nullptr;
  std::byte* device = nullptr;
  uint64_t size = 0;
  bool operator==(const HostMapping&) const = default;
};
struct DeviceAllocation {
  std::byte* data = nullptr;
  uint64_t size = 0;
  bool operator==(const DeviceAllocation&) const = default;
};
namespace detail {
struct FreeDevice {
  void operator()(const DeviceAllocation& a) const;
};
struct FreeHost {
  void operator()(const HostMapping& m) const;
};
struct UnregisterHost {
  void operator()(const HostMapping& m) const;
};
struct DestroyStream {
  void operator()(cudaStream_t s) const;
};
}  // namespace detail

// Zero-filled device memory, freed on destruction.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(uint64_t bytes, const std::string& what);
  std::byte* data() const { return owned_.get().data; }
  uint64_t size() const { return owned_.get().size; }
  void reset() { owned_.reset(); }
  // Forgets the memory without freeing it (a kernel that did not return may still use it).
  void leak() { owned_.leak(); }

 private:
  CudaOwned<DeviceAllocation, detail::FreeDevice> owned_;
};

// Pinned host memory mapped into the device's address space: the host reads what kernels write
// there without a copy. Zero-filled; freed on destruction.
class MappedBuffer {
 public:
  static Result<MappedBuffer> allocate(uint64_t bytes, const std::string& what);
  std::byte* host() const { return owned_.get().host; }
  std::byte* device() const { return owned_.get().device; }
  uint64_t size() const { return owned_.get().size; }
  void reset() { owned_.reset(); }

 private:
  CudaOwned<HostMapping, detail::FreeHost> owned_;
};

// Host memory someone else allocated (a shm mapping) registered with CUDA as mapped memory, so
// kernels read and write it in place. Unregistered on destruction, which must come before the
// memory is unmapped.
class MappedHostRange {
 public:
  // `host` and `bytes` must be page-aligned (a shm mapping is).
  static Result<MappedHostRange> register_range(std::byte* host, uint64_t bytes);
  std::byte* host() const { return owned_.get().host; }
  std::byte* device() const { return owned_.get().device; }
  uint64_t size() const { return owned_.get().size; }
  void reset() { owned_.reset(); }
  // Forgets the range without unregistering it: for a kernel that may still use it, which only
  // the end of the process stops.
  void leak() { owned_.leak(); }

 private:
  CudaOwned<HostMapping, detail::UnregisterHost> owned_;
};

// A non-blocking stream: work on it never waits for, nor holds up, the legacy default stream,
// so a persistent kernel on one such stream and copies on another run side by side.
class Stream {
 public:
  static Result<Stream> create(const std::string& what);
  cudaStream_t get() const { return owned_.get(); }
  void reset() { owned_.reset(); }

 private:
  CudaOwned<cudaStream_t, detail::DestroyStream> owned_;
};

// Waits until everything queued on `stream` has finished (OK), the work fails (the error), or
// `timeout` passes (kUnavailable and *timed_out set; nothing cancelled: a kernel that ignores its
// stop word keeps running until the process exits, which is what frees the GPU then).
Status wait_stream(cudaStream_t stream, std::chrono::milliseconds timeout, const std::string& what,
                   bool* timed_out = nullptr);

// The attributes the `rdma` transport relies on for a region in device memory: that the NIC
// can write it (GPUDirect RDMA), that it can be exported as a dma-buf for ibv_reg_dmabuf_mr,
// and that the GPU sees remote writes in the order they were made, for its own kernels at least
// (CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER), so that a polled index never overtakes the data.
struct RdmaCapabilities {
  bool gpudirect_rdma = false;
  bool dma_buf = false;
  int writes_ordering = 0;  // CUGPUDirectRDMAWritesOrdering: 0 none, 100 owner, 200 all
  int flush_options = 0;    // CUflushGPUDirectRDMAWritesOptions bits
  std::string str() const;
};
Result<RdmaCapabilities> query_rdma_capabilities(int device);
// OK when a device-memory region on `device` can take RDMA writes with the protocol's ordering;
// otherwise says which attribute is missing and what to do instead.
Status check_rdma_capabilities(const RdmaCapabilities& caps, int device);

// A queue region in device memory: allocated, its header written and control words cleared
// (mqueue::initialize_region on a host image, copied in), exported as a dma-buf on request.
class DeviceRegion {
 public:
  // Validates the geometry. The allocation is rounded up to 2 MiB, the GPU's large page, so
  // that it can be exported and registered whole.
  static Result<DeviceRegion> create(int device, const mqueue::RegionGeometry& geometry,
                                     uint64_t epoch);
  std::byte* device() const { return memory_.data(); }
  uint64_t bytes() const { return header_.region_bytes; }
  uint64_t allocation_bytes() const { return memory_.size(); }
  const mqueue::RegionHeader& header() const { return header_; }
  int device_index() const { return device_; }
  // A dma-buf file descriptor for the whole allocation (the caller owns and closes it), for
  // ibv_reg_dmabuf_mr. Fails with the driver's reason where dma-buf is not supported.
  Result<int> export_dma_buf() const;

 private:
  DeviceBuffer memory_;
  mqueue::RegionHeader header_{};
  int device_ = 0;
};

// A process other than this one that holds a context on the device.
struct GpuProcess {
  unsigned pid = 0;
  std::string name;          // from /proc/PID/comm where visible
  uint64_t used_memory = 0;  // bytes, as the driver reports (0 when hidden)
};
// The processes (this one excluded) with a compute context on `device`: a persistent handler
// time-slices against every one of them, so the agent warns about them. kUnavailable when this
// build or this driver cannot tell.
Result<std::vector<GpuProcess>> other_gpu_processes(int device);

}  // namespace caracal::accel::gpu
