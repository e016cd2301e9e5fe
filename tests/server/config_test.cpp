#include "caracal/server/config.hpp"

#include <gtest/gtest.h>

#include <string>

namespace caracal::server {
namespace {

const char* kValid = R"(io_threads: 3
log_level: debug
control:
  listen: 127.0.0.1:7100
  secret: 0123456789abcdef0123
  heartbeat_interval_ms: 50
  agent_timeout_ms: 500
metrics:
  listen: "[::1]:9100"
services:
  - name: echo
    max_message_bytes: 1024
    dispatch: flow_affinity
    listeners:
      - { protocol: udp, listen: 0.0.0.0:7000 }
      - protocol: tcp
        listen: 0.0.0.0:7001
        framing: { kind: length_prefixed, prefix_bytes: 2, byte_order: little }
      - protocol: tcp
        listen: 0.0.0.0:7002
        framing: { kind: line, delimiter: "\r\n" }
destinations:
  - name: memcached
    connect: localhost:11211
    framing: { kind: line, delimiter: "\r\n" }
)";

ServerConfig parse(const std::string& text) {
  return parse_server_config(config::load_yaml_text(text, "test.yaml"));
}

// The message of the ConfigError that parsing `text` throws ("" if none).
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return "";
}

// kValid with one line replaced.
std::string with(const std::string& from, const std::string& to) {
  std::string s = kValid;
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(ServerConfig, ParsesEverySetting) {
  const ServerConfig c = parse(kValid);
  EXPECT_EQ(c.io_threads, 3u);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.control.listen.host, "127.0.0.1");
  EXPECT_EQ(c.control.listen.port, 7100);
  EXPECT_EQ(c.control.secret, "0123456789abcdef0123");
  EXPECT_EQ(c.control.heartbeat_interval_ms, 50u);
  ASSERT_TRUE(c.metrics_listen.has_value());
  EXPECT_EQ(c.metrics_listen->host, "::1");
  EXPECT_EQ(c.metrics_listen->str(), "[::1]:9100");
  ASSERT_EQ(c.services.size(), 1u);
  const ServiceConfig& s = c.services[0];
  EXPECT_EQ(s.dispatch, DispatchPolicy::kFlowAffinity);
  ASSERT_EQ(s.listeners.size(), 3u);
  EXPECT_EQ(s.listeners[0].protocol, Protocol::kUdp);
  EXPECT_EQ(s.listeners[1].framing.kind, FramingKind::kLengthPrefixed);
  EXPECT_EQ(s.listeners[1].framing.prefix_bytes, 2u);
  EXPECT_EQ(s.listeners[1].framing.byte_order, ByteOrder::kLittle);
  EXPECT_EQ(s.listeners[1].framing.max_message_bytes, 1024u);
  EXPECT_EQ(s.listeners[2].framing.delimiter, "\r\n");
  ASSERT_EQ(c.destinations.size(), 1u);
  EXPECT_EQ(c.destinations[0].connect.port, 11211);
}

