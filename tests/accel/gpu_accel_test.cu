// The GPU accelerator against a real SmartNIC side: persistent kernels serving regions in
// mapped shared memory (the `shm` transport, with RemoteRegion<ShmTransport> on a second
// mapping) and in device memory (written and read by the copy engine from a non-blocking
// stream, the way RDMA arrives). Skipped where no CUDA device is present.
//
// CARACAL_GPU_TEST_MESSAGES scales the message counts (compute-sanitizer runs use fewer).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/gpu/accelerator.cuh"
#include "caracal/accel/gpu/copy_transport.hpp"
#include "caracal/accel/gpu/cuda.hpp"
#include "snic_driver.hpp"

extern char** environ;

namespace caracal::accel::test {
namespace {

using gpu::GpuAccelerator;
using gpu::GpuRegion;
using PendingRequest = SnicDriver::PendingRequest;

// Names the helper a child of this binary runs (main(), Child::spawn).
constexpr const char* kHelperVariable = "CARACAL_GPU_TEST_HELPER";

// A helper's failure: said on stdout, where the test reads it, and exit 1.
int helper_failed(const std::string& what) {
  std::printf("helper failed: %s\n", what.c_str());
  std::fflush(stdout);
  return 1;
}

bool have_gpu() {
  return gpu::device_count() > 0;
}

uint32_t messages(uint32_t normal) {
  if (const char* s = std::getenv("CARACAL_GPU_TEST_MESSAGES")) {
    const uint32_t n = static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
    if (n != 0 && n < normal) return n;
  }
  return normal;
}

// --- handlers of every shape ----------------------------------------------------------------

template <Granularity G>
struct Echo {
  static constexpr Granularity kGranularity = G;
  CARACAL_HOST_DEVICE void operator()(const Request& req, Response& resp, Context& ctx) const {
    group_copy(ctx.group(), resp.data, req.data, req.size);
    resp.size = req.size;
  }
};

template <Granularity G, uint32_t B>
struct BatchEcho {
  static constexpr Granularity kGranularity = G;
  static constexpr uint32_t kBatch = B;
  CARACAL_HOST_DEVICE void operator()(const Request* reqs, Response* resps, uint32_t n,
                                      Context& ctx) const {
    for (uint32_t i = 0; i < n; ++i) {
      group_copy(ctx.group(), resps[i].data, reqs[i].data, reqs[i].size);
      resps[i].size = reqs[i].size;
    }
  }
};

// Requests of random sizes from 0 to the largest message, single- and multi-slot, with the
// slot boundaries among them.
std::vector<std::vector<PendingRequest>> make_requests(uint32_t queues, uint32_t per_queue,
                                                       uint32_t max_message, uint32_t slot_bytes,
                                                       uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> size(0, max_message);
  const uint32_t edges[] = {0, 1, slot_bytes - mqueue::kSlotHeaderBytes,
                            slot_bytes - mqueue::kSlotHeaderBytes + 1, max_message};
  std::vector<std::vector<PendingRequest>> r(queues);
  for (uint32_t q = 0; q < queues; ++q) {
    for (uint32_t i = 0; i < per_queue; ++i) {
      const uint32_t n = i < 5 ? edges[i] : size(rng);
      r[q].push_back(PendingRequest{random_bytes(rng, n), request_token(q, i)});
    }
  }
  return r;
}

// Every reply is its request's bytes, in order, with its token.
void expect_echoed(const std::vector<std::vector<PendingRequest>>& requests,
                   const std::vector<std::vector<TxEntry>>& replies) {
  ASSERT_EQ(replies.size(), requests.size());
  for (size_t q = 0; q < requests.size(); ++q) {
    ASSERT_EQ(replies[q].size(), requests[q].size()) << "queue " << q;
    for (size_t i = 0; i < requests[q].size(); ++i) {
      ASSERT_EQ(replies[q][i].token, requests[q][i].token) << "queue " << q << " reply " << i;
      ASSERT_EQ(replies[q][i].flags, 0) << "queue " << q << " reply " << i;
      ASSERT_TRUE(replies[q][i].data == requests[q][i].payload)
          << "queue " << q << " reply " << i << ": " << replies[q][i].data.size() << " bytes for "
          << requests[q][i].payload.size();
    }
  }
}

mqueue::RegionGeometry multi_slot_geometry(uint32_t server_queues, uint32_t client_queues = 0,
                                           bool rx_lines = false, bool tx_lines = false) {
  mqueue::RegionGeometry g;
  g.rx_lines = rx_lines;
  g.tx_lines = tx_lines;
  g.server_queue_count = server_queues;
  g.client_queue_count = client_queues;
  g.slot_bytes = 64;
  g.ring_capacity = 64;
  g.max_message_bytes = 1000;  // up to 16 slots
  return g;
}

// A region in shared memory, registered with CUDA the way a GPU agent registers it.
struct MappedShm {
  explicit MappedShm(const mqueue::RegionGeometry& g) : driver(g) {
    Result<gpu::MappedHostRange> r =
        gpu::MappedHostRange::register_range(driver.agent_data(), driver.agent_bytes());
    if (!r.ok()) throw std::runtime_error(r.status().message());
    range = std::move(r).value();
  }
  GpuRegion region() const { return GpuRegion{range.device(), range.host()}; }
  SnicDriver driver;
  gpu::MappedHostRange range;
};

template <class A>
void stop_ok(A& acc) {
  Status s = acc.stop();
  ASSERT_TRUE(s.ok()) << s.message();
}

// --- echo over shm, every handler shape -----------------------------------------------------

template <class H>
class GpuEcho : public ::testing::Test {};
using Shapes =
    ::testing::Types<Echo<Granularity::kThread>, Echo<Granularity::kWarp>,
                     Echo<Granularity::kBlock>, BatchEcho<Granularity::kThread, 8>,
                     BatchEcho<Granularity::kWarp, 16>, BatchEcho<Granularity::kBlock, 4>>;
TYPED_TEST_SUITE(GpuEcho, Shapes);

template <class H>
void echo_over_mapped_shm(bool rx_lines, bool tx_lines = false) {
  const mqueue::RegionGeometry g = multi_slot_geometry(4, 0, rx_lines, tx_lines);
  MappedShm shm(g);
  GpuOptions options;
  options.workers = 2;  // two queues per worker
  GpuAccelerator<H> acc(shm.region(), H{}, options, 0);
  Status s = acc.start();
  ASSERT_TRUE(s.ok()) << s.message();
  const uint32_t per_queue = messages(3000);
  const auto requests = make_requests(4, per_queue, g.max_message_bytes, g.slot_bytes, 7);
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(shm.driver.exchange(requests, replies)) << "timed out";
  expect_echoed(requests, replies);
  ASSERT_TRUE(acc.health().ok()) << acc.health().message();
  stop_ok(acc);
  EXPECT_EQ(acc.total_requests(), uint64_t{4} * per_queue);
  uint64_t errors = 0;
  for (uint32_t w = 0; w < acc.workers(); ++w)
    errors += acc.counters(w).handler_errors + acc.counters(w).corrupt_entries;
  EXPECT_EQ(errors, 0u);
  // Warps and blocks with a single-request handler announce short replies in TX lines; the
  // driver takes whichever of line and tail it meets first, so some (not all) come by line.
  constexpr bool kAnnounces = granularity_of<H>() != Granularity::kThread && batch_of<H>() == 1;
  if (tx_lines && kAnnounces) {
    EXPECT_GT(shm.driver.taken_by_line(), 0u);
  } else {
    EXPECT_EQ(shm.driver.taken_by_line(), 0u);
  }
}

TYPED_TEST(GpuEcho, EveryReplyCorrectAndInOrderOverMappedShm) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  echo_over_mapped_shm<TypeParam>(false);
}

// Requests found through RX lines: short ones from the line itself (warps and blocks), long
// ones and skips announced there and read from the slots.
TYPED_TEST(GpuEcho, EveryReplyCorrectAndInOrderWithRxLines) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  echo_over_mapped_shm<TypeParam>(true);
}

