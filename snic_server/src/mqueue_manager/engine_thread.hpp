// One engine thread: the regions (or parts of regions) it serves, its loop of rounds, the
// commands other threads post to it, and its sleep.
//
// A round applies the posted commands (attach, detach, fail), then lets each region's binding
// serve this thread's queues (datapath.cpp), and hands the replies it routed to their sinks in
// one burst per round. At most once per tunables::kReplyCheckPeriod a round also fails the
// requests on this thread's queues that their region's reply bound has run out for, and tells
// the services of regions whose ejection is over (check_deadlines()). A round without work asks
// the idle policy (idle_policy.hpp) whether to spin, yield or sleep.
//
// Threads: post(), notify(), note_dispatched() and in_flight() are for any thread; start(),
// request_stop() and join() for the one that starts and stops the engine. Everything else runs
// on the thread that runs the loop (the owner: a thread of its own, or the I/O thread that hosts
// it) and asserts so, except that once the loop has ended, the stopping thread settles late
// commands with the same functions under commands_m_ (apply_without_thread()).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "idle_policy.hpp"
#include "mqueue_manager/engine.hpp"
#include "mqueue_manager/region.hpp"
#include "owner_thread.hpp"
#include "reply_routing.hpp"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace caracal::server {

class EngineThread {
 public:
  using Clock = std::chrono::steady_clock;

  struct Command {
    enum class Kind { kAttach, kDetach, kFail } kind;
    std::shared_ptr<AgentRegion> region;
    std::vector<uint32_t> queues;  // kAttach: the queues of the region this thread serves
    std::chrono::milliseconds drain{0};
    std::function<void()> done;
    std::string reason;
  };

  EngineThread(Engine& engine, uint32_t index);
  ~EngineThread() { stop(); }
  EngineThread(const EngineThread&) = delete;
  EngineThread& operator=(const EngineThread&) = delete;

  // Hosted mode (Engine::host()): the thread's rounds run in `io`'s thread, between its
  // handlers (run_hosted()), and wake-ups are posts to `io`. Set before start().
  void set_host(boost::asio::io_context& io) { host_ = &io; }
  // The host's loop: engine rounds and `io`'s ready handlers in turn until the engine stops,
  // then io.run() until `io` stops. Called once, on the thread that runs `io`.
  void run_hosted();

  void start();
  void request_stop();  // stop() in two halves, so that every thread winds down at once
  // Waits for the thread; from then on a command is applied as it is posted (see
  // apply_without_thread()).
  void join();
  void stop() {
    request_stop();
    join();
  }

  // Any thread.
  void post(Command c);
  // A request was queued in one of this thread's inboxes. The count it raises is also what a
  // sleeping thread is woken for (see sleep_until_woken()), so a dispatch costs one shared
  // read-modify-write.
  // `by_host`: the caller is a handler that this thread's own host runs (the request was read
  // by the I/O thread hosting it). Then no wake-up is needed: a sleeping host is inside the
  // run_one_for() that runs this very handler, which returns when the handler does, and an
  // awake one takes the request in its next round. The wake-up would be a post of an empty
  // handler to itself, an allocation per request read while asleep.
  void note_dispatched(bool by_host) {
    // Pairs with sleep_until_woken(): Dekker-style, the submitter raises in_flight_ and then
    // reads sleeping_; the thread sets sleeping_ and then reads in_flight_. Both seq_cst, so at
    // least one of them sees the other: the thread does not sleep, or the submitter wakes it.
    in_flight_.fetch_add(1, std::memory_order_seq_cst);
    if (!by_host && sleeping_.load(std::memory_order_seq_cst)) wake();
  }
  void notify();
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  uint32_t index() const { return index_; }
  // Seconds spent in rounds without work so far (IdleTime::seconds()); any thread.
  double idle_seconds() const { return idle_time_.seconds(); }

  // Routes one answer (a reply, or a failure) to its client and reports it to `events` (the
  // region's service; may be null). The sink may hold it until flush_replies(). Owner thread
  // only (the region's binding calls it from serve()).
  void answer(EngineEvents* events, uint64_t token, ReplyView reply, Clock::time_point submitted);

