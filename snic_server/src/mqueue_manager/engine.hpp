// The mqueue manager: engine threads that own the attached regions (region.hpp) and move
// messages between the server's I/O threads and the rings. Engine is the scheduler: it deals
// each region's queues among its threads and posts attach, detach and failure to them; one
// thread's loop, its rounds and its idle policy are in src/mqueue_manager/.
//
// I/O threads hand requests to a queue's inbox (a short mutex-protected list). An engine
// thread drains inboxes into per-queue backlogs, writes as many entries into each RX ring as
// its credits allow and publishes the tail once per round, then reads the TX tails and routes
// each reply by its token (reply_routing.hpp). Client queues run the other way: TX entries go to
// the queue's destination link, and the destination's replies come back through the queue's inbox
// into its RX ring.
//
// With several engine threads (EngineOptions::threads), the queues of a region whose binding
// allows it (shm) are dealt among them: server queue q is served by thread (b + q) % threads,
// and only by it, so every queue still has one producer and one consumer on this side; client
// queue c by the thread of server queue c, (b + c) % threads. The base b is where the region
// placed before it ended (place()), so that the queues of several regions (an agent per GPU)
// together spread over every thread rather than all starting at thread 0. A region that cannot
// be shared (rdma: one queue pair, one completion queue) is served by thread 0. With more
// threads than queues some threads serve none; dispatch then lends them another thread's
// queues (dispatch.hpp).
//
// Hosted engine threads (snic_server's `engine_threads: 0`): each I/O thread runs one engine
// thread's rounds itself, between its socket handlers, instead of handing requests to an engine
// thread of their own. Nothing then waits for a wake-up between a socket and a ring while the
// thread polls, and the server needs no core besides its I/O threads'.
//
// Backpressure: a queue whose backlog holds a ring's worth of entries is congested; TCP
// connections stop reading and park on their service until the engine has room again.
//
// Reply deadlines: the thread that serves a queue also fails each request on it that its
// service's reply bound (AgentRegion::reply_timeout) has run out for, in the ring or waiting
// for room, and drops the answer that may come for it later (flights.hpp); it reports the
// timeouts to the service (EngineEvents::on_reply_timeouts), which may eject the agent from
// dispatch, and tells the service when an ejected region answered in time or its period is
// over (EngineEvents::on_ejection_over).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mqueue_manager/region.hpp"
#include "reply_routing.hpp"
#include "tunables.hpp"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace caracal::server {

class Counter;  // metrics/metrics.hpp

// The defaults are in tunables.hpp, with the reasons for their values; tests set their own.
struct EngineOptions {
  // Rounds without work a thread spins before it starts yielding, then sleeping.
  uint32_t spin_rounds = tunables::kSpinRounds;
  // With the engine in the I/O threads: the rounds a thread spins after a handler that brought
  // no request ended its sleep (see tunables::kQuietWakeSpinRounds).
  uint32_t quiet_wake_spin_rounds = tunables::kQuietWakeSpinRounds;
  // Spinning pays only on a core of the thread's own. A thread that lost its core to other
  // threads for at least `contended_lost_min`, and an eighth of the time, since it last looked
  // (more runnable threads than cores: another poller on the host, the agent's CPU workers,
  // the clients) spins at most `contended_spin_rounds` instead, for `contended_hold`, and then
  // tries the long spin again. A thread looks every tunables::kContendedLookRounds rounds
  // without work (idle_policy.cpp), at its CPU clock against the wall clock.
  uint32_t contended_spin_rounds = tunables::kContendedSpinRounds;
  std::chrono::microseconds contended_lost_min = tunables::kContendedLostMin;
  std::chrono::milliseconds contended_hold = tunables::kContendedHold;
  // Longest sleep while replies are outstanding (latency cost of an idle engine).
  std::chrono::microseconds max_poll_sleep = tunables::kMaxPollSleep;
  // Engine threads, 1 to kMaxEngineThreads (see the top of this file). Reply sinks need a lane
  // for each (ReplySink).
  uint32_t threads = 1;
  // Counts the times a thread found it had lost its core and spun short; may be null.
  Counter* spins_cut = nullptr;
  // Counts the times a thread went to sleep: it ran out of rounds to spin and waited for work
  // (or for replies, max_poll_sleep at a time); may be null.
  Counter* sleeps = nullptr;
};

