// Byte helpers for handler code that runs on every backend. Host compilers get the C library;
// on the GPU, a group's threads split the work and move 16 bytes at a time where both sides are
// 16-byte aligned (ring payloads are: a slot is a multiple of 64 bytes and its header is 16), so
// a warp moves 512 bytes per step instead of 32 single-byte accesses across PCIe.
#pragma once

#include <cstdint>
#include <cstring>

#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/platform.hpp"

namespace caracal::accel {

// Copies n bytes; every thread of `group` calls it, and it returns when the calling thread's
// share is written (call group.sync() before reading what the others wrote).
CARACAL_INLINE void group_copy(const Group& group, std::byte* dst, const std::byte* src,
                               uint32_t n) {
#if defined(__CUDA_ARCH__)
  const uint32_t rank = group.rank();
  const uint32_t size = group.size();
  uint32_t done = 0;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const uint32_t chunks = n / 16;
    for (uint32_t i = rank; i < chunks; i += size) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
    done = chunks * 16;
  }
  for (uint32_t i = done + rank; i < n; i += size)
    dst[i] = src[i];
#else
  if (group.leader() && n != 0) std::memcpy(dst, src, n);
#endif
}

// Single-thread helpers with the semantics of memcpy/memmove/memcmp, usable in device code
// (where the C library's memmove and memcmp are not).
CARACAL_INLINE void copy_bytes(void* dst, const void* src, uint32_t n) {
#if defined(__CUDA_ARCH__)
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  for (uint32_t i = 0; i < n; ++i)
    d[i] = s[i];
#else
  if (n != 0) std::memcpy(dst, src, n);
#endif
}

CARACAL_INLINE void move_bytes(void* dst, const void* src, uint32_t n) {
#if defined(__CUDA_ARCH__)
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (d < s) {
    for (uint32_t i = 0; i < n; ++i)
      d[i] = s[i];
  } else {
    for (uint32_t i = n; i > 0; --i)
      d[i - 1] = s[i - 1];
  }
#else
  if (n != 0) std::memmove(dst, src, n);
#endif
}

// True when the n bytes at a equal those at b.
CARACAL_INLINE bool equal_bytes(const void* a, const void* b, uint32_t n) {
#if defined(__CUDA_ARCH__)
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  for (uint32_t i = 0; i < n; ++i) {
    if (x[i] != y[i]) return false;
  }
  return true;
#else
  return n == 0 || std::memcmp(a, b, n) == 0;
#endif
}

}  // namespace caracal::accel
