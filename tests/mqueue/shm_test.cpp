// The shm transport end to end in one thread: the agent creates a region in a memfd, the
// SmartNIC side maps it a second time and attaches with RemoteRegion<ShmTransport>; requests go
// through RX, replies come back through TX. Also ShmMapping itself (memfd and named objects).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "test_support.hpp"

namespace caracal::mqueue {
namespace {

using test::Message;
using test::numbered_bytes;
using test::pop_message;
using test::push_message;
using ::testing::HasSubstr;

// Two server queues and one client queue; 16 slots of 128 bytes, messages up to 8 slots.
constexpr RegionGeometry kGeometry{2, 1, 128, 16, 8 * 128 - kSlotHeaderBytes};

// The agent's mapping and the SmartNIC's, of the same memfd, with the SmartNIC attached.
class ShmRegionTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(create(kGeometry)); }

  void create(const RegionGeometry& g) {
    Result<ShmMapping> agent = create_shm_region(g, 77, "caracal-mqueue-test");
    ASSERT_TRUE(agent.ok()) << agent.status().message();
    agent_ = std::move(agent).value();
    Result<ShmMapping> nic = ShmMapping::open_fd(agent_.fd());
    ASSERT_TRUE(nic.ok()) << nic.status().message();
    nic_ = std::move(nic).value();
    transport_.emplace(nic_.data(), nic_.size());
  }

  void attach() {
    Result<RemoteRegion<ShmTransport>> r = RemoteRegion<ShmTransport>::attach(&*transport_);
    ASSERT_TRUE(r.ok()) << r.status().message();
    remote_.emplace(std::move(r).value());
  }

  RegionView view() const { return RegionView(agent_.data()); }
  const RegionHeader& header() const {
    return *reinterpret_cast<const RegionHeader*>(agent_.data());
  }
  uint32_t word(IndexArray a, uint32_t q) const {
    return load_acquire(reinterpret_cast<uint32_t*>(agent_.data() + index_offset(header(), a, q)));
  }
  void set_word(IndexArray a, uint32_t q, uint32_t v) {
    store_release(reinterpret_cast<uint32_t*>(agent_.data() + index_offset(header(), a, q)), v);
  }

  // The SmartNIC reads every TX ring's new entries: one fetch of all tails, then next().
  std::vector<Message> read_replies(uint32_t q) {
    remote_->fetch_tx_tails();
    EXPECT_TRUE(remote_->deliver_tx_tails());
    std::vector<Message> out;
    while (std::optional<Message> m = pop_message(remote_->tx(q))) {
      out.push_back(std::move(*m));
    }
    return out;
  }

  ShmMapping agent_;
  ShmMapping nic_;
  std::optional<ShmTransport> transport_;
  std::optional<RemoteRegion<ShmTransport>> remote_;
};

TEST_F(ShmRegionTest, CreatedRegionIsInitialisedAndMappedTwice) {
  const RegionHeader expected = compute_layout(kGeometry, 77);
  EXPECT_EQ(std::memcmp(agent_.data(), &expected, sizeof(expected)), 0);
  EXPECT_EQ(agent_.size(), expected.region_bytes);
  EXPECT_EQ(nic_.size(), expected.region_bytes);
  EXPECT_NE(agent_.data(), nic_.data());
  EXPECT_NE(agent_.fd(), nic_.fd());
  EXPECT_TRUE(agent_.name().empty());
  // One memory: a write through one mapping shows through the other.
  agent_.data()[expected.region_bytes - 1] = std::byte{0x5A};
  EXPECT_EQ(nic_.data()[expected.region_bytes - 1], std::byte{0x5A});
  for (uint32_t q = 0; q < 3; ++q) {
    for (IndexArray a :
         {IndexArray::kRxTail, IndexArray::kRxHead, IndexArray::kTxHead, IndexArray::kTxTail}) {
      EXPECT_EQ(word(a, q), 0u);
    }
  }
}

TEST_F(ShmRegionTest, AttachReadsTheHeader) {
  ASSERT_NO_FATAL_FAILURE(attach());
  EXPECT_EQ(remote_->header().agent_epoch, 77u);
  EXPECT_EQ(remote_->queue_count(), 3u);
  EXPECT_EQ(remote_->header().slot_bytes, kGeometry.slot_bytes);
  EXPECT_EQ(std::string(remote_->transport().name()), "shm");
}

