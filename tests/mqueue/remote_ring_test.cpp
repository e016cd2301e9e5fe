// The SmartNIC-side ring code against a transport that behaves like an RDMA queue pair: a
// staging image apart from the region, posted operations that complete in order only when
// progress() runs them. This checks what the shm transport cannot show: which byte ranges are
// posted, that nothing is used before its read completes, and that index reads are posted only
// when needed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/remote_ring.hpp"
#include "caracal/mqueue/shm.hpp"
#include "test_support.hpp"

namespace caracal::mqueue {
namespace {

using test::LocalRegion;
using test::Message;
using test::numbered_bytes;
using test::pop_message;
using test::push_message;
using ::testing::HasSubstr;

class AsyncTransport {
 public:
  enum class Kind { kWrite, kRead, kIndex };
  struct Op {
    Kind kind;
    uint64_t offset;
    uint32_t length;
    uint32_t value;
  };

  AsyncTransport(std::byte* remote, uint64_t bytes) : remote_(remote), staging_(bytes) {}

  std::byte* staging(uint64_t offset) { return staging_.data() + offset; }
  uint64_t post_write(uint64_t offset, uint32_t length) {
    return post(Op{Kind::kWrite, offset, length, 0});
  }
  uint64_t post_read(uint64_t offset, uint32_t length) {
    return post(Op{Kind::kRead, offset, length, 0});
  }
  uint64_t publish_index(uint64_t offset, uint32_t value) {
    return post(Op{Kind::kIndex, offset, sizeof(uint32_t), value});
  }
  uint32_t load_index(uint64_t offset) {
    uint32_t v;
    std::memcpy(&v, staging_.data() + offset, sizeof(v));
    return v;
  }
  // Runs the oldest posted operation, if any and if not stalled.
  Status progress() {
    if (!stalled_ && !queue_.empty()) {
      run(queue_.front());
      queue_.pop_front();
      ++completed_;
    }
    return Status::ok_status();
  }
  uint64_t completed() const { return completed_; }
  uint64_t region_bytes() const { return staging_.size(); }
  const char* name() const { return "async-test"; }

  // Test hooks.
  void run_all() {
    while (!queue_.empty()) {
      (void)progress();
    }
  }
  size_t pending() const { return queue_.size(); }
  const std::vector<Op>& log() const { return log_; }
  void clear_log() { log_.clear(); }
  size_t count(Kind k) const {
    size_t n = 0;
    for (const Op& op : log_) {
      n += op.kind == k ? 1 : 0;
    }
    return n;
  }
  void set_stalled(bool s) { stalled_ = s; }
  bool out_of_bounds() const { return out_of_bounds_; }

 private:
  uint64_t post(const Op& op) {
    if (op.offset > staging_.size() || op.length > staging_.size() - op.offset) {
      out_of_bounds_ = true;
    }
    queue_.push_back(op);
    log_.push_back(op);
    return ++posted_;
  }
  void run(const Op& op) {
    if (op.offset > staging_.size() || op.length > staging_.size() - op.offset) return;
    switch (op.kind) {
      case Kind::kWrite:
        std::memcpy(remote_ + op.offset, staging_.data() + op.offset, op.length);
        break;
      case Kind::kRead:
        std::memcpy(staging_.data() + op.offset, remote_ + op.offset, op.length);
        break;
      case Kind::kIndex:
        store_release(reinterpret_cast<uint32_t*>(remote_ + op.offset), op.value);
        break;
    }
  }

  std::byte* remote_;
  std::vector<std::byte> staging_;
  std::deque<Op> queue_;
  std::vector<Op> log_;
  uint64_t posted_ = 0;
  uint64_t completed_ = 0;
  bool stalled_ = false;
  bool out_of_bounds_ = false;
};
static_assert(Transport<AsyncTransport>);

using Kind = AsyncTransport::Kind;

// One server and one client queue of 8 slots of 64 bytes; messages up to 4 slots.
constexpr RegionGeometry kGeometry{1, 1, 64, 8, 4 * 64 - kSlotHeaderBytes};

class RemoteRingTest : public ::testing::Test {
 protected:
  RemoteRingTest()
      : region_(kGeometry), transport_(region_.base(), region_.header().region_bytes) {}

