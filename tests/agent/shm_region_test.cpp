// Regions as the agent creates them: named shm, mode 0600, a valid header with the epoch,
// removed from /dev/shm on unlink and on every destruction path.
#include "caracal/agent/shm_region.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "caracal/mqueue/validate.hpp"
#include "fake_server.hpp"

namespace caracal::agent {
namespace {

using test::shm_exists;

mqueue::RegionGeometry geometry() {
  mqueue::RegionGeometry g;
  g.server_queue_count = 2;
  g.client_queue_count = 1;
  g.slot_bytes = 128;
  g.ring_capacity = 64;
  g.max_message_bytes = 1000;
  return g;
}

std::string test_name(const char* what) {
  return region_shm_name("shm-test", getpid(), what);
}

TEST(ShmRegion, NameIsAgentPidService) {
  EXPECT_EQ(region_shm_name("echo-1", 4321, "echo"), "/caracal-echo-1-4321-echo");
}

TEST(ShmRegion, EpochsAreNonzeroAndFresh) {
  std::set<uint64_t> seen;
  for (int i = 0; i < 64; ++i) {
    const uint64_t e = fresh_epoch();
    EXPECT_NE(e, 0u);
    seen.insert(e);
  }
  EXPECT_EQ(seen.size(), 64u);
}

TEST(ShmRegion, CreatedRegionValidatesIsPrivateAndUnlinks) {
  const std::string name = test_name("valid");
  Result<NamedShmRegion> r = NamedShmRegion::create(name, geometry(), 0xABCDEF);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->linked());
  EXPECT_EQ(r->name(), name);

  // What the server does with the announcement: open by name, check the mode, validate.
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  close(fd);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), r->bytes());

  test::RegionPeer peer(name);
  EXPECT_EQ(peer.header().agent_epoch, 0xABCDEFu);
  EXPECT_EQ(peer.header().server_queue_count, 2u);
  EXPECT_EQ(peer.header().client_queue_count, 1u);
  EXPECT_EQ(peer.header().max_message_bytes, 1000u);
  EXPECT_EQ(peer.header().region_bytes, r->bytes());
  EXPECT_TRUE(mqueue::validate_region(peer.header(), peer.mapped_bytes()).ok());
  EXPECT_EQ(peer.stop_word(), 0u);

  ASSERT_TRUE(r->unlink().ok());
  EXPECT_FALSE(r->linked());
  EXPECT_FALSE(shm_exists(name));
  EXPECT_TRUE(r->unlink().ok());  // idempotent
  // Both mappings outlive the name: a write on one side is seen on the other.
  r->view().request_stop();
  EXPECT_EQ(peer.stop_word(), 1u);
}

TEST(ShmRegion, DestroyingALinkedRegionRemovesTheName) {
  const std::string name = test_name("drop");
  {
    Result<NamedShmRegion> r = NamedShmRegion::create(name, geometry(), 1);
    ASSERT_TRUE(r.ok()) << r.status().message();
    NamedShmRegion moved = std::move(r).value();
    EXPECT_TRUE(moved.linked());
    EXPECT_TRUE(shm_exists(name));
  }
  EXPECT_FALSE(shm_exists(name));
}

TEST(ShmRegion, FailuresLeaveNothingBehind) {
  const std::string name = test_name("bad");
  mqueue::RegionGeometry g = geometry();
  g.max_message_bytes = 1u << 20;  // more than half the ring
  Result<NamedShmRegion> r = NamedShmRegion::create(name, g, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_message_bytes"), std::string::npos);
  EXPECT_FALSE(shm_exists(name));

  // A name that exists is never taken over, and the existing object is left alone.
  Result<NamedShmRegion> first = NamedShmRegion::create(name, geometry(), 1);
  ASSERT_TRUE(first.ok());
  Result<NamedShmRegion> second = NamedShmRegion::create(name, geometry(), 2);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(name), std::string::npos);
  EXPECT_TRUE(shm_exists(name));
  EXPECT_EQ(first->header().agent_epoch, 1u);
}

}  // namespace
}  // namespace caracal::agent
