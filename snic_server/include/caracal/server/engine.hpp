// The mqueue manager: one thread that owns every attached region and moves messages between
// the server's I/O threads and the rings.
//
// I/O threads hand requests to a queue's inbox (a short mutex-protected list). The engine
// thread drains inboxes into per-queue backlogs, writes as many entries into each RX ring as
// its credits allow and publishes the tail once per round, then fetches all TX tails of a
// region with one read and routes each reply by its token (reply.hpp). Client queues run the
// other way: TX entries go to the queue's destination link, and the destination's replies come
// back through the queue's inbox into its RX ring.
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
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/status.hpp"
#include "caracal/server/reply.hpp"

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
  // Moves everything waiting to `out` (engine thread). True if anything moved.
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

  // Called on the engine thread after the engine dropped the region for a fault (a corrupt
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

struct EngineOptions {
  // Rounds without work the engine spins before it starts yielding, then sleeping.
  uint32_t spin_rounds = 20000;
  // Longest sleep while replies are outstanding (latency cost of an idle engine).
  std::chrono::microseconds max_poll_sleep{50};
};

class Engine {
 public:
  Engine(ReplyTable& replies, EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void start();
  // Fails what is still in flight ("server shutting down") and joins the thread.
  void stop();

  // The engine owns the region from now on (any thread).
  void attach(std::shared_ptr<AgentRegion> region);
  // Closes the region's inboxes; once every request in flight is answered, or after `drain`,
  // fails what is left with "agent detached" and calls `done` (on the engine thread).
  void detach(std::shared_ptr<AgentRegion> region, std::chrono::milliseconds drain,
              std::function<void()> done);
  // The agent is gone: fails everything in flight with `reason` and drops the region.
  void fail(std::shared_ptr<AgentRegion> region, std::string reason);

  // Called after a request was submitted to an inbox: counts it in flight and wakes the
  // engine if it sleeps.
  void note_dispatched();
  // Called after any other submission (a destination's reply): wakes the engine if it sleeps.
  void notify();

  // Requests dispatched to some region and not yet answered or failed.
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }

  // Routes one answer (a reply, or a failure) to its client; counts it on `service`. The sink
  // may hold it until flush_replies(). Engine thread (and tests).
  void answer(Service* service, uint64_t token, Reply reply,
              std::chrono::steady_clock::time_point submitted);
  // Flushes every sink answer() delivered to since the last call (see ReplySink).
  void flush_replies();

 private:
  friend class RegionBinding;
  struct Command {
    enum class Kind { kAttach, kDetach, kFail } kind;
    std::shared_ptr<AgentRegion> region;
    std::chrono::milliseconds drain{0};
    std::function<void()> done;
    std::string reason;
  };
  struct Attached {
    std::shared_ptr<AgentRegion> region;
    bool draining = false;
    std::chrono::steady_clock::time_point drain_deadline;
    std::function<void()> done;
  };

  void run();
  bool apply_commands();
  void fail_region(Attached& a, const std::string& reason);
  void idle(uint32_t idle_rounds);
  void notify_always();

  ReplyTable& replies_;
  EngineOptions options_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  std::mutex commands_m_;
  std::vector<Command> commands_;
  std::vector<Attached> regions_;                     // engine thread only
  std::vector<std::shared_ptr<ReplySink>> to_flush_;  // engine thread only

  // Dekker-style handshake between notify() and the sleeping engine: the submitter bumps
  // `submitted_` after queuing and then reads `sleeping_`; the engine sets `sleeping_` and
  // then reads `submitted_`. Both sides use seq_cst so at least one of them sees the other.
  std::atomic<uint64_t> submitted_{0};
  std::atomic<bool> sleeping_{false};
  uint64_t round_seen_ = 0;  // submitted_ at the start of the engine's current round
  std::mutex sleep_m_;
  std::condition_variable sleep_cv_;

  std::atomic<int64_t> in_flight_{0};
};

// The transport-specific part of a region (engine thread only after attach).
class RegionBinding {
 public:
  virtual ~RegionBinding() = default;
  virtual const mqueue::RegionHeader& header() const = 0;
  // One round: inboxes to RX rings, TX rings to replies and client links. Returns whether it
  // did anything; a non-empty `fault` means the region is unusable (a corrupt entry).
  virtual bool serve(Engine& engine, AgentRegion& region, std::string& fault) = 0;
  // Tokens of requests written or waiting, with their submit times; cleared.
  virtual void take_in_flight(
      std::vector<std::pair<uint64_t, std::chrono::steady_clock::time_point>>& out) = 0;
  virtual size_t in_flight() const = 0;
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
