// AgentRuntime against a scripted control endpoint: registration, heartbeats, echo through the
// announced regions, detach, refusals, a lost server and reconnection with a new epoch.
#include "caracal/agent/runtime.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "caracal/agent/shm_region.hpp"
#include "echo.hpp"
#include "fake_server.hpp"

namespace caracal::agent {
namespace {

using test::FakeControlServer;
using test::RegionPeer;
using test::shm_exists;

constexpr const char* kSecret = "0123456789abcdef-secret";

ServiceConfig service(const std::string& name, uint32_t queues,
                      std::vector<std::string> destinations = {}) {
  ServiceConfig s;
  s.name = name;
  s.queues = queues;
  s.ring_capacity = 64;
  s.slot_bytes = 128;
  s.max_message_bytes = 1024;
  for (std::string& d : destinations)
    s.client_queues.push_back(ClientQueueConfig{std::move(d)});
  return s;
}

AgentConfig agent_config(uint16_t port, std::vector<ServiceConfig> services) {
  AgentConfig c;
  c.agent = "runtime-test";
  c.server = config::HostPort{"127.0.0.1", port};
  c.secret = kSecret;
  c.accelerator.kind = AcceleratorKind::kAuto;
  c.reconnect_interval_ms = 20;
  c.services = std::move(services);
  return c;
}

RuntimeOptions fast_options() {
  RuntimeOptions o;
  o.connect_timeout = std::chrono::milliseconds(2000);
  o.handshake_timeout = std::chrono::milliseconds(5000);
  o.bye_timeout = std::chrono::milliseconds(5000);
  return o;
}

std::string region_name(const std::string& service) {
  return region_shm_name("runtime-test", getpid(), service);
}

// AgentRuntime::run() on its own thread; stopped and joined (bounded) on destruction.
class RunningAgent {
 public:
  explicit RunningAgent(AgentConfig config, RuntimeOptions options = fast_options(),
                        HandlerBackends backends = make_backends(examples::Echo{}))
      : runtime_(std::move(config), std::move(backends), options), thread_([this] {
          status_ = runtime_.run();
          done_.store(true, std::memory_order_release);  // pairs with the acquire in done()
        }) {}
  ~RunningAgent() {
    runtime_.request_stop();
    (void)join();
  }

  AgentRuntime& runtime() { return runtime_; }
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Waits for run() to return and gives its status.
  Status join() {
    if (thread_.joinable()) {
      accel::test::finish_within("AgentRuntime::run()", [&] { thread_.join(); });
    }
    return status_;
  }