TEST(ServerConfig, UnknownKeyNamesLineAndKnownKeys) {
  const std::string e = error_of(with("    dispatch: flow_affinity", "    dispatcher: x"));
  EXPECT_NE(e.find("test.yaml:13:"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown setting 'dispatcher'"), std::string::npos) << e;
  EXPECT_NE(e.find("known here: name, max_message_bytes, dispatch, listeners"), std::string::npos)
      << e;
}

TEST(ServerConfig, BadChoiceListsTheChoices) {
  const std::string e = error_of(with("dispatch: flow_affinity", "dispatch: random"));
  EXPECT_NE(e.find("test.yaml:13:"), std::string::npos) << e;
  EXPECT_NE(e.find("services[0].dispatch"), std::string::npos) << e;
  EXPECT_NE(e.find("round_robin, least_loaded, flow_affinity"), std::string::npos) << e;
}

TEST(ServerConfig, BadPortAndAddress) {
  std::string e = error_of(with("0.0.0.0:7000", "0.0.0.0:70000"));
  EXPECT_NE(e.find("test.yaml:15:"), std::string::npos) << e;
  EXPECT_NE(e.find("services[0].listeners[0].listen"), std::string::npos) << e;
  EXPECT_NE(e.find("no valid port"), std::string::npos) << e;
  e = error_of(with("localhost:11211", "fe80::1:11211"));
  EXPECT_NE(e.find("[address]:port"), std::string::npos) << e;
}

TEST(ServerConfig, SecretRequiredAndLongEnough) {
  std::string e = error_of(with("  secret: 0123456789abcdef0123\n", ""));
  EXPECT_NE(e.find("'secret' or 'secret_file'"), std::string::npos) << e;
  e = error_of(with("secret: 0123456789abcdef0123", "secret: short"));
  EXPECT_NE(e.find("test.yaml:5:"), std::string::npos) << e;
  EXPECT_NE(e.find("at least 16"), std::string::npos) << e;
  e = error_of(with("secret: 0123456789abcdef0123", "secret_file: /nonexistent/secret"));
  EXPECT_NE(e.find("cannot read secret file"), std::string::npos) << e;
}

TEST(ServerConfig, FramingMismatches) {
  std::string e =
      error_of(with("{ protocol: udp, listen: 0.0.0.0:7000 }",
                    "{ protocol: udp, listen: 0.0.0.0:7000, framing: { kind: line } }"));
  EXPECT_NE(e.find("UDP listeners take no framing"), std::string::npos) << e;
  e = error_of(with("prefix_bytes: 2", "prefix_bytes: 3"));
  EXPECT_NE(e.find("must be 1, 2, 4 or 8"), std::string::npos) << e;
  e = error_of(
      with("{ kind: line, delimiter: \"\\r\\n\" }\ndest", "{ kind: line, prefix_bytes: 4 }\ndest"));
  EXPECT_NE(e.find("only applies to framing kind 'length_prefixed'"), std::string::npos) << e;
  e = error_of(with("kind: length_prefixed, prefix_bytes: 2, byte_order: little",
                    "kind: fixed, size: 2048"));
  EXPECT_NE(e.find("out of range [1, 1024]"), std::string::npos) << e;
}

TEST(ServerConfig, DuplicatesAreRefused) {
  std::string e = error_of(with("0.0.0.0:7002", "0.0.0.0:7001"));
  EXPECT_NE(e.find("already used by another listener"), std::string::npos) << e;
  EXPECT_NE(e.find("test.yaml:20:"), std::string::npos) << e;
}

TEST(ServerConfig, TimeoutMustExceedHeartbeat) {
  const std::string e = error_of(with("agent_timeout_ms: 500", "agent_timeout_ms: 50"));
  EXPECT_NE(e.find("must exceed heartbeat_interval_ms"), std::string::npos) << e;
}

TEST(ServerConfig, RdmaTimeouts) {
  const ServerConfig d = parse(kValid);
  EXPECT_EQ(d.control.rdma_connect_timeout_ms, 2000u);
  EXPECT_EQ(d.control.rdma_reconnect_max_ms, 5000u);
  const ServerConfig c = parse(with("agent_timeout_ms: 500",
                                    "agent_timeout_ms: 500\n"
                                    "  rdma_connect_timeout_ms: 300\n"
                                    "  rdma_reconnect_max_ms: 1000"));
  EXPECT_EQ(c.control.rdma_connect_timeout_ms, 300u);
  EXPECT_EQ(c.control.rdma_reconnect_max_ms, 1000u);
  std::string e = error_of(
      with("agent_timeout_ms: 500", "agent_timeout_ms: 500\n  rdma_connect_timeout_ms: 0"));
  EXPECT_NE(e.find("test.yaml:8:"), std::string::npos) << e;
  EXPECT_NE(e.find("control.rdma_connect_timeout_ms"), std::string::npos) << e;
  e = error_of(with("agent_timeout_ms: 500", "agent_timeout_ms: 500\n  rdma_reconnect_max_ms: 5"));
  EXPECT_NE(e.find("test.yaml:8:"), std::string::npos) << e;
}

TEST(ServerConfig, SyntaxErrorCarriesTheParserPosition) {
  const std::string e = error_of(with("  listen: 127.0.0.1:7100", "  listen: [127.0.0.1:7100"));
  EXPECT_NE(e.find("test.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML syntax"), std::string::npos) << e;
}

TEST(ServerConfig, MissingFileIsAClearError) {
  try {
    load_server_config("/nonexistent/caracal.yaml");
    FAIL() << "no error";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace caracal::server

namespace caracal::server {
namespace {

// Every server configuration shipped in configs/ parses as it is.
TEST(ShippedConfigs, EchoServerParses) {
  const ServerConfig c = load_server_config(CARACAL_CONFIGS_DIR "/echo-server.yaml");
  ASSERT_EQ(c.services.size(), 1u);
  EXPECT_EQ(c.services[0].name, "echo");
  ASSERT_EQ(c.services[0].listeners.size(), 4u);
  EXPECT_EQ(c.services[0].listeners[2].error_reply, "ERROR {reason}");
  EXPECT_EQ(c.services[0].listeners[3].framing.fixed_bytes, 64u);
}

TEST(ShippedConfigs, KvServerParses) {
  const ServerConfig c = load_server_config(CARACAL_CONFIGS_DIR "/kv-server.yaml");
  ASSERT_EQ(c.destinations.size(), 1u);
  EXPECT_EQ(c.destinations[0].name, "memcached");
  EXPECT_EQ(c.services[0].dispatch, DispatchPolicy::kLeastLoaded);
}

TEST(ListenerConfig, ErrorReplyMustSayWhereTheReasonGoes) {
  const std::string text = R"(control: { listen: 127.0.0.1:1, secret: 0123456789abcdef }
services:
  - name: e
    max_message_bytes: 64
    listeners:
      - { protocol: udp, listen: 127.0.0.1:1, error_reply: "oops" }
)";
  try {
    parse_server_config(config::load_yaml_text(text, "t.yaml"));
    FAIL() << "accepted an error_reply without {reason}";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.yaml:6:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("{reason}"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace caracal::server
