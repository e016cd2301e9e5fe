// The dispatcher's policies, on real regions (named shm, attached through bind_shm_region as the
// control endpoint does) with the engine not running, so every request stays in the inbox of
// the queue the policy chose.
#include <gtest/gtest.h>

#include <map>

#include "caracal/mqueue/shm.hpp"
#include "caracal/server/dispatch.hpp"
#include "caracal/server/mqueue_manager/engine.hpp"
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
    c.name = "svc";
    c.max_message_bytes = 64;
    c.dispatch = policy;
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
