// The mqueue manager: engine threads that own the attached regions and move messages between
// the server's I/O threads and the rings.
//
// I/O threads hand requests to a queue's inbox (a short mutex-protected list). An engine
// thread drains inboxes into per-queue backlogs, writes as many entries into each RX ring as
// its credits allow and publishes the tail once per round, then reads the TX tails and routes
// each reply by its token (reply.hpp). Client queues run the other way: TX entries go to the
// queue's destination link, and the destination's replies come back through the queue's inbox
// into its RX ring.
//
// With several engine threads (EngineOptions::threads), the server queues of a region whose
// binding allows it (shm) are dealt among them: queue q is served by thread q % threads, and
// only by it, so every queue still has one producer and one consumer on this side. A region
// that cannot be shared (rdma: one queue pair, one completion queue) and every client queue are
// served by thread 0.
//
// Hosted engine threads (snic_server's `engine_threads: 0`): each I/O thread runs one engine
// thread's rounds itself, between its socket handlers, instead of handing requests to an engine
// thread of their own. Nothing then waits for a wake-up between a socket and a ring while the
// thread polls, and the server needs no core besides its I/O threads'.
//
// Backpressure: a queue whose backlog holds a ring's worth of entries is congested; TCP
// connections stop reading and park on their service until the engine has room again.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/core/status.hpp"
#include "caracal/server/reply.hpp"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace caracal::server {

class Service;

// One message waiting for a ring: a request (server queue) or a destination's reply (client
// queue).
struct Message {
  uint64_t token = 0;
  uint16_t flags = 0;  // mqueue::SlotFlags (kSlotError for a failed call-out)
  std::string bytes;
  std::chrono::steady_clock::time_point submitted;
};

// The I/O threads' side of one queue.
class QueueInbox {
 public:
  // Queues a message (moved from `m` only on success); false once the region is closed (lost
  // or detaching): the caller then picks another queue or fails the request.
  bool submit(Message& m);
  // Closes the inbox; returns what was still waiting in it.
  std::vector<Message> close();
  // Moves everything waiting to `out` (engine thread). True if anything moved. An empty inbox
  // costs no lock: the engine looks at every inbox of its queues every round, and each lock
  // and unlock wrote the mutex's cache line, which submit() on an I/O thread writes too.
  bool take(std::deque<Message>& out);

  // Dispatched and not yet answered (server queues): what least_loaded compares.
  std::atomic<int64_t> outstanding{0};
  // Submitted and not yet written into the ring.
  std::atomic<uint32_t> waiting{0};
  // Ring slots not yet given back by the accelerator, as of the engine's last round.
  std::atomic<uint32_t> ring_slots_in_use{0};

 private:
  std::mutex m_;
  std::vector<Message> items_;
  // !items_.empty(), as of the last unlock: written only under m_, read by take() without it as
  // a hint. Relaxed: the messages themselves are read under m_, which orders them; a take() that
  // reads a stale false finds them on its next round.
  std::atomic<bool> queued_{false};
  bool open_ = true;
};

// A client queue's connection to its destination (destinations.hpp). send() is called from
// the engine thread; replies come back through the region's inbox of that client queue.
class ClientLink {
 public:
  virtual ~ClientLink() = default;
  virtual void send(uint64_t token, std::string bytes) = 0;
  virtual void close() = 0;
};

// The engine's handle on one region: the transport-specific part (shm today, rdma later) is
// behind this interface, so the engine loop itself does not depend on the transport.
class RegionBinding;

// One region an agent registered for one service.
class AgentRegion {
 public:
  AgentRegion(std::string agent, uint64_t epoch, Service* service,
              std::unique_ptr<RegionBinding> binding);
  ~AgentRegion();

  const std::string& agent() const { return agent_; }
  uint64_t epoch() const { return epoch_; }
  Service* service() const { return service_; }
  const mqueue::RegionHeader& header() const;
  uint32_t server_queues() const { return header().server_queue_count; }
  uint32_t client_queues() const { return header().client_queue_count; }
  QueueInbox& inbox(uint32_t queue) { return *inboxes_[queue]; }
  // Shared with the client links, which may outlive the region by a completion handler.
  std::shared_ptr<QueueInbox> inbox_ptr(uint32_t queue) const { return inboxes_[queue]; }
  // "agent echo-1 epoch 0x1f..., service echo": for logs.
  std::string label() const;

  void set_links(std::vector<std::shared_ptr<ClientLink>> links) { links_ = std::move(links); }
  ClientLink* link(uint32_t client) const {
    return client < links_.size() ? links_[client].get() : nullptr;
  }
  RegionBinding& binding() { return *binding_; }
  const RegionBinding& binding() const { return *binding_; }

  // Called on an engine thread after the engine dropped the region for a fault (a corrupt
  // entry, a failed transport), with the fault; not when the control endpoint detaches or
  // fails it. Set before attach.
  void set_on_fault(std::function<void(const std::string&)> f) { on_fault_ = std::move(f); }
  void notify_fault(const std::string& fault) const {
    if (on_fault_) on_fault_(fault);
  }

 private:
  std::string agent_;
  uint64_t epoch_;
  Service* service_;
  std::unique_ptr<RegionBinding> binding_;
  std::vector<std::shared_ptr<QueueInbox>> inboxes_;
  std::vector<std::shared_ptr<ClientLink>> links_;
  std::function<void(const std::string&)> on_fault_;
};

class Counter;  // metrics.hpp

