// caracal_gpu_bench: the GPU accelerator over the `shm` transport, measured the way it is
// deployed: the SmartNIC side is a separate process that never touches CUDA (a forked child,
// driving RemoteRegion<ShmTransport> on the region's memfd mapping), the agent side registers
// the mapping with CUDA and runs the persistent kernel on it.
//
//   floor       a flag ping-pong between that process and a kernel polling a mapped word:
//               the least a round trip across PCIe can take here
//   rtt         one 64-byte request in flight through the rings and the echo handler
//   throughput  rings kept full by several driver threads, for queue counts, handler batch
//               sizes and message sizes, next to the host-to-device copy bandwidth
//
// Every reply is checked (token and length); a wrong or missing one ends the run with an error.
// Writes JSON (and a markdown table) with the GPU, the date and the commit.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/gpu/accelerator.cuh"
#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/mqueue/platform.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "json_writer.hpp"
#include "latency.hpp"
#include "machine_info.hpp"
#include "matvec.hpp"

namespace caracal::bench {
namespace {

using Clock = std::chrono::steady_clock;
using accel::Granularity;

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
}

// --- handlers -------------------------------------------------------------------------------

// The examples' echo (warp-granular, 16-byte copies), optionally batched.
template <uint32_t B>
struct Echo {
  static constexpr Granularity kGranularity = Granularity::kWarp;
  static constexpr uint32_t kBatch = B;
  CARACAL_HOST_DEVICE void operator()(const accel::Request& req, accel::Response& resp,
                                      accel::Context& ctx) const {
    accel::group_copy(ctx.group(), resp.data, req.data, req.size);
    resp.size = req.size;
  }
  CARACAL_HOST_DEVICE void operator()(const accel::Request* reqs, accel::Response* resps,
                                      uint32_t n, accel::Context& ctx) const {
    for (uint32_t i = 0; i < n; ++i) {
      accel::group_copy(ctx.group(), resps[i].data, reqs[i].data, reqs[i].size);
      resps[i].size = reqs[i].size;
    }
  }
};

// The baseline for the copy above: the same 16-byte words, but each thread stores a word before
// it loads the next, so it has one read across PCIe in flight (a copy that does not issue
// several loads per step, as group_copy does).
struct EchoOneWordInFlight {
  static constexpr Granularity kGranularity = Granularity::kWarp;
  __device__ void operator()(const accel::Request& req, accel::Response& resp,
                             accel::Context& ctx) const {
    const auto* src = reinterpret_cast<const uint4*>(req.data);
    auto* dst = reinterpret_cast<uint4*>(resp.data);
    for (uint32_t i = ctx.group().rank(); i < req.size / 16; i += ctx.group().size())
      dst[i] = src[i];
    resp.size = req.size;
  }
};

// Reads the whole request (a warp sums its 16-byte words) and answers 8 bytes: what a handler
// that consumes large requests and returns a small result costs.
template <uint32_t B>
struct Sink {
  static constexpr Granularity kGranularity = Granularity::kWarp;
  static constexpr uint32_t kBatch = B;
  static constexpr uint32_t kMaxResponseBytes = 8;
  __device__ static uint64_t sum(const accel::Request& req, const accel::Group& g) {
    uint64_t s = 0;
    const uint4* words = reinterpret_cast<const uint4*>(req.data);
    for (uint32_t i = g.rank(); i < req.size / 16; i += g.size()) {
      const uint4 w = words[i];
      s += w.x + w.y + w.z + w.w;
    }
    for (int o = 16; o > 0; o /= 2)
      s += __shfl_down_sync(0xffffffffu, s, o);
    return s;
  }
  __device__ void operator()(const accel::Request& req, accel::Response& resp,
                             accel::Context& ctx) const {
    const uint64_t s = sum(req, ctx.group());
    if (ctx.group().leader()) std::memcpy(resp.data, &s, 8);
    resp.size = 8;
  }
  __device__ void operator()(const accel::Request* reqs, accel::Response* resps, uint32_t n,
                             accel::Context& ctx) const {
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t s = sum(reqs[i], ctx.group());
      if (ctx.group().leader()) std::memcpy(resps[i].data, &s, 8);
      resps[i].size = 8;
    }
  }
};

// --- the floor ------------------------------------------------------------------------------

__global__ void flag_responder(uint32_t* ping, uint32_t* pong, uint32_t count) {
  for (uint32_t i = 1; i <= count; ++i) {
    uint32_t spins = 0;
    while (mqueue::load_acquire(ping) != i) {
      if (++spins > (1u << 30)) return;  // the driver is gone
    }
    mqueue::store_release(pong, i);
  }
}

