#include "caracal/server/engine.hpp"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <type_traits>

#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#ifdef CARACAL_HAVE_RDMA
#include "caracal/mqueue/rdma.hpp"
#endif
#include "caracal/server/service.hpp"
#include "engine_profile.hpp"

namespace caracal::server {

namespace prof = engine_profile;

#ifdef CARACAL_ENGINE_PROFILE
namespace engine_profile {
namespace {

constexpr const char* kStageNames[kStageCount] = {
    "round",        "serve",      "inbox_take",  "rx_write",   "rx_copy", "request_free",
    "tx_fetch",     "tx_next",    "reply_alloc", "reply_copy", "route",   "deliver",
    "answer_other", "tx_release", "flush",       "idle"};

thread_local std::chrono::steady_clock::time_point started;
thread_local rusage usage_at_start;
thread_local timespec cpu_at_start;

}  // namespace

void thread_begin() {
  totals = Totals{};
  started = std::chrono::steady_clock::now();
  getrusage(RUSAGE_THREAD, &usage_at_start);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_at_start);
}

void thread_end() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  timespec cpu{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double cpu_s = static_cast<double>(cpu.tv_sec - cpu_at_start.tv_sec) +
                       static_cast<double>(cpu.tv_nsec - cpu_at_start.tv_nsec) * 1e-9;
  const double user_s =
      static_cast<double>(u.ru_utime.tv_sec - usage_at_start.ru_utime.tv_sec) +
      static_cast<double>(u.ru_utime.tv_usec - usage_at_start.ru_utime.tv_usec) * 1e-6;
  const double sys_s =
      static_cast<double>(u.ru_stime.tv_sec - usage_at_start.ru_stime.tv_sec) +
      static_cast<double>(u.ru_stime.tv_usec - usage_at_start.ru_stime.tv_usec) * 1e-6;
  std::fprintf(stderr,
               "engine profile: wall %.3f s, thread cpu %.3f s (user %.3f, sys %.3f), minor "
               "faults %ld, major %ld, voluntary switches %ld, involuntary %ld\n",
               wall_s, cpu_s, user_s, sys_s, u.ru_minflt - usage_at_start.ru_minflt,
               u.ru_majflt - usage_at_start.ru_majflt, u.ru_nvcsw - usage_at_start.ru_nvcsw,
               u.ru_nivcsw - usage_at_start.ru_nivcsw);
  for (uint32_t i = 0; i < kStageCount; ++i) {
    if (totals.count[i] == 0) continue;
    std::fprintf(stderr, "engine profile: %-13s %10.3f ms %10llu x %9.1f ns\n", kStageNames[i],
                 static_cast<double>(totals.ns[i]) * 1e-6,
                 static_cast<unsigned long long>(totals.count[i]),
                 static_cast<double>(totals.ns[i]) / static_cast<double>(totals.count[i]));
  }
}

}  // namespace engine_profile
#endif

// ---------------------------------------------------------------------------------------------
// QueueInbox