// Short replies announced in TX lines as well (warps and blocks with single-request handlers
// stage their replies and write the line; the others count entries and go by the tail).
TYPED_TEST(GpuEcho, EveryReplyCorrectAndInOrderWithRxAndTxLines) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  echo_over_mapped_shm<TypeParam>(true, true);
}

TYPED_TEST(GpuEcho, EveryReplyCorrectAndInOrderWithTxLinesOnly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  echo_over_mapped_shm<TypeParam>(false, true);
}

// --- a region in device memory, reached by the copy engine ---------------------------------

class CopyEngineDriver : public RemoteDriver<gpu::CopyEngineTransport> {
 public:
  explicit CopyEngineDriver(const gpu::DeviceRegion& region) {
    Result<gpu::CopyEngineTransport> t =
        gpu::CopyEngineTransport::create(region.device(), region.bytes());
    if (!t.ok()) throw std::runtime_error(t.status().message());
    transport_.emplace(std::move(t).value());
    Result<Remote> remote = Remote::attach(&*transport_);
    if (!remote.ok()) throw std::runtime_error("attach: " + remote.status().message());
    remote_.emplace(std::move(remote).value());
  }
};

TEST(GpuDeviceRegion, CopyEngineWritesAndReadsWhileTheKernelPolls) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const mqueue::RegionGeometry g = multi_slot_geometry(4);
  Result<gpu::DeviceRegion> region = gpu::DeviceRegion::create(0, g, 42);
  ASSERT_TRUE(region.ok()) << region.status().message();
  CopyEngineDriver driver(*region);
  EXPECT_EQ(driver.header().agent_epoch, 42u);
  using H = Echo<Granularity::kWarp>;
  GpuAccelerator<H> acc(GpuRegion{region->device(), nullptr}, H{}, {}, 0);
  Status s = acc.start();
  ASSERT_TRUE(s.ok()) << s.message();
  const uint32_t per_queue = messages(2000);
  const auto requests = make_requests(4, per_queue, g.max_message_bytes, g.slot_bytes, 11);
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(driver.exchange(requests, replies)) << "timed out";
  expect_echoed(requests, replies);
  stop_ok(acc);  // the stop word goes in by a copy too
  EXPECT_EQ(acc.total_requests(), uint64_t{4} * per_queue);
}

