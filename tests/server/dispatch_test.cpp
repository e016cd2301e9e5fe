// The dispatcher's policies, on real regions (named shm, attached through bind_shm_region as the
// control endpoint does) with the engine not running, so every request stays in the inbox of
// the queue the policy chose.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "caracal/mqueue/shm.hpp"
#include "dispatch.hpp"
#include "mqueue_manager/engine.hpp"
#include "test_region.hpp"

namespace caracal::server {
namespace {

using Region = test::TestRegion;

Region make_region(const std::string& name, uint32_t queues, Service* service) {
  mqueue::RegionGeometry g;
  g.server_queue_count = queues;
  g.slot_bytes = 64;
  g.ring_capacity = 8;
  g.max_message_bytes = 64;
  return test::make_test_region(name, g, 42, service);
}

class DispatchTest : public ::testing::Test {
 protected:
  void make_service(DispatchPolicy policy) {
    ServiceConfig c;
    c.dispatch = policy;
    make_service_with(c);
  }
  void make_service_with(ServiceConfig c) {
    service_.reset();  // a service made before, with its regions (their names are reused)
    a_ = {};
    b_ = {};
    c.name = "svc";
    c.max_message_bytes = 64;
    service_ = std::make_unique<Service>(c, engine_, metrics_);
    a_ = make_region("a", 2, service_.get());
    b_ = make_region("b", 2, service_.get());
    ASSERT_TRUE(service_->add(a_.region).ok());
    ASSERT_TRUE(service_->add(b_.region).ok());
  }
  // Waiting requests per queue: a0 a1 b0 b1.
  std::vector<uint32_t> waiting() const {
    std::vector<uint32_t> out;
    for (const Region* r : {&a_, &b_}) {
      for (uint32_t q = 0; q < 2; ++q)
        out.push_back(r->region->inbox(q).waiting.load());
    }
    return out;
  }

  ReplyTable replies_{16};
  Engine engine_{replies_};
  Registry metrics_;
  std::unique_ptr<Service> service_;
  Region a_, b_;
};

TEST_F(DispatchTest, RoundRobinVisitsEveryQueueInTurn) {
  make_service(DispatchPolicy::kRoundRobin);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(service_->dispatch(i, "x", 0, false), DispatchStatus::kQueued);
  }
  EXPECT_EQ(waiting(), (std::vector<uint32_t>{2, 2, 2, 2}));
}

TEST_F(DispatchTest, FlowAffinityKeepsAFlowOnOneQueue) {
  make_service(DispatchPolicy::kFlowAffinity);
  for (int i = 0; i < 5; ++i)
    (void)service_->dispatch(i, "x", /*flow=*/6, false);
  for (int i = 0; i < 3; ++i)
    (void)service_->dispatch(i, "x", /*flow=*/7, false);
  EXPECT_EQ(waiting(), (std::vector<uint32_t>{0, 0, 5, 3}));
}

// Listeners' identifiers a queue count apart (the TCP connections that one I/O thread gets when
// connections are dealt to the threads in turn) must not all land on one queue, as they would
// with the identifier itself as the flow.
TEST_F(DispatchTest, FlowKeysSpreadIdentifiersAQueueCountApart) {
  make_service(DispatchPolicy::kFlowAffinity);
  for (uint64_t id = 3; id < 3 + 4 * 16; id += 4) {
    for (int i = 0; i < 2; ++i) {
      // Queued, on a congested queue too (may_exceed, as TCP does): no request moves on.
      const DispatchStatus st = service_->dispatch(id * 2 + i, "x", flow_key(id), true);
      EXPECT_TRUE(st == DispatchStatus::kQueued || st == DispatchStatus::kCongested) << id;
    }
  }
  const std::vector<uint32_t> w = waiting();
  EXPECT_GE(std::count_if(w.begin(), w.end(), [](uint32_t n) { return n > 0; }), 3)
      << "16 connections on " << w[0] << " " << w[1] << " " << w[2] << " " << w[3];
  for (const uint32_t n : w)
    EXPECT_EQ(n % 2, 0u) << "a connection's two requests went to two queues";
  EXPECT_NE(flow_key(1), flow_key(2));
}

TEST_F(DispatchTest, LeastLoadedPicksTheQueueWithFewestOutstanding) {
  make_service(DispatchPolicy::kLeastLoaded);
  a_.region->inbox(0).outstanding = 5;
  a_.region->inbox(1).outstanding = 3;
  b_.region->inbox(1).outstanding = 4;
  // b0 has 0 outstanding: it takes requests until it is level with a1 (3).
  for (int i = 0; i < 3; ++i)
    (void)service_->dispatch(i, "x", 0, false);
  EXPECT_EQ(waiting(), (std::vector<uint32_t>{0, 0, 3, 0}));
  (void)service_->dispatch(9, "x", 0, false);  // a1 and b0 tie at 3; either is right
  const auto w = waiting();
  EXPECT_EQ(w[0] + w[3], 0u);
  EXPECT_EQ(w[1] + w[2], 4u);
}

TEST_F(DispatchTest, CongestedQueuesRefuseUdpAndPauseTcp) {
  make_service(DispatchPolicy::kRoundRobin);
  // A queue is congested once a ring's worth (8) of requests waits for it.
  for (int i = 0; i < 4 * 8; ++i) {
    EXPECT_EQ(service_->dispatch(i, "x", 0, false), DispatchStatus::kQueued) << i;
  }
  EXPECT_EQ(service_->dispatch(99, "x", 0, false), DispatchStatus::kFull);
  EXPECT_EQ(service_->dispatch(99, "x", 0, true), DispatchStatus::kCongested);
  bool resumed = false;
  service_->park([&] { resumed = true; });
  EXPECT_FALSE(resumed) << "parked while congested";
}

TEST_F(DispatchTest, ARemovedOrClosedRegionIsNotPicked) {
  make_service(DispatchPolicy::kRoundRobin);
  (void)a_.region->inbox(0).close();
  (void)a_.region->inbox(1).close();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(service_->dispatch(i, "x", 0, false), DispatchStatus::kQueued);
  }
  const auto w = waiting();
  EXPECT_EQ(w[0] + w[1], 0u) << "a closed inbox took a request";
  EXPECT_EQ(w[2] + w[3], 4u);
  service_->remove(b_.region.get());
  service_->remove(a_.region.get());
  EXPECT_EQ(service_->dispatch(5, "x", 0, false), DispatchStatus::kNoAgent);
}