// Steps between the floor and a round trip through the rings, each measured on its own so that
// the round trip's cost can be attributed: a warp of which lane 0 polls `ping` (acquire); then,
// by `kind`: 0 nothing (the floor again, in a warp); 1 one read of 64 B by four lanes at once;
// 2 a 16-byte read by lane 0 and then, dependent on it, the 64 B read; 3 the 64 B read and a
// 64 B write by four lanes; 4 as 3 with one more read of `ping` by lane 0 before the publish.
// Every kind ends with a system-scope release fence and a relaxed store of `pong`, as a burst of
// the accelerator does. The host keeps `data` zero, so the values read change nothing.
__global__ void step_responder(uint32_t* ping, uint32_t* pong, uint4* data, uint32_t count,
                               int kind) {
  const uint32_t lane = threadIdx.x;
  __shared__ uint32_t seen;
  for (uint32_t i = 1; i <= count; ++i) {
    if (lane == 0) {
      uint32_t spins = 0;
      uint32_t v;
      while ((v = mqueue::load_acquire(ping)) != i) {
        if (++spins > (1u << 30)) {
          v = 0;
          break;
        }
      }
      seen = v;
    }
    __syncwarp();
    if (seen != i) return;  // the driver is gone
    uint32_t offset = 0;
    if (kind == 2) {
      __shared__ uint32_t header;
      if (lane == 0) header = data[0].x;
      __syncwarp();
      offset = header;  // zero, but the read below depends on it
    }
    uint4 v{0, 0, 0, 0};
    if (kind >= 1 && lane < 4) v = data[1 + offset + lane];
    if (kind >= 3 && lane < 4) data[8 + lane] = v;
    uint32_t extra = 0;
    if (kind == 4 && lane == 0) extra = mqueue::load_acquire(ping) - i;
    __syncwarp();
    if (lane == 0) {
      mqueue::fence_release();
      mqueue::store_relaxed(pong, i + v.x + extra);
    }
  }
}

// Low-latency lines (the "LL" idea of NCCL's protocol of that name): every 8-byte word carries
// 4 bytes of data and, in its upper half, a 4-byte flag that the writer sets to the round trip's
// number. An aligned 8-byte store (x86) and an aligned 8-byte load (`ld.relaxed.sys.b64`) are
// single-copy atomic, so a reader that sees the flag in a word sees that word's data: a line is
// discovered and read by the same load, with no fence on either side and no dependent read.
inline constexpr uint32_t kLlLineOffset = 1024;   // request line, in the flags mapping
inline constexpr uint32_t kLlReplyOffset = 2048;  // reply line (kind 7)

__device__ inline uint64_t ll_load(uint64_t* w) {
  return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*w).load(
      cuda::std::memory_order_relaxed);
}

// kind 5: a warp polls a 256-byte LL request line (one word a lane) until every lane sees round
// i, then answers like the other steps (fence, flag); 6: the same with a 128-byte line (16
// lanes); 7: 256 bytes in, and the reply is a 256-byte LL line too (no fence); 8: as 5, with a
// 64 B write before the fence (an LL RX ring with a plain TX ring).
//
// 9, 10: as 5, and 11: as 7, with the line's reads overlapped: `kPolls` loads of the line are
// in flight at once, issued a fraction of a round trip apart, and each is re-issued as soon as
// it has been checked. A read across PCIe takes a whole round trip over the bus, so with one
// load in flight a line written just after a load sampled it waits for that load and then a
// whole next one; with four staggered loads it waits for a quarter of that. Whether the GPU
// sends overlapping reads of one address across PCIe, or merges them, is what these steps show.
//
// 12, 13: as 9 and 10, but the driver writes 2 or 4 copies of the line (kLlCopiesOffset) and
// each load in flight reads its own copy: whether reads of different addresses overlap where
// reads of one address do not.
__device__ inline uint32_t ll_polls(int kind) {
  return (kind == 9 || kind == 12) ? 2 : (kind == 10 || kind == 11 || kind == 13) ? 4 : 1;
}
inline constexpr uint32_t kLlCopiesOffset = 4096;  // kinds 12, 13: the line's copies

// `copy_words`: 0, every load reads `line`; 32, load k reads copy k (kinds 12, 13).
template <uint32_t kPolls>
__device__ bool ll_wait(uint64_t* line, uint32_t lane, uint32_t words, uint32_t i, uint64_t& out,
                        uint32_t stagger_ns, uint32_t copy_words) {
  uint64_t w[kPolls];
#pragma unroll
  for (uint32_t k = 0; k < kPolls; ++k) {
    w[k] = lane < words ? ll_load(line + k * copy_words + lane) : uint64_t{i} << 32;
    if (k + 1 < kPolls) __nanosleep(stagger_ns);
  }
  for (uint32_t spins = 0; spins < (1u << 28); ++spins) {
#pragma unroll
    for (uint32_t k = 0; k < kPolls; ++k) {
      if (__all_sync(0xffffffffu, static_cast<uint32_t>(w[k] >> 32) == i)) {
        out = w[k];
        return true;
      }
      w[k] = lane < words ? ll_load(line + k * copy_words + lane) : uint64_t{i} << 32;
    }
  }
  return false;  // the driver is gone
}

__device__ uint32_t g_ll_stage[32];  // kind 15

