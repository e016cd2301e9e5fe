#include "caracal/server/engine.hpp"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>

#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#ifdef CARACAL_HAVE_RDMA
#include "caracal/mqueue/rdma.hpp"
#endif
#include "caracal/server/metrics.hpp"
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
  queued_.store(true, std::memory_order_relaxed);  // see queued_
  waiting.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::vector<Message> QueueInbox::close() {
  std::lock_guard lock(m_);
  open_ = false;
  waiting.fetch_sub(static_cast<uint32_t>(items_.size()), std::memory_order_relaxed);
  std::vector<Message> left;
  left.swap(items_);
  queued_.store(false, std::memory_order_relaxed);
  return left;
}

bool QueueInbox::take(std::deque<Message>& out) {
  if (!queued_.load(std::memory_order_relaxed)) return false;  // see queued_
  std::lock_guard lock(m_);
  if (items_.empty()) return false;
  for (Message& m : items_)
    out.push_back(std::move(m));
  items_.clear();
  queued_.store(false, std::memory_order_relaxed);
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

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// EngineThread: one engine thread, the regions (or parts of regions) it serves, and its sleep.

class EngineThread {
 public:
  struct Command {
    enum class Kind { kAttach, kDetach, kFail } kind;
    std::shared_ptr<AgentRegion> region;
    std::vector<uint32_t> queues;  // kAttach: the queues of the region this thread serves
    std::chrono::milliseconds drain{0};
    std::function<void()> done;
    std::string reason;
  };

  EngineThread(Engine& engine, uint32_t index) : engine_(engine), index_(index) {}

  // Hosted mode (Engine::host()): the thread's rounds run in `io`'s thread, between its
  // handlers (run_hosted()), and wake-ups are posts to `io`. Set before start().
  void set_host(boost::asio::io_context& io) { host_ = &io; }
  // The host's loop: engine rounds and `io`'s ready handlers in turn until the engine stops,
  // then io.run() until `io` stops. Called once, on the thread that runs `io`.
  void run_hosted();
  ~EngineThread() { stop(); }
  EngineThread(const EngineThread&) = delete;
  EngineThread& operator=(const EngineThread&) = delete;

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
  // sleeping thread is woken for (see idle()), so a dispatch costs one shared read-modify-write.
  void note_dispatched() {
    // Pairs with idle(): Dekker-style, the submitter raises in_flight_ and then reads sleeping_;
    // the thread sets sleeping_ and then reads in_flight_. Both seq_cst, so at least one of them
    // sees the other: the thread does not sleep, or the submitter wakes it.
    in_flight_.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst)) wake();
  }
  void notify();
  int64_t in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  uint32_t index() const { return index_; }

  // Routes one answer (a reply, or a failure) to its client; counts it on `service`. The sink
  // may hold it until flush_replies(). This thread only.
  void answer(Service* service, uint64_t token, Reply reply, Clock::time_point submitted);

 private:
  struct Attached {
    std::shared_ptr<AgentRegion> region;
    std::vector<uint32_t> queues;  // the region's queues this thread serves
    bool draining = false;
    Clock::time_point drain_deadline;
    std::function<void()> done;
  };

  void run();
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
  void flush_replies();
  // A round without work: spin, yield or sleep (see the definition). True if the host ran one of
  // its handlers while this thread waited in it (hosted mode): that was work, and the caller
  // starts counting rounds without work afresh.
  bool idle(uint32_t idle_rounds);
  // Whether other threads had this thread's core for a good part of the time since the last
  // look (see idle()); this thread only.
  bool lost_core_since_last_look();
  void notify_always();

  Engine& engine_;
  const uint32_t index_;
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
  std::vector<Attached> regions_;                     // this thread only
  std::vector<std::shared_ptr<ReplySink>> to_flush_;  // this thread only
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
  // Contention (see idle()), this thread only: the wall and CPU clocks at the last look (none
  // after a sleep), and until when the thread spins short.
  struct ClockReading {
    Clock::time_point wall;
    std::chrono::nanoseconds cpu;  // this thread's CPU time
  };
  std::optional<ClockReading> last_look_;
  std::optional<Clock::time_point> spin_short_until_;
};

