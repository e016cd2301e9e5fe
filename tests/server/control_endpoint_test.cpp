// The control endpoint of a real Server, spoken to over loopback as a hostile or mistaken agent
// would: every refusal answered and counted under its reason, repeated failed hellos from one
// address throttled (other addresses admitted meanwhile, the address admitted again after its
// penalty), and region announcements whose descriptor or header is hostile refused with the
// field named, before the server reads or writes outside the region.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "caracal/config/yaml.hpp"
#include "caracal/control/protocol.hpp"
#include "caracal/mqueue/shm.hpp"
#include "config.hpp"
#include "server.hpp"

namespace caracal::server {
namespace {

using ::testing::HasSubstr;

constexpr const char* kSecret = "0123456789abcdef-right";

ServerConfig make_config(const std::string& control_extra) {
  const std::string text = std::string(R"(io_threads: 2
control: { listen: 127.0.0.1:0, secret: )") +
                           kSecret + control_extra + R"( }
services:
  - name: echo
    max_message_bytes: 64
    listeners: [ { protocol: udp, listen: 127.0.0.1:0 } ]
)";
  return parse_server_config(config::load_yaml_text(text, "t.yaml"));
}

// One control connection from `source` (a loopback address, so that tests can be several
// addresses), blocking, with a deadline on every read.
class Peer {
 public:
  Peer(uint16_t port, const char* source = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    ::inet_pton(AF_INET, source, &local.sin_addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0) << source;
    sockaddr_in server{};
    server.sin_family = AF_INET;
    server.sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.1", &server.sin_addr);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&server), sizeof(server)), 0);
  }
  ~Peer() { ::close(fd_); }

  void send_raw(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  void send(const control::Message& m) { send_raw(control::encode(m)); }

  // The next message, or nullopt when the server closed the connection (or 5 s passed).
  std::optional<control::Message> next() {
    std::string prefix = read_exactly(control::kFramePrefixBytes);
    if (prefix.size() != control::kFramePrefixBytes) return std::nullopt;
    Result<uint32_t> n = control::frame_length(reinterpret_cast<const std::byte*>(prefix.data()));
    if (!n.ok()) return std::nullopt;
    Result<control::Message> m = control::decode(read_exactly(*n), "server");
    EXPECT_TRUE(m.ok()) << m.status().message();
    if (!m.ok()) return std::nullopt;
    return std::move(*m);
  }
  // Whether the server closed the connection (end of stream within 5 s).
  bool closed_by_server() { return read_exactly(1).empty(); }

 private:
  std::string read_exactly(size_t n) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t r = ::recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
      if (r <= 0) break;
      out.append(buf, static_cast<size_t>(r));
    }
    return out;
  }
  int fd_ = -1;
};

control::Hello hello(const std::string& secret, uint64_t epoch = 1, const char* agent = "a") {
  return control::Hello{control::kProtocolVersion, secret, agent, epoch, "cpu"};
}

class ControlEndpointTest : public ::testing::Test {
 protected:
  void start(const std::string& control_extra = "") {
    server_.emplace(make_config(control_extra));
    ASSERT_TRUE(server_->start().ok());
    port_ = server_->control_port();
  }
  void TearDown() override {
    if (server_) server_->stop();
  }
  uint64_t metric(const std::string& series) {
    const std::string text = server_->metrics().render();
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return 0;
    return std::stoull(text.substr(at + series.size() + 2));
  }
  uint64_t refusals(const char* reason) {
    return metric(std::string("caracal_control_refusals_total{reason=\"") + reason + "\"}");
  }
  // Sends `m` as the first message from `source` and returns the refusal's text ("" when the
  // server answered anything else or nothing).
  control::Refused refused_first(const control::Message& m, const char* source = "127.0.0.1") {
    Peer p(port_, source);
    p.send(m);
    std::optional<control::Message> answer = p.next();
    if (!answer || !std::holds_alternative<control::Refused>(*answer)) return {};
    EXPECT_TRUE(p.closed_by_server());
    return std::get<control::Refused>(*answer);
  }
  bool welcomed(const char* source, uint64_t epoch) {
    Peer p(port_, source);
    p.send(hello(kSecret, epoch, source[8] == '2' ? "b" : "c"));
    std::optional<control::Message> answer = p.next();
    return answer && std::holds_alternative<control::Welcome>(*answer);
  }

