// The CPU accelerator: the same handler types, run by host threads that poll the region's
// server queues. How CI and laptops run everything, and a real backend for hosts without GPUs.
//
// Worker w owns server queues q with q % workers == w and client queues c with
// c % workers == w, so every ring side has exactly one owner thread. A worker serves a burst
// from each queue it owns, then publishes its TX tail and its RX head once for the burst.
// When a reply ring is full it stops taking requests from that queue (backpressure reaches the
// SmartNIC as RX credits it does not get back) until the SmartNIC drains it.
//
// An overlapped handler (kInFlight, overlap.hpp) is served by serve_overlapped, the loop the GPU
// runs too, with a table of open requests per worker that outlives restarts.
//
// A handler that calls fault() (handler.hpp) stops its worker: the worker returns, its request
// unanswered, and health() reports the fault from then on; the other workers go on until the
// accelerator is stopped (the agent stops it once it sees the fault).
//
// An idle worker backs off the way the server's engine does: it keeps polling at full speed for
// a while after its last request, then sleeps between polls, longer each time up to a bound
// (IdleBackoff), so an idle agent does not hold a core and a request that comes while it sleeps
// waits at most that bound.
#pragma once

#include <pthread.h>
#include <sys/prctl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "caracal/accel/client.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/accel/overlap.hpp"
#include "caracal/core/status.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/ring.hpp"

namespace caracal::accel {

struct CpuOptions {
  uint32_t workers = 1;
  // Worker i runs on cpus[i % cpus.size()]; empty leaves placement to the scheduler.
  std::vector<int> cpus;
  // Requests taken from one queue before publishing and moving to the next queue.
  uint32_t burst = 32;
  // While it spins, empty polling rounds before a worker yields its core once (0: never yield).
  uint32_t idle_rounds_before_yield = 256;
  // How long a worker keeps polling at full speed after its last request before it starts to
  // sleep between polls. Longer than the gaps of a client that keeps a request in flight, so
  // such a client never waits for a wake-up.
  uint32_t idle_spin_us = 200;
  // The longest sleep between two polls of an idle worker: the most a request that arrives
  // while the worker sleeps waits for it. The sleeps start at kFirstIdleSleepUs and double.
  // 0: never sleep (spin forever; a core per worker while idle).
  uint32_t idle_sleep_max_us = 1000;
};

// What a client is told of a request its handler failed (threw): the exception's text may say
// what the client should not see, so it goes to the agent's log instead (ErrorNote).
inline constexpr const char* kHandlerFailedReply = "handler failed; the agent logs why";

// The last of a worker's handler errors in words (an exception's what(), an overrun in
// numbers), for the agent's log: set on the error path only, under its lock.
class ErrorNote {
 public:
  void set(std::string text) {
    std::lock_guard lock(m_);
    text_ = std::move(text);
  }
  std::string get() const {
    std::lock_guard lock(m_);
    return text_;
  }

 private:
  mutable std::mutex m_;
  std::string text_;
};

// Counters a worker keeps (relaxed: read for reporting only).
struct WorkerStats {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> handler_errors{0};   // handler threw or overran its response buffer
  ErrorNote last_error;                      // the last of them, in words
  std::atomic<uint64_t> reply_ring_full{0};  // times a burst stopped on a full TX ring
  std::atomic<uint64_t> corrupt_entries{0};  // RX entries that failed validation (ring stopped)
  std::atomic<uint64_t> idle_sleeps{0};      // sleeps between polls of an idle worker
  std::atomic<uint64_t> stale_replies{0};    // client replies for no open call (overlapped)
};

// The idle policy of one worker (CpuOptions::idle_spin_us, idle_sleep_max_us): spin, yielding
// now and then, for idle_spin_us after the last work, then sleep between polls, the sleep
// doubling from kFirstIdleSleepUs to idle_sleep_max_us. Owned by its worker thread.
class IdleBackoff {
 public:
  static constexpr uint32_t kFirstIdleSleepUs = 8;

