// The rdma transport against real kernel RDMA (Soft-RoCE inside tests/vm/rxe-vm.sh's VM; on a
// machine with an RDMA device, wherever RXE_IP names its address).
//
//  - RdmaRegionTest: the SmartNIC side (RemoteRegion<RdmaTransport>) and the accelerator side
//    (RegionView on the exported host memory) in one process, the exporter's events served by
//    a thread: the conformance cases, where the test plays the accelerator step by step.
//  - RdmaPeerProcess: the accelerator in a process of its own (caracal_rdma_peer): the stress
//    echo, and a peer killed mid-stream then started again.
//  - The errors: no listener, no route, wrong rkey, out-of-region operations, bad exports.
//
// Outside the VM, with no RDMA device, every test skips.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/rdma.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "stress_protocol.hpp"
#include "test_support.hpp"

#ifndef CARACAL_RDMA_PEER_PATH
#error "CARACAL_RDMA_PEER_PATH must name the rdma peer executable"
#endif

namespace caracal::mqueue {
namespace {

using test::Message;
using test::numbered_bytes;
using test::pop_message;
using test::push_message;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Two server queues and one client queue; 16 slots of 128 bytes, messages up to 8 slots.
constexpr RegionGeometry kGeometry{2, 1, 128, 16, 8 * 128 - kSlotHeaderBytes};
// Hang guards, not performance bounds: the VM is emulated and slow.
constexpr auto kWait = seconds(30);

std::string rxe_ip() {
  const char* ip = std::getenv("RXE_IP");
  return ip != nullptr && *ip != '\0' ? ip : "192.0.2.1";
}

bool have_rdma_device() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list != nullptr) ibv_free_device_list(list);
  return n > 0;
}

#define SKIP_WITHOUT_RDMA()                                                                  \
  if (!have_rdma_device()) {                                                                 \
    GTEST_SKIP() << "no RDMA device here: these tests run inside tests/vm/rxe-vm.sh (ctest " \
                    "-L rdma)";                                                              \
  }

// An exporter whose connection events a thread services, as an agent's event loop would.
class ServedExporter {
 public:
  ~ServedExporter() { stop(); }

  Status start(const RdmaExportOptions& options, const RdmaMemory& memory) {
    Result<std::unique_ptr<RdmaRegionExporter>> x = RdmaRegionExporter::listen(options, memory);
    if (!x.ok()) return x.status();
    exporter_ = std::move(x).value();
    thread_ = std::thread([this] { serve(); });
    return Status::ok_status();
  }
  void stop() {
    done_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
    exporter_.reset();
  }
  // Set before the thread starts, never changed after: safe to read from the test thread.
  RdmaRegionAddress exported() const { return exporter_->exported(); }
  uint16_t port() const { return exporter_->port(); }
  const std::string& registration() const { return exporter_->registration(); }

  uint32_t connections() const { return connections_.load(std::memory_order_acquire); }
  bool wait_connections(uint32_t n) const {
    const auto deadline = Clock::now() + kWait;
    while (connections() != n) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return true;
  }
  std::string errors() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return errors_;
  }

 private:
  void serve() {
    while (!done_.load(std::memory_order_relaxed)) {
      pollfd p{exporter_->event_fd(), POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      if (Status s = exporter_->poll(); !s.ok()) {
        std::lock_guard<std::mutex> lock(mutex_);
        errors_ += s.message() + "\n";
      }
      // Pairs with the acquire in connections().
      connections_.store(exporter_->connections(), std::memory_order_release);
    }
  }

  std::unique_ptr<RdmaRegionExporter> exporter_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::atomic<uint32_t> connections_{0};
  mutable std::mutex mutex_;
  std::string errors_;
};

RdmaConnectOptions connect_options(uint16_t port, const RdmaRegionAddress& region) {
  RdmaConnectOptions o;
  o.host = rxe_ip();
  o.port = port;
  o.region = region;
  o.timeout = milliseconds(10000);
  return o;
}

// Runs `t` until everything posted so far has completed.
Status drain(RdmaTransport& t) {
  return wait_for(t, t.posted(), kWait);
}

// ---------------------------------------------------------------------------------------------
// One process: the test is the accelerator, step by step.

class RdmaRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_RDMA();
    region_.emplace(kGeometry, 77);
    RdmaExportOptions options;
    options.bind_address = rxe_ip();
    const Status s = exporter_.start(options, RdmaMemory{RdmaMemory::Kind::kHost, region_->base(),
                                                         region_->header().region_bytes});
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_NE(exporter_.port(), 0);
    EXPECT_EQ(exporter_.exported().bytes, region_->header().region_bytes);
  }
  void TearDown() override {
    remote_.reset();
    transport_.reset();
    exporter_.stop();
    EXPECT_EQ(exporter_.errors(), "");
  }

  std::unique_ptr<RdmaTransport> connect(RdmaConnectOptions o) {
    Result<std::unique_ptr<RdmaTransport>> t = RdmaTransport::connect(o);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  void attach(RdmaConnectOptions o) {
    transport_ = connect(o);
    ASSERT_NE(transport_, nullptr);
    Result<RemoteRegion<RdmaTransport>> r =
        RemoteRegion<RdmaTransport>::attach(transport_.get(), kWait);
    ASSERT_TRUE(r.ok()) << r.status().message();
    remote_.emplace(std::move(r).value());
  }
  void attach() { attach(connect_options(exporter_.port(), exporter_.exported())); }

  RegionView view() const { return region_->view(); }
  const RegionHeader& header() const { return region_->header(); }
  uint32_t word(IndexArray a, uint32_t q) const {
    return load_acquire(
        reinterpret_cast<uint32_t*>(region_->base() + index_offset(header(), a, q)));
  }
  void set_word(IndexArray a, uint32_t q, uint32_t v) {
    store_release(reinterpret_cast<uint32_t*>(region_->base() + index_offset(header(), a, q)), v);
  }
  void drain_all() {
    const Status s = drain(*transport_);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  // The SmartNIC reads queue q's new replies: one fetch of all tails, then the slots' reads.
  std::vector<Message> read_replies(uint32_t q) {
    std::vector<Message> out;
    const Status s = wait_for(*transport_, remote_->fetch_tx_tails(), kWait);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_TRUE(remote_->deliver_tx_tails());
    const Status d = drain(*transport_);
    EXPECT_TRUE(d.ok()) << d.message();
    while (std::optional<Message> m = pop_message(remote_->tx(q))) {
      out.push_back(std::move(*m));
    }
    return out;
  }

  std::optional<test::LocalRegion> region_;
  ServedExporter exporter_;
  std::unique_ptr<RdmaTransport> transport_;
  std::optional<RemoteRegion<RdmaTransport>> remote_;
};

TEST_F(RdmaRegionTest, AttachReadsTheHeaderAndControlAreaThroughTheTransport) {
  ASSERT_NO_FATAL_FAILURE(attach());
  EXPECT_EQ(remote_->header().agent_epoch, 77u);
  EXPECT_EQ(std::memcmp(&remote_->header(), &header(), sizeof(RegionHeader)), 0);
  EXPECT_EQ(remote_->queue_count(), 3u);
  EXPECT_EQ(transport_->posted(), 2u) << "one READ of the header, one of the control area";
  EXPECT_EQ(transport_->completed(), 2u);
  EXPECT_TRUE(exporter_.wait_connections(1));
  EXPECT_EQ(exporter_.registration(), "host memory (ibv_reg_mr)");
}

TEST_F(RdmaRegionTest, EntryIsVisibleOnlyOnceWrittenAndPublished) {
  ASSERT_NO_FATAL_FAILURE(attach());
  const std::vector<std::byte> payload = numbered_bytes(100, 3);
  ASSERT_TRUE(push_message(remote_->rx(0), payload, 0xABCD));
  remote_->rx(0).publish();
  // Two requests (entry, tail) are below a post list: nothing has left before progress().
  EXPECT_EQ(transport_->waiting(), 2u);
  EXPECT_EQ(word(IndexArray::kRxTail, 0), 0u);
  ASSERT_NO_FATAL_FAILURE(drain_all());
  EXPECT_EQ(word(IndexArray::kRxTail, 0), 1u);
  RingConsumer rx = view().rx_consumer(0);
  std::optional<Message> m = pop_message(rx);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 0xABCDu);
  EXPECT_EQ(m->payload, payload);
  EXPECT_FALSE(pop_message(rx).has_value());
}