struct EngineOptions {
  // Rounds without work a thread spins before it starts yielding, then sleeping.
  uint32_t spin_rounds = 20000;
  // Spinning pays only on a core of the thread's own. A thread that lost its core to other
  // threads for at least `contended_lost_min`, and an eighth of the time, since it last looked
  // (more runnable threads than cores: another poller on the host, the agent's CPU workers,
  // the clients) spins at most `contended_spin_rounds` instead, for `contended_hold`, and then
  // tries the long spin again. A thread looks every kContendedLookRounds rounds without work
  // (engine.cpp), at its CPU clock against the wall clock.
  uint32_t contended_spin_rounds = 64;
  std::chrono::microseconds contended_lost_min{500};
  std::chrono::milliseconds contended_hold{1000};
  // Longest sleep while replies are outstanding (latency cost of an idle engine).
  std::chrono::microseconds max_poll_sleep{50};
  // Engine threads, 1 to kMaxEngineThreads (see the top of this file).
  uint32_t threads = 1;
  // Counts the times a thread found it had lost its core and spun short; may be null.
  Counter* spins_cut = nullptr;
  // Counts the times a thread went to sleep: it ran out of rounds to spin and waited for work
  // (or for replies, max_poll_sleep at a time); may be null.
  Counter* sleeps = nullptr;
};

class EngineThread;  // one engine thread and what it owns (engine.cpp)

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
  // The engine thread that the calling thread hosts (in run_hosted()), or -1: the dispatcher
  // prefers that thread's queues.
  static int hosted_thread();

  void start();
  // Fails what is still in flight ("server shutting down") and joins the threads (hosted:
  // waits until each host has finished its last round).
  void stop();

  // The engine owns the region from now on (any thread).
  void attach(std::shared_ptr<AgentRegion> region);
  // Closes the region's inboxes; once every request in flight is answered, or after `drain`,
  // fails what is left with "agent detached" and calls `done` (once, on an engine thread).
  void detach(std::shared_ptr<AgentRegion> region, std::chrono::milliseconds drain,
              std::function<void()> done);
  // The agent is gone: fails everything in flight with `reason` and drops the region.
  void fail(std::shared_ptr<AgentRegion> region, std::string reason);

  // Called after a request was submitted to `queue`'s inbox: counts it in flight on the thread
  // that serves the queue and wakes that thread if it sleeps.
  void note_dispatched(const AgentRegion& region, uint32_t queue);
  // Called after a destination's reply was submitted to a client queue's inbox: wakes the
  // thread that serves client queues (thread 0) if it sleeps.
  void notify();

  // Requests dispatched to some region and not yet answered or failed.
  int64_t in_flight() const;
  // Requests in flight on one thread's queues (a relaxed read: a hint for the dispatcher).
  int64_t in_flight(uint32_t thread) const;
  uint32_t threads() const { return static_cast<uint32_t>(threads_.size()); }
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

  ReplyTable& replies_;
  EngineOptions options_;
  std::vector<std::unique_ptr<EngineThread>> threads_;
};

// The transport-specific part of a region (engine thread only after attach).
class RegionBinding {
 public:
  virtual ~RegionBinding() = default;
  virtual const mqueue::RegionHeader& header() const = 0;
  // Whether several engine threads may serve disjoint sets of its queues at once.
  virtual bool shareable() const = 0;
  // One round over `queues` (of one engine thread): inboxes to RX rings, TX rings to replies
  // and client links. Returns whether it did anything; a non-empty `fault` means the region is
  // unusable (a corrupt entry).
  virtual bool serve(EngineThread& engine, AgentRegion& region, std::span<const uint32_t> queues,
                     std::string& fault) = 0;
  // Tokens of requests written or waiting on `queues`, with their submit times; cleared.
  virtual void take_in_flight(
      std::span<const uint32_t> queues,
      std::vector<std::pair<uint64_t, std::chrono::steady_clock::time_point>>& out) = 0;
  virtual size_t in_flight(std::span<const uint32_t> queues) const = 0;
  // Raises the region's stop word (the agent's pollers return).
  virtual void request_stop() = 0;
};

// Maps the named shm object an agent announced, checks its size against the announcement and
// attaches to the region in it (validate_region checks every header field).
Result<std::unique_ptr<RegionBinding>> bind_shm_region(const std::string& shm_name,
                                                       uint64_t region_bytes);

// Where an agent's rdma region is (its region announcement) and how long connecting may take.
struct RdmaRegionTarget {
  std::string host;
  uint16_t port = 0;
  uint64_t address = 0;
  uint32_t rkey = 0;
  uint64_t region_bytes = 0;
  // For the rdma_cm connect, and again for each of attach's two header READs.
  std::chrono::milliseconds timeout{2000};
  // The queue pair's local ACK timeout exponent and retry count (mqueue::RdmaConnectOptions).
  uint8_t ack_timeout = 18;
  uint8_t retry_count = 6;
};

// Connects one RC queue pair to the agent's RdmaRegionExporter and attaches to the region
// through it (validate_region checks every header field). Blocks up to about 3x the timeout:
// call it off the I/O threads. Without rdma-core (CARACAL_HAVE_RDMA) it returns kUnavailable.
//
// TX polling over rdma is adaptive: while requests are outstanding the binding fetches every
// TX tail (one RDMA READ) each round; with none outstanding it waits between fetches, from
// kRdmaIdleFetchMin doubling up to kRdmaIdleFetchMax, so an idle region costs a READ per
// millisecond at most, and a call a client queue makes waits at most that long to be seen.
// The shm binding reads its tails every round, as before (a load, no READ).
Result<std::unique_ptr<RegionBinding>> bind_rdma_region(const RdmaRegionTarget& target);
inline constexpr std::chrono::microseconds kRdmaIdleFetchMin{20};
inline constexpr std::chrono::microseconds kRdmaIdleFetchMax{1000};

}  // namespace caracal::server
