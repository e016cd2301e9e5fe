// Which accelerator serves an agent's regions, and how the runtime starts a handler on it.
//
// The runtime is written once, without the handler type: for each region it asks the agent's
// HandlerBackends for a ServingAccelerator, which owns whatever runs the handler (host threads
// for the CPU backend) and stops it when asked or destroyed. agent_main (agent.hpp) fills the
// backends from the handler type with make_backends<H>().
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/host_init/config.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/status.hpp"

namespace caracal::host {

// An accelerator that will run: never kAuto.
struct AcceleratorChoice {
  AcceleratorKind kind = AcceleratorKind::kCpu;
  uint32_t gpu = 0;
  // "cpu" or "gpu:N": what the hello message reports.
  std::string str() const;
};

// Whether this build can run `setting` (an error that says why not). `auto` always can.
Status check_accelerator_available(const AcceleratorSetting& setting);

// `auto` becomes the best accelerator present: a GPU once agents carry the CUDA backend, the
// CPU until then and on hosts without one. Explicit settings are returned as they are.
Result<AcceleratorChoice> resolve_accelerator(const AcceleratorSetting& setting);

// A handler running on one region. Destroying it stops it.
class ServingAccelerator {
 public:
  virtual ~ServingAccelerator() = default;
  // Raises the region's stop word and waits until nothing polls the region any more.
  virtual void stop() = 0;
};

using StartResult = Result<std::unique_ptr<ServingAccelerator>>;

// How to start the agent's handler on each accelerator kind. The CUDA backend adds its
// launcher here next to `cpu`.
struct HandlerBackends {
  std::function<StartResult(mqueue::RegionView, const accel::CpuOptions&)> cpu;
};

// The CPU backend: a CpuAccelerator<H> on the region, started before it is returned.
template <accel::Handler H>
class CpuServing final : public ServingAccelerator {
 public:
  CpuServing(mqueue::RegionView region, H handler, accel::CpuOptions options)
      : accelerator_(region, std::move(handler), std::move(options)) {}
  Status start() { return accelerator_.start(); }
  void stop() override { accelerator_.stop(); }
  const accel::CpuAccelerator<H>& accelerator() const { return accelerator_; }

 private:
  accel::CpuAccelerator<H> accelerator_;
};

template <accel::Handler H>
HandlerBackends make_backends(H handler) {
  HandlerBackends b;
  b.cpu = [handler](mqueue::RegionView region, const accel::CpuOptions& options) -> StartResult {
    auto serving = std::make_unique<CpuServing<H>>(region, handler, options);
    if (Status s = serving->start(); !s.ok()) return s;
    return std::unique_ptr<ServingAccelerator>(std::move(serving));
  };
  return b;
}

}  // namespace caracal::host
