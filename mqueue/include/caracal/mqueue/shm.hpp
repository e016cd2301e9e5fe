// The `shm` transport: a region in shared host memory that two processes map. The agent
// creates it (memfd, or a named POSIX shm object) and hands it to the server (the fd over a
// UNIX socket, or the name); with a GPU accelerator the agent also registers it with CUDA as
// mapped memory so kernels poll it directly.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "caracal/core/status.hpp"
#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/platform.hpp"
#include "caracal/mqueue/transport.hpp"

namespace caracal::mqueue {

// An owned shared-memory mapping (move-only).
class ShmMapping {
 public:
  ShmMapping() = default;
  ShmMapping(ShmMapping&& other) noexcept;
  ShmMapping& operator=(ShmMapping&& other) noexcept;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping();

  // A new anonymous memfd of `bytes` (zero-filled). `label` shows in /proc/PID/fd.
  static Result<ShmMapping> create_memfd(const std::string& label, uint64_t bytes);
  // A new named POSIX shm object ("/name"); fails if it exists. Unlinked when this mapping is
  // destroyed.
  static Result<ShmMapping> create_named(const std::string& name, uint64_t bytes);
  // Maps an object another process created: an fd it passed over (duplicated here), or a name.
  static Result<ShmMapping> open_fd(int fd);
  static Result<ShmMapping> open_named(const std::string& name);

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  // The name of a named object, empty for a memfd.
  const std::string& name() const { return name_; }

  // Takes ownership of a mapping made elsewhere (used by the factory functions).
  void adopt(std::byte* data, uint64_t size, int fd) {
    data_ = data;
    size_ = size;
    fd_ = fd;
  }

 private:
  void reset();

  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
  std::string name_;
  bool unlink_on_close_ = false;
};

// Writes a fresh region layout into `base` (which holds at least header.region_bytes zeroed
// bytes): the header first, then clears every control word. Done by the agent before it
// announces the region.
void initialize_region(std::byte* base, const RegionHeader& header);

// Creates a memfd-backed region for `geometry` and initialises it. Validates the geometry first.
Result<ShmMapping> create_shm_region(const RegionGeometry& geometry, uint64_t epoch,
                                     const std::string& label);

// The SmartNIC side of a region mapped into this process. Staging is the region itself: entry
// writes land in place and a post only takes a ticket; publish_index is a release store and
// load_index an acquire load, which order them against the accelerator's own acquire/release.
class ShmTransport {
 public:
  ShmTransport(std::byte* base, uint64_t bytes) : base_(base), bytes_(bytes) {}

  std::byte* staging(uint64_t offset) { return base_ + offset; }
  uint64_t post_write(uint64_t, uint32_t) { return take_ticket(); }
  uint64_t post_read(uint64_t, uint32_t) { return take_ticket(); }
  uint64_t publish_index(uint64_t offset, uint32_t value) {
    // Pairs with the accelerator's load_acquire of this index (RingConsumer::refresh_tail for
    // an RX tail, RingProducer::refresh_credits for a TX head).
    store_release(word(offset), value);
    return take_ticket();
  }
  uint32_t load_index(uint64_t offset) {
    // Pairs with the accelerator's store_release of this index (RingProducer::publish for a TX
    // tail, RingConsumer::publish for an RX head).
    return load_acquire(word(offset));
  }
  Status progress() { return Status::ok_status(); }
  uint64_t completed() const { return posted_.load(std::memory_order_relaxed); }
  uint64_t region_bytes() const { return bytes_; }
  const char* name() const { return "shm"; }

 private:
  uint32_t* word(uint64_t offset) const { return reinterpret_cast<uint32_t*>(base_ + offset); }
  // Every operation has completed by the time it returns, so a ticket orders nothing: the
  // counter only keeps completed() >= every ticket handed out. It is atomic because several
  // engine threads may serve disjoint queues of one region through one transport; relaxed,
  // because a thread compares only tickets it took itself, which its own later load sees.
  uint64_t take_ticket() { return posted_.fetch_add(1, std::memory_order_relaxed) + 1; }

  std::byte* base_;
  uint64_t bytes_;
  std::atomic<uint64_t> posted_{0};
};
static_assert(Transport<ShmTransport>);

}  // namespace caracal::mqueue
