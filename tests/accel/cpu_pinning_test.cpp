// Pinning CPU accelerator workers with CpuOptions::cpus.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/handler.hpp"
#include "snic_driver.hpp"

namespace caracal::accel::test {
namespace {

using mqueue::IndexArray;

// Answers with the CPUs its thread may run on, as a list of numbers ("0,3,").
struct ReportAffinity {
  void operator()(const Request&, Response& resp, Context&) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) != 0) {
      resp.set_error("pthread_getaffinity_np failed");
      return;
    }
    std::string out;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) out += std::to_string(cpu) + ",";
    }
    const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(out.size()), resp.capacity);
    std::memcpy(resp.data, out.data(), n);
    resp.size = n;
  }
};

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) out.push_back(cpu);
  }
  return out;
}

mqueue::RegionGeometry pin_geometry(uint32_t server_queues) {
  mqueue::RegionGeometry g;
  g.server_queue_count = server_queues;
  g.slot_bytes = 256;
  g.ring_capacity = 8;
  g.max_message_bytes = 2 * 256 - mqueue::kSlotHeaderBytes;
  return g;
}

TEST(PinningTest, WorkerRunsOnTheCpuItWasGiven) {
  const std::vector<int> allowed = allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  // CPU 0 where this process may use it (the usual case), else the first CPU it may use.
  const int cpu = allowed.front();
  SnicDriver snic(pin_geometry(1));
  CpuOptions options = workers_options(1);
  options.cpus = {cpu};
  CpuAccelerator<ReportAffinity> acc(snic.region(), ReportAffinity{}, options);
  const Status s = acc.start();
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_TRUE(snic.push(0, to_bytes("where"), 1));
  std::vector<TxEntry> replies;
  ASSERT_TRUE(snic.collect_replies(1, replies));
  stop_within(acc);
  EXPECT_EQ(replies[0].flags, 0) << replies[0].text();
  EXPECT_EQ(replies[0].text(), std::to_string(cpu) + ",");
}

TEST(PinningTest, WorkersCycleThroughTheCpuList) {
  const std::vector<int> allowed = allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  // Three workers over a list of up to two CPUs: worker i runs on cpus[i % size].
  std::vector<int> cpus(allowed.begin(), allowed.begin() + std::min<size_t>(2, allowed.size()));
  SnicDriver snic(pin_geometry(3));
  CpuOptions options = workers_options(3);
  options.cpus = cpus;
  CpuAccelerator<ReportAffinity> acc(snic.region(), ReportAffinity{}, options);
  const Status s = acc.start();
  ASSERT_TRUE(s.ok()) << s.message();
  for (uint32_t q = 0; q < 3; ++q)
    ASSERT_TRUE(snic.push(q, to_bytes("where"), q));
  std::vector<TxEntry> replies;
  ASSERT_TRUE(snic.collect_replies(3, replies));
  stop_within(acc);
  for (const TxEntry& r : replies) {
    // Queue q belongs to worker q (three workers, three queues).
    EXPECT_EQ(r.text(), std::to_string(cpus[r.queue % cpus.size()]) + ",") << "queue " << r.queue;
  }
}

struct BadCpuCase {
  const char* name;
  bool out_of_range;  // else: a CPU outside this process's affinity mask
};

void PrintTo(const BadCpuCase& c, std::ostream* os) {
  *os << c.name;
}

class BadCpuTest : public ::testing::TestWithParam<BadCpuCase> {};

// A worker that cannot be pinned fails start() with a message naming it and its CPU, and no
// worker is left running (none served a request, none is still a thread of the process).
TEST_P(BadCpuTest, StartFailsAndLeavesNoThread) {
  const std::vector<int> allowed = allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  int bad = 100000;
  if (!GetParam().out_of_range) {
    bad = -1;
    for (int cpu = 0; cpu < CPU_SETSIZE && bad < 0; ++cpu) {
      if (std::find(allowed.begin(), allowed.end(), cpu) == allowed.end()) bad = cpu;
    }
    if (bad < 0) GTEST_SKIP() << "this process may use every CPU the kernel can name";
  }
  SnicDriver snic(pin_geometry(2));
  // Requests are waiting: a worker that ran anyway would answer them.
  for (uint32_t q = 0; q < 2; ++q)
    ASSERT_TRUE(snic.push(q, to_bytes("where"), q));
  const size_t baseline = baseline_thread_count();

  CpuOptions options = workers_options(3);
  options.cpus = {allowed.front(), bad};  // worker 1 gets the bad CPU, workers 0 and 2 a good one
  CpuAccelerator<ReportAffinity> acc(snic.region(), ReportAffinity{}, options);
  const Status s = acc.start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("worker 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("CPU " + std::to_string(bad)), std::string::npos) << s.message();

  EXPECT_TRUE(wait_until([&] { return thread_count() == baseline; }))
      << thread_count() << " threads after the failed start, " << baseline << " before";
  for (uint32_t q = 0; q < 2; ++q) {
    EXPECT_EQ(snic.index(IndexArray::kRxHead, q), 0u) << "queue " << q << " was served";
    EXPECT_EQ(snic.index(IndexArray::kTxTail, q), 0u) << "queue " << q << " was answered";
  }
  // The failed accelerator never raised the stop word, so a good one can take the region over.
  EXPECT_FALSE(snic.region().stop_requested());
  CpuAccelerator<ReportAffinity> good(snic.region(), ReportAffinity{}, workers_options(2));
  ASSERT_TRUE(good.start().ok());
  std::vector<TxEntry> replies;
  EXPECT_TRUE(snic.collect_replies(2, replies));
  stop_within(good);
}

INSTANTIATE_TEST_SUITE_P(Kinds, BadCpuTest,
                         ::testing::Values(BadCpuCase{"OutOfRange", true},
                                           BadCpuCase{"NotInAffinityMask", false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace caracal::accel::test
