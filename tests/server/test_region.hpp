// A real region for the server's tests: a named shm object the test creates and initialises as
// an agent does, bound through bind_shm_region as the control endpoint binds one.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "caracal/mqueue/shm.hpp"
#include "mqueue_manager/region.hpp"
#include "mqueue_manager/region_setup.hpp"

namespace caracal::server::test {

struct TestRegion {
  mqueue::ShmMapping mapping;  // the agent's side; unlinks the name when destroyed
  std::shared_ptr<AgentRegion> region;
};

// `name` tells the regions of one test process apart. On failure the test fails and `region`
// is null.
inline TestRegion make_test_region(const std::string& name, const mqueue::RegionGeometry& g,
                                   uint64_t epoch, EngineEvents* events) {
  const mqueue::RegionHeader h = mqueue::compute_layout(g, epoch);
  const std::string shm = "/caracal-server-test-" + std::to_string(getpid()) + "-" + name;
  TestRegion r;
  Result<mqueue::ShmMapping> m = mqueue::ShmMapping::create_named(shm, h.region_bytes);
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (!m.ok()) return r;
  r.mapping = std::move(m).value();
  mqueue::initialize_region(r.mapping.data(), h);
  Result<std::unique_ptr<RegionBinding>> b = bind_shm_region(shm, h.region_bytes);
  EXPECT_TRUE(b.ok()) << b.status().message();
  if (!b.ok()) return r;
  r.region = std::make_shared<AgentRegion>(name, epoch, events, std::move(b).value());
  return r;
}

}  // namespace caracal::server::test