  void SetUp() override {
    Result<RemoteRegion<AsyncTransport>> r = RemoteRegion<AsyncTransport>::attach(&transport_);
    ASSERT_TRUE(r.ok()) << r.status().message();
    remote_.emplace(std::move(r).value());
    transport_.clear_log();
  }
  void TearDown() override { EXPECT_FALSE(transport_.out_of_bounds()); }

  const RegionHeader& h() const { return region_.header(); }
  uint32_t word(IndexArray a, uint32_t q) const {
    uint32_t v;
    std::memcpy(&v, region_.base() + index_offset(h(), a, q), sizeof(v));
    return v;
  }

  LocalRegion region_;
  AsyncTransport transport_;
  std::optional<RemoteRegion<AsyncTransport>> remote_;
};

TEST_F(RemoteRingTest, AttachReadTheHeaderAndControlAreaThroughTheTransport) {
  EXPECT_EQ(remote_->header().agent_epoch, region_.header().agent_epoch);
  EXPECT_EQ(remote_->queue_count(), 2u);
}

TEST_F(RemoteRingTest, EntryIsPostedAsHeaderAndPayloadThenTheTail) {
  RemoteRingProducer<AsyncTransport>& rx = remote_->rx(1);
  const std::vector<std::byte> payload = numbered_bytes(100, 1);
  ASSERT_TRUE(rx.push(payload.data(), 100, 0xAB));
  ASSERT_TRUE(push_message(rx, numbered_bytes(0, 0), 0xCD));
  rx.publish();
  rx.publish();  // nothing new: no second index write
  ASSERT_EQ(transport_.log().size(), 3u);
  const AsyncTransport::Op& first = transport_.log()[0];
  EXPECT_EQ(first.kind, Kind::kWrite);
  EXPECT_EQ(first.offset, rx_ring_offset(h(), 1));
  EXPECT_EQ(first.length, kSlotHeaderBytes + 100);  // not the whole two slots
  const AsyncTransport::Op& second = transport_.log()[1];
  EXPECT_EQ(second.kind, Kind::kWrite);
  EXPECT_EQ(second.offset, rx_ring_offset(h(), 1) + 2 * 64);
  EXPECT_EQ(second.length, kSlotHeaderBytes);
  const AsyncTransport::Op& tail = transport_.log()[2];
  EXPECT_EQ(tail.kind, Kind::kIndex);
  EXPECT_EQ(tail.offset, index_offset(h(), IndexArray::kRxTail, 1));
  EXPECT_EQ(tail.value, 3u);

  // Nothing reaches the region before the operations run, and the tail comes last.
  RingConsumer consumer = region_.view().rx_consumer(1);
  EXPECT_FALSE(pop_message(consumer).has_value());
  (void)transport_.progress();
  (void)transport_.progress();
  EXPECT_EQ(word(IndexArray::kRxTail, 1), 0u);
  EXPECT_FALSE(pop_message(consumer).has_value());
  (void)transport_.progress();
  EXPECT_EQ(word(IndexArray::kRxTail, 1), 3u);
  std::optional<Message> m = pop_message(consumer);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, payload);
  EXPECT_EQ(m->token, 0xABu);
  m = pop_message(consumer);
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(m->payload.empty());
  EXPECT_EQ(m->token, 0xCDu);
}

TEST_F(RemoteRingTest, SkipMarkerIsPostedWithItsOwnWrite) {
  RemoteRingProducer<AsyncTransport>& rx = remote_->rx(0);
  for (uint32_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(push_message(rx, {}, i));
  }
  rx.publish();
  transport_.run_all();
  RingConsumer consumer = region_.view().rx_consumer(0);
  for (uint32_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(pop_message(consumer).has_value());
  }
  consumer.release();
  consumer.publish();
  EXPECT_EQ(rx.reserve(150), nullptr);  // posts the read of the head
  transport_.run_all();
  transport_.clear_log();
  ASSERT_TRUE(push_message(rx, numbered_bytes(150, 0), 6));  // 3 slots: skip 6-7, then 0-2
  ASSERT_EQ(transport_.log().size(), 2u);
  EXPECT_EQ(transport_.log()[0].offset, rx_ring_offset(h(), 0) + 6 * 64);
  EXPECT_EQ(transport_.log()[0].length, kSlotHeaderBytes);
  EXPECT_EQ(transport_.log()[1].offset, rx_ring_offset(h(), 0));
  EXPECT_EQ(transport_.log()[1].length, kSlotHeaderBytes + 150);
  EXPECT_EQ(rx.tail(), 11u);
}

TEST(RemoteRingLines, TheLineIsPostedAfterTheEntryAndTheEntryCountBeforeTheTail) {
  RegionGeometry g = kGeometry;
  g.rx_lines = true;
  LocalRegion region(g);
  const RegionHeader& h = region.header();
  AsyncTransport transport(region.base(), h.region_bytes);
  Result<RemoteRegion<AsyncTransport>> remote = RemoteRegion<AsyncTransport>::attach(&transport);
  ASSERT_TRUE(remote.ok()) << remote.status().message();
  transport.clear_log();
  RemoteRingProducer<AsyncTransport>& rx = remote->rx(1);
  ASSERT_TRUE(rx.has_lines());
  ASSERT_TRUE(push_message(rx, numbered_bytes(100, 1), 0xAB));
  rx.publish();
  ASSERT_EQ(transport.log().size(), 4u);
  EXPECT_EQ(transport.log()[0].kind, Kind::kWrite);  // the entry
  EXPECT_EQ(transport.log()[0].offset, rx_ring_offset(h, 1));
  EXPECT_EQ(transport.log()[1].kind, Kind::kWrite);  // its line, whole
  EXPECT_EQ(transport.log()[1].offset, rx_lines_offset(h, 1));
  EXPECT_EQ(transport.log()[1].length, kLineBytes);
  EXPECT_EQ(transport.log()[2].kind, Kind::kIndex);  // the entry count
  EXPECT_EQ(transport.log()[2].offset, index_offset(h, IndexArray::kRxTail, 1) + 4);
  EXPECT_EQ(transport.log()[2].value, 1u);
  EXPECT_EQ(transport.log()[3].kind, Kind::kIndex);  // the tail
  EXPECT_EQ(transport.log()[3].value, 2u);

  // The consumer sees the entry by its line once the line has landed, whatever the tail says.
  RingConsumer consumer = region.view().rx_consumer(1);
  (void)transport.progress();
  EXPECT_FALSE(test::pop_by_line(consumer).has_value());
  (void)transport.progress();
  std::optional<Message> m = test::pop_by_line(consumer);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->payload, numbered_bytes(100, 1));
  EXPECT_EQ(m->token, 0xABu);
}

