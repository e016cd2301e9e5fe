#include "config.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
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
  EXPECT_EQ(c.destinations[0].timeout_ms, 1000u);
}

TEST(ServerConfig, DestinationTimeout) {
  const std::string connect = "    connect: localhost:11211";
  EXPECT_EQ(parse(with(connect, connect + "\n    timeout_ms: 0")).destinations[0].timeout_ms, 0u);
  EXPECT_EQ(parse(with(connect, connect + "\n    timeout_ms: 250")).destinations[0].timeout_ms,
            250u);
  const std::string e = error_of(with(connect, connect + "\n    timeout_ms: 600001"));
  EXPECT_NE(e.find("timeout_ms"), std::string::npos) << e;
}

TEST(ServerConfig, ServiceReplyTimeoutAndEjection) {
  const ServiceConfig defaults = parse(kValid).services[0];
  EXPECT_EQ(defaults.reply_timeout_ms, 10000u);
  EXPECT_EQ(defaults.eject_after_timeouts, 3u);
  EXPECT_EQ(defaults.eject_ms, 5000u);
  EXPECT_EQ(defaults.eject_max_ms, 60000u);

  const std::string dispatch = "    dispatch: flow_affinity";
  const ServiceConfig set = parse(with(dispatch, dispatch + R"(
    reply_timeout_ms: 200
    eject_after_timeouts: 5
    eject_ms: 100
    eject_max_ms: 800)"))
                                .services[0];
  EXPECT_EQ(set.reply_timeout_ms, 200u);
  EXPECT_EQ(set.eject_after_timeouts, 5u);
  EXPECT_EQ(set.eject_ms, 100u);
  EXPECT_EQ(set.eject_max_ms, 800u);

  // 0: no bound, and no ejection.
  EXPECT_EQ(
      parse(with(dispatch, dispatch + "\n    reply_timeout_ms: 0")).services[0].reply_timeout_ms,
      0u);
  EXPECT_EQ(parse(with(dispatch, dispatch + "\n    eject_after_timeouts: 0"))
                .services[0]
                .eject_after_timeouts,
            0u);
  // A first ejection longer than the default cap raises the cap with it.
  EXPECT_EQ(parse(with(dispatch, dispatch + "\n    eject_ms: 120000")).services[0].eject_max_ms,
            120000u);
  // A cap below the first ejection is a mistake, named at its line.
  std::string e =
      error_of(with(dispatch, dispatch + "\n    eject_ms: 1000\n    eject_max_ms: 500"));
  EXPECT_NE(e.find("test.yaml:15:"), std::string::npos) << e;
  EXPECT_NE(e.find("eject_max_ms (500) is below eject_ms (1000)"), std::string::npos) << e;
  e = error_of(with(dispatch, dispatch + "\n    eject_ms: 0"));
  EXPECT_NE(e.find("services[0].eject_ms"), std::string::npos) << e;
  e = error_of(with(dispatch, dispatch + "\n    reply_timeout_ms: -1"));
  EXPECT_NE(e.find("services[0].reply_timeout_ms"), std::string::npos) << e;
}

TEST(ServerConfig, UnknownKeyNamesLineAndKnownKeys) {
  const std::string e = error_of(with("    dispatch: flow_affinity", "    dispatcher: x"));
  EXPECT_NE(e.find("test.yaml:13:"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown setting 'dispatcher'"), std::string::npos) << e;
  EXPECT_NE(e.find("known here: name, max_message_bytes, dispatch, listeners"), std::string::npos)
      << e;
}

// A list or a mapping where a setting's name goes ("? " in YAML) is a ConfigError at its line,
// not yaml-cpp's conversion error escaping (the fuzz input
// tests/fuzz/regressions/server_config/mapping-as-key).
TEST(ServerConfig, KeyThatIsNotANameNamesItsLine) {
  const std::string e = error_of(with("  secret: 0123456789abcdef0123", "? [secret]: x"));
  EXPECT_NE(e.find("test.yaml:5:"), std::string::npos) << e;
  EXPECT_NE(e.find("a setting's name must be a single word"), std::string::npos) << e;
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

TEST(ServerConfig, TheExampleSecretOnlyOnLoopback) {
  // kValid with the control endpoint at `listen` and the examples' secret.
  const auto example_on = [](const std::string& listen) {
    std::string text = with("127.0.0.1:7100", listen);
    const std::string secret = "secret: 0123456789abcdef0123";
    return text.replace(text.find(secret), secret.size(), "secret: change-me-0123456789");
  };
  for (const char* loopback :
       {"127.0.0.1:7100", "127.0.0.2:7100", "\"[::1]:7100\"", "localhost:7100"}) {
    EXPECT_EQ(error_of(example_on(loopback)), "") << loopback;
  }
  const std::string e = error_of(example_on("0.0.0.0:7100"));
  EXPECT_NE(e.find("test.yaml:5:"), std::string::npos) << e;
  EXPECT_NE(e.find("the example secret"), std::string::npos) << e;
  EXPECT_NE(e.find("0.0.0.0:7100"), std::string::npos) << e;
  // Another secret is fine there.
  EXPECT_EQ(error_of(with("127.0.0.1:7100", "0.0.0.0:7100")), "");
}

// Left out, the control and metrics endpoints listen on loopback only: nothing but the
// services' own listeners is reachable from another machine unless the config says so.
TEST(ServerConfig, ControlAndMetricsDefaultToLoopback) {
  const ServerConfig defaults;
  EXPECT_TRUE(is_loopback_host(defaults.control.listen.host));
  EXPECT_EQ(defaults.control.listen.str(), "127.0.0.1:7100");
  EXPECT_EQ(kDefaultMetricsListen.str(), "127.0.0.1:9100");
  EXPECT_TRUE(is_loopback_host(kDefaultMetricsListen.host));

  std::string text = with("  listen: 127.0.0.1:7100\n", "");
  text = text.replace(text.find("metrics:\n  listen: \"[::1]:9100\"\n"),
                      std::string("metrics:\n  listen: \"[::1]:9100\"\n").size(), "metrics: {}\n");
  const ServerConfig c = parse(text);
  EXPECT_EQ(c.control.listen.str(), "127.0.0.1:7100");
  ASSERT_TRUE(c.metrics_listen.has_value());
  EXPECT_EQ(c.metrics_listen->str(), "127.0.0.1:9100");
  // No metrics section: no metrics endpoint at all.
  std::string none = kValid;
  none.erase(none.find("metrics:"), std::string("metrics:\n  listen: \"[::1]:9100\"\n").size());
  EXPECT_FALSE(parse(none).metrics_listen.has_value());
}

TEST(ServerConfig, IsLoopbackHost) {
  for (const char* h : {"127.0.0.1", "127.0.0.2", "::1", "localhost"})
    EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"0.0.0.0", "::", "192.0.2.1", "10.0.0.1", "example.org", ""})
    EXPECT_FALSE(is_loopback_host(h)) << h;
}

// A control endpoint anywhere, loopback or not, needs a secret of at least 16 characters: the
// server does not start without one (SecretRequiredAndLongEnough), and the examples' secret
// only on loopback (TheExampleSecretOnlyOnLoopback).
TEST(ServerConfig, NoSecretOnANonLoopbackAddressIsRefused) {
  std::string text = with("127.0.0.1:7100", "0.0.0.0:7100");
  text.erase(text.find("  secret: 0123456789abcdef0123\n"),
             std::string("  secret: 0123456789abcdef0123\n").size());
  const std::string e = error_of(text);
  EXPECT_NE(e.find("'secret' or 'secret_file'"), std::string::npos) << e;
}

TEST(ServerConfig, AuthThrottleSettings) {
  const ServerConfig d = parse(kValid);
  EXPECT_EQ(d.control.auth.failures, 5u);
  EXPECT_EQ(d.control.auth.window.count(), 60'000);
  EXPECT_EQ(d.control.auth.penalty.count(), 1'000);
  EXPECT_EQ(d.control.auth.max_penalty.count(), 60'000);
  EXPECT_EQ(d.control.auth.max_addresses, 4096u);
  EXPECT_EQ(d.control.max_region_bytes, uint64_t{4} << 30);
  const std::string at = "  agent_timeout_ms: 500";
  const ServerConfig c =
      parse(with(at, at + "\n  auth_failures: 3\n  auth_window_ms: 1000\n  auth_penalty_ms: 200\n"
                          "  auth_penalty_max_ms: 800\n  auth_tracked_addresses: 16\n"
                          "  max_region_bytes: 1048576"));
  EXPECT_EQ(c.control.auth.failures, 3u);
  EXPECT_EQ(c.control.auth.window.count(), 1000);
  EXPECT_EQ(c.control.auth.penalty.count(), 200);
  EXPECT_EQ(c.control.auth.max_penalty.count(), 800);
  EXPECT_EQ(c.control.auth.max_addresses, 16u);
  EXPECT_EQ(c.control.max_region_bytes, 1u << 20);
  EXPECT_EQ(parse(with(at, at + "\n  auth_failures: 0")).control.auth.failures, 0u);
  std::string e = error_of(with(at, at + "\n  auth_penalty_ms: 5000\n  auth_penalty_max_ms: 1000"));
  EXPECT_NE(e.find("auth_penalty_max_ms (1000) must be at least auth_penalty_ms (5000)"),
            std::string::npos)
      << e;
  e = error_of(with(at, at + "\n  auth_tracked_addresses: 0"));
  EXPECT_NE(e.find("auth_tracked_addresses"), std::string::npos) << e;
  e = error_of(with(at, at + "\n  max_region_bytes: 100"));
  EXPECT_NE(e.find("max_region_bytes"), std::string::npos) << e;
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

TEST(ServerConfig, RdmaQueuePairRetries) {
  const ServerConfig d = parse(kValid);
  EXPECT_EQ(d.control.rdma_ack_timeout, 18u);
  EXPECT_EQ(d.control.rdma_retry_count, 6u);
  const ServerConfig c = parse(with("agent_timeout_ms: 500",
                                    "agent_timeout_ms: 500\n"
                                    "  rdma_ack_timeout: 16\n"
                                    "  rdma_retry_count: 3"));
  EXPECT_EQ(c.control.rdma_ack_timeout, 16u);
  EXPECT_EQ(c.control.rdma_retry_count, 3u);
  std::string e =
      error_of(with("agent_timeout_ms: 500", "agent_timeout_ms: 500\n  rdma_ack_timeout: 32"));
  EXPECT_NE(e.find("test.yaml:8:"), std::string::npos) << e;
  EXPECT_NE(e.find("control.rdma_ack_timeout"), std::string::npos) << e;
  e = error_of(with("agent_timeout_ms: 500", "agent_timeout_ms: 500\n  rdma_retry_count: 8"));
  EXPECT_NE(e.find("test.yaml:8:"), std::string::npos) << e;
  EXPECT_NE(e.find("control.rdma_retry_count"), std::string::npos) << e;
}

TEST(ServerConfig, EngineThreads) {
  // Without the key the I/O threads run the engine, however many there are: no cut-over to a
  // few engine threads of their own past some count.
  for (const uint32_t io : {1u, 2u, 3u, 8u, 9u, 12u, 16u, 24u, 32u, 64u, 256u}) {
    const ServerConfig c = parse(with("io_threads: 3", "io_threads: " + std::to_string(io)));
    EXPECT_EQ(c.io_threads, io);
    EXPECT_EQ(c.engine_threads, 0u) << "io_threads " << io;
  }
  EXPECT_EQ(parse(with("io_threads: 3", "io_threads: 3\nengine_threads: 4")).engine_threads, 4u);
  // 0: each I/O thread hosts an engine thread, also past 8 of them.
  EXPECT_EQ(parse(with("io_threads: 3", "io_threads: 3\nengine_threads: 0")).engine_threads, 0u);
  EXPECT_EQ(parse(with("io_threads: 3", "io_threads: 32\nengine_threads: 0")).engine_threads, 0u);
  // Threads of their own, up to one per I/O thread a server may have.
  EXPECT_EQ(parse(with("io_threads: 3", "io_threads: 32\nengine_threads: 16")).engine_threads, 16u);
  EXPECT_EQ(parse(with("io_threads: 3", "io_threads: 3\nengine_threads: 256")).engine_threads,
            256u);
  for (const char* bad : {"engine_threads: 257", "engine_threads: two", "engine_threads: -1"}) {
    const std::string e = error_of(with("io_threads: 3", std::string("io_threads: 3\n") + bad));
    EXPECT_NE(e.find("test.yaml:2:"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("engine_threads"), std::string::npos) << bad << ": " << e;
  }
  for (const char* bad : {"io_threads: 0", "io_threads: 257", "io_threads: many"}) {
    const std::string e = error_of(with("io_threads: 3", bad));
    EXPECT_NE(e.find("test.yaml:1:"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("io_threads"), std::string::npos) << bad << ": " << e;
  }
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

// The shipped server configs, and the one the package installs, keep the control and metrics
// endpoints on loopback.
TEST(ShippedConfigs, ControlAndMetricsOnLoopback) {
  for (const char* name : {"echo-server.yaml", "kv-server.yaml", "face-server.yaml"}) {
    const ServerConfig c = load_server_config(std::string(CARACAL_CONFIGS_DIR "/") + name);
    EXPECT_TRUE(is_loopback_host(c.control.listen.host)) << name;
    ASSERT_TRUE(c.metrics_listen.has_value()) << name;
    EXPECT_TRUE(is_loopback_host(c.metrics_listen->host)) << name;
  }
  // deploy/etc/server.yaml reads /etc/caracal/secret, which a test machine lacks: parsed with
  // an inline secret in its place.
  std::ifstream in(CARACAL_DEPLOY_DIR "/etc/server.yaml");
  ASSERT_TRUE(in) << CARACAL_DEPLOY_DIR "/etc/server.yaml";
  std::stringstream text;
  text << in.rdbuf();
  std::string yaml = text.str();
  const std::string file_key = "secret_file: /etc/caracal/secret";
  ASSERT_NE(yaml.find(file_key), std::string::npos);
  yaml.replace(yaml.find(file_key), file_key.size(), "secret: 0123456789abcdef");
  const ServerConfig c = parse(yaml);
  EXPECT_TRUE(is_loopback_host(c.control.listen.host));
  ASSERT_TRUE(c.metrics_listen.has_value());
  EXPECT_TRUE(is_loopback_host(c.metrics_listen->host));
}

TEST(ShippedConfigs, KvServerParses) {
  const ServerConfig c = load_server_config(CARACAL_CONFIGS_DIR "/kv-server.yaml");
  ASSERT_EQ(c.destinations.size(), 1u);
  EXPECT_EQ(c.destinations[0].name, "memcached");
  EXPECT_EQ(c.services[0].dispatch, DispatchPolicy::kLeastLoaded);
}

TEST(ShippedConfigs, FaceServerParses) {
  const ServerConfig c = load_server_config(CARACAL_CONFIGS_DIR "/face-server.yaml");
  ASSERT_EQ(c.destinations.size(), 1u);
  EXPECT_EQ(c.destinations[0].timeout_ms, 1000u);
  EXPECT_EQ(c.services[0].max_message_bytes, 8192u);
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

// socket_buffer_bytes and spread: keys of Asio UDP listeners only.
TEST(ListenerConfig, SocketBufferBytesAndSpreadAreForAsioUdpSocketsOnly) {
  const auto with = [](const std::string& listener) {
    return std::string(R"(control: { listen: 127.0.0.1:1, secret: 0123456789abcdef }
services:
  - name: e
    max_message_bytes: 64
    listeners:
      - )") +
           listener + "\n";
  };
  const ServerConfig defaults = parse_server_config(
      config::load_yaml_text(with("{ protocol: udp, listen: 127.0.0.1:1 }"), "t.yaml"));
  EXPECT_EQ(defaults.services[0].listeners[0].socket_buffer_bytes,
            ListenerConfig::kDefaultSocketBufferBytes);
  EXPECT_FALSE(defaults.services[0].listeners[0].socket_buffer_set);
  const ServerConfig set = parse_server_config(config::load_yaml_text(
      with("{ protocol: udp, listen: 127.0.0.1:1, socket_buffer_bytes: 65536 }"), "t.yaml"));
  EXPECT_EQ(set.services[0].listeners[0].socket_buffer_bytes, 65536u);
  EXPECT_TRUE(set.services[0].listeners[0].socket_buffer_set);
  EXPECT_EQ(defaults.services[0].listeners[0].spread, ListenerConfig::Spread::kFlows);
  const ServerConfig spread = parse_server_config(config::load_yaml_text(
      with("{ protocol: udp, listen: 127.0.0.1:1, spread: datagrams }"), "t.yaml"));
  EXPECT_EQ(spread.services[0].listeners[0].spread, ListenerConfig::Spread::kDatagrams);
  const std::pair<const char*, const char*> refused[] = {
      {"{ protocol: tcp, listen: 127.0.0.1:1, framing: { kind: line }, socket_buffer_bytes: 65536 "
       "}",
       "Asio UDP listener"},
      {"{ protocol: udp, listen: 127.0.0.1:1, socket_buffer_bytes: 100 }", "4096"},
      {"{ protocol: udp, listen: 127.0.0.1:1, socket_buffer_bytes: -1 }", "t.yaml:6:"},
      {"{ protocol: tcp, listen: 127.0.0.1:1, framing: { kind: line }, spread: datagrams }",
       "Asio UDP listener"},
      {"{ protocol: udp, listen: 127.0.0.1:1, spread: packets }", "datagrams"},
  };
  for (const auto& [listener, says] : refused) {
    try {
      parse_server_config(config::load_yaml_text(with(listener), "t.yaml"));
      ADD_FAILURE() << "accepted " << listener;
    } catch (const config::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("t.yaml:6:"), std::string::npos) << e.what();
    }
  }
}

// The keys that bound a TCP listener's connections: defaults, values, ranges, and refusal on
// UDP listeners, each error at the listener's line.
TEST(ListenerConfig, ConnectionLimitsAndTimeouts) {
  const auto with = [](const std::string& listener) {
    return std::string(R"(control: { listen: 127.0.0.1:1, secret: 0123456789abcdef }
services:
  - name: e
    max_message_bytes: 64
    listeners:
      - )") +
           listener + "\n";
  };
  const auto parse_listener = [&](const std::string& listener) {
    return parse_server_config(config::load_yaml_text(with(listener), "t.yaml"))
        .services[0]
        .listeners[0];
  };
  const ListenerConfig d =
      parse_listener("{ protocol: tcp, listen: 127.0.0.1:1, framing: { kind: line } }");
  EXPECT_EQ(d.max_connections, ListenerConfig::kDefaultMaxConnections);
  EXPECT_EQ(d.max_connections, 16384u);
  EXPECT_EQ(d.max_connections_per_address, 0u);
  EXPECT_EQ(d.idle_timeout_ms, 300'000u);
  EXPECT_EQ(d.request_timeout_ms, 30'000u);
  EXPECT_EQ(d.max_queued_reply_bytes, 1u << 20);
  EXPECT_EQ(d.send_timeout_ms, 60'000u);

  const ListenerConfig set = parse_listener(
      "{ protocol: tcp, listen: 127.0.0.1:1, framing: { kind: line }, max_connections: 100, "
      "max_connections_per_address: 10, idle_timeout_ms: 5000, request_timeout_ms: 2000, "
      "max_queued_reply_bytes: 65536, send_timeout_ms: 3000 }");
  EXPECT_EQ(set.max_connections, 100u);
  EXPECT_EQ(set.max_connections_per_address, 10u);
  EXPECT_EQ(set.idle_timeout_ms, 5000u);
  EXPECT_EQ(set.request_timeout_ms, 2000u);
  EXPECT_EQ(set.max_queued_reply_bytes, 65536u);
  EXPECT_EQ(set.send_timeout_ms, 3000u);

  // 0 turns a timeout off.
  const ListenerConfig off = parse_listener(
      "{ protocol: tcp, listen: 127.0.0.1:1, framing: { kind: line }, idle_timeout_ms: 0, "
      "request_timeout_ms: 0, send_timeout_ms: 0 }");
  EXPECT_EQ(off.idle_timeout_ms, 0u);
  EXPECT_EQ(off.request_timeout_ms, 0u);
  EXPECT_EQ(off.send_timeout_ms, 0u);

  const std::string tcp = "{ protocol: tcp, listen: 127.0.0.1:1, framing: { kind: line }, ";
  const std::pair<std::string, const char*> refused[] = {
      {"{ protocol: udp, listen: 127.0.0.1:1, max_connections: 10 }", "TCP listeners only"},
      {"{ protocol: udp, listen: 127.0.0.1:1, idle_timeout_ms: 10 }", "TCP listeners only"},
      {"{ protocol: udp, listen: 127.0.0.1:1, send_timeout_ms: 10 }", "TCP listeners only"},
      {tcp + "max_connections: 0 }", "max_connections"},
      {tcp + "max_connections: 2000000 }", "max_connections"},
      {tcp + "max_connections: 10, max_connections_per_address: 11 }",
       "above the listener's max_connections (10)"},
      {tcp + "max_connections_per_address: -1 }", "max_connections_per_address"},
      {tcp + "idle_timeout_ms: 86400001 }", "idle_timeout_ms"},
      {tcp + "request_timeout_ms: soon }", "request_timeout_ms"},
      {tcp + "max_queued_reply_bytes: 100 }", "1024"},
      {tcp + "max_queued_reply_bytes: 2147483648 }", "max_queued_reply_bytes"},
      {tcp + "max_connection: 10 }", "max_connections_per_address"},  // a typo lists the keys
  };
  for (const auto& [listener, says] : refused) {
    try {
      parse_server_config(config::load_yaml_text(with(listener), "t.yaml"));
      ADD_FAILURE() << "accepted " << listener;
    } catch (const config::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("t.yaml:6:"), std::string::npos) << e.what();
    }
  }
}

// A server with a DPDK port: its listeners share the port's address and differ by UDP port.
const char* kDpdk = R"yaml(control: { listen: 127.0.0.1:7100, secret: 0123456789abcdef0123 }
dpdk:
  eal_args: [--no-huge, -m, "256", "--vdev=net_af_packet0,iface=veth0,qpairs=2", "--lcores=0@(0-1),1@(0-1),2@(0-1)"]
  port: net_af_packet0
  ipv4: 192.0.2.2
  queues: 2
  burst: 64
  mbufs: 16383
  checksum_offload: false
  idle_sleep_us: 5
services:
  - name: echo
    max_message_bytes: 1024
    listeners:
      - { protocol: udp, kind: dpdk, listen: 192.0.2.2:7000 }
      - { protocol: udp, listen: 0.0.0.0:7000 }
  - name: kv
    max_message_bytes: 1024
    listeners:
      - { protocol: udp, kind: dpdk, listen: 0.0.0.0:7001 }
)yaml";

std::string dpdk_with(const std::string& from, const std::string& to) {
  std::string s = kDpdk;
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(ServerConfig, DpdkSectionAndListeners) {
  if (!dpdk_available()) {
    // Built without DPDK: the first dpdk listener is refused where it is, with the reason.
    std::string e = error_of(kDpdk);
    EXPECT_NE(e.find("test.yaml:15:"), std::string::npos) << e;
    EXPECT_NE(e.find("built without DPDK"), std::string::npos) << e;
    // And so is the section, without dpdk listeners.
    e = error_of(with("services:", "dpdk: { ipv4: 192.0.2.2 }\nservices:"));
    EXPECT_NE(e.find("test.yaml:10:7:"), std::string::npos) << e;
    EXPECT_NE(e.find("dpdk: this snic_server was built without DPDK"), std::string::npos) << e;
    EXPECT_NE(e.find("built without DPDK"), std::string::npos) << e;
    return;
  }
  const ServerConfig c = parse(kDpdk);
  ASSERT_TRUE(c.dpdk.has_value());
  EXPECT_EQ(c.dpdk->eal_args.size(), 5u);
  EXPECT_EQ(c.dpdk->eal_args[3], "--vdev=net_af_packet0,iface=veth0,qpairs=2");
  EXPECT_EQ(c.dpdk->port, "net_af_packet0");
  EXPECT_EQ(c.dpdk->ipv4, "192.0.2.2");
  EXPECT_EQ(c.dpdk->queues, 2);
  EXPECT_EQ(c.dpdk->burst, 64);
  EXPECT_EQ(c.dpdk->mbufs, 16383u);
  EXPECT_FALSE(c.dpdk->checksum_offload);
  EXPECT_EQ(c.dpdk->idle_sleep_us, 5u);
  EXPECT_EQ(c.services[0].listeners[0].kind, ListenerKind::kDpdk);
  EXPECT_EQ(c.services[0].listeners[1].kind, ListenerKind::kAsio);  // same port, other stack
  EXPECT_EQ(c.services[1].listeners[0].kind, ListenerKind::kDpdk);
}

TEST(ServerConfig, DpdkMistakesNameTheirLine) {
  if (!dpdk_available()) {
    const std::string e = error_of(with("{ protocol: udp, listen: 0.0.0.0:7000 }",
                                        "{ protocol: udp, kind: dpdk, listen: 0.0.0.0:7000 }"));
    EXPECT_NE(e.find("test.yaml:15:"), std::string::npos) << e;
    EXPECT_NE(e.find("services[0].listeners[0].kind"), std::string::npos) << e;
    EXPECT_NE(e.find("built without DPDK"), std::string::npos) << e;
    return;
  }
  std::string e = error_of(with("{ protocol: udp, listen: 0.0.0.0:7000 }",
                                "{ protocol: udp, kind: dpdk, listen: 0.0.0.0:7000 }"));
  EXPECT_NE(e.find("test.yaml:15:"), std::string::npos) << e;
  EXPECT_NE(e.find("needs the top-level 'dpdk' section"), std::string::npos) << e;
  e = error_of(dpdk_with("protocol: udp, kind: dpdk, listen: 192.0.2.2:7000",
                         "protocol: tcp, kind: dpdk, listen: 192.0.2.2:7000"));
  EXPECT_NE(e.find("the DPDK port serves UDP only"), std::string::npos) << e;
  e = error_of(
      dpdk_with("kind: dpdk, listen: 192.0.2.2:7000", "kind: dpdk, listen: 192.0.2.9:7000"));
  EXPECT_NE(e.find("test.yaml:15:"), std::string::npos) << e;
  EXPECT_NE(e.find("the dpdk port's address 192.0.2.2"), std::string::npos) << e;
  e = error_of(dpdk_with("kind: dpdk, listen: 192.0.2.2:7000", "kind: dpdk, listen: 192.0.2.2:0"));
  EXPECT_NE(e.find("a port other than 0"), std::string::npos) << e;
  e = error_of(dpdk_with("listen: 0.0.0.0:7001", "listen: 0.0.0.0:7000"));
  EXPECT_NE(e.find("test.yaml:20:"), std::string::npos) << e;
  EXPECT_NE(e.find("already used by another dpdk listener"), std::string::npos) << e;
  e = error_of(dpdk_with("ipv4: 192.0.2.2", "ipv4: 224.0.0.1"));
  EXPECT_NE(e.find("test.yaml:5:"), std::string::npos) << e;
  EXPECT_NE(e.find("multicast"), std::string::npos) << e;
  e = error_of(dpdk_with("mbufs: 16383", "mbufs: 1000"));
  EXPECT_NE(e.find("mbufs (1000) must be at least"), std::string::npos) << e;
  e = error_of(dpdk_with("queues: 2", "queue: 2"));
  EXPECT_NE(e.find("unknown setting 'queue'"), std::string::npos) << e;
  std::string no_dpdk_listener =
      dpdk_with("      - { protocol: udp, kind: dpdk, listen: 0.0.0.0:7001 }",
                "      - { protocol: udp, listen: 0.0.0.0:7001 }");
  const std::string first = "      - { protocol: udp, kind: dpdk, listen: 192.0.2.2:7000 }\n";
  no_dpdk_listener.erase(no_dpdk_listener.find(first), first.size());
  e = error_of(no_dpdk_listener);
  EXPECT_NE(e.find("no listener has kind: dpdk"), std::string::npos) << e;
}

}  // namespace
}  // namespace caracal::server