__global__ void ll_responder(uint32_t* pong, uint64_t* line, uint64_t* reply, uint4* data,
                             uint32_t count, int kind, uint32_t stagger_ns) {
  const uint32_t lane = threadIdx.x;
  const uint32_t words = kind == 6 ? 16 : 32;
  const uint32_t polls = ll_polls(kind);
  const uint32_t copy_words = kind == 12 || kind == 13 ? 32 : 0;
  for (uint32_t i = 1; i <= count; ++i) {
    uint64_t w = 0;
    const bool seen = polls == 1   ? ll_wait<1>(line, lane, words, i, w, 0, 0)
                      : polls == 2 ? ll_wait<2>(line, lane, words, i, w, stagger_ns, copy_words)
                                   : ll_wait<4>(line, lane, words, i, w, stagger_ns, copy_words);
    if (!seen) return;
    const uint32_t value = static_cast<uint32_t>(w);  // the driver writes i into every word
    if (kind == 7 || kind == 11) {
      cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(reply[lane])
          .store((uint64_t{i} << 32) | value, cuda::std::memory_order_relaxed);
      continue;
    }
    if (kind >= 14) {
      // The reply line first, then what a ring publish does: a 64 B write, a fence and a flag.
      uint32_t v = value;
      if (kind == 15) {
        // The line's data staged through device memory first (a neighbour lane's word).
        g_ll_stage[lane] = value;
        __syncwarp();
        v = cuda::atomic_ref<uint32_t, cuda::thread_scope_block>(g_ll_stage[(lane + 1) % 32])
                .load(cuda::std::memory_order_relaxed);
      }
      cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(reply[lane])
          .store((uint64_t{i} << 32) | v, cuda::std::memory_order_relaxed);
      if (kind == 16) (void)ll_load(line + lane);  // a read across PCIe after the stores
      if (lane < 4) data[8 + lane] = uint4{value, value, value, value};
      __syncwarp();
      if (lane == 0) {
        mqueue::fence_release();
        mqueue::store_relaxed(pong, value);
      }
      continue;
    }
    if (kind == 8 && lane < 4) data[8 + lane] = uint4{value, value, value, value};
    __syncwarp();
    if (lane == 0) {
      mqueue::fence_release();
      mqueue::store_relaxed(pong, value);
    }
  }
}

// Shared between the bench and its driver child (MAP_SHARED before the fork).
struct Shared {
  std::atomic<uint32_t> go{0};
  std::atomic<uint32_t> done{0};
  std::atomic<uint64_t> replies{0};
  std::atomic<uint64_t> errors{0};
  char error[256] = {};
  uint64_t samples[1];  // followed by more
};

Shared* map_shared(size_t samples) {
  const size_t bytes = sizeof(Shared) + samples * sizeof(uint64_t);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap of the shared results failed");
  return new (p) Shared();
}

void fail_child(Shared* s, const std::string& why) {
  std::snprintf(s->error, sizeof(s->error), "%s", why.c_str());
  s->errors.fetch_add(1);
}

// Runs `driver` in a child process (which must not touch CUDA) and `accelerator` here; the child
// starts once `go` is raised. Returns the child's error, if any.
std::string run_pair(Shared* shared, const std::function<void()>& driver,
                     const std::function<Status()>& start, const std::function<void()>& stop) {
  const pid_t child = fork();
  if (child < 0) return "fork failed";
  if (child == 0) {
    while (shared->go.load(std::memory_order_acquire) == 0)
      std::this_thread::yield();
    try {
      driver();
    } catch (const std::exception& e) {
      fail_child(shared, e.what());
    }
    shared->done.store(1, std::memory_order_release);
    _exit(0);
  }
  Status s = start();
  if (!s.ok()) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return s.message();
  }
  shared->go.store(1, std::memory_order_release);
  int status = 0;
  waitpid(child, &status, 0);
  stop();
  if (shared->errors.load() != 0) return shared->error;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return "the driver process failed";
  return "";
}