bool QueueInbox::submit(Message& m) {
  std::lock_guard lock(m_);
  if (!open_) return false;
  items_.push_back(std::move(m));
  waiting.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::vector<Message> QueueInbox::close() {
  std::lock_guard lock(m_);
  open_ = false;
  waiting.fetch_sub(static_cast<uint32_t>(items_.size()), std::memory_order_relaxed);
  std::vector<Message> left;
  left.swap(items_);
  return left;
}

bool QueueInbox::take(std::deque<Message>& out) {
  std::lock_guard lock(m_);
  if (items_.empty()) return false;
  for (Message& m : items_)
    out.push_back(std::move(m));
  items_.clear();
  return true;
}

// ---------------------------------------------------------------------------------------------
// AgentRegion

AgentRegion::AgentRegion(std::string agent, uint64_t epoch, Service* service,
                         std::unique_ptr<RegionBinding> binding)
    : agent_(std::move(agent)), epoch_(epoch), service_(service), binding_(std::move(binding)) {
  const uint32_t queues = mqueue::queue_count(binding_->header());
  for (uint32_t q = 0; q < queues; ++q)
    inboxes_.push_back(std::make_shared<QueueInbox>());
}

AgentRegion::~AgentRegion() {
  for (auto& l : links_) {
    if (l) l->close();
  }
}

const mqueue::RegionHeader& AgentRegion::header() const {
  return binding_->header();
}

std::string AgentRegion::label() const {
  char epoch[24];
  std::snprintf(epoch, sizeof(epoch), "%016llx", static_cast<unsigned long long>(epoch_));
  return "agent " + agent_ + " epoch " + epoch + ", service " +
         (service_ != nullptr ? service_->name() : std::string("?"));
}

// ---------------------------------------------------------------------------------------------
// TransportBinding: the data path of one region over transport T.

namespace {

using Clock = std::chrono::steady_clock;

template <mqueue::Transport T>
class TransportBinding final : public RegionBinding {
 public:
  // `memory` keeps whatever backs the region (the shm mapping) alive as long as the binding.
  TransportBinding(std::unique_ptr<T> transport, mqueue::RemoteRegion<T> region,
                   std::shared_ptr<void> memory)
      : memory_(std::move(memory)),
        transport_(std::move(transport)),
        region_(std::move(region)),
        backlog_(mqueue::queue_count(region_.header())) {}

  const mqueue::RegionHeader& header() const override { return region_.header(); }

  bool serve(Engine& engine, AgentRegion& r, std::string& fault) override {
    bool busy = false;
    const mqueue::RegionHeader& h = region_.header();
    const uint32_t queues = mqueue::queue_count(h);
    if (Status s = transport_->progress(); !s.ok()) {
      fault = "transport: " + s.message();
      return true;
    }
    // Inboxes to RX rings, as far as credits go; one tail publication per ring per round.
    for (uint32_t q = 0; q < queues; ++q) {
      QueueInbox& inbox = r.inbox(q);
      std::deque<Message>& backlog = backlog_[q];
      {
        prof::Scope t(prof::kInboxTake);
        busy |= inbox.take(backlog);
      }
      if (backlog.empty()) continue;
      auto& rx = region_.rx(q);
      const bool server_queue = q < h.server_queue_count;
      uint32_t written = 0;
      prof::Scope rx_write(prof::kRxWrite);
      while (!backlog.empty()) {
        Message& m = backlog.front();
        std::byte* dst = rx.reserve(static_cast<uint32_t>(m.bytes.size()));
        if (dst == nullptr) break;  // no credits yet (a read of the head is in flight)
        if (!m.bytes.empty()) {
          prof::Scope t(prof::kRxCopy);
          std::memcpy(dst, m.bytes.data(), m.bytes.size());
        }
        rx.commit(static_cast<uint32_t>(m.bytes.size()), m.token, m.flags);
        if (server_queue) in_flight_.emplace(m.token, m.submitted);
        {
          prof::Scope t(prof::kRequestFree);
          backlog.pop_front();
        }
        ++written;
      }
      if (written != 0) {
        rx.publish();
        inbox.waiting.fetch_sub(written, std::memory_order_relaxed);
        busy = true;
        if (server_queue && r.service() != nullptr) r.service()->on_room();
      }
      inbox.ring_slots_in_use.store(rx.outstanding_slots(), std::memory_order_relaxed);
    }
    // TX rings: one read of every tail, then the entries each one uncovered.
    std::optional<prof::Scope> tx_fetch(std::in_place, prof::kTxFetch);
    if (should_fetch_tx_tails()) region_.fetch_tx_tails();
    if (Status s = transport_->progress(); !s.ok()) {
      fault = "transport: " + s.message();
      return true;
    }
    if (!region_.deliver_tx_tails()) return busy;
    tx_fetch.reset();
    bool delivered_any = false;
    for (uint32_t q = 0; q < queues; ++q) {
      auto& tx = region_.tx(q);
      const bool server_queue = q < h.server_queue_count;
      mqueue::Entry e;
      mqueue::PollResult pr;
      bool any = false;
      for (;;) {
        {
          prof::Scope t(prof::kTxNext);
          pr = tx.next(e);
        }
        if (pr != mqueue::PollResult::kReady) break;
        any = true;
        if (server_queue) {
          reply(engine, r, q, e);
        } else {
          call_out(r, q - h.server_queue_count, e);
        }
      }
      if (any) {
        prof::Scope t(prof::kTxRelease);
        tx.release();
        tx.publish();
        busy = true;
        delivered_any = true;
      }
      if (pr == mqueue::PollResult::kCorrupt) {
        fault = std::string(server_queue ? "server" : "client") + " queue " + std::to_string(q) +
                ": corrupt TX entry (" + mqueue::entry_check_name(tx.last_check()) + ")";
        return true;
      }
    }
    note_tx_fetch(delivered_any);
    return busy;
  }

  void take_in_flight(std::vector<std::pair<uint64_t, Clock::time_point>>& out) override {
    for (auto& [token, t] : in_flight_)
      out.emplace_back(token, t);
    in_flight_.clear();
    for (uint32_t q = 0; q < region_.header().server_queue_count; ++q) {
      for (Message& m : backlog_[q])
        out.emplace_back(m.token, m.submitted);
      backlog_[q].clear();
    }
  }

  size_t in_flight() const override {
    size_t n = in_flight_.size();
    for (uint32_t q = 0; q < region_.header().server_queue_count; ++q)
      n += backlog_[q].size();
    return n;
  }

  void request_stop() override { region_.request_stop(); }

 private:
  // A remote transport pays a READ per TX-tail fetch: fetch every round while requests are
  // outstanding, back off while none are (see bind_rdma_region). A local one fetches always.
  static constexpr bool kAdaptiveTxPolling = !std::is_same_v<T, mqueue::ShmTransport>;

  bool should_fetch_tx_tails() {
    if constexpr (!kAdaptiveTxPolling) {
      return true;
    } else {
      if (!in_flight_.empty()) {
        idle_fetch_gap_ = std::chrono::microseconds{0};
        return true;
      }
      return Clock::now() >= next_idle_fetch_;
    }
  }

  // After a fetch was delivered: anything found keeps polling busy; an empty fetch with
  // nothing outstanding doubles the gap to the next one, up to kRdmaIdleFetchMax.
  void note_tx_fetch(bool found) {
    if constexpr (kAdaptiveTxPolling) {
      if (found || !in_flight_.empty()) {
        idle_fetch_gap_ = std::chrono::microseconds{0};
      } else {
        idle_fetch_gap_ = std::clamp(idle_fetch_gap_ * 2, kRdmaIdleFetchMin, kRdmaIdleFetchMax);
      }
      next_idle_fetch_ = Clock::now() + idle_fetch_gap_;
    } else {
      (void)found;
    }
  }

  void reply(Engine& engine, AgentRegion& r, uint32_t q, const mqueue::Entry& e) {
    const auto it = in_flight_.find(e.token);
    if (it == in_flight_.end()) {
      // Not a token this region was given (or one already answered): a handler bug. It cannot
      // be routed safely, so it is dropped.
      if (r.service() != nullptr) r.service()->count_drop(DropReason::kUnknownToken);
      return;
    }
    const Clock::time_point submitted = it->second;
    in_flight_.erase(it);
    r.inbox(q).outstanding.fetch_sub(1, std::memory_order_relaxed);
    Reply rep;
    if ((e.flags & mqueue::kSlotNoReply) != 0) {
      rep.kind = Reply::Kind::kNoReply;
    } else {
      rep.kind = (e.flags & mqueue::kSlotError) != 0 ? Reply::Kind::kError : Reply::Kind::kData;
      {
        prof::Scope t(prof::kReplyAlloc);
        rep.bytes.reserve(e.length);
      }
      prof::Scope t(prof::kReplyCopy);
      rep.bytes.assign(reinterpret_cast<const char*>(e.payload), e.length);
    }
    engine.answer(r.service(), e.token, std::move(rep), submitted);
  }

  void call_out(AgentRegion& r, uint32_t client, const mqueue::Entry& e) {
    ClientLink* link = r.link(client);
    std::string bytes(reinterpret_cast<const char*>(e.payload), e.length);
    if (link == nullptr) {
      Message m{e.token, mqueue::kSlotError,
                "client queue " + std::to_string(client) + " has no destination", Clock::now()};
      (void)r.inbox(r.server_queues() + client).submit(m);
      return;
    }
    link->send(e.token, std::move(bytes));
  }

  std::shared_ptr<void> memory_;  // declared first: destroyed after the transport using it
  std::unique_ptr<T> transport_;
  mqueue::RemoteRegion<T> region_;
  std::vector<std::deque<Message>> backlog_;
  std::unordered_map<uint64_t, Clock::time_point> in_flight_;
  std::chrono::microseconds idle_fetch_gap_{0};  // adaptive TX polling only
  Clock::time_point next_idle_fetch_{};
};

}  // namespace

Result<std::unique_ptr<RegionBinding>> bind_shm_region(const std::string& shm_name,
                                                       uint64_t region_bytes) {
  Result<mqueue::ShmMapping> m = mqueue::ShmMapping::open_named(shm_name);
  if (!m.ok()) return m.status();
  auto mapping = std::make_shared<mqueue::ShmMapping>(std::move(m).value());
  if (mapping->size() != region_bytes) {
    return invalid_argument("region_bytes: the agent announced " + std::to_string(region_bytes) +
                            " bytes but shm '" + shm_name + "' holds " +
                            std::to_string(mapping->size()));
  }
  auto transport = std::make_unique<mqueue::ShmTransport>(mapping->data(), mapping->size());
  Result<mqueue::RemoteRegion<mqueue::ShmTransport>> region =
      mqueue::RemoteRegion<mqueue::ShmTransport>::attach(transport.get());
  if (!region.ok()) return region.status();
  return std::unique_ptr<RegionBinding>(new TransportBinding<mqueue::ShmTransport>(
      std::move(transport), std::move(region).value(), std::move(mapping)));
}

Result<std::unique_ptr<RegionBinding>> bind_rdma_region(const RdmaRegionTarget& target) {
#ifdef CARACAL_HAVE_RDMA
  mqueue::RdmaConnectOptions o;
  o.host = target.host;
  o.port = target.port;
  o.region = mqueue::RdmaRegionAddress{target.address, target.rkey, target.region_bytes};
  o.timeout = target.timeout;
  o.ack_timeout = target.ack_timeout;
  o.retry_count = target.retry_count;
  Result<std::unique_ptr<mqueue::RdmaTransport>> t = mqueue::RdmaTransport::connect(o);
  if (!t.ok()) return t.status();
  std::unique_ptr<mqueue::RdmaTransport> transport = std::move(t).value();
  Result<mqueue::RemoteRegion<mqueue::RdmaTransport>> region =
      mqueue::RemoteRegion<mqueue::RdmaTransport>::attach(transport.get(), target.timeout);
  if (!region.ok()) {
    return Status(region.status().code(),
                  "rdma " + transport->peer() + ": attach: " + region.status().message());
  }
  return std::unique_ptr<RegionBinding>(new TransportBinding<mqueue::RdmaTransport>(
      std::move(transport), std::move(region).value(), nullptr));
#else
  return Status(StatusCode::kUnavailable,
                "transport rdma to " + target.host + ": this server was built without rdma-core");
#endif
}

// ---------------------------------------------------------------------------------------------
// Engine

Engine::Engine(ReplyTable& replies, EngineOptions options) : replies_(replies), options_(options) {}

Engine::~Engine() {
  stop();
}

void Engine::start() {
  if (thread_.joinable()) return;
  stopping_.store(false);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "caracal-engine");
    prof::thread_begin();
    run();
    prof::thread_end();
  });
}