TEST_F(RdmaRegionTest, MultiSlotMessagesAndASkipMarkerAtTheRingEnd) {
  ASSERT_NO_FATAL_FAILURE(attach());
  RemoteRingProducer<RdmaTransport>& nic = remote_->rx(1);
  RingConsumer acc = view().rx_consumer(1);
  const uint32_t four_slots = 4 * kGeometry.slot_bytes - kSlotHeaderBytes;
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(push_message(nic, numbered_bytes(four_slots, i), i));
  }
  nic.publish();
  ASSERT_NO_FATAL_FAILURE(drain_all());
  for (uint32_t i = 0; i < 3; ++i) {
    std::optional<Message> m = pop_message(acc);
    ASSERT_TRUE(m.has_value()) << i;
    EXPECT_EQ(m->token, i);
    EXPECT_EQ(m->payload, numbered_bytes(four_slots, i));
  }
  acc.release();
  acc.publish();
  // Six slots do not fit in the four left before the end: a skip marker fills them, once the
  // READ of the accelerator's head has returned the credits.
  const uint32_t six_slots = 6 * kGeometry.slot_bytes - kSlotHeaderBytes;
  const std::vector<std::byte> big = numbered_bytes(six_slots, 9);
  const auto deadline = Clock::now() + kWait;
  while (!push_message(nic, big, 9)) {
    const Status s = transport_->progress();
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_LT(Clock::now(), deadline) << "credits never came back";
  }
  nic.publish();
  ASSERT_NO_FATAL_FAILURE(drain_all());
  EXPECT_EQ(word(IndexArray::kRxTail, 1), 12u + 4u + 6u);
  SlotHeader skip;
  std::memcpy(&skip,
              region_->base() + rx_ring_offset(header(), 1) + 12 * uint64_t{kGeometry.slot_bytes},
              sizeof(skip));
  EXPECT_NE(skip.flags & kSlotSkip, 0) << "no skip marker at slot 12";
  EXPECT_EQ(skip.slots, 4u);
  std::optional<Message> m = pop_message(acc);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 9u);
  EXPECT_EQ(m->payload, big);
}

// Indexes just short of the 32-bit wrap, traffic across it both ways (requests, replies,
// credits in each direction).
TEST_F(RdmaRegionTest, TrafficAcrossTheIndexWrap) {
  const uint32_t start = UINT32_MAX - 20;
  for (IndexArray a :
       {IndexArray::kRxTail, IndexArray::kRxHead, IndexArray::kTxHead, IndexArray::kTxTail}) {
    set_word(a, 0, start);
  }
  ASSERT_NO_FATAL_FAILURE(attach());
  EXPECT_EQ(remote_->rx(0).tail(), start);
  EXPECT_EQ(remote_->tx(0).head(), start);
  RingConsumer rx = view().rx_consumer(0);
  RingProducer tx = view().tx_producer(0);
  uint32_t sent = 0;
  uint32_t answered = 0;
  uint32_t received = 0;
  for (uint32_t round = 0; round < 40; ++round) {
    for (uint32_t i = 0; i < 3; ++i) {
      const uint32_t length = (sent * 97) % (kGeometry.max_message_bytes + 1);
      if (!push_message(remote_->rx(0), numbered_bytes(length, sent), sent)) break;
      ++sent;
    }
    remote_->rx(0).publish();
    ASSERT_NO_FATAL_FAILURE(drain_all());
    while (std::optional<Message> m = pop_message(rx)) {
      ASSERT_EQ(m->token, answered);
      ASSERT_EQ(m->payload, numbered_bytes(static_cast<uint32_t>(m->payload.size()), answered));
      if (!push_message(tx, m->payload, m->token)) {
        rx.unread();
        break;
      }
      rx.release();
      ++answered;
    }
    tx.publish();
    rx.publish();
    for (Message& m : read_replies(0)) {
      ASSERT_EQ(m.token, received);
      ASSERT_EQ(m.payload, numbered_bytes(static_cast<uint32_t>(m.payload.size()), received));
      ++received;
    }
    remote_->tx(0).release();
    remote_->tx(0).publish();
    ASSERT_NO_FATAL_FAILURE(drain_all());
  }
  EXPECT_GT(received, 30u);
  EXPECT_LT(word(IndexArray::kRxTail, 0), start) << "RX tail did not wrap";
  EXPECT_LT(word(IndexArray::kTxTail, 0), start) << "TX tail did not wrap";
  EXPECT_LT(word(IndexArray::kTxHead, 0), start) << "TX head did not wrap";
}