// kind < 0: the flag responder (the floor); 0-4: step_responder of that kind; 5-16: ll_responder
// (9-11 with their loads `stagger_ns` apart at the start).
LatencySummary measure_floor(uint32_t count, int kind = -1, uint32_t stagger_ns = 0) {
  Shared* shared = map_shared(count);
  Result<mqueue::ShmMapping> flags = mqueue::ShmMapping::create_memfd("gpu-bench-flags", 8192);
  if (!flags.ok()) throw std::runtime_error(flags.status().message());
  auto* ping = reinterpret_cast<uint32_t*>(flags->data());
  auto* pong = reinterpret_cast<uint32_t*>(flags->data() + 64);
  accel::gpu::MappedHostRange range;
  accel::gpu::Stream stream;
  const std::string err = run_pair(
      shared,
      [&] {
        auto* line = reinterpret_cast<uint64_t*>(
            flags->data() + (kind == 12 || kind == 13 ? kLlCopiesOffset : kLlLineOffset));
        const uint32_t copies = kind == 12 ? 2 : kind == 13 ? 4 : 1;
        auto* reply = reinterpret_cast<uint64_t*>(flags->data() + kLlReplyOffset);
        const uint32_t words = kind == 6 ? 16 : 32;
        for (uint32_t i = 1; i <= count; ++i) {
          const uint64_t t0 = now_ns();
          if (kind < 5) {
            mqueue::store_release(ping, i);
          } else {
            // Relaxed 8-byte stores: each word carries its own flag, no order between them.
            for (uint32_t c = 0; c < copies; ++c) {
              for (uint32_t w = 0; w < words; ++w)
                std::atomic_ref<uint64_t>(line[c * 32 + w])
                    .store((uint64_t{i} << 32) | i, std::memory_order_relaxed);
            }
          }
          if (kind == 7 || kind == 11 || kind >= 14) {
            for (uint32_t w = 0; w < 32; ++w) {
              while (std::atomic_ref<uint64_t>(reply[w]).load(std::memory_order_relaxed) >> 32 !=
                     i) {
              }
            }
          } else {
            while (mqueue::load_acquire(pong) != i) {
            }
          }
          shared->samples[i - 1] = now_ns() - t0;
          // 14-16: the kernel publishes after the line; the next request waits for it, so that
          // only the line's own latency is timed.
          while (kind >= 14 && mqueue::load_acquire(pong) != i) {
          }
        }
      },
      [&]() -> Status {
        Result<accel::gpu::MappedHostRange> r =
            accel::gpu::MappedHostRange::register_range(flags->data(), flags->size());
        if (!r.ok()) return r.status();
        range = std::move(r).value();
        Result<accel::gpu::Stream> st = accel::gpu::Stream::create("floor");
        if (!st.ok()) return st.status();
        stream = std::move(st).value();
        auto* d_ping = reinterpret_cast<uint32_t*>(range.device());
        auto* d_pong = reinterpret_cast<uint32_t*>(range.device() + 64);
        if (kind < 0) {
          flag_responder<<<1, 1, 0, stream.get()>>>(d_ping, d_pong, count);
        } else if (kind < 5) {
          step_responder<<<1, 32, 0, stream.get()>>>(
              d_ping, d_pong, reinterpret_cast<uint4*>(range.device() + 1024), count, kind);
        } else {
          ll_responder<<<1, 32, 0, stream.get()>>>(
              d_pong,
              reinterpret_cast<uint64_t*>(
                  range.device() + (kind == 12 || kind == 13 ? kLlCopiesOffset : kLlLineOffset)),
              reinterpret_cast<uint64_t*>(range.device() + kLlReplyOffset),
              reinterpret_cast<uint4*>(range.device() + 3072), count, kind, stagger_ns);
        }
        return accel::gpu::cuda_status(cudaGetLastError(), "flag responder");
      },
      [&] { cudaStreamSynchronize(stream.get()); });
  if (!err.empty()) throw std::runtime_error("floor: " + err);
  std::vector<uint64_t> v(shared->samples, shared->samples + count);
  return summarize(v);
}

// --- through the rings ----------------------------------------------------------------------

// --rx-lines: every region of the run announces its RX entries in LL lines
// (mqueue/layout.hpp), which the kernel polls instead of the tails.
bool g_rx_lines = false;
bool g_tx_lines = false;
// --rtt-queues: the latency runs' regions have this many queues, each polled by a worker of its
// own, while the driver uses queue 0 only (what the other queues' polling costs a request).
uint32_t g_rtt_queues = 1;
// --busy-polls: the latency runs' GpuOptions::busy_polls (empty rounds before a worker sleeps).
uint32_t g_busy_polls = accel::GpuOptions{}.busy_polls;
uint32_t g_stagger_ns = 300;  // --stagger-ns

struct RingSetup {
  uint32_t queues = 1;
  uint32_t message = 64;
  uint32_t slot_bytes = 128;
  uint32_t capacity = 1024;
};

mqueue::ShmMapping make_region(const RingSetup& r) {
  mqueue::RegionGeometry g;
  g.server_queue_count = r.queues;
  g.slot_bytes = r.slot_bytes;
  g.ring_capacity = r.capacity;
  g.max_message_bytes = r.message;
  g.rx_lines = g_rx_lines;
  g.tx_lines = g_tx_lines;
  Result<mqueue::ShmMapping> m = mqueue::create_shm_region(g, 1, "gpu-bench");
  if (!m.ok()) throw std::runtime_error(m.status().message());
  return std::move(m).value();
}

// Starts GpuAccelerator<H> on the mapping (registered) for run_pair.
template <class H>
struct GpuSide {
  explicit GpuSide(mqueue::ShmMapping& region) : region_(region) {}
  Status start(const accel::GpuOptions& options = {}) {
    Result<accel::gpu::MappedHostRange> r =
        accel::gpu::MappedHostRange::register_range(region_.data(), region_.size());
    if (!r.ok()) return r.status();
    range_ = std::move(r).value();
    acc_.emplace(accel::gpu::GpuRegion{range_.device(), range_.host()}, H{}, options, 0);
    return acc_->start();
  }
  void stop() {
    if (acc_) (void)acc_->stop();
  }
  mqueue::ShmMapping& region_;
  accel::gpu::MappedHostRange range_;
  std::optional<accel::gpu::GpuAccelerator<H>> acc_;
};

