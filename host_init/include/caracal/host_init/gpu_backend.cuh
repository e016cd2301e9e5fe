// The GPU backend of an agent: included by accelerator.hpp when the handler source is compiled
// by nvcc. It registers each region's shm mapping with CUDA as mapped memory (the `shm`
// transport's placement: the server writes it from its own process, the kernel polls it in
// place) and runs the handler's persistent kernel on it (accel/gpu/accelerator.cuh).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "caracal/accel/gpu/accelerator.cuh"
#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/host_init/accelerator.hpp"

namespace caracal::host {

template <accel::Handler H>
class GpuServing final : public ServingAccelerator {
 public:
  static StartResult start(std::byte* region, uint64_t bytes, uint32_t device,
                           const accel::GpuOptions& options, const H& handler) {
    if (Status s = accel::gpu::use_device(static_cast<int>(device)); !s.ok()) return s;
    std::unique_ptr<GpuServing> serving(new GpuServing);
    Result<accel::gpu::MappedHostRange> range =
        accel::gpu::MappedHostRange::register_range(region, bytes);
    if (!range.ok()) return range.status();
    serving->range_ = std::move(range).value();
    serving->accelerator_.emplace(
        accel::gpu::GpuRegion{serving->range_.device(), serving->range_.host()}, handler, options,
        static_cast<int>(device));
    if (Status s = serving->accelerator_->start(); !s.ok()) return s;
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

 private:
  GpuServing() = default;
  // Declared before the accelerator: destroyed after it, so the region stays registered until
  // the kernel is gone.
  accel::gpu::MappedHostRange range_;
  std::optional<accel::gpu::GpuAccelerator<H>> accelerator_;
};

// What the agent logs about its GPU before it serves: the device, and the processes that would
// time-slice against the persistent kernels.
inline Result<std::string> prepare_gpu(uint32_t device, std::vector<std::string>& warnings) {
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
  return info->str();
}

template <accel::Handler H>
GpuBackend make_gpu_backend(H handler) {
  GpuBackend b;
  b.device_count = [] { return accel::gpu::device_count(); };
  b.prepare = [](uint32_t device, std::vector<std::string>& warnings) {
    return prepare_gpu(device, warnings);
  };
  b.start = [handler](std::byte* region, uint64_t bytes, uint32_t device,
                      const accel::GpuOptions& options) {
    return GpuServing<H>::start(region, bytes, device, options, handler);
  };
  return b;
}

}  // namespace caracal::host
