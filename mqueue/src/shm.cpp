#include "caracal/mqueue/shm.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "caracal/mqueue/validate.hpp"

namespace caracal::mqueue {
namespace {

Status io_error(const std::string& what, int err) {
  return Status(StatusCode::kIoError, what + ": " + std::strerror(err));
}

}  // namespace

ShmMapping::ShmMapping(ShmMapping&& other) noexcept {
  *this = std::move(other);
}

ShmMapping& ShmMapping::operator=(ShmMapping&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    name_ = std::move(other.name_);
    unlink_on_close_ = std::exchange(other.unlink_on_close_, false);
  }
  return *this;
}

ShmMapping::~ShmMapping() {
  reset();
}

void ShmMapping::reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  if (unlink_on_close_) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
  unlink_on_close_ = false;
}

namespace {

// Maps all of `fd` (taking ownership of it) and returns the mapping.
Result<ShmMapping> map_whole(ShmMapping&& m, int fd, const std::string& what);

}  // namespace

Result<ShmMapping> ShmMapping::create_memfd(const std::string& label, uint64_t bytes) {
  const int fd = memfd_create(label.c_str(), MFD_CLOEXEC);
  if (fd < 0) return io_error("memfd_create(" + label + ")", errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    return io_error("ftruncate of memfd '" + label + "' to " + std::to_string(bytes), err);
  }
  return map_whole(ShmMapping(), fd, "memfd '" + label + "'");
}

Result<ShmMapping> ShmMapping::create_named(const std::string& name, uint64_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("shm_open(" + name + ", create)", errno);
  ShmMapping m;
  m.name_ = name;
  m.unlink_on_close_ = true;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    return io_error("ftruncate of shm '" + name + "' to " + std::to_string(bytes), err);
  }
  return map_whole(std::move(m), fd, "shm '" + name + "'");
}

Result<ShmMapping> ShmMapping::open_fd(int fd) {
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return io_error("dup of fd " + std::to_string(fd), errno);
  return map_whole(ShmMapping(), copy, "fd " + std::to_string(fd));
}

Result<ShmMapping> ShmMapping::open_named(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return io_error("shm_open(" + name + ")", errno);
  ShmMapping m;
  m.name_ = name;
  return map_whole(std::move(m), fd, "shm '" + name + "'");
}

namespace {

Result<ShmMapping> map_whole(ShmMapping&& m, int fd, const std::string& what) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return io_error("fstat of " + what, err);
  }
  if (st.st_size <= 0) {
    close(fd);
    return Status(StatusCode::kInvalidArgument, what + " is empty");
  }
  void* p =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return io_error("mmap of " + what, err);
  }
  m.adopt(static_cast<std::byte*>(p), static_cast<uint64_t>(st.st_size), fd);
  return std::move(m);
}

}  // namespace

void initialize_region(std::byte* base, const RegionHeader& header) {
  std::memset(base + header.control_offset, 0, header.control_bytes);
  std::memcpy(base, &header, sizeof(header));
}

Result<ShmMapping> create_shm_region(const RegionGeometry& geometry, uint64_t epoch,
                                     const std::string& label) {
  CARACAL_RETURN_IF_ERROR(validate_geometry(geometry));
  const RegionHeader header = compute_layout(geometry, epoch);
  Result<ShmMapping> m = ShmMapping::create_memfd(label, header.region_bytes);
  if (!m.ok()) return m;
  initialize_region(m->data(), header);
  return m;
}

}  // namespace caracal::mqueue
