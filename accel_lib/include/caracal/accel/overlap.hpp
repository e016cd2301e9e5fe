// Overlapped handlers: a worker keeps many requests open across their client calls, so that a
// handler waiting on a memcached round trip does not hold its queue. Host/device code; the CPU
// and GPU accelerators run the same loop (serve_overlapped) with their own groups of threads.
//
// A handler is overlapped when it declares `kInFlight` (how many requests a worker keeps open
// at once) and two phases instead of a call operator:
//
//   struct Lookup {
//     static constexpr uint32_t kInFlight = 32;  // requests open per worker
//     static constexpr uint32_t kMaxCalls = 1;   // calls one request may make (default 1)
//     struct Pending { uint32_t key; };          // kept for the request between the phases
//     CARACAL_HOST_DEVICE void start(const Request& req, Pending& p, Calls& calls, Context& ctx);
//     CARACAL_HOST_DEVICE void finish(const Request& req, Pending& p, const Replies& replies,
//                                     Response& resp, Context& ctx);
//   };
//
// start() runs when the request is taken: it checks the request, sends its calls through
// `calls` (the group's leader only) and keeps in `p` what finish() needs. It writes no
// response. finish() runs once every call has its reply, or at once when start() made none: it
// gets the replies in call order and writes the response, as a call operator would. Between the
// two the worker takes other requests and finishes others, in the order their replies land.
//
// The runtime keeps, per worker, kInFlight slots of Pending and bookkeeping (in device memory on
// a GPU), and tokens that name the slot and the call, so replies may land in any order. The
// request stays in place in its RX ring until finish() has run (the worker gives back the RX
// slots of the oldest requests once they are answered), and so does every reply until its
// request's finish(): `req.data` and each reply's bytes are valid in both phases, with no copy.
// So a queue's ring capacity bounds what it can have open too: a ring of 512 slots holds 30
// requests of 17 slots each.
//
// Every call gets an outcome. A call that went out gets the destination's reply or, when the
// destination fails or does not answer within its `timeout_ms` (the server's client queue
// configuration), an error reply (kRemoteError): the runtime keeps no clock of its own and
// relies on the server for that. A call that timed out may still have been carried out by
// the destination (at-least-once). A call that could not go out (no such client queue, the
// queue full, too large) gets its status at once and nothing waits for it; a send() past
// kMaxCalls returns false and is not a call at all.
//
// Groups. Both phases run on every thread of the worker's group, as a call operator does
// (handler.hpp); only the leader sends, and `Pending` is shared by the group: on a GPU it is in
// device memory, and what one thread writes to it in start() is visible to every thread of the
// group in finish() (the runtime puts barriers between the phases). Pending must be trivially
// copyable; it is not constructed or destroyed, and start() must set what finish() reads.
//
// On the CPU an exception from start() or finish() becomes the request's error reply, as it
// does from a call operator; fault() stops the worker, its open requests unanswered (the agent
// leaves the server, which fails them).
#pragma once

#include <cstdint>
#include <type_traits>

#include "caracal/accel/client.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/platform.hpp"
#include "caracal/mqueue/ring.hpp"

namespace caracal::accel {

// One call's outcome, as finish() sees it: the reply's bytes (valid during finish()) when
// status is kOk, and for kRemoteError the error text the server sent.
struct CallReply {
  const std::byte* data = nullptr;
  uint32_t length = 0;
  CallStatus status = CallStatus::kOk;
};

// The replies of one request's calls, in the order it made them.
class Replies {
 public:
  CARACAL_HOST_DEVICE Replies(const CallReply* replies, uint32_t count)
      : replies_(replies), count_(count) {}
  CARACAL_INLINE uint32_t count() const { return count_; }
  CARACAL_INLINE const CallReply& operator[](uint32_t i) const { return replies_[i]; }

