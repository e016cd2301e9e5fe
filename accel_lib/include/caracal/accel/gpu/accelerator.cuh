// The GPU accelerator: the same handler types as the CPU backend, run by a persistent CUDA
// kernel that polls the region's queues. A handler source that includes this header is compiled
// by nvcc (caracal_add_handler does that where CUDA is present).
//
// Workers. One worker is a thread, a warp or a block, as the handler's kGranularity says, and
// owns server queues q with q % workers == w and client queues c with c % workers == w, so
// every ring side has exactly one owner. The worker's leader (rank 0) alone touches ring state:
// it polls RX, reserves TX, commits and publishes. The group learns what to do through a
// mailbox (shared memory for warps and blocks) between barriers, runs the handler together,
// and the leader commits the reply. A batched handler (kBatch > 1) gets up to kBatch requests
// of one queue at once; its replies go to per-worker staging in device memory, and the group
// copies them into the TX ring after the call.
//
// An overlapped handler (kInFlight, overlap.hpp) runs serve_overlapped instead, the loop the
// CPU runs too: the group follows its leader through a box in the mailbox's memory, and the
// worker's open requests live in a table in device memory that outlives the launch.
//
// Memory ordering. Every index is read with a system-scope acquire and published with a
// system-scope release (mqueue/platform.hpp): the peer is another processor (the CPU through a
// mapping, or a NIC's DMA). Payload bytes written by any thread of a group before the group's
// barrier are ordered before the leader's release of the tail: the barrier orders them before
// the leader's subsequent operations at block scope, and the PTX memory model's release is
// cumulative over what the releasing thread has observed that way. Likewise the leader's
// acquire of an RX tail, then the barrier, orders every thread's reads of that payload after it.
//
// With RX lines (mqueue/layout.hpp) warps and blocks poll the next entry's line (relaxed, each
// word checked by its own flag) and the tail with it. When the payload is longer than the line
// holds, or the burst goes on by the tail, the leader's system-scope acquire fence in
// RingConsumer::next, then the barrier, order every thread's reads of the slots after them.
//
// Publishing. A burst ends with one system-scope release fence, then relaxed stores of the TX
// tail and the RX head (RingProducer/RingConsumer::publish_after_fence).
//
// With TX lines, a warp or block with a single-request handler has it write its reply into the
// worker's staging in device memory; the group then announces a reply of up to
// kLineInlineBytes in its line (a word a lane, relaxed: each word carries its own flag) and
// copies the reply into its slots, both before the burst's fence. The server takes the reply
// from the line as soon as it lands, where the tail would wait for the fence (mqueue/layout.hpp).
//
// Polling and stopping. A worker that finds nothing spins busy_polls rounds, then sleeps with
// __nanosleep between rounds, doubling up to idle_sleep_max_ns, so an idle service stops
// reading across PCIe at full rate. The stop word is read every kStopCheckRounds rounds when
// busy and every kSleepingStopCheckRounds rounds when sleeping (so a stop is seen within
// kSleepingStopCheckRounds longest sleeps); client calls check it while they wait. It is not
// read every round: every idle worker reading the one shared word across PCIe slows the busy
// workers' reads, with idle queues next to a busy one (bench/results/EXPERIMENTS.md,
// rx-lines-h200). stop() raises it and waits (bounded) for the kernel to return.
#pragma once

#if !defined(__CUDACC__)
#error "caracal/accel/gpu/accelerator.cuh is device code: compile the handler source with nvcc"
#endif

#include <cuda_runtime.h>
#include <cuda/atomic>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/client.hpp"
#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/accel/gpu/launch.hpp"
#include "caracal/accel/gpu/options.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/accel/overlap.hpp"
#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/ring.hpp"

