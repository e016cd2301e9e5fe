// Which accelerator serves an agent's regions, and how the runtime starts a handler on it.
//
// The runtime is written once, without the handler type: for each region it asks the agent's
// HandlerBackends for a ServingAccelerator, which owns whatever runs the handler (host threads
// for the CPU backend, a persistent kernel for the GPU backend) and stops it when asked or
// destroyed. agent_main (agent.hpp) fills the backends from the handler type with
// make_backends<H>(); compiled by nvcc, the handler source also gets the GPU backend.
#pragma once

#include <any>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/gpu/options.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/agent/config.hpp"
#include "caracal/core/status.hpp"
#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"

namespace caracal::agent {

// An accelerator that will run: never kAuto.
struct AcceleratorChoice {
  AcceleratorKind kind = AcceleratorKind::kCpu;
  uint32_t gpu = 0;
  // "cpu" or "gpu:N": what the hello message reports.
  std::string str() const;
};

// A handler running on one region. Destroying it stops it.
class ServingAccelerator {
 public:
  virtual ~ServingAccelerator() = default;
  // Raises the region's stop word and waits until nothing polls the region any more. An error
  // means something may still poll it (a GPU kernel that did not return): the agent must exit.
  virtual Status stop() = 0;
  // OK while it serves; otherwise why it stopped serving on its own (a GPU kernel that failed).
  virtual Status health() { return Status::ok_status(); }
  // What runs, for the log ("2 CPU worker(s)", "gpu:0 kernel: 2 warp-granular worker(s) ...").
  virtual std::string describe() const = 0;