// ---------------------------------------------------------------------------------------------
// TransportBinding: the data path of one region over transport T.

namespace {

template <mqueue::Transport T>
class TransportBinding final : public RegionBinding {
 public:
  // `memory` keeps whatever backs the region (the shm mapping) alive as long as the binding.
  TransportBinding(std::unique_ptr<T> transport, mqueue::RemoteRegion<T> region,
                   std::shared_ptr<void> memory)
      : memory_(std::move(memory)),
        transport_(std::move(transport)),
        region_(std::move(region)),
        backlog_(mqueue::queue_count(region_.header())),
        in_flight_(mqueue::queue_count(region_.header())) {}

  const mqueue::RegionHeader& header() const override { return region_.header(); }

  bool shareable() const override { return kLocal; }

  bool serve(EngineThread& engine, AgentRegion& r, std::span<const uint32_t> queues,
             std::string& fault) override {
    bool busy = false;
    const mqueue::RegionHeader& h = region_.header();
    if (Status s = transport_->progress(); !s.ok()) {
      fault = "transport: " + s.message();
      return true;
    }
    // Inboxes to RX rings, as far as credits go; one tail publication per ring per round.
    for (const uint32_t q : queues) {
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
        if (server_queue) in_flight_[q].emplace(m.token, m.submitted);
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
    // TX rings. Local: a load of each of this thread's tails, as it goes (below). Remote: one
    // read of every tail (the region is served by one thread).
    if constexpr (!kLocal) {
      prof::Scope tx_fetch(prof::kTxFetch);
      if (should_fetch_tx_tails()) region_.fetch_tx_tails();
      if (Status s = transport_->progress(); !s.ok()) {
        fault = "transport: " + s.message();
        return true;
      }
      if (!region_.deliver_tx_tails()) return busy;
    }
    bool delivered_any = false;
    for (const uint32_t q : queues) {
      auto& tx = region_.tx(q);
      const bool server_queue = q < h.server_queue_count;
      mqueue::Entry e;
      mqueue::PollResult pr;
      bool any = false;
      for (;;) {
        bool by_line = false;
        {
          prof::Scope t(prof::kTxNext);
          if constexpr (kLocal) {
            // With TX lines, an entry the accelerator has announced in its line first: it lands
            // before the tail that covers it is published (mqueue/layout.hpp). Then the tail,
            // loaded now, for entries without a line (none without TX lines).
            pr = tx.next_by_line(e);
            by_line = pr == mqueue::PollResult::kReady;
            if (pr == mqueue::PollResult::kEmpty) {
              region_.observe_tx_tail(q);
              pr = tx.next(e);
            }
          } else {
            pr = tx.next(e);
          }
        }
        if (pr != mqueue::PollResult::kReady) break;
        any = true;
        if (server_queue) {
          if (by_line && r.service() != nullptr) r.service()->count_line_reply();
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

  void take_in_flight(std::span<const uint32_t> queues,
                      std::vector<std::pair<uint64_t, Clock::time_point>>& out) override {
    for (const uint32_t q : queues) {
      if (q >= region_.header().server_queue_count) continue;
      for (auto& [token, t] : in_flight_[q])
        out.emplace_back(token, t);
      in_flight_[q].clear();
      for (Message& m : backlog_[q])
        out.emplace_back(m.token, m.submitted);
      backlog_[q].clear();
    }
  }

  size_t in_flight(std::span<const uint32_t> queues) const override {
    size_t n = 0;
    for (const uint32_t q : queues) {
      if (q < region_.header().server_queue_count) n += in_flight_[q].size() + backlog_[q].size();
    }
    return n;
  }

  void request_stop() override { region_.request_stop(); }

 private:
  // A local transport (shm) reads a tail with a load: several engine threads may share the
  // region, each serving its own queues, and every round reads the tails of its queues. A
  // remote one (rdma) pays a READ per fetch of every tail: fetch every round while requests are
  // outstanding, back off while none are (see bind_rdma_region).
  static constexpr bool kLocal = std::is_same_v<T, mqueue::ShmTransport>;

  // Remote only (the region is served by one thread).
  bool any_in_flight() const {
    return std::any_of(in_flight_.begin(), in_flight_.end(),
                       [](const auto& m) { return !m.empty(); });
  }

  bool should_fetch_tx_tails() {
    if (any_in_flight()) {
      idle_fetch_gap_ = std::chrono::microseconds{0};
      return true;
    }
    return Clock::now() >= next_idle_fetch_;
  }

  // After a fetch was delivered: anything found keeps polling busy; an empty fetch with
  // nothing outstanding doubles the gap to the next one, up to kRdmaIdleFetchMax.
  void note_tx_fetch(bool found) {
    if constexpr (!kLocal) {
      if (found || any_in_flight()) {
        idle_fetch_gap_ = std::chrono::microseconds{0};
      } else {
        idle_fetch_gap_ = std::clamp(idle_fetch_gap_ * 2, kRdmaIdleFetchMin, kRdmaIdleFetchMax);
      }
      next_idle_fetch_ = Clock::now() + idle_fetch_gap_;
    } else {
      (void)found;
    }
  }

  void reply(EngineThread& engine, AgentRegion& r, uint32_t q, const mqueue::Entry& e) {
    auto& flights = in_flight_[q];
    const auto it = flights.find(e.token);
    if (it == flights.end()) {
      // Not a token this queue was given (or one already answered): a handler bug, such as an
      // answer on another queue's TX ring. It cannot be routed safely, so it is dropped.
      if (r.service() != nullptr) r.service()->count_drop(DropReason::kUnknownToken);
      return;
    }
    const Clock::time_point submitted = it->second;
    flights.erase(it);
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
  // Per queue, each used by the thread that serves the queue only.
  std::vector<std::deque<Message>> backlog_;
  std::vector<std::unordered_map<uint64_t, Clock::time_point>> in_flight_;  // server queues
  std::chrono::microseconds idle_fetch_gap_{0};  // remote TX polling only
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

Engine::Engine(ReplyTable& replies, EngineOptions options) : replies_(replies), options_(options) {
  options_.threads = std::clamp<uint32_t>(options_.threads, 1, kMaxEngineThreads);
  for (uint32_t i = 0; i < options_.threads; ++i)
    threads_.push_back(std::make_unique<EngineThread>(*this, i));
}

Engine::~Engine() {
  stop();
}

namespace {
thread_local int hosted_index = -1;  // see Engine::hosted_thread()
}  // namespace

int Engine::hosted_thread() {
  return hosted_index;
}

void Engine::host(uint32_t thread, boost::asio::io_context& io) {
  threads_.at(thread)->set_host(io);
}

void Engine::run_hosted(uint32_t thread) {
  threads_.at(thread)->run_hosted();
}

void Engine::start() {
  for (auto& t : threads_)
    t->start();
}

void Engine::stop() {
  for (auto& t : threads_)
    t->request_stop();
  for (auto& t : threads_)
    t->join();
}

uint32_t Engine::thread_of(const AgentRegion& region, uint32_t queue) const {
  const auto n = static_cast<uint32_t>(threads_.size());
  if (n == 1 || queue >= region.server_queues() || !region.binding().shareable()) return 0;
  return queue % n;
}

std::vector<std::vector<uint32_t>> Engine::queues_by_thread(const AgentRegion& region) const {
  std::vector<std::vector<uint32_t>> parts(threads_.size());
  const uint32_t queues = region.server_queues() + region.client_queues();
  for (uint32_t q = 0; q < queues; ++q)
    parts[thread_of(region, q)].push_back(q);
  return parts;
}

void Engine::attach(std::shared_ptr<AgentRegion> region) {
  std::vector<std::vector<uint32_t>> parts = queues_by_thread(*region);
  for (size_t i = 0; i < threads_.size(); ++i) {
    if (parts[i].empty()) continue;
    threads_[i]->post(EngineThread::Command{
        EngineThread::Command::Kind::kAttach, region, std::move(parts[i]), {}, {}, {}});
  }
}

void Engine::detach(std::shared_ptr<AgentRegion> region, std::chrono::milliseconds drain,
                    std::function<void()> done) {
  const std::vector<std::vector<uint32_t>> parts = queues_by_thread(*region);
  const auto holders = static_cast<uint32_t>(
      std::count_if(parts.begin(), parts.end(), [](const auto& p) { return !p.empty(); }));
  if (holders == 0) {
    if (done) done();
    return;
  }
  // Every thread that serves part of the region drains its part; the last one to finish calls
  // `done`. acq_rel: that thread's call comes after every other thread's part was failed.
  auto remaining = std::make_shared<std::atomic<uint32_t>>(holders);
  auto shared_done = std::make_shared<std::function<void()>>(std::move(done));
  for (size_t i = 0; i < threads_.size(); ++i) {
    if (parts[i].empty()) continue;
    threads_[i]->post(EngineThread::Command{
        EngineThread::Command::Kind::kDetach,
        region,
        {},
        drain,
        [remaining, shared_done] {
          if (remaining->fetch_sub(1, std::memory_order_acq_rel) == 1 && *shared_done) {
            (*shared_done)();
          }
        },
        {}});
  }
}

void Engine::fail(std::shared_ptr<AgentRegion> region, std::string reason) {
  fail_elsewhere(region, reason, kMaxEngineThreads);
}

void Engine::fail_elsewhere(const std::shared_ptr<AgentRegion>& region, const std::string& reason,
                            uint32_t except) {
  const std::vector<std::vector<uint32_t>> parts = queues_by_thread(*region);
  for (uint32_t i = 0; i < threads_.size(); ++i) {
    if (parts[i].empty() || i == except) continue;
    threads_[i]->post(
        EngineThread::Command{EngineThread::Command::Kind::kFail, region, {}, {}, {}, reason});
  }
}

void Engine::note_dispatched(const AgentRegion& region, uint32_t queue) {
  threads_[thread_of(region, queue)]->note_dispatched();
}

void Engine::notify() {
  threads_[0]->notify();
}

int64_t Engine::in_flight(uint32_t thread) const {
  return threads_[thread]->in_flight();
}

int64_t Engine::in_flight() const {
  int64_t n = 0;
  for (const auto& t : threads_)
    n += t->in_flight();
  return n;
}

// ---------------------------------------------------------------------------------------------
// EngineThread

void EngineThread::start() {
  if (thread_.joinable()) return;
  {
    std::lock_guard lock(commands_m_);
    exited_ = false;
  }
  stopping_.store(false);
  started_ = true;
  if (host_ != nullptr) return;  // the host's thread runs the rounds (run_hosted())
  thread_ = std::thread([this] {
    // Thread 0 keeps the name it had before there were several; names stay within 15 bytes.
    const std::string name =
        index_ == 0 ? std::string("caracal-engine") : "caracal-engine" + std::to_string(index_);
    pthread_setname_np(pthread_self(), name.c_str());
    prof::thread_begin();
    run();
    prof::thread_end();
  });
}

void EngineThread::request_stop() {
  if (!started_) return;
  // Once is enough: a second stop (the engine's destructor after Engine::stop) wakes nobody,
  // and must not post to a host that may be gone by then.
  if (stopping_.exchange(true)) return;
  notify_always();
}

void EngineThread::join() {
  if (thread_.joinable()) thread_.join();
  std::unique_lock lock(commands_m_);
  // Hosted: the host's loop finishes its rounds (it saw stopping_ or will at its next round).
  // A host that has not entered run_hosted() yet finds exited_ set when it does, and runs no
  // round at all.
  hosted_done_.wait(lock, [this] { return !hosted_running_; });
  started_ = false;
  // The thread has failed what it served; nothing runs its commands from now on. The reply
  // state apply_without_thread() uses (to_flush_, the sinks' element index_) is this thread's,
  // and with the thread gone only apply_without_thread() touches it, always under commands_m_.
  exited_ = true;
  for (Command& c : commands_)
    apply_without_thread(c);
  commands_.clear();
}

void EngineThread::post(Command c) {
  {
    std::lock_guard lock(commands_m_);
    if (exited_) {
      apply_without_thread(c);
      return;
    }
    commands_.push_back(std::move(c));
  }
  notify_always();
}

void EngineThread::apply_without_thread(Command& c) {
  switch (c.kind) {
    case Command::Kind::kAttach: {
      Attached a{std::move(c.region), std::move(c.queues), false, {}, {}};
      fail_region(a, "server shutting down");
      flush_replies();
      break;
    }
    case Command::Kind::kDetach:
      if (c.done) c.done();
      break;
    case Command::Kind::kFail:
      break;
  }
}

void EngineThread::notify() {
  // Pairs with idle(): see the comment on submitted_/sleeping_.
  submitted_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) wake();
}

void EngineThread::notify_always() {
  submitted_.fetch_add(1, std::memory_order_seq_cst);
  wake();
}

void EngineThread::wake() {
  if (host_ != nullptr) {
    // An empty handler: the host's run_one_for() in idle() returns once it ran. A post that
    // comes before the host waits is run by that wait at once, so no wake-up is lost.
    boost::asio::post(*host_, [] {});
    return;
  }
  std::lock_guard lock(sleep_m_);
  sleep_cv_.notify_one();
}

void EngineThread::answer(Service* service, uint64_t token, Reply reply,
                          Clock::time_point submitted) {
  std::optional<prof::Scope> stage(std::in_place, prof::kAnswerOther);
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  if (service != nullptr) service->count_answer(reply, Clock::now() - submitted);
  stage.emplace(prof::kRoute);
  std::optional<ReplyTable::Route> route = engine_.replies_.route(token);
  stage.emplace(prof::kDeliver);
  if (!route) {
    // The connection closed (or the UDP request was already failed): nobody to answer.
    if (service != nullptr) service->count_drop(DropReason::kConnectionClosed);
    return;
  }
  route->sink->deliver(index_, token, route->peer, std::move(reply));
  if (!route->sink->awaiting_end_burst[index_]) {
    route->sink->awaiting_end_burst[index_] = true;
    to_flush_.push_back(std::move(route->sink));
  }
}

void EngineThread::flush_replies() {
  if (to_flush_.empty()) return;
  prof::Scope t(prof::kFlush);
  for (const std::shared_ptr<ReplySink>& sink : to_flush_) {
    sink->awaiting_end_burst[index_] = false;
    sink->end_burst(index_);
  }
  to_flush_.clear();
}

bool EngineThread::apply_commands() {
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
        if (it == regions_.end()) {
          regions_.push_back(Attached{std::move(c.region), std::move(c.queues), false, {}, {}});
        }
        break;
      case Command::Kind::kDetach:
        if (it == regions_.end()) {
          if (c.done) c.done();
          break;
        }
        for (const uint32_t q : it->queues) {
          if (q >= it->region->server_queues()) continue;
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

void EngineThread::fail_region(Attached& a, const std::string& reason) {
  AgentRegion& r = *a.region;
  std::vector<std::pair<uint64_t, Clock::time_point>> lost;
  for (const uint32_t q : a.queues) {
    for (Message& m : r.inbox(q).close()) {
      if (q < r.server_queues()) lost.emplace_back(m.token, m.submitted);
    }
  }
  r.binding().take_in_flight(a.queues, lost);
  for (const uint32_t q : a.queues) {
    if (q < r.server_queues()) r.inbox(q).outstanding.store(0, std::memory_order_relaxed);
  }
  if (!lost.empty()) {
    SPDLOG_WARN("{}: {} request(s) in flight failed: {}", r.label(), lost.size(), reason);
  }
  for (auto& [token, submitted] : lost) {
    answer(r.service(), token, Reply{Reply::Kind::kError, reason}, submitted);
  }
  if (a.done) {
    a.done();
    a.done = nullptr;
  }
}

EngineThread::RoundOutcome EngineThread::round() {
  prof::Scope round(prof::kRound);
  round_seen_ = submitted_.load(std::memory_order_seq_cst);
  bool busy = apply_commands();
  flush_replies();
  if (stopping_.load(std::memory_order_relaxed)) return RoundOutcome::kStopping;
  for (size_t i = 0; i < regions_.size();) {
    Attached& a = regions_[i];
    std::string fault;
    {
      prof::Scope t(prof::kServe);
      busy |= a.region->binding().serve(*this, *a.region, a.queues, fault);
    }
    flush_replies();  // this region's replies go out before the next region is polled
    if (!fault.empty()) {
      SPDLOG_ERROR("{}: {}; the region is dropped", a.region->label(), fault);
      if (a.region->service() != nullptr) a.region->service()->remove(a.region.get());
      fail_region(a, "agent fault: " + fault);
      std::shared_ptr<AgentRegion> dropped = std::move(a.region);
      regions_.erase(regions_.begin() + static_cast<ptrdiff_t>(i));
      flush_replies();
      // The threads that serve the region's other queues drop it as well.
      engine_.fail_elsewhere(dropped, "agent fault: " + fault, index_);
      dropped->notify_fault(fault);
      continue;
    }
    if (a.draining &&
        (a.region->binding().in_flight(a.queues) == 0 || Clock::now() >= a.drain_deadline)) {
      fail_region(a, "agent detached");
      flush_replies();
      regions_.erase(regions_.begin() + static_cast<ptrdiff_t>(i));
      continue;
    }
    ++i;
  }
  return busy ? RoundOutcome::kBusy : RoundOutcome::kIdle;
}

void EngineThread::finish() {
  for (Attached& a : regions_)
    fail_region(a, "server shutting down");
  flush_replies();
  regions_.clear();
}

void EngineThread::run() {
  uint32_t idle_rounds = 0;
  for (RoundOutcome r; (r = round()) != RoundOutcome::kStopping;) {
    if (r == RoundOutcome::kBusy) {
      idle_rounds = 0;
    } else {
      prof::Scope t(prof::kIdle);
      idle(++idle_rounds);
    }
  }
  finish();
}

void EngineThread::run_hosted() {
  boost::asio::io_context& io = *host_;
  bool run_rounds = false;
  {
    std::lock_guard lock(commands_m_);
    // Not after join(): a server that stops before its I/O threads got here runs no round.
    run_rounds = !exited_;
    hosted_running_ = run_rounds;
  }
  if (run_rounds) {
    hosted_index = static_cast<int>(index_);
    prof::thread_begin();
    uint32_t idle_rounds = 0;
    for (;;) {
      // The host's ready handlers (received requests, replies to write), without waiting.
      const size_t handled = io.poll();
      if (io.stopped()) break;
      const RoundOutcome r = round();
      if (r == RoundOutcome::kStopping) break;
      if (r == RoundOutcome::kBusy || handled > 0) {
        idle_rounds = 0;
      } else {
        prof::Scope t(prof::kIdle);
        // A handler that ended the wait (a socket's request, a wake-up) was work like one that
        // io.poll() ran: the thread spins again before its next sleep. Otherwise a thread that
        // only reads (its requests go to another thread's queues) would, once asleep, sleep
        // again after every request, and each would wait for that thread to be woken.
        if (idle(++idle_rounds)) idle_rounds = 0;
      }
    }
    finish();
    prof::thread_end();
    hosted_index = -1;  // the dispatcher no longer favours this thread's queues
    {
      std::lock_guard lock(commands_m_);
      hosted_running_ = false;
    }
    hosted_done_.notify_all();
  }
  // The engine is done; the host goes on serving its sockets (replies of the drain, closing
  // connections) until the server stops it.
  if (!io.stopped()) io.run();
}

// Rounds without work between two looks at how much of its core a thread kept (see idle()): a
// look is a system call (the thread's CPU clock), a round with nothing to do far less.
constexpr uint32_t kContendedLookRounds = 256;

bool EngineThread::lost_core_since_last_look() {
  timespec cpu_now{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu_now) != 0) return false;
  const ClockReading now{Clock::now(), std::chrono::seconds(cpu_now.tv_sec) +
                                           std::chrono::nanoseconds(cpu_now.tv_nsec)};
  const std::optional<ClockReading> last = std::exchange(last_look_, now);
  if (!last) return false;
  // Wall time in which this thread was runnable but not running: no sleep lies between two
  // looks (every sleep drops the last one), so the difference is time other threads had the
  // core.
  const auto wall = now.wall - last->wall;
  const auto lost = wall - (now.cpu - last->cpu);
  const EngineOptions& o = engine_.options_;
  return lost >= o.contended_lost_min && lost * 8 >= wall;
}

bool EngineThread::idle(uint32_t idle_rounds) {
  const EngineOptions& o = engine_.options_;
  // Spinning keeps a request's latency down only where the thread has a core to itself. Where
  // runnable threads outnumber cores (2 I/O threads and the agent's CPU worker on 2 cores), a
  // spinning thread holds the core that the thread it waits for needs, until the scheduler's
  // time slice ends: replies then take milliseconds. So a thread looks every
  // kContendedLookRounds rounds without work at how much of its core it kept since it last looked,
  // and one that lost a good part of it (at least contended_lost_min, and an eighth of the time)
  // spins short for a while. A short preemption (a kernel worker, a client woken on the same core)
  // does not count.
  uint32_t spin = o.spin_rounds;
  if (spin_short_until_) {
    spin = std::min(spin, o.contended_spin_rounds);
    if (idle_rounds == spin && Clock::now() >= *spin_short_until_) spin_short_until_.reset();
  } else if (idle_rounds % kContendedLookRounds == 0 && lost_core_since_last_look()) {
    spin_short_until_ = Clock::now() + o.contended_hold;
    if (o.spins_cut != nullptr) o.spins_cut->inc();
    spin = std::min(spin, o.contended_spin_rounds);
  }
  if (idle_rounds < spin) return false;
  const bool waiting_for_replies = in_flight_.load(std::memory_order_relaxed) > 0;
  if (waiting_for_replies) {
    // Replies can arrive at any moment and nothing will wake us for them: poll, but give the
    // core away in between (the agent's pollers may share it). A switch that the yield makes
    // is time another thread wanted this core, and counts as lost at the next look.
    if (idle_rounds < o.spin_rounds * 2) {
      std::this_thread::yield();
      return false;
    }
    last_look_.reset();  // a sleep is not time lost to another thread
    if (o.sleeps != nullptr) o.sleeps->inc();
    if (host_ != nullptr) {
      return host_->run_one_for(o.max_poll_sleep) > 0;  // a handler of the host's ends the wait
    }
    std::this_thread::sleep_for(o.max_poll_sleep);
    return false;
  }
  last_look_.reset();
  if (host_ != nullptr) {
    // Hosted: the host's own wait is the sleep, and a wake() is a post that ends it. The same
    // handshake as below, without the mutex: the post cannot be lost (see wake()).
    sleeping_.store(true, std::memory_order_seq_cst);
    size_t ran = 0;
    if (submitted_.load(std::memory_order_seq_cst) == round_seen_ &&
        in_flight_.load(std::memory_order_seq_cst) <= 0 &&
        !stopping_.load(std::memory_order_relaxed)) {
      if (o.sleeps != nullptr) o.sleeps->inc();
      ran = host_->run_one_for(std::chrono::milliseconds(5));
    }
    sleeping_.store(false, std::memory_order_seq_cst);
    return ran > 0;
  }
  // Nothing in flight: sleep until a submission or a command, with a timeout for heartbeats of
  // draining regions.
  // Anything notified since this round began (round_seen_) is not served yet, and a request
  // dispatched since the check above is in flight: no sleep then (see note_dispatched()).
  std::unique_lock lock(sleep_m_);
  sleeping_.store(true, std::memory_order_seq_cst);
  if (submitted_.load(std::memory_order_seq_cst) == round_seen_ &&
      in_flight_.load(std::memory_order_seq_cst) <= 0 &&
      !stopping_.load(std::memory_order_relaxed)) {
    if (o.sleeps != nullptr) o.sleeps->inc();
    sleep_cv_.wait_for(lock, std::chrono::milliseconds(5));
  }
  sleeping_.store(false, std::memory_order_seq_cst);
  return false;
}

}  // namespace caracal::server