  explicit IdleBackoff(const CpuOptions& options)
      : spin_(std::chrono::microseconds(options.idle_spin_us)),
        sleep_max_us_(options.idle_sleep_max_us),
        yield_rounds_(options.idle_rounds_before_yield) {}

  // The worker found work: the next empty round starts a new spin.
  void worked() {
    rounds_ = 0;
    sleep_us_ = 0;
  }

  // One empty round: a pause, a yield or a sleep. Returns whether it slept.
  bool idle() {
    using Clock = std::chrono::steady_clock;
    if (rounds_ == 0) idle_since_ = Clock::now();
    ++rounds_;
    bool spinning;
    if (sleep_max_us_ == 0) {
      spinning = true;  // never sleeps
    } else if (sleep_us_ != 0) {
      spinning = false;  // already sleeping: until the next work
    } else {
      // The clock is read every 64 rounds: a few microseconds late against a spin of hundreds.
      spinning = rounds_ % 64 != 0 || Clock::now() - idle_since_ < spin_;
    }
    if (spinning) {
      if (yield_rounds_ != 0 && rounds_ % yield_rounds_ == 0) {
        std::this_thread::yield();
      } else {
        mqueue::spin_pause();
      }
      return false;
    }
    sleep_us_ = sleep_us_ == 0 ? kFirstIdleSleepUs : sleep_us_ * 2;
    if (sleep_us_ > sleep_max_us_) sleep_us_ = sleep_max_us_;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    return true;
  }

  // The length of the last sleep in microseconds; 0 while spinning.
  uint32_t sleep_us() const { return sleep_us_; }

 private:
  std::chrono::steady_clock::duration spin_;
  uint32_t sleep_max_us_;
  uint32_t yield_rounds_;
  uint32_t rounds_ = 0;
  uint32_t sleep_us_ = 0;  // the last sleep; 0 while spinning
  std::chrono::steady_clock::time_point idle_since_{};
};

namespace detail {

// Pins the calling thread to `cpu`; an error names the worker and the CPU.
Status pin_current_thread(uint32_t worker, int cpu);

// Writes `text` into a response buffer as an error reply.
void write_error(Response& resp, const std::string& text);

}  // namespace detail

template <Handler H>
class CpuAccelerator {
  static constexpr bool kOverlapped = DeclaresInFlight<H>;
  static_assert(!kOverlapped || OverlappedHandler<H>,
                "a handler with kInFlight needs a trivially copyable Pending, start() and finish() "
                "(caracal/accel/overlap.hpp)");

 public:
  CpuAccelerator(mqueue::RegionView region, H handler, CpuOptions options = {})
      : region_(region), handler_(std::move(handler)), options_(std::move(options)) {
    if (options_.workers == 0) options_.workers = 1;
    if (options_.burst == 0) options_.burst = 1;
    stats_ = std::make_unique<WorkerStats[]>(options_.workers);
    if constexpr (kOverlapped) {
      // Value-initialized: next_seq starts at 0 and stays with the worker across restarts.
      tables_ = std::make_unique<overlap::Table<H>[]>(options_.workers);
    }
  }
  CpuAccelerator(const CpuAccelerator&) = delete;
  CpuAccelerator& operator=(const CpuAccelerator&) = delete;
  ~CpuAccelerator() { stop(); }