TEST_F(RdmaRegionTest, TxTailsOfAllQueuesComeInOneRead) {
  ASSERT_NO_FATAL_FAILURE(attach());
  for (uint32_t q = 0; q < 3; ++q) {
    RingProducer tx = view().tx_producer(q);
    ASSERT_TRUE(push_message(tx, numbered_bytes(40 + q, q), 100 + q));
    tx.publish();
  }
  const uint64_t before = transport_->posted();
  const uint64_t ticket = remote_->fetch_tx_tails();
  EXPECT_EQ(ticket, before + 1);
  EXPECT_EQ(transport_->posted(), before + 1) << "one READ for every tail";
  const Status s = wait_for(*transport_, ticket, kWait);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_TRUE(remote_->deliver_tx_tails());
  EXPECT_EQ(transport_->posted(), before + 4) << "then one READ of each queue's new slot";
  ASSERT_NO_FATAL_FAILURE(drain_all());
  for (uint32_t q = 0; q < 3; ++q) {
    std::optional<Message> m = pop_message(remote_->tx(q));
    ASSERT_TRUE(m.has_value()) << "queue " << q;
    EXPECT_EQ(m->token, 100u + q);
    EXPECT_EQ(m->payload, numbered_bytes(40 + q, q));
  }
}

TEST_F(RdmaRegionTest, StopWordReachesTheAccelerator) {
  ASSERT_NO_FATAL_FAILURE(attach());
  EXPECT_FALSE(view().stop_requested());
  remote_->request_stop();
  ASSERT_NO_FATAL_FAILURE(drain_all());
  EXPECT_TRUE(view().stop_requested());
}

// Far more requests than the send queue holds: they wait in the transport, go out as
// completions make room, and all land, in order.
TEST_F(RdmaRegionTest, PostsBeyondTheSendQueueWaitAndAllLand) {
  RdmaConnectOptions o = connect_options(exporter_.port(), exporter_.exported());
  o.send_queue_depth = 4;
  o.signal_every = 3;
  o.post_batch = 2;
  ASSERT_NO_FATAL_FAILURE(attach(o));
  EXPECT_EQ(transport_->send_queue_depth(), 4u);
  const uint64_t first = rx_ring_offset(header(), 0);
  const uint32_t count =
      static_cast<uint32_t>(std::min<uint64_t>(300, (header().region_bytes - first) / 32));
  ASSERT_GT(count, 100u);
  size_t most_waiting = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const std::vector<std::byte> bytes = numbered_bytes(32, i);
    std::memcpy(transport_->staging(first + i * 32ull), bytes.data(), 32);
    transport_->post_write(first + i * 32ull, 32);
    most_waiting = std::max(most_waiting, transport_->waiting());
  }
  EXPECT_GT(most_waiting, 100u) << "the send queue should have been full";
  // The index after the data: it lands last.
  transport_->publish_index(index_offset(header(), IndexArray::kRxTail, 2), 1234);
  ASSERT_NO_FATAL_FAILURE(drain_all());
  EXPECT_EQ(transport_->completed(), transport_->posted());
  EXPECT_EQ(transport_->waiting(), 0u);
  for (uint32_t i = 0; i < count; ++i) {
    ASSERT_EQ(std::memcmp(region_->base() + first + i * 32ull, numbered_bytes(32, i).data(), 32), 0)
        << "write " << i;
  }
  EXPECT_EQ(word(IndexArray::kRxTail, 2), 1234u);
}

TEST_F(RdmaRegionTest, IndexPublishesCarryTheirOwnValues) {
  ASSERT_NO_FATAL_FAILURE(attach());
  const uint64_t at = index_offset(header(), IndexArray::kRxTail, 0);
  // Many publishes of one word queued at once: each carries the value it was posted with, and
  // the last one wins.
  for (uint32_t v = 1; v <= 200; ++v) {
    transport_->publish_index(at, v);
  }
  ASSERT_NO_FATAL_FAILURE(drain_all());
  EXPECT_EQ(word(IndexArray::kRxTail, 0), 200u);
  EXPECT_EQ(transport_->load_index(at), 200u);
}

