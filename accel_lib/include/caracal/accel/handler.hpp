// The handler shape: what a user writes once and runs on every accelerator backend.
//
// A handler is a functor. Its call operator takes a request and writes a response in place:
//
//   struct Echo {
//     CARACAL_HOST_DEVICE void operator()(const Request& req, Response& resp, Context& ctx) {
//       for (uint32_t i = ctx.group().rank(); i < req.size; i += ctx.group().size())
//         resp.data[i] = req.data[i];
//       resp.size = req.size;
//     }
//   };
//
// Optional declarations on the handler type:
//  - `static constexpr Granularity kGranularity`: who runs one call together: a thread (the
//    default), a warp or a block. A call made by a group sees the group in ctx.group() and
//    splits its work by rank; on the CPU every group is one host thread (size 1).
//    Every thread of the group may write the response's bytes (each its own); only the leader's
//    `size` and `flags` count (set them in the leader). The group's threads share no memory
//    the runtime gives them: a warp or block that needs some declares it (__shared__ on a GPU,
//    thread_local on the CPU, as examples/face_verify does), and warps of one block that are
//    separate workers (warp granularity) must index such memory by their warp (threadIdx.x / 32)
//    and sync with __syncwarp only: __syncthreads would wait for workers that are not there.
//  - `static constexpr uint32_t kBatch`: more than 1 makes it a batched handler, called with up
//    to kBatch requests of one queue at once:
//      void operator()(const Request* reqs, Response* resps, uint32_t count, Context& ctx);
//  - `static constexpr uint32_t kMaxResponseBytes`: the largest response it writes (default:
//    the region's max_message_bytes). Smaller values reserve less of the TX ring per request.
//  - `static constexpr uint32_t kBlockThreads`: a block-granular handler's block size on a GPU
//    (default: the agent's gpu.block_threads).
//  - `static constexpr uint32_t kInFlight` with start() and finish() instead of the call
//    operator: an overlapped handler, whose worker keeps up to kInFlight requests open across
//    their client calls (overlap.hpp).
//
// Copies. Every worker holds its own copy of the handler, made from the one the agent started
// the region with: a CPU worker thread copies it once; a GPU kernel takes it by value as a
// kernel parameter, and every thread of the kernel copies that. So on a GPU a handler must be
// trivially copyable and small (kernel parameters are limited to a few KiB), and every pointer
// in it must be readable by the device. Members are per-worker (per-thread on a GPU) scratch:
// they start again from the prototype whenever the region is started again, which happens each
// time the agent registers anew. What must outlast that, or be shared, is state.
//
// State shared by workers. A handler with state (caracal/agent/setup.hpp) is a view that its
// setup made, on the host, before any worker started: pointers into memory on the chosen
// accelerator (device memory on a GPU, host memory on the CPU) and sizes. The contract:
//  - Read-only state (a table, a model's weights) needs nothing: setup wrote it before the
//    workers were started, and the start orders those writes before every worker's first read
//    (a kernel launch; a thread's creation).
//  - Mutable shared state is read and written with atomics only: cuda::atomic_ref at device
//    scope on a GPU (system scope where the host reads it while the kernel runs),
//    std::atomic_ref on the CPU; plain stores to memory another worker reads are a data race.
//    Relaxed order suffices for counters; a word that publishes other data is written with
//    release and read with acquire, as the rings do. Workers of several regions (a service's
//    regions across re-registrations) never run at once, so state set up per service has the
//    workers of one region at a time.
//  - The state outlives every worker: it is torn down only after every accelerator serving the
//    service has stopped, and never while one may still run.
//
// A handler that cannot go on calls fault(): see there. One that fails a request on the CPU may
// throw: the client gets an error reply that says only that the handler failed
// (kHandlerFailedReply, cpu.hpp), and the agent logs how many failed and the last exception's
// text, a line per service a second at most. To tell the client why, answer with set_error().
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "caracal/accel/client.hpp"
#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/platform.hpp"

namespace caracal::accel {

enum class Granularity : uint8_t { kThread = 0, kWarp = 1, kBlock = 2 };

// One request, in place in its RX ring (or, for a small request on the GPU, in a copy the
// worker made in shared memory): valid for the duration of the call.
struct Request {
  const std::byte* data = nullptr;
  uint32_t size = 0;
  uint32_t queue = 0;  // the server queue it came in on
  uint64_t token = 0;  // reply address; the runtime copies it to the response
};

// Where the handler writes its reply, in place in the TX ring (or a staging buffer).
struct Response {
  std::byte* data = nullptr;
  uint32_t capacity = 0;  // bytes the handler may write at data
  uint32_t size = 0;      // bytes it wrote; set by the handler
  uint16_t flags = 0;     // mqueue::SlotFlags

