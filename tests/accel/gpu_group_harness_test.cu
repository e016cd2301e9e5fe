// The group harness on a GPU (caracal/accel/gpu/group_harness.cuh): the handlers of
// group_handlers.hpp as kernels whose warps and blocks are their groups, with the GPU's
// collectives (shuffles, shared memory), give what the CPU harness's threads give, and what the
// request says they must. Skipped where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/accel/gpu/group_harness.cuh"
#include "group_handlers.hpp"

namespace caracal::accel::test {
namespace {

std::vector<std::string> some_requests(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  const std::string alphabet = "abc xyz \x01\x7fq";
  for (size_t i = 0; i < n; ++i) {
    std::string s(rng() % 700, ' ');
    for (char& c : s)
      c = alphabet[rng() % alphabet.size()];
    out.push_back(std::move(s));
  }
  out.push_back("");
  out.push_back("   ");
  out.push_back("q");
  return out;
}

template <class H>
void expect_same_on_both(const std::vector<std::string>& requests,
                         const HarnessOptions& options = {}) {
  if (gpu::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<HarnessReply> cpu = run_on_cpu(H{}, requests, options);
  Result<std::vector<HarnessReply>> on_gpu = gpu::run_on_gpu(H{}, requests, options);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status().message();
  ASSERT_EQ(on_gpu->size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ((*on_gpu)[i].flags, cpu[i].flags) << "request " << i;
    EXPECT_EQ((*on_gpu)[i].bytes, cpu[i].bytes) << "request " << i;
  }
}

TEST(GpuGroupHarness, CompactOverEveryGroupShape) {
  const std::vector<std::string> requests = some_requests(300, 11);
  expect_same_on_both<Compact<Granularity::kThread>>(requests);
  expect_same_on_both<Compact<Granularity::kWarp>>(requests);
  expect_same_on_both<Compact<Granularity::kBlock>>(requests);
  expect_same_on_both<Compact<Granularity::kBlock, 64>>(requests);
  HarnessOptions wide;
  wide.block_threads = 1024;  // 32 warps: every slot of the block's collectives
  expect_same_on_both<Compact<Granularity::kBlock>>(requests, wide);
  if (gpu::device_count() == 0) return;
  // And what the request says it must be, not only the CPU's answer.
  auto replies = gpu::run_on_gpu(Compact<Granularity::kWarp>{}, requests);
  ASSERT_TRUE(replies.ok());
  for (size_t i = 0; i < requests.size(); ++i) {
    std::string want = requests[i];
    want.erase(std::remove(want.begin(), want.end(), ' '), want.end());
    EXPECT_EQ((*replies)[i].bytes, want) << "request " << i;
  }
}

TEST(GpuGroupHarness, FiguresOverEveryGroupShape) {
  const std::vector<std::string> requests = some_requests(100, 5);
  expect_same_on_both<Figures<Granularity::kThread>>(requests);
  expect_same_on_both<Figures<Granularity::kWarp>>(requests);
  expect_same_on_both<Figures<Granularity::kBlock>>(requests);
  HarnessOptions wide;
  wide.block_threads = 1024;
  expect_same_on_both<Figures<Granularity::kBlock>>(requests, wide);
}

TEST(GpuGroupHarness, BatchedHandlers) {
  expect_same_on_both<BatchSums>(some_requests(41, 3));
}

}  // namespace
}  // namespace caracal::accel::test