// --- client queues from device code ---------------------------------------------------------

constexpr uint64_t call_token(uint32_t worker, uint64_t n) {
  return (uint64_t{worker} << 48) | n;
}

// Forwards each request through the worker's client queue; the response is the call's status
// in one byte, then the reply.
struct CallThrough {
  uint64_t calls = 0;
  CARACAL_HOST_DEVICE void operator()(const Request& req, Response& resp, Context& ctx) {
    if (ctx.client_count() == 0) return resp.set_error("no client queue");
    const CallResult r = ctx.client(0).call(call_token(ctx.worker(), ++calls), req.data, req.size,
                                            resp.data + 1, resp.capacity - 1);
    resp.data[0] = static_cast<std::byte>(r.status);
    resp.size = 1 + (r.length < resp.capacity - 1 ? r.length : resp.capacity - 1);
  }
};

void call_out(bool rx_lines, bool tx_lines = false) {
  const mqueue::RegionGeometry g = multi_slot_geometry(2, 2, rx_lines, tx_lines);
  MappedShm shm(g);
  GpuAccelerator<CallThrough> acc(shm.region(), CallThrough{}, {}, 0);
  Status s = acc.start();
  ASSERT_TRUE(s.ok()) << s.message();
  SnicDriver& d = shm.driver;
  const uint32_t per_queue = messages(500);
  std::vector<std::vector<PendingRequest>> requests(2);
  for (uint32_t q = 0; q < 2; ++q) {
    for (uint32_t i = 0; i < per_queue; ++i) {
      requests[q].push_back(PendingRequest{
          to_bytes("q" + std::to_string(q) + "-" + std::to_string(i)), request_token(q, i)});
    }
  }
  // The destination: answers every call with the request upper-cased, echoing its token; an
  // unexpected token fails.
  std::vector<uint64_t> next_call(2, 1);
  bool bad_token = false;
  auto destination = [&] {
    for (uint32_t c = 0; c < 2; ++c) {
      std::vector<TxEntry> calls;
      d.take_client_requests(c, calls);
      for (const TxEntry& call : calls) {
        if (call.token != call_token(c, next_call[c]++)) bad_token = true;
        std::string text = call.text();
        for (char& ch : text)
          ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        if (!d.answer(c, call.token, to_bytes(text))) bad_token = true;
      }
    }
  };
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(d.exchange(requests, replies, 0, destination)) << "timed out";
  EXPECT_FALSE(bad_token);
  for (uint32_t q = 0; q < 2; ++q) {
    ASSERT_EQ(replies[q].size(), per_queue);
    for (uint32_t i = 0; i < per_queue; ++i) {
      const TxEntry& r = replies[q][i];
      ASSERT_FALSE(r.data.empty());
      EXPECT_EQ(static_cast<CallStatus>(r.data[0]), CallStatus::kOk);
      std::string want = "Q" + std::to_string(q) + "-" + std::to_string(i);
      EXPECT_EQ(r.text().substr(1), want);
    }
  }
  stop_ok(acc);
}