TEST_F(RdmaRegionTest, OperationOutsideTheRegionFailsTheTransport) {
  ASSERT_NO_FATAL_FAILURE(attach());
  const uint64_t bytes = transport_->region_bytes();
  transport_->post_write(bytes - 8, 64);
  const Status s = transport_->progress();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("RDMA WRITE of 64 bytes at region offset"));
  EXPECT_THAT(s.message(), HasSubstr("outside the region"));
  // Sticky: later calls say the same, and nothing more completes.
  const uint64_t done = transport_->completed();
  const uint64_t later = transport_->post_read(0, 64);
  EXPECT_EQ(transport_->progress().message(), s.message());
  EXPECT_LT(transport_->completed(), later);
  EXPECT_EQ(transport_->completed(), done);
  EXPECT_TRUE(transport_->failed());
}

TEST_F(RdmaRegionTest, WrongRkeyIsACompletionErrorThatNamesTheOperation) {
  RdmaRegionAddress wrong = exporter_.exported();
  wrong.rkey ^= 0x5A5A00u;
  transport_ = connect(connect_options(exporter_.port(), wrong));
  ASSERT_NE(transport_, nullptr);
  Result<RemoteRegion<RdmaTransport>> r =
      RemoteRegion<RdmaTransport>::attach(transport_.get(), kWait);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  std::printf("[ error    ] %s\n", m.c_str());
  EXPECT_THAT(m, HasSubstr("RDMA READ of"));
  EXPECT_THAT(m, HasSubstr("region offset 0"));
  EXPECT_THAT(m, HasSubstr("qp "));
  EXPECT_THAT(m, HasSubstr("wc status"));
  EXPECT_THAT(m, AnyOf(HasSubstr("remote access error"), HasSubstr("remote invalid request")));
  EXPECT_TRUE(transport_->failed());
}

TEST_F(RdmaRegionTest, WriteBeyondTheRegisteredRegionIsACompletionError) {
  RdmaRegionAddress larger = exporter_.exported();
  larger.bytes += 4096;  // a SmartNIC told a wrong size
  ASSERT_NO_FATAL_FAILURE(attach(connect_options(exporter_.port(), larger)));
  transport_->post_write(exporter_.exported().bytes, 64);
  const Status s = drain(*transport_);
  ASSERT_FALSE(s.ok());
  std::printf("[ error    ] %s\n", s.message().c_str());
  EXPECT_THAT(s.message(), HasSubstr("RDMA WRITE of 64 bytes"));
  EXPECT_THAT(s.message(), AnyOf(HasSubstr("remote access error"), HasSubstr("remote invalid")));
}

