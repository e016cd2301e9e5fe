#include <gtest/gtest.h>

#include "caracal/control/protocol.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace caracal::control {
namespace {

// An shm announcement; the rdma fields keep their defaults.
RegionAnnounce shm_announce(std::string service, std::string shm_name, uint64_t bytes,
                            std::vector<std::string> destinations = {}) {
  RegionAnnounce r;
  r.service = std::move(service);
  r.transport = "shm";
  r.shm_name = std::move(shm_name);
  r.region_bytes = bytes;
  r.destinations = std::move(destinations);
  return r;
}

Message round_trip(const Message& m) {
  const std::string frame = encode(m);
  Result<uint32_t> n = frame_length(reinterpret_cast<const std::byte*>(frame.data()));
  EXPECT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(*n + kFramePrefixBytes, frame.size());
  Result<Message> back = decode(std::string_view(frame).substr(kFramePrefixBytes), "test");
  EXPECT_TRUE(back.ok()) << back.status().message();
  return *back;
}

TEST(ControlProtocol, HelloRoundTripsSecretsWithYamlSpecials) {
  Hello h;
  h.secret = "a: b, {c} [d] # 'e' \"f\" 0123456789";
  h.agent = "echo-1";
  h.epoch = 0xFFFF'FFFF'FFFF'FFFFULL;
  h.accelerator = "cpu";
  const auto back = std::get<Hello>(round_trip(h));
  EXPECT_EQ(back.secret, h.secret);
  EXPECT_EQ(back.agent, "echo-1");
  EXPECT_EQ(back.epoch, h.epoch);
  EXPECT_EQ(back.accelerator, "cpu");
}

TEST(ControlProtocol, RegionRoundTrips) {
  RegionAnnounce r = shm_announce("kv", "/caracal-kv-1", 1 << 20, {"memcached", "memcached"});
  const auto back = std::get<RegionAnnounce>(round_trip(r));
  EXPECT_EQ(back.service, "kv");
  EXPECT_EQ(back.shm_name, "/caracal-kv-1");
  EXPECT_EQ(back.region_bytes, 1u << 20);
  EXPECT_EQ(back.destinations, r.destinations);
  const auto none = std::get<RegionAnnounce>(round_trip(shm_announce("e", "/x", 8)));
  EXPECT_TRUE(none.destinations.empty());
}

TEST(ControlProtocol, SmallMessagesRoundTrip) {
  EXPECT_EQ(std::get<Welcome>(round_trip(Welcome{100, 1000})).agent_timeout_ms, 1000u);
  EXPECT_EQ(std::get<Attached>(round_trip(Attached{"echo"})).service, "echo");
  EXPECT_TRUE(std::holds_alternative<Heartbeat>(round_trip(Heartbeat{})));
  EXPECT_TRUE(std::holds_alternative<Bye>(round_trip(Bye{})));
  EXPECT_EQ(std::get<Refused>(round_trip(Refused{"", "bad secret"})).message, "bad secret");
  EXPECT_EQ(std::get<Refused>(round_trip(Refused{"", "bad secret"})).retry_after_ms, 0u);
  // Only a throttled refusal carries the key.
  EXPECT_EQ(encode(Refused{"", "bad secret"}).find("retry_after_ms"), std::string::npos);
  const Refused throttled = std::get<Refused>(round_trip(Refused{"", "throttled", 4000}));
  EXPECT_EQ(throttled.message, "throttled");
  EXPECT_EQ(throttled.retry_after_ms, 4000u);
}

TEST(ControlProtocol, AnyProtocolVersionDecodesForTheServerToRefuse) {
  Result<Message> m =
      decode("{type: hello, protocol: 2, secret: s, agent: a, epoch: 1}", "control 127.0.0.1:5");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(std::get<Hello>(*m).protocol, 2u);
  EXPECT_NE(unsupported_protocol(2).find("protocol version 2 is not supported"), std::string::npos);
}

TEST(ControlProtocol, FrameLengthBounds) {
  const std::byte zero[4] = {};
  EXPECT_FALSE(frame_length(zero).ok());
  const std::byte huge[4] = {std::byte{0}, std::byte{1}, std::byte{0}, std::byte{1}};
  Result<uint32_t> r = frame_length(huge);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("65537"), std::string::npos);
}

