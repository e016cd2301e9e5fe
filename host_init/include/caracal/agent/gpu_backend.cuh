// The GPU backend of an agent: included by accelerator.hpp when the handler source is compiled
// by nvcc. It registers each region's shm mapping with CUDA as mapped memory (the `shm`
// transport's placement: the server writes it from its own process, the kernel polls it in
// place) and runs the handler's persistent kernel on it (caracal/accel/gpu/accelerator.cuh); with
// transport rdma and region_memory gpu it creates the region in device memory instead and runs
// the kernel there (GpuDeviceServing).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "caracal/accel/gpu/accelerator.cuh"
#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/agent/accelerator.hpp"

namespace caracal::agent {

// A kernel's handler errors: a GPU handler cannot throw, so each is a response that claimed
// more bytes than its buffer holds (the client got an error reply saying so).
template <accel::Handler H>
ServingAccelerator::HandlerErrors gpu_handler_errors(
    const std::optional<accel::gpu::GpuAccelerator<H>>& accelerator) {
  ServingAccelerator::HandlerErrors e;
  if (!accelerator) return e;
  for (uint32_t w = 0; w < accelerator->workers(); ++w)
    e.count += accelerator->counters(w).handler_errors;
  if (e.count != 0) e.last = "a response claimed more bytes than its buffer holds";
  return e;
}

template <accel::Handler H>
class GpuServing final : public ServingAccelerator {
 public:
  static StartResult start(std::byte* region, uint64_t bytes, uint32_t device,
                           const accel::GpuOptions& options, const H& handler) {
    CARACAL_RETURN_IF_ERROR(accel::gpu::use_device(static_cast<int>(device)));
    std::unique_ptr<GpuServing> serving(new GpuServing);
    Result<accel::gpu::MappedHostRange> range =
        accel::gpu::MappedHostRange::register_range(region, bytes);
    if (!range.ok()) return range.status();
    serving->range_ = std::move(range).value();
    serving->accelerator_.emplace(
        accel::gpu::GpuRegion{serving->range_.device(), serving->range_.host()}, handler, options,
        static_cast<int>(device));
    CARACAL_RETURN_IF_ERROR(serving->accelerator_->start());
    return std::unique_ptr<ServingAccelerator>(std::move(serving));
  }

  ~GpuServing() override { (void)stop(); }

  Status stop() override {
    if (!accelerator_ || !accelerator_->running()) return Status::ok_status();
    Status s = accelerator_->stop();
    // A kernel that did not return may still touch the region: keep it registered (and the
    // kernel's memory allocated) until the process exits, which ends the kernel.
    if (!s.ok()) range_.leak();
    return s;
  }
  Status health() override { return accelerator_ ? accelerator_->health() : Status::ok_status(); }
  std::string describe() const override { return accelerator_ ? accelerator_->summary() : "gpu"; }
  HandlerErrors handler_errors() const override { return gpu_handler_errors(accelerator_); }

