// What the mqueue manager serves: the regions agents registered, each with one inbox per queue
// where the I/O threads leave messages for the rings, and the transport-specific binding that
// reaches the region's memory.
//
// A queue's inbox is a short mutex-protected list: I/O threads (dispatch, destinations) submit
// to it, and the engine thread that serves the queue takes everything in it once per round.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "mqueue_manager/engine_events.hpp"

namespace caracal::server {

class EngineThread;  // one engine thread (src/mqueue_manager/engine_thread.hpp)

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
  // costs no lock, and no call: the engine looks at every inbox of its queues every round, and
  // each lock and unlock wrote the mutex's cache line, which submit() on an I/O thread writes too.
  bool take(std::deque<Message>& out) {
    if (!queued_.load(std::memory_order_relaxed)) return false;  // see queued_
    return take_locked(out);
  }
  // For RegionBinding::write_now(), on the engine thread that serves the queue: whether the
  // inbox may hold messages (a hint, as for take()), and whether it is still open. Only that
  // thread closes it (on detach or failure), so it reads open_ without the lock.
  bool maybe_waiting() const { return queued_.load(std::memory_order_relaxed); }
  bool open_for_owner() const { return open_; }

  // Dispatched and not yet answered (server queues): what least_loaded compares.
  std::atomic<int64_t> outstanding{0};
  // Submitted and not yet written into the ring.
  std::atomic<uint32_t> waiting{0};
  // Ring slots not yet given back by the accelerator, as of the engine's last round.
  std::atomic<uint32_t> ring_slots_in_use{0};
  // Requests the queue's handler answered (a reply, an error or none), since the region was
  // attached: how the service's requests spread over agents. Written only by the engine thread
  // that serves the queue (a load and a store, no read-modify-write), read by metric scrapes;
  // relaxed both ways, it orders nothing.
  std::atomic<uint64_t> answered{0};

 private:
  bool take_locked(std::deque<Message>& out);

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

class AgentRegion;

// The transport-specific part of a region (engine thread only after attach): the data path of
// shm or rdma (src/mqueue_manager/datapath.cpp), made by the setup of region_setup.hpp. The
// engine loop itself does not depend on the transport.
class RegionBinding {
 public:
  virtual ~RegionBinding() = default;
  virtual const mqueue::RegionHeader& header() const = 0;
  // Whether several engine threads may serve disjoint sets of its queues at once.
  virtual bool shareable() const = 0;
  // One round over `queues` (of one engine thread): inboxes to RX rings, TX rings to replies
  // and client links. Returns whether it did anything; a non-empty `fault` means the region is
  // unusable (a corrupt entry, a failed transport).
  virtual bool serve(EngineThread& engine, AgentRegion& region, std::span<const uint32_t> queues,
                     std::string& fault) = 0;
  // Fails every request on `queues` (server queues) dispatched at least the region's reply
  // bound before `now`, waiting for ring room or in the ring, with the region's timeout_reason(),
  // and reports them to its events (EngineEvents::on_reply_timeouts). Replies that come for them
  // later are dropped as late. Only for a region with a bound.
  virtual void expire(EngineThread& engine, AgentRegion& region, std::span<const uint32_t> queues,
                      std::chrono::steady_clock::time_point now) = 0;
  // Tokens of requests written or waiting on `queues` and not yet answered (timed-out ones are),
  // with their submit times; cleared.
  virtual void take_in_flight(
      std::span<const uint32_t> queues,
      std::vector<std::pair<uint64_t, std::chrono::steady_clock::time_point>>& out) = 0;
  // Requests written or waiting on `queues` and not yet answered (nor timed out).
  virtual size_t in_flight(std::span<const uint32_t> queues) const = 0;
  // Server queue `queue`'s request written straight into its RX ring, by the engine thread that
  // serves the queue (a hosted engine thread's I/O thread reading a request for its own queue):
  // one copy from the read buffer into the slot, no message, no inbox. The tail is published by
  // that thread's next round of serve(), once for all written since. False, and nothing
  // written, when the request must take the inbox: requests wait before it (the backlog or the
  // inbox), the ring has no room, the queue is closed, or the transport is remote.
  virtual bool write_now(AgentRegion& region, uint32_t queue, uint64_t token,
                         std::string_view bytes,
                         std::chrono::steady_clock::time_point submitted) = 0;
  // Raises the region's stop word (the agent's pollers return).
  virtual void request_stop() = 0;
};

// One region an agent registered for one service. `events` is that service (dispatch.hpp), or
// null (tests): what the engine reports about the region's requests goes there.
class AgentRegion {
 public:
  AgentRegion(std::string agent, uint64_t epoch, EngineEvents* events,
              std::unique_ptr<RegionBinding> binding);
  ~AgentRegion();

  const std::string& agent() const { return agent_; }
  uint64_t epoch() const { return epoch_; }
  EngineEvents* events() const { return events_; }
  const mqueue::RegionHeader& header() const { return binding_->header(); }
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
  // fails it. For whoever registered the region (the control endpoint reconnects an rdma
  // region); its service hears of it through EngineEvents::on_region_unusable. Set before
  // attach.
  void set_on_fault(std::function<void(const std::string&)> f) { on_fault_ = std::move(f); }
  void notify_fault(const std::string& fault) const {
    if (on_fault_) on_fault_(fault);
  }

  // The engine thread that serves the region's server queue 0, where the engine starts dealing
  // its queues among its threads (Engine::place()); 0 for a region never placed. Set before the
  // region is added to dispatch and attached (whose locks publish it), read-only afterwards.
  uint32_t engine_base() const { return engine_base_; }
  void set_engine_base(uint32_t base) { engine_base_ = base; }

  // The service's reply bound (ServiceConfig::reply_timeout_ms; 0: none): a request dispatched
  // to the region and not answered within it is failed with timeout_reason() by the engine
  // thread that serves its queue. Set with the region's service (Service::add()), before attach,
  // whose command lock publishes it; read-only afterwards.
  std::chrono::milliseconds reply_timeout() const { return reply_timeout_; }
  // "agent 'echo-1' did not answer within 200 ms"
  const std::string& timeout_reason() const { return timeout_reason_; }
  void set_reply_timeout(std::chrono::milliseconds bound);

  // Outlier ejection (dispatch.hpp): until when the region is out of its service's dispatch,
  // or nullopt while it is in it. Written by the service under its membership lock; read by
  // engine threads, which tell the service when the time is up or the region answered in time
  // (EngineEvents::on_ejection_over). Relaxed both ways: it is a hint that orders nothing; the
  // service decides under its lock, and dispatch learns of it through its shards' locks.
  std::optional<std::chrono::steady_clock::time_point> ejected_until() const {
    const int64_t ns = ejected_until_ns_.load(std::memory_order_relaxed);
    if (ns == 0) return std::nullopt;
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
  }
  void set_ejected_until(std::optional<std::chrono::steady_clock::time_point> until);

 private:
  std::string agent_;
  uint64_t epoch_;
  EngineEvents* events_;
  std::unique_ptr<RegionBinding> binding_;
  std::vector<std::shared_ptr<QueueInbox>> inboxes_;
  std::vector<std::shared_ptr<ClientLink>> links_;
  std::function<void(const std::string&)> on_fault_;
  uint32_t engine_base_ = 0;
  std::chrono::milliseconds reply_timeout_{0};
  std::string timeout_reason_;
  std::atomic<int64_t> ejected_until_ns_{0};  // steady_clock ns; 0: in dispatch
};

}  // namespace caracal::server