// Outlier ejection, with the service told of timeouts as an engine thread tells it
// (EngineEvents::on_reply_timeouts): the engine does not run here.
class EjectionTest : public DispatchTest {
 protected:
  void SetUp() override {
    ServiceConfig c;
    c.reply_timeout_ms = 100;
    c.eject_after_timeouts = 3;
    c.eject_ms = 60000;
    c.eject_max_ms = 60000;
    ASSERT_NO_FATAL_FAILURE(make_service_with(c));
  }
  // The value of a series in /metrics (-1 when it is not there).
  double metric(const std::string& series) const {
    const std::string text = metrics_.render();
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 2));
  }
};

TEST_F(EjectionTest, TimeoutsInARowEjectAnAgentAndItsQueuesGetNoRequests) {
  EXPECT_EQ(a_.region->reply_timeout(), std::chrono::milliseconds(100)) << "set by add()";
  EXPECT_EQ(a_.region->timeout_reason(), "agent 'a' did not answer within 100 ms");
  service_->on_reply_timeouts(*a_.region, 2, 2);
  EXPECT_EQ(service_->queue_count(), 4u) << "two in a row are not enough";
  EXPECT_FALSE(a_.region->ejected_until());
  service_->on_reply_timeouts(*a_.region, 1, 3);
  EXPECT_EQ(service_->queue_count(), 2u);
  EXPECT_EQ(service_->ejected_count(), 1u);
  ASSERT_TRUE(a_.region->ejected_until());
  EXPECT_GT(*a_.region->ejected_until(),
            std::chrono::steady_clock::now() + std::chrono::seconds(50));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(service_->dispatch(i, "x", 0, false), DispatchStatus::kQueued);
  }
  EXPECT_EQ(waiting(), (std::vector<uint32_t>{0, 0, 2, 2}));
  EXPECT_EQ(metric(R"(caracal_agent_reply_timeouts_total{service="svc",agent="a"})"), 3);
  EXPECT_EQ(metric(R"(caracal_agent_ejections_total{service="svc",agent="a"})"), 1);
  EXPECT_EQ(metric(R"(caracal_agent_ejections_total{service="svc",agent="b"})"), 0);
  EXPECT_EQ(metric(R"(caracal_service_agents_ejected{service="svc"})"), 1);
  // More timeouts of an ejected agent (its rings still held requests) count, and eject nothing.
  service_->on_reply_timeouts(*a_.region, 5, 8);
  EXPECT_EQ(metric(R"(caracal_agent_reply_timeouts_total{service="svc",agent="a"})"), 8);
  EXPECT_EQ(metric(R"(caracal_agent_ejections_total{service="svc",agent="a"})"), 1);
}

