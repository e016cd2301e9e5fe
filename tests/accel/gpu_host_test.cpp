// The host side of the GPU accelerator that needs no GPU: launch shapes, the refusal of devices
// that cannot take RDMA writes into a region, and device discovery on a host without a device.
#include <gtest/gtest.h>

#include <string>

#include "caracal/accel/gpu/cuda.hpp"
#include "caracal/accel/gpu/launch.hpp"

namespace caracal::accel::gpu {
namespace {

TEST(GpuLaunchShape, WorkersFollowTheGranularity) {
  GpuOptions o;
  Result<detail::LaunchShape> warp = detail::launch_shape(Granularity::kWarp, 8, 0, o, 128, 48);
  ASSERT_TRUE(warp.ok());
  EXPECT_EQ(warp->workers, 8u);  // one per server queue
  EXPECT_EQ(warp->threads, 128u);
  EXPECT_EQ(warp->blocks, 2u);
  EXPECT_EQ(warp->shared_bytes, 4u * 48);

  Result<detail::LaunchShape> thread = detail::launch_shape(Granularity::kThread, 3, 0, o, 128, 48);
  ASSERT_TRUE(thread.ok());
  EXPECT_EQ(thread->threads, 32u);  // a warp holds all three
  EXPECT_EQ(thread->blocks, 1u);
  EXPECT_EQ(thread->shared_bytes, 0u);

  Result<detail::LaunchShape> block = detail::launch_shape(Granularity::kBlock, 5, 0, o, 256, 48);
  ASSERT_TRUE(block.ok());
  EXPECT_EQ(block->blocks, 5u);
  EXPECT_EQ(block->threads, 256u);
}

TEST(GpuLaunchShape, WorkersAreBoundedByQueuesAndClientQueues) {
  GpuOptions o;
  o.workers = 50;
  EXPECT_EQ(detail::launch_shape(Granularity::kWarp, 8, 0, o, 128, 48)->workers, 8u);
  o.workers = 0;
  // Every worker must own a client queue to call out.
  EXPECT_EQ(detail::launch_shape(Granularity::kThread, 4, 1, o, 128, 48)->workers, 1u);
  o.workers = 3;
  EXPECT_EQ(detail::launch_shape(Granularity::kThread, 4, 1, o, 128, 48)->workers, 3u);
}

TEST(GpuLaunchShape, BadBlockSizesAreRefused) {
  GpuOptions o;
  Result<detail::LaunchShape> odd = detail::launch_shape(Granularity::kBlock, 1, 0, o, 100, 48);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("multiple of 32"), std::string::npos);
  EXPECT_FALSE(detail::launch_shape(Granularity::kBlock, 1, 0, o, 2048, 48).ok());
  EXPECT_FALSE(detail::launch_shape(Granularity::kWarp, 0, 0, o, 128, 48).ok());
}

TEST(GpuRdmaCheck, EachMissingAttributeIsNamed) {
  RdmaCapabilities ok{true, true, 100, 1};
  EXPECT_TRUE(check_rdma_capabilities(ok, 0).ok());
  RdmaCapabilities all = ok;
  all.writes_ordering = 200;
  EXPECT_TRUE(check_rdma_capabilities(all, 0).ok());

  RdmaCapabilities no_rdma = ok;
  no_rdma.gpudirect_rdma = false;
  Status a = check_rdma_capabilities(no_rdma, 1);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.message().find("gpu:1 does not support GPUDirect RDMA"), std::string::npos);

  RdmaCapabilities no_dmabuf = ok;
  no_dmabuf.dma_buf = false;
  Status b = check_rdma_capabilities(no_dmabuf, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.message().find("dma-buf"), std::string::npos);

  RdmaCapabilities unordered = ok;
  unordered.writes_ordering = 0;
  Status c = check_rdma_capabilities(unordered, 0);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.message().find("does not order remote writes"), std::string::npos);
  EXPECT_NE(unordered.str().find("remote-write ordering none"), std::string::npos);
}

TEST(GpuDiscovery, ABadDeviceIndexIsNamed) {
  const int n = device_count();  // 0 on a host without a driver: not an error
  Status s = use_device(n + 3);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("gpu:" + std::to_string(n + 3) + ": no such device"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(describe_device(-1).ok());
}

}  // namespace
}  // namespace caracal::accel::gpu