// Round trips of one message at a time through queue 0, answered by H (an echo: the reply must
// have the request's length). `gap_ns`: the driver waits this long (spinning) after each reply
// before it sends the next request, as a server's clients leave the GPU time between requests;
// 0: back to back, where whatever the GPU does after a reply is visible (its publish) delays
// the next request.
template <class H = Echo<1>>
LatencySummary measure_rtt(uint32_t count, uint32_t message, const accel::GpuOptions& options = {},
                           uint64_t gap_ns = 0) {
  RingSetup setup;
  setup.queues = g_rtt_queues;
  setup.message = message;
  setup.slot_bytes = message <= 112 ? 128 : 2048;
  setup.capacity = 256;
  mqueue::ShmMapping region = make_region(setup);
  Shared* shared = map_shared(count);
  GpuSide<H> gpu(region);
  const std::string err = run_pair(
      shared,
      [&] {
        mqueue::ShmTransport t(region.data(), region.size());
        auto remote = mqueue::RemoteRegion<mqueue::ShmTransport>::attach(&t);
        if (!remote.ok()) throw std::runtime_error(remote.status().message());
        std::vector<std::byte> payload(message, std::byte{0x5a});
        auto& rx = remote->rx(0);
        auto& tx = remote->tx(0);
        const uint32_t warmup = count / 10;
        for (uint32_t i = 0; i < count + warmup; ++i) {
          const uint64_t t0 = now_ns();
          if (!rx.push(payload.data(), message, i)) throw std::runtime_error("RX ring full");
          rx.publish();
          mqueue::Entry e;
          for (;;) {
            tx.refresh_tail();
            mqueue::PollResult r = tx.next(e);
            // With TX lines, as snic_server: the reply's line may land before its tail.
            if (r == mqueue::PollResult::kEmpty) {
              r = tx.next_by_line(e);
              if (r == mqueue::PollResult::kReady && i >= warmup) shared->replies.fetch_add(1);
            }
            if (r == mqueue::PollResult::kReady) break;
            if (r == mqueue::PollResult::kCorrupt) throw std::runtime_error("corrupt reply");
          }
          const uint64_t t1 = now_ns();
          if (e.token != i || e.length != message) throw std::runtime_error("wrong reply");
          tx.release();
          tx.publish();
          if (i >= warmup) shared->samples[i - warmup] = t1 - t0;
          while (gap_ns != 0 && now_ns() - t1 < gap_ns) {
          }
        }
      },
      [&] {
        accel::GpuOptions o = options;
        o.busy_polls = g_busy_polls;
        return gpu.start(o);
      },
      [&] { gpu.stop(); });
  if (!err.empty()) throw std::runtime_error("rtt: " + err);
  if (g_tx_lines) {
    std::printf("  (%llu of %u replies taken from their TX lines)\n",
                static_cast<unsigned long long>(shared->replies.load()), count);
  }
  std::vector<uint64_t> v(shared->samples, shared->samples + count);
  return summarize(v);
}

struct ThroughputResult {
  std::string handler;
  uint32_t batch = 1;
  uint32_t queues = 0;
  uint32_t message = 0;
  uint32_t reply = 0;
  uint32_t driver_threads = 0;
  double seconds = 0;
  uint64_t replies = 0;
  double messages_per_s = 0;
  double request_gbytes_per_s = 0;
};

