// A handler with state (setup.hpp) in AgentRuntime on the CPU accelerator: a setup that fails
// stops the agent before it registers, a table set up once is read by every worker (and a
// counter they share is written with atomics), the state survives re-registration, and its
// teardown runs at exit, after the workers have stopped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "caracal/agent/runtime.hpp"
#include "caracal/agent/setup.hpp"
#include "caracal/agent/shm_region.hpp"
#include "fake_server.hpp"

namespace caracal::agent {
namespace {

using test::FakeControlServer;
using test::RegionPeer;

constexpr const char* kSecret = "0123456789abcdef-secret";

// The view every worker copies: the table and the counters, in the accelerator's memory.
struct TableLookup {
  const uint32_t* table = nullptr;
  uint32_t rows = 0;
  uint64_t* reads = nullptr;  // [workers]: shared and mutable, so written with atomics

  // The request is a row (4 bytes); the reply, that row's entry and the worker that read it.
  void operator()(const accel::Request& req, accel::Response& resp, accel::Context& ctx) const {
    uint32_t row = 0;
    if (req.size != sizeof(row)) return resp.set_error("a row is 4 bytes");
    std::memcpy(&row, req.data, sizeof(row));
    if (row >= rows) return resp.set_error("no such row");
    const uint32_t reply[2] = {table[row], ctx.worker()};
    std::memcpy(resp.data, reply, sizeof(reply));
    resp.size = sizeof(reply);
    std::atomic_ref<uint64_t>(reads[ctx.worker()]).fetch_add(1, std::memory_order_relaxed);
  }
};
static_assert(std::is_trivially_copyable_v<TableLookup>);

uint32_t entry(uint32_t row) {
  return row * 7 + 1;
}

// What the tests see of the state's life.
struct Life {
  std::mutex m;
  int setups = 0;
  int teardowns = 0;
  AcceleratorChoice accelerator;
  uint32_t workers = 0;
  std::vector<uint64_t> reads_at_teardown;
};
Life& life() {
  static Life l;
  return l;
}

class Table {
 public:
  struct Config {
    uint32_t rows;
    std::string fail;
  };
  static Config configure(Settings& s) {
    return Config{s.integer<uint32_t>("rows", 64, 1, 1u << 20),
                  s.choice("fail", "no", {"no", "throw", "status"})};
  }

  static Result<Table> setup(const Config& c, SetupContext& ctx) {
    if (c.fail == "throw") throw SetupError("cannot load the table from /nowhere: no such file");
    if (c.fail == "status") {
      return Status(StatusCode::kUnavailable, "the table's source is down");
    }
    std::vector<uint32_t> rows(c.rows);
    for (uint32_t r = 0; r < c.rows; ++r)
      rows[r] = entry(r);
    Table t;
    t.view_.table = ctx.upload(rows, "table");
    t.view_.rows = c.rows;
    t.workers_ = ctx.cpu_workers();
    t.view_.reads = ctx.allocate<uint64_t>(t.workers_, "read counters");
    std::lock_guard lock(life().m);
    ++life().setups;
    life().accelerator = ctx.accelerator();
    life().workers = t.workers_;
    return t;
  }

  TableLookup handler() const { return view_; }

  void teardown(SetupContext& ctx) {
    std::vector<uint64_t> reads(workers_);
    ctx.copy_to_host(std::span<uint64_t>(reads), view_.reads, "read counters");
    std::lock_guard lock(life().m);
    ++life().teardowns;
    life().reads_at_teardown = reads;
  }

 private:
  TableLookup view_;
  uint32_t workers_ = 0;
};
static_assert(StatefulHandler<Table>);

ServiceConfig service(const std::string& name, uint32_t queues) {
  ServiceConfig s;
  s.name = name;
  s.queues = queues;
  s.ring_capacity = 64;
  s.slot_bytes = 128;
  s.max_message_bytes = 256;
  return s;
}

AgentConfig agent_config(uint16_t port, std::vector<ServiceConfig> services, uint32_t workers) {
  AgentConfig c;
  c.agent = "state-test";
  c.server = config::HostPort{"127.0.0.1", port};
  c.secret = kSecret;
  c.accelerator.kind = AcceleratorKind::kCpu;
  c.reconnect_interval_ms = 20;
  c.cpu.workers = workers;
  c.services = std::move(services);
  return c;
}

// The backends of Table with `handler` (YAML) as every service's settings.
HandlerBackends table_backends(const AgentConfig& c, const std::string& handler) {
  HandlerBackends b = make_stateful_backends<Table>();
  AgentConfig with = c;
  for (ServiceConfig& s : with.services)
    s.handler = config::load_yaml_text(handler, "agent.yaml");
  configure_services(with, b, {});
  return b;
}

// AgentRuntime::run() on its own thread; stopped and joined (bounded) on destruction.
class RunningAgent {
 public:
  RunningAgent(AgentConfig config, HandlerBackends backends)
      : runtime_(std::move(config), std::move(backends), options()),
        thread_([this] { status_ = runtime_.run(); }) {}
  ~RunningAgent() {
    runtime_.request_stop();
    (void)join();
  }
  static RuntimeOptions options() {
    RuntimeOptions o;
    o.connect_timeout = std::chrono::milliseconds(2000);
    o.bye_timeout = std::chrono::milliseconds(5000);
    return o;
  }
  AgentRuntime& runtime() { return runtime_; }
  Status join() {
    if (thread_.joinable()) {
      accel::test::finish_within("AgentRuntime::run()", [&] { thread_.join(); });
    }
    return status_;
  }