void Engine::stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  notify_always();
  thread_.join();
}

void Engine::attach(std::shared_ptr<AgentRegion> region) {
  {
    std::lock_guard lock(commands_m_);
    commands_.push_back(Command{Command::Kind::kAttach, std::move(region), {}, {}, {}});
  }
  notify_always();
}

void Engine::detach(std::shared_ptr<AgentRegion> region, std::chrono::milliseconds drain,
                    std::function<void()> done) {
  {
    std::lock_guard lock(commands_m_);
    commands_.push_back(
        Command{Command::Kind::kDetach, std::move(region), drain, std::move(done), {}});
  }
  notify_always();
}

void Engine::fail(std::shared_ptr<AgentRegion> region, std::string reason) {
  {
    std::lock_guard lock(commands_m_);
    commands_.push_back(
        Command{Command::Kind::kFail, std::move(region), {}, {}, std::move(reason)});
  }
  notify_always();
}

void Engine::note_dispatched() {
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  notify();
}

void Engine::notify() {
  // Pairs with idle(): see the comment on submitted_/sleeping_.
  submitted_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) {
    std::lock_guard lock(sleep_m_);
    sleep_cv_.notify_one();
  }
}

void Engine::notify_always() {
  submitted_.fetch_add(1, std::memory_order_seq_cst);
  std::lock_guard lock(sleep_m_);
  sleep_cv_.notify_one();
}

