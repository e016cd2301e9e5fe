#include "dispatch.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

namespace caracal::server {

using Clock = std::chrono::steady_clock;

Service::Service(const ServiceConfig& config, Engine& engine, Registry& metrics)
    : config_(config),
      ejection_policy_(EjectionPolicy::of(config)),
      engine_(engine),
      metrics_(metrics),
      shards_(std::make_unique<Shard[]>(kThreadShards)),
      targets_(std::make_shared<const Targets>()),
      requests_(metrics.counter("caracal_service_requests_total",
                                "Requests dispatched to the service's queues",
                                {{"service", config.name}})),
      replies_(metrics.counter("caracal_service_replies_total",
                               "Answers that came back from the service's handlers",
                               {{"service", config.name}})),
      errors_(metrics.counter("caracal_service_errors_total",
                              "Answers that were errors (handler errors, lost agents)",
                              {{"service", config.name}})),
      pauses_(metrics.counter("caracal_service_backpressure_pauses_total",
                              "Times a TCP connection stopped reading because the service's "
                              "queues were congested",
                              {{"service", config.name}})),
      line_replies_(metrics.counter("caracal_service_tx_line_replies_total",
                                    "Replies taken from their TX lines, ahead of the tail that "
                                    "publishes them",
                                    {{"service", config.name}})),
      ejected_(metrics.gauge("caracal_service_agents_ejected",
                             "Agents of the service out of its dispatch now for timing out",
                             {{"service", config.name}})),
      drops_(metrics, "caracal_service_drops_total", "Requests or replies dropped, by reason",
             {{"service", config.name}}),
      latency_(metrics.histogram("caracal_service_latency_seconds",
                                 "Time from dispatch to the answer leaving the engine",
                                 {{"service", config.name}}, latency_buckets_seconds())) {
  for (uint32_t k = 0; k < kThreadShards; ++k) {
    shards_[k].targets = targets_;
    shards_[k].next = k;  // threads start their round robin at different queues
  }
}

void Service::publish(std::shared_ptr<const Targets> next) {
  targets_ = std::move(next);
  for (uint32_t k = 0; k < kThreadShards; ++k) {
    std::shared_ptr<const Targets> old;  // released outside the shard's lock
    std::lock_guard lock(shards_[k].m);
    old = std::exchange(shards_[k].targets, targets_);
  }
}

Service::~Service() {
  std::lock_guard lock(membership_m_);
  for (auto& [region, id] : metric_callbacks_)
    metrics_.remove_callback(id);
}

bool Service::congested(const Target& t) const {
  return t.region->inbox(t.queue).waiting.load(std::memory_order_relaxed) >= t.high_water;
}

bool Service::any_congested() const {
  return with_targets([this](const Targets& t, uint64_t&) {
    return std::any_of(t.all.begin(), t.all.end(),
                       [this](const Target& x) { return congested(x); });
  });
}

void Service::index_by_thread(Targets& t) const {
  const uint32_t threads = engine_.threads();
  t.by_thread.assign(threads, {});
  for (uint32_t i = 0; i < t.all.size(); ++i)
    t.by_thread[engine_.thread_of(*t.all[i].region, t.all[i].queue)].push_back(i);
  std::vector<uint32_t> serving;
  for (uint32_t i = 0; i < threads; ++i) {
    if (!t.by_thread[i].empty()) serving.push_back(i);
  }
  t.stand_in.clear();
  if (serving.empty()) return;  // no queues: nothing to choose among
  t.stand_in.resize(threads);
  for (uint32_t i = 0; i < threads; ++i)
    t.stand_in[i] = t.by_thread[i].empty() ? serving[i % serving.size()] : i;
}

template <typename Load>
size_t Service::pick(size_t n, uint64_t& next, uint64_t flow, Load load) const {
  switch (config_.dispatch) {
    case DispatchPolicy::kRoundRobin:
      return next++ % n;
    case DispatchPolicy::kFlowAffinity:
      return flow % n;
    case DispatchPolicy::kLeastLoaded: {
      // Start the scan at a rotating position so that ties do not all land on queue 0.
      const size_t start = next++ % n;
      size_t best = start;
      int64_t best_load = INT64_MAX;
      for (size_t i = 0; i < n; ++i) {
        const size_t k = (start + i) % n;
        if (const int64_t l = load(k); l < best_load) {
          best_load = l;
          best = k;
        }
      }
      return best;
    }
  }
  return 0;
}

DispatchStatus Service::dispatch(uint64_t token, std::string_view bytes, uint64_t flow,
                                 bool may_exceed) {
  return with_targets([&](const Targets& t, uint64_t& next) {
    const size_t n = t.all.size();
    if (n == 0) return DispatchStatus::kNoAgent;
    const auto outstanding = [&](size_t i) {
      return t.all[i].region->inbox(t.all[i].queue).outstanding.load(std::memory_order_relaxed);
    };
    // Read by an I/O thread that hosts an engine thread: its own queues (see Targets::by_thread),
    // a thread that serves none standing on the queues of another (Targets::stand_in). The
    // policy picks among them as it would among all.
    const std::vector<uint32_t>* among = nullptr;
    const int host = Engine::hosted_thread();
    if (host >= 0 && static_cast<size_t>(host) < t.stand_in.size()) {
      among = &t.by_thread[t.stand_in[static_cast<size_t>(host)]];
    }
    size_t k = 0;
    if (among != nullptr) {
      const std::vector<uint32_t>& queues = *among;
      k = queues[pick(queues.size(), next, flow, [&](size_t i) { return outstanding(queues[i]); })];
    } else {
      k = pick(n, next, flow, outstanding);
    }
    const Clock::time_point now = Clock::now();
    std::optional<Message> m;  // made only for an inbox
    bool saw_congested = false;
    // A queue can close under us (its agent was lost a moment ago), or be congested; try the
    // others in turn before giving up.
    for (size_t attempt = 0; attempt < n; ++attempt, k = (k + 1) % n) {
      const Target& target = t.all[k];
      const bool full = congested(target);
      saw_congested |= full;
      if (full && !may_exceed) continue;
      QueueInbox& inbox = target.region->inbox(target.queue);
      inbox.outstanding.fetch_add(1, std::memory_order_relaxed);
      // This thread runs the rounds of the queue's engine thread: the request goes into the
      // ring now, and this thread's next round publishes it.
      const bool own = host >= 0 && engine_.thread_of(*target.region, target.queue) ==
                                        static_cast<uint32_t>(host);
      if (!own ||
          !target.region->binding().write_now(*target.region, target.queue, token, bytes, now)) {
        if (!m) m.emplace(Message{token, 0, std::string(bytes), now});
        if (!inbox.submit(*m)) {  // closed: its agent is going away; try the next queue
          inbox.outstanding.fetch_sub(1, std::memory_order_relaxed);
          continue;
        }
      }
      requests_.inc();
      engine_.note_dispatched(*target.region, target.queue);
      return full ? DispatchStatus::kCongested : DispatchStatus::kQueued;
    }
    return saw_congested ? DispatchStatus::kFull : DispatchStatus::kNoAgent;
  });
}

Status Service::add(std::shared_ptr<AgentRegion> region) {
  const mqueue::RegionHeader& h = region->header();
  if (h.max_message_bytes < config_.max_message_bytes) {
    return invalid_argument("the region's rings carry messages of at most " +
                            std::to_string(h.max_message_bytes) + " bytes but service " +
                            config_.name + " accepts up to " +
                            std::to_string(config_.max_message_bytes) +
                            " (raise max_message_bytes in the agent's config)");
  }
  region->set_reply_timeout(std::chrono::milliseconds(config_.reply_timeout_ms));
  std::lock_guard lock(membership_m_);
  const Labels agent_labels{{"service", config_.name}, {"agent", region->agent()}};
  members_.push_back(Member{
      region,
      {},
      &metrics_.counter("caracal_agent_reply_timeouts_total",
                        "Requests the agent did not answer within the service's "
                        "reply_timeout_ms (each got an error reply)",
                        agent_labels),
      &metrics_.counter("caracal_agent_ejections_total",
                        "Times the agent was taken out of the service's dispatch for requests "
                        "that timed out in a row",
                        agent_labels),
      std::nullopt});
  for (uint32_t q = 0; q < region->server_queues(); ++q) {
    const Labels labels{
        {"service", config_.name}, {"agent", region->agent()}, {"queue", std::to_string(q)}};
    const QueueInbox* inbox = &region->inbox(q);
    // Each gauge reads one of the inbox's counters at scrape time (relaxed: reporting only).
    auto gauge = [&](const char* name, const char* help, auto QueueInbox::*counter) {
      metric_callbacks_.emplace_back(
          region.get(), metrics_.gauge_callback(name, help, labels, [inbox, counter] {
            return static_cast<double>((inbox->*counter).load(std::memory_order_relaxed));
          }));
    };
    // The engine reads the accelerator's head only when it has requests to write (a read of
    // GPU or remote memory): with no traffic the gauge keeps the last reading.
    gauge("caracal_queue_ring_slots_in_use",
          "RX ring slots the accelerator had not given back the last time the engine had requests "
          "for the ring; with no traffic it keeps that reading",
          &QueueInbox::ring_slots_in_use);
    gauge("caracal_queue_outstanding_requests",
          "Requests dispatched to the queue and not yet answered", &QueueInbox::outstanding);
    gauge("caracal_queue_waiting_requests", "Requests waiting for room in the queue's RX ring",
          &QueueInbox::waiting);
    gauge("caracal_queue_answered_requests",
          "Requests the queue's handler answered since its region was attached",
          &QueueInbox::answered);
  }
  rebuild_locked();
  return Status::ok_status();
}

Service::Member* Service::member_locked(const AgentRegion& region) {
  for (Member& m : members_) {
    if (m.region.get() == &region) return &m;
  }
  return nullptr;
}

size_t Service::in_dispatch_locked() const {
  return static_cast<size_t>(std::count_if(members_.begin(), members_.end(),
                                           [](const Member& m) { return !m.ejection.ejected(); }));
}

void Service::rebuild_locked() {
  auto next = std::make_shared<Targets>();
  for (const Member& m : members_) {
    if (m.ejection.ejected()) continue;
    const uint32_t capacity = m.region->header().ring_capacity;
    for (uint32_t q = 0; q < m.region->server_queues(); ++q)
      next->all.push_back(Target{m.region, q, capacity});
  }
  index_by_thread(*next);
  publish(std::move(next));
  ejected_.set(static_cast<int64_t>(members_.size() - in_dispatch_locked()));
}

void Service::readmit_locked(Member& m, Clock::time_point now, const char* why) {
  m.ejection.readmit(now);
  m.region->set_ejected_until(std::nullopt);
  spdlog::info("agent '{}' is back in the dispatch of service '{}': {}", m.region->agent(),
               config_.name, why);
}

void Service::on_reply_timeouts(const AgentRegion& region, uint32_t expired, uint32_t in_a_row) {
  std::lock_guard lock(membership_m_);
  Member* m = member_locked(region);
  if (m == nullptr) return;  // left the service meanwhile
  m->timeouts->inc(expired);
  if (!ejection_policy_.due(in_a_row) || m->ejection.ejected()) return;
  const Clock::time_point now = Clock::now();
  if (in_dispatch_locked() <= 1) {
    // The last agent in dispatch: ejecting it would turn a slow service into one that answers
    // nothing but `no agent` (see the top of dispatch.hpp).
    if (!m->spared_logged || now - *m->spared_logged >= ejection_policy_.period) {
      m->spared_logged = now;
      SPDLOG_WARN(
          "agent '{}': {} request(s) in a row unanswered within {} ms on a queue of service "
          "'{}'; not ejected: it is the last agent of the service in dispatch",
          region.agent(), in_a_row, config_.reply_timeout_ms, config_.name);
    }
    return;
  }
  const std::chrono::milliseconds period = m->ejection.eject(now, ejection_policy_);
  m->region->set_ejected_until(m->ejection.until());
  m->ejections->inc();
  rebuild_locked();
  SPDLOG_WARN(
      "agent '{}' ejected from the dispatch of service '{}' for {} ms: {} request(s) in a row "
      "unanswered within {} ms on one of its queues (ejection {} in a row)",
      region.agent(), config_.name, period.count(), in_a_row, config_.reply_timeout_ms,
      m->ejection.streak());
  on_room();  // connections parked on its congested queues go on with the other agents
}

void Service::on_ejection_over(const AgentRegion& region, bool answered) {
  std::lock_guard lock(membership_m_);
  Member* m = member_locked(region);
  if (m == nullptr || !m->ejection.ejected()) return;  // gone, or back already
  const Clock::time_point now = Clock::now();
  if (!answered && now < m->ejection.until()) return;
  readmit_locked(*m, now, answered ? "it answered a request in time" : "its ejection ended");
  rebuild_locked();
}

void Service::remove(const AgentRegion* region) {
  std::lock_guard lock(membership_m_);
  std::erase_if(members_, [&](const Member& m) {
    if (m.region.get() != region) return false;
    // Out of the service: engine threads, which may still serve it while it drains, have no one
    // to tell about its ejection any more.
    m.region->set_ejected_until(std::nullopt);
    return true;
  });
  if (in_dispatch_locked() == 0) {
    // Whoever is left is ejected: they serve again rather than nobody (see the top of
    // dispatch.hpp).
    const Clock::time_point now = Clock::now();
    for (Member& m : members_) {
      readmit_locked(m, now, "no other agent of the service is left in dispatch");
    }
  }
  rebuild_locked();
  on_room();  // connections parked on the removed queues would otherwise wait forever
  for (auto it = metric_callbacks_.begin(); it != metric_callbacks_.end();) {
    if (it->first == region) {
      metrics_.remove_callback(it->second);
      it = metric_callbacks_.erase(it);
    } else {
      ++it;
    }
  }
}

void Service::remove_all() {
  std::vector<const AgentRegion*> regions;
  {
    std::lock_guard lock(membership_m_);
    for (const Member& m : members_)
      regions.push_back(m.region.get());
  }
  for (const AgentRegion* r : regions)
    remove(r);
}

size_t Service::queue_count() const {
  return with_targets([](const Targets& t, uint64_t&) { return t.all.size(); });
}

size_t Service::ejected_count() const {
  std::lock_guard lock(membership_m_);
  return members_.size() - in_dispatch_locked();
}

void Service::park(std::function<void()> resume) {
  {
    std::lock_guard lock(parked_m_);
    parked_.push_back(std::move(resume));
    parked_count_.store(parked_.size(), std::memory_order_relaxed);
    // Pairs with the fence in on_room(), Dekker-style: this thread writes parked_count_ and
    // then reads the inboxes' `waiting`; the engine writes `waiting` (the room it made) and
    // then reads parked_count_. With a seq_cst fence between each write and read, at least one
    // of them sees the other's write: either this check sees the room, or on_room() sees this
    // connection parked (and takes the lock, which orders the rest).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (any_congested()) {
      pauses_.inc();
      return;
    }
    resume = std::move(parked_.back());
    parked_.pop_back();
    parked_count_.store(parked_.size(), std::memory_order_relaxed);
  }
  resume();
}

void Service::on_room() {
  // Every engine thread calls this after every round that wrote into a ring: with nothing
  // parked (the rule under load over UDP, and over TCP until the rings fill) it takes no lock,
  // so that the engine threads do not all pass the lock's cache line around. See park() for
  // the fence.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (parked_count_.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::function<void()>> resume;
  {
    std::lock_guard lock(parked_m_);
    if (parked_.empty() || any_congested()) return;
    resume.swap(parked_);
    parked_count_.store(0, std::memory_order_relaxed);
  }
  for (auto& r : resume)
    r();
}

void Service::on_answer(Reply::Kind kind, Clock::duration latency) {
  replies_.inc();
  if (kind == Reply::Kind::kError) errors_.inc();
  latency_.observe(std::chrono::duration<double>(latency).count());
}

}  // namespace caracal::server
