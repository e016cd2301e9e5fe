#include "caracal/agent/accelerator.hpp"

namespace caracal::agent {

std::string AcceleratorChoice::str() const {
  return kind == AcceleratorKind::kGpu ? "gpu:" + std::to_string(gpu) : "cpu";
}

Status check_accelerator_available(const AcceleratorSetting& setting,
                                   const HandlerBackends& backends) {
  if (setting.kind != AcceleratorKind::kGpu) return Status::ok_status();
  if (!backends.gpu) {
    return Status(StatusCode::kUnavailable,
                  "accelerator '" + setting.str() +
                      "': this agent was built without the CUDA accelerator backend (its "
                      "handler source was not compiled by nvcc), so it cannot serve from a GPU; "
                      "use 'cpu' or 'auto'");
  }
  const int devices = backends.gpu->device_count();
  if (setting.gpu >= static_cast<uint32_t>(devices)) {
    return Status(StatusCode::kUnavailable,
                  "accelerator '" + setting.str() + "': this host has " + std::to_string(devices) +
                      " CUDA device(s)" +
                      (devices > 0 ? " (gpu:0 to gpu:" + std::to_string(devices - 1) + ")" : ""));
  }
  return Status::ok_status();
}

Result<AcceleratorChoice> resolve_accelerator(const AcceleratorSetting& setting,
                                              const HandlerBackends& backends) {
  CARACAL_RETURN_IF_ERROR(check_accelerator_available(setting, backends));
  switch (setting.kind) {
    case AcceleratorKind::kGpu:
      return AcceleratorChoice{AcceleratorKind::kGpu, setting.gpu};
    case AcceleratorKind::kAuto:
      if (backends.gpu && backends.gpu->device_count() > 0) {
        return AcceleratorChoice{AcceleratorKind::kGpu, 0};
      }
      return AcceleratorChoice{AcceleratorKind::kCpu, 0};
    case AcceleratorKind::kCpu:
      return AcceleratorChoice{AcceleratorKind::kCpu, 0};
  }
  return Status(StatusCode::kInternal, "unknown accelerator kind");
}

}  // namespace caracal::agent
