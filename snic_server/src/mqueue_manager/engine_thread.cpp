#include "engine_thread.hpp"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cassert>
#include <optional>
#include <utility>

#include "metrics/metrics.hpp"
#include "profile.hpp"
#include "tunables.hpp"

namespace caracal::server {

namespace prof = engine_profile;

EngineThread::EngineThread(Engine& engine, uint32_t index)
    : engine_(engine), index_(index), idle_policy_(engine.options_) {}

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
    // Thread 0 has the plain name, that of a server's only engine thread; names stay within
    // 15 bytes.
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
  // Pairs with sleep_until_woken(): see the comment on submitted_/sleeping_.
  submitted_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) wake();
}

void EngineThread::notify_always() {
  submitted_.fetch_add(1, std::memory_order_seq_cst);
  wake();
}

void EngineThread::wake() {
  if (host_ != nullptr) {
    // An empty handler: the host's run_one_for() in idle() or sleep_until_woken() returns once
    // it ran. A post that
    // comes before the host waits is run by that wait at once, so no wake-up is lost.
    boost::asio::post(*host_, [] {});
    return;
  }
  std::lock_guard lock(sleep_m_);
  sleep_cv_.notify_one();
}

void EngineThread::answer(EngineEvents* events, uint64_t token, ReplyView reply,
                          Clock::time_point submitted) {
  CARACAL_ASSERT_OWNER_THREAD(owner_);
  std::optional<prof::Scope> stage(std::in_place, prof::kAnswerOther);
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  if (events != nullptr) events->on_answer(reply.kind, Clock::now() - submitted);
  stage.emplace(prof::kRoute);
  std::optional<ReplyTable::Route> route = engine_.replies_.route(token);
  stage.emplace(prof::kDeliver);
  if (!route) {
    // The connection closed (or the UDP request was already failed): nobody to answer.
    if (events != nullptr) events->on_unrouted(DropReason::kConnectionClosed);
    return;
  }
  // A sink made for fewer engine threads than this one has no lane for it: a wiring bug.
  assert(index_ < route->sink->lanes());
  route->sink->deliver(index_, token, route->peer, reply);
  if (bool& awaiting = route->sink->awaiting_end_burst(index_); !awaiting) {
    awaiting = true;
    to_flush_.push_back(std::move(route->sink));
  }
}

void EngineThread::flush_replies() {
  CARACAL_ASSERT_OWNER_THREAD(owner_);
  if (to_flush_.empty()) return;
  prof::Scope t(prof::kFlush);
  for (const std::shared_ptr<ReplySink>& sink : to_flush_) {
    sink->awaiting_end_burst(index_) = false;
    sink->end_burst(index_);
  }
  to_flush_.clear();
}