  std::optional<Server> server_;
  uint16_t port_ = 0;
};

TEST_F(ControlEndpointTest, EveryRefusalOfAHelloIsCountedUnderItsReason) {
  start(", auth_failures: 0");  // no throttling here: every try is examined
  for (const char* reason :
       {"wrong_secret", "malformed", "protocol_version", "not_hello", "duplicate_agent", "replaced",
        "unexpected_message", "unknown_service", "region_size", "bad_region"}) {
    EXPECT_EQ(refusals(reason), 0u) << reason << ": every series exists from the start";
    EXPECT_NE(server_->metrics().render().find(std::string("reason=\"") + reason + "\""),
              std::string::npos);
  }
  EXPECT_THAT(refused_first(hello("not-the-secret-0123")).message, HasSubstr("wrong secret"));
  EXPECT_EQ(refusals("wrong_secret"), 1u);

  EXPECT_THAT(refused_first(hello(std::string(kSecret) + "x")).message, HasSubstr("wrong secret"));
  EXPECT_EQ(refusals("wrong_secret"), 2u);

  control::Hello v2 = hello(kSecret);
  v2.protocol = 2;
  EXPECT_THAT(refused_first(v2).message, HasSubstr("protocol version 2 is not supported"));
  EXPECT_EQ(refusals("protocol_version"), 1u);

  EXPECT_THAT(refused_first(control::Heartbeat{}).message, HasSubstr("must be hello"));
  EXPECT_EQ(refusals("not_hello"), 1u);

  {
    Peer p(port_);
    p.send_raw(std::string("\0\0\0\x05{a: [", 9));  // YAML that does not parse
    std::optional<control::Message> m = p.next();
    ASSERT_TRUE(m && std::holds_alternative<control::Refused>(*m));
  }
  {
    Peer p(port_);
    p.send_raw(std::string("\x7f\0\0\0", 4));  // a frame far over kMaxFrameBytes
    std::optional<control::Message> m = p.next();
    ASSERT_TRUE(m && std::holds_alternative<control::Refused>(*m));
    EXPECT_THAT(std::get<control::Refused>(*m).message, HasSubstr("control frame of"));
  }
  EXPECT_EQ(refusals("malformed"), 2u);

  // After a good hello: the same name and epoch again, and a message no agent sends.
  Peer agent(port_);
  agent.send(hello(kSecret, 7));
  std::optional<control::Message> w = agent.next();
  ASSERT_TRUE(w && std::holds_alternative<control::Welcome>(*w));
  EXPECT_THAT(refused_first(hello(kSecret, 7)).message, HasSubstr("already registered"));
  EXPECT_EQ(refusals("duplicate_agent"), 1u);
  agent.send(control::Welcome{1, 2});
  std::optional<control::Message> r = agent.next();
  ASSERT_TRUE(r && std::holds_alternative<control::Refused>(*r));
  EXPECT_EQ(refusals("unexpected_message"), 1u);
  EXPECT_EQ(metric("caracal_control_throttled_total"), 0u);
}

// A second registration of a live agent's name with a new epoch (a restart, or a second agent
// with the same name) takes the name; the first is told why and closed, so that two agents of
// one name do not replace each other on every reconnection.
TEST_F(ControlEndpointTest, ANewEpochOfALiveNameRefusesTheOldRegistrationWithTheReason) {
  start();
  Peer first(port_);
  first.send(hello(kSecret, 1, "face-1"));
  std::optional<control::Message> w = first.next();
  ASSERT_TRUE(w && std::holds_alternative<control::Welcome>(*w));
  Peer second(port_, "127.0.0.3");
  second.send(hello(kSecret, 2, "face-1"));
  w = second.next();
  ASSERT_TRUE(w && std::holds_alternative<control::Welcome>(*w));
  std::optional<control::Message> r = first.next();
  ASSERT_TRUE(r && std::holds_alternative<control::Refused>(*r));
  const control::Refused& refused = std::get<control::Refused>(*r);
  EXPECT_THAT(refused.message, HasSubstr("'face-1' was registered again from 127.0.0.3"));
  EXPECT_THAT(refused.message, HasSubstr("second agent running with this name"));
  EXPECT_TRUE(first.closed_by_server());
  EXPECT_EQ(refusals("replaced"), 1u);
  // The new registration holds the name: its epoch again is a duplicate.
  EXPECT_THAT(refused_first(hello(kSecret, 2, "face-1")).message, HasSubstr("already registered"));
}

// auth_failures: 3 failed hellos from 127.0.0.2, penalties from 300 ms doubling to 1.2 s.
constexpr const char* kThrottle =
    ", auth_failures: 3, auth_penalty_ms: 300, auth_penalty_max_ms: 1200, auth_window_ms: 10000";

TEST_F(ControlEndpointTest, RepeatedFailuresFromOneAddressAreThrottled) {
  start(kThrottle);
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(refused_first(hello("wrong-secret-0123456"), "127.0.0.2").message,
                HasSubstr("wrong secret"));
  }
  EXPECT_EQ(metric("caracal_control_penalties_total"), 1u);
  // Under penalty: refused unread, with how long is left; the secret is not compared.
  control::Refused t = refused_first(hello("wrong-secret-0123456"), "127.0.0.2");
  EXPECT_THAT(t.message, HasSubstr("throttled"));
  EXPECT_THAT(t.message, HasSubstr("127.0.0.2"));
  EXPECT_GT(t.retry_after_ms, 0u);
  EXPECT_LE(t.retry_after_ms, 300u);
  EXPECT_EQ(refusals("wrong_secret"), 3u);
  // Any first frame from it, even one that would not decode, meets the same refusal.
  {
    Peer p(port_, "127.0.0.2");
    p.send_raw(std::string("\0\0\0\x05{a: [", 9));
    std::optional<control::Message> m = p.next();
    ASSERT_TRUE(m && std::holds_alternative<control::Refused>(*m));
    EXPECT_GT(std::get<control::Refused>(*m).retry_after_ms, 0u);
  }
  EXPECT_EQ(refusals("malformed"), 0u);
  // The right secret from there waits the penalty out too: refused for now, not for good.
  control::Refused right = refused_first(hello(kSecret, 1, "b"), "127.0.0.2");
  EXPECT_THAT(right.message, HasSubstr("throttled"));
  EXPECT_GT(right.retry_after_ms, 0u);
  EXPECT_EQ(metric("caracal_control_throttled_total"), 3u);