TEST_F(ShmRegionTest, RequestsAndRepliesOnEveryQueue) {
  ASSERT_NO_FATAL_FAILURE(attach());
  const RegionView v = view();
  // 1 + 1 + 1 + 2 + 3 + 5 = 13 of the ring's 16 slots, each way.
  const uint32_t sizes[] = {0, 1, 112, 113, 300, 500};
  // SmartNIC: a burst of requests on every queue, one publish each.
  for (uint32_t q = 0; q < 3; ++q) {
    for (uint32_t i = 0; i < 6; ++i) {
      ASSERT_TRUE(push_message(remote_->rx(q), numbered_bytes(sizes[i], q * 10 + i),
                               (uint64_t{q} << 32) | i))
          << "queue " << q << " request " << i;
    }
    EXPECT_EQ(word(IndexArray::kRxTail, q), 0u) << "visible before publish";
    remote_->rx(q).publish();
    EXPECT_EQ(word(IndexArray::kRxTail, q), remote_->rx(q).tail());
  }
  // Accelerator: read each request in place and answer it with a transformed payload.
  for (uint32_t q = 0; q < 3; ++q) {
    RingConsumer rx = v.rx_consumer(q);
    RingProducer tx = v.tx_producer(q);
    for (uint32_t i = 0; i < 6; ++i) {
      std::optional<Message> m = pop_message(rx);
      ASSERT_TRUE(m.has_value()) << "queue " << q << " request " << i;
      EXPECT_EQ(m->token, (uint64_t{q} << 32) | i);
      EXPECT_EQ(m->payload, numbered_bytes(sizes[i], q * 10 + i));
      std::vector<std::byte> reply = numbered_bytes(sizes[5 - i], 100 + q * 10 + i);
      ASSERT_TRUE(push_message(tx, reply, m->token, i == 2 ? kSlotError : 0));
    }
    EXPECT_FALSE(pop_message(rx).has_value());
    rx.release();
    tx.publish();
    rx.publish();
    EXPECT_EQ(word(IndexArray::kRxHead, q), word(IndexArray::kRxTail, q));
  }
  // SmartNIC: the replies, in order, with the tokens of their requests.
  for (uint32_t q = 0; q < 3; ++q) {
    std::vector<Message> replies = read_replies(q);
    ASSERT_EQ(replies.size(), 6u) << "queue " << q;
    for (uint32_t i = 0; i < 6; ++i) {
      EXPECT_EQ(replies[i].token, (uint64_t{q} << 32) | i);
      EXPECT_EQ(replies[i].payload, numbered_bytes(sizes[5 - i], 100 + q * 10 + i));
      EXPECT_EQ(replies[i].flags, i == 2 ? kSlotError : 0);
    }
    remote_->tx(q).release();
    remote_->tx(q).publish();
    EXPECT_EQ(word(IndexArray::kTxHead, q), word(IndexArray::kTxTail, q));
    EXPECT_EQ(remote_->tx(q).head(), word(IndexArray::kTxTail, q));
  }
  // Nothing more anywhere.
  for (uint32_t q = 0; q < 3; ++q) {
    EXPECT_TRUE(read_replies(q).empty());
  }
}

TEST_F(ShmRegionTest, ReplyIsInvisibleUntilTheAcceleratorPublishes) {
  ASSERT_NO_FATAL_FAILURE(attach());
  RingProducer tx = view().tx_producer(0);
  ASSERT_TRUE(push_message(tx, numbered_bytes(40, 1), 1));
  EXPECT_TRUE(read_replies(0).empty());
  tx.publish();
  std::vector<Message> replies = read_replies(0);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].token, 1u);
}