TEST_F(RdmaRegionTest, SeveralConnectionsAndAReconnect) {
  ASSERT_NO_FATAL_FAILURE(attach());
  std::unique_ptr<RdmaTransport> second =
      connect(connect_options(exporter_.port(), exporter_.exported()));
  ASSERT_NE(second, nullptr);
  EXPECT_NE(second->qp_num(), transport_->qp_num());
  EXPECT_TRUE(exporter_.wait_connections(2));
  {
    Result<RemoteRegion<RdmaTransport>> r =
        RemoteRegion<RdmaTransport>::attach(second.get(), kWait);
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  // The first SmartNIC goes away: the exporter cleans up its queue pair.
  remote_.reset();
  transport_.reset();
  EXPECT_TRUE(exporter_.wait_connections(1));
  // And comes back.
  ASSERT_NO_FATAL_FAILURE(attach());
  EXPECT_TRUE(exporter_.wait_connections(2));
  ASSERT_TRUE(push_message(remote_->rx(0), numbered_bytes(10, 1), 5));
  remote_->rx(0).publish();
  ASSERT_NO_FATAL_FAILURE(drain_all());
  EXPECT_EQ(word(IndexArray::kRxTail, 0), 1u);
  second.reset();
  EXPECT_TRUE(exporter_.wait_connections(1));
}

TEST_F(RdmaRegionTest, ExporterGoingAwayFailsTheTransport) {
  ASSERT_NO_FATAL_FAILURE(attach());
  const uint16_t port = exporter_.port();
  exporter_.stop();  // the agent disconnects and deregisters the region
  const auto deadline = Clock::now() + kWait;
  Status s;
  while (s.ok() && Clock::now() < deadline) {
    transport_->post_read(0, 64);  // keeps traffic going, as a polling SmartNIC does
    s = transport_->progress();
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_FALSE(s.ok()) << "no failure in " << kWait.count() << " s";
  std::printf("[ error    ] %s\n", s.message().c_str());
  EXPECT_THAT(s.message(), HasSubstr(rxe_ip() + ":" + std::to_string(port)));
}

// ---------------------------------------------------------------------------------------------
// Setup errors

TEST(RdmaSetupErrors, ConnectToAPortNobodyListensOn) {
  SKIP_WITHOUT_RDMA();
  RdmaConnectOptions o = connect_options(1, RdmaRegionAddress{0x1000, 1, 4096});
  o.timeout = milliseconds(10000);
  Result<std::unique_ptr<RdmaTransport>> t = RdmaTransport::connect(o);
  ASSERT_FALSE(t.ok());
  std::printf("[ error    ] %s\n", t.status().message().c_str());
  EXPECT_THAT(t.status().message(), HasSubstr(rxe_ip() + ":1"));
  EXPECT_THAT(t.status().message(), HasSubstr("nobody listens on that port"));
}

TEST(RdmaSetupErrors, ConnectToAnAddressNoRdmaDeviceReaches) {
  SKIP_WITHOUT_RDMA();
  RdmaConnectOptions o = connect_options(7471, RdmaRegionAddress{0x1000, 1, 4096});
  o.host = "198.51.100.7";  // TEST-NET-2: no route
  o.timeout = milliseconds(3000);
  Result<std::unique_ptr<RdmaTransport>> t = RdmaTransport::connect(o);
  ASSERT_FALSE(t.ok());
  std::printf("[ error    ] %s\n", t.status().message().c_str());
  EXPECT_THAT(t.status().message(), HasSubstr("198.51.100.7:7471"));
}

TEST(RdmaSetupErrors, BadConnectOptions) {
  RdmaConnectOptions o = connect_options(7471, RdmaRegionAddress{0x1000, 1, 0});
  Result<std::unique_ptr<RdmaTransport>> t = RdmaTransport::connect(o);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("region of 0 bytes"));
  o.region.bytes = 4096;
  o.send_queue_depth = 1;
  t = RdmaTransport::connect(o);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("send_queue_depth 1"));
  o.send_queue_depth = 64;
  o.ack_timeout = 32;
  t = RdmaTransport::connect(o);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("ack_timeout 32 (0-31)"));
}

TEST(RdmaSetupErrors, ExportOfABadRegion) {
  SKIP_WITHOUT_RDMA();
  RdmaExportOptions options;
  options.bind_address = rxe_ip();
  Result<std::unique_ptr<RdmaRegionExporter>> x =
      RdmaRegionExporter::listen(options, RdmaMemory{RdmaMemory::Kind::kHost, nullptr, 4096});
  ASSERT_FALSE(x.ok());
  EXPECT_THAT(x.status().message(), HasSubstr("region address is null"));
  // An address nothing is mapped at.
  auto* unmapped = reinterpret_cast<std::byte*>(uintptr_t{0x10000});
  x = RdmaRegionExporter::listen(options, RdmaMemory{RdmaMemory::Kind::kHost, unmapped, 4096});
  ASSERT_FALSE(x.ok());
  std::printf("[ error    ] %s\n", x.status().message().c_str());
  EXPECT_THAT(x.status().message(), HasSubstr("cannot register host memory: region at 0x10000"));
  EXPECT_THAT(x.status().message(), HasSubstr("on rxe0"));
}

TEST(RdmaSetupErrors, ExportOnAnAddressThatIsNotAnRdmaDevice) {
  SKIP_WITHOUT_RDMA();
  std::vector<std::byte> memory(4096);
  RdmaExportOptions options;
  options.bind_address = "198.51.100.7";
  Result<std::unique_ptr<RdmaRegionExporter>> x = RdmaRegionExporter::listen(
      options, RdmaMemory{RdmaMemory::Kind::kHost, memory.data(), memory.size()});
  ASSERT_FALSE(x.ok());
  std::printf("[ error    ] %s\n", x.status().message().c_str());
  EXPECT_THAT(x.status().message(), HasSubstr("198.51.100.7"));
  EXPECT_THAT(x.status().message(), HasSubstr("rdma_bind_addr"));
}