  // Other addresses are admitted meanwhile.
  EXPECT_TRUE(welcomed("127.0.0.3", 1));
  EXPECT_EQ(refused_first(hello("wrong-secret-0123456"), "127.0.0.4").retry_after_ms, 0u)
      << "a failure from another address is examined, not throttled";

  // After the penalty the right secret is admitted, and forgives the address.
  std::this_thread::sleep_for(std::chrono::milliseconds(right.retry_after_ms + 50));
  EXPECT_TRUE(welcomed("127.0.0.2", 2));
  EXPECT_EQ(refused_first(hello("wrong-secret-0123456"), "127.0.0.2").retry_after_ms, 0u);
}

TEST_F(ControlEndpointTest, EachFailureAfterAPenaltyDoublesIt) {
  start(kThrottle);
  for (int i = 0; i < 3; ++i)
    refused_first(hello("wrong-secret-0123456"), "127.0.0.5");
  uint32_t left = refused_first(hello("x-wrong-secret-0123"), "127.0.0.5").retry_after_ms;
  EXPECT_LE(left, 300u);
  std::this_thread::sleep_for(std::chrono::milliseconds(left + 30));
  // One more failure once the penalty is over: a penalty twice as long at once.
  EXPECT_THAT(refused_first(hello("wrong-secret-0123456"), "127.0.0.5").message,
              HasSubstr("wrong secret"));
  left = refused_first(hello("wrong-secret-0123456"), "127.0.0.5").retry_after_ms;
  EXPECT_GT(left, 300u);
  EXPECT_LE(left, 600u);
  EXPECT_EQ(metric("caracal_control_penalties_total"), 2u);
  EXPECT_EQ(refusals("wrong_secret"), 4u);
}