TEST(GpuClientQueues, HandlersCallOutAndGetTheirReplies) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  call_out(false);
}

// The replies on client queues come through RX lines too.
TEST(GpuClientQueues, HandlersCallOutAndGetTheirRepliesWithRxLines) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  call_out(true);
}

TEST(GpuClientQueues, HandlersCallOutAndGetTheirRepliesWithRxAndTxLines) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  call_out(true, true);
}

// --- overlapped handlers (overlap.hpp) ------------------------------------------------------

// Sends the request through client queue 0 and answers "<request>=<reply>"; every thread of the
// group writes its share of the reply, so a broken barrier between the phases shows.
template <Granularity G>
struct OverlapRelay {
  static constexpr Granularity kGranularity = G;
  static constexpr uint32_t kInFlight = 16;
  struct Pending {
    uint32_t sent;
    uint32_t length;
    std::byte copy[64];  // the request, copied by the group in start()
  };
  CARACAL_HOST_DEVICE void start(const Request& req, Pending& p, Calls& calls, Context& ctx) {
    const Group& g = ctx.group();
    const uint32_t n = req.size < 64 ? req.size : 64;
    for (uint32_t i = g.rank(); i < n; i += g.size())
      p.copy[i] = req.data[i];
    if (g.leader()) {
      p.length = n;
      p.sent = calls.send(0, req.data, req.size) ? 1 : 0;
    }
  }
  CARACAL_HOST_DEVICE void finish(const Request&, Pending& p, const Replies& replies,
                                  Response& resp, Context& ctx) {
    const Group& g = ctx.group();
    if (p.sent == 0 || replies[0].status != CallStatus::kOk) {
      if (g.leader()) resp.set_error("overlap: call failed");
      return;
    }
    const uint32_t n = p.length;
    const uint32_t m = replies[0].length;
    for (uint32_t i = g.rank(); i < n + 1 + m; i += g.size()) {
      resp.data[i] = i < n ? p.copy[i] : i == n ? std::byte{'='} : replies[0].data[i - n - 1];
    }
    if (g.leader()) resp.size = n + 1 + m;
  }
};

template <class H>
class GpuOverlap : public ::testing::Test {};
using OverlapShapes =
    ::testing::Types<OverlapRelay<Granularity::kThread>, OverlapRelay<Granularity::kWarp>,
                     OverlapRelay<Granularity::kBlock>>;
TYPED_TEST_SUITE(GpuOverlap, OverlapShapes);

// Two queues, two workers; the destination holds the calls and answers them newest first, in
// groups of 16 (a worker that held its queue for each call would never have two open).
TYPED_TEST(GpuOverlap, RequestsStayOpenAcrossCallsAndFinishAsRepliesLand) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const mqueue::RegionGeometry g = multi_slot_geometry(2, 2, true, false);
  MappedShm shm(g);
  GpuAccelerator<TypeParam> acc(shm.region(), TypeParam{}, {}, 0);
  Status s = acc.start();
  ASSERT_TRUE(s.ok()) << s.message();
  SnicDriver& d = shm.driver;
  const uint32_t per_queue = messages(2000);
  std::vector<std::vector<PendingRequest>> requests(2);
  for (uint32_t q = 0; q < 2; ++q) {
    for (uint32_t i = 0; i < per_queue; ++i) {
      requests[q].push_back(PendingRequest{
          to_bytes("q" + std::to_string(q) + "-" + std::to_string(i)), request_token(q, i)});
    }
  }
  std::vector<std::vector<TxEntry>> held(2);
  std::vector<size_t> answered(2, 0);
  size_t most_open = 0;
  bool failed = false;
  auto destination = [&] {
    for (uint32_t c = 0; c < 2; ++c) {
      d.take_client_requests(c, held[c]);
      most_open = std::max(most_open, held[c].size());
      if (held[c].size() >= 16 || answered[c] + held[c].size() == per_queue) {
        for (auto it = held[c].rbegin(); it != held[c].rend(); ++it) {
          std::string text = it->text();
          std::reverse(text.begin(), text.end());
          if (!d.answer(c, it->token, to_bytes(text))) failed = true;
        }
        answered[c] += held[c].size();
        held[c].clear();
      }
    }
  };
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(d.exchange(requests, replies, 0, destination)) << "timed out";
  EXPECT_FALSE(failed);
  EXPECT_EQ(most_open, 16u);
  for (uint32_t q = 0; q < 2; ++q) {
    ASSERT_EQ(replies[q].size(), per_queue);
    std::vector<bool> seen(per_queue, false);
    for (const TxEntry& r : replies[q]) {
      const uint32_t i = token_seq(r.token);
      ASSERT_LT(i, per_queue);
      EXPECT_FALSE(seen[i]);
      seen[i] = true;
      const std::string text = to_text(requests[q][i].payload);
      EXPECT_EQ(r.text(), text + "=" + std::string(text.rbegin(), text.rend()));
    }
  }
  stop_ok(acc);
  uint64_t stale = 0;
  for (uint32_t w = 0; w < acc.workers(); ++w)
    stale += acc.counters(w).stale_replies;
  EXPECT_EQ(stale, 0u);
}

