// Host/device portability for the parts of the mqueue contract that device code includes.
//
// Everything here compiles with a plain C++20 host compiler and inside a CUDA translation unit.
// Under nvcc the atomics are libcu++'s `cuda::atomic_ref` at system scope (the peer is another
// processor across PCIe or the network); under a host compiler they are `std::atomic_ref`.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda/atomic>
#define CARACAL_HOST_DEVICE __host__ __device__
#define CARACAL_INLINE __host__ __device__ __forceinline__
// CARACAL_INLINE for members of a template over an access policy (ring.hpp), which is
// instantiated with a policy that runs on the device (local memory) and with host-only ones
// (a Transport). The host-only instantiations never run on the device; without the pragma nvcc
// warns about each of their calls into the transport (libcu++ does the same for its own
// templates, _CCCL_EXEC_CHECK_DISABLE).
#define CARACAL_POLICY_INLINE _Pragma("nv_exec_check_disable") __host__ __device__ __forceinline__
// The same for a function template over such policies: written before its `template`.
#define CARACAL_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#include <atomic>
#define CARACAL_HOST_DEVICE
#define CARACAL_INLINE inline
#define CARACAL_POLICY_INLINE inline
#define CARACAL_EXEC_CHECK_DISABLE
#endif

namespace caracal::mqueue {

#if defined(__CUDACC__)
// System scope: the other side of every index is a different processor (CPU, NIC or GPU).
template <class T>
using SystemAtomicRef = cuda::atomic_ref<T, cuda::thread_scope_system>;
namespace mo = cuda::std;
#else
template <class T>
using SystemAtomicRef = std::atomic_ref<T>;
namespace mo = std;
#endif

// Acquire load of an index word that a peer publishes. Pairs with that peer's store_release.
CARACAL_INLINE uint32_t load_acquire(uint32_t* word) {
  return SystemAtomicRef<uint32_t>(*word).load(mo::memory_order_acquire);
}

// Relaxed load of a word this side owns (or only uses as a hint; no data depends on it).
CARACAL_INLINE uint32_t load_relaxed(uint32_t* word) {
  return SystemAtomicRef<uint32_t>(*word).load(mo::memory_order_relaxed);
}

// Release store of an index word: every write to the slots it covers, made by this thread
// before the call, is visible to a peer whose load_acquire reads the new value.
CARACAL_INLINE void store_release(uint32_t* word, uint32_t value) {
  SystemAtomicRef<uint32_t>(*word).store(value, mo::memory_order_release);
}

CARACAL_INLINE void store_relaxed(uint32_t* word, uint32_t value) {
  SystemAtomicRef<uint32_t>(*word).store(value, mo::memory_order_relaxed);
}

// A word of an RX line (layout.hpp): aligned 8-byte accesses, single-copy atomic. Each word
// carries its own flag, so most are relaxed; the line's first word is stored with release, and
// an acquire after it is seen (its load on the host, a fence on the GPU) orders the entry's
// slots (written before the line) before the consumer's reads of them.
CARACAL_INLINE uint64_t load_relaxed(const uint64_t* word) {
  return SystemAtomicRef<uint64_t>(*const_cast<uint64_t*>(word)).load(mo::memory_order_relaxed);
}
CARACAL_INLINE uint64_t load_acquire(const uint64_t* word) {
  return SystemAtomicRef<uint64_t>(*const_cast<uint64_t*>(word)).load(mo::memory_order_acquire);
}
CARACAL_INLINE void store_relaxed(uint64_t* word, uint64_t value) {
  SystemAtomicRef<uint64_t>(*word).store(value, mo::memory_order_relaxed);
}
CARACAL_INLINE void store_release(uint64_t* word, uint64_t value) {
  SystemAtomicRef<uint64_t>(*word).store(value, mo::memory_order_release);
}

// System-scope acquire fence: every load before it is ordered before every load and store
// after it. After a relaxed load that saw a peer's release store, it makes what the peer wrote
// before that store visible (GPU: RingConsumer's reads of an RX line).
CARACAL_INLINE void fence_acquire() {
#if defined(__CUDACC__)
  cuda::atomic_thread_fence(cuda::std::memory_order_acquire, cuda::thread_scope_system);
#else
  std::atomic_thread_fence(std::memory_order_acquire);
#endif
}

// System-scope release fence: every load and store before it is ordered before every store
// after it. One fence ahead of several relaxed index stores publishes all of them (see
// RingProducer::publish_after_fence), where a release store each would fence each.
CARACAL_INLINE void fence_release() {
#if defined(__CUDACC__)
  cuda::atomic_thread_fence(cuda::std::memory_order_release, cuda::thread_scope_system);
#else
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

// Short pause inside a spin loop. On the GPU, `__nanosleep` keeps an idle poller off the
// memory system; on the host, the CPU's pause hint.
CARACAL_INLINE void spin_pause([[maybe_unused]] uint32_t ns_hint = 0) {
#if defined(__CUDA_ARCH__)
  if (ns_hint != 0) __nanosleep(ns_hint);
#elif defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace caracal::mqueue