bool EngineThread::apply_commands() {
  CARACAL_ASSERT_OWNER_THREAD(owner_);
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
          // region has left dispatch, so nothing new arrives).
          for (Message& m : it->region->inbox(q).close()) {
            it->region->inbox(q).outstanding.fetch_sub(1, std::memory_order_relaxed);
            answer(it->region->events(), m.token, ReplyView{Reply::Kind::kError, "agent detached"},
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
  CARACAL_ASSERT_OWNER_THREAD(owner_);
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
    answer(r.events(), token, ReplyView{Reply::Kind::kError, reason}, submitted);
  }
  if (a.done) {
    a.done();
    a.done = nullptr;
  }
}

EngineThread::RoundOutcome EngineThread::round() {
  CARACAL_ASSERT_OWNER_THREAD(owner_);
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
    if (!fault.empty()) {
      SPDLOG_ERROR("{}: {}; the region is dropped", a.region->label(), fault);
      if (a.region->events() != nullptr) a.region->events()->on_region_unusable(*a.region);
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
  // One burst per round, whatever the number of regions: a TCP connection or UDP socket that
  // regions answered in this round gets one handler and one send, not one for each region.
  // Replies from the first region wait for the other regions' serve(), which adds no latency
  // that shows, and every sink that regions share is spared a send per region
  // (bench/results/EXPERIMENTS.md, one-burst-per-round-h100x4).
  flush_replies();
  check_deadlines();
  return busy ? RoundOutcome::kBusy : RoundOutcome::kIdle;
}

void EngineThread::check_deadlines() {
  CARACAL_ASSERT_OWNER_THREAD(owner_);
  if (++rounds_since_clock_ < tunables::kDeadlineClockRounds) return;
  rounds_since_clock_ = 0;
  const Clock::time_point now = Clock::now();
  if (now < next_deadline_check_) return;
  next_deadline_check_ = now + tunables::kReplyCheckPeriod;
  for (Attached& a : regions_) {
    AgentRegion& r = *a.region;
    if (r.reply_timeout().count() != 0) r.binding().expire(*this, r, a.queues, now);
    if (r.events() != nullptr) {
      if (const auto until = r.ejected_until(); until && now >= *until) {
        r.events()->on_ejection_over(r, /*answered=*/false);
      }
    }
  }
  flush_replies();  // every region's failures in one burst, as a round's replies
}

void EngineThread::finish() {
  CARACAL_ASSERT_OWNER_THREAD(owner_);
  for (Attached& a : regions_)
    fail_region(a, "server shutting down");
  flush_replies();
  regions_.clear();
}

void EngineThread::run() {
  owner_.enter();
  serve();
  owner_.leave();
}

// The one loop, hosted or not: a turn runs the host's ready handlers (hosted only), then a
// round, then, if neither found work, an idle step. Without a host a turn has no handlers and
// idle() never reports one that ended its wait, so only the round and the idle step remain.
void EngineThread::serve() {
  uint32_t idle_rounds = 0;
  // Hosted: whether the host's handlers since `dispatches` (a reading of
  // Engine::hosted_dispatches_) brought requests: dispatched some, or left some in flight on
  // this thread's queues.
  const auto brought_requests = [this](uint64_t dispatches) {
    return Engine::hosted_dispatches_ != dispatches ||
           in_flight_.load(std::memory_order_relaxed) > 0;
  };
  for (;;) {
    // While idle, the turns since the last mark found no work: their time counts, and the
    // run ends here if this turn finds work (a clock read per turn without work, none per
    // turn with it). The host's handlers below run after the mark: however long they take,
    // none of it reads as idle.
    if (idle_time_.idle()) idle_time_.mark(Clock::now());
    const uint64_t dispatches = Engine::hosted_dispatches_;
    // The host's ready handlers (received requests, replies to write), without waiting, and
    // at most kHostHandlersPerRound of them: a flood keeps a socket's handler ready forever.
    size_t handled = 0;
    if (host_ != nullptr) {
      while (handled < tunables::kHostHandlersPerRound && host_->poll_one() > 0)
        ++handled;
      if (host_->stopped()) break;
    }
    const RoundOutcome r = round();
    if (r == RoundOutcome::kStopping) break;
    if (r == RoundOutcome::kBusy || handled > 0) {
      // The spin starts afresh after a round that worked or handlers that brought requests.
      // Handlers that brought none (a timer, a control message, a write's completion) leave
      // it where it was: a timer that fires more often than a spin lasts (the acceptor's
      // retry every 100 ms at the file limit) would otherwise keep an idle thread spinning.
      if (r == RoundOutcome::kBusy || brought_requests(dispatches)) idle_rounds = 0;
      idle_time_.end();
    } else {
      // A handler that the host runs inside idle() (below, the one that ends a sleep) counts
      // as idle time; the handlers after it run at the start of the next turn, as work.
      if (!idle_time_.idle()) idle_time_.begin(Clock::now());
      prof::Scope t(prof::kIdle);
      // A handler that ended the wait and brought requests (dispatched here, or in flight on
      // this thread's queues) was work like one run between rounds: the thread spins again
      // before its next sleep. Otherwise a thread that only reads (one that serves no
      // queue: its requests go to its stand-in's) would, once asleep, sleep again after every
      // request, and each would wait for it to be woken. A handler that brought none (a
      // timer, a control message, a connection) gets tunables::kQuietWakeSpinRounds.
      const uint64_t before_wait = Engine::hosted_dispatches_;
      if (idle(++idle_rounds)) {
        const uint32_t spin = engine_.options_.spin_rounds;
        const uint32_t quiet = engine_.options_.quiet_wake_spin_rounds;
        idle_rounds = brought_requests(before_wait) || quiet >= spin ? 0 : spin - quiet;
      }
    }
  }
  if (idle_time_.idle()) idle_time_.mark(Clock::now());
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
    owner_.enter();
    Engine::hosted_index_ = static_cast<int>(index_);
    prof::thread_begin();
    serve();
    prof::thread_end();
    Engine::hosted_index_ = -1;  // dispatch no longer favours this thread's queues
    owner_.leave();
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

bool EngineThread::idle(uint32_t idle_rounds) {
  CARACAL_ASSERT_OWNER_THREAD(owner_);
  const EngineOptions& o = engine_.options_;
  switch (idle_policy_.next_step(idle_rounds, in_flight_)) {
    case IdlePolicy::Step::kSpin:
      return false;
    case IdlePolicy::Step::kYield:
      std::this_thread::yield();
      return false;
    case IdlePolicy::Step::kNap:
      if (o.sleeps != nullptr) o.sleeps->inc();
      if (host_ != nullptr) {
        return host_->run_one_for(o.max_poll_sleep) > 0;  // a handler of the host's ends the wait
      }
      std::this_thread::sleep_for(o.max_poll_sleep);
      return false;
    case IdlePolicy::Step::kSleep:
      return sleep_until_woken();
  }
  return false;
}

bool EngineThread::sleep_until_woken() {
  const EngineOptions& o = engine_.options_;
  if (host_ != nullptr) {
    // Hosted: the host's own wait is the sleep, and a wake() is a post that ends it. The same
    // handshake as below, without the mutex: the post cannot be lost (see wake()).
    sleeping_.store(true, std::memory_order_seq_cst);
    size_t ran = 0;
    if (submitted_.load(std::memory_order_seq_cst) == round_seen_ &&
        in_flight_.load(std::memory_order_seq_cst) <= 0 &&
        !stopping_.load(std::memory_order_relaxed)) {
      if (o.sleeps != nullptr) o.sleeps->inc();
      ran = host_->run_one_for(tunables::kIdleSleep);
    }
    sleeping_.store(false, std::memory_order_seq_cst);
    rounds_since_clock_ = tunables::kDeadlineClockRounds;  // the next round reads the clock
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
    sleep_cv_.wait_for(lock, tunables::kIdleSleep);
  }
  sleeping_.store(false, std::memory_order_seq_cst);
  rounds_since_clock_ = tunables::kDeadlineClockRounds;  // the next round reads the clock
  return false;
}

}  // namespace caracal::server