// A kernel stopped with requests open serves them again after the restart; the calls it made
// before are answered late, and dropped (the tables outlive the launch, so tokens never repeat).
TEST(GpuOverlapLifecycle, RequestsOpenAtAStopAreServedAgainAfterTheRestart) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const mqueue::RegionGeometry g = multi_slot_geometry(1, 1, false, false);
  MappedShm shm(g);
  using H = OverlapRelay<Granularity::kWarp>;
  GpuAccelerator<H> acc(shm.region(), H{}, {}, 0);
  Status s = acc.start();
  ASSERT_TRUE(s.ok()) << s.message();
  SnicDriver& d = shm.driver;
  constexpr uint32_t kRequests = 6;
  std::vector<std::vector<PendingRequest>> requests(1);
  for (uint32_t i = 0; i < kRequests; ++i)
    requests[0].push_back(PendingRequest{to_bytes("r" + std::to_string(i)), request_token(0, i)});
  for (const PendingRequest& r : requests[0])
    ASSERT_TRUE(d.try_push(0, r.payload, r.token));
  d.publish(0);
  std::vector<TxEntry> first;
  ASSERT_TRUE(wait_until([&] {
    d.take_client_requests(0, first);
    return first.size() == kRequests;
  }));
  stop_ok(acc);
  s = acc.start();
  ASSERT_TRUE(s.ok()) << s.message();
  for (const TxEntry& call : first)
    ASSERT_TRUE(d.answer(0, call.token, to_bytes("late")));
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(d.exchange(requests, replies, kRequests, [&] {
    std::vector<TxEntry> calls;
    d.take_client_requests(0, calls);
    for (const TxEntry& call : calls)
      ASSERT_TRUE(d.answer(0, call.token, to_bytes("ok")));
  })) << "timed out";
  ASSERT_EQ(replies[0].size(), kRequests);
  for (const TxEntry& r : replies[0])
    EXPECT_EQ(r.text(), "r" + std::to_string(token_seq(r.token)) + "=ok");
  stop_ok(acc);
  EXPECT_EQ(acc.counters(0).stale_replies, kRequests);
}

// --- lifecycle ------------------------------------------------------------------------------

void stop_then_restart(bool rx_lines, bool tx_lines = false) {
  const mqueue::RegionGeometry g = multi_slot_geometry(2, 0, rx_lines, tx_lines);
  MappedShm shm(g);
  using H = Echo<Granularity::kWarp>;
  GpuAccelerator<H> acc(shm.region(), H{}, {}, 0);
  ASSERT_TRUE(acc.start().ok());
  auto first = make_requests(2, 200, g.max_message_bytes, g.slot_bytes, 1);
  std::vector<std::vector<TxEntry>> replies;
  ASSERT_TRUE(shm.driver.exchange(first, replies));
  expect_echoed(first, replies);
  stop_ok(acc);
  EXPECT_FALSE(acc.running());
  EXPECT_TRUE(acc.health().ok());

  // Requests queued while nothing serves wait in RX; the restarted kernel takes them from the
  // head the last one published, once each.
  auto second = make_requests(2, 20, 40, g.slot_bytes, 2);  // one slot each: 20 fit a ring
  for (uint32_t q = 0; q < 2; ++q) {
    for (const auto& r : second[q])
      ASSERT_TRUE(shm.driver.push(q, r.payload, r.token));
  }
  std::vector<TxEntry> early;
  shm.driver.poll_replies(early);
  EXPECT_TRUE(early.empty()) << "a stopped kernel answered";
  Status s = acc.start();
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<std::vector<TxEntry>> later;
  ASSERT_TRUE(shm.driver.exchange(second, later, second[0].size()));
  expect_echoed(second, later);
  stop_ok(acc);
  if (tx_lines) {
    // Both sides count every TX entry (skip markers too) across the restart.
    for (uint32_t q = 0; q < 2; ++q) {
      const uint32_t produced = shm.driver.transport().load_index(
          mqueue::index_offset(shm.driver.header(), mqueue::IndexArray::kTxTail, q) +
          mqueue::kEntriesWordOffset);
      EXPECT_EQ(produced, shm.driver.remote().tx(q).entries()) << "queue " << q;
      EXPECT_GE(produced, 220u) << "queue " << q;
    }
  }
}