void expect_refused(std::string_view text, const std::string& needle) {
  Result<Message> r = decode(text, "control 127.0.0.1:5");
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("control 127.0.0.1:5"), std::string::npos);
}

TEST(ControlProtocol, BadMessagesNameTheField) {
  expect_refused("{type: nope}", "unknown message type 'nope'");
  expect_refused("[1, 2]", "mapping");
  expect_refused("{type: hello, protocol: -1, secret: s, agent: a, epoch: 1}", "protocol");
  expect_refused("{type: refused, message: m, retry_after_ms: 0}", "retry_after_ms");
  expect_refused("{type: hello, protocol: 1, secret: s, agent: 'a b', epoch: 1}", "agent");
  expect_refused("{type: hello, protocol: 1, secret: s, agent: a, epoch: 0}", "epoch");
  expect_refused("{type: hello, protocol: 1, secret: s, agent: a, epoch: 1, x: 1}",
                 "unknown setting 'x'");
  expect_refused("{type: region, service: e, transport: tcp, shm_name: /a, region_bytes: 1}",
                 "transport 'tcp' is not one of: shm, rdma");
  expect_refused(
      "{type: region, service: e, transport: shm, shm_name: /a, region_bytes: 1, rdma_port: 5}",
      "rdma_port belongs to transport rdma");
  expect_refused("{type: region, service: e, transport: shm, shm_name: /a/b, region_bytes: 1}",
                 "shm_name");
  expect_refused("{type: region, service: e, transport: shm, shm_name: /a, region_bytes: -1}",
                 "region_bytes");
  expect_refused("{type: region, service: e, transport: shm, shm_name: /a}", "region_bytes");
  expect_refused("{type: hello, protocol: 1", "YAML syntax");
}

constexpr const char* kRdmaRegion =
    "{type: region, service: e, transport: rdma, rdma_host: 192.0.2.1, rdma_port: 4791,\n"
    " rdma_address: 140737488289792, rdma_rkey: 4660, region_bytes: 8192}";

TEST(ControlProtocol, RdmaRegionRoundTrips) {
  RegionAnnounce r;
  r.service = "echo";
  r.transport = "rdma";
  r.region_bytes = 1 << 20;
  r.destinations = {"memcached"};
  r.rdma_host = "192.0.2.1";
  r.rdma_port = 41443;
  r.rdma_address = 0x7f12'3456'7000ull;
  r.rdma_rkey = 0xdeadbeef;
  if (!rdma_available()) {
    // The agent side still encodes it; a server built like this one refuses it at the line.
    Result<Message> m = decode(encode(r).substr(kFramePrefixBytes), "control 127.0.0.1:5");
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("built without rdma-core"), std::string::npos);
    return;
  }
  const auto back = std::get<RegionAnnounce>(round_trip(r));
  EXPECT_EQ(back.transport, "rdma");
  EXPECT_EQ(back.shm_name, "");
  EXPECT_EQ(back.rdma_host, "192.0.2.1");
  EXPECT_EQ(back.rdma_port, 41443);
  EXPECT_EQ(back.rdma_address, 0x7f12'3456'7000ull);
  EXPECT_EQ(back.rdma_rkey, 0xdeadbeefu);
  EXPECT_EQ(back.region_bytes, 1u << 20);
  EXPECT_EQ(back.destinations, r.destinations);
  // The shm encoding carries none of the rdma keys (old servers refuse unknown keys).
  RegionAnnounce shm = shm_announce("e", "/x", 8);
  EXPECT_EQ(encode(shm).find("rdma"), std::string::npos);
}