 private:
  AgentRuntime runtime_;
  Status status_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Accepts the agent and answers its hello with a welcome; returns the hello.
control::Hello welcome_agent(FakeControlServer& server, uint32_t heartbeat_ms = 50,
                             uint32_t timeout_ms = 10000) {
  if (!server.accept_agent()) throw std::runtime_error("the agent did not connect");
  control::Hello hello = server.expect<control::Hello>();
  server.send(control::Welcome{heartbeat_ms, timeout_ms});
  return hello;
}

std::vector<std::vector<std::byte>> some_payloads(size_t n) {
  std::vector<std::vector<std::byte>> out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(
        accel::test::to_bytes("request " + std::to_string(i) + std::string(i % 700, 'x')));
  return out;
}

// The clean end of a test with a registered agent: stop, bye both ways, run() returns OK.
void detach(FakeControlServer& server, RunningAgent& agent) {
  agent.runtime().request_stop();
  server.expect<control::Bye>();
  server.send(control::Bye{});
  const Status s = agent.join();
  EXPECT_TRUE(s.ok()) << s.message();
}

void expect_echoed(RegionPeer& peer, size_t n) {
  const auto payloads = some_payloads(n);
  const auto replies = peer.exchange(payloads);
  ASSERT_EQ(replies.size(), n);
  for (const auto& [token, reply] : replies)
    ASSERT_EQ(reply.data, payloads[token]) << "token " << token;
}

TEST(AgentRuntime, RegistersServesHeartbeatsAndDetaches) {
  FakeControlServer server;
  RunningAgent agent(
      agent_config(server.port(), {service("echo", 2), service("kv", 1, {"memcached", "redis"})}));

  const control::Hello hello = welcome_agent(server);
  EXPECT_EQ(hello.protocol, control::kProtocolVersion);
  EXPECT_EQ(hello.agent, "runtime-test");
  EXPECT_EQ(hello.secret, kSecret);
  EXPECT_NE(hello.epoch, 0u);
  EXPECT_EQ(hello.accelerator, "cpu");

  const auto echo = server.expect<control::RegionAnnounce>();
  EXPECT_EQ(echo.service, "echo");
  EXPECT_EQ(echo.transport, "shm");
  EXPECT_EQ(echo.shm_name, region_name("echo"));
  EXPECT_TRUE(echo.destinations.empty());
  RegionPeer echo_peer(echo.shm_name);
  EXPECT_EQ(echo_peer.header().agent_epoch, hello.epoch);
  EXPECT_EQ(echo_peer.header().region_bytes, echo.region_bytes);
  EXPECT_EQ(echo_peer.header().server_queue_count, 2u);
  // One region at a time: nothing else until this one is attached.
  EXPECT_FALSE(server.receive_skipping_heartbeats(true, std::chrono::milliseconds(150)));
  server.send(control::Attached{"echo"});

  const auto kv = server.expect<control::RegionAnnounce>();
  EXPECT_FALSE(shm_exists(echo.shm_name));  // removed on `attached`, before the next region
  EXPECT_EQ(kv.service, "kv");
  EXPECT_EQ(kv.destinations, (std::vector<std::string>{"memcached", "redis"}));
  RegionPeer kv_peer(kv.shm_name);
  EXPECT_EQ(kv_peer.header().client_queue_count, 2u);
  EXPECT_EQ(kv_peer.header().agent_epoch, hello.epoch);
  server.send(control::Attached{"kv"});
  ASSERT_TRUE(accel::test::wait_until([&] { return agent.runtime().registrations() == 1; }));
  EXPECT_FALSE(shm_exists(kv.shm_name));

  expect_echoed(echo_peer, 300);
  expect_echoed(kv_peer, 50);

  // Heartbeats keep coming every 50 ms while the server answers them.
  const uint64_t before = server.heartbeats();
  const auto until = test::Clock::now() + std::chrono::milliseconds(400);
  while (test::Clock::now() < until) {
    ASSERT_FALSE(server.receive_skipping_heartbeats(true, until - test::Clock::now()));
  }
  EXPECT_GE(server.heartbeats() - before, 2u);

  agent.runtime().request_stop();
  server.expect<control::Bye>();
  // Until the server's bye, the accelerators still serve (replies in flight go out).
  expect_echoed(echo_peer, 20);
  EXPECT_EQ(echo_peer.stop_word(), 0u);
  server.send(control::Bye{});
  EXPECT_TRUE(server.wait_closed());
  const Status s = agent.join();
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(echo_peer.stop_word(), 1u);
  EXPECT_EQ(kv_peer.stop_word(), 1u);
}

TEST(AgentRuntime, RefusedHelloEndsTheRunWithTheServersMessage) {
  FakeControlServer server;
  RunningAgent agent(agent_config(server.port(), {service("echo", 1)}));
  ASSERT_TRUE(server.accept_agent());
  server.expect<control::Hello>();
  server.send(control::Refused{"", "wrong secret"});
  server.drop_client();
  const Status s = agent.join();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("refused agent 'runtime-test': wrong secret"), std::string::npos)
      << s.message();
  EXPECT_FALSE(shm_exists(region_name("echo")));
}

TEST(AgentRuntime, RefusedRegionEndsTheRunAndRemovesTheName) {
  FakeControlServer server;
  RunningAgent agent(agent_config(server.port(), {service("echo", 1)}));
  welcome_agent(server);
  const auto region = server.expect<control::RegionAnnounce>();
  EXPECT_TRUE(shm_exists(region.shm_name));
  server.send(control::Refused{"echo", "max_message_bytes 1024 is below the service's 4096"});
  server.expect<control::Bye>();
  server.send(control::Bye{});
  const Status s = agent.join();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("service 'echo'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("below the service's 4096"), std::string::npos) << s.message();
  EXPECT_FALSE(shm_exists(region.shm_name));
}

// Registers the agent's one service and returns the server's view of it.
std::unique_ptr<RegionPeer> register_echo(FakeControlServer& server, uint64_t* epoch,
                                          uint32_t heartbeat_ms = 50, uint32_t timeout_ms = 10000) {
  *epoch = welcome_agent(server, heartbeat_ms, timeout_ms).epoch;
  const auto region = server.expect<control::RegionAnnounce>();
  auto peer = std::make_unique<RegionPeer>(region.shm_name);
  server.send(control::Attached{region.service});
  return peer;
}

// Echoes, except "throw:<what>", which throws an exception saying <what>.
struct ThrowOnCommand {
  void operator()(const accel::Request& req, accel::Response& resp, accel::Context&) {
    const std::string_view text(reinterpret_cast<const char*>(req.data), req.size);
    if (text.starts_with("throw:"))
      throw std::runtime_error("internal " + std::string(text.substr(6)));
    std::memcpy(resp.data, req.data, req.size);
    resp.size = req.size;
  }
};

// The lines logged through it, kept for a test to read while other threads log.
class LinesSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

// A handler's exception is for the agent's log: the client's error reply says only that the
// handler failed, and the log says how many failed and why, a line for the lot.
TEST(AgentRuntime, HandlerErrorsAreLoggedAndNotSentToTheClient) {
  auto sink = std::make_shared<LinesSink>();
  const std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("runtime-test", sink));
  struct Restore {
    std::shared_ptr<spdlog::logger> logger;
    ~Restore() { spdlog::set_default_logger(logger); }
  } restore{previous};

  FakeControlServer server;
  AgentConfig c = agent_config(server.port(), {service("echo", 1)});
  c.accelerator.kind = AcceleratorKind::kCpu;
  RunningAgent agent(c, fast_options(), make_backends(ThrowOnCommand{}));
  uint64_t epoch = 0;
  auto peer = register_echo(server, &epoch);
  ASSERT_TRUE(accel::test::wait_until([&] { return agent.runtime().registrations() == 1; }));

  const std::vector<std::string> texts = {"a", "throw:key 1", "b", "throw:key 2"};
  std::vector<std::vector<std::byte>> payloads;
  for (const std::string& t : texts)
    payloads.push_back(accel::test::to_bytes(t));
  const auto replies = peer->exchange(payloads);
  ASSERT_EQ(replies.size(), texts.size());
  for (const auto& [token, reply] : replies) {
    if (texts[token].starts_with("throw:")) {
      EXPECT_TRUE(reply.is_error()) << texts[token];
      EXPECT_EQ(reply.text(), accel::kHandlerFailedReply);
    } else {
      EXPECT_EQ(reply.text(), texts[token]);
    }
  }
  // Both counted (in one line, or two a second apart should the log look between them), the
  // last line with the second one's reason.
  const std::string prefix = "service 'echo': the handler failed ";
  uint64_t counted = 0;
  std::string last;
  const auto logged = [&] {
    counted = 0;
    for (const std::string& line : sink->lines()) {
      if (!line.starts_with(prefix)) continue;
      counted += std::stoull(line.substr(prefix.size()));
      last = line;
    }
    return counted == 2 && last.ends_with("; the last: the handler threw: internal key 2");
  };
  EXPECT_TRUE(accel::test::wait_until(logged)) << counted << " counted; the last line: " << last;
  detach(server, agent);
}

// rdma.region_memory gpu on the CPU accelerator (a config an embedding program filled in
// itself; the parser refuses it at its line): the service fails with why before anything is
// announced, and the agent says bye.
TEST(AgentRuntime, RegionInGpuMemoryWithoutTheGpuAcceleratorEndsTheRun) {
  FakeControlServer server;
  AgentConfig c = agent_config(server.port(), {service("echo", 1)});
  c.accelerator.kind = AcceleratorKind::kCpu;
  c.transport = TransportKind::kRdma;
  c.rdma.bind_address = "127.0.0.1";
  c.rdma.region_memory = RegionMemory::kGpu;
  RunningAgent agent(c);
  welcome_agent(server);
  server.expect<control::Bye>();  // no region announced before it
  server.send(control::Bye{});
  const Status s = agent.join();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(
                "service 'echo': rdma.region_memory gpu needs the GPU accelerator, and this agent "
                "runs on cpu"),
            std::string::npos)
      << s.message();
}

TEST(AgentRuntime, SilentServerIsLeftAndTheAgentRegistersAgainWithANewEpoch) {
  FakeControlServer server;
  RunningAgent agent(agent_config(server.port(), {service("echo", 1)}));
  // The agent's last message from the server is the `attached` sent inside register_echo, so
  // it gives up no earlier than agent_timeout_ms after `started`.
  const auto started = test::Clock::now();
  uint64_t first_epoch = 0;
  auto first = register_echo(server, &first_epoch, 20, 300);
  // Heartbeats go unanswered: after agent_timeout_ms the agent gives up on this connection.
  while (!server.closed()) {
    ASSERT_LT(test::Clock::now() - started, accel::test::kWaitLimit);
    server.receive_skipping_heartbeats(/*answer_heartbeats=*/false, std::chrono::seconds(1));
  }
  EXPECT_GE(test::Clock::now() - started, std::chrono::milliseconds(300));
  EXPECT_GE(server.heartbeats(), 2u);  // they kept coming while unanswered
  EXPECT_EQ(first->stop_word(), 1u);   // its accelerator was stopped

  uint64_t second_epoch = 0;
  auto second = register_echo(server, &second_epoch);
  EXPECT_NE(second_epoch, first_epoch);
  EXPECT_EQ(second->header().agent_epoch, second_epoch);
  expect_echoed(*second, 10);
  ASSERT_TRUE(accel::test::wait_until([&] { return agent.runtime().registrations() == 2; }));
  detach(server, agent);
  EXPECT_EQ(second->stop_word(), 1u);
}

TEST(AgentRuntime, ClosedConnectionOrProtocolErrorMeansANewRegistration) {
  FakeControlServer server;
  RunningAgent agent(agent_config(server.port(), {service("echo", 1)}));
  uint64_t e1 = 0;
  auto first = register_echo(server, &e1);
  ASSERT_TRUE(accel::test::wait_until([&] { return agent.runtime().registrations() == 1; }));
  server.drop_client();  // the server went away

  uint64_t e2 = 0;
  auto second = register_echo(server, &e2);
  EXPECT_NE(e2, e1);
  EXPECT_EQ(first->stop_word(), 1u);
  ASSERT_TRUE(accel::test::wait_until([&] { return agent.runtime().registrations() == 2; }));
  server.send(control::Attached{"nope"});  // not a service awaiting attachment
  EXPECT_TRUE(server.wait_closed());

  uint64_t e3 = 0;
  auto third = register_echo(server, &e3);
  EXPECT_NE(e3, e2);
  EXPECT_EQ(second->stop_word(), 1u);
  expect_echoed(*third, 10);
  detach(server, agent);
}

TEST(AgentRuntime, WaitsForTheServerToComeUp) {
  uint16_t port = 0;
  {
    FakeControlServer probe;  // a free port, closed again
    port = probe.port();
  }
  RunningAgent agent(agent_config(port, {service("echo", 1)}));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // several refused attempts
  EXPECT_FALSE(agent.done());
  FakeControlServer server(port);
  uint64_t epoch = 0;
  auto peer = register_echo(server, &epoch);
  expect_echoed(*peer, 10);
  detach(server, agent);
}

TEST(AgentRuntime, UnansweredByeIsBounded) {
  FakeControlServer server;
  RuntimeOptions o = fast_options();
  o.bye_timeout = std::chrono::milliseconds(200);
  RunningAgent agent(agent_config(server.port(), {service("echo", 1)}), o);
  uint64_t epoch = 0;
  auto peer = register_echo(server, &epoch);
  ASSERT_TRUE(accel::test::wait_until([&] { return agent.runtime().registrations() == 1; }));
  const auto asked = test::Clock::now();
  agent.runtime().request_stop();
  server.expect<control::Bye>();  // and never answered
  const Status s = agent.join();
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_GE(test::Clock::now() - asked, std::chrono::milliseconds(200));
  EXPECT_EQ(peer->stop_word(), 1u);
}

TEST(AgentRuntime, StopWhileTheServerIsAway) {
  uint16_t port = 0;
  {
    FakeControlServer probe;
    port = probe.port();
  }
  RunningAgent agent(agent_config(port, {service("echo", 1)}));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  agent.runtime().request_stop();
  const Status s = agent.join();
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(shm_exists(region_name("echo")));
}

}  // namespace
}  // namespace caracal::agent