TEST(GpuLifecycle, StopThenRestartResumesWhereItLeftOff) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  stop_then_restart(false);
}

// With RX lines the restarted kernel also resumes at the entry count the last one published.
TEST(GpuLifecycle, StopThenRestartResumesWhereItLeftOffWithRxLines) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  stop_then_restart(true);
}

// The restarted kernel resumes the TX entry count too: its replies' lines carry the flags the
// driver expects.
TEST(GpuLifecycle, StopThenRestartResumesWhereItLeftOffWithRxAndTxLines) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  stop_then_restart(true, true);
}

TEST(GpuLifecycle, StopWordRaisedByThePeerEndsTheKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  MappedShm shm(multi_slot_geometry(2));
  using H = Echo<Granularity::kThread>;
  GpuAccelerator<H> acc(shm.region(), H{}, {}, 0);
  ASSERT_TRUE(acc.start().ok());
  ASSERT_TRUE(acc.health().ok());
  shm.driver.request_stop();
  ASSERT_TRUE(wait_until([&] { return !acc.health().ok(); })) << "the kernel kept running";
  EXPECT_EQ(acc.health().code(), StatusCode::kAborted) << acc.health().message();
  EXPECT_NE(acc.health().message().find("stop word"), std::string::npos);
  stop_ok(acc);
}

TEST(GpuLifecycle, AnIdleWorkerThatBackedOffStillAnswers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  MappedShm shm(multi_slot_geometry(1));
  using H = Echo<Granularity::kWarp>;
  GpuOptions options;
  options.busy_polls = 16;
  options.idle_sleep_max_ns = 100000;  // the longest sleep the hardware allows is about 1 ms
  GpuAccelerator<H> acc(shm.region(), H{}, options, 0);
  ASSERT_TRUE(acc.start().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // long past busy_polls
  ASSERT_TRUE(shm.driver.push(0, to_bytes("after a nap"), 5));
  std::vector<TxEntry> replies;
  ASSERT_TRUE(shm.driver.collect_replies(1, replies));
  EXPECT_EQ(replies[0].text(), "after a nap");
  EXPECT_EQ(replies[0].token, 5u);
  stop_ok(acc);
}

// --- bad handlers and bad peers ---------------------------------------------------------------

// Claims one byte more than its buffer holds for requests that start with 'X'.
struct Overrun {
  CARACAL_HOST_DEVICE void operator()(const Request& req, Response& resp, Context&) const {
    if (req.size > 0 && req.data[0] == std::byte{'X'}) {
      resp.size = resp.capacity + 1;
      return;
    }
    copy_bytes(resp.data, req.data, req.size);
    resp.size = req.size;
  }
};

TEST(GpuErrors, AnOverrunningResponseBecomesAnErrorReply) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  MappedShm shm(multi_slot_geometry(1));
  GpuAccelerator<Overrun> acc(shm.region(), Overrun{}, {}, 0);
  ASSERT_TRUE(acc.start().ok());
  ASSERT_TRUE(shm.driver.push(0, to_bytes("fine"), 1));
  ASSERT_TRUE(shm.driver.push(0, to_bytes("Xbad"), 2));
  ASSERT_TRUE(shm.driver.push(0, to_bytes("fine again"), 3));
  std::vector<TxEntry> replies;
  ASSERT_TRUE(shm.driver.collect_replies(3, replies));
  EXPECT_EQ(replies[0].text(), "fine");
  EXPECT_TRUE(replies[1].is_error());
  EXPECT_NE(replies[1].text().find("overran"), std::string::npos) << replies[1].text();
  EXPECT_EQ(replies[2].text(), "fine again");
  stop_ok(acc);
  EXPECT_EQ(acc.counters(0).handler_errors, 1u);
}