TEST_F(RemoteRingTest, HeadIsReadOnlyWhenCreditsRunOutAndUsedOnlyOnceRead) {
  RemoteRingProducer<AsyncTransport>& rx = remote_->rx(0);
  for (uint32_t i = 0; i < kGeometry.ring_capacity; ++i) {
    ASSERT_TRUE(push_message(rx, numbered_bytes(20, i), i));
  }
  rx.publish();
  EXPECT_EQ(transport_.count(Kind::kRead), 0u) << "read the head with credits left";

  // Out of credits: one read of the head is posted, and not repeated while it is in flight.
  EXPECT_EQ(rx.reserve(0), nullptr);
  EXPECT_EQ(rx.reserve(0), nullptr);
  ASSERT_EQ(transport_.count(Kind::kRead), 1u);
  EXPECT_EQ(transport_.log().back().offset, index_offset(h(), IndexArray::kRxHead, 0));
  EXPECT_EQ(transport_.log().back().length, sizeof(uint32_t));

  // The read runs before the accelerator frees anything: still no credits; the next attempt
  // posts a new read.
  transport_.run_all();
  EXPECT_EQ(rx.reserve(0), nullptr);
  EXPECT_EQ(rx.reserve(0), nullptr);
  EXPECT_EQ(transport_.count(Kind::kRead), 2u);

  // The accelerator consumes three entries; the in-flight read sees that once it runs.
  RingConsumer consumer = region_.view().rx_consumer(0);
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(pop_message(consumer).has_value());
  }
  consumer.release();
  consumer.publish();
  EXPECT_EQ(rx.reserve(0), nullptr);  // the read has not completed yet
  transport_.run_all();
  EXPECT_NE(rx.reserve(0), nullptr);
  EXPECT_EQ(rx.credits(), 3u);
  EXPECT_EQ(transport_.count(Kind::kRead), 2u);
}