  // Requests the handler failed so far, each answered with an error reply, and one of the
  // latest failures in words: for the agent's log, since the client is told only that the
  // handler failed (accel::kHandlerFailedReply).
  struct HandlerErrors {
    uint64_t count = 0;
    std::string last;
  };
  virtual HandlerErrors handler_errors() const { return {}; }
};

using StartResult = Result<std::unique_ptr<ServingAccelerator>>;

// A persistent kernel serving a region in its GPU's memory (transport rdma with region_memory
// gpu). It owns the region as well: stopping and destroying it are ServingAccelerator's, and a
// kernel that did not return keeps the region allocated until the process exits.
class DeviceRegionServing : public ServingAccelerator {
 public:
  // The region's first byte in device memory: what kernels poll, and the iova that its RDMA
  // registration names (the address the agent announces).
  virtual std::byte* region() const = 0;
  // The header as written (the host cannot read device memory); region_bytes is its size.
  virtual const mqueue::RegionHeader& header() const = 0;
  // A dma-buf fd for the region's allocation, for ibv_reg_dmabuf_mr at offset 0; the caller
  // closes it. Fails with the driver's reason where the device or driver cannot export one.
  virtual Result<int> export_dma_buf() const = 0;
};

// Memory a handler's state keeps on its accelerator (SetupContext, setup.hpp): device memory of
// a GPU, or host memory for the CPU accelerator.
struct AcceleratorMemory {
  // `bytes` zero-filled bytes aligned to 256, valid while the returned pointer (or a copy of
  // it) lives; the error names `what`.
  std::function<Result<std::shared_ptr<std::byte>>(uint64_t bytes, const std::string& what)>
      allocate;
  // Copies between host memory and memory from `allocate`, either way.
  std::function<Status(void* to, const void* from, uint64_t bytes)> copy;
};

// The CPU accelerator's: host memory (aligned new) and memcpy.
AcceleratorMemory host_memory();

// The GPU side of an agent: present when its handler source was compiled by nvcc with the CUDA
// backend (gpu_backend.cuh fills it in). device_count, prepare, check_rdma_memory and memory do
// not depend on the handler; start and start_in_device_memory run it.
struct GpuBackend {
  // CUDA devices present (0 without a driver or a device).
  std::function<int()> device_count;
  // Checks `device` and describes it for the log ("gpu:0 (NVIDIA H200, sm_90, ...)") and for
  // sizing (its SMs); what the operator should know goes to `warnings` (other processes holding
  // a context on it).
  struct Prepared {
    std::string description;
    uint32_t multiprocessors = 0;
  };
  std::function<Result<Prepared>(uint32_t device, std::vector<std::string>& warnings)> prepare;
  // Registers the region (this process's shm mapping) with CUDA as mapped memory and launches
  // the handler's persistent kernel on it.
  std::function<StartResult(std::byte* region, uint64_t bytes, uint32_t device,
                            const accel::GpuOptions& options)>
      start;
  // transport rdma with region_memory gpu: whether a NIC can write a region in `device`'s
  // memory in the order the ring protocol needs (query_rdma_capabilities, then
  // check_rdma_capabilities). OK: the capabilities, for the log; otherwise the error names the
  // device and the attribute it lacks.
  std::function<Result<std::string>(uint32_t device)> check_rdma_memory;
  // Creates a region of `geometry` with `epoch` in `device`'s memory (accel::gpu::DeviceRegion)
  // and launches the handler's persistent kernel on it; nothing is registered with CUDA.
  std::function<Result<std::unique_ptr<DeviceRegionServing>>(const mqueue::RegionGeometry& geometry,
                                                             uint64_t epoch, uint32_t device,
                                                             const accel::GpuOptions& options)>
      start_in_device_memory;
  // Device memory of `device` for a handler's state (cudaMalloc, cudaMemcpy).
  std::function<AcceleratorMemory(uint32_t device)> memory;
};

class Settings;      // settings.hpp
class SetupContext;  // setup.hpp
struct ServiceHandler;

// How to start the agent's handler on each accelerator kind.
//
// A handler without state has `cpu` and `gpu` (make_backends<H>): the one handler serves every
// service. A handler with state (make_stateful_backends<S>, setup.hpp) has `configure` and
// `setup` as well, and only the handler-independent part of `gpu`: each service's handler is
// made by `setup` once the accelerator is chosen (AgentRuntime does that before it registers),
// and its ServiceHandler starts it.
struct HandlerBackends {
  std::function<StartResult(mqueue::RegionView, const accel::CpuOptions&)> cpu;
  std::optional<GpuBackend> gpu;
  // Reads a service's settings (Settings, settings.hpp) into what `setup` takes; throws
  // config::ConfigError. Empty: the handler declares no settings.
  std::function<std::any(Settings&)> configure;
  // Sets one service up with what `configure` read for it, in the context it is given (and
  // keeps it with the state); an exception or an error stops the agent.
  std::function<Result<ServiceHandler>(const std::any& configured,
                                       std::unique_ptr<SetupContext> context)>
      setup;
  // What `configure` read, by service name: filled by configure_services (agent.hpp); a service
  // missing here is configured by AgentRuntime from its `handler:` mapping alone.
  std::map<std::string, std::any> configured;
};

// One service's handler, made by its setup: what starts it, and what tears its state down (the
// state's teardown, then the state and its memory freed). `teardown` is called at most once,
// and only after every accelerator serving the service has stopped.
struct ServiceHandler {
  HandlerBackends backends;  // cpu and gpu, bound to the state's handler() view
  std::function<void()> teardown;
};

// Whether this agent can run `setting` here: `gpu:N` needs the CUDA backend and device N.
// `auto` and `cpu` always can.
Status check_accelerator_available(const AcceleratorSetting& setting,
                                   const HandlerBackends& backends);

// `auto` becomes the best accelerator present: GPU 0 when the agent carries the CUDA backend and
// the host has a device, the CPU otherwise. Explicit settings are checked and returned.
Result<AcceleratorChoice> resolve_accelerator(const AcceleratorSetting& setting,
                                              const HandlerBackends& backends);

// The CPU backend: a CpuAccelerator<H> on the region, started before it is returned.
template <accel::Handler H>
class CpuServing final : public ServingAccelerator {
 public:
  CpuServing(mqueue::RegionView region, H handler, accel::CpuOptions options)
      : accelerator_(region, std::move(handler), std::move(options)) {}
  Status start() { return accelerator_.start(); }
  Status stop() override {
    accelerator_.stop();
    return Status::ok_status();
  }
  // A worker whose handler called accel::fault() has stopped serving.
  Status health() override { return accelerator_.health(); }
  std::string describe() const override {
    return std::to_string(accelerator_.workers()) + " CPU worker(s)";
  }
  HandlerErrors handler_errors() const override {
    HandlerErrors e;
    for (uint32_t w = 0; w < accelerator_.workers(); ++w) {
      const accel::WorkerStats& stats = accelerator_.stats(w);
      const uint64_t n = stats.handler_errors.load(std::memory_order_relaxed);
      if (n == 0) continue;
      e.count += n;
      if (std::string last = stats.last_error.get(); !last.empty()) e.last = std::move(last);
    }
    return e;
  }
  const accel::CpuAccelerator<H>& accelerator() const { return accelerator_; }

 private:
  accel::CpuAccelerator<H> accelerator_;
};

}  // namespace caracal::agent

#if defined(__CUDACC__) && defined(CARACAL_HAVE_CUDA)
#include "caracal/agent/gpu_backend.cuh"
#endif

namespace caracal::agent {

// The backends for handler H: the CPU always; the GPU when this source is compiled by nvcc.
template <accel::Handler H>
HandlerBackends make_backends(H handler) {
  HandlerBackends b;
  b.cpu = [handler](mqueue::RegionView region, const accel::CpuOptions& options) -> StartResult {
    auto serving = std::make_unique<CpuServing<H>>(region, handler, options);
    CARACAL_RETURN_IF_ERROR(serving->start());
    return std::unique_ptr<ServingAccelerator>(std::move(serving));
  };
#if defined(__CUDACC__) && defined(CARACAL_HAVE_CUDA)
  b.gpu = make_gpu_backend<H>(handler);
#endif
  return b;
}

}  // namespace caracal::agent
