#include "caracal/host_init/accelerator.hpp"

namespace caracal::host {

std::string AcceleratorChoice::str() const {
  return kind == AcceleratorKind::kGpu ? "gpu:" + std::to_string(gpu) : "cpu";
}

Status check_accelerator_available(const AcceleratorSetting& setting) {
  if (setting.kind == AcceleratorKind::kGpu) {
    return Status(StatusCode::kUnavailable,
                  "accelerator '" + setting.str() +
                      "': this agent was built without the CUDA accelerator backend, so it "
                      "cannot serve from a GPU yet; use 'cpu' or 'auto'");
  }
  return Status::ok_status();
}

Result<AcceleratorChoice> resolve_accelerator(const AcceleratorSetting& setting) {
  if (Status s = check_accelerator_available(setting); !s.ok()) return s;
  switch (setting.kind) {
    case AcceleratorKind::kGpu:
      return AcceleratorChoice{AcceleratorKind::kGpu, setting.gpu};
    case AcceleratorKind::kCpu:
    case AcceleratorKind::kAuto:
      // `auto` prefers a GPU when the agent carries the CUDA backend and a device is present;
      // without the backend the CPU is the best accelerator there is.
      return AcceleratorChoice{AcceleratorKind::kCpu, 0};
  }
  return Status(StatusCode::kInternal, "unknown accelerator kind");
}

}  // namespace caracal::host