TEST_F(RemoteRingTest, TxEntriesAreUsedOnlyAfterTheirSlotsAreRead) {
  RingProducer tx = region_.view().tx_producer(1);
  ASSERT_TRUE(push_message(tx, numbered_bytes(100, 9), 9));  // 2 slots
  ASSERT_TRUE(push_message(tx, numbered_bytes(5, 10), 10));  // 1 slot
  tx.publish();

  // One read of all TX tails.
  const uint64_t ticket = remote_->fetch_tx_tails();
  ASSERT_EQ(transport_.log().size(), 1u);
  EXPECT_EQ(transport_.log()[0].kind, Kind::kRead);
  EXPECT_EQ(transport_.log()[0].offset, index_offset(h(), IndexArray::kTxTail, 0));
  EXPECT_EQ(transport_.log()[0].length, 2 * kControlLineBytes);
  EXPECT_FALSE(remote_->deliver_tx_tails());
  (void)transport_.progress();
  EXPECT_GE(transport_.completed(), ticket);
  ASSERT_TRUE(remote_->deliver_tx_tails());
  EXPECT_FALSE(remote_->deliver_tx_tails()) << "delivered the same fetch twice";

  // The new slots, and only those, are read; entries wait for that read.
  ASSERT_EQ(transport_.log().size(), 2u);
  EXPECT_EQ(transport_.log()[1].kind, Kind::kRead);
  EXPECT_EQ(transport_.log()[1].offset, tx_ring_offset(h(), 1));
  EXPECT_EQ(transport_.log()[1].length, 3 * 64u);
  EXPECT_EQ(remote_->tx(1).pending_slots(), 3u);
  EXPECT_FALSE(pop_message(remote_->tx(1)).has_value());
  (void)transport_.progress();
  std::optional<Message> m = pop_message(remote_->tx(1));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 9u);
  EXPECT_EQ(m->payload, numbered_bytes(100, 9));
  m = pop_message(remote_->tx(1));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 10u);
  EXPECT_FALSE(pop_message(remote_->tx(1)).has_value());
  EXPECT_FALSE(pop_message(remote_->tx(0)).has_value());

  // The head goes back once per burst.
  remote_->tx(1).release();
  remote_->tx(1).publish();
  remote_->tx(1).publish();
  EXPECT_EQ(transport_.count(Kind::kIndex), 1u);
  transport_.run_all();
  EXPECT_EQ(word(IndexArray::kTxHead, 1), 3u);
}

TEST_F(RemoteRingTest, TxSlotsAcrossTheRingEndAreReadInTwoRanges) {
  RingProducer tx = region_.view().tx_producer(0);
  // Move both sides to position 6.
  for (uint32_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(push_message(tx, {}, i));
  }
  tx.publish();
  remote_->fetch_tx_tails();
  transport_.run_all();
  ASSERT_TRUE(remote_->deliver_tx_tails());
  transport_.run_all();
  for (uint32_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(pop_message(remote_->tx(0)).has_value());
  }
  remote_->tx(0).release();
  remote_->tx(0).publish();
  transport_.run_all();
  transport_.clear_log();

  ASSERT_TRUE(push_message(tx, numbered_bytes(40, 1), 100));  // slot 6
  ASSERT_TRUE(push_message(tx, numbered_bytes(90, 2), 101));  // 2 slots: skip 7, then 0-1
  tx.publish();
  remote_->fetch_tx_tails();
  transport_.run_all();
  ASSERT_TRUE(remote_->deliver_tx_tails());
  ASSERT_EQ(transport_.log().size(), 3u);
  EXPECT_EQ(transport_.log()[1].offset, tx_ring_offset(h(), 0) + 6 * 64);
  EXPECT_EQ(transport_.log()[1].length, 2 * 64u);
  EXPECT_EQ(transport_.log()[2].offset, tx_ring_offset(h(), 0));
  EXPECT_EQ(transport_.log()[2].length, 2 * 64u);
  (void)transport_.progress();  // only the first range
  std::optional<Message> m = pop_message(remote_->tx(0));
  EXPECT_FALSE(m.has_value()) << "used entries before all of their fetch completed";
  (void)transport_.progress();
  m = pop_message(remote_->tx(0));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 100u);
  m = pop_message(remote_->tx(0));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 101u);
  EXPECT_EQ(m->payload, numbered_bytes(90, 2));
}