// A region for the announcements below: a named shm object laid out and initialised as an
// agent does, which a case may then corrupt.
struct ShmRegion {
  std::string name;
  mqueue::ShmMapping mapping;
  mqueue::RegionHeader& header() {
    return *reinterpret_cast<mqueue::RegionHeader*>(mapping.data());
  }
};

ShmRegion make_region(const std::string& tag, uint64_t epoch, uint64_t extra_bytes = 0) {
  const mqueue::RegionGeometry g{1, 0, 128, 16, 64, true, true};
  const mqueue::RegionHeader h = mqueue::compute_layout(g, epoch);
  ShmRegion r;
  r.name = "/caracal-ctl-test-" + std::to_string(getpid()) + "-" + tag;
  Result<mqueue::ShmMapping> m =
      mqueue::ShmMapping::create_named(r.name, h.region_bytes + extra_bytes);
  EXPECT_TRUE(m.ok()) << m.status().message();
  r.mapping = std::move(m).value();
  mqueue::initialize_region(r.mapping.data(), h);
  return r;
}

control::RegionAnnounce shm_announce(const ShmRegion& r) {
  control::RegionAnnounce a;
  a.service = "echo";
  a.transport = "shm";
  a.shm_name = r.name;
  a.region_bytes = r.mapping.size();
  return a;
}

struct AnnounceCase {
  const char* name;
  // Changes the region (its header) and the announcement before it is sent.
  std::function<void(mqueue::RegionHeader&, control::RegionAnnounce&)> corrupt;
  const char* reason;  // of caracal_control_refusals_total
  const char* says;    // in the refusal: the field, quoted as validate_region quotes it
};

void PrintTo(const AnnounceCase& c, std::ostream* os) {
  *os << c.name;
}

using control::RegionAnnounce;
using mqueue::kPageBytes;
using mqueue::RegionHeader;
constexpr uint64_t kTop = uint64_t{1} << 63;