 private:
  const CallReply* replies_;
  uint32_t count_;
};

template <class H>
constexpr uint32_t in_flight_of() {
  if constexpr (requires { H::kInFlight; }) {
    static_assert(H::kInFlight >= 1 && H::kInFlight <= 4096, "kInFlight must be 1 to 4096");
    return H::kInFlight;
  } else {
    return 0;
  }
}

template <class H>
constexpr uint32_t max_calls_of() {
  if constexpr (requires { H::kMaxCalls; }) {
    static_assert(H::kMaxCalls >= 1 && H::kMaxCalls <= 32, "kMaxCalls must be 1 to 32");
    return H::kMaxCalls;
  } else {
    return 1;
  }
}

namespace overlap {

// A call's token: the request's sequence number (40 bits), its slot (16) and the call (8). A
// reply whose token names no open call (a request given up when a worker stopped, an earlier
// kernel's) is dropped and counted.
inline constexpr uint32_t kCallBits = 8;
inline constexpr uint32_t kSlotBits = 16;
CARACAL_INLINE constexpr uint64_t token_of(uint64_t seq, uint32_t slot, uint32_t call) {
  return (seq << (kCallBits + kSlotBits)) | (uint64_t{slot} << kCallBits) | call;
}
CARACAL_INLINE constexpr uint32_t slot_of(uint64_t token) {
  return static_cast<uint32_t>(token >> kCallBits) & ((1u << kSlotBits) - 1);
}
CARACAL_INLINE constexpr uint32_t call_of(uint64_t token) {
  return static_cast<uint32_t>(token) & ((1u << kCallBits) - 1);
}
CARACAL_INLINE constexpr uint64_t seq_of(uint64_t token) {
  return token >> (kCallBits + kSlotBits);
}
inline constexpr uint64_t kSeqMask = (uint64_t{1} << (64 - kCallBits - kSlotBits)) - 1;

enum : uint32_t { kFree = 0, kWaiting = 1, kReady = 2 };

// The calls of one open request, kept in its slot.
struct CallLog {
  uint32_t made = 0;         // calls made (sent or not)
  uint32_t outstanding = 0;  // sent calls without a reply yet
  uint32_t answered = 0;     // bit k: call k's reply is held in its client ring
  uint32_t pad = 0;
};

}  // namespace overlap

// How start() makes its calls. Only the group's leader calls send().
class Calls {
 public:
  CARACAL_HOST_DEVICE Calls(ClientChannel* channels, uint32_t channel_count, uint64_t seq,
                            uint32_t slot, uint32_t max_calls, overlap::CallLog* log,
                            CallReply* replies, uint32_t* channel_of)
      : channels_(channels),
        channel_count_(channel_count),
        seq_(seq),
        slot_(slot),
        max_calls_(max_calls),
        log_(log),
        replies_(replies),
        channel_of_(channel_of) {}

  // Sends `length` bytes through client queue `client` (as Context::client numbers them) as the
  // request's next call; its outcome is replies[the call's number] in finish(). False when it
  // could not go out; the reply's status then says why (kNoClient, kQueueFull, kTooLarge), and
  // with kMaxCalls made already nothing is recorded.
  CARACAL_INLINE bool send(uint32_t client, const void* data, uint32_t length) {
    if (log_->made >= max_calls_) return false;
    const uint32_t call = log_->made++;
    CallReply& r = replies_[call];
    r = CallReply{nullptr, 0, CallStatus::kOk};
    channel_of_[call] = client;
    if (client >= channel_count_) {
      r.status = CallStatus::kNoClient;
      return false;
    }
    ClientChannel& ch = channels_[client];
    if (length > ch.max_message_bytes()) {
      r.status = CallStatus::kTooLarge;
      return false;
    }
    if (!ch.send(overlap::token_of(seq_, slot_, call), data, length)) {
      r.status = CallStatus::kQueueFull;
      return false;
    }
    ++log_->outstanding;
    return true;
  }
  // Calls made so far.
  CARACAL_INLINE uint32_t count() const { return log_->made; }

 private:
  ClientChannel* channels_;
  uint32_t channel_count_;
  uint64_t seq_;
  uint32_t slot_;
  uint32_t max_calls_;
  overlap::CallLog* log_;
  CallReply* replies_;
  uint32_t* channel_of_;
};

template <class H>
concept OverlappedHandler = in_flight_of<H>()
>= 1 &&
    std::is_trivially_copyable_v<typename H::Pending>&& requires(H& h, const Request& rq,
                                                                 typename H::Pending& p,
                                                                 Calls& calls, const Replies& rp,
                                                                 Response& rs, Context& c) {
  h.start(rq, p, calls, c);
  h.finish(rq, p, rp, rs, c);
};

namespace overlap {

// One open request.
template <class H>
struct Slot {
  static constexpr uint32_t kCalls = max_calls_of<H>();
  uint64_t seq;
  uint32_t state;   // kFree, kWaiting, kReady
  uint32_t queue;   // among the worker's server queues
  uint32_t failed;  // start() failed (CPU: it threw): finish() is not called
  uint32_t pad;
  mqueue::ReadMark rx_mark;  // where the request's RX entry starts
  Request request;
  CallLog log;
  CallReply replies[kCalls];
  uint32_t channel[kCalls];  // the client queue of each call
  mqueue::ReadMark reply_mark[kCalls];
  typename H::Pending pending;
};

// A worker's open requests: its slots, a stack of the free ones and a FIFO of the ready ones.
template <class H>
struct Table {
  static constexpr uint32_t kSlots = in_flight_of<H>();
  uint64_t next_seq;  // kept across restarts of the worker: tokens never repeat
  uint32_t free_count;
  uint32_t ready_head;
  uint32_t ready_count;
  uint32_t open;  // slots not free
  uint32_t free_stack[kSlots];
  uint32_t ready_ring[kSlots];
  Slot<H> slots[kSlots];