namespace caracal::accel::gpu {

namespace detail {

inline constexpr uint32_t kStopCheckRounds = 1024;
inline constexpr uint32_t kSleepingStopCheckRounds = 64;
inline constexpr uint32_t kFirstSleepNs = 32;

enum : uint32_t { kStepIdle = 0, kStepServe = 1, kStepExit = 2 };

// How much of the first RX slot of a burst a warp or block copies in one go (header and
// payload together), so that a small request costs one read across PCIe after the tail rather
// than two (the header, then the payload the header describes).
inline constexpr uint32_t kSlotImageBytes = 256;

static_assert(mqueue::kLineDataBytes <= kSlotImageBytes);

// The leader's word to its group before each step.
struct Mailbox {
  uint32_t step;
  uint32_t count;  // requests in this batch
  Request req;     // single-request handlers
  std::byte* out;  // where the reply goes
  // The first unread RX slot of the burst and how many of its bytes to copy into `image`
  // (warp- and block-granular workers; 0: nothing published).
  const std::byte* image_from;
  uint32_t image_bytes;
  // With RX lines instead: the next entry's line and the flag its words carry once written
  // (nullptr: the queue is stopped). The group decodes the line into `image`.
  const uint64_t* line;
  uint32_t line_flag;
  // With TX lines: the committed reply's header, and its line (nullptr: too long for one) with
  // the flag its words carry.
  uint64_t* tx_line;
  uint32_t tx_flag;
  mqueue::SlotHeader reply;
  alignas(16) std::byte image[kSlotImageBytes];
};

// Who a thread is, per granularity.
template <Granularity G>
struct Lanes;
template <>
struct Lanes<Granularity::kThread> {
  __device__ static uint32_t worker() { return blockIdx.x * blockDim.x + threadIdx.x; }
  __device__ static uint32_t rank() { return 0; }
  __device__ static uint32_t size() { return 1; }
  __device__ static uint32_t mailbox() { return 0; }
  __device__ static void sync() {}
};
template <>
struct Lanes<Granularity::kWarp> {
  __device__ static uint32_t worker() { return (blockIdx.x * blockDim.x + threadIdx.x) / 32; }
  __device__ static uint32_t rank() { return threadIdx.x % 32; }
  __device__ static uint32_t size() { return 32; }
  __device__ static uint32_t mailbox() { return threadIdx.x / 32; }
  __device__ static void sync() { __syncwarp(); }
  __device__ static bool all(bool v) { return __all_sync(0xffffffffu, v); }
};
template <>
struct Lanes<Granularity::kBlock> {
  __device__ static uint32_t worker() { return blockIdx.x; }
  __device__ static uint32_t rank() { return threadIdx.x; }
  __device__ static uint32_t size() { return blockDim.x; }
  __device__ static uint32_t mailbox() { return 0; }
  __device__ static void sync() { __syncthreads(); }
  __device__ static bool all(bool v) { return __syncthreads_and(v) != 0; }
};

// The leader's running totals, written to the worker's counters when they change.
struct LeaderTotals {
  uint64_t requests = 0;
  uint64_t handler_errors = 0;
  uint64_t reply_ring_full = 0;
  uint64_t corrupt_entries = 0;
  uint64_t stale_replies = 0;
  uint64_t written = 0;  // sum of the above at the last flush

  __device__ void add(const overlap::Counts& c) {
    requests += c.requests;
    handler_errors += c.handler_errors;
    reply_ring_full += c.reply_ring_full;
    corrupt_entries += c.corrupt_entries;
    stale_replies += c.stale_replies;
  }