// One case per field of what an agent registers: the announcement's, then the header's.
const AnnounceCase kAnnounceCases[] = {
    {"UnknownService", [](RegionHeader&, RegionAnnounce& a) { a.service = "nope"; },
     "unknown_service", "no such service"},
    {"UnknownDestination", [](RegionHeader&, RegionAnnounce& a) { a.destinations = {"memcached"}; },
     "unknown_destination", "destinations[0]"},
    {"ShmNameMissing", [](RegionHeader&, RegionAnnounce& a) { a.shm_name = "/caracal-no-such"; },
     "region_unreachable", "shm_open"},
    {"RegionBytesBelowAPage",
     [](RegionHeader&, RegionAnnounce& a) { a.region_bytes = kPageBytes - 1; }, "region_size",
     "region_bytes"},
    {"RegionBytesOverTheLimit",
     [](RegionHeader&, RegionAnnounce& a) { a.region_bytes = (uint64_t{1} << 20) + 1; },
     "region_size", "region_bytes"},
    {"RegionBytesMax", [](RegionHeader&, RegionAnnounce& a) { a.region_bytes = UINT64_MAX; },
     "region_size", "region_bytes"},
    {"RegionBytesNotTheObjectsSize",
     [](RegionHeader&, RegionAnnounce& a) { a.region_bytes -= kPageBytes; }, "bad_region",
     "region_bytes"},
    {"HeaderMagic", [](RegionHeader& h, RegionAnnounce&) { h.magic = 0; }, "bad_region", "'magic'"},
    {"HeaderLayoutVersion", [](RegionHeader& h, RegionAnnounce&) { h.layout_version = 0; },
     "bad_region", "'layout_version'"},
    {"HeaderHeaderBytes", [](RegionHeader& h, RegionAnnounce&) { h.header_bytes = 0; },
     "bad_region", "'header_bytes'"},
    {"HeaderRegionBytesPastTheObject",
     [](RegionHeader& h, RegionAnnounce&) { h.region_bytes += kPageBytes; }, "bad_region",
     "'region_bytes'"},
    {"HeaderRegionBytesMax", [](RegionHeader& h, RegionAnnounce&) { h.region_bytes = UINT64_MAX; },
     "bad_region", "'region_bytes'"},
    {"HeaderEpoch", [](RegionHeader& h, RegionAnnounce&) { h.agent_epoch += 1; }, "epoch_mismatch",
     "epoch"},
    {"HeaderEpochZero", [](RegionHeader& h, RegionAnnounce&) { h.agent_epoch = 0; },
     "epoch_mismatch", "epoch"},
    {"HeaderServerQueueCount",
     [](RegionHeader& h, RegionAnnounce&) { h.server_queue_count = UINT32_MAX; }, "bad_region",
     "'server_queue_count'"},
    {"HeaderServerQueuesBeyondTheLayout",
     [](RegionHeader& h, RegionAnnounce&) { h.server_queue_count = 64; }, "bad_region",
     "'control_bytes'"},
    {"HeaderClientQueueCount",
     [](RegionHeader& h, RegionAnnounce&) { h.client_queue_count = UINT32_MAX; }, "bad_region",
     "'client_queue_count'"},
    // A client queue more than the region was laid out for: its rings would be where the
    // lines are.
    {"HeaderClientQueueBeyondTheLayout",
     [](RegionHeader& h, RegionAnnounce&) { h.client_queue_count = 1; }, "bad_region",
     "'lines_offset'"},
    {"HeaderSlotBytes", [](RegionHeader& h, RegionAnnounce&) { h.slot_bytes = 1u << 31; },
     "bad_region", "'slot_bytes'"},
    {"HeaderRingCapacity", [](RegionHeader& h, RegionAnnounce&) { h.ring_capacity = 1u << 31; },
     "bad_region", "'ring_capacity'"},
    {"HeaderMaxMessageBytes",
     [](RegionHeader& h, RegionAnnounce&) { h.max_message_bytes = UINT32_MAX; }, "bad_region",
     "'max_message_bytes'"},
    // Valid for the region, too small for the service's max_message_bytes (64).
    {"HeaderMaxMessageBytesBelowTheService",
     [](RegionHeader& h, RegionAnnounce&) { h.max_message_bytes = 32; }, "service_refused",
     "max_message_bytes"},
    {"HeaderControlLineBytes", [](RegionHeader& h, RegionAnnounce&) { h.control_line_bytes = 8; },
     "bad_region", "'control_line_bytes'"},
    {"HeaderControlOffset", [](RegionHeader& h, RegionAnnounce&) { h.control_offset = kTop; },
     "bad_region", "'control_offset'"},
    {"HeaderControlBytes",
     [](RegionHeader& h, RegionAnnounce&) { h.control_bytes = 0 - h.control_offset; }, "bad_region",
     "'control_bytes'"},
    {"HeaderRingsOffset",
     [](RegionHeader& h, RegionAnnounce&) { h.rings_offset = h.control_offset; }, "bad_region",
     "'rings_offset'"},
    {"HeaderRingsOffsetPastTheRegion",
     [](RegionHeader& h, RegionAnnounce&) { h.rings_offset = h.region_bytes + kPageBytes; },
     "bad_region", "'rings_offset'"},
    {"HeaderRingStride", [](RegionHeader& h, RegionAnnounce&) { h.ring_stride = kPageBytes / 2; },
     "bad_region", "'ring_stride'"},
    {"HeaderRingStrideWrapping", [](RegionHeader& h, RegionAnnounce&) { h.ring_stride = kTop; },
     "bad_region", "'region_bytes'"},
    {"HeaderFeatures", [](RegionHeader& h, RegionAnnounce&) { h.features = 1u << 9; }, "bad_region",
     "'features'"},
    {"HeaderLineBytes", [](RegionHeader& h, RegionAnnounce&) { h.line_bytes = 64; }, "bad_region",
     "'line_bytes'"},
    {"HeaderLinesOffset", [](RegionHeader& h, RegionAnnounce&) { h.lines_offset = h.rings_offset; },
     "bad_region", "'lines_offset'"},
    {"HeaderLinesOffsetPastTheRegion",
     [](RegionHeader& h, RegionAnnounce&) { h.lines_offset = UINT64_MAX - kPageBytes + 1; },
     "bad_region", "'lines_offset'"},
    {"HeaderLineStride", [](RegionHeader& h, RegionAnnounce&) { h.line_stride = kPageBytes; },
     "bad_region", "'line_stride'"},
    {"HeaderLineStrideWrapping", [](RegionHeader& h, RegionAnnounce&) { h.line_stride = kTop; },
     "bad_region", "'region_bytes'"},
};