 private:
  GpuServing() = default;
  // Declared before the accelerator: destroyed after it, so the region stays registered until
  // the kernel is gone.
  accel::gpu::MappedHostRange range_;
  std::optional<accel::gpu::GpuAccelerator<H>> accelerator_;
};

// The GPU backend on a region in the GPU's own memory (transport rdma with region_memory gpu:
// the Lynx placement). The region is an accel::gpu::DeviceRegion that this object owns; the
// kernel polls it locally, and the SmartNIC writes and reads it with one-sided RDMA through the
// registration the agent makes (export_dma_buf). Nothing is registered with CUDA.
//
// Ordering against a NIC instead of a CPU. The kernel's code is the one that serves host
// memory (caracal/accel/gpu/accelerator.cuh); what changes is who provides each side's guarantee.
//  - RX: the SmartNIC WRITEs the slots, then the tail in a WRITE of its own on the same RC queue
//    pair, which the NIC places in that order (mqueue/rdma.hpp). That the kernel's system-scope
//    acquire of the tail (RingConsumer::refresh_tail) then sees the slot bytes is not the NIC's
//    doing but the GPU's: its GPUDirect RDMA write-ordering attribute (owner or all devices)
//    says that remote writes become visible to its own kernels in the order they arrived.
//    check_rdma_capabilities requires it (check_rdma_memory below) before the agent creates a
//    region here; on a device without it a tail could overtake its data, so the placement is
//    refused there.
//  - TX: a burst ends with one system-scope release fence (mqueue::fence_release:
//    cuda::atomic_thread_fence(release, thread_scope_system), a fence.acq_rel.sys, the ordering
//    __threadfence_system() gives these stores) and then relaxed stores of the TX tail and the RX
//    head (publish_after_fence). The fence orders the slot writes before the tail store at
//    system scope, which a PCIe read by the NIC is part of; the SmartNIC READs the tail, and
//    READs the slots only once that READ has completed, so it reads them whole. The stop word
//    goes in by a copy from this process (the accelerator has no host alias of the region).
template <accel::Handler H>
class GpuDeviceServing final : public DeviceRegionServing {
 public:
  static Result<std::unique_ptr<DeviceRegionServing>> start(const mqueue::RegionGeometry& geometry,
                                                            uint64_t epoch, uint32_t device,
                                                            const accel::GpuOptions& options,
                                                            const H& handler) {
    Result<accel::gpu::DeviceRegion> region =
        accel::gpu::DeviceRegion::create(static_cast<int>(device), geometry, epoch);
    if (!region.ok()) return region.status();
    std::unique_ptr<GpuDeviceServing> serving(new GpuDeviceServing);
    serving->region_ = std::make_unique<accel::gpu::DeviceRegion>(std::move(region).value());
    serving->accelerator_.emplace(accel::gpu::GpuRegion{serving->region_->device(), nullptr},
                                  handler, options, static_cast<int>(device));
    CARACAL_RETURN_IF_ERROR(serving->accelerator_->start());
    return std::unique_ptr<DeviceRegionServing>(std::move(serving));
  }

  ~GpuDeviceServing() override {
    (void)stop();
    // A kernel that did not return may still poll the region: it stays allocated until the
    // process exits, which ends the kernel (cudaFree would wait for the kernel, too).
    if (leaked_) (void)region_.release();
  }

  Status stop() override {
    if (!accelerator_ || !accelerator_->running()) return Status::ok_status();
    Status s = accelerator_->stop();
    if (!s.ok()) leaked_ = true;
    return s;
  }
  Status health() override { return accelerator_ ? accelerator_->health() : Status::ok_status(); }
  std::string describe() const override {
    return (accelerator_ ? accelerator_->summary() : std::string("gpu")) +
           " on a region in device memory";
  }
  HandlerErrors handler_errors() const override { return gpu_handler_errors(accelerator_); }
  std::byte* region() const override { return region_->device(); }
  const mqueue::RegionHeader& header() const override { return region_->header(); }
  Result<int> export_dma_buf() const override { return region_->export_dma_buf(); }