  // Starts the workers. Fails (and starts none) if a worker cannot be pinned.
  Status start() {
    if (!threads_.empty()) return invalid_argument("CPU accelerator already started");
    // This accelerator's own earlier stop() left the stop word raised: starting again clears
    // it. A stop raised by anyone else (the SmartNIC, the agent) stays in force.
    if (raised_stop_) region_.clear_stop();
    raised_stop_ = false;
    go_.store(false, std::memory_order_relaxed);
    std::vector<Status> pin_status(options_.workers);
    std::atomic<uint32_t> started{0};
    for (uint32_t w = 0; w < options_.workers; ++w) {
      threads_.emplace_back([this, w, &pin_status, &started] {
        pthread_setname_np(pthread_self(), "caracal-cpu");
        // An idle worker's sleeps are tens of microseconds at first: the default timer slack
        // (50 us) would stretch each of them, and the wait of a request that comes meanwhile.
        prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
        if (!options_.cpus.empty()) {
          pin_status[w] = detail::pin_current_thread(w, options_.cpus[w % options_.cpus.size()]);
        }
        started.fetch_add(1, std::memory_order_acq_rel);
        while (!go_.load(std::memory_order_acquire))
          std::this_thread::yield();
        if (abort_start_.load(std::memory_order_acquire)) return;
        run_worker(w);
      });
    }
    while (started.load(std::memory_order_acquire) < options_.workers)
      std::this_thread::yield();
    Status failed;
    for (const Status& s : pin_status) {
      if (!s.ok()) failed = s;
    }
    abort_start_.store(!failed.ok(), std::memory_order_release);
    go_.store(true, std::memory_order_release);
    if (!failed.ok()) {
      join();
      return failed;
    }
    return Status::ok_status();
  }

  // Raises the region's stop word and waits for every worker to return.
  void stop() {
    if (threads_.empty()) return;
    region_.request_stop();
    raised_stop_ = true;
    join();
  }