TEST_F(EjectionTest, TheLastAgentInDispatchIsNeverEjected) {
  service_->on_reply_timeouts(*a_.region, 3, 3);
  ASSERT_EQ(service_->ejected_count(), 1u);
  // b times out too: a slow service stays one, it does not become one with no agent.
  service_->on_reply_timeouts(*b_.region, 10, 10);
  EXPECT_EQ(service_->ejected_count(), 1u);
  EXPECT_FALSE(b_.region->ejected_until());
  EXPECT_EQ(service_->dispatch(1, "x", 0, false), DispatchStatus::kQueued);
  EXPECT_EQ(metric(R"(caracal_agent_reply_timeouts_total{service="svc",agent="b"})"), 10);
  EXPECT_EQ(metric(R"(caracal_agent_ejections_total{service="svc",agent="b"})"), 0);
}

TEST_F(EjectionTest, AnAnswerInTimeBringsItBackAndALookBeforeTheEndDoesNot) {
  service_->on_reply_timeouts(*a_.region, 3, 3);
  ASSERT_EQ(service_->ejected_count(), 1u);
  service_->on_ejection_over(*a_.region, /*answered=*/false);  // an engine thread, too early
  EXPECT_EQ(service_->ejected_count(), 1u);
  service_->on_ejection_over(*a_.region, /*answered=*/true);
  EXPECT_EQ(service_->ejected_count(), 0u);
  EXPECT_FALSE(a_.region->ejected_until());
  EXPECT_EQ(service_->queue_count(), 4u);
  EXPECT_EQ(metric(R"(caracal_service_agents_ejected{service="svc"})"), 0);
  // Another thread's word that comes after it is back changes nothing.
  service_->on_ejection_over(*a_.region, /*answered=*/true);
  EXPECT_EQ(service_->queue_count(), 4u);
}

TEST_F(EjectionTest, ItReturnsWhenItsPeriodIsOver) {
  ServiceConfig c;
  c.reply_timeout_ms = 100;
  c.eject_after_timeouts = 3;
  c.eject_ms = 1;
  ASSERT_NO_FATAL_FAILURE(make_service_with(c));
  service_->on_reply_timeouts(*a_.region, 3, 3);
  ASSERT_EQ(service_->ejected_count(), 1u);
  const auto until = a_.region->ejected_until();
  ASSERT_TRUE(until);
  std::this_thread::sleep_until(*until + std::chrono::milliseconds(1));
  service_->on_ejection_over(*a_.region, /*answered=*/false);
  EXPECT_EQ(service_->ejected_count(), 0u);
  EXPECT_EQ(service_->queue_count(), 4u);
}

TEST_F(EjectionTest, WhenTheLastAgentInDispatchLeavesTheEjectedOnesReturn) {
  service_->on_reply_timeouts(*a_.region, 3, 3);
  ASSERT_EQ(service_->ejected_count(), 1u);
  service_->remove(b_.region.get());  // b is lost
  EXPECT_EQ(service_->ejected_count(), 0u);
  EXPECT_FALSE(a_.region->ejected_until());
  EXPECT_EQ(service_->queue_count(), 2u);
  EXPECT_EQ(service_->dispatch(1, "x", 0, false), DispatchStatus::kQueued);
  // An ejected agent that leaves is no longer counted as ejected.
  ASSERT_TRUE(service_->add(b_.region).ok());
  service_->on_reply_timeouts(*a_.region, 3, 3);
  ASSERT_EQ(service_->ejected_count(), 1u);
  service_->remove(a_.region.get());
  EXPECT_EQ(service_->ejected_count(), 0u);
  EXPECT_EQ(metric(R"(caracal_service_agents_ejected{service="svc"})"), 0);
}

TEST_F(EjectionTest, NoEjectionWhenItIsOff) {
  ServiceConfig c;
  c.eject_after_timeouts = 0;
  ASSERT_NO_FATAL_FAILURE(make_service_with(c));
  service_->on_reply_timeouts(*a_.region, 1000, 1000);
  EXPECT_EQ(service_->ejected_count(), 0u);
  EXPECT_EQ(service_->queue_count(), 4u);
}

TEST_F(DispatchTest, ARegionTooSmallForTheServiceIsRefused) {
  ServiceConfig c;
  c.name = "big";
  c.max_message_bytes = 4096;
  Service big(c, engine_, metrics_);
  Region r = make_region("small", 1, &big);
  const Status s = big.add(r.region);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("at most 64 bytes"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace caracal::server
