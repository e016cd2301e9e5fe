// The engine with one and several threads, running, on a real region (named shm, attached
// through bind_shm_region as the control endpoint does) served by the CPU accelerator: every
// request dispatched through the service comes back to the sink of its token, from the engine
// thread that serves its queue; detach and fail reach every thread's part of the region; commands
// that come after the stop are settled at once. Each case runs with threads of the engine's own
// and with hosted threads, whose rounds run in threads that serve an io_context (as snic_server's
// I/O threads do with `engine_threads: 0`). The region has TX lines: the CPU workers announce
// every reply in one, and the engine takes replies from them before the tails.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "caracal/accel/cpu.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "dispatch.hpp"
#include "metrics/metrics.hpp"
#include "mqueue_manager/engine.hpp"
#include "test_region.hpp"
#include "tunables.hpp"

namespace caracal::server {
namespace {

using namespace std::chrono_literals;

// The reply is the request with "re:" in front (Prefix), or "rb:" (PrefixB: a second region's
// replies, told apart from the first's).
template <char Second>
struct Prefixed {
  static constexpr accel::Granularity kGranularity = accel::Granularity::kThread;
  void operator()(const accel::Request& req, accel::Response& resp, accel::Context&) const {
    const char prefix[3] = {'r', Second, ':'};
    std::memcpy(resp.data, prefix, 3);
    std::memcpy(resp.data + 3, req.data, req.size);
    resp.size = req.size + 3;
  }
};
using Prefix = Prefixed<'e'>;
using PrefixB = Prefixed<'b'>;

// Records every answer with the engine thread that delivered it. Engine threads call it at
// once, so everything is under one lock.
class RecordingSink final : public ReplySink {
 public:
  // A lane for every engine thread a test may run.
  RecordingSink() : ReplySink(kMaxEngineThreads) {}

  struct Answer {
    uint32_t thread;
    Reply reply;
    std::chrono::steady_clock::time_point at;  // when it was delivered
  };

  void deliver(uint32_t thread, uint64_t token, const boost::asio::ip::udp::endpoint&,
               ReplyView reply) override {
    std::lock_guard lock(m_);
    answers_.emplace(token, Answer{thread, reply.owned(), std::chrono::steady_clock::now()});
    ++deliveries_;
    cv_.notify_all();
  }

  // Answers delivered, a second one for a token included.
  size_t deliveries() {
    std::lock_guard lock(m_);
    return deliveries_;
  }