TEST_F(ShmRegionTest, RxCreditsComeBackWhenTheAcceleratorPublishesItsHead) {
  ASSERT_NO_FATAL_FAILURE(attach());
  RemoteRingProducer<ShmTransport>& rx = remote_->rx(1);
  uint32_t pushed = 0;
  while (push_message(rx, numbered_bytes(10, pushed), pushed)) {
    ++pushed;
    ASSERT_LE(pushed, kGeometry.ring_capacity) << "pushed more than the ring holds";
  }
  EXPECT_EQ(pushed, kGeometry.ring_capacity);  // one slot each: every slot used
  EXPECT_EQ(rx.credits(), 0u);
  EXPECT_EQ(rx.outstanding_slots(), kGeometry.ring_capacity);
  EXPECT_EQ(rx.reserve(0), nullptr);
  rx.publish();

  RingConsumer consumer = view().rx_consumer(1);
  // Half read and released but not published: no credits.
  for (uint32_t i = 0; i < pushed / 2; ++i) {
    ASSERT_TRUE(pop_message(consumer).has_value());
  }
  consumer.release();
  rx.refresh_credits();
  EXPECT_EQ(rx.credits(), 0u);
  consumer.publish();
  rx.refresh_credits();
  EXPECT_EQ(rx.credits(), pushed / 2);
  EXPECT_EQ(rx.outstanding_slots(), pushed / 2);

  // The rest; the producer picks the credits up by itself when it runs out.
  for (uint32_t i = pushed / 2; i < pushed; ++i) {
    std::optional<Message> m = pop_message(consumer);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->token, i);
  }
  consumer.release();
  consumer.publish();
  for (uint32_t i = 0; i < pushed / 2; ++i) {
    ASSERT_TRUE(push_message(rx, {}, i));
  }
  EXPECT_EQ(rx.credits(), 0u);
  EXPECT_TRUE(push_message(rx, {}, 0));  // reserve polls the head and finds pushed / 2 more
  EXPECT_EQ(rx.credits(), pushed / 2 - 1);
}

TEST_F(ShmRegionTest, TxCreditsComeBackWhenTheSmartNicPublishesItsHead) {
  ASSERT_NO_FATAL_FAILURE(attach());
  RingProducer tx = view().tx_producer(2);
  uint32_t pushed = 0;
  while (push_message(tx, numbered_bytes(200, pushed), pushed)) {  // two slots each
    ++pushed;
    ASSERT_LE(pushed, kGeometry.ring_capacity);
  }
  EXPECT_EQ(pushed, kGeometry.ring_capacity / 2);
  tx.publish();
  std::vector<Message> replies = read_replies(2);
  ASSERT_EQ(replies.size(), pushed);
  EXPECT_EQ(tx.reserve(0), nullptr);  // read, but the head is not yet published
  remote_->tx(2).release();
  EXPECT_EQ(tx.reserve(0), nullptr);
  remote_->tx(2).publish();
  EXPECT_NE(tx.reserve(0), nullptr);
  EXPECT_EQ(tx.credits(), kGeometry.ring_capacity);
}

// The SmartNIC takes over rings at whatever indexes it finds, including just short of the
// 32-bit wrap, and traffic runs across it in both directions.
TEST_F(ShmRegionTest, AttachTakesOverIndexesNearTheWrap) {
  const uint32_t start = UINT32_MAX - 20;
  for (IndexArray a :
       {IndexArray::kRxTail, IndexArray::kRxHead, IndexArray::kTxHead, IndexArray::kTxTail}) {
    set_word(a, 0, start);
  }
  ASSERT_NO_FATAL_FAILURE(attach());
  EXPECT_EQ(remote_->rx(0).tail(), start);
  EXPECT_EQ(remote_->rx(0).credits(), kGeometry.ring_capacity);
  EXPECT_EQ(remote_->tx(0).head(), start);
  RingConsumer rx = view().rx_consumer(0);
  RingProducer tx = view().tx_producer(0);
  uint64_t sent = 0;
  uint64_t answered = 0;
  uint64_t received = 0;
  for (uint32_t round = 0; round < 40; ++round) {
    for (uint32_t i = 0; i < 3; ++i) {
      const uint32_t length = (sent * 97) % (kGeometry.max_message_bytes + 1);
      if (!push_message(remote_->rx(0), numbered_bytes(length, sent), sent)) break;
      ++sent;
    }
    remote_->rx(0).publish();
    while (std::optional<Message> m = pop_message(rx)) {
      ASSERT_EQ(m->token, answered);
      ASSERT_EQ(m->payload, numbered_bytes(m->payload.size(), answered));
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
      ASSERT_EQ(m.payload, numbered_bytes(m.payload.size(), received));
      ++received;
    }
    remote_->tx(0).release();
    remote_->tx(0).publish();
  }
  EXPECT_GT(received, 40u);
  EXPECT_LT(word(IndexArray::kRxTail, 0), start) << "RX tail did not wrap";
  EXPECT_LT(word(IndexArray::kTxTail, 0), start) << "TX tail did not wrap";
}

TEST_F(ShmRegionTest, StopWordReachesTheAccelerator) {
  ASSERT_NO_FATAL_FAILURE(attach());
  EXPECT_FALSE(view().stop_requested());
  remote_->request_stop();
  EXPECT_TRUE(view().stop_requested());
}