  // Nothing goes back to the client for this request.
  CARACAL_INLINE void no_reply() { flags |= mqueue::kSlotNoReply; }
  // The response is an error text; the server answers the client with it where the framing
  // can carry errors and otherwise drops the request, counted.
  CARACAL_INLINE void set_error(const char* text) {
    uint32_t n = 0;
    while (text[n] != '\0' && n < capacity) {
      data[n] = static_cast<std::byte>(text[n]);
      ++n;
    }
    size = n;
    flags |= mqueue::kSlotError;
  }
};

namespace detail {

// What a group's collectives compute (Group): also how the CPU's group harness checks that
// every rank called the same one (group_harness.hpp).
enum class GroupOp : uint32_t {
  kSync = 1,
  kBroadcast,
  kSum,
  kMax,
  kMin,
  kAll,
  kAny,
  kExclusiveSum
};

// One step of a reduction (kSum, kMax, kMin): what it makes of the value so far and the next,
// the same on every backend.
template <class T>
CARACAL_INLINE T combine_two(GroupOp op, T a, T b) {
  switch (op) {
    case GroupOp::kMax:
      return a < b ? b : a;
    case GroupOp::kMin:
      return b < a ? b : a;
    default:
      return a + b;
  }
}

#if !defined(__CUDA_ARCH__)
// A collective of a host group of more than one thread (the group harness gives the group its
// HostGroup): each rank's value goes through the harness's slots between two barriers.
// Implemented in group_harness.hpp; `combine` reads every rank's value in rank order.
void host_collective(void* group, uint32_t rank, GroupOp op, const void* value, void* result,
                     uint32_t bytes,
                     void (*combine)(GroupOp, const void* values, uint32_t ranks, uint32_t rank,
                                     uint32_t from, void* result),
                     uint32_t from);

// The collective's result at `rank` from every rank's value (`values`: `ranks` of T), in the
// same order of operations on every rank, so that all get the same bits.
template <class T>
void combine_values(GroupOp op, const void* values, uint32_t ranks, uint32_t rank, uint32_t from,
                    void* result) {
  const T* v = static_cast<const T*>(values);
  T r{};
  switch (op) {
    case GroupOp::kBroadcast:
      r = v[from];
      break;
    case GroupOp::kSum:
    case GroupOp::kMax:
    case GroupOp::kMin:
      r = op == GroupOp::kSum ? T{} : v[0];
      for (uint32_t i = op == GroupOp::kSum ? 0 : 1; i < ranks; ++i)
        r = combine_two(op, r, v[i]);
      break;
    case GroupOp::kExclusiveSum:
      for (uint32_t i = 0; i < rank; ++i)
        r = r + v[i];
      break;
    default:
      break;
  }
  *static_cast<T*>(result) = r;
}
#endif

#if defined(__CUDACC__)
// A block's collectives go through shared memory: a slot per warp (a block has at most 32),
// one array per value type. The warp stage is the warp's own collective.
// kSum, kMax or kMin over a warp's 32 lanes, every lane getting the result.
template <class T>
__device__ T warp_reduce(GroupOp op, T v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = combine_two(op, v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
// The sum over the lanes below this one (0 at lane 0).
template <class T>
__device__ T warp_exclusive_sum(T v, uint32_t lane) {
  T inclusive = v;
  for (uint32_t offset = 1; offset < 32; offset *= 2) {
    const T o = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive = inclusive + o;
  }
  const T below = __shfl_up_sync(0xffffffffu, inclusive, 1);
  return lane == 0 ? T{} : below;
}

template <class T>
__device__ T block_collective(GroupOp op, T v, uint32_t rank, uint32_t size, uint32_t from) {
  __shared__ T slots[32];
  const uint32_t warp = rank / 32;
  const uint32_t lane = rank % 32;
  const uint32_t warps = size / 32;
  T r{};
  switch (op) {
    case GroupOp::kBroadcast:
      if (rank == from) slots[0] = v;
      __syncthreads();
      r = slots[0];
      break;
    case GroupOp::kSum:
    case GroupOp::kMax:
    case GroupOp::kMin: {
      const T w = warp_reduce(op, v);
      if (lane == 0) slots[warp] = w;
      __syncthreads();
      // Every thread combines the warps' results in the same order: the same bits everywhere.
      r = slots[0];
      for (uint32_t i = 1; i < warps; ++i)
        r = combine_two(op, r, slots[i]);
      break;
    }
    case GroupOp::kExclusiveSum: {
      const T below = warp_exclusive_sum(v, lane);
      if (lane == 31) slots[warp] = below + v;  // the warp's total
      __syncthreads();
      for (uint32_t i = 0; i < warp; ++i)
        r = r + slots[i];
      r = r + below;
      break;
    }
    default:
      break;
  }
  __syncthreads();  // every thread has read the slots before the next collective writes them
  return r;
}
#endif

}  // namespace detail

// The threads that run one handler call together: one (kThread), a warp's 32 lanes (kWarp) or a
// block's threads (kBlock, a multiple of 32).
//
// Collectives: sync() and the calls below are made by every thread of the group, the same
// ones in the same order, outside branches that only some ranks take (on a GPU a rank that
// skips one hangs its group or reads garbage; the CPU's group harness, group_harness.hpp,
// reports it). Each returns the same value on every rank. T: an arithmetic type of 4 or 8
// bytes. Integer sums are exact; a float sum is added in a fixed order per backend, so a GPU's
// and the harness's may differ in the last bits. A block's collectives use 32 slots of
// shared memory per type, and include their own barriers. A group of one thread (kThread,
// and every group the CPU accelerator runs) returns its own value.
class Group {
 public:
  CARACAL_HOST_DEVICE Group() {}
  CARACAL_HOST_DEVICE Group(Granularity g, uint32_t rank, uint32_t size, void* host = nullptr)
      : granularity_(g), rank_(rank), size_(size), host_(host) {}
  CARACAL_INLINE uint32_t rank() const { return rank_; }
  CARACAL_INLINE uint32_t size() const { return size_; }
  CARACAL_INLINE bool leader() const { return rank_ == 0; }
  CARACAL_INLINE Granularity granularity() const { return granularity_; }
  // Barrier among the group's threads (a no-op for a single thread): what each wrote before it
  // is seen by every rank after it.
  CARACAL_INLINE void sync() const {
#if defined(__CUDA_ARCH__)
    if (granularity_ == Granularity::kWarp) __syncwarp();
    if (granularity_ == Granularity::kBlock) __syncthreads();
#else
    if (host_ != nullptr) {
      uint32_t none = 0;
      detail::host_collective(host_, rank_, detail::GroupOp::kSync, &none, &none, sizeof none,
                              nullptr, 0);
    }
#endif
  }

  // Rank `from`'s value, on every rank.
  template <class T>
  CARACAL_INLINE T broadcast(T value, uint32_t from = 0) const {
    return collective(detail::GroupOp::kBroadcast, value, from);
  }
  template <class T>
  CARACAL_INLINE T sum(T value) const {
    return collective(detail::GroupOp::kSum, value, 0);
  }
  template <class T>
  CARACAL_INLINE T max(T value) const {
    return collective(detail::GroupOp::kMax, value, 0);
  }
  template <class T>
  CARACAL_INLINE T min(T value) const {
    return collective(detail::GroupOp::kMin, value, 0);
  }
  // The sum of the values of the ranks below this one (0 at the leader): where each rank's
  // part starts when the ranks append parts of their own sizes in rank order.
  template <class T>
  CARACAL_INLINE T exclusive_sum(T value) const {
    return collective(detail::GroupOp::kExclusiveSum, value, 0);
  }
  CARACAL_INLINE bool all(bool value) const {
#if defined(__CUDA_ARCH__)
    if (granularity_ == Granularity::kWarp) return __all_sync(0xffffffffu, value) != 0;
    if (granularity_ == Granularity::kBlock) return __syncthreads_and(value) != 0;
    return value;
#else
    return min(value ? 1u : 0u) != 0;
#endif
  }
  CARACAL_INLINE bool any(bool value) const {
#if defined(__CUDA_ARCH__)
    if (granularity_ == Granularity::kWarp) return __any_sync(0xffffffffu, value) != 0;
    if (granularity_ == Granularity::kBlock) return __syncthreads_or(value) != 0;
    return value;
#else
    return max(value ? 1u : 0u) != 0;
#endif
  }

 private:
  template <class T>
  CARACAL_INLINE T collective(detail::GroupOp op, T value, uint32_t from) const {
    static_assert(std::is_arithmetic_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                  "group collectives take an arithmetic type of 4 or 8 bytes");
#if defined(__CUDA_ARCH__)
    switch (granularity_) {
      case Granularity::kWarp:
        switch (op) {
          case detail::GroupOp::kBroadcast:
            return __shfl_sync(0xffffffffu, value, static_cast<int>(from));
          case detail::GroupOp::kSum:
          case detail::GroupOp::kMax:
          case detail::GroupOp::kMin:
            return detail::warp_reduce(op, value);
          case detail::GroupOp::kExclusiveSum:
            return detail::warp_exclusive_sum(value, rank_);
          default:
            return value;
        }
      case Granularity::kBlock:
        return detail::block_collective(op, value, rank_, size_, from);
      default:
        return op == detail::GroupOp::kExclusiveSum ? T{} : value;
    }
#else
    if (host_ == nullptr) return op == detail::GroupOp::kExclusiveSum ? T{} : value;
    T result{};
    detail::host_collective(host_, rank_, op, &value, &result, sizeof(T),
                            &detail::combine_values<T>, from);
    return result;
#endif
  }

  Granularity granularity_ = Granularity::kThread;
  uint32_t rank_ = 0;
  uint32_t size_ = 1;
  // The CPU group harness's HostGroup for a host group of more than one thread (else null,
  // and always on a GPU).
  void* host_ = nullptr;
};

// What a handler call can reach besides its request and response.
class Context {
 public:
  CARACAL_HOST_DEVICE Context() {}
  CARACAL_HOST_DEVICE Context(Group group, ClientChannel* clients, uint32_t client_count,
                              uint32_t worker)
      : group_(group), clients_(clients), client_count_(client_count), worker_(worker) {}

  CARACAL_INLINE const Group& group() const { return group_; }
  // The client queues this worker owns (client queue c belongs to worker c % workers).
  CARACAL_INLINE uint32_t client_count() const { return client_count_; }
  CARACAL_INLINE ClientChannel& client(uint32_t i) const { return clients_[i]; }
  CARACAL_INLINE uint32_t worker() const { return worker_; }

 private:
  Group group_{};
  ClientChannel* clients_ = nullptr;
  uint32_t client_count_ = 0;
  uint32_t worker_ = 0;
};

// What fault() throws on the CPU (host code only; nvcc's device pass sees the declaration). The
// CPU accelerator does not turn it into an error reply, as it does other exceptions: the worker
// stops serving and the accelerator reports the fault.
class HandlerFault : public std::runtime_error {
 public:
  explicit HandlerFault(const std::string& what) : std::runtime_error(what) {}
};

// The handler cannot go on (its state is broken): the accelerator stops serving, as a kernel
// that faults does. On a GPU this is __trap(): the kernel fails and the CUDA context is
// poisoned; on the CPU the worker that calls it returns, its request unanswered. Either way the
// accelerator reports the failure (ServingAccelerator::health) and the agent leaves the server
// without bye, so that the server fails the requests in flight to it at once, and exits 1 with
// the error.
CARACAL_INLINE void fault([[maybe_unused]] const char* what) {
#if defined(__CUDA_ARCH__)
  __trap();
#else
  throw HandlerFault(what);
#endif
}

template <class H>
concept MessageHandler = requires(H& h, const Request& rq, Response& rs, Context& c) {
  h(rq, rs, c);
};
template <class H>
concept BatchHandler = requires(H& h, const Request* rq, Response* rs, uint32_t n, Context& c) {
  h(rq, rs, n, c);
};

template <class H>
constexpr Granularity granularity_of() {
  if constexpr (requires { H::kGranularity; }) {
    return H::kGranularity;
  } else {
    return Granularity::kThread;
  }
}

template <class H>
constexpr uint32_t batch_of() {
  if constexpr (requires { H::kBatch; }) {
    static_assert(H::kBatch >= 1, "kBatch must be at least 1");
    return H::kBatch;
  } else {
    return 1;
  }
}

// The reply size to reserve for this handler in a region with `max_message_bytes`.
template <class H>
constexpr uint32_t max_response_of(uint32_t max_message_bytes) {
  if constexpr (requires { H::kMaxResponseBytes; }) {
    return H::kMaxResponseBytes < max_message_bytes ? H::kMaxResponseBytes : max_message_bytes;
  } else {
    return max_message_bytes;
  }
}

// An overlapped handler (overlap.hpp: kInFlight, start() and finish()); the accelerators check
// the rest of its shape (OverlappedHandler).
template <class H>
concept DeclaresInFlight = requires {
  H::kInFlight;
};

template <class H>
concept Handler = (batch_of<H>() == 1 && MessageHandler<H>) ||
                  (batch_of<H>() > 1 && BatchHandler<H>) || DeclaresInFlight<H>;

}  // namespace caracal::accel
