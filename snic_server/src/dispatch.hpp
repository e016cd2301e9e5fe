// Dispatch: one Service per configured service. Its listeners feed it requests, and it chooses
// the server queue of a registered region for each one and leaves the request in that queue's
// inbox for the mqueue manager (mqueue_manager/engine.hpp). Membership (regions joining and
// leaving dispatch) comes from the control endpoint; backpressure parks TCP connections while the
// queues are congested.
//
// Policies (config `dispatch`):
//  - round_robin: the next queue in turn;
//  - least_loaded: the queue with the fewest requests dispatched and not yet answered;
//  - flow_affinity: a flow (a TCP connection, a UDP peer) always goes to the same queue while
//    the set of queues does not change.
// Replies on one TCP connection leave in request order under every policy (the connection
// reorders them by sequence); flow_affinity only saves the reordering.
//
// Outlier ejection (ejection.hpp): an agent whose requests time out several times in a row on
// one of its queues (EngineEvents::on_reply_timeouts) leaves dispatch for a while, its regions
// staying attached (late answers are still read and dropped, answers in time bring it back). The
// last agent in dispatch is never ejected: a service whose every agent is slow stays a slow
// service, answering each request or failing it at its bound, rather than becoming one that
// answers `no agent` to all. For the same reason, when the last agent in dispatch leaves (lost,
// detached) while others are ejected, those return at once.
//
// With the engine in the I/O threads (engine_threads: 0), an I/O thread applies the policy to
// the queues of its own engine thread only (see Targets::by_thread); a thread that serves no
// queue uses those of the thread that stands in for it (Targets::stand_in).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config.hpp"
#include "ejection.hpp"
#include "metrics/drops.hpp"
#include "metrics/metrics.hpp"
#include "mqueue_manager/engine.hpp"
#include "mqueue_manager/engine_events.hpp"
#include "reply_routing.hpp"
#include "thread_shard.hpp"

namespace caracal::server {

// A listener's identifier of a flow made into the `flow` that Service::dispatch() takes: every
// bit of it mixed into the low bits, which flow_affinity keeps (the key modulo the queues
// chosen among). Identifiers are not random: a TCP connection's is its listener's count of
// connections so far, and connections are dealt to the I/O threads in turn, so one thread's
// connections have identifiers a thread count apart. Taken modulo that thread's queues as they
// are, every connection of a thread would go to one queue whenever the queue count divides the
// thread count. (The finalizer of SplitMix64: a bijection, so distinct flows stay distinct.)
constexpr uint64_t flow_key(uint64_t id) {
  id = (id ^ (id >> 30)) * 0xBF58476D1CE4E5B9ULL;
  id = (id ^ (id >> 27)) * 0x94D049BB133111EBULL;
  return id ^ (id >> 31);
}

enum class DispatchStatus : uint8_t {
  kQueued,     // in a queue's inbox; the reply will come through the token
  kCongested,  // queued, but the queue holds a ring's worth of waiting requests: stop reading
  kFull,       // not queued: every queue is congested (UDP drops it)
  kNoAgent,    // not queued: no agent serves the service
};

// Also what the engine reports to about the service's requests (EngineEvents, called on engine
// threads): answers and drops are counted, a region the engine dropped leaves dispatch, and room
// in the rings resumes parked connections.
class Service final : public EngineEvents {
 public:
  Service(const ServiceConfig& config, Engine& engine, Registry& metrics);
  ~Service();

  const std::string& name() const override { return config_.name; }
  const ServiceConfig& config() const { return config_; }

  // Sends a request to a queue chosen by the policy. `flow` identifies the connection or peer
  // for flow_affinity, which takes it modulo the queues: listeners pass flow_key() of theirs.
  // `may_exceed` queues it even on a congested queue (TCP has already read it); otherwise a
  // congested queue refuses it (kFull). The bytes are copied before it returns: called by the
  // I/O thread that hosts the chosen queue's engine thread, straight into the queue's RX ring
  // when nothing waits before it there (RegionBinding::write_now()), else into a message for
  // the queue's inbox.
  DispatchStatus dispatch(uint64_t token, std::string_view bytes, uint64_t flow, bool may_exceed);

  // Membership, from the control endpoint. add() fails if the region cannot carry the
  // service's largest message (the reason is returned); it gives the region the service's reply
  // bound (AgentRegion::set_reply_timeout), so call it before the region is attached.
  Status add(std::shared_ptr<AgentRegion> region);
  void remove(const AgentRegion* region);
  void remove_all();
  // Queues in dispatch (those of ejected regions left out).
  size_t queue_count() const;
  // Regions of the service ejected now.
  size_t ejected_count() const;

  // Backpressure: a TCP connection that stopped reading registers how to resume it; it is
  // resumed at once if no queue is congested any more, else when the engine next makes room.
  void park(std::function<void()> resume);