  // Waits for the workers without raising the stop word (someone else raises it).
  void join() {
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

  // OK while every worker serves; otherwise the first handler fault (fault() in handler.hpp),
  // naming its worker. Any thread.
  Status health() const {
    // Pairs with the release store in run_worker(): a fault seen here has its text written.
    if (!faulted_.load(std::memory_order_acquire)) return Status::ok_status();
    std::lock_guard lock(fault_m_);
    return fault_;
  }

  const WorkerStats& stats(uint32_t worker) const { return stats_[worker]; }
  uint32_t workers() const { return options_.workers; }
  uint64_t total_requests() const {
    uint64_t n = 0;
    for (uint32_t w = 0; w < options_.workers; ++w) {
      n += stats_[w].requests.load(std::memory_order_relaxed);
    }
    return n;
  }

 private:
  struct ServerQueue {
    uint32_t index;
    mqueue::RingConsumer rx;
    mqueue::RingProducer tx;
    uint32_t stopped;   // a corrupt entry stopped this queue
    uint32_t finished;  // overlapped: requests were answered this round
  };

  // The single-thread group of an overlapped worker.
  struct SoloLanes {
    static void sync() {}
  };

  // Runs an overlapped handler's phases as invoke() runs a call operator: an exception becomes
  // the request's error reply (start()'s at the request's finish step), its text the log's.
  struct OverlapInvoke {
    WorkerStats& stats;

    bool start(H& h, const Request& req, typename H::Pending& p, Calls& calls, Context& ctx,
               uint32_t /*slot*/) {
      try {
        h.start(req, p, calls, ctx);
        return true;
      } catch (const HandlerFault&) {
        throw;
      } catch (const std::exception& ex) {
        note_failure(stats, std::string("start() threw: ") + ex.what());
      } catch (...) {
        note_failure(stats, "start() threw something that is not a std::exception");
      }
      return false;
    }
    void finish(H& h, const Request& req, typename H::Pending& p, const Replies& replies,
                Response& resp, Context& ctx) {
      try {
        h.finish(req, p, replies, resp, ctx);
        return;
      } catch (const HandlerFault&) {
        throw;
      } catch (const std::exception& ex) {
        note_failure(stats, std::string("finish() threw: ") + ex.what());
      } catch (...) {
        note_failure(stats, "finish() threw something that is not a std::exception");
      }
      detail::write_error(resp, kHandlerFailedReply);
    }
    void failed(Response& resp, uint32_t /*slot*/) {
      detail::write_error(resp, kHandlerFailedReply);
    }
  };

  void run_worker(uint32_t w) {
    const mqueue::RegionHeader& h = region_.header();
    std::vector<ServerQueue> queues;
    for (uint32_t q = w; q < h.server_queue_count; q += options_.workers) {
      queues.push_back(ServerQueue{q, region_.rx_consumer(q), region_.tx_producer(q), 0, 0});
    }
    std::vector<ClientChannel> clients;
    for (uint32_t c = w; c < h.client_queue_count; c += options_.workers) {
      clients.emplace_back(region_, c);
    }
    H handler = handler_;  // each worker its own copy
    // On the CPU every group, whatever the handler declares, is this one thread.
    Context ctx(Group(granularity_of<H>(), 0, 1), clients.data(),
                static_cast<uint32_t>(clients.size()), w);
    const uint32_t max_response = max_response_of<H>(h.max_message_bytes);
    std::vector<std::byte> staging;
    if constexpr (batch_of<H>() > 1) staging.resize(size_t{batch_of<H>()} * max_response);
    WorkerStats& stats = stats_[w];

    try {
      if constexpr (kOverlapped) {
        serve_overlapped_until_stopped(w, queues, clients, handler, ctx, max_response, stats);
      } else {
        serve_until_stopped(queues, handler, ctx, max_response, staging, stats);
      }
    } catch (const HandlerFault& f) {
      // The request that faulted stays in its ring, unanswered: the worker is done.
      std::lock_guard lock(fault_m_);
      if (fault_.ok()) {
        fault_ = Status(StatusCode::kAborted,
                        "CPU worker " + std::to_string(w) + ": handler fault: " + f.what());
      }
      faulted_.store(true, std::memory_order_release);  // pairs with the acquire in health()
    }
  }

  // The worker's loop, until the stop word is raised (or a handler faults: HandlerFault).
  void serve_until_stopped(std::vector<ServerQueue>& queues, H& handler, Context& ctx,
                           uint32_t max_response, std::vector<std::byte>& staging,
                           WorkerStats& stats) {
    IdleBackoff backoff(options_);
    uint32_t rounds = 0;
    for (;;) {
      uint32_t served = 0;
      for (ServerQueue& sq : queues) {
        if (sq.stopped) continue;
        if constexpr (batch_of<H>() == 1) {
          served += serve_burst(sq, handler, ctx, max_response, stats);
        } else {
          served += serve_batches(sq, handler, ctx, max_response, staging, stats);
        }
      }
      // The stop word carries no data; checked every few thousand rounds, busy or idle, and
      // after every sleep (a sleeping worker's rounds are up to idle_sleep_max_us long).
      if (++rounds % 2048 == 0 && region_.stop_requested()) break;
      if (served != 0) {
        backoff.worked();
      } else if (backoff.idle()) {
        stats.idle_sleeps.fetch_add(1, std::memory_order_relaxed);
        if (region_.stop_requested()) break;
      }
    }
  }

  // The loop of an overlapped handler's worker (overlap.hpp), until the stop word is raised.
  // While requests are open it polls at full speed: their replies may land at any time.
  void serve_overlapped_until_stopped(uint32_t w, std::vector<ServerQueue>& queues,
                                      std::vector<ClientChannel>& clients, H& handler, Context& ctx,
                                      uint32_t max_response, WorkerStats& stats) {
    overlap::Table<H>& table = tables_[w];
    table.reset();
    const overlap::Worker<ServerQueue> worker{queues.data(),
                                              1,
                                              static_cast<uint32_t>(queues.size()),
                                              w,
                                              options_.workers,
                                              clients.data(),
                                              static_cast<uint32_t>(clients.size()),
                                              options_.burst,
                                              max_response,
                                              true};
    std::vector<uint32_t> channel_stopped(clients.size(), 0);
    OverlapInvoke invoke{stats};
    overlap::Box box{};
    IdleBackoff backoff(options_);
    uint32_t rounds = 0;
    for (;;) {
      overlap::Counts counts;
      bool open = false;
      const uint32_t work = serve_overlapped<H, SoloLanes>(
          table, worker, handler, ctx, &box, true, invoke, channel_stopped.data(), counts, open);
      if (work != 0) add_counts(stats, counts);
      if (++rounds % 2048 == 0 && region_.stop_requested()) break;
      if (work != 0) {
        backoff.worked();
      } else if (open) {
        backoff.worked();
        mqueue::spin_pause();
      } else if (backoff.idle()) {
        stats.idle_sleeps.fetch_add(1, std::memory_order_relaxed);
        if (region_.stop_requested()) break;
      }
    }
  }

  static void add_counts(WorkerStats& stats, const overlap::Counts& c) {
    constexpr auto kRelaxed = std::memory_order_relaxed;
    if (c.requests != 0) stats.requests.fetch_add(c.requests, kRelaxed);
    if (c.handler_errors != 0) stats.handler_errors.fetch_add(c.handler_errors, kRelaxed);
    if (c.reply_ring_full != 0) stats.reply_ring_full.fetch_add(c.reply_ring_full, kRelaxed);
    if (c.corrupt_entries != 0) stats.corrupt_entries.fetch_add(c.corrupt_entries, kRelaxed);
    if (c.stale_replies != 0) stats.stale_replies.fetch_add(c.stale_replies, kRelaxed);
  }

  // Serves up to `burst` requests of one queue with a single-request handler, writing replies
  // in place in the TX ring.
  uint32_t serve_burst(ServerQueue& sq, H& handler, Context& ctx, uint32_t max_response,
                       WorkerStats& stats) {
    uint32_t n = 0;
    mqueue::Entry e;
    while (n < options_.burst) {
      const mqueue::PollResult r = sq.rx.next(e);
      if (r == mqueue::PollResult::kEmpty) break;
      if (r == mqueue::PollResult::kCorrupt) {
        sq.stopped = true;
        stats.corrupt_entries.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      std::byte* out = sq.tx.reserve(max_response);
      if (out == nullptr) {
        sq.rx.unread();
        stats.reply_ring_full.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      Request req{e.payload, e.length, sq.index, e.token};
      Response resp{out, max_response, 0, 0};
      try {
        invoke(handler, req, resp, ctx, stats);
      } catch (const HandlerFault&) {
        end_burst(sq, n, stats);  // the replies before the fault still go out
        throw;
      }
      sq.tx.commit(resp.size, e.token, resp.flags);
      sq.tx.write_line();  // with TX lines, a short reply is announced before the publish
      sq.rx.release();
      ++n;
    }
    end_burst(sq, n, stats);
    return n;
  }

  // Publishes the `n` replies of a burst and the RX credits they free.
  static void end_burst(ServerQueue& sq, uint32_t n, WorkerStats& stats) {
    if (n == 0) return;
    sq.tx.publish();  // replies first, then the RX credits they free
    sq.rx.publish();
    stats.requests.fetch_add(n, std::memory_order_relaxed);
  }

  // Serves one queue with a batched handler: up to kBatch requests per call, as many as the TX
  // ring is sure to have room for; responses are written to per-worker staging and copied into
  // the ring after the call.
  uint32_t serve_batches(ServerQueue& sq, H& handler, Context& ctx, uint32_t max_response,
                         std::vector<std::byte>& staging, WorkerStats& stats) {
    constexpr uint32_t kBatch = batch_of<H>();
    const mqueue::RingGeometry& g = sq.tx.geometry();
    const uint32_t per_reply = mqueue::slots_for(max_response, g.slot_bytes);
    Request reqs[kBatch];
    Response resps[kBatch];
    uint32_t total = 0;
    while (total < options_.burst) {
      // Room for k replies, whatever skip marker the ring end forces: k*per_reply + per_reply-1.
      uint32_t room = sq.tx.credits();
      if (room < 2 * per_reply - 1) {
        sq.tx.refresh_credits();
        room = sq.tx.credits();
      }
      uint32_t k = 0;
      mqueue::Entry e;
      while (k < kBatch && (k + 2) * per_reply - 1 <= room) {
        const mqueue::PollResult r = sq.rx.next(e);
        if (r == mqueue::PollResult::kEmpty) break;
        if (r == mqueue::PollResult::kCorrupt) {
          sq.stopped = true;
          stats.corrupt_entries.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        reqs[k] = Request{e.payload, e.length, sq.index, e.token};
        resps[k] = Response{staging.data() + size_t{k} * max_response, max_response, 0, 0};
        ++k;
      }
      if (k == 0) {
        if (room < 2 * per_reply - 1) {
          stats.reply_ring_full.fetch_add(1, std::memory_order_relaxed);
        }
        break;
      }
      try {
        invoke_batch(handler, reqs, resps, k, ctx, stats);
      } catch (const HandlerFault&) {
        end_burst(sq, total, stats);  // the batches before the fault still go out
        throw;
      }
      for (uint32_t i = 0; i < k; ++i) {
        std::byte* out = sq.tx.reserve(resps[i].size);  // credits were checked above
        std::memcpy(out, resps[i].data, resps[i].size);
        sq.tx.commit(resps[i].size, reqs[i].token, resps[i].flags);
        sq.tx.write_line();
      }
      sq.rx.release();
      total += k;
      if (sq.stopped) break;
    }
    end_burst(sq, total, stats);
    return total;
  }

  // A request (or `n`) the handler failed: counted, and `why` kept for the agent's log.
  static void note_failure(WorkerStats& stats, std::string why, uint64_t n = 1) {
    stats.handler_errors.fetch_add(n, std::memory_order_relaxed);
    stats.last_error.set(std::move(why));
  }

  // An overrun is the handler's bug in numbers it can act on, and tells the client nothing of
  // the request's data: the reply says it as the log does.
  static void check_overrun(Response& resp, WorkerStats& stats) {
    if (resp.size <= resp.capacity) return;
    std::string why = "handler wrote " + std::to_string(resp.size) + " bytes into a " +
                      std::to_string(resp.capacity) + "-byte response";
    detail::write_error(resp, why);
    note_failure(stats, std::move(why));
  }

  static void invoke(H& handler, const Request& req, Response& resp, Context& ctx,
                     WorkerStats& stats) {
    try {
      handler(req, resp, ctx);
      check_overrun(resp, stats);
      return;
    } catch (const HandlerFault&) {
      throw;  // not an error reply: the worker stops (run_worker)
    } catch (const std::exception& ex) {
      note_failure(stats, std::string("the handler threw: ") + ex.what());
    } catch (...) {
      note_failure(stats, "the handler threw something that is not a std::exception");
    }
    detail::write_error(resp, kHandlerFailedReply);
  }

  static void invoke_batch(H& handler, const Request* reqs, Response* resps, uint32_t n,
                           Context& ctx, WorkerStats& stats) {
    try {
      handler(reqs, resps, n, ctx);
      for (uint32_t i = 0; i < n; ++i)
        check_overrun(resps[i], stats);
      return;
    } catch (const HandlerFault&) {
      throw;  // not an error reply: the worker stops (run_worker)
    } catch (const std::exception& ex) {
      note_failure(
          stats,
          std::string("the handler threw on a batch of ") + std::to_string(n) + ": " + ex.what(),
          n);
    } catch (...) {
      note_failure(stats, "the handler threw something that is not a std::exception", n);
    }
    for (uint32_t i = 0; i < n; ++i)
      detail::write_error(resps[i], kHandlerFailedReply);
  }

  mqueue::RegionView region_;
  H handler_;
  CpuOptions options_;
  std::vector<std::thread> threads_;
  std::unique_ptr<WorkerStats[]> stats_;
  // Overlapped handlers: each worker's open requests (overlap.hpp); unused otherwise.
  struct NoTable {};
  std::unique_ptr<std::conditional_t<kOverlapped, overlap::Table<H>, NoTable>[]> tables_;
  std::atomic<bool> abort_start_{false};
  // A member, not a local of start(): a worker may still be reading it after start() returns.
  std::atomic<bool> go_{false};
  bool raised_stop_ = false;  // the stop word is up because stop() raised it
  // The first handler fault, written by the worker that caught it under fault_m_, then
  // faulted_ raised (release); health() reads faulted_ (acquire) before it takes the lock.
  mutable std::mutex fault_m_;
  Status fault_;
  std::atomic<bool> faulted_{false};
};

}  // namespace caracal::accel