TEST(RdmaSetupErrors, RegionLargerThanTheDevicesLargestMemoryRegion) {
  SKIP_WITHOUT_RDMA();
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_device_attr attr{};
  ASSERT_EQ(ibv_query_device(ctx, &attr), 0);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  if (attr.max_mr_size == UINT64_MAX) {
    GTEST_SKIP() << "the device has no largest memory region (max_mr_size is 2^64-1)";
  }
  std::vector<std::byte> memory(4096);
  RdmaExportOptions options;
  options.bind_address = rxe_ip();
  Result<std::unique_ptr<RdmaRegionExporter>> x = RdmaRegionExporter::listen(
      options, RdmaMemory{RdmaMemory::Kind::kHost, memory.data(), attr.max_mr_size + 1});
  ASSERT_FALSE(x.ok());
  EXPECT_THAT(x.status().message(), HasSubstr("exceeds the device's largest memory region"));
}

// ---------------------------------------------------------------------------------------------
// Two processes: caracal_rdma_peer is the accelerator.

// A peer process whose stdout comes through a pipe; killed and reaped if the test leaves early.
class Peer {
 public:
  Peer() = default;
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  ~Peer() {
    kill_now();
    if (out_ >= 0) close(out_);
  }

  // Starts the peer on `port` (0: any) and waits for its READY line.
  std::string start(uint16_t port, uint64_t timeout_s, const std::vector<uint64_t>& expected) {
    kill_now();
    if (out_ >= 0) close(out_);
    out_ = -1;
    std::vector<std::string> args{CARACAL_RDMA_PEER_PATH, rxe_ip(), std::to_string(port),
                                  std::to_string(timeout_s)};
    for (uint64_t n : expected) {
      args.push_back(std::to_string(n));
    }
    std::vector<char*> argv;
    for (std::string& a : args) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) return std::string("pipe: ") + std::strerror(errno);
    const pid_t pid = fork();
    if (pid < 0) return std::string("fork: ") + std::strerror(errno);
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      close(fds[0]);
      close(fds[1]);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
    pid_ = pid;
    exited_ = false;
    std::string line;
    const auto deadline = Clock::now() + kWait;
    while (line.empty() || line.back() != '\n') {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 100) > 0) {
        char c;
        if (read(out_, &c, 1) != 1) return "the peer exited before it was ready";
        line += c;
      } else if (Clock::now() > deadline) {
        return "the peer was not ready in time";
      }
    }
    std::istringstream in(line);
    std::string ready;
    unsigned port_read = 0;
    in >> ready >> port_read >> address_.address >> address_.rkey >> address_.bytes;
    if (ready != "READY" || !in) return "unexpected line from the peer: " + line;
    port_ = static_cast<uint16_t>(port_read);
    return {};
  }

  bool running() {
    if (pid_ <= 0 || exited_) return false;
    if (waitpid(pid_, &status_, WNOHANG) == pid_) exited_ = true;
    return !exited_;
  }
  void kill_now() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
      exited_ = true;
    }
  }
  pid_t pid() const { return pid_; }
  // Waits for the peer to exit; kills it after `timeout`. Its exit code, or -1.
  int wait(std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (running() && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    if (running()) {
      kill_now();
      return -1;
    }
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
  }
  uint16_t port() const { return port_; }
  const RdmaRegionAddress& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int status_ = 0;
  bool exited_ = true;
  uint16_t port_ = 0;
  RdmaRegionAddress address_{};
};

uint64_t stress_messages() {
  return test::env_u64("CARACAL_RDMA_STRESS_MESSAGES", 20000);
}