 private:
  struct Attached {
    std::shared_ptr<AgentRegion> region;
    std::vector<uint32_t> queues;  // the region's queues this thread serves
    bool draining = false;
    Clock::time_point drain_deadline;
    std::function<void()> done;
  };

  // A thread of its own: serve() between entering and leaving the owner role.
  void run();
  // The loop, a thread of its own or hosted (run_hosted()), until a stop; then finish().
  void serve();
  // What one round found: work, none, or that the thread is asked to stop (the round then did
  // nothing).
  enum class RoundOutcome { kIdle, kBusy, kStopping };
  // One round: commands, then every region's queues.
  RoundOutcome round();
  // After the last round: fails what is still served ("server shutting down").
  void finish();
  // Wakes the thread out of its sleep (a post to the host in hosted mode).
  void wake();
  bool apply_commands();
  // A command that finds the thread stopped (commands_m_ held): an attached region is failed at
  // once, a detach is done at once, a failure has nothing left to fail. Nothing is left waiting
  // in commands_, where a detach's `done` (which may own a control session, and its socket) would
  // outlive the server's I/O context.
  void apply_without_thread(Command& c);
  void fail_region(Attached& a, const std::string& reason);
  // Reply deadlines and ejections (see the top of this file): reads the clock every
  // tunables::kDeadlineClockRounds calls, looks once the period has passed.
  void check_deadlines();
  void flush_replies();
  // A round without work: the idle policy's step, carried out. True if the host ran one of its
  // handlers while this thread waited in it (hosted mode): that was work, and the caller starts
  // counting rounds without work afresh.
  bool idle(uint32_t idle_rounds);
  // Nothing in flight: sleeps until a request, a command or a notification comes, at most
  // tunables::kIdleSleep. The same return as idle().
  bool sleep_until_woken();
  void notify_always();

  Engine& engine_;
  const uint32_t index_;
  OwnerThread owner_;
  IdlePolicy idle_policy_;  // owner thread only
  IdleTime idle_time_;      // written by the owner thread, read by scrapes
  std::thread thread_;
  boost::asio::io_context* host_ = nullptr;  // hosted mode only; set before start()
  // Between start() and join(); used by the thread that starts and stops the engine only. A
  // hosted thread that was never started has nothing to wake, and its host may be gone.
  bool started_ = false;
  // Hosted mode, under commands_m_: run_hosted() is between its first and its last round.
  bool hosted_running_ = false;
  std::condition_variable hosted_done_;  // hosted_running_ went false (with commands_m_)
  std::atomic<bool> stopping_{false};
  std::mutex commands_m_;
  std::vector<Command> commands_;
  bool exited_ = false;                               // under commands_m_: see join()
  std::vector<Attached> regions_;                     // owner thread only
  std::vector<std::shared_ptr<ReplySink>> to_flush_;  // owner thread only
  // check_deadlines(), owner thread only: rounds since the clock was read (set to the limit
  // after a sleep, so that the first round after one reads it), and when to look next.
  uint32_t rounds_since_clock_ = 0;
  Clock::time_point next_deadline_check_{};
  // Dekker-style handshake between notify() and the sleeping thread: the notifier bumps
  // `submitted_` after queuing (a command, a client queue's reply) and then reads `sleeping_`;
  // the thread sets `sleeping_` and then reads `submitted_`. Both sides use seq_cst so at least
  // one of them sees the other. Dispatched requests use in_flight_ instead (note_dispatched()).
  // Each of the three atomics has a cache line of its own: in_flight_ changes with every request
  // and reply, sleeping_ is read with every request, submitted_ is read every round.
  alignas(64) std::atomic<uint64_t> submitted_{0};
  alignas(64) std::atomic<bool> sleeping_{false};
  uint64_t round_seen_ = 0;  // submitted_ at the start of the current round
  std::mutex sleep_m_;
  std::condition_variable sleep_cv_;
  // Requests dispatched to this thread's queues and not yet answered or failed.
  alignas(64) std::atomic<int64_t> in_flight_{0};
};

}  // namespace caracal::server