TEST(ControlProtocol, BadRdmaRegionsNameTheField) {
  if (!rdma_available()) {
    // Line 1, at the transport value.
    expect_refused(kRdmaRegion,
                   "5:1:39: transport: transport 'rdma' is not served by this "
                   "server: it was built without rdma-core");
    return;
  }
  ASSERT_TRUE(decode(kRdmaRegion, "control 127.0.0.1:5").ok());
  auto with = [](const std::string& from, const std::string& to) {
    std::string t = kRdmaRegion;
    t.replace(t.find(from), from.size(), to);
    return t;
  };
  expect_refused(with("rdma_port: 4791", "rdma_port: 0"), "5:1:78: rdma_port: 0 is out of range");
  expect_refused(with("rdma_port: 4791", "rdma_port: 70000"), "rdma_port: 70000");
  expect_refused(with("rdma_host: 192.0.2.1, ", ""), "missing required setting 'rdma_host'");
  expect_refused(with("rdma_host: 192.0.2.1", "rdma_host: ''"), "1:56: rdma_host");
  expect_refused(with("rdma_address: 140737488289792", "rdma_address: 0"), "2:16: rdma_address");
  expect_refused(with("rdma_rkey: 4660", "rdma_rkey: 4294967296"), "2:44: rdma_rkey");
  expect_refused(with("rdma_rkey: 4660, ", ""), "missing required setting 'rdma_rkey'");
  expect_refused(with("rdma_address: 140737488289792", "rdma_address: 18446744073709551615"),
                 "wrap around");
  expect_refused(with("region_bytes: 8192", "region_bytes: 8192, shm_name: /a"),
                 "shm_name belongs to transport shm");
}

TEST(ControlProtocol, SecretsEqual) {
  EXPECT_TRUE(secrets_equal("0123456789abcdef", "0123456789abcdef"));
  EXPECT_FALSE(secrets_equal("0123456789abcdef", "0123456789abcdeg"));
  EXPECT_FALSE(secrets_equal("0123456789abcdef", "0123456789abcde"));
  EXPECT_FALSE(secrets_equal("", "x"));
  EXPECT_TRUE(secrets_equal("", ""));
  EXPECT_FALSE(secrets_equal(std::string_view("a\0b", 3), std::string_view("a\0c", 3)));
}

// read_secret on a secret file with mode `mode` ("" when it is accepted, else the error).
std::string secret_file_error(mode_t mode) {
  char path[] = "/tmp/caracal-secret-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  const std::string secret = "0123456789abcdef-secret\n";
  EXPECT_EQ(write(fd, secret.data(), secret.size()), static_cast<ssize_t>(secret.size()));
  close(fd);
  EXPECT_EQ(chmod(path, mode), 0);
  std::string error;
  try {
    const config::Field root =
        config::load_yaml_text(std::string("secret_file: ") + path + "\n", "agent.yaml");
    EXPECT_EQ(read_secret(root), "0123456789abcdef-secret");
  } catch (const config::ConfigError& e) {
    error = e.what();
  }
  std::remove(path);
  return error;
}

TEST(ControlSecret, AFileOpenToOtherUsersIsRefusedWithItsMode) {
  EXPECT_EQ(secret_file_error(0600), "");
  EXPECT_EQ(secret_file_error(0640), "");  // the service's group may read it
  EXPECT_EQ(secret_file_error(0400), "");
  for (const mode_t open_to_others : {0644, 0604, 0602, 0601, 0666}) {
    const std::string e = secret_file_error(open_to_others);
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(open_to_others));
    EXPECT_NE(e.find("agent.yaml:1:14"), std::string::npos) << e;
    EXPECT_NE(e.find("is open to other users (mode " + std::string(mode) + ")"), std::string::npos)
        << e;
    EXPECT_NE(e.find("chmod o="), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace caracal::control
