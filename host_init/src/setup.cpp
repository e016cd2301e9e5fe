#include "caracal/agent/setup.hpp"

#include <cstring>
#include <new>

namespace caracal::agent {
namespace {

constexpr std::align_val_t kAlignment{256};

}  // namespace

AcceleratorMemory host_memory() {
  AcceleratorMemory m;
  m.allocate = [](uint64_t bytes, const std::string& what) -> Result<std::shared_ptr<std::byte>> {
    const uint64_t n = bytes == 0 ? 1 : bytes;
    void* p = ::operator new(n, kAlignment, std::nothrow);
    if (p == nullptr) {
      return Status(StatusCode::kUnavailable,
                    what + ": cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    }
    std::memset(p, 0, n);
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                      [](std::byte* q) { ::operator delete(q, kAlignment); });
  };
  m.copy = [](void* to, const void* from, uint64_t bytes) {
    if (bytes != 0) std::memcpy(to, from, bytes);
    return Status::ok_status();
  };
  return m;
}

std::byte* SetupContext::allocate_bytes(uint64_t bytes, const std::string& what) {
  Result<std::shared_ptr<std::byte>> p = memory_.allocate(bytes, what);
  if (!p.ok()) throw SetupError(p.status().message());
  held_.push_back(*p);
  allocated_bytes_ += bytes;
  return p->get();
}

void SetupContext::copy_bytes(void* to, const void* from, uint64_t bytes, const std::string& what) {
  if (Status s = memory_.copy(to, from, bytes); !s.ok()) {
    throw SetupError(what + ": copying " + std::to_string(bytes) + " bytes: " + s.message());
  }
}

std::vector<std::string> configure_services(const AgentConfig& config, HandlerBackends& backends,
                                            const SettingsOptions& options) {
  std::vector<std::string> summaries;
  for (const ServiceConfig& service : config.services) {
    Settings settings(SettingsSource{service.name, service.handler, service.entry, options.base_dir,
                                     options.overrides});
    std::any configured;
    if (backends.configure) configured = backends.configure(settings);
    settings.finish();
    summaries.push_back(settings.summary());
    backends.configured[service.name] = std::move(configured);
  }
  return summaries;
}

}  // namespace caracal::agent