TEST_F(ShmRegionTest, RequestLongerThanTheMaximumIsRefused) {
  ASSERT_NO_FATAL_FAILURE(attach());
  RemoteRingProducer<ShmTransport>& rx = remote_->rx(0);
  EXPECT_EQ(rx.reserve(kGeometry.max_message_bytes + 1), nullptr);
  std::vector<std::byte> big(kGeometry.max_message_bytes + 1);
  EXPECT_FALSE(rx.push(big.data(), static_cast<uint32_t>(big.size()), 1));
  EXPECT_EQ(rx.tail(), 0u);
  EXPECT_EQ(rx.credits(), kGeometry.ring_capacity);  // and it did not cost a credit read
  EXPECT_FALSE(rx.commit(0, 0));
}

// attach() refuses a header that fails validation, naming the field.
struct AttachCase {
  const char* name;
  void (*corrupt)(RegionHeader&);
  const char* field;
};

void PrintTo(const AttachCase& c, std::ostream* os) {
  *os << c.name;
}

class AttachRefusalTest : public ShmRegionTest, public ::testing::WithParamInterface<AttachCase> {};

const AttachCase kAttachCases[] = {
    {"Magic", [](RegionHeader& h) { h.magic = 0; }, "'magic'"},
    {"LayoutVersion", [](RegionHeader& h) { h.layout_version = 99; }, "'layout_version'"},
    {"SlotBytes", [](RegionHeader& h) { h.slot_bytes = 100; }, "'slot_bytes'"},
    {"RingCapacity", [](RegionHeader& h) { h.ring_capacity = 3; }, "'ring_capacity'"},
    {"RegionBytes", [](RegionHeader& h) { h.region_bytes *= 2; }, "'region_bytes'"},
    {"ControlOffset", [](RegionHeader& h) { h.control_offset = 100; }, "'control_offset'"},
    {"RingStride", [](RegionHeader& h) { h.ring_stride = 64; }, "'ring_stride'"},
};

INSTANTIATE_TEST_SUITE_P(BadHeaders, AttachRefusalTest, ::testing::ValuesIn(kAttachCases),
                         [](const ::testing::TestParamInfo<AttachCase>& info) {
                           return info.param.name;
                         });

TEST_P(AttachRefusalTest, NamesTheField) {
  RegionHeader* h = reinterpret_cast<RegionHeader*>(agent_.data());
  GetParam().corrupt(*h);
  Result<RemoteRegion<ShmTransport>> r = RemoteRegion<ShmTransport>::attach(&*transport_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr(GetParam().field));
}

TEST_F(ShmRegionTest, AttachRefusesARegionSmallerThanItsHeaderSays) {
  ShmTransport short_transport(nic_.data(), nic_.size() - kPageBytes);
  Result<RemoteRegion<ShmTransport>> r = RemoteRegion<ShmTransport>::attach(&short_transport);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'region_bytes'"));
}

TEST_F(ShmRegionTest, AttachRefusesAMappingSmallerThanAPage) {
  ShmTransport tiny(nic_.data(), kPageBytes - 1);
  Result<RemoteRegion<ShmTransport>> r = RemoteRegion<ShmTransport>::attach(&tiny);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("smaller than a header page"));
}

TEST(CreateShmRegion, RefusesABadGeometry) {
  Result<ShmMapping> m = create_shm_region(RegionGeometry{1, 0, 100, 16, 48}, 1, "bad");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("'slot_bytes'"));
}

// --- ShmMapping ------------------------------------------------------------------------------