TEST(GpuErrors, ACorruptEntryStopsItsQueueOnly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  MappedShm shm(multi_slot_geometry(2));
  using H = Echo<Granularity::kThread>;
  GpuOptions options;
  options.workers = 1;  // one worker owns both queues
  GpuAccelerator<H> acc(shm.region(), H{}, options, 0);
  ASSERT_TRUE(acc.start().ok());
  mqueue::SlotHeader bad{8, 0x80, 1, 99};  // an unknown flag
  shm.driver.push_raw_header(0, bad, 8);
  ASSERT_TRUE(wait_until([&] { return acc.counters(0).corrupt_entries == 1; }));
  ASSERT_TRUE(shm.driver.push(1, to_bytes("still here"), 7));
  std::vector<TxEntry> replies;
  ASSERT_TRUE(shm.driver.collect_replies(1, replies));
  EXPECT_EQ(replies[0].text(), "still here");
  EXPECT_EQ(replies[0].queue, 1u);
  stop_ok(acc);
}

TEST(GpuErrors, WorkersThatCannotAllBeResidentAreRefused) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  mqueue::RegionGeometry g;
  g.server_queue_count = 1000;
  g.slot_bytes = 64;
  g.ring_capacity = 2;
  g.max_message_bytes = 48;
  MappedShm shm(g);
  using H = Echo<Granularity::kBlock>;
  GpuOptions options;
  options.block_threads = 1024;
  GpuAccelerator<H> acc(shm.region(), H{}, options, 0);
  Status s = acc.start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("resident"), std::string::npos) << s.message();
  EXPECT_FALSE(acc.running());
}

// --- the device facts the agent relies on -----------------------------------------------------

TEST(GpuDevice, RdmaAttributesAreReadAndDmaBufExportMatchesThem) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Result<gpu::RdmaCapabilities> caps = gpu::query_rdma_capabilities(0);
  ASSERT_TRUE(caps.ok()) << caps.status().message();
  std::printf("gpu:0 %s\n", caps->str().c_str());
  Result<gpu::DeviceRegion> region = gpu::DeviceRegion::create(0, multi_slot_geometry(2), 1);
  ASSERT_TRUE(region.ok()) << region.status().message();
  EXPECT_EQ(region->allocation_bytes() % (2u << 20), 0u);
  Result<int> fd = region->export_dma_buf();
  if (caps->dma_buf) {
    ASSERT_TRUE(fd.ok()) << fd.status().message();
    EXPECT_GE(*fd, 0);
    close(*fd);
  } else {
    EXPECT_FALSE(fd.ok());
  }
  Status check = gpu::check_rdma_capabilities(*caps, 0);
  std::printf("rdma check: %s\n", check.ok() ? "usable" : check.message().c_str());
}

// This test binary again, running one helper (see main() below) instead of the tests; its stdin
// and stdout are pipes. For what must happen in a process of its own: holding a context that
// another process sees, or a kernel fault that poisons the CUDA context for good.
struct Child {
  pid_t pid = 0;
  int in = -1;   // the child's stdin
  int out = -1;  // the child's stdout

