// A service's queue region as the agent allocates it for the `shm` transport: a named POSIX
// shared memory object, mode 0600, that the server opens by name when it reads the region
// announcement. Once the server has attached (it holds its own mapping) the agent removes the
// name, so nothing is left in /dev/shm; a region whose name is still there when it is
// destroyed removes it then, so no exit path the agent controls leaves one behind.
#pragma once

#include <sys/types.h>
#include <cstdint>
#include <string>
#include <string_view>

#include "caracal/core/status.hpp"
#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/shm.hpp"

namespace caracal::agent {

// "/caracal-<agent>-<pid>-<service>": unique per live agent process and service.
std::string region_shm_name(std::string_view agent, pid_t pid, std::string_view service);

// A fresh agent epoch: random, nonzero, new for every (re)registration.
uint64_t fresh_epoch();

class NamedShmRegion {
 public:
  NamedShmRegion() = default;
  NamedShmRegion(NamedShmRegion&& other) noexcept;
  NamedShmRegion& operator=(NamedShmRegion&& other) noexcept;
  NamedShmRegion(const NamedShmRegion&) = delete;
  NamedShmRegion& operator=(const NamedShmRegion&) = delete;
  ~NamedShmRegion();

  // Validates `geometry`, creates the object `name` (failing if it exists), sizes and maps it,
  // and writes the region header (with `epoch`) and cleared control words. On failure nothing
  // is left under `name`.
  static Result<NamedShmRegion> create(const std::string& name,
                                       const mqueue::RegionGeometry& geometry, uint64_t epoch);

  // Removes the name; the mapping stays valid. Idempotent.
  Status unlink();

  const std::string& name() const { return name_; }
  bool linked() const { return linked_; }
  uint64_t bytes() const { return mapping_.size(); }
  std::byte* data() const { return mapping_.data(); }
  mqueue::RegionView view() const { return mqueue::RegionView(mapping_.data()); }
  const mqueue::RegionHeader& header() const {
    return *reinterpret_cast<const mqueue::RegionHeader*>(mapping_.data());
  }

 private:
  mqueue::ShmMapping mapping_;
  std::string name_;
  bool linked_ = false;
};

}  // namespace caracal::agent