void Engine::answer(Service* service, uint64_t token, Reply reply, Clock::time_point submitted) {
  std::optional<prof::Scope> stage(std::in_place, prof::kAnswerOther);
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  if (service != nullptr) service->count_answer(reply, Clock::now() - submitted);
  stage.emplace(prof::kRoute);
  std::optional<ReplyTable::Route> route = replies_.route(token);
  stage.emplace(prof::kDeliver);
  if (!route) {
    // The connection closed (or the UDP request was already failed): nobody to answer.
    if (service != nullptr) service->count_drop(DropReason::kConnectionClosed);
    return;
  }
  route->sink->deliver(token, route->peer, std::move(reply));
  if (!route->sink->awaiting_end_burst) {
    route->sink->awaiting_end_burst = true;
    to_flush_.push_back(std::move(route->sink));
  }
}

void Engine::flush_replies() {
  if (to_flush_.empty()) return;
  prof::Scope t(prof::kFlush);
  for (const std::shared_ptr<ReplySink>& sink : to_flush_) {
    sink->awaiting_end_burst = false;
    sink->end_burst();
  }
  to_flush_.clear();
}

bool Engine::apply_commands() {
  std::vector<Command> commands;
  {
    std::lock_guard lock(commands_m_);
    if (commands_.empty()) return false;
    commands.swap(commands_);
  }
  for (Command& c : commands) {
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [&](const Attached& a) { return a.region == c.region; });
    switch (c.kind) {
      case Command::Kind::kAttach:
        if (it == regions_.end()) regions_.push_back(Attached{std::move(c.region), false, {}, {}});
        break;
      case Command::Kind::kDetach:
        if (it == regions_.end()) {
          if (c.done) c.done();
          break;
        }
        for (uint32_t q = 0; q < it->region->server_queues(); ++q) {
          // Requests still waiting in the inbox were never written: fail them now (the
          // dispatcher no longer picks this region, so nothing new arrives).
          for (Message& m : it->region->inbox(q).close()) {
            it->region->inbox(q).outstanding.fetch_sub(1, std::memory_order_relaxed);
            answer(it->region->service(), m.token, Reply{Reply::Kind::kError, "agent detached"},
                   m.submitted);
          }
        }
        it->draining = true;
        it->drain_deadline = Clock::now() + c.drain;
        it->done = std::move(c.done);
        break;
      case Command::Kind::kFail:
        if (it != regions_.end()) {
          fail_region(*it, c.reason);
          regions_.erase(it);
        }
        break;
    }
  }
  return true;
}