class EngineThread;  // one engine thread and what it owns (src/mqueue_manager/engine_thread.hpp)

class Engine {
 public:
  Engine(ReplyTable& replies, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Hosted mode: engine thread `thread` gets no thread of its own. Its rounds run on the
  // thread that runs `io`, in run_hosted(), between `io`'s handlers, and its wake-ups are posts
  // to `io`. For every thread, before start().
  void host(uint32_t thread, boost::asio::io_context& io);
  // The loop of a hosted thread's host: engine rounds and `io`'s ready handlers in turn while
  // the engine runs, then io.run() until `io` stops. `io` must have work (a work guard) so that
  // it does not stop when it runs out of handlers. Call once, from the thread that runs `io`.
  void run_hosted(uint32_t thread);
  // The engine thread that the calling thread hosts (in run_hosted()), or -1: dispatch
  // prefers that thread's queues.
  static int hosted_thread();

  void start();
  // Fails what is still in flight ("server shutting down") and joins the threads (hosted:
  // waits until each host has finished its last round).
  void stop();

  // Chooses where the region's server queues start among the threads (its engine_base()): the
  // thread after the last queue of the region placed before it. Call once, before the region is
  // added to dispatch and attached; a region never placed starts at thread 0.
  void place(AgentRegion& region);
  // The engine owns the region from now on (any thread).
  void attach(const std::shared_ptr<AgentRegion>& region);
  // Closes the region's inboxes; once every request in flight is answered, or after `drain`,
  // fails what is left with "agent detached" and calls `done` (once, on an engine thread).
  void detach(const std::shared_ptr<AgentRegion>& region, std::chrono::milliseconds drain,
              std::function<void()> done);
  // The agent is gone: fails everything in flight with `reason` and drops the region.
  void fail(const std::shared_ptr<AgentRegion>& region, const std::string& reason);

  // Called after a request was submitted to `queue`'s inbox: counts it in flight on the thread
  // that serves the queue and wakes that thread if it sleeps.
  void note_dispatched(const AgentRegion& region, uint32_t queue);
  // Called after a destination's reply was submitted to a client queue's inbox: wakes
  // `thread`, the one that serves the queue (thread_of()), if it sleeps.
  void notify(uint32_t thread);

  // Requests dispatched to some region and not yet answered or failed.
  int64_t in_flight() const;
  uint32_t threads() const { return static_cast<uint32_t>(threads_.size()); }
  // Seconds `thread` has spent in rounds without work (spinning, yielding or asleep) since it
  // started: its share of a polling core that waited rather than worked. Any thread; a reading
  // may fall short by the run of idle rounds that ended while it was taken.
  double idle_seconds(uint32_t thread) const;
  // The thread that serves `queue` of `region` (see the top of this file).
  uint32_t thread_of(const AgentRegion& region, uint32_t queue) const;

 private:
  friend class EngineThread;
  // Posts a failure of `region` to every thread that serves part of it but `except`: a thread
  // that dropped the region for a fault makes the others drop it too.
  void fail_elsewhere(const std::shared_ptr<AgentRegion>& region, const std::string& reason,
                      uint32_t except);
  // Each thread's share of `region`'s queues; empty for a thread that serves none.
  std::vector<std::vector<uint32_t>> queues_by_thread(const AgentRegion& region) const;

  // The engine thread that this thread hosts while it runs its rounds (hosted_thread()); set
  // and cleared by that engine thread's run_hosted(), read only by the thread itself.
  static thread_local int hosted_index_;
  // Requests this thread has dispatched (note_dispatched()), counted only while it hosts an
  // engine thread: how the host's loop tells a handler that brought requests from one that
  // brought none (EngineThread::run_hosted()). Read only by the thread itself.
  static thread_local uint64_t hosted_dispatches_;
  // No engine thread: fail_elsewhere()'s `except` when every thread is to hear of it.
  static constexpr uint32_t kNoThread = UINT32_MAX;

  ReplyTable& replies_;
  EngineOptions options_;
  std::vector<std::unique_ptr<EngineThread>> threads_;
  // Where the next region placed starts (place()), in queues dealt so far; a counter only.
  std::atomic<uint32_t> next_base_{0};
};

}  // namespace caracal::server
