// The CPU accelerator's idle policy (IdleBackoff): a worker with nothing to do spins for
// idle_spin_us, then sleeps between polls, the sleeps doubling up to idle_sleep_max_us; a
// request that comes while it sleeps is still served, and stop() ends a sleeping worker.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/handler.hpp"
#include "snic_driver.hpp"

namespace caracal::accel::test {
namespace {

struct Echo {
  void operator()(const Request& req, Response& resp, Context&) {
    std::memcpy(resp.data, req.data, req.size);
    resp.size = req.size;
  }
};

mqueue::RegionGeometry small_geometry(uint32_t queues) {
  mqueue::RegionGeometry g;
  g.server_queue_count = queues;
  g.slot_bytes = 64;
  g.ring_capacity = 64;
  g.max_message_bytes = 256;
  return g;
}

std::vector<std::vector<SnicDriver::PendingRequest>> workload(uint32_t queues, uint32_t per_queue,
                                                              uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<SnicDriver::PendingRequest>> out(queues);
  for (uint32_t q = 0; q < queues; ++q) {
    for (uint32_t i = 0; i < per_queue; ++i)
      out[q].push_back({random_bytes(rng, 1 + rng() % 200), request_token(q, i)});
  }
  return out;
}

// Waits (up to the tests' wait limit) until `done()` holds.
template <class Done>
bool eventually(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(IdleBackoff, SpinsThenSleepsLongerEachTimeUpToTheBound) {
  CpuOptions o;
  o.idle_spin_us = 0;  // the spin ends at the first clock check (64 rounds)
  o.idle_sleep_max_us = 40;
  IdleBackoff b(o);
  int spins = 0;
  while (!b.idle()) {
    ASSERT_LT(++spins, 64) << "no sleep after the first clock check";
  }
  std::vector<uint32_t> sleeps{b.sleep_us()};
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(b.idle()) << "a sleeping worker stopped sleeping without work";
    sleeps.push_back(b.sleep_us());
  }
  EXPECT_EQ(sleeps, (std::vector<uint32_t>{IdleBackoff::kFirstIdleSleepUs, 16, 32, 40, 40}));
  // Work ends the sleeping: the next idle rounds spin again.
  b.worked();
  EXPECT_FALSE(b.idle());
  EXPECT_EQ(b.sleep_us(), 0u);
}

TEST(IdleBackoff, ASleepBoundOfZeroNeverSleeps) {
  CpuOptions o;
  o.idle_spin_us = 0;
  o.idle_sleep_max_us = 0;
  IdleBackoff b(o);
  for (int i = 0; i < 100000; ++i)
    ASSERT_FALSE(b.idle()) << "round " << i;
}

// An idle worker reaches its sleeps, serves what comes while it sleeps, and sleeps again after.
TEST(CpuIdle, AnIdleWorkerSleepsAndStillServesWhatComes) {
  SnicDriver snic(small_geometry(2));
  CpuOptions o = workers_options(2);
  o.idle_spin_us = 100;
  o.idle_sleep_max_us = 500;
  CpuAccelerator<Echo> acc(snic.region(), Echo{}, o);
  ASSERT_TRUE(acc.start().ok());
  // Each worker owns one queue, and both go to sleep with nothing to do.
  ASSERT_TRUE(eventually([&] {
    return acc.stats(0).idle_sleeps.load() >= 10 && acc.stats(1).idle_sleeps.load() >= 10;
  })) << "the idle workers never slept";

  const auto requests = workload(2, 200, 5);
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies)) << "timed out waiting for replies";
  for (uint32_t q = 0; q < 2; ++q) {
    ASSERT_EQ(replies[q].size(), requests[q].size());
    for (size_t i = 0; i < replies[q].size(); ++i) {
      EXPECT_EQ(replies[q][i].token, requests[q][i].token);
      EXPECT_EQ(replies[q][i].data, requests[q][i].payload);
    }
  }
  const uint64_t after_work = sum_stat(acc, &WorkerStats::idle_sleeps);
  ASSERT_TRUE(eventually([&] { return sum_stat(acc, &WorkerStats::idle_sleeps) > after_work; }))
      << "the workers did not go back to sleep after the work";
  // stop() raises the stop word, which a sleeping worker reads after its sleep.
  stop_within(acc);
  EXPECT_EQ(acc.total_requests(), 400u);
}

// idle_sleep_max_us 0: the workers poll without ever sleeping.
TEST(CpuIdle, ASleepBoundOfZeroKeepsTheWorkersPolling) {
  SnicDriver snic(small_geometry(1));
  CpuOptions o = workers_options(1);
  o.idle_spin_us = 0;
  o.idle_sleep_max_us = 0;
  CpuAccelerator<Echo> acc(snic.region(), Echo{}, o);
  ASSERT_TRUE(acc.start().ok());
  const auto requests = workload(1, 50, 9);
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(snic.exchange(requests, replies));
  // With idle_spin_us 0 a worker that could sleep does so within 64 empty rounds; give this
  // one far more than that.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop_within(acc);
  EXPECT_EQ(sum_stat(acc, &WorkerStats::idle_sleeps), 0u);
  EXPECT_EQ(acc.total_requests(), 50u);
}

}  // namespace
}  // namespace caracal::accel::test