TEST_F(RemoteRingTest, PerRingTailRefresh) {
  RingProducer tx = region_.view().tx_producer(1);
  ASSERT_TRUE(push_message(tx, numbered_bytes(7, 7), 7));
  tx.publish();
  remote_->tx(1).refresh_tail();  // posts the read; it has not completed: nothing observed
  EXPECT_EQ(remote_->tx(1).pending_slots(), 0u);
  EXPECT_EQ(transport_.count(Kind::kRead), 1u);
  remote_->tx(1).refresh_tail();  // still in flight: no second read
  EXPECT_EQ(transport_.count(Kind::kRead), 1u);
  transport_.run_all();
  remote_->tx(1).refresh_tail();  // folds in the completed read and posts the slots' read
  EXPECT_EQ(remote_->tx(1).pending_slots(), 1u);
  ASSERT_EQ(transport_.count(Kind::kRead), 2u);
  EXPECT_EQ(transport_.log().back().offset, tx_ring_offset(h(), 1));
  transport_.run_all();
  std::optional<Message> m = pop_message(remote_->tx(1));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->token, 7u);
}

TEST_F(RemoteRingTest, BogusTailsFromThePeerAreIgnored) {
  RemoteRingConsumer<AsyncTransport>& tx = remote_->tx(0);
  tx.observe_tail(kGeometry.ring_capacity + 1);  // more than a ring's worth
  EXPECT_EQ(tx.pending_slots(), 0u);
  EXPECT_EQ(transport_.log().size(), 0u) << "read slots for an impossible tail";
  tx.observe_tail(UINT32_MAX);  // behind the head
  EXPECT_EQ(tx.pending_slots(), 0u);

  RingProducer producer = region_.view().tx_producer(0);
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(push_message(producer, {}, i));
  }
  producer.publish();
  tx.observe_tail(3);
  EXPECT_EQ(tx.pending_slots(), 3u);
  tx.observe_tail(2);  // backwards
  EXPECT_EQ(tx.pending_slots(), 3u);
  transport_.run_all();
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(pop_message(tx).has_value());
  }
  EXPECT_FALSE(pop_message(tx).has_value());
}

TEST_F(RemoteRingTest, BogusHeadFromThePeerIsIgnored) {
  RemoteRingProducer<AsyncTransport>& rx = remote_->rx(0);
  for (uint32_t i = 0; i < kGeometry.ring_capacity; ++i) {
    ASSERT_TRUE(push_message(rx, {}, i));
  }
  // A head past the tail would hand out credits for unread slots.
  const uint32_t bogus = 100;
  std::memcpy(region_.base() + index_offset(h(), IndexArray::kRxHead, 0), &bogus, sizeof(bogus));
  EXPECT_EQ(rx.reserve(0), nullptr);
  transport_.run_all();
  EXPECT_EQ(rx.reserve(0), nullptr);
  EXPECT_EQ(rx.credits(), 0u);
}

TEST(RemoteRegionAttach, TimesOutOnATransportThatNeverCompletes) {
  LocalRegion region(kGeometry);
  AsyncTransport transport(region.base(), region.header().region_bytes);
  transport.set_stalled(true);
  Result<RemoteRegion<AsyncTransport>> r =
      RemoteRegion<AsyncTransport>::attach(&transport, std::chrono::milliseconds(20));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("did not complete"));
  EXPECT_THAT(r.status().message(), HasSubstr("async-test"));
}