class HostileRegionTest : public ControlEndpointTest,
                          public ::testing::WithParamInterface<AnnounceCase> {};

INSTANTIATE_TEST_SUITE_P(Fields, HostileRegionTest, ::testing::ValuesIn(kAnnounceCases),
                         [](const ::testing::TestParamInfo<AnnounceCase>& info) {
                           return info.param.name;
                         });

// Each case is refused with the field named and counted; the session stays open, and a good
// region on it is attached afterwards (the server neither crashed nor lost track). The shm
// object is exactly region_bytes long, so a read or write past it would fault the test.
TEST_P(HostileRegionTest, IsRefusedWithTheFieldNamed) {
  start(", max_region_bytes: 1048576");
  const uint64_t epoch = 42;
  Peer agent(port_);
  agent.send(hello(kSecret, epoch));
  std::optional<control::Message> w = agent.next();
  ASSERT_TRUE(w && std::holds_alternative<control::Welcome>(*w));

  ShmRegion bad = make_region("bad", epoch);
  RegionAnnounce a = shm_announce(bad);
  GetParam().corrupt(bad.header(), a);
  agent.send(a);
  std::optional<control::Message> answer = agent.next();
  ASSERT_TRUE(answer.has_value()) << "the server closed the session";
  ASSERT_TRUE(std::holds_alternative<control::Refused>(*answer)) << control::type_name(*answer);
  const control::Refused& r = std::get<control::Refused>(*answer);
  EXPECT_THAT(r.message, HasSubstr(GetParam().says));
  EXPECT_EQ(refusals(GetParam().reason), 1u) << r.message;

  ShmRegion good = make_region("good", epoch);
  agent.send(shm_announce(good));
  answer = agent.next();
  ASSERT_TRUE(answer && std::holds_alternative<control::Attached>(*answer))
      << (answer ? std::get<control::Refused>(*answer).message : "closed");
}

// transport rdma: the server allocates and registers a staging image of region_bytes before it
// can read the header, so an announcement past control.max_region_bytes is refused before it
// connects or allocates anything.
TEST_F(ControlEndpointTest, AnRdmaRegionPastTheLimitIsRefusedBeforeAnyAllocation) {
  if (!control::rdma_available()) GTEST_SKIP() << "built without rdma-core";
  start(", max_region_bytes: 1048576");
  Peer agent(port_);
  agent.send(hello(kSecret, 9));
  std::optional<control::Message> w = agent.next();
  ASSERT_TRUE(w && std::holds_alternative<control::Welcome>(*w));
  for (const uint64_t bytes : {uint64_t{1} << 40, (uint64_t{1} << 20) + 1}) {
    control::RegionAnnounce a;
    a.service = "echo";
    a.transport = "rdma";
    a.region_bytes = bytes;
    a.rdma_host = "192.0.2.1";
    a.rdma_port = 4791;
    a.rdma_address = 4096;
    a.rdma_rkey = 1;
    agent.send(a);
    std::optional<control::Message> answer = agent.next();
    ASSERT_TRUE(answer && std::holds_alternative<control::Refused>(*answer));
    EXPECT_THAT(std::get<control::Refused>(*answer).message, HasSubstr("region_bytes"));
  }
  EXPECT_EQ(refusals("region_size"), 2u);
}

}  // namespace
}  // namespace caracal::server