  __device__ void flush(WorkerCounters& c) {
    const uint64_t sum =
        requests + handler_errors + reply_ring_full + corrupt_entries + stale_replies;
    if (sum == written) return;
    written = sum;
    // Relaxed: reporting only; the host reads each word relaxed.
    using Ref = cuda::atomic_ref<uint64_t, cuda::thread_scope_system>;
    Ref(c.requests).store(requests, cuda::std::memory_order_relaxed);
    Ref(c.handler_errors).store(handler_errors, cuda::std::memory_order_relaxed);
    Ref(c.reply_ring_full).store(reply_ring_full, cuda::std::memory_order_relaxed);
    Ref(c.corrupt_entries).store(corrupt_entries, cuda::std::memory_order_relaxed);
    Ref(c.stale_replies).store(stale_replies, cuda::std::memory_order_relaxed);
  }
};

__device__ inline void overrun_error(Response& resp, LeaderTotals& tally) {
  ++tally.handler_errors;
  resp.size = 0;
  resp.flags = 0;
  resp.set_error("handler response overran its buffer");
}

// With TX lines: a group's reply, written by the handler into `stage`, goes out from there. Lane
// k < kLineWords stores word k of the reply's line (the header from the mailbox, then the
// payload, zero-padded) when it has one, and then the group copies the payload into its slots.
// The line's words go out first: they are what the server waits for.
template <class L>
__device__ void announce_reply(const Mailbox* box, const std::byte* stage, std::byte* out,
                               const Group& group) {
  const uint32_t length = box->reply.length;
  uint64_t* line = box->tx_line;
  const uint32_t k = L::rank();
  if (line != nullptr && k < mqueue::kLineWords) {
    constexpr uint32_t kHeaderWords = mqueue::kSlotHeaderBytes / 4;
    uint32_t d = 0;
    if (k < kHeaderWords) {
      // From the mailbox in place: a copy in registers indexed by lane would go to local memory.
      memcpy(&d, reinterpret_cast<const std::byte*>(&box->reply) + 4 * k, 4);
    } else if (const uint32_t at = 4 * (k - kHeaderWords); at < length) {
      memcpy(&d, stage + at, 4);  // staging is 16-byte aligned
      const uint32_t valid = length - at;
      if (valid < 4) d &= (1u << (8 * valid)) - 1;
    }
    mqueue::store_relaxed(line + k, mqueue::line_word(box->tx_flag, d));
  }
  group_copy(group, out, stage, length);
}

// One worker's share of a queue with a single-request handler: up to `burst` requests, replies
// written in place in the TX ring, then one publish of TX and one of RX. Every thread of the
// group calls it; the returned count is meaningful in the leader.
//
// The tail is read once, at the start of the burst; the burst serves the entries it covers. A
// warp or block then copies the first slot (kSlotImageBytes at most) with all its lanes at once
// and the leader parses the entry from that copy, so a request that fits is answered after one
// read of the tail and one of its slot.
//
// With RX lines (mqueue/layout.hpp) a warp or block reads the next entry's line instead, a word
// a lane, and decodes it into the image when every word carries the entry's flag: one read
// across PCIe finds the entry and, up to kLineInlineBytes, delivers it. The leader loads the
// tail in the same round trip; when it covers more entries, the burst goes on through the ring
// as above, after one acquire fence.
//
// `stage` (TX lines, warps and blocks): where the handler writes its reply (announce_reply);
// nullptr: straight into the TX ring.
template <class H, class L>
__device__ uint32_t serve_queue(const KernelArgs& a, QueueState& qs, uint32_t q, H& handler,
                                Context& ctx, Mailbox* box, bool leader, LeaderTotals& tally,
                                std::byte* stage) {
  constexpr bool kImage = granularity_of<H>() != Granularity::kThread;
  const std::byte* image = nullptr;
  uint32_t image_bytes = 0;
  bool image_is_line = false;
  if constexpr (kImage) {
    if (leader) {
      box->line = nullptr;
      box->image_bytes = 0;
      if (qs.stopped == 0 && qs.rx.has_lines()) {
        const mqueue::LineRef<const uint64_t> line = qs.rx.next_entry_line();
        box->line = line.words;
        box->line_flag = line.flag;
      } else if (qs.stopped == 0) {
        uint32_t slots = 0;
        box->image_from = qs.rx.peek(slots);
        const uint32_t bytes = slots * qs.rx.geometry().slot_bytes;
        box->image_bytes = bytes < kSlotImageBytes ? bytes : kSlotImageBytes;
      }
    }
    L::sync();
    const uint64_t* line = box->line;
    if (line != nullptr) {
      const uint32_t flag = box->line_flag;
      // A word a lane (warps have 32 lanes, blocks at least 32 threads), relaxed, so the loads
      // go out together; the leader's next() fences before a payload that is not in the image
      // is read from the slots. The leader loads the tail too, before any of the words is used,
      // so that it travels in the same round trip: it tells the burst whether entries follow
      // (RingConsumer::load_tail_hint).
      static_assert(mqueue::kLineWords == 32);
      const uint32_t k = L::rank();
      const bool mine = k < mqueue::kLineWords;
      const uint64_t w = mine ? mqueue::load_relaxed(line + k) : mqueue::line_word(flag, 0);
      if (leader) qs.rx.load_tail_hint();
      bool whole = mqueue::line_word_flag(w) == flag;
      if (mine) {
        // The image is 16-byte aligned.
        *reinterpret_cast<uint32_t*>(box->image + 4 * k) = mqueue::line_word_data(w);
      }
      // The vote, then a barrier (a warp's vote orders no memory): the image is complete.
      whole = L::all(whole);
      L::sync();
      if (!whole) return 0;
      image_bytes = mqueue::kLineDataBytes;
      image_is_line = true;
    } else {
      image_bytes = box->image_bytes;
      if (image_bytes == 0) {
        L::sync();  // everyone has read the mailbox before the leader writes it again
        return 0;
      }
      // Ordered after the leader's acquire of the tail by the barrier (see the top of the file).
      group_copy(ctx.group(), box->image, box->image_from, image_bytes);
      L::sync();  // the copy is complete
    }
    image = box->image;
  }
  uint32_t n = 0;
  for (;;) {
    if (leader) {
      box->step = kStepIdle;
      if (n < a.burst && qs.stopped == 0) {
        mqueue::Entry e;
        const bool first = n == 0;
        const mqueue::PollResult r = qs.rx.next(e, first && !kImage, first ? image : nullptr);
        if (r == mqueue::PollResult::kReady) {
          std::byte* out = qs.tx.reserve(a.max_response);
          if (out == nullptr) {
            qs.rx.unread();  // no room for the reply: leave the request for a later round
            ++tally.reply_ring_full;
          } else {
            // The copy serves as the payload when the whole request is in it.
            const std::byte* payload = e.payload;
            const bool in_image = image_is_line
                                      ? e.length <= mqueue::kLineInlineBytes
                                      : e.payload == box->image_from + mqueue::kSlotHeaderBytes;
            if (first && image != nullptr && in_image &&
                mqueue::kSlotHeaderBytes + e.length <= image_bytes) {
              payload = image + mqueue::kSlotHeaderBytes;
            }
            box->step = kStepServe;
            box->req = Request{payload, e.length, q, e.token};
            box->out = out;
          }
        } else if (r == mqueue::PollResult::kCorrupt) {
          qs.stopped = 1;
          ++tally.corrupt_entries;
        }
      }
    }
    L::sync();
    const bool serve = box->step == kStepServe;
    Request req{};
    std::byte* out = nullptr;
    if (serve) {
      req = box->req;
      out = box->out;
    }
    L::sync();  // everyone has read the mailbox before the leader writes it again
    if (!serve) break;
    Response resp{stage != nullptr ? stage : out, a.max_response, 0, 0};
    handler(req, resp, ctx);
    L::sync();  // every thread's reply bytes are written
    if (leader) {
      if (resp.size > resp.capacity) overrun_error(resp, tally);
      qs.tx.commit(resp.size, req.token, resp.flags);
      qs.rx.release();
      ++n;
      if (stage != nullptr) {
        const mqueue::LineRef<uint64_t> line = qs.tx.committed_entry_line();
        box->tx_line = line.words;
        box->tx_flag = line.flag;
        box->reply = qs.tx.committed_header();
      }
    }
    if constexpr (kImage) {
      if (stage != nullptr) {
        L::sync();  // the mailbox has the reply's header and line, staging the error text
        announce_reply<L>(box, stage, out, ctx.group());
        L::sync();  // staging is copied out before the next handler writes it
      }
    }
  }
  if (leader && n != 0) {
    // One system-scope fence orders the replies' bytes and headers, and the reads of the
    // requests, before both index stores: a fence waits for the writes before it to reach
    // across PCIe, and two release stores would pay that wait twice.
    mqueue::fence_release();
    qs.tx.publish_after_fence();
    qs.rx.publish_after_fence();
    tally.requests += n;
  }
  return n;
}

// The same with a batched handler: up to kBatch requests per call, as many as the TX ring is
// sure to have room for (k replies of up to max_response each, whatever skip marker the ring's
// end forces: (k + 1) * per_reply - 1 slots).
template <class H, class L>
__device__ uint32_t serve_batches(const KernelArgs& a, QueueState& qs, uint32_t q, uint32_t w,
                                  H& handler, Context& ctx, Mailbox* box, bool leader,
                                  LeaderTotals& tally) {
  constexpr uint32_t kBatch = batch_of<H>();
  Request* reqs = a.batch_requests + size_t{w} * kBatch;
  std::byte** outs = a.batch_out + size_t{w} * kBatch;
  uint32_t* sizes = a.batch_sizes + size_t{w} * kBatch;
  std::byte* staging = a.staging + size_t{w} * kBatch * a.staging_stride;
  uint32_t total = 0;
  for (;;) {
    if (leader) {
      uint32_t k = 0;
      if (total < a.burst && qs.stopped == 0) {
        const uint32_t per_reply = mqueue::slots_for(a.max_response, qs.tx.geometry().slot_bytes);
        uint32_t room = qs.tx.credits();
        if (room < 2 * per_reply - 1) {
          qs.tx.refresh_credits();
          room = qs.tx.credits();
        }
        mqueue::Entry e;
        while (k < kBatch && (k + 2) * per_reply - 1 <= room) {
          // The tail is read again only for the first request of the burst (RX lines or not:
          // a batch goes by the tail).
          const mqueue::PollResult r = qs.rx.next(e, total == 0 && k == 0);
          if (r == mqueue::PollResult::kEmpty) break;
          if (r == mqueue::PollResult::kCorrupt) {
            qs.stopped = 1;
            ++tally.corrupt_entries;
            break;
          }
          reqs[k] = Request{e.payload, e.length, q, e.token};
          ++k;
        }
        if (k == 0 && room < 2 * per_reply - 1) ++tally.reply_ring_full;
      }
      box->count = k;
    }
    L::sync();
    const uint32_t k = box->count;
    L::sync();
    if (k == 0) break;
    Response resps[kBatch];
    for (uint32_t i = 0; i < k; ++i) {
      resps[i] = Response{staging + size_t{i} * a.staging_stride, a.max_response, 0, 0};
    }
    handler(static_cast<const Request*>(reqs), resps, k, ctx);
    L::sync();  // staging holds every reply
    if (leader) {
      for (uint32_t i = 0; i < k; ++i) {
        if (resps[i].size > resps[i].capacity) overrun_error(resps[i], tally);
        outs[i] = qs.tx.reserve(resps[i].size);  // room was checked above
        qs.tx.commit(resps[i].size, reqs[i].token, resps[i].flags);
        sizes[i] = resps[i].size;
      }
      qs.rx.release();
    }
    L::sync();
    const Group group(granularity_of<H>(), L::rank(), L::size());
    for (uint32_t i = 0; i < k; ++i) {
      group_copy(group, outs[i], staging + size_t{i} * a.staging_stride, sizes[i]);
    }
    L::sync();  // the copies are done before the leader publishes or reuses staging
    if (leader) total += k;
  }
  if (leader && total != 0) {
    mqueue::fence_release();  // as in serve_queue
    qs.tx.publish_after_fence();
    qs.rx.publish_after_fence();
    tally.requests += total;
  }
  return total;
}

// Runs an overlapped handler's phases on the device (no exceptions: start() never fails).
template <class H>
struct DeviceOverlapInvoke {
  __device__ bool start(H& h, const Request& req, typename H::Pending& p, Calls& calls,
                        Context& ctx, uint32_t) {
    h.start(req, p, calls, ctx);
    return true;
  }
  __device__ void finish(H& h, const Request& req, typename H::Pending& p, const Replies& replies,
                         Response& resp, Context& ctx) {
    h.finish(req, p, replies, resp, ctx);
  }
  __device__ void failed(Response& resp, uint32_t) { resp.set_error("handler start failed"); }
};

// One overlapped round of worker `w` (serve_overlapped); returns its work in the leader, and
// counts a round with requests open as work, so that the worker does not sleep on them.
template <class H, class L>
__device__ uint32_t serve_overlapped_round(const KernelArgs& a, uint32_t w, H& handler,
                                           Context& ctx, Mailbox* box, bool leader,
                                           LeaderTotals& tally, uint32_t server_queues) {
  auto& table = reinterpret_cast<overlap::Table<H>*>(a.overlap_tables)[w];
  uint32_t own = 0;
  for (uint32_t q = w; q < server_queues; q += a.workers)
    ++own;
  const overlap::Worker<QueueState> worker{a.queues + w,
                                           a.workers,
                                           own,
                                           w,
                                           a.workers,
                                           ctx.client_count() == 0 ? nullptr : &ctx.client(0),
                                           ctx.client_count(),
                                           a.burst,
                                           a.max_response,
                                           false};
  DeviceOverlapInvoke<H> invoke;
  overlap::Counts counts;
  bool open = false;
  // The box lives in the mailbox's memory: one group step at a time uses either.
  const uint32_t work = serve_overlapped<H, L>(
      table, worker, handler, ctx, reinterpret_cast<overlap::Box*>(box), leader, invoke,
      a.channel_stopped + size_t{w} * a.channels_per_worker, counts, open);
  if (!leader) return 0;
  tally.add(counts);
  return work != 0 || open ? 1 : 0;
}

// One extern declaration of the dynamic shared memory for every instantiation.
extern __shared__ __align__(16) unsigned char mailbox_memory[];

template <class H>
__global__ void serve_kernel(KernelArgs a, H prototype) {
  constexpr Granularity kG = granularity_of<H>();
  using L = Lanes<kG>;
  const uint32_t w = L::worker();
  if (w >= a.workers) return;  // whole warps or blocks past the last worker: nothing to own
  const bool leader = L::rank() == 0;
  Mailbox own{};
  Mailbox* box =
      kG == Granularity::kThread ? &own : reinterpret_cast<Mailbox*>(mailbox_memory) + L::mailbox();

  const mqueue::RegionView region(a.region);
  const uint32_t server_queues = region.server_queue_count();
  const uint32_t client_queues = region.client_queue_count();
  ClientChannel* channels = a.channels + size_t{w} * a.channels_per_worker;
  uint32_t channel_count = 0;
  for (uint32_t c = w; c < client_queues; c += a.workers)
    ++channel_count;
  if (leader) {
    // Ring state starts from the indexes in the region, so a restarted kernel resumes where the
    // last one published.
    for (uint32_t q = w; q < server_queues; q += a.workers) {
      a.queues[q] = QueueState{region.rx_consumer(q), region.tx_producer(q), 0, 0};
    }
    for (uint32_t c = w, i = 0; c < client_queues; c += a.workers, ++i) {
      channels[i] = ClientChannel(region, c);
    }
    if constexpr (DeclaresInFlight<H>) {
      // Requests left open by an earlier launch are read again from the rings.
      reinterpret_cast<overlap::Table<H>*>(a.overlap_tables)[w].reset();
    }
  }
  L::sync();

  // With TX lines, warps and blocks stage single replies (announce_reply).
  std::byte* const stage = kG != Granularity::kThread && batch_of<H>() == 1 && a.staging != nullptr
                               ? a.staging + size_t{w} * a.staging_stride
                               : nullptr;
  H handler = prototype;  // every thread its own copy
  Context ctx(Group(kG, L::rank(), L::size()), channels, channel_count, w);
  LeaderTotals tally;
  uint32_t rounds = 0;
  uint32_t idle = 0;
  uint32_t sleep_ns = 0;
  for (;;) {
    uint32_t served = 0;
    if constexpr (DeclaresInFlight<H>) {
      served = serve_overlapped_round<H, L>(a, w, handler, ctx, box, leader, tally, server_queues);
    } else {
      for (uint32_t q = w; q < server_queues; q += a.workers) {
        // The leader works on a copy of the ring state in registers and writes it back: in
        // device memory each of its steps would be a dependent load.
        QueueState qs;
        if (leader) qs = a.queues[q];
        if constexpr (batch_of<H>() == 1) {
          served += serve_queue<H, L>(a, qs, q, handler, ctx, box, leader, tally, stage);
        } else {
          served += serve_batches<H, L>(a, qs, q, w, handler, ctx, box, leader, tally);
        }
        if (leader) a.queues[q] = qs;
      }
    }
    if (leader) {
      ++rounds;
      // Counters go out when idle or every kStopCheckRounds rounds: writes across PCIe right
      // before the next publish would make its fence wait for them.
      if (served == 0 || rounds % kStopCheckRounds == 0) tally.flush(a.counters[w]);
      if (served != 0) {
        idle = 0;
        sleep_ns = 0;
      } else if (idle <= a.busy_polls) {
        ++idle;
      }
      const bool sleeping = served == 0 && idle > a.busy_polls;
      const bool stop = ((sleeping && rounds % kSleepingStopCheckRounds == 0) ||
                         rounds % kStopCheckRounds == 0) &&
                        region.stop_requested();
      box->step = stop ? kStepExit : kStepServe;
      if (!stop && sleeping) {
        sleep_ns = sleep_ns == 0 ? kFirstSleepNs : sleep_ns * 2;
        if (sleep_ns > a.idle_sleep_max_ns) sleep_ns = a.idle_sleep_max_ns;
        __nanosleep(sleep_ns);
      }
    }
    L::sync();
    const bool exit = box->step == kStepExit;
    L::sync();
    if (exit) break;
  }
  if (leader) tally.flush(a.counters[w]);
}

}  // namespace detail

// The handler-typed part of the accelerator: what H asks of a launch, and the launch itself.
// The rest (memory, stopping, health, counters) is detail::Runtime, compiled once in
// caracal::accel_gpu rather than in every handler.
template <Handler H>
class GpuAccelerator {
  static constexpr bool kOverlapped = DeclaresInFlight<H>;
  static_assert(!kOverlapped || OverlappedHandler<H>,
                "a handler with kInFlight needs a trivially copyable Pending, start() and finish() "
                "(caracal/accel/overlap.hpp)");

