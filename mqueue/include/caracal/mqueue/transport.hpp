// How the SmartNIC reaches a region in another device's memory. The mqueue manager is written
// once against this interface; `shm` (shm.hpp) and `rdma` implement it. The transport is a
// template parameter of the SmartNIC-side ring code, so the data path makes no virtual calls.
//
// The model is that of one RDMA reliable-connected queue pair:
//  - The SmartNIC keeps a local staging image of the remote region (for `shm` it is the region
//    itself). It writes entries into staging and posts writes that copy byte ranges to the
//    remote region; posted reads copy remote ranges into staging.
//  - Operations complete in the order they were posted. Each post returns a ticket; completed()
//    is the highest ticket known complete after the last progress().
//  - publish_index() writes a 32-bit index word and is ordered after every write posted before
//    it (the release that makes those writes visible to a poller on the other side).
//  - load_index() returns an index word as last read into staging (for `shm`: the live word,
//    loaded with acquire); slots read after it are at least as new.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <string>
#include <utility>

#include "caracal/core/status.hpp"

namespace caracal::mqueue {

template <class T>
concept Transport = requires(T& t, const T& ct, uint64_t offset, uint32_t length, uint32_t value) {
  { t.staging(offset) } -> std::same_as<std::byte*>;
  { t.post_write(offset, length) } -> std::same_as<uint64_t>;
  { t.post_read(offset, length) } -> std::same_as<uint64_t>;
  { t.publish_index(offset, value) } -> std::same_as<uint64_t>;
  { t.load_index(offset) } -> std::same_as<uint32_t>;
  { t.progress() } -> std::same_as<Status>;
  { ct.completed() } -> std::same_as<uint64_t>;
  { ct.region_bytes() } -> std::same_as<uint64_t>;
  { ct.name() } -> std::convertible_to<const char*>;
};

// Drives `t` until `ticket` completes, a completion fails, or `timeout` passes. For setup and
// for the rare synchronous step; the data path polls completed() instead.
template <Transport T>
Status wait_for(T& t, uint64_t ticket, std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  uint32_t spins = 0;
  while (t.completed() < ticket) {
    CARACAL_RETURN_IF_ERROR(t.progress());
    if (++spins % 1024 == 0 && std::chrono::steady_clock::now() > deadline) {
      // Appended to a named string: GCC 12 warns (-Warray-bounds, a false positive) about
      // the same text built as one std::string(...) + ... chain in sources that use the
      // precompiled gtest header.
      std::string message = t.name();
      message +=
          " transport: operation " + std::to_string(ticket) + " did not complete in " +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) +
          " ms";
      return Status(StatusCode::kUnavailable, std::move(message));
    }
  }
  return Status::ok_status();
}

}  // namespace caracal::mqueue