  static Child spawn(const std::string& helper) {
    int to_child[2];
    int from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    posix_spawn_file_actions_addclose(&fa, to_child[1]);
    posix_spawn_file_actions_addclose(&fa, from_child[0]);
    std::string self(4096, '\0');
    self.resize(static_cast<size_t>(readlink("/proc/self/exe", self.data(), self.size())));
    char* argv[] = {self.data(), nullptr};
    std::vector<char*> env;
    for (char** e = environ; *e != nullptr; ++e)
      env.push_back(*e);
    std::string marker = std::string(kHelperVariable) + "=" + helper;
    env.push_back(marker.data());
    env.push_back(nullptr);
    Child c;
    if (posix_spawn(&c.pid, self.c_str(), &fa, nullptr, argv, env.data()) != 0) {
      throw std::runtime_error("posix_spawn");
    }
    posix_spawn_file_actions_destroy(&fa);
    close(to_child[0]);
    close(from_child[1]);
    c.in = to_child[1];
    c.out = from_child[0];
    return c;
  }
  // Reads the child's stdout until `needle` shows or it closes.
  std::string read_until(const std::string& needle) {
    std::string text;
    char buf[256];
    while (text.find(needle) == std::string::npos) {
      const ssize_t n = read(out, buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    return text;
  }
  int wait() {
    if (in >= 0) close(in);
    in = -1;
    int status = 0;
    waitpid(pid, &status, 0);
    if (out >= 0) close(out);
    out = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

// A handler that faults on requests starting with '!'.
struct Faulty {
  __device__ void operator()(const Request& req, Response& resp, Context&) const {
    if (req.size > 0 && req.data[0] == std::byte{'!'}) __trap();
    copy_bytes(resp.data, req.data, req.size);
    resp.size = req.size;
  }
};

// Helper "faulting-kernel", for the next test: after the fault, health() names the failure
// and stop() returns instead of hanging. Exit 0 when it got that far.
int faulting_kernel_helper() {
  MappedShm shm(multi_slot_geometry(1));
  GpuAccelerator<Faulty> acc(shm.region(), Faulty{}, {}, 0);
  if (Status s = acc.start(); !s.ok()) return helper_failed("start: " + s.message());
  std::vector<TxEntry> replies;
  if (!shm.driver.push(0, to_bytes("fine"), 1) || !shm.driver.collect_replies(1, replies)) {
    return helper_failed("no reply before the fault");
  }
  if (!shm.driver.push(0, to_bytes("!boom"), 2)) return helper_failed("cannot push the fault");
  if (!wait_until([&] { return !acc.health().ok(); })) return helper_failed("no fault reported");
  std::printf("health: %s\n", acc.health().message().c_str());
  Status stopped = acc.stop();
  std::printf("stop: %s\n", stopped.ok() ? "ok" : stopped.message().c_str());
  std::fflush(stdout);
  return 0;
}

TEST(GpuFault, AFaultIsReportedAndNothingHangs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Child child = Child::spawn("faulting-kernel");
  const std::string out = child.read_until("stop: ");
  const std::string rest = child.read_until("\n");
  EXPECT_EQ(child.wait(), 0) << out << rest;
  EXPECT_NE(out.find("health: gpu:0 kernel"), std::string::npos) << out;
  EXPECT_NE(out.find("failed"), std::string::npos) << out;
}

// Helper "hold-context", for the next test: holds a CUDA context until its stdin closes.
int hold_context_helper() {
  if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess) {
    return helper_failed(std::string("no CUDA context: ") + cudaGetErrorString(e));
  }
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}

TEST(GpuDevice, OtherProcessesOnTheGpuAreListed) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // this process holds a context too
  Result<std::vector<gpu::GpuProcess>> before = gpu::other_gpu_processes(0);
  // Only a build or a host without NVML is a reason to skip; any other error fails.
  if (!before.ok() && (before.status().message().find("cannot load NVML") != std::string::npos ||
                       before.status().message().find("no NVML support") != std::string::npos)) {
    GTEST_SKIP() << before.status().message();
  }
  ASSERT_TRUE(before.ok()) << before.status().message();
  for (const auto& p : *before)
    EXPECT_NE(p.pid, static_cast<unsigned>(getpid())) << "this process listed as another";

  Child child = Child::spawn("hold-context");
  const std::string out = child.read_until("ready");
  bool listed = false;
  if (out.find("ready") != std::string::npos) {
    wait_until(
        [&] {
          Result<std::vector<gpu::GpuProcess>> now = gpu::other_gpu_processes(0);
          if (!now.ok()) return true;
          for (const auto& p : *now) {
            if (p.pid == static_cast<unsigned>(child.pid)) listed = true;
          }
          return listed;
        },
        std::chrono::seconds(10));
  }
  child.wait();  // closing its stdin ends the helper
  ASSERT_NE(out.find("ready"), std::string::npos) << "helper output: " << out;
  // NVML reports PIDs of the host's PID namespace: inside a container with a namespace of its
  // own, nothing matches and this fails; the agent's own listing is then of no use either.
  EXPECT_TRUE(listed) << "the helper's context (pid " << child.pid
                      << ") was not listed; NVML reports the PIDs of the host's namespace";
}

}  // namespace
}  // namespace caracal::accel::test

// The tests, or with CARACAL_GPU_TEST_HELPER=NAME one helper (Child::spawn): what a test must
// run in a process of its own. The helpers are no tests of their own, so a run on a GPU
// machine reports no skip for them.
int main(int argc, char** argv) {
  using namespace caracal::accel::test;
  if (const char* helper = std::getenv(kHelperVariable)) {
    const std::string name = helper;
    if (name == "faulting-kernel") return faulting_kernel_helper();
    if (name == "hold-context") return hold_context_helper();
    std::fprintf(stderr, "%s=%s: no such helper\n", kHelperVariable, helper);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