// Random traffic through the asynchronous transport, in one thread: the SmartNIC side sends
// and checks, the accelerator side echoes, and the transport runs a random number of posted
// operations between steps. Indexes start near the 32-bit wrap.
TEST(RemoteRingTraffic, RandomTrafficWithDelayedCompletions) {
  LocalRegion region(kGeometry);
  const RegionHeader& h = region.header();
  const uint32_t start = UINT32_MAX - 50;
  for (uint32_t q = 0; q < 2; ++q) {
    for (IndexArray a :
         {IndexArray::kRxTail, IndexArray::kRxHead, IndexArray::kTxHead, IndexArray::kTxTail}) {
      std::memcpy(region.base() + index_offset(h, a, q), &start, sizeof(start));
    }
  }
  AsyncTransport transport(region.base(), h.region_bytes);
  Result<RemoteRegion<AsyncTransport>> attached = RemoteRegion<AsyncTransport>::attach(&transport);
  ASSERT_TRUE(attached.ok()) << attached.status().message();
  RemoteRegion<AsyncTransport>& remote = *attached;
  const RegionView view = region.view();
  RingConsumer rx[2] = {view.rx_consumer(0), view.rx_consumer(1)};
  RingProducer tx[2] = {view.tx_producer(0), view.tx_producer(1)};

  std::mt19937 rng(12345);
  const uint32_t kMessages = 3000;
  uint32_t sent[2] = {0, 0};
  uint32_t echoed[2] = {0, 0};
  uint32_t received[2] = {0, 0};
  bool tails_in_flight = false;
  auto length_of = [](uint32_t q, uint32_t seq) {
    return (seq * 2654435761u + q * 97) % (kGeometry.max_message_bytes + 1);
  };
  for (uint32_t step = 0; step < 200000 && received[0] + received[1] < 2 * kMessages; ++step) {
    const uint32_t q = rng() % 2;
    switch (rng() % 4) {
      case 0: {  // SmartNIC sends a burst
        for (uint32_t i = rng() % 4; i > 0 && sent[q] < kMessages; --i) {
          const uint32_t length = length_of(q, sent[q]);
          if (!push_message(remote.rx(q), numbered_bytes(length, sent[q]), sent[q])) break;
          ++sent[q];
        }
        remote.rx(q).publish();
        break;
      }
      case 1: {  // accelerator echoes a burst
        uint32_t n = 0;
        while (std::optional<Message> m = pop_message(rx[q])) {
          ASSERT_EQ(m->token, echoed[q]) << "queue " << q;
          ASSERT_EQ(m->payload, numbered_bytes(length_of(q, echoed[q]), echoed[q]));
          std::reverse(m->payload.begin(), m->payload.end());
          if (!push_message(tx[q], m->payload, m->token)) {
            rx[q].unread();
            break;
          }
          rx[q].release();
          ++echoed[q];
          if (++n == rng() % 5) break;
        }
        tx[q].publish();
        rx[q].publish();
        break;
      }
      case 2: {  // SmartNIC reads replies; one fetch of the tails in flight at a time
        if (!tails_in_flight) {
          remote.fetch_tx_tails();
          tails_in_flight = true;
        }
        if (remote.deliver_tx_tails()) tails_in_flight = false;
        while (std::optional<Message> m = pop_message(remote.tx(q))) {
          ASSERT_EQ(m->token, received[q]) << "queue " << q;
          std::vector<std::byte> expected = numbered_bytes(length_of(q, received[q]), received[q]);
          std::reverse(expected.begin(), expected.end());
          ASSERT_EQ(m->payload, expected);
          ++received[q];
        }
        remote.tx(q).release();
        remote.tx(q).publish();
        break;
      }
      case 3: {  // the transport completes some operations
        for (uint32_t i = rng() % 8; i > 0; --i) {
          (void)transport.progress();
        }
        break;
      }
    }
  }
  EXPECT_EQ(received[0], kMessages);
  EXPECT_EQ(received[1], kMessages);
  EXPECT_FALSE(transport.out_of_bounds());
  // The last deliver may have left the TX tails unobserved; every index crossed zero.
  transport.run_all();
  EXPECT_LT(remote.rx(0).tail(), start);
  EXPECT_LT(remote.tx(1).head(), start);
}

}  // namespace
}  // namespace caracal::mqueue
