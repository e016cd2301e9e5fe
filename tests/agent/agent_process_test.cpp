// caracal_echo_agent as a process: --check-config on good and bad configurations, --version,
// and a whole run against a scripted control endpoint ended by SIGTERM or by a refusal.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "caracal/agent/shm_region.hpp"
#include "fake_server.hpp"

extern char** environ;

namespace caracal::agent {
namespace {

namespace fs = std::filesystem;
using test::FakeControlServer;
using test::shm_exists;

// A temporary directory for one test's files, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "caracal-agent-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path path_of(const std::string& name) const { return path_ / name; }
  fs::path file(const std::string& name, const std::string& text = "") const {
    const fs::path p = path_ / name;
    if (!text.empty()) std::ofstream(p) << text;
    return p;
  }

 private:
  fs::path path_;
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The agent started with `args`, its stdout and stderr going to files of `dir`.
class AgentProcess {
 public:
  AgentProcess(const TempDir& dir, std::vector<std::string> args)
      : out_(dir.file("stdout")), err_(dir.file("stderr")) {
    args.insert(args.begin(), CARACAL_ECHO_AGENT);
    std::vector<char*> argv;
    for (std::string& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&actions, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("posix_spawn " + std::string(argv[0]) + " failed");
  }
  ~AgentProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  void signal(int sig) { kill(pid_, sig); }

  // The exit status, or -1 (and the process killed) when it does not exit within `limit`.
  int wait_exit(std::chrono::nanoseconds limit = test::kWaitLimit) {
    const auto deadline = test::Clock::now() + limit;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (test::Clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string out() const { return read_file(out_); }
  std::string err() const { return read_file(err_); }

 private:
  fs::path out_;
  fs::path err_;
  pid_t pid_ = -1;
};

std::string agent_yaml(const std::string& server, const std::string& accelerator = "auto") {
  return "agent: proc-test\n"
         "server: " +
         server +
         "\n"
         "secret: 0123456789abcdef-secret\n"
         "accelerator: " +
         accelerator +
         "\n"
         "reconnect_interval_ms: 20\n"
         "services:\n"
         "  - name: echo\n"
         "    queues: 2\n"
         "    max_message_bytes: 1024\n";
}

TEST(AgentProcess, CheckConfigAcceptsTheShippedConfig) {
  TempDir dir;
  AgentProcess p(dir, {"--config", CARACAL_CONFIGS_DIR "/echo-agent.yaml", "--check-config"});
  EXPECT_EQ(p.wait_exit(), 0) << p.err();
  EXPECT_NE(p.out().find("configuration is valid: agent 'echo-1', 1 service(s)"), std::string::npos)
      << p.out();
}

TEST(AgentProcess, CheckConfigReportsTheBadLine) {
  TempDir dir;
  // No host has 64 GPUs: the agent refuses the setting whether or not it carries the GPU
  // backend, and says which of the two is missing.
  const fs::path gpu = dir.file("gpu.yaml", agent_yaml("127.0.0.1:7100", "gpu:63"));
  AgentProcess p(dir, {"--config", gpu.string(), "--check-config"});
  EXPECT_EQ(p.wait_exit(), 2);
  EXPECT_NE(p.err().find(gpu.string() + ":4:14: accelerator: "), std::string::npos) << p.err();
#if defined(CARACAL_HAVE_CUDA)
  EXPECT_NE(p.err().find("CUDA device(s)"), std::string::npos) << p.err();
#else
  EXPECT_NE(p.err().find("without the CUDA accelerator"), std::string::npos) << p.err();
#endif

  const fs::path missing = dir.path_of("none.yaml");
  AgentProcess q(dir, {"--config", missing.string(), "--check-config"});
  EXPECT_EQ(q.wait_exit(), 2);
  EXPECT_NE(q.err().find("cannot open the configuration file"), std::string::npos) << q.err();
}

TEST(AgentProcess, CommandLine) {
  TempDir dir;
  AgentProcess version(dir, {"--version"});
  EXPECT_EQ(version.wait_exit(), 0);
  EXPECT_NE(version.out().find("Caracal "), std::string::npos) << version.out();
  AgentProcess no_config(dir, {});
  EXPECT_NE(no_config.wait_exit(), 0);
  EXPECT_NE(no_config.err().find("--config is required"), std::string::npos) << no_config.err();
}

TEST(AgentProcess, SigtermDetachesWithByeAndExitsZero) {
  TempDir dir;
  FakeControlServer server;
  const fs::path config = dir.file("agent.yaml", agent_yaml(server.endpoint()));
  AgentProcess p(dir, {"--config", config.string(), "--log-level", "debug"});
  ASSERT_TRUE(server.accept_agent());
  const auto hello = server.expect<control::Hello>();
  server.send(control::Welcome{50, 10000});
  const auto region = server.expect<control::RegionAnnounce>();
  EXPECT_EQ(region.shm_name, region_shm_name("proc-test", p.pid(), "echo"));
  test::RegionPeer peer(region.shm_name);
  EXPECT_EQ(peer.header().agent_epoch, hello.epoch);
  server.send(control::Attached{"echo"});

  const auto payloads = std::vector<std::vector<std::byte>>{
      accel::test::to_bytes("hello"), accel::test::to_bytes(std::string(1024, 'z')), {}};
  const auto replies = peer.exchange(payloads);
  for (const auto& [token, reply] : replies)
    EXPECT_EQ(reply.data, payloads[token]);
  // The agent removes the name when it reads `attached`, which may come after these replies.
  EXPECT_TRUE(accel::test::wait_until([&] { return !shm_exists(region.shm_name); }));

  p.signal(SIGTERM);
  server.expect<control::Bye>();
  server.send(control::Bye{});
  EXPECT_EQ(p.wait_exit(), 0) << p.err();
  EXPECT_EQ(peer.stop_word(), 1u);
  EXPECT_NE(p.err().find("received SIGTERM"), std::string::npos) << p.err();
  EXPECT_NE(p.err().find("the server confirmed the detach"), std::string::npos) << p.err();
}

TEST(AgentProcess, RefusalExitsNonZeroAndLeavesNoShm) {
  TempDir dir;
  FakeControlServer server;
  const fs::path config = dir.file("agent.yaml", agent_yaml(server.endpoint()));
  AgentProcess p(dir, {"--config", config.string()});
  ASSERT_TRUE(server.accept_agent());
  server.expect<control::Hello>();
  server.send(control::Welcome{50, 10000});
  const auto region = server.expect<control::RegionAnnounce>();
  EXPECT_TRUE(shm_exists(region.shm_name));
  server.send(control::Refused{"echo", "no such service"});
  server.expect<control::Bye>();
  server.send(control::Bye{});
  EXPECT_EQ(p.wait_exit(), 1) << p.err();
  EXPECT_NE(p.err().find("refused the region of service 'echo': no such service"),
            std::string::npos)
      << p.err();
  EXPECT_FALSE(shm_exists(region.shm_name));
}

TEST(AgentProcess, SigintWhileWaitingForTheServer) {
  TempDir dir;
  uint16_t port = 0;
  {
    FakeControlServer probe;
    port = probe.port();
  }
  const fs::path config = dir.file("agent.yaml", agent_yaml("127.0.0.1:" + std::to_string(port)));
  AgentProcess p(dir, {"--config", config.string()});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  p.signal(SIGINT);
  EXPECT_EQ(p.wait_exit(), 0) << p.err();
  // Not reachable is said once, however many attempts were made.
  const std::string err = p.err();
  const size_t first = err.find("is not reachable");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("is not reachable", first + 1), std::string::npos) << err;
}

}  // namespace
}  // namespace caracal::agent
