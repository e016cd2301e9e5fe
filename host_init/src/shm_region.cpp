#include "caracal/agent/shm_region.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include "caracal/mqueue/validate.hpp"

namespace caracal::agent {
namespace {

Status io_error(const std::string& what, int err) {
  return Status(StatusCode::kIoError, what + ": " + std::strerror(err));
}

}  // namespace

std::string region_shm_name(std::string_view agent, pid_t pid, std::string_view service) {
  std::string name = "/caracal-";
  name += agent;
  name += '-';
  name += std::to_string(pid);
  name += '-';
  name += service;
  return name;
}

uint64_t fresh_epoch() {
  std::random_device rd;
  for (;;) {
    const uint64_t e = (uint64_t{rd()} << 32) ^ rd();
    if (e != 0) return e;
  }
}

NamedShmRegion::NamedShmRegion(NamedShmRegion&& other) noexcept {
  *this = std::move(other);
}

NamedShmRegion& NamedShmRegion::operator=(NamedShmRegion&& other) noexcept {
  if (this != &other) {
    (void)unlink();
    mapping_ = std::move(other.mapping_);
    name_ = std::move(other.name_);
    linked_ = std::exchange(other.linked_, false);
  }
  return *this;
}

NamedShmRegion::~NamedShmRegion() {
  (void)unlink();
}

Status NamedShmRegion::unlink() {
  if (!linked_) return Status::ok_status();
  linked_ = false;
  if (shm_unlink(name_.c_str()) != 0) return io_error("shm_unlink(" + name_ + ")", errno);
  return Status::ok_status();
}

Result<NamedShmRegion> NamedShmRegion::create(const std::string& name,
                                              const mqueue::RegionGeometry& geometry,
                                              uint64_t epoch) {
  CARACAL_RETURN_IF_ERROR(mqueue::validate_geometry(geometry));
  const mqueue::RegionHeader header = mqueue::compute_layout(geometry, epoch);

  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("shm_open(" + name + ", create)", errno);
  // From here on the region owns the name: any early return unlinks it.
  NamedShmRegion region;
  region.name_ = name;
  region.linked_ = true;

  // The umask may have taken bits away from 0600; the server (same user) opens it read-write.
  if (fchmod(fd, 0600) != 0) {
    const int err = errno;
    close(fd);
    return io_error("fchmod(" + name + ", 0600)", err);
  }
  if (ftruncate(fd, static_cast<off_t>(header.region_bytes)) != 0) {
    const int err = errno;
    close(fd);
    return io_error(
        "ftruncate of shm '" + name + "' to " + std::to_string(header.region_bytes) + " bytes",
        err);
  }
  Result<mqueue::ShmMapping> mapping = mqueue::ShmMapping::open_fd(fd);  // maps a duplicate
  close(fd);
  if (!mapping.ok()) return mapping.status();
  region.mapping_ = std::move(mapping).value();
  // A fresh object is zero-filled; initialize_region writes the header and clears the control
  // words. The server maps the region only after the announcement, which the agent sends after
  // this returns, so plain stores are enough here.
  mqueue::initialize_region(region.mapping_.data(), header);
  return region;
}

}  // namespace caracal::agent