 private:
  GpuDeviceServing() = default;
  // Declared before the accelerator: destroyed after it, so the region stays allocated until
  // the kernel is gone.
  std::unique_ptr<accel::gpu::DeviceRegion> region_;
  std::optional<accel::gpu::GpuAccelerator<H>> accelerator_;
  bool leaked_ = false;  // stop() failed: the kernel may still run
};

// Whether a NIC can write a region in `device`'s memory with the protocol's ordering: the
// capabilities for the log, or the error of check_rdma_capabilities (naming the device and the
// attribute it lacks).
inline Result<std::string> check_rdma_memory(uint32_t device) {
  Result<accel::gpu::RdmaCapabilities> caps =
      accel::gpu::query_rdma_capabilities(static_cast<int>(device));
  if (!caps.ok()) return caps.status();
  CARACAL_RETURN_IF_ERROR(accel::gpu::check_rdma_capabilities(*caps, static_cast<int>(device)));
  return caps->str();
}

// What the agent logs about its GPU before it serves: the device, and the processes that would
// time-slice against the persistent kernels.
inline Result<GpuBackend::Prepared> prepare_gpu(uint32_t device,
                                                std::vector<std::string>& warnings) {
  Result<accel::gpu::DeviceInfo> info = accel::gpu::describe_device(static_cast<int>(device));
  if (!info.ok()) return info.status();
  Result<std::vector<accel::gpu::GpuProcess>> others =
      accel::gpu::other_gpu_processes(static_cast<int>(device));
  if (!others.ok()) {
    warnings.push_back("cannot tell whether other processes use " + info->str() + ": " +
                       others.status().message());
  } else if (!others->empty()) {
    std::string list;
    for (const accel::gpu::GpuProcess& p : *others) {
      if (!list.empty()) list += ", ";
      list += std::to_string(p.pid) + " (" + p.name + ")";
    }
    warnings.push_back(std::to_string(others->size()) + " other process(es) hold a context on " +
                       info->str() + ": " + list +
                       ". Persistent handlers time-slice against every other context on their "
                       "GPU (milliseconds per request); dedicate the GPU to this agent or share "
                       "it through MPS");
  }
  return GpuBackend::Prepared{info->str(), static_cast<uint32_t>(info->multiprocessors)};
}

// Device memory of `device` for a handler's state (AcceleratorMemory): cudaMalloc'd and zeroed
// by DeviceBuffer, copied with cudaMemcpyDefault (unified addressing tells the direction).
inline AcceleratorMemory gpu_memory(uint32_t device) {
  AcceleratorMemory m;
  m.allocate = [device](uint64_t bytes,
                        const std::string& what) -> Result<std::shared_ptr<std::byte>> {
    CARACAL_RETURN_IF_ERROR(accel::gpu::use_device(static_cast<int>(device)));
    Result<accel::gpu::DeviceBuffer> buffer = accel::gpu::DeviceBuffer::allocate(bytes, what);
    if (!buffer.ok()) return buffer.status();
    auto owner = std::make_shared<accel::gpu::DeviceBuffer>(std::move(buffer).value());
    return std::shared_ptr<std::byte>(owner, owner->data());
  };
  m.copy = [device](void* to, const void* from, uint64_t bytes) -> Status {
    CARACAL_RETURN_IF_ERROR(accel::gpu::use_device(static_cast<int>(device)));
    return accel::gpu::cuda_status(cudaMemcpy(to, from, bytes, cudaMemcpyDefault), "cudaMemcpy");
  };
  return m;
}

// What a GPU backend has without a handler: the device checks and the memory. A handler with
// state starts its kernels through each service's ServiceHandler (setup.hpp).
inline GpuBackend make_gpu_probe() {
  GpuBackend b;
  b.device_count = [] { return accel::gpu::device_count(); };
  b.prepare = [](uint32_t device, std::vector<std::string>& warnings) {
    return prepare_gpu(device, warnings);
  };
  b.check_rdma_memory = [](uint32_t device) { return check_rdma_memory(device); };
  b.memory = [](uint32_t device) { return gpu_memory(device); };
  return b;
}

template <accel::Handler H>
GpuBackend make_gpu_backend(H handler) {
  GpuBackend b = make_gpu_probe();
  b.start = [handler](std::byte* region, uint64_t bytes, uint32_t device,
                      const accel::GpuOptions& options) {
    return GpuServing<H>::start(region, bytes, device, options, handler);
  };
  b.start_in_device_memory = [handler](const mqueue::RegionGeometry& geometry, uint64_t epoch,
                                       uint32_t device, const accel::GpuOptions& options) {
    return GpuDeviceServing<H>::start(geometry, epoch, device, options, handler);
  };
  return b;
}

}  // namespace caracal::agent