 public:
  GpuAccelerator(GpuRegion region, H handler, GpuOptions options = {}, int device = 0)
      : runtime_(region, options, device, needs()), handler_(std::move(handler)) {}
  GpuAccelerator(const GpuAccelerator&) = delete;
  GpuAccelerator& operator=(const GpuAccelerator&) = delete;

  // Launches the persistent kernel. Fails, with nothing left running, when the device cannot
  // hold every worker at once (a worker that is never scheduled would leave its queues unserved).
  Status start() {
    detail::KernelArgs args{};
    CARACAL_RETURN_IF_ERROR(
        runtime_.prepare(reinterpret_cast<const void*>(&detail::serve_kernel<H>), args));
    const detail::LaunchShape& shape = runtime_.shape();
    detail::serve_kernel<H>
        <<<shape.blocks, shape.threads, shape.shared_bytes, runtime_.stream()>>>(args, handler_);
    return runtime_.launched(cudaGetLastError());
  }

  // detail::Runtime says what each does.
  Status stop() { return runtime_.stop(); }
  Status health() { return runtime_.health(); }
  bool running() const { return runtime_.running(); }
  uint32_t workers() const { return runtime_.workers(); }
  WorkerCounters counters(uint32_t worker) const { return runtime_.counters(worker); }
  uint64_t total_requests() const { return runtime_.total_requests(); }
  std::string summary() const { return runtime_.summary(); }

 private:
  static detail::HandlerNeeds needs() {
    detail::HandlerNeeds n;
    n.granularity = granularity_of<H>();
    if constexpr (requires { H::kBlockThreads; }) n.block_threads = H::kBlockThreads;
    n.batch = batch_of<H>();
    if constexpr (requires { H::kMaxResponseBytes; }) n.max_response_bytes = H::kMaxResponseBytes;
    n.mailbox_bytes = sizeof(detail::Mailbox);
    if constexpr (kOverlapped) n.overlap_table_bytes = sizeof(overlap::Table<H>);
    return n;
  }

  detail::Runtime runtime_;
  H handler_;
};

}  // namespace caracal::accel::gpu