  // Every slot free again (a worker starts; requests left open are read again from the rings).
  CARACAL_INLINE void reset() {
    if (next_seq == 0) next_seq = 1;
    free_count = kSlots;
    ready_head = 0;
    ready_count = 0;
    open = 0;
    for (uint32_t i = 0; i < kSlots; ++i) {
      free_stack[i] = kSlots - 1 - i;
      slots[i].state = kFree;
    }
  }
  CARACAL_INLINE void make_ready(uint32_t s) {
    slots[s].state = kReady;
    ready_ring[(ready_head + ready_count) % kSlots] = s;
    ++ready_count;
  }
};

// What the leader tells its group before each step.
enum : uint32_t { kStepNone = 0, kStepStart = 1, kStepFinish = 2 };
struct Box {
  uint32_t step;
  uint32_t slot;
  std::byte* out;
};

// The leader's counts of one round.
struct Counts {
  uint64_t requests = 0;
  uint64_t handler_errors = 0;
  uint64_t reply_ring_full = 0;
  uint64_t corrupt_entries = 0;
  uint64_t stale_replies = 0;
};

// A worker's part of the round: its server queues (queue j at queues[j * queue_step], whose
// index is first_queue + j * queue_stride) and its client queues.
template <class Q>
struct Worker {
  Q* queues;
  uint32_t queue_step;
  uint32_t queue_count;
  uint32_t first_queue;
  uint32_t queue_stride;
  ClientChannel* channels;
  uint32_t channel_count;
  uint32_t burst;         // requests taken from one queue per round
  uint32_t max_response;  // bytes reserved in the TX ring per reply
  bool write_lines;       // announce short replies in TX lines from the leader (host rings)
};

// Replies read from one client queue per round, at most.
inline constexpr uint32_t kRepliesPerRound = 64;

// Phase A (leader): reads the replies that landed and hands each to its slot; a slot whose
// calls are all answered becomes ready. A corrupt client ring stops being read: the calls
// waiting on it are answered kCorrupt. Returns the replies read.
template <class H, class Q>
CARACAL_INLINE uint32_t take_replies(Table<H>& t, const Worker<Q>& w, uint32_t* channel_stopped,
                                     Counts& counts) {
  uint32_t taken = 0;
  for (uint32_t c = 0; c < w.channel_count; ++c) {
    if (channel_stopped[c] != 0) continue;
    ClientChannel& ch = w.channels[c];
    for (uint32_t n = 0; n < kRepliesPerRound; ++n) {
      const mqueue::ReadMark mark = ch.reply_mark();
      mqueue::Entry e;
      const mqueue::PollResult r = ch.next_reply(e);
      if (r == mqueue::PollResult::kEmpty) break;
      if (r == mqueue::PollResult::kCorrupt) {
        channel_stopped[c] = 1;
        ++counts.corrupt_entries;
        for (uint32_t s = 0; s < Table<H>::kSlots; ++s) {
          Slot<H>& slot = t.slots[s];
          if (slot.state != kWaiting) continue;
          for (uint32_t k = 0; k < slot.log.made; ++k) {
            const bool waiting =
                slot.replies[k].status == CallStatus::kOk && (slot.log.answered & (1u << k)) == 0;
            if (slot.channel[k] != c || !waiting) continue;
            slot.replies[k].status = CallStatus::kCorrupt;
            if (--slot.log.outstanding == 0) t.make_ready(s);
          }
        }
        break;
      }
      ++taken;
      const uint32_t s = slot_of(e.token);
      const uint32_t k = call_of(e.token);
      Slot<H>* slot = s < Table<H>::kSlots ? &t.slots[s] : nullptr;
      const bool open = slot != nullptr && slot->state == kWaiting &&
                        slot->seq == seq_of(e.token) && k < slot->log.made &&
                        slot->channel[k] == c && slot->replies[k].status == CallStatus::kOk &&
                        (slot->log.answered & (1u << k)) == 0;
      if (!open) {
        ++counts.stale_replies;  // released with the ring's next release
        continue;
      }
      slot->replies[k] = CallReply{
          e.payload, e.length,
          (e.flags & mqueue::kSlotError) != 0 ? CallStatus::kRemoteError : CallStatus::kOk};
      slot->reply_mark[k] = mark;
      slot->log.answered |= 1u << k;
      if (--slot->log.outstanding == 0) t.make_ready(s);
    }
  }
  return taken;
}

// Phase D (leader): gives back the RX entries of answered requests and the client replies no
// open request holds, each ring up to its oldest entry still held; then one fence and every
// index.
template <class H, class Q>
CARACAL_INLINE void release_and_publish(Table<H>& t, const Worker<Q>& w) {
  for (uint32_t j = 0; j < w.queue_count; ++j) {
    Q& q = w.queues[size_t{j} * w.queue_step];
    if (q.finished == 0) continue;
    bool held = false;
    mqueue::ReadMark oldest{};
    for (uint32_t s = 0; s < Table<H>::kSlots; ++s) {
      const Slot<H>& slot = t.slots[s];
      if (slot.state == kFree || slot.queue != j) continue;
      if (!held || q.rx.distance(slot.rx_mark) < q.rx.distance(oldest)) oldest = slot.rx_mark;
      held = true;
    }
    if (held) {
      q.rx.release_to(oldest);
    } else {
      q.rx.release();
    }
  }
  for (uint32_t c = 0; c < w.channel_count; ++c) {
    ClientChannel& ch = w.channels[c];
    bool held = false;
    mqueue::ReadMark oldest{};
    for (uint32_t s = 0; s < Table<H>::kSlots; ++s) {
      const Slot<H>& slot = t.slots[s];
      if (slot.state == kFree || slot.log.answered == 0) continue;
      for (uint32_t k = 0; k < slot.log.made; ++k) {
        if ((slot.log.answered & (1u << k)) == 0 || slot.channel[k] != c) continue;
        if (!held || ch.reply_distance(slot.reply_mark[k]) < ch.reply_distance(oldest)) {
          oldest = slot.reply_mark[k];
        }
        held = true;
      }
    }
    if (held) {
      ch.release_replies_to(oldest);
    } else {
      ch.release_all_replies();
    }
  }
  // One fence orders the replies' bytes and headers, and every read of the released entries,
  // before the index stores (as the single-request loops do).
  mqueue::fence_release();
  for (uint32_t j = 0; j < w.queue_count; ++j) {
    Q& q = w.queues[size_t{j} * w.queue_step];
    if (q.finished == 0) continue;
    q.finished = 0;
    q.tx.publish_after_fence();
    q.rx.publish_after_fence();
  }
  for (uint32_t c = 0; c < w.channel_count; ++c)
    w.channels[c].publish_replies_after_fence();
}

}  // namespace overlap

// One round of an overlapped worker: take the replies that landed, start new requests (up to
// `burst` per queue while slots are free), finish every ready request, give back and publish.
// Every thread of the group calls it (L: the group's lanes: sync(), as in the accelerators);
// `box` is shared by the group, `table` and the queues' and channels' state are the leader's.
// `invoke` runs the phases (the CPU's catches exceptions). Returns the work done (replies
// read, requests started and finished: 0 for an idle round) in the leader, and whether
// requests are open in `open`.
//
// The lanes and invokers of the CPU are host-only and those of the GPU device-only; each
// instantiation runs only where its types do (CARACAL_EXEC_CHECK_DISABLE tells nvcc so).
CARACAL_EXEC_CHECK_DISABLE
template <class H, class L, class Q, class Invoke>
CARACAL_INLINE uint32_t serve_overlapped(overlap::Table<H>& t, const overlap::Worker<Q>& w,
                                         H& handler, Context& ctx, overlap::Box* box, bool leader,
                                         Invoke& invoke, uint32_t* channel_stopped,
                                         overlap::Counts& counts, bool& open) {
  using overlap::Slot;
  uint32_t work = 0;
  if (leader) work += overlap::take_replies(t, w, channel_stopped, counts);

  // Start: a request a step, the group together.
  bool sent = false;
  for (uint32_t j = 0; j < w.queue_count; ++j) {
    uint32_t taken = 0;
    for (;;) {
      if (leader) {
        box->step = overlap::kStepNone;
        Q& q = w.queues[size_t{j} * w.queue_step];
        if (taken < w.burst && t.free_count != 0 && q.stopped == 0) {
          const mqueue::ReadMark mark = q.rx.mark();
          mqueue::Entry e;
          // The tail is read again only for the queue's first request of the round.
          const mqueue::PollResult r = q.rx.next(e, taken == 0);
          if (r == mqueue::PollResult::kReady) {
            const uint32_t s = t.free_stack[--t.free_count];
            Slot<H>& slot = t.slots[s];
            slot.seq = t.next_seq;
            t.next_seq = (t.next_seq + 1) & overlap::kSeqMask;
            if (t.next_seq == 0) t.next_seq = 1;
            slot.state = overlap::kWaiting;
            slot.queue = j;
            slot.failed = 0;
            slot.rx_mark = mark;
            slot.request =
                Request{e.payload, e.length, w.first_queue + j * w.queue_stride, e.token};
            slot.log = overlap::CallLog{};
            ++t.open;
            box->step = overlap::kStepStart;
            box->slot = s;
          } else if (r == mqueue::PollResult::kCorrupt) {
            q.stopped = 1;
            ++counts.corrupt_entries;
          }
        }
      }
      L::sync();
      const uint32_t step = box->step;
      const uint32_t s = box->slot;
      L::sync();  // everyone has read the box before the leader writes it again
      if (step == overlap::kStepNone) break;
      Slot<H>& slot = t.slots[s];
      Calls calls(w.channels, w.channel_count, slot.seq, s, Slot<H>::kCalls, &slot.log,
                  slot.replies, slot.channel);
      const bool ok = invoke.start(handler, slot.request, slot.pending, calls, ctx, s);
      L::sync();  // Pending and the calls are written
      if (leader) {
        ++taken;
        ++work;
        sent = sent || slot.log.outstanding != 0;
        if (!ok) slot.failed = 1;
        if (!ok || slot.log.outstanding == 0) t.make_ready(s);
      }
    }
  }
  if (leader && sent) {
    for (uint32_t c = 0; c < w.channel_count; ++c)
      w.channels[c].flush();
  }

  // Finish: the ready requests in the order they became ready, while their TX rings have room.
  for (;;) {
    if (leader) {
      box->step = overlap::kStepNone;
      if (t.ready_count != 0) {
        const uint32_t s = t.ready_ring[t.ready_head];
        Q& q = w.queues[size_t{t.slots[s].queue} * w.queue_step];
        std::byte* out = q.tx.reserve(w.max_response);
        if (out == nullptr) {
          ++counts.reply_ring_full;  // the SmartNIC drains it; the next round tries again
        } else {
          t.ready_head = (t.ready_head + 1) % overlap::Table<H>::kSlots;
          --t.ready_count;
          box->step = overlap::kStepFinish;
          box->slot = s;
          box->out = out;
        }
      }
    }
    L::sync();
    const uint32_t step = box->step;
    const uint32_t s = box->slot;
    std::byte* out = box->out;
    L::sync();
    if (step == overlap::kStepNone) break;
    Slot<H>& slot = t.slots[s];
    Response resp{out, w.max_response, 0, 0};
    if (slot.failed != 0) {
      if (leader) invoke.failed(resp, s);
    } else {
      invoke.finish(handler, slot.request, slot.pending, Replies(slot.replies, slot.log.made), resp,
                    ctx);
    }
    L::sync();  // every thread's reply bytes are written
    if (leader) {
      if (resp.size > resp.capacity) {
        ++counts.handler_errors;
        resp.size = 0;
        resp.flags = 0;
        resp.set_error("handler response overran its buffer");
      }
      Q& q = w.queues[size_t{slot.queue} * w.queue_step];
      q.tx.commit(resp.size, slot.request.token, resp.flags);
      if (w.write_lines) q.tx.write_line();
      q.finished = 1;
      slot.state = overlap::kFree;
      t.free_stack[t.free_count++] = s;
      --t.open;
      ++counts.requests;
      ++work;
    }
  }
  if (leader) {
    if (work != 0) overlap::release_and_publish(t, w);
    open = t.open != 0;
  }
  return work;
}

}  // namespace caracal::accel