void Engine::fail_region(Attached& a, const std::string& reason) {
  AgentRegion& r = *a.region;
  std::vector<std::pair<uint64_t, Clock::time_point>> lost;
  for (uint32_t q = 0; q < r.server_queues() + r.client_queues(); ++q) {
    for (Message& m : r.inbox(q).close()) {
      if (q < r.server_queues()) lost.emplace_back(m.token, m.submitted);
    }
  }
  r.binding().take_in_flight(lost);
  for (uint32_t q = 0; q < r.server_queues(); ++q) {
    r.inbox(q).outstanding.store(0, std::memory_order_relaxed);
  }
  if (!lost.empty()) {
    spdlog::warn("{}: {} request(s) in flight failed: {}", r.label(), lost.size(), reason);
  }
  for (auto& [token, submitted] : lost) {
    answer(r.service(), token, Reply{Reply::Kind::kError, reason}, submitted);
  }
  if (a.done) {
    a.done();
    a.done = nullptr;
  }
}

void Engine::run() {
  uint32_t idle_rounds = 0;
  for (;;) {
    prof::Scope round(prof::kRound);
    round_seen_ = submitted_.load(std::memory_order_seq_cst);
    bool busy = apply_commands();
    flush_replies();
    if (stopping_.load(std::memory_order_relaxed)) break;
    for (size_t i = 0; i < regions_.size();) {
      Attached& a = regions_[i];
      std::string fault;
      {
        prof::Scope t(prof::kServe);
        busy |= a.region->binding().serve(*this, *a.region, fault);
      }
      flush_replies();  // this region's replies go out before the next region is polled
      if (!fault.empty()) {
        spdlog::error("{}: {}; the region is dropped", a.region->label(), fault);
        if (a.region->service() != nullptr) a.region->service()->remove(a.region.get());
        fail_region(a, "agent fault: " + fault);
        std::shared_ptr<AgentRegion> dropped = std::move(a.region);
        regions_.erase(regions_.begin() + static_cast<ptrdiff_t>(i));
        flush_replies();
        dropped->notify_fault(fault);
        continue;
      }
      if (a.draining &&
          (a.region->binding().in_flight() == 0 || Clock::now() >= a.drain_deadline)) {
        fail_region(a, "agent detached");
        flush_replies();
        regions_.erase(regions_.begin() + static_cast<ptrdiff_t>(i));
        continue;
      }
      ++i;
    }
    if (busy) {
      idle_rounds = 0;
    } else {
      prof::Scope t(prof::kIdle);
      idle(++idle_rounds);
    }
  }
  for (Attached& a : regions_)
    fail_region(a, "server shutting down");
  flush_replies();
  regions_.clear();
}

void Engine::idle(uint32_t idle_rounds) {
  if (idle_rounds < options_.spin_rounds) return;
  const bool waiting_for_replies = in_flight_.load(std::memory_order_relaxed) > 0;
  if (waiting_for_replies) {
    // Replies can arrive at any moment and nothing will wake us for them: poll, but give the
    // core away in between (the agent's pollers may share it).
    if (idle_rounds < options_.spin_rounds * 2) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(options_.max_poll_sleep);
    }
    return;
  }
  // Nothing in flight: sleep until a submission or a command, with a timeout for heartbeats of
  // draining regions.
  // Anything submitted since this round began (round_seen_) is not served yet: no sleep then.
  std::unique_lock lock(sleep_m_);
  sleeping_.store(true, std::memory_order_seq_cst);
  if (submitted_.load(std::memory_order_seq_cst) == round_seen_ &&
      !stopping_.load(std::memory_order_relaxed)) {
    sleep_cv_.wait_for(lock, std::chrono::milliseconds(5));
  }
  sleeping_.store(false, std::memory_order_seq_cst);
}

}  // namespace caracal::server