  // Waits up to 10 s for `n` answers; returns what came.
  std::map<uint64_t, Answer> wait_for(size_t n) {
    std::unique_lock lock(m_);
    cv_.wait_for(lock, 10s, [&] { return answers_.size() >= n; });
    return answers_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::map<uint64_t, Answer> answers_;
  size_t deliveries_ = 0;
};

// The value of a series in `metrics`' text (-1 when it is not there).
double metric_value(const Registry& metrics, const std::string& series) {
  const std::string text = metrics.render();
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// Polls `done` every millisecond for up to 10 s; returns its last value.
template <class F>
bool eventually(F done) {
  for (int i = 0; i < 10000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return done();
}

constexpr uint32_t kQueues = 4;

// (engine threads, hosted)
class EngineTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {
 protected:
  static uint32_t threads() { return std::get<0>(GetParam()); }
  static bool hosted() { return std::get<1>(GetParam()); }

  void SetUp() override {
    // snic_server sets up its logging before any engine thread starts; so does the test.
    // spdlog creates its registry on first use, and two engine threads logging first at once
    // would do that inside libspdlog, where ThreadSanitizer cannot see the guard.
    spdlog::set_level(spdlog::level::warn);
    ServiceConfig c;
    c.name = "svc";
    c.max_message_bytes = 256;
    c.dispatch = DispatchPolicy::kFlowAffinity;
    engine_ = std::make_unique<Engine>(replies_, EngineOptions{.threads = threads()});
    if (hosted()) {
      for (uint32_t i = 0; i < threads(); ++i) {
        hosts_.push_back(std::make_unique<boost::asio::io_context>(1));
        engine_->host(i, *hosts_.back());
      }
    }
    service_ = std::make_unique<Service>(c, *engine_, metrics_);
    ASSERT_NO_FATAL_FAILURE(region_ = make_region("a"));
    engine_->attach(region_);
    engine_->start();
    if (hosted()) start_hosts();
  }

  // One thread per host, as snic_server's I/O threads: a work guard, then the host's loop.
  void start_hosts() {
    for (uint32_t i = 0; i < hosts_.size(); ++i) {
      host_threads_.emplace_back([this, i] {
        auto guard = boost::asio::make_work_guard(*hosts_[i]);
        engine_->run_hosted(i);
      });
    }
  }

  // A region of kQueues server queues, added to `service` (by default the test's; not attached).
  std::shared_ptr<AgentRegion> make_region(const std::string& name, Service* service = nullptr) {
    if (service == nullptr) service = service_.get();
    mqueue::RegionGeometry g;
    g.server_queue_count = kQueues;
    g.slot_bytes = 64;
    g.ring_capacity = 64;
    g.max_message_bytes = 256;
    g.tx_lines = true;
    test::TestRegion r = test::make_test_region(name, g, 7, service);
    if (!r.region) return nullptr;
    mappings_.push_back(std::move(r.mapping));
    EXPECT_TRUE(service->add(r.region).ok());
    return r.region;
  }

  void TearDown() override {
    if (accelerator_) accelerator_->stop();
    if (engine_) engine_->stop();
    for (auto& h : hosts_)
      h->stop();
    for (auto& t : host_threads_)
      t.join();
  }

  void start_accelerator() {
    accel::CpuOptions o;
    o.workers = 2;
    accelerator_ = std::make_unique<accel::CpuAccelerator<Prefix>>(
        mqueue::RegionView(mappings_.front().data()), Prefix{}, o);
    ASSERT_TRUE(accelerator_->start().ok());
  }

  // Dispatches `n` requests "r<i>"; returns their tokens in order.
  std::vector<uint64_t> dispatch(int n) {
    std::vector<uint64_t> tokens;
    for (int i = 0; i < n; ++i) {
      std::optional<uint64_t> t = replies_.acquire(sink_);
      EXPECT_TRUE(t.has_value());
      if (!t) break;
      tokens.push_back(*t);
      // Flow affinity puts request i on queue i % kQueues; `may_exceed` (as for TCP) keeps a
      // congested queue from sending it elsewhere.
      const DispatchStatus s =
          service_->dispatch(*t, "r" + std::to_string(i), static_cast<uint64_t>(i), true);
      EXPECT_TRUE(s == DispatchStatus::kQueued || s == DispatchStatus::kCongested)
          << "request " << i << ": " << static_cast<int>(s);
    }
    return tokens;
  }

  std::deque<mqueue::ShmMapping> mappings_;
  ReplyTable replies_{4096};
  Registry metrics_;
  // Before the engine: its wake-ups post to them until it is gone.
  std::vector<std::unique_ptr<boost::asio::io_context>> hosts_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Service> service_;
  std::shared_ptr<AgentRegion> region_;
  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
  std::unique_ptr<accel::CpuAccelerator<Prefix>> accelerator_;
  std::vector<std::thread> host_threads_;
};

TEST_P(EngineTest, QueuesAreDealtAmongTheThreads) {
  EXPECT_EQ(engine_->threads(), threads());
  for (uint32_t q = 0; q < kQueues; ++q) {
    EXPECT_EQ(engine_->thread_of(*region_, q), q % threads()) << "queue " << q;
  }
}

TEST_P(EngineTest, EveryRequestIsAnsweredByTheThreadOfItsQueue) {
  ASSERT_NO_FATAL_FAILURE(start_accelerator());
  constexpr int kRequests = 3000;
  const std::vector<uint64_t> tokens = dispatch(kRequests);
  const auto answers = sink_->wait_for(tokens.size());
  ASSERT_EQ(answers.size(), tokens.size());
  std::set<uint32_t> seen;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto it = answers.find(tokens[i]);
    ASSERT_NE(it, answers.end()) << "request " << i;
    EXPECT_EQ(it->second.reply.kind, Reply::Kind::kData);
    EXPECT_EQ(it->second.reply.bytes, "re:r" + std::to_string(i));
    EXPECT_EQ(it->second.thread, (i % kQueues) % threads()) << "request " << i;
    seen.insert(it->second.thread);
  }
  EXPECT_EQ(seen.size(), std::min(threads(), kQueues));
  EXPECT_EQ(engine_->in_flight(), 0);
  // Some replies were taken from their TX lines (which of line and tail comes first is a race
  // with the workers, so not all of them), and counted.
  const std::string text = metrics_.render();
  const std::string series = "caracal_service_tx_line_replies_total{service=\"svc\"} ";
  const size_t at = text.find(series);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_GT(std::stoull(text.substr(at + series.size())), 0u) << text;
}

TEST_P(EngineTest, ATxLineThatCannotBeAnEntryFailsTheRegionWithTheReason) {
  // No accelerator: request 0 waits on queue 0, and a line that announces its reply with 200
  // bytes (valid in the slots, longer than a line holds) appears where the reply's would.
  const std::vector<uint64_t> tokens = dispatch(1);
  ASSERT_EQ(tokens.size(), 1u);
  const mqueue::SlotHeader h{200, 0, static_cast<uint16_t>(mqueue::slots_for(200, 64)), tokens[0]};
  uint32_t data[mqueue::kLineWords] = {};
  std::memcpy(data, &h, sizeof(h));
  uint64_t* line = mqueue::RegionView(mappings_.front().data()).tx_lines(0);
  for (uint32_t k = 0; k < mqueue::kLineWords; ++k)
    mqueue::store_relaxed(line + k, mqueue::line_word(mqueue::line_flag(0), data[k]));
  const auto answers = sink_->wait_for(1);
  ASSERT_EQ(answers.size(), 1u);
  const Reply& r = answers.begin()->second.reply;
  EXPECT_EQ(r.kind, Reply::Kind::kError);
  EXPECT_EQ(r.bytes,
            "agent fault: server queue 0: corrupt TX entry (TX line announces an entry that does "
            "not fit in a line)");
  EXPECT_EQ(engine_->in_flight(), 0);
  // The engine told the service (EngineEvents::on_region_unusable) before it failed the
  // request: the region has left dispatch.
  EXPECT_EQ(service_->queue_count(), 0u);
}

TEST_P(EngineTest, FailAnswersWhatEveryThreadHeld) {
  // No accelerator: the requests wait in the rings and the inboxes until the region fails.
  const std::vector<uint64_t> tokens = dispatch(4 * kQueues);
  EXPECT_EQ(engine_->in_flight(), static_cast<int64_t>(tokens.size()));
  service_->remove(region_.get());
  engine_->fail(region_, "agent lost: test");
  const auto answers = sink_->wait_for(tokens.size());
  ASSERT_EQ(answers.size(), tokens.size());
  for (const auto& [token, a] : answers) {
    EXPECT_EQ(a.reply.kind, Reply::Kind::kError);
    EXPECT_EQ(a.reply.bytes, "agent lost: test");
  }
  EXPECT_EQ(engine_->in_flight(), 0);
}

TEST_P(EngineTest, DetachCallsDoneOnceEveryThreadHasDrained) {
  const std::vector<uint64_t> tokens = dispatch(4 * kQueues);
  service_->remove(region_.get());
  std::mutex m;
  std::condition_variable cv;
  int done = 0;
  engine_->detach(region_, 100ms, [&] {
    std::lock_guard lock(m);
    ++done;
    cv.notify_all();
  });
  {
    std::unique_lock lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return done > 0; }));
  }
  // Nothing answered them within the drain: every thread failed its own.
  const auto answers = sink_->wait_for(tokens.size());
  ASSERT_EQ(answers.size(), tokens.size());
  for (const auto& [token, a] : answers)
    EXPECT_EQ(a.reply.bytes, "agent detached");
  std::this_thread::sleep_for(50ms);
  std::lock_guard lock(m);
  EXPECT_EQ(done, 1);
}

TEST_P(EngineTest, CommandsAfterStopAreSettledAtOnce) {
  engine_->stop();
  // A detach is done at once: nothing is left waiting for a thread that will not run again.
  int done = 0;
  engine_->detach(region_, 10s, [&] { ++done; });
  EXPECT_EQ(done, 1);
  // A region attached after the stop has its waiting requests failed at once.
  std::shared_ptr<AgentRegion> late;
  ASSERT_NO_FATAL_FAILURE(late = make_region("late"));
  service_->remove(region_.get());
  const std::vector<uint64_t> tokens = dispatch(2 * kQueues);
  engine_->attach(late);
  const auto answers = sink_->wait_for(tokens.size());
  ASSERT_EQ(answers.size(), tokens.size());
  for (const auto& [token, a] : answers)
    EXPECT_EQ(a.reply.bytes, "server shutting down");
  EXPECT_EQ(engine_->in_flight(), 0);
}

// A region whose agent does not answer: every request, in its ring or waiting for room there,
// is failed by the thread that serves its queue once the service's bound has passed, with an
// error naming the agent and the bound, and only once: when the agent answers afterwards, each
// answer is dropped as late.
TEST_P(EngineTest, UnansweredRequestsTimeOutOnceAndLateAnswersAreDropped) {
  ServiceConfig c;
  c.name = "bounded";
  c.max_message_bytes = 256;
  c.dispatch = DispatchPolicy::kFlowAffinity;
  c.reply_timeout_ms = 100;
  Service bounded(c, *engine_, metrics_);
  std::shared_ptr<AgentRegion> r;
  ASSERT_NO_FATAL_FAILURE(r = make_region("silent", &bounded));
  engine_->attach(r);
  // 100 requests per queue: 64 fill its ring (one slot each), 36 wait for room.
  constexpr int kRequests = 100 * static_cast<int>(kQueues);
  std::vector<uint64_t> tokens;
  std::vector<std::chrono::steady_clock::time_point> sent;
  for (int i = 0; i < kRequests; ++i) {
    const std::optional<uint64_t> t = replies_.acquire(sink_);
    ASSERT_TRUE(t.has_value());
    tokens.push_back(*t);
    sent.push_back(std::chrono::steady_clock::now());
    const DispatchStatus s =
        bounded.dispatch(*t, "r" + std::to_string(i), static_cast<uint64_t>(i), true);
    ASSERT_TRUE(s == DispatchStatus::kQueued || s == DispatchStatus::kCongested) << i;
  }
  const auto answers = sink_->wait_for(tokens.size());
  ASSERT_EQ(answers.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const RecordingSink::Answer& a = answers.at(tokens[i]);
    EXPECT_EQ(a.reply.kind, Reply::Kind::kError) << i;
    EXPECT_EQ(a.reply.bytes, "agent 'silent' did not answer within 100 ms") << i;
    EXPECT_GE(a.at - sent[i], 100ms) << "request " << i << " failed before its bound";
    EXPECT_EQ(a.thread, (i % kQueues) % threads()) << "request " << i;
  }
  EXPECT_EQ(engine_->in_flight(), 0);
  for (uint32_t q = 0; q < kQueues; ++q) {
    EXPECT_EQ(r->inbox(q).outstanding.load(), 0) << q;
    EXPECT_EQ(r->inbox(q).waiting.load(), 0u) << q;
  }
  // Counted once the thread has answered its last (the sink has them a moment before).
  const std::string timeouts =
      R"(caracal_agent_reply_timeouts_total{service="bounded",agent="silent"})";
  EXPECT_TRUE(eventually([&] { return metric_value(metrics_, timeouts) == kRequests; }))
      << metric_value(metrics_, timeouts);
  // The agent wakes up and answers what its rings hold: 64 per queue, each too late.
  accel::CpuOptions o;
  o.workers = 2;
  accel::CpuAccelerator<Prefix> late(mqueue::RegionView(mappings_.back().data()), Prefix{}, o);
  ASSERT_TRUE(late.start().ok());
  const std::string late_drops = R"(caracal_service_drops_total{service="bounded",reason="late"})";
  EXPECT_TRUE(eventually([&] { return metric_value(metrics_, late_drops) == 64 * kQueues; }))
      << metric_value(metrics_, late_drops);
  late.stop();
  EXPECT_EQ(sink_->deliveries(), tokens.size()) << "a request was answered twice";
  EXPECT_EQ(
      metric_value(metrics_,
                   R"(caracal_service_drops_total{service="bounded",reason="unknown_token"})"),
      -1);
  EXPECT_EQ(engine_->in_flight(), 0);
  bounded.remove(r.get());
}

// The hosted cases only.
class HostedEngineTest : public EngineTest {};

TEST_P(HostedEngineTest, HostsServeTheirHandlersBetweenRoundsAndAfterTheStop) {
  ASSERT_NO_FATAL_FAILURE(start_accelerator());
  // While the engine runs, a host runs what is posted to it (its sockets' handlers in the
  // server), and requests are answered at the same time.
  std::atomic<int> ran{0};
  for (auto& h : hosts_)
    boost::asio::post(*h, [&] { ran.fetch_add(1); });
  const std::vector<uint64_t> tokens = dispatch(200);
  EXPECT_EQ(sink_->wait_for(tokens.size()).size(), tokens.size());
  for (int i = 0; i < 1000 && ran.load() < static_cast<int>(hosts_.size()); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(ran.load(), static_cast<int>(hosts_.size()));
  // After the engine stops, the hosts still serve their io_contexts until those stop.
  engine_->stop();
  std::atomic<int> after{0};
  for (auto& h : hosts_)
    boost::asio::post(*h, [&] { after.fetch_add(1); });
  for (int i = 0; i < 1000 && after.load() < static_cast<int>(hosts_.size()); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(after.load(), static_cast<int>(hosts_.size()));
}

// 6: more threads than the region has queues (two threads serve none).
INSTANTIATE_TEST_SUITE_P(Threads, EngineTest,
                         ::testing::Values(std::tuple{1u, false}, std::tuple{2u, false},
                                           std::tuple{3u, false}, std::tuple{6u, false},
                                           std::tuple{1u, true}, std::tuple{2u, true},
                                           std::tuple{6u, true}),
                         [](const auto& info) {
                           return (std::get<1>(info.param) ? "hosted" : "") +
                                  std::to_string(std::get<0>(info.param));
                         });

TEST_P(HostedEngineTest, AHostKeepsWhatItReadsOnItsOwnQueues) {
  // Dispatched from inside the last host's loop, as its sockets' handlers dispatch: every
  // request goes to the host's own queues, the first one as the fortieth, whatever its flow and
  // however few are in flight. (With two threads, a request that went to the other thread
  // would show its index in the answer.)
  const uint32_t host = threads() - 1;
  std::vector<uint64_t> tokens;
  std::atomic<bool> dispatched{false};
  boost::asio::post(*hosts_[host], [&] {
    tokens = dispatch(40);
    dispatched = true;
  });
  for (int i = 0; i < 1000 && !dispatched; ++i)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(dispatched);
  ASSERT_NO_FATAL_FAILURE(start_accelerator());
  const auto answers = sink_->wait_for(tokens.size());
  ASSERT_EQ(answers.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto it = answers.find(tokens[i]);
    ASSERT_NE(it, answers.end()) << "request " << i;
    EXPECT_EQ(it->second.reply.bytes, "re:r" + std::to_string(i));
    EXPECT_EQ(it->second.thread, host) << "request " << i;
  }
  // From a thread that hosts nothing, the requests spread over every thread's queues.
  const std::vector<uint64_t> more = dispatch(8);
  const auto all = sink_->wait_for(tokens.size() + more.size());
  std::set<uint32_t> seen;
  for (const uint64_t t : more) {
    ASSERT_TRUE(all.contains(t));
    seen.insert(all.at(t).thread);
  }
  EXPECT_EQ(seen.size(), threads());
}

// A socket under a flood: its handler is ready again as soon as it ends. The host must still
// run rounds between its handlers, or no reply is taken for as long as the flood lasts.
TEST_P(HostedEngineTest, AHostWhoseHandlersNeverRunDryStillTakesReplies) {
  ASSERT_NO_FATAL_FAILURE(start_accelerator());
  std::atomic<bool> flood{true};
  std::atomic<uint64_t> handlers{0};
  std::vector<std::function<void()>> again(hosts_.size());
  for (size_t h = 0; h < hosts_.size(); ++h) {
    again[h] = [&, h] {
      handlers.fetch_add(1, std::memory_order_relaxed);
      if (flood.load(std::memory_order_relaxed)) boost::asio::post(*hosts_[h], again[h]);
    };
    boost::asio::post(*hosts_[h], again[h]);
  }
  for (int i = 0; i < 1000 && handlers.load() < 10000; ++i)
    std::this_thread::sleep_for(1ms);
  const std::vector<uint64_t> tokens = dispatch(40);
  const size_t answered = sink_->wait_for(tokens.size()).size();
  const bool flooding = flood.load();
  flood = false;
  // A host may still hold an `again`, or be running one that read `flood` before it fell and
  // posts one more behind a marker. Two markers in turn: every `again` queued before the
  // second one sees `flood` down and posts nothing, and then no handler refers to this test's
  // locals.
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& h : hosts_) {
      std::promise<void> ran;
      boost::asio::post(*h, [&ran] { ran.set_value(); });
      ran.get_future().wait();
    }
  }
  EXPECT_TRUE(flooding);
  EXPECT_EQ(answered, tokens.size()) << "requests went unanswered while the hosts' handlers ran";
}

// Counts what each engine thread hands over per end_burst(): the replies delivered since its
// last one.
class BurstSink final : public ReplySink {
 public:
  BurstSink() : ReplySink(kMaxEngineThreads) {}