 private:
  AgentRuntime runtime_;
  Status status_;
  std::thread thread_;
};

void reset_life() {
  std::lock_guard lock(life().m);
  life().setups = 0;
  life().teardowns = 0;
  life().workers = 0;
  life().reads_at_teardown.clear();
}

// Registers the agent's one service and returns the server's view of it.
std::unique_ptr<RegionPeer> register_service(FakeControlServer& server) {
  if (!server.accept_agent()) throw std::runtime_error("the agent did not connect");
  server.expect<control::Hello>();
  server.send(control::Welcome{50, 10000});
  const auto region = server.expect<control::RegionAnnounce>();
  auto peer = std::make_unique<RegionPeer>(region.shm_name);
  server.send(control::Attached{region.service});
  return peer;
}

std::vector<std::vector<std::byte>> rows_requested(uint32_t n, uint32_t rows) {
  std::vector<std::vector<std::byte>> out;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t row = (i * 13) % rows;
    std::vector<std::byte> p(sizeof(row));
    std::memcpy(p.data(), &row, sizeof(row));
    out.push_back(std::move(p));
  }
  return out;
}

// Every reply is its row's entry; returns the workers that answered.
std::set<uint32_t> expect_rows(RegionPeer& peer, uint32_t n, uint32_t rows) {
  const auto requests = rows_requested(n, rows);
  const auto replies = peer.exchange(requests);
  std::set<uint32_t> workers;
  EXPECT_EQ(replies.size(), n);
  for (const auto& [token, reply] : replies) {
    uint32_t row = 0;
    uint32_t got[2] = {0, 0};
    std::memcpy(&row, requests[token].data(), sizeof(row));
    EXPECT_EQ(reply.flags & mqueue::kSlotError, 0) << "token " << token;
    EXPECT_EQ(reply.data.size(), sizeof(got)) << "token " << token;
    if (reply.data.size() != sizeof(got)) continue;
    std::memcpy(got, reply.data.data(), sizeof(got));
    EXPECT_EQ(got[0], entry(row)) << "token " << token;
    workers.insert(got[1]);
  }
  return workers;
}

void detach(FakeControlServer& server, RunningAgent& agent) {
  agent.runtime().request_stop();
  server.expect<control::Bye>();
  server.send(control::Bye{});
  const Status s = agent.join();
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(HandlerState, ATableSetUpOnceIsReadByEveryWorkerAndTornDownAtExit) {
  reset_life();
  FakeControlServer server;
  const AgentConfig c = agent_config(server.port(), {service("table", 4)}, 4);
  RunningAgent agent(c, table_backends(c, "rows: 100\n"));
  auto peer = register_service(server);
  EXPECT_EQ(expect_rows(*peer, 800, 100), (std::set<uint32_t>{0, 1, 2, 3}));
  {
    std::lock_guard lock(life().m);
    EXPECT_EQ(life().setups, 1);
    EXPECT_EQ(life().teardowns, 0);
    EXPECT_EQ(life().accelerator.str(), "cpu");
    EXPECT_EQ(life().workers, 4u);
  }

  // The server goes away: the workers stop, the state stays; the new registration's workers
  // get the same view.
  server.drop_client();
  auto again = register_service(server);
  EXPECT_EQ(expect_rows(*again, 400, 100), (std::set<uint32_t>{0, 1, 2, 3}));
  detach(server, agent);

  std::lock_guard lock(life().m);
  EXPECT_EQ(life().setups, 1);
  EXPECT_EQ(life().teardowns, 1);
  // Torn down after every worker stopped: the counters hold every request.
  ASSERT_EQ(life().reads_at_teardown.size(), 4u);
  uint64_t total = 0;
  for (uint64_t r : life().reads_at_teardown) {
    EXPECT_GT(r, 0u);
    total += r;
  }
  EXPECT_EQ(total, 1200u);
}

// Both ways to fail: an exception, a Result with an error.
void expect_setup_failure_before_registration(const std::string& fail, const std::string& what) {
  reset_life();
  FakeControlServer server;
  const AgentConfig c = agent_config(server.port(), {service("first", 1), service("table", 1)}, 2);
  HandlerBackends b = make_stateful_backends<Table>();
  AgentConfig with = c;
  with.services[1].handler = config::load_yaml_text("fail: " + fail + "\n", "agent.yaml");
  configure_services(with, b, {});
  RunningAgent agent(with, std::move(b));
  const Status s = agent.join();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("service 'table': handler setup on cpu failed: " + what),
            std::string::npos)
      << s.message();
  // Nothing reached the server, and the service set up before the failure was torn down.
  EXPECT_FALSE(server.accept_agent(std::chrono::milliseconds(200)));
  std::lock_guard lock(life().m);
  EXPECT_EQ(life().setups, 1);
  EXPECT_EQ(life().teardowns, 1);
}

TEST(HandlerState, ASetupThatThrowsStopsTheAgentBeforeItRegisters) {
  expect_setup_failure_before_registration("throw",
                                           "cannot load the table from /nowhere: no such file");
}

TEST(HandlerState, ASetupThatReturnsAnErrorStopsTheAgentBeforeItRegisters) {
  expect_setup_failure_before_registration("status", "the table's source is down");
}

// Without configure_services (an embedding program), the runtime reads the mapping itself; a
// bad setting then fails the setup, still before registration.
TEST(HandlerState, SettingsReadByTheRuntimeWhenNotConfiguredBefore) {
  reset_life();
  FakeControlServer server;
  AgentConfig c = agent_config(server.port(), {service("table", 1)}, 1);
  c.services[0].handler = config::load_yaml_text("rows: 0\n", "agent.yaml");
  RunningAgent agent(c, make_stateful_backends<Table>());
  const Status s = agent.join();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("agent.yaml:1:7: rows: 0 is out of range [1, 1048576]"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(server.accept_agent(std::chrono::milliseconds(200)));
}

}  // namespace
}  // namespace caracal::agent
