// The echo handler: the reply is the request. Host/device code, so the same type runs on
// every accelerator backend.
//
// It also speaks sockperf's side of the conversation, so `sockperf ping-pong` and
// `sockperf throughput` work against it unmodified. A sockperf message starts with a 14-byte
// header: sequence number (8 bytes), flags (2), total length (4), all big-endian; flag 1 marks
// a client message and flag 2 asks for a reply. A message with that header (and its own
// length in it) is answered the way sockperf's server does: with the client flag cleared when
// a reply is asked for, with nothing otherwise. Every other message is echoed as it is.
//
// Faults on purpose, for the tests of what the server does with a bad agent (all off by
// default; the agent's --stall-after, --delay-us and --fault-after set them). Each worker (a
// CPU thread, a GPU warp) counts the requests it served, so "after N" is per worker: with one
// worker per queue, N per queue.
//  - stall_after N: from its N+1-th request on, the worker never answers: the call blocks for
//    good (a CPU thread sleeps, a GPU warp spins on __nanosleep), while the agent runs and
//    heartbeats. Such an agent cannot detach cleanly either: its workers never return, so SIGTERM
//    leaves it waiting (CPU) or failing to stop its kernel (GPU); SIGKILL ends it.
//  - delay_us D: every request waits D microseconds before it is answered (a sleep on the CPU,
//    a spin on the GPU's global timer): a slow agent, with the right answers.
//  - fault_after N: the N+1-th request makes the handler fault (accel::fault(): __trap() on a
//    GPU, a stopped worker on the CPU); the agent reports it and exits 1.
#pragma once

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <chrono>
#include <thread>
#endif

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/platform.hpp"

namespace caracal::examples {

struct SockperfHeader {
  static constexpr uint32_t kBytes = 14;
  static constexpr uint16_t kClient = 1;
  static constexpr uint16_t kPongRequest = 2;
  static constexpr uint16_t kKnownFlags = 7;  // client, pong request, warm-up

  // Whether `data` is a sockperf client message; `flags` receives its flags.
  CARACAL_INLINE static bool parse(const std::byte* data, uint32_t size, uint16_t& flags) {
    if (size < kBytes) return false;
    flags = static_cast<uint16_t>((static_cast<uint32_t>(data[8]) << 8) |
                                  static_cast<uint32_t>(data[9]));
    const uint32_t length =
        (static_cast<uint32_t>(data[10]) << 24) | (static_cast<uint32_t>(data[11]) << 16) |
        (static_cast<uint32_t>(data[12]) << 8) | static_cast<uint32_t>(data[13]);
    return length == size && (flags & ~kKnownFlags) == 0 && (flags & kClient) != 0;
  }
};

// The faults an echo worker plays (see the top of this file). Every thread of a group keeps its
// own copy and sees the same requests, so they all take the same turn.
struct EchoFaults {
  uint32_t stall_after = 0;  // 0: never
  uint32_t delay_us = 0;
  uint32_t fault_after = 0;  // 0: never
  uint64_t served = 0;       // requests this worker has taken

  CARACAL_INLINE bool any() const { return stall_after != 0 || delay_us != 0 || fault_after != 0; }

  // Before the request is answered: stalls, faults or waits as set.
  CARACAL_INLINE void before_answer() {
    ++served;
    if (stall_after != 0 && served > stall_after) stall();
    if (fault_after != 0 && served > fault_after) accel::fault("echo: --fault-after reached");
    if (delay_us != 0) wait_us(delay_us);
  }

  CARACAL_INLINE static void stall() {
    for (;;) {
#if defined(__CUDA_ARCH__)
      __nanosleep(1000000);
#else
      std::this_thread::sleep_for(std::chrono::seconds(1));
#endif
    }
  }

  CARACAL_INLINE static void wait_us(uint32_t us) {
#if defined(__CUDA_ARCH__)
    uint64_t start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (;;) {
      uint64_t now;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - start >= uint64_t{us} * 1000) break;
      __nanosleep(1000);
    }
#else
    std::this_thread::sleep_for(std::chrono::microseconds(us));
#endif
  }
};

struct Echo {
  // On a GPU a warp answers each request: its 32 threads copy 16 bytes each per step. On the
  // CPU a group is one thread whatever the granularity.
  static constexpr accel::Granularity kGranularity = accel::Granularity::kWarp;

  EchoFaults faults;

  CARACAL_HOST_DEVICE void operator()(const accel::Request& req, accel::Response& resp,
                                      accel::Context& ctx) {
    if (faults.any()) faults.before_answer();
    uint16_t flags = 0;
    const bool sockperf = SockperfHeader::parse(req.data, req.size, flags);
    if (sockperf && (flags & SockperfHeader::kPongRequest) == 0) {
      resp.no_reply();  // throughput mode: sockperf's server answers nothing
      return;
    }
    // The runtime sizes the response for the region's largest message, so any request fits;
    // a group splits the copy by rank (on the CPU the group is one thread).
    accel::group_copy(ctx.group(), resp.data, req.data, req.size);
    ctx.group().sync();
    if (sockperf && ctx.group().leader()) {
      resp.data[9] = static_cast<std::byte>(flags & ~SockperfHeader::kClient);  // from the server
    }
    resp.size = req.size;
  }
};

}  // namespace caracal::examples