  // EngineEvents (engine threads).
  void on_room() override;
  void on_region_unusable(const AgentRegion& region) override { remove(&region); }
  void on_answer(Reply::Kind kind, std::chrono::steady_clock::duration latency) override;
  void on_line_reply() override { line_replies_.inc(); }
  void on_unrouted(DropReason reason) override { drops_.inc(reason); }
  void on_reply_timeouts(const AgentRegion& region, uint32_t expired, uint32_t in_a_row) override;
  void on_ejection_over(const AgentRegion& region, bool answered) override;

 private:
  struct Target {
    std::shared_ptr<AgentRegion> region;
    uint32_t queue = 0;
    uint32_t high_water = 0;  // waiting entries at which the queue counts as congested
  };
  struct Targets {
    std::vector<Target> all;
    // The indexes into `all` of the queues engine thread i serves. With the engine in the I/O
    // threads (Engine::hosted_thread()), a request goes to a queue of the thread that read it:
    // the reader's next engine round, right after its socket handlers, takes it into its ring,
    // and the request never waits for a hand-off to another thread, nor wakes one. The other
    // threads have nothing to do for it and sleep. Handing a lone request to the next thread's
    // queues instead keeps two threads at work for one client, with no lower latency
    // (`bench/results/EXPERIMENTS.md`, local-dispatch-h100x4).
    std::vector<std::vector<uint32_t>> by_thread;
    // For each engine thread, the thread whose queues stand for its own in that choice: itself
    // if it serves queues, else one that does. With more engine threads than queues (32 I/O
    // threads hosting the engine, one agent with 16 queues) the threads without queues are
    // dealt among those with queues, one each in turn, so that under load each of those takes
    // the requests of at most a few readers besides its own, instead of every reader without
    // queues spreading its requests over every queue (and waking every thread).
    std::vector<uint32_t> stand_in;
  };
  // `all` filled in: indexes it by engine thread.
  void index_by_thread(Targets& t) const;

  // Copy-on-write membership, one copy per thread shard (thread_shard.hpp). dispatch() reads its
  // thread's copy under that shard's lock, which other threads take only when they share the
  // shard or when the membership changes; so the I/O threads dispatching every request take no
  // common lock and count no common reference. add/remove (rare, under membership_m_) install the
  // new membership in every shard, one shard at a time.
  struct alignas(64) Shard {
    std::mutex m;
    std::shared_ptr<const Targets> targets;
    uint64_t next = 0;  // round_robin's position, and least_loaded's first queue to look at
  };
  // Runs f(targets, next) under the calling thread's shard lock.
  template <typename F>
  auto with_targets(F&& f) const {
    Shard& sh = shards_[thread_shard()];
    std::lock_guard lock(sh.m);
    return f(*sh.targets, sh.next);
  }
  void publish(std::shared_ptr<const Targets> next);  // caller holds membership_m_
  bool congested(const Target& t) const;
  bool any_congested() const;
  // A position in [0, n) by the policy; load(i) is the outstanding count of candidate i.
  template <typename Load>
  size_t pick(size_t n, uint64_t& next, uint64_t flow, Load load) const;

  // A region of the service, in dispatch or ejected.
  struct Member {
    std::shared_ptr<AgentRegion> region;
    Ejection ejection;
    Counter* timeouts = nullptr;   // caracal_agent_reply_timeouts_total of its agent
    Counter* ejections = nullptr;  // caracal_agent_ejections_total of its agent
    // The last time it was kept in dispatch although due for ejection (the last one there):
    // logged once per eject_ms.
    std::optional<std::chrono::steady_clock::time_point> spared_logged;
  };
  Member* member_locked(const AgentRegion& region);  // caller holds membership_m_; may be null
  size_t in_dispatch_locked() const;                 // caller holds membership_m_
  // Builds the targets from the members in dispatch and publishes them; caller holds
  // membership_m_.
  void rebuild_locked();
  void readmit_locked(Member& m, std::chrono::steady_clock::time_point now, const char* why);

  ServiceConfig config_;
  EjectionPolicy ejection_policy_;
  Engine& engine_;
  Registry& metrics_;

  std::unique_ptr<Shard[]> shards_;
  mutable std::mutex membership_m_;
  std::vector<Member> members_;             // under membership_m_
  std::shared_ptr<const Targets> targets_;  // the current membership; under membership_m_
  std::vector<uint64_t> queue_metric_ids_;
  std::vector<std::pair<const AgentRegion*, uint64_t>> metric_callbacks_;

  std::mutex parked_m_;
  std::vector<std::function<void()>> parked_;  // under parked_m_
  // parked_.size(), written under parked_m_, read by on_room() without it (see park()).
  std::atomic<size_t> parked_count_{0};

  Counter& requests_;
  Counter& replies_;
  Counter& errors_;
  Counter& pauses_;
  Counter& line_replies_;
  Gauge& ejected_;  // members ejected now (under membership_m_)
  DropCounters drops_;
  Histogram& latency_;
};

}  // namespace caracal::server
