// Byte helpers for handler code that runs on every backend. Host compilers get the C library;
// on the GPU, a group's threads split the work and move 16 bytes at a time where both sides are
// 16-byte aligned (ring payloads are: a slot is a multiple of 64 bytes and its header is 16), so
// a warp moves 512 bytes per step instead of 32 single-byte accesses across PCIe.
//
// A ring in host memory is read by the GPU across PCIe, each read a round trip over the bus
// (bench/results/EXPERIMENTS.md, gpu-shm-latency-nvidia-h200.md). A loop that stores each word
// before it loads the next has one read in flight per thread and pays that round trip per step;
// the 16-byte copies here issue kCopyWordsInFlight loads before their stores (the compiler may
// not reorder a load above a store that could alias it), so a warp has up to 4 KiB of reads
// outstanding (bench/results/EXPERIMENTS.md, gpu-copies-h200.md).
#pragma once

#include <cstdint>
#include <cstring>

#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/platform.hpp"

namespace caracal::accel {

#if defined(__CUDA_ARCH__)
namespace detail {

inline constexpr uint32_t kCopyWordsInFlight = 8;

// Copies the 16-byte words first, first + stride, ... below `words`: each step loads up to
// kCopyWordsInFlight words into registers, then stores them. The loads of a step are
// predicated, not a separate tail loop, so a copy shorter than a full step (1 KiB is two words
// per lane of a warp) also has all its reads in flight at once.
__device__ __forceinline__ void copy_words(uint4* dst, const uint4* src, uint32_t words,
                                           uint32_t first, uint32_t stride) {
  for (uint32_t i = first; i < words; i += kCopyWordsInFlight * stride) {
    uint4 w[kCopyWordsInFlight];
#pragma unroll
    for (uint32_t k = 0; k < kCopyWordsInFlight; ++k) {
      if (i + k * stride < words) w[k] = src[i + k * stride];
    }
#pragma unroll
    for (uint32_t k = 0; k < kCopyWordsInFlight; ++k) {
      if (i + k * stride < words) dst[i + k * stride] = w[k];
    }
  }
}

__device__ __forceinline__ bool aligned16(const void* a, const void* b) {
  return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15) == 0;
}

}  // namespace detail
#endif

// Copies n bytes; every thread of `group` calls it, and it returns when the calling thread's
// share is written (call group.sync() before reading what the others wrote).
CARACAL_INLINE void group_copy(const Group& group, std::byte* dst, const std::byte* src,
                               uint32_t n) {
#if defined(__CUDA_ARCH__)
  const uint32_t rank = group.rank();
  const uint32_t size = group.size();
  uint32_t done = 0;
  if (detail::aligned16(dst, src)) {
    detail::copy_words(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), n / 16,
                       rank, size);
    done = n / 16 * 16;
  }
  for (uint32_t i = done + rank; i < n; i += size)
    dst[i] = src[i];
#else
  if (group.leader() && n != 0) std::memcpy(dst, src, n);
#endif
}

// Single-thread helpers with the semantics of memcpy/memmove/memcmp, usable in device code
// (where the C library's memmove and memcmp are not).
// On the GPU, copy_bytes moves 16-byte words when both sides are 16-byte aligned (declare a
// register array that is copied to or from ring memory `alignas(16)`).
CARACAL_INLINE void copy_bytes(void* dst, const void* src, uint32_t n) {
#if defined(__CUDA_ARCH__)
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  uint32_t done = 0;
  if (detail::aligned16(d, s)) {
    detail::copy_words(reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(s), n / 16, 0,
                       1);
    done = n / 16 * 16;
  }
  for (uint32_t i = done; i < n; ++i)
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