// The SmartNIC side of a stress run against a started peer; "" or the first error.
std::string run_stress(Peer& peer, const std::vector<uint64_t>& expected, double* seconds_out) {
  Result<std::unique_ptr<RdmaTransport>> t =
      RdmaTransport::connect(connect_options(peer.port(), peer.address()));
  if (!t.ok()) return t.status().message();
  Result<RemoteRegion<RdmaTransport>> remote = RemoteRegion<RdmaTransport>::attach(t->get(), kWait);
  if (!remote.ok()) return remote.status().message();
  const auto started = Clock::now();
  const std::string error = stress::run_smartnic(*remote, expected, started + seconds(240),
                                                 [&] { return peer.running(); });
  if (seconds_out != nullptr)
    *seconds_out = std::chrono::duration<double>(Clock::now() - started).count();
  if (!error.empty()) return error;
  // Every reply is read: the stop word tells the peer it may go (it lingers until then, since
  // the replies live in its memory).
  if (Status s = wait_for(**t, remote->request_stop(), kWait); !s.ok()) {
    return "smartnic: stop word: " + s.message();
  }
  return {};
}

TEST(RdmaPeerProcess, StressEchoEveryReplyCheckedInOrder) {
  SKIP_WITHOUT_RDMA();
  const uint64_t messages = stress_messages();
  const std::vector<uint64_t> expected = stress::split_messages(messages, 4);
  Peer peer;
  ASSERT_EQ(peer.start(0, 240, expected), "");
  double seconds_taken = 0;
  EXPECT_EQ(run_stress(peer, expected, &seconds_taken), "");
  EXPECT_EQ(peer.wait(seconds(30)), 0) << "the peer's stderr above says why";
  std::printf(
      "[ stress   ] %llu messages over 4 queues through rdma with a peer process in %.2f s\n",
      static_cast<unsigned long long>(messages), seconds_taken);
}

TEST(RdmaPeerProcess, PeerKilledMidStreamFailsTheTransportThenAReconnectWorks) {
  SKIP_WITHOUT_RDMA();
  const std::vector<uint64_t> endless(4, uint64_t{1} << 40);
  Peer peer;
  ASSERT_EQ(peer.start(0, 240, endless), "");
  const uint16_t port = peer.port();
  Result<std::unique_ptr<RdmaTransport>> t =
      RdmaTransport::connect(connect_options(port, peer.address()));
  ASSERT_TRUE(t.ok()) << t.status().message();
  Result<RemoteRegion<RdmaTransport>> remote = RemoteRegion<RdmaTransport>::attach(t->get(), kWait);
  ASSERT_TRUE(remote.ok()) << remote.status().message();
  // The peer is killed while traffic flows (after a while; the test checks below that
  // replies had come back by then).
  std::atomic<bool> stop_watch{false};
  std::thread killer([&] {
    const auto at = Clock::now() + milliseconds(3000);
    while (!stop_watch.load() && Clock::now() < at) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    kill(peer.pid(), SIGKILL);
  });
  const auto started = Clock::now();
  const std::string error =
      stress::run_smartnic(*remote, endless, started + seconds(120), [] { return true; });
  stop_watch.store(true);
  killer.join();
  const double took = std::chrono::duration<double>(Clock::now() - started).count();
  std::printf("[ error    ] after %.2f s: %s\n", took, error.c_str());
  EXPECT_THAT(error, HasSubstr("smartnic: transport: rdma transport to " + rxe_ip() + ":" +
                               std::to_string(port)));
  EXPECT_TRUE((*t)->failed());
  uint64_t replies = 0;
  for (uint32_t q = 0; q < remote->queue_count(); ++q) {
    replies += remote->tx(q).head();
  }
  EXPECT_GT(replies, 0u) << "the peer died before any reply: not mid-stream";
  peer.wait(seconds(10));
  remote = Status(StatusCode::kAborted, "released");
  t = Status(StatusCode::kAborted, "released");

  // The agent comes back on the same port with a new region: a new connection works.
  const std::vector<uint64_t> expected = stress::split_messages(2000, 4);
  Peer again;
  std::string start_error = "not started";
  for (int attempt = 0; attempt < 50 && !start_error.empty(); ++attempt) {
    start_error = again.start(port, 240, expected);
    if (!start_error.empty()) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_EQ(start_error, "");
  EXPECT_EQ(again.port(), port);
  EXPECT_EQ(run_stress(again, expected, nullptr), "");
  EXPECT_EQ(again.wait(seconds(30)), 0);
}

}  // namespace
}  // namespace caracal::mqueue