// Keeps every RX ring full from `threads` driver threads (each owns queues q % threads) for
// `seconds`, and counts the replies, checking each one's length and token order.
template <class H>
ThroughputResult measure_throughput(const char* name, uint32_t queues, uint32_t message,
                                    uint32_t reply, double seconds, uint32_t max_threads) {
  RingSetup setup;
  setup.queues = queues;
  setup.message = message;
  setup.slot_bytes = message <= 112 ? 128 : 2048;
  setup.capacity = message <= 112 ? 1024 : 256;
  mqueue::ShmMapping region = make_region(setup);
  Shared* shared = map_shared(1);
  const uint32_t threads = std::min(queues, max_threads);
  GpuSide<H> gpu(region);
  double elapsed = 0;
  const std::string err = run_pair(
      shared,
      [&] {
        std::atomic<bool> stop{false};
        std::atomic<bool> counting{false};
        std::vector<std::thread> pool;
        for (uint32_t t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            try {
              mqueue::ShmTransport tr(region.data(), region.size());
              auto remote = mqueue::RemoteRegion<mqueue::ShmTransport>::attach(&tr);
              if (!remote.ok()) throw std::runtime_error(remote.status().message());
              std::vector<std::byte> payload(message, std::byte{1});
              std::vector<uint64_t> sent(queues, 0), got(queues, 0);
              uint64_t counted = 0;
              while (!stop.load(std::memory_order_relaxed)) {
                for (uint32_t q = t; q < queues; q += threads) {
                  auto& rx = remote->rx(q);
                  while (rx.push(payload.data(), message, sent[q]))
                    ++sent[q];
                  rx.publish();
                  auto& tx = remote->tx(q);
                  tx.refresh_tail();
                  mqueue::Entry e;
                  mqueue::PollResult r;
                  auto next = [&] {
                    const mqueue::PollResult by_tail = tx.next(e);
                    return by_tail == mqueue::PollResult::kEmpty ? tx.next_by_line(e) : by_tail;
                  };
                  while ((r = next()) == mqueue::PollResult::kReady) {
                    if (e.token != got[q] || e.length != reply) {
                      throw std::runtime_error("queue " + std::to_string(q) + ": reply " +
                                               std::to_string(got[q]) + " wrong");
                    }
                    ++got[q];
                    if (counting.load(std::memory_order_relaxed)) ++counted;
                  }
                  if (r == mqueue::PollResult::kCorrupt) throw std::runtime_error("corrupt reply");
                  tx.release();
                  tx.publish();
                }
              }
              shared->replies.fetch_add(counted);
            } catch (const std::exception& e) {
              fail_child(shared, e.what());
              stop.store(true);
            }
          });
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // warm-up
        counting.store(true);
        const auto t0 = Clock::now();
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        counting.store(false);
        const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        stop.store(true);
        for (auto& th : pool)
          th.join();
        shared->samples[0] = static_cast<uint64_t>(secs * 1e9);
      },
      [&] { return gpu.start(); }, [&] { gpu.stop(); });
  if (!err.empty()) throw std::runtime_error(std::string("throughput ") + name + ": " + err);
  elapsed = static_cast<double>(shared->samples[0]) / 1e9;
  ThroughputResult r;
  r.handler = name;
  r.batch = accel::batch_of<H>();
  r.queues = queues;
  r.message = message;
  r.reply = reply;
  r.driver_threads = threads;
  r.seconds = elapsed;
  r.replies = shared->replies.load();
  r.messages_per_s = static_cast<double>(r.replies) / elapsed;
  r.request_gbytes_per_s = r.messages_per_s * message / 1e9;
  return r;
}

// Host-to-device copy bandwidth from pinned memory: the median of several 256 MiB copies.
double h2d_bandwidth_gbytes() {
  const size_t bytes = 256u << 20;
  void* host = nullptr;
  void* dev = nullptr;
  if (cudaHostAlloc(&host, bytes, cudaHostAllocDefault) != cudaSuccess ||
      cudaMalloc(&dev, bytes) != cudaSuccess) {
    throw std::runtime_error("cannot allocate for the copy bandwidth");
  }
  std::memset(host, 1, bytes);
  std::vector<double> rates;
  for (int i = 0; i < 9; ++i) {
    const auto t0 = Clock::now();
    cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i > 0) rates.push_back(bytes / s / 1e9);
  }
  cudaFreeHost(host);
  cudaFree(dev);
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// Prints the median and p99 of `s` on a line of its own, and returns `s`.
const LatencySummary& print_latency(const std::string& what, const LatencySummary& s) {
  std::printf("%s: p50 %.2f us p99 %.2f us\n", what.c_str(), s.p50_ns / 1e3, s.p99_ns / 1e3);
  return s;
}

// The summary as an object, without its minimum (which this report never had).
void write_latency(JsonWriter& j, std::string_view key, const LatencySummary& s) {
  j.begin_object(key);
  write_fields(j, s, false);
  j.end_object();
}

}  // namespace
}  // namespace caracal::bench