  void deliver(uint32_t thread, uint64_t, const boost::asio::ip::udp::endpoint&,
               ReplyView reply) override {
    std::lock_guard lock(m_);
    open_[thread].emplace_back(reply.bytes);
    ++delivered_;
  }
  void end_burst(uint32_t thread) override {
    std::lock_guard lock(m_);
    bursts_[thread].push_back(std::move(open_[thread]));
    open_.erase(thread);
  }

  size_t delivered() {
    std::lock_guard lock(m_);
    return delivered_;
  }
  // Engine thread -> its bursts, each the replies it held.
  std::map<uint32_t, std::vector<std::vector<std::string>>> bursts() {
    std::lock_guard lock(m_);
    return bursts_;
  }

 private:
  std::mutex m_;
  std::map<uint32_t, std::vector<std::string>> open_;
  std::map<uint32_t, std::vector<std::vector<std::string>>> bursts_;
  size_t delivered_ = 0;
};

// A thread that serves two regions hands the replies it takes from both in one round to a sink
// in one burst (one sendmmsg for a UDP socket, one handler for a TCP connection), not one burst
// per region. The hosts are held in a handler while both agents answer, so that the next round
// finds every reply of both regions waiting.
TEST_P(HostedEngineTest, RepliesFromEveryRegionOfARoundGoOutInOneBurst) {
  std::shared_ptr<AgentRegion> b;
  ASSERT_NO_FATAL_FAILURE(b = make_region("b"));
  engine_->attach(b);
  auto sink = std::make_shared<BurstSink>();
  constexpr int kRequests = 16;
  for (int i = 0; i < kRequests; ++i) {
    std::optional<uint64_t> t = replies_.acquire(sink);
    ASSERT_TRUE(t.has_value());
    const DispatchStatus s =
        service_->dispatch(*t, "r" + std::to_string(i), static_cast<uint64_t>(i), true);
    ASSERT_TRUE(s == DispatchStatus::kQueued || s == DispatchStatus::kCongested) << i;
  }
  // Every request in an RX ring (one slot each), with no agent yet to take it.
  const auto published = [&](mqueue::IndexArray index) {
    uint32_t n = 0;
    for (const mqueue::ShmMapping& m : mappings_) {
      const mqueue::RegionView view(m.data());
      for (uint32_t q = 0; q < kQueues; ++q)
        n += mqueue::load_acquire(view.index_word(index, q));
    }
    return n;
  };
  ASSERT_TRUE(eventually([&] { return published(mqueue::IndexArray::kRxTail) == kRequests; }))
      << published(mqueue::IndexArray::kRxTail) << " requests in the RX rings";
  // Hold every host between two rounds.
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  std::atomic<uint32_t> held{0};
  for (auto& h : hosts_) {
    boost::asio::post(*h, [&held, released] {
      held.fetch_add(1);
      released.wait();
    });
  }
  // Let the hosts go once, here or when a failed assertion leaves the test early.
  bool let_go = false;
  const auto release = [&] {
    if (!let_go) go.set_value();
    let_go = true;
  };
  struct AtExit {
    std::function<void()> f;
    ~AtExit() { f(); }
  } at_exit{release};
  ASSERT_TRUE(eventually([&] { return held.load() == hosts_.size(); }));
  accel::CpuOptions o;
  o.workers = 2;
  accel::CpuAccelerator<Prefix> agent_a(mqueue::RegionView(mappings_[0].data()), Prefix{}, o);
  accel::CpuAccelerator<PrefixB> agent_b(mqueue::RegionView(mappings_[1].data()), PrefixB{}, o);
  ASSERT_TRUE(agent_a.start().ok());
  ASSERT_TRUE(agent_b.start().ok());
  ASSERT_TRUE(eventually([&] { return published(mqueue::IndexArray::kTxTail) == kRequests; }))
      << published(mqueue::IndexArray::kTxTail) << " replies in the TX rings";
  ASSERT_GT(agent_a.total_requests(), 0u);
  ASSERT_GT(agent_b.total_requests(), 0u);
  release();
  ASSERT_TRUE(eventually([&] { return sink->delivered() == kRequests; }));
  // Each thread's burst is closed once its round ends.
  ASSERT_TRUE(eventually([&] {
    size_t n = 0;
    for (const auto& [thread, list] : sink->bursts())
      for (const auto& burst : list)
        n += burst.size();
    return n == kRequests;
  }));
  bool both_in_one = false;
  for (const auto& [thread, list] : sink->bursts()) {
    EXPECT_EQ(list.size(), 1u) << "engine thread " << thread << " handed its replies over in "
                               << list.size() << " bursts";
    std::set<std::string> prefixes;
    for (const std::string& reply : list.front())
      prefixes.insert(reply.substr(0, 3));
    both_in_one |= prefixes.size() == 2;
  }
  EXPECT_TRUE(both_in_one) << "no thread took replies from both regions in one round";
  agent_a.stop();
  agent_b.stop();
}

INSTANTIATE_TEST_SUITE_P(Threads, HostedEngineTest,
                         ::testing::Values(std::tuple{1u, true}, std::tuple{2u, true}),
                         [](const auto& info) {
                           return "hosted" + std::to_string(std::get<0>(info.param));
                         });

// More hosts than the region has queues (kQueues): hosts 4 and 5 serve none.
class WideHostedEngineTest : public EngineTest {
 protected:
  // Dispatches `n` requests from inside host `host`'s loop; returns their tokens.
  std::vector<uint64_t> dispatch_from(uint32_t host, int n) {
    std::vector<uint64_t> tokens;
    std::atomic<bool> dispatched{false};
    boost::asio::post(*hosts_[host], [&] {
      tokens = dispatch(n);
      dispatched = true;
    });
    for (int i = 0; i < 1000 && !dispatched; ++i)
      std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(dispatched);
    return tokens;
  }
};

TEST_P(WideHostedEngineTest, AHostWithoutQueuesStandsOnTheQueuesOfAnother) {
  ASSERT_EQ(threads(), 6u);
  // Threads 0-3 serve queue 0-3; 4 and 5 serve none, and stand on 0 and 1 (the serving threads
  // in turn). Every request from host 5 goes to its stand-in, thread 1, and every one from
  // host 4 to thread 0; none to any other thread, none to a thread without queues. (No
  // accelerator yet: nothing is answered.)
  const std::vector<uint64_t> from5 = dispatch_from(5, 40);
  const std::vector<uint64_t> from4 = dispatch_from(4, 40);
  ASSERT_EQ(from5.size(), 40u);
  ASSERT_EQ(from4.size(), 40u);
  ASSERT_NO_FATAL_FAILURE(start_accelerator());
  const auto answers = sink_->wait_for(from5.size() + from4.size());
  ASSERT_EQ(answers.size(), from5.size() + from4.size());
  for (size_t i = 0; i < from5.size(); ++i) {
    ASSERT_TRUE(answers.contains(from5[i])) << "request " << i;
    EXPECT_EQ(answers.at(from5[i]).thread, 1u) << "from host 5, request " << i;
  }
  for (size_t i = 0; i < from4.size(); ++i) {
    ASSERT_TRUE(answers.contains(from4[i])) << "request " << i;
    EXPECT_EQ(answers.at(from4[i]).thread, 0u) << "from host 4, request " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, WideHostedEngineTest, ::testing::Values(std::tuple{6u, true}),
                         [](const auto& info) {
                           return "hosted" + std::to_string(std::get<0>(info.param));
                         });

// A small region with `servers` server queues and `clients` client queues, for the placement
// tests (they look at which thread serves which queue, not at traffic).
test::TestRegion placement_region(const std::string& name, uint32_t servers, uint32_t clients = 0) {
  mqueue::RegionGeometry g;
  g.server_queue_count = servers;
  g.client_queue_count = clients;
  g.slot_bytes = 64;
  g.ring_capacity = 64;
  g.max_message_bytes = 256;
  return test::make_test_region(name, g, 7, nullptr);
}

// Placement: each region's server queues start on the thread after the last queue of the
// region placed before, so that several regions together cover every thread; a region never
// placed starts at thread 0.
TEST(EnginePlacement, RegionsAreDealtOneAfterAnotherOverEveryThread) {
  spdlog::set_level(spdlog::level::warn);
  ReplyTable replies(64);
  Engine engine(replies, EngineOptions{.threads = 8});
  test::TestRegion unplaced = placement_region("unplaced", 3);
  test::TestRegion a = placement_region("a", 4), b = placement_region("b", 6),
                   c = placement_region("c", 16);
  ASSERT_TRUE(unplaced.region && a.region && b.region && c.region);
  engine.place(*a.region);
  engine.place(*b.region);
  engine.place(*c.region);
  EXPECT_EQ(unplaced.region->engine_base(), 0u);
  EXPECT_EQ(a.region->engine_base(), 0u);
  EXPECT_EQ(b.region->engine_base(), 4u);
  EXPECT_EQ(c.region->engine_base(), 2u);  // (4 + 6) % 8
  for (uint32_t q = 0; q < 3; ++q)
    EXPECT_EQ(engine.thread_of(*unplaced.region, q), q);
  // a and b together: threads 0-7, then 0 and 1 again.
  std::vector<uint32_t> per_thread(8, 0);
  for (uint32_t q = 0; q < 4; ++q) {
    EXPECT_EQ(engine.thread_of(*a.region, q), q);
    ++per_thread[engine.thread_of(*a.region, q)];
  }
  for (uint32_t q = 0; q < 6; ++q) {
    EXPECT_EQ(engine.thread_of(*b.region, q), (4 + q) % 8);
    ++per_thread[engine.thread_of(*b.region, q)];
  }
  EXPECT_EQ(per_thread, (std::vector<uint32_t>{2, 2, 1, 1, 1, 1, 1, 1}));
  // More queues than threads: each thread serves two of c's 16.
  std::vector<uint32_t> of_c(8, 0);
  for (uint32_t q = 0; q < 16; ++q)
    ++of_c[engine.thread_of(*c.region, q)];
  EXPECT_EQ(of_c, std::vector<uint32_t>(8, 2));
  EXPECT_EQ(engine.thread_of(*c.region, 0), 2u);
}

// Client queue c is served by the thread of server queue c, wherever the region was placed; an
// index past the region's queues falls back to thread 0.
TEST(EnginePlacement, ClientQueueGoesWithItsServerQueue) {
  ReplyTable replies(64);
  Engine engine(replies, EngineOptions{.threads = 4});
  test::TestRegion first = placement_region("first", 6, 6);
  test::TestRegion second = placement_region("second", 6, 6);
  ASSERT_TRUE(first.region && second.region);
  engine.place(*first.region);
  engine.place(*second.region);
  ASSERT_EQ(second.region->engine_base(), 2u);  // 6 % 4
  std::vector<uint32_t> per_thread(4, 0);
  for (const test::TestRegion* t : {&first, &second}) {
    for (uint32_t c = 0; c < 6; ++c) {
      const uint32_t q = mqueue::client_queue_index(t->region->header(), c);
      EXPECT_EQ(engine.thread_of(*t->region, q), engine.thread_of(*t->region, c)) << "client " << c;
      ++per_thread[engine.thread_of(*t->region, q)];
    }
  }
  EXPECT_EQ(per_thread, std::vector<uint32_t>(4, 3));  // 12 client queues over 4 threads
  EXPECT_EQ(engine.thread_of(*first.region, 12), 0u);
}

// One engine thread serves everything, wherever a region was placed.
TEST(EnginePlacement, OneThreadServesEveryQueue) {
  ReplyTable replies(64);
  Engine engine(replies, EngineOptions{.threads = 1});
  test::TestRegion a = placement_region("one-a", 5);
  test::TestRegion b = placement_region("one-b", 5);
  ASSERT_TRUE(a.region && b.region);
  engine.place(*a.region);
  engine.place(*b.region);
  for (uint32_t q = 0; q < 5; ++q) {
    EXPECT_EQ(engine.thread_of(*a.region, q), 0u);
    EXPECT_EQ(engine.thread_of(*b.region, q), 0u);
  }
}

// What the engine reports about a region goes to the region's EngineEvents and nowhere else: a
// region whose events are not a Service is served the same, and hears of every answer, of the
// room its requests' writes made, and of a reply nobody is left to take.
class RecordingEvents final : public EngineEvents {
 public:
  const std::string& name() const override { return name_; }
  void on_room() override { rooms.fetch_add(1); }
  void on_region_unusable(const AgentRegion&) override { unusable.fetch_add(1); }
  void on_answer(Reply::Kind kind, std::chrono::steady_clock::duration) override {
    (kind == Reply::Kind::kData ? data : errors).fetch_add(1);
  }
  void on_line_reply() override { line_replies.fetch_add(1); }
  void on_unrouted(DropReason reason) override {
    if (reason == DropReason::kConnectionClosed) connection_closed.fetch_add(1);
  }
  void on_reply_timeouts(const AgentRegion&, uint32_t, uint32_t) override {}
  void on_ejection_over(const AgentRegion&, bool) override {}

  std::atomic<int> rooms{0}, unusable{0}, data{0}, errors{0}, line_replies{0}, connection_closed{0};

 private:
  std::string name_ = "recorded";
};

TEST(EngineEvents, TheEngineReportsARegionsRequestsToItsEvents) {
  spdlog::set_level(spdlog::level::warn);
  ReplyTable replies(64);
  Engine engine(replies, EngineOptions{.threads = 1});
  RecordingEvents events;
  mqueue::RegionGeometry g;
  g.server_queue_count = 2;
  g.slot_bytes = 64;
  g.ring_capacity = 64;
  g.max_message_bytes = 256;
  test::TestRegion r = test::make_test_region("events", g, 7, &events);
  ASSERT_TRUE(r.region);
  engine.attach(r.region);
  engine.start();
  accel::CpuOptions o;
  o.workers = 1;
  accel::CpuAccelerator<Prefix> accelerator(mqueue::RegionView(r.mapping.data()), Prefix{}, o);
  ASSERT_TRUE(accelerator.start().ok());

  // Requests into the inboxes as dispatch leaves them; the last one's slot is released before
  // it is written, as when its connection closes, so its reply has nowhere to go.
  auto sink = std::make_shared<RecordingSink>();
  constexpr int kRequests = 40;
  for (int i = 0; i <= kRequests; ++i) {
    const std::optional<uint64_t> token = replies.acquire(sink);
    ASSERT_TRUE(token.has_value());
    if (i == kRequests) replies.release(*token);
    const uint32_t q = static_cast<uint32_t>(i) % g.server_queue_count;
    QueueInbox& inbox = r.region->inbox(q);
    inbox.outstanding.fetch_add(1);
    Message m{*token, 0, "r" + std::to_string(i), std::chrono::steady_clock::now()};
    ASSERT_TRUE(inbox.submit(m));
    engine.note_dispatched(*r.region, q);
  }
  EXPECT_EQ(sink->wait_for(kRequests).size(), static_cast<size_t>(kRequests));
  for (int i = 0; i < 1000 && events.connection_closed.load() == 0; ++i)
    std::this_thread::sleep_for(10ms);
  accelerator.stop();
  engine.stop();
  EXPECT_EQ(events.data.load(), kRequests + 1);
  EXPECT_EQ(events.errors.load(), 0);
  EXPECT_EQ(events.connection_closed.load(), 1);
  EXPECT_GT(events.rooms.load(), 0);
  EXPECT_EQ(events.unusable.load(), 0);
  EXPECT_EQ(events.line_replies.load(), 0) << "the region has no TX lines";
}

// Outlier ejection with a running engine: two regions of one service, one whose agent answers
// nothing and one that answers everything.
class EngineEjection : public ::testing::Test {
 protected:
  void start(uint32_t reply_timeout_ms, uint32_t eject_ms, DispatchPolicy policy) {
    spdlog::set_level(spdlog::level::warn);
    ServiceConfig c;
    c.name = "svc";
    c.max_message_bytes = 256;
    c.dispatch = policy;
    c.reply_timeout_ms = reply_timeout_ms;
    c.eject_after_timeouts = 3;
    c.eject_ms = eject_ms;
    c.eject_max_ms = eject_ms;
    service_ = std::make_unique<Service>(c, engine_, metrics_);
    mqueue::RegionGeometry g;
    g.server_queue_count = 2;
    g.slot_bytes = 64;
    g.ring_capacity = 64;
    g.max_message_bytes = 256;
    for (const char* name : {"stalled", "healthy"}) {
      test::TestRegion r = test::make_test_region(name, g, 9, service_.get());
      ASSERT_TRUE(r.region);
      ASSERT_TRUE(service_->add(r.region).ok());
      engine_.attach(r.region);
      regions_.push_back(std::move(r));
    }
    engine_.start();
    ASSERT_NO_FATAL_FAILURE(start_agent(1));
  }
  void start_agent(size_t region) {
    accel::CpuOptions o;
    o.workers = 1;
    agents_.push_back(std::make_unique<accel::CpuAccelerator<Prefix>>(
        mqueue::RegionView(regions_[region].mapping.data()), Prefix{}, o));
    ASSERT_TRUE(agents_.back()->start().ok());
  }
  void TearDown() override {
    for (auto& a : agents_)
      a->stop();
    engine_.stop();
  }
  uint64_t dispatch(uint64_t flow) {
    const std::optional<uint64_t> t = replies_.acquire(sink_);
    EXPECT_TRUE(t.has_value());
    EXPECT_EQ(service_->dispatch(*t, "f" + std::to_string(flow), flow, false),
              DispatchStatus::kQueued);
    return *t;
  }
  AgentRegion& stalled() { return *regions_[0].region; }

  ReplyTable replies_{4096};
  Registry metrics_;
  Engine engine_{replies_, EngineOptions{.threads = 2}};
  std::unique_ptr<Service> service_;
  std::vector<test::TestRegion> regions_;
  std::vector<std::unique_ptr<accel::CpuAccelerator<Prefix>>> agents_;
  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
};

TEST_F(EngineEjection, AStalledAgentLeavesDispatchAndAnEngineThreadBringsItBack) {
  ASSERT_NO_FATAL_FAILURE(start(100, 300, DispatchPolicy::kRoundRobin));
  // Round robin over the four queues: half of the requests go to the stalled agent.
  for (uint64_t i = 0; i < 40; ++i)
    dispatch(i);
  const auto answers = sink_->wait_for(40);
  ASSERT_EQ(answers.size(), 40u);
  int errors = 0;
  for (const auto& [token, a] : answers)
    errors += a.reply.kind == Reply::Kind::kError ? 1 : 0;
  EXPECT_EQ(errors, 20);
  ASSERT_TRUE(eventually([&] { return service_->ejected_count() == 1; }));
  EXPECT_TRUE(stalled().ejected_until());
  // While it is out, the healthy agent answers everything.
  std::vector<uint64_t> tokens;
  for (uint64_t i = 0; i < 40; ++i)
    tokens.push_back(dispatch(i));
  const auto more = sink_->wait_for(80);
  for (const uint64_t t : tokens) {
    ASSERT_TRUE(more.contains(t));
    EXPECT_EQ(more.at(t).reply.kind, Reply::Kind::kData);
  }
  // Its 300 ms end, and the engine thread that serves its queues brings it back.
  EXPECT_TRUE(eventually([&] { return service_->ejected_count() == 0; }));
  EXPECT_FALSE(stalled().ejected_until());
  EXPECT_EQ(service_->queue_count(), 4u);
  EXPECT_EQ(
      metric_value(metrics_, R"(caracal_agent_ejections_total{service="svc",agent="stalled"})"), 1);
  EXPECT_EQ(metric_value(metrics_,
                         R"(caracal_agent_reply_timeouts_total{service="svc",agent="stalled"})"),
            20);
}

TEST_F(EngineEjection, AnEjectedAgentThatAnswersInTimeIsBackAtOnce) {
  // An ejection of a minute: only an answer in time brings the agent back within the test.
  ASSERT_NO_FATAL_FAILURE(start(1000, 60000, DispatchPolicy::kFlowAffinity));
  // Flow affinity over stalled q0, q1, healthy q0, q1: three requests on the stalled agent's
  // queue 0 now, one on its queue 1 half a bound later.
  std::vector<uint64_t> early;
  for (int i = 0; i < 3; ++i)
    early.push_back(dispatch(0));
  std::this_thread::sleep_for(500ms);
  const uint64_t in_time = dispatch(1);
  // The first three time out together: three in a row on queue 0, and the agent is out.
  ASSERT_TRUE(eventually([&] { return service_->ejected_count() == 1; }));
  // It wakes up with half a bound left for the fourth: its answer comes in time.
  ASSERT_NO_FATAL_FAILURE(start_agent(0));
  const auto answers = sink_->wait_for(4);
  ASSERT_EQ(answers.size(), 4u);
  for (const uint64_t t : early)
    EXPECT_EQ(answers.at(t).reply.kind, Reply::Kind::kError);
  EXPECT_EQ(answers.at(in_time).reply.bytes, "re:f1");
  EXPECT_TRUE(eventually([&] { return service_->ejected_count() == 0; }));
  EXPECT_TRUE(eventually([&] {
    return metric_value(metrics_, R"(caracal_service_drops_total{service="svc",reason="late"})") ==
           3;
  }));
}

// A server that stops before its I/O threads reach their loops: the engine settles what it was
// given on the stopping thread, and the hosts that come later run no round.
TEST(HostedEngine, StopBeforeTheHostsStart) {
  ReplyTable replies(64);
  boost::asio::io_context a(1), b(1);  // before the engine, which posts to them
  Engine engine(replies, EngineOptions{.threads = 2});
  engine.host(0, a);
  engine.host(1, b);
  engine.start();
  engine.stop();
  int done = 0;
  test::TestRegion r = [&] {
    mqueue::RegionGeometry g;
    g.server_queue_count = 2;
    g.slot_bytes = 64;
    g.ring_capacity = 64;
    g.max_message_bytes = 256;
    return test::make_test_region("stopped", g, 7, nullptr);
  }();
  ASSERT_TRUE(r.region);
  engine.detach(r.region, 10s, [&] { ++done; });
  EXPECT_EQ(done, 1);
  std::thread host([&] {
    auto guard = boost::asio::make_work_guard(a);
    engine.run_hosted(0);  // no round: straight to a.run()
  });
  std::atomic<bool> ran{false};
  boost::asio::post(a, [&] { ran = true; });
  for (int i = 0; i < 1000 && !ran; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(ran);
  a.stop();
  host.join();
}

// One hosted engine thread that has gone to sleep, for the tests of what ends its sleep. It
// spins a million rounds (far longer than the gaps between the handlers the tests post) before
// it sleeps, with no cut to short spins on a loaded machine (contended_spin_rounds as long), and
// `quiet_wake` rounds after a wake-up that brought no request. The engine counts its sleeps (not
// the thread's context switches, which a loaded machine and a sanitizer's locks add to).
class SleepingHost {
 public:
  static constexpr uint32_t kSpin = 1'000'000;
  explicit SleepingHost(uint32_t quiet_wake)
      : engine_(replies_, EngineOptions{.spin_rounds = kSpin,
                                        .quiet_wake_spin_rounds = quiet_wake,
                                        .contended_spin_rounds = kSpin,
                                        .threads = 1,
                                        .sleeps = &sleeps_}) {
    engine_.host(0, io_);
    engine_.start();
    host_ = std::thread([this] {
      auto guard = boost::asio::make_work_guard(io_);
      engine_.run_hosted(0);
    });
    // Asleep once the engine counts a sleep; the thread waits in io.run_one_for() from then on.
    for (int i = 0; i < 6000 && sleeps_.value() == 0; ++i)
      std::this_thread::sleep_for(10ms);
  }
  ~SleepingHost() {
    engine_.stop();
    io_.stop();
    host_.join();
  }
  boost::asio::io_context& io() { return io_; }
  uint64_t sleeps() const { return sleeps_.value(); }

 private:
  ReplyTable replies_{64};
  boost::asio::io_context io_{1};
  Counter sleeps_;
  Engine engine_;
  std::thread host_;
};

// A handler that ends a hosted thread's sleep and counts as bringing requests (here: any, with
// the quiet wake-up as long as the spin) is work, as one that io.poll() runs is: the thread
// spins again before it sleeps. A thread that only reads sockets (its requests go to another
// thread's queues) would otherwise fall asleep once and then sleep again after every request,
// each of which would then wait for the thread to be woken. Handlers come here every 50 us.
TEST(HostedEngine, AHandlerThatEndsTheSleepIsWorkAndTheThreadSpinsAgain) {
  SleepingHost h(SleepingHost::kSpin);
  ASSERT_GE(h.sleeps(), 1u) << "the host never went to sleep";
  std::promise<uint64_t> first, last;
  boost::asio::post(h.io(), [&] { first.set_value(h.sleeps()); });
  constexpr int kHandlers = 40;
  for (int i = 0; i < kHandlers; ++i) {
    std::this_thread::sleep_for(50us);
    boost::asio::post(h.io(), [] {});
  }
  boost::asio::post(h.io(), [&] { last.set_value(h.sleeps()); });
  const uint64_t slept = last.get_future().get() - first.get_future().get();
  EXPECT_LE(slept, uint64_t{kHandlers / 4})
      << "the host slept again after the handlers that woke it";
}

// A handler that ends the sleep but brings no request (a timer, a control message: here empty
// posts) buys only quiet_wake_spin_rounds of spinning, not spin_rounds: the thread sleeps again
// after nearly every one. With the long spin it would not sleep between posts 5 ms apart; 64
// rounds are over well within 5 ms, even under a sanitizer.
TEST(HostedEngine, AWakeUpThatBringsNoRequestSpinsShort) {
  SleepingHost h(64);
  ASSERT_GE(h.sleeps(), 1u) << "the host never went to sleep";
  const uint64_t first = h.sleeps();
  constexpr int kHandlers = 40;
  for (int i = 0; i < kHandlers; ++i) {
    boost::asio::post(h.io(), [] {});
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_GE(h.sleeps() - first, uint64_t{kHandlers / 2})
      << "the host spun on after wake-ups that brought no request";
}

// caracal_engine_idle_seconds_total's source: a hosted thread's time without work counts, the
// time its host spends in handlers does not, not even in a reading taken during the handler. The
// handler below keeps the thread 300 ms; the idle time over the same stretch must fall short of the
// wall time by about as much. Bounds are wide (a loaded machine or a sanitizer stretches the wall
// time, never the handler's).
TEST(HostedEngine, IdleSecondsLeaveOutTheHostsHandlers) {
  using Clock = std::chrono::steady_clock;
  ReplyTable replies(64);
  boost::asio::io_context io(1);
  Engine engine(replies, EngineOptions{.threads = 1});
  engine.host(0, io);
  engine.start();
  std::thread host([&] {
    auto guard = boost::asio::make_work_guard(io);
    engine.run_hosted(0);
  });
  // Nothing to do: the thread's time is idle time.
  for (int i = 0; i < 1000 && engine.idle_seconds(0) < 0.1; ++i)
    std::this_thread::sleep_for(10ms);
  const Clock::time_point t1 = Clock::now();
  const double idle1 = engine.idle_seconds(0);
  EXPECT_GE(idle1, 0.1);
  // The first handler may end a sleep (that one counts as idle); the one it posts is work,
  // run at the start of the next turn or in the same one. (Posted from here, the second could
  // find the thread asleep again after the first, and end that sleep.)
  std::promise<void> done;
  double in_handler_first = 0;
  double in_handler_last = 0;
  boost::asio::post(io, [&] {
    boost::asio::post(io, [&] {
      in_handler_first = engine.idle_seconds(0);
      const Clock::time_point until = Clock::now() + 300ms;
      while (Clock::now() < until) {
      }
      in_handler_last = engine.idle_seconds(0);
      done.set_value();
    });
  });
  done.get_future().get();
  // A scrape while the host works must not read the work as idle either: a counter cannot take
  // it back once the run turns out to have ended where the handler began.
  EXPECT_LT(in_handler_last - in_handler_first, 0.05)
      << "a reading during the 300 ms handler counted it as idle";
  std::this_thread::sleep_for(50ms);
  const double idle2 = engine.idle_seconds(0);
  const double wall = std::chrono::duration<double>(Clock::now() - t1).count();
  EXPECT_LE(idle2 - idle1, wall - 0.25) << "the handler's 300 ms counted as idle";
  EXPECT_GE(idle2 - idle1, 0.02) << "the 50 ms after the handler not counted as idle";
  EXPECT_LE(engine.idle_seconds(0),
            std::chrono::duration<double>(Clock::now() - t1).count() + idle1 + 0.001);
  engine.stop();
  io.stop();
  host.join();
}

}  // namespace
}  // namespace caracal::server