bool shm_name_exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(ShmMapping, NamedRoundTripAndCleanup) {
  const std::string name = test::unique_shm_name("named");
  {
    Result<ShmMapping> owner = ShmMapping::create_named(name, 3 * kPageBytes);
    ASSERT_TRUE(owner.ok()) << owner.status().message();
    EXPECT_EQ(owner->name(), name);
    EXPECT_EQ(owner->size(), 3u * kPageBytes);
    EXPECT_TRUE(shm_name_exists(name));
    // Zero-filled.
    for (uint64_t i = 0; i < owner->size(); i += 512) {
      ASSERT_EQ(owner->data()[i], std::byte{0});
    }

    // Creating it again fails: the name is taken.
    Result<ShmMapping> again = ShmMapping::create_named(name, kPageBytes);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), StatusCode::kIoError);
    EXPECT_THAT(again.status().message(), HasSubstr(name));
    EXPECT_TRUE(shm_name_exists(name)) << "a failed create removed the owner's object";

    {
      Result<ShmMapping> peer = ShmMapping::open_named(name);
      ASSERT_TRUE(peer.ok()) << peer.status().message();
      EXPECT_EQ(peer->size(), 3u * kPageBytes);
      EXPECT_EQ(peer->name(), name);
      EXPECT_NE(peer->data(), owner->data());
      std::memcpy(owner->data() + 100, "both ways", 9);
      EXPECT_EQ(std::memcmp(peer->data() + 100, "both ways", 9), 0);
      std::memcpy(peer->data() + 2 * kPageBytes, "back", 4);
      EXPECT_EQ(std::memcmp(owner->data() + 2 * kPageBytes, "back", 4), 0);
    }
    // Closing an opener leaves the name in place.
    EXPECT_TRUE(shm_name_exists(name));
    Result<ShmMapping> reopened = ShmMapping::open_named(name);
    ASSERT_TRUE(reopened.ok()) << reopened.status().message();
    EXPECT_EQ(std::memcmp(reopened->data() + 100, "both ways", 9), 0);
  }
  // The creator unlinks it.
  EXPECT_FALSE(shm_name_exists(name));
  Result<ShmMapping> gone = ShmMapping::open_named(name);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kIoError);
  EXPECT_THAT(gone.status().message(), HasSubstr(name));
}

TEST(ShmMapping, MovedMappingOwnsTheNameOnce) {
  const std::string name = test::unique_shm_name("move");
  {
    Result<ShmMapping> created = ShmMapping::create_named(name, kPageBytes);
    ASSERT_TRUE(created.ok()) << created.status().message();
    ShmMapping a = std::move(created).value();
    std::byte* data = a.data();
    ShmMapping b(std::move(a));
    // The moved-from state is part of the contract: empty, owning nothing.
    EXPECT_EQ(a.data(), nullptr);  // NOLINT(clang-analyzer-cplusplus.Move)
    EXPECT_EQ(a.fd(), -1);         // NOLINT(clang-analyzer-cplusplus.Move)
    EXPECT_EQ(b.data(), data);
    ShmMapping c;
    c = std::move(b);
    EXPECT_EQ(b.data(), nullptr);  // NOLINT(clang-analyzer-cplusplus.Move)
    EXPECT_EQ(c.data(), data);
    EXPECT_TRUE(shm_name_exists(name));
    c.data()[0] = std::byte{1};  // still mapped
    // Destroying the moved-from objects must not unlink the name.
    { ShmMapping drop = std::move(a); }
    EXPECT_TRUE(shm_name_exists(name));
  }
  EXPECT_FALSE(shm_name_exists(name));
}

TEST(ShmMapping, MemfdSharesThroughOpenFd) {
  Result<ShmMapping> a = ShmMapping::create_memfd("caracal-test-memfd", 2 * kPageBytes);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->name().empty());
  EXPECT_GE(a->fd(), 0);
  EXPECT_EQ(fcntl(a->fd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC) << "memfd leaks into exec'd children";
  Result<ShmMapping> b = ShmMapping::open_fd(a->fd());
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->size(), 2u * kPageBytes);
  a->data()[kPageBytes + 7] = std::byte{0x42};
  EXPECT_EQ(b->data()[kPageBytes + 7], std::byte{0x42});
  // open_fd duplicated the descriptor: the copy outlives the original's owner.
  const int b_fd = b->fd();
  EXPECT_NE(b_fd, a->fd());
  a = Result<ShmMapping>(ShmMapping());
  EXPECT_EQ(b->data()[kPageBytes + 7], std::byte{0x42});
  EXPECT_EQ(fcntl(b_fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

TEST(ShmMapping, ErrorsSayWhatFailed) {
  Result<ShmMapping> bad_fd = ShmMapping::open_fd(-1);
  ASSERT_FALSE(bad_fd.ok());
  EXPECT_EQ(bad_fd.status().code(), StatusCode::kIoError);
  EXPECT_THAT(bad_fd.status().message(), HasSubstr("fd -1"));

  Result<ShmMapping> missing = ShmMapping::open_named(test::unique_shm_name("missing"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);

  Result<ShmMapping> empty = ShmMapping::create_memfd("caracal-test-empty", 0);
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("empty"));
}

}  // namespace
}  // namespace caracal::mqueue