int main(int argc, char** argv) {
  using namespace caracal::bench;
  CLI::App app{"caracal_gpu_bench: the GPU accelerator over shm, with its floor and baselines"};
  std::string json_path = "gpu-bench.json";
  std::string md_path = "gpu-bench.md";
  std::string commit = "unknown";
  uint32_t samples = 100000;
  double seconds = 1.0;
  uint32_t max_threads = 14;
  app.add_option("--json", json_path, "JSON report");
  app.add_option("--markdown", md_path, "markdown table");
  app.add_option("--commit", commit, "the commit measured");
  app.add_option("--samples", samples, "round trips per latency measurement");
  app.add_option("--seconds", seconds, "seconds per throughput point");
  app.add_option("--driver-threads", max_threads, "most SmartNIC-side threads");
  bool latency_only = false;
  app.add_flag("--latency-only", latency_only, "only the latency measurements");
  app.add_flag("--rx-lines", g_rx_lines, "regions with RX lines (the kernel polls LL lines)");
  app.add_flag("--tx-lines", g_tx_lines,
               "regions with TX lines (warps announce short replies in LL lines)");
  app.add_option("--busy-polls", g_busy_polls, "GPU workers' empty rounds before they sleep");

  app.add_option("--stagger-ns", g_stagger_ns,
                 "steps 9-11: time between the first overlapping reads of the line");
  app.add_option("--rtt-queues", g_rtt_queues, "queues polled in the latency runs (1 used)")
      ->check(CLI::Range(1u, 1024u));
  CLI11_PARSE(app, argc, argv);

  try {
    const MachineInfo machine = collect_machine_info();
    caracal::Result<caracal::accel::gpu::DeviceInfo> gpu = caracal::accel::gpu::describe_device(0);
    if (!gpu.ok()) {
      std::fprintf(stderr, "no GPU: %s\n", gpu.status().message().c_str());
      return 77;
    }
    std::printf("%s\n", gpu->str().c_str());
    const LatencySummary floor = print_latency("floor", measure_floor(samples));
    const LatencySummary rtt = print_latency("rtt 64 B", measure_rtt(samples, 64));
    caracal::accel::GpuOptions single;
    single.burst = 1;
    const LatencySummary rtt_single =
        print_latency("rtt 64 B, burst 1", measure_rtt(samples, 64, single));
    const LatencySummary rtt_apart =
        print_latency("rtt 64 B, 5 us apart", measure_rtt(samples, 64, {}, 5000));
    static const char* const kStepNames[] = {
        "warp polls the flag (floor in a warp)",
        "+ 64 B read",
        "+ 16 B read, then 64 B read",
        "+ 64 B read, 64 B write",
        "+ 64 B read, 64 B write, flag read again",
        "LL request line of 256 B polled by the warp (no flag read)",
        "LL request line of 128 B",
        "LL request line of 256 B, LL reply line of 256 B (no fence)",
        "LL request line of 256 B, 64 B write",
        "as 5, two reads of the line in flight",
        "as 5, four reads of the line in flight",
        "as 7, four reads of the line in flight",
        "as 5, two reads in flight, each of its own copy of the line",
        "as 5, four reads in flight, each of its own copy of the line",
        "as 7, then a 64 B write, fence and flag (the reply line before a publish)",
        "as 14, the reply line's data staged through device memory",
        "as 14, a read across PCIe right after the reply line"};
    std::vector<LatencySummary> steps;
    for (int k = 0; k < 17; ++k) {
      steps.push_back(print_latency("step " + std::to_string(k) + " (" + kStepNames[k] + ")",
                                    measure_floor(samples, k, g_stagger_ns)));
    }
    // 16 KiB: the copy with several reads in flight per thread, next to one read in flight.
    struct SizedRtt {
      std::string what;
      LatencySummary latency;
    };
    std::vector<SizedRtt> large;
    auto large_rtt = [&](const char* what, const LatencySummary& s) {
      large.push_back({what, print_latency(std::string("rtt 16 KiB, ") + what, s)});
    };
    const uint32_t large_samples = std::max(1000u, samples / 10);
    large_rtt("echo (group_copy)", measure_rtt<Echo<1>>(large_samples, 16384));
    large_rtt("echo, one read in flight per thread",
              measure_rtt<EchoOneWordInFlight>(large_samples, 16384));
    large_rtt("matvec (examples/matvec)",
              measure_rtt<caracal::examples::MatVec>(large_samples, 16384));
    std::fflush(stdout);
    if (latency_only) return 0;
    const double h2d = h2d_bandwidth_gbytes();
    std::printf("host-to-device copy: %.1f GB/s\n", h2d);

    std::vector<ThroughputResult> tp;
    auto run = [&](ThroughputResult r) {
      std::printf("%-5s batch %2u queues %3u %5u B: %7.2f M msg/s %6.2f GB/s (%u threads)\n",
                  r.handler.c_str(), r.batch, r.queues, r.message, r.messages_per_s / 1e6,
                  r.request_gbytes_per_s, r.driver_threads);
      std::fflush(stdout);
      tp.push_back(r);
    };
    for (uint32_t q : {1u, 8u, 32u, 128u}) {
      run(measure_throughput<Echo<1>>("echo", q, 64, 64, seconds, max_threads));
      run(measure_throughput<Echo<8>>("echo", q, 64, 64, seconds, max_threads));
      run(measure_throughput<Echo<32>>("echo", q, 64, 64, seconds, max_threads));
    }
    for (uint32_t q : {8u, 32u, 128u, 256u}) {
      run(measure_throughput<Echo<1>>("echo", q, 1024, 1024, seconds, max_threads));
      run(measure_throughput<Echo<32>>("echo", q, 1024, 1024, seconds, max_threads));
      run(measure_throughput<Sink<1>>("sink", q, 1024, 8, seconds, max_threads));
      run(measure_throughput<Sink<32>>("sink", q, 1024, 8, seconds, max_threads));
    }
    for (uint32_t q : {8u, 32u}) {
      run(measure_throughput<Echo<1>>("echo", q, 16384, 16384, seconds, max_threads));
      run(measure_throughput<EchoOneWordInFlight>("echo, one read in flight", q, 16384, 16384,
                                                  seconds, max_threads));
      run(measure_throughput<Sink<1>>("sink", q, 16384, 8, seconds, max_threads));
      run(measure_throughput<caracal::examples::MatVec>("matvec", q, 16384, 16384, seconds,
                                                        max_threads));
    }

    std::ofstream out(json_path);
    JsonWriter j(out);
    j.begin_object();
    j.field("benchmark", "caracal_gpu_bench");
    j.field("commit", commit);
    j.field("date_utc", machine.date_utc);
    j.field("gpu", gpu->str());
    j.field("cpu", machine.cpu_model);
    j.field("online_cpus", machine.online_cpus);
    j.field("kernel", machine.kernel);
    j.field("transport",
            "shm: memfd region registered with cudaHostRegister(Mapped); SmartNIC side in a "
            "separate process that never touches CUDA");
    j.field("rx_lines", g_rx_lines);
    j.field("tx_lines", g_tx_lines);
    write_latency(j, "floor_flag_pingpong", floor);
    write_latency(j, "rtt_echo_64B", rtt);
    write_latency(j, "rtt_echo_64B_burst_1", rtt_single);
    write_latency(j, "rtt_echo_64B_5us_apart", rtt_apart);
    j.begin_array("steps");
    for (size_t k = 0; k < steps.size(); ++k) {
      j.begin_object();
      j.field("step", kStepNames[k]);
      write_latency(j, "latency", steps[k]);
      j.end_object();
    }
    j.end_array();
    j.begin_array("rtt_16KiB");
    for (const SizedRtt& r : large) {
      j.begin_object();
      j.field("handler", r.what);
      write_latency(j, "latency", r.latency);
      j.end_object();
    }
    j.end_array();
    j.field("rtt_over_floor_p50",
            static_cast<double>(rtt.p50_ns) / static_cast<double>(floor.p50_ns));
    j.field("h2d_copy_gbytes_per_s", h2d);
    j.begin_array("throughput");
    for (const ThroughputResult& r : tp) {
      j.begin_object();
      j.field("handler", r.handler);
      j.field("batch", r.batch);
      j.field("queues", r.queues);
      j.field("request_bytes", r.message);
      j.field("reply_bytes", r.reply);
      j.field("driver_threads", r.driver_threads);
      j.field("seconds", r.seconds);
      j.field("replies", r.replies);
      j.field("messages_per_s", r.messages_per_s);
      j.field("request_gbytes_per_s", r.request_gbytes_per_s);
      j.field("fraction_of_h2d_copy", r.request_gbytes_per_s / h2d);
      j.end_object();
    }
    j.end_array();
    j.end_object();
    out << "\n";

    std::ofstream md(md_path);
    md << "# GPU accelerator over shm: " << gpu->str() << "\n\n";
    md << "Date " << machine.date_utc << ", commit " << commit << ", CPU " << machine.cpu_model
       << " (" << machine.online_cpus << " online). Regions "
       << (g_rx_lines ? "with RX lines (the kernel polls LL lines, not tails)" : "without RX lines")
       << (g_tx_lines ? ", with TX lines (replies announced in LL lines)" : ", without TX lines")
       << ".\n\n";
    md << "| round trip, 64 B | p50 | p90 | p99 | p99.9 |\n| --- | --- | --- | --- | --- |\n";
    auto row = [&](const char* what, const LatencySummary& s) {
      md << "| " << what << " | " << s.p50_ns / 1e3 << " us | " << s.p90_ns / 1e3 << " us | "
         << s.p99_ns / 1e3 << " us | " << s.p999_ns / 1e3 << " us |\n";
    };
    row("floor: flag ping-pong, process to kernel", floor);
    row("Caracal: RX ring, echo kernel, TX ring", rtt);
    row("the same, burst 1", rtt_single);
    row("the same, 5 us between a reply and the next request", rtt_apart);
    for (size_t k = 0; k < steps.size(); ++k)
      row((std::string("step: ") + kStepNames[k]).c_str(), steps[k]);
    md << "\n| round trip, 16 KiB | p50 | p90 | p99 | p99.9 |\n| --- | --- | --- | --- | --- |\n";
    for (const SizedRtt& r : large)
      row(r.what.c_str(), r.latency);
    md << "\nRound trip over floor at p50: " << static_cast<double>(rtt.p50_ns) / floor.p50_ns
       << "x. Host-to-device copy bandwidth (pinned, 256 MiB): " << h2d << " GB/s.\n\n";
    md << "| handler | batch | queues | request B | reply B | driver threads | M msg/s | request "
          "GB/s | of copy bandwidth |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const ThroughputResult& r : tp) {
      md << "| " << r.handler << " | " << r.batch << " | " << r.queues << " | " << r.message
         << " | " << r.reply << " | " << r.driver_threads << " | " << r.messages_per_s / 1e6
         << " | " << r.request_gbytes_per_s << " | " << r.request_gbytes_per_s / h2d << " |\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caracal_gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
