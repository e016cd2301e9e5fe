// Stress across processes: this process is the SmartNIC, and caracal_mqueue_shm_peer, started
// with fork + exec, is the accelerator. The region reaches the peer as an inherited memfd or as a
// named POSIX shm object. The peer checks every request and exits non-zero on any error; this
// side checks every reply and the peer's exit status. Bounded in time: a peer that does not
// finish is killed and the test fails.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "stress_protocol.hpp"
#include "test_support.hpp"

#ifndef CARACAL_SHM_PEER_PATH
#error "CARACAL_SHM_PEER_PATH must name the shm_peer executable"
#endif

namespace caracal::mqueue {
namespace {

// A child process that is killed and reaped if the test leaves early.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // fork + exec of `argv`; `inherit_fd`, when >= 0, stays open across exec in the child.
  // Returns "" or why it failed.
  std::string start(const std::vector<std::string>& args, int inherit_fd) {
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (const std::string& a : args) {
      argv.push_back(const_cast<char*>(a.c_str()));
    }
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return std::string("fork: ") + std::strerror(errno);
    if (pid == 0) {
      // Only async-signal-safe calls from here to exec.
      if (inherit_fd >= 0 && fcntl(inherit_fd, F_SETFD, 0) != 0) _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    pid_ = pid;
    return {};
  }

  // True while the child runs; once it has exited, its status is in status().
  bool running() {
    if (pid_ <= 0 || exited_) return false;
    const pid_t r = waitpid(pid_, &status_, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) exited_ = true;
    return !exited_;
  }

  // Waits up to `timeout` for the child to exit; kills it otherwise. True if it exited by
  // itself.
  bool wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (running()) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status_, 0);
        exited_ = true;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

  std::string describe_status() const {
    if (WIFEXITED(status_)) return "exit status " + std::to_string(WEXITSTATUS(status_));
    if (WIFSIGNALED(status_)) return "killed by signal " + std::to_string(WTERMSIG(status_));
    return "status " + std::to_string(status_);
  }
  bool exited_cleanly() const { return exit_code() == 0; }
  // The exit status of a child that exited normally, else -1.
  int exit_code() const { return exited_ && WIFEXITED(status_) ? WEXITSTATUS(status_) : -1; }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
};

// Runs the SmartNIC side against a peer started with `peer_args` (the region's location first),
// `messages` in all.
void run_against_peer(const ShmMapping& nic_mapping, std::vector<std::string> peer_args,
                      int inherit_fd, uint64_t messages) {
  ShmTransport transport(nic_mapping.data(), nic_mapping.size());
  Result<RemoteRegion<ShmTransport>> remote = RemoteRegion<ShmTransport>::attach(&transport);
  ASSERT_TRUE(remote.ok()) << remote.status().message();
  const std::vector<uint64_t> expected = stress::split_messages(messages, remote->queue_count());

  const uint64_t timeout_s = test::stress_timeout_s();
  std::vector<std::string> args{CARACAL_SHM_PEER_PATH};
  args.insert(args.end(), peer_args.begin(), peer_args.end());
  args.push_back(std::to_string(timeout_s));
  for (uint64_t n : expected) {
    args.push_back(std::to_string(n));
  }

  const auto started = stress::Clock::now();
  Child peer;
  const std::string start_error = peer.start(args, inherit_fd);
  ASSERT_EQ(start_error, "");
  const std::string error = stress::run_smartnic(
      *remote, expected, started + std::chrono::seconds(timeout_s), [&] { return peer.running(); });
  // The peer answers every request before it exits; once the replies are in, it has at most
  // its own return left to do. After an error it has seen the stop word, or its own deadline.
  const bool exited = peer.wait(std::chrono::seconds(error.empty() ? 30 : timeout_s + 10));
  const double seconds = std::chrono::duration<double>(stress::Clock::now() - started).count();

  EXPECT_EQ(error, "");
  EXPECT_TRUE(exited) << "the peer did not exit in time and was killed";
  EXPECT_TRUE(peer.exited_cleanly())
      << "peer: " << peer.describe_status() << " (its stderr above says why)";
  std::printf("[ stress   ] %llu messages over %zu queues with a peer process in %.2f s\n",
              static_cast<unsigned long long>(messages), expected.size(), seconds);
}

TEST(ProcessStress, EchoThroughAnInheritedMemfd) {
  Result<ShmMapping> agent = create_shm_region(stress::stress_geometry(), 2, "caracal-proc-stress");
  ASSERT_TRUE(agent.ok()) << agent.status().message();
  // The SmartNIC maps it a second time, as the server does with an fd passed over a socket;
  // the peer gets the original descriptor.
  Result<ShmMapping> nic = ShmMapping::open_fd(agent->fd());
  ASSERT_TRUE(nic.ok()) << nic.status().message();
  run_against_peer(*nic, {"--fd", std::to_string(agent->fd())}, agent->fd(),
                   test::stress_messages());
}

// With RX lines: the peer learns of them from the header.
TEST(ProcessStress, EchoThroughANamedShmObjectWithRxLines) {
  const RegionGeometry g{2, 2, 128, 32, 16 * 128 - kSlotHeaderBytes, /*rx_lines=*/true};
  const RegionHeader header = compute_layout(g, 3);
  const std::string name = test::unique_shm_name("proc-stress");
  Result<ShmMapping> nic = ShmMapping::create_named(name, header.region_bytes);
  ASSERT_TRUE(nic.ok()) << nic.status().message();
  initialize_region(nic->data(), header);
  // A smaller run: the memfd test carries the volume.
  const uint64_t messages = std::max<uint64_t>(test::stress_messages() / 10, 1000);
  run_against_peer(*nic, {"--name", name}, -1, messages);
}

// The peer's own failure paths, which the stress tests rely on to report rather than hang.
TEST(ProcessStress, PeerRefusesADamagedRegion) {
  Result<ShmMapping> agent = create_shm_region(stress::stress_geometry(), 4, "caracal-bad-peer");
  ASSERT_TRUE(agent.ok()) << agent.status().message();
  reinterpret_cast<RegionHeader*>(agent->data())->magic = 0;
  Child peer;
  ASSERT_EQ(peer.start({CARACAL_SHM_PEER_PATH, "--fd", std::to_string(agent->fd()), "60", "1", "1",
                        "1", "1"},
                       agent->fd()),
            "");
  ASSERT_TRUE(peer.wait(std::chrono::seconds(60)));
  EXPECT_EQ(peer.exit_code(), 2) << peer.describe_status();
}

TEST(ProcessStress, PeerGivesUpWhenRequestsNeverCome) {
  Result<ShmMapping> agent = create_shm_region(stress::stress_geometry(), 5, "caracal-idle-peer");
  ASSERT_TRUE(agent.ok()) << agent.status().message();
  Child peer;
  ASSERT_EQ(peer.start({CARACAL_SHM_PEER_PATH, "--fd", std::to_string(agent->fd()), "1", "1", "0",
                        "0", "0"},
                       agent->fd()),
            "");
  ASSERT_TRUE(peer.wait(std::chrono::seconds(60)));
  EXPECT_EQ(peer.exit_code(), 1) << peer.describe_status();
}

TEST(ProcessStress, PeerStopsOnTheStopWord) {
  Result<ShmMapping> agent = create_shm_region(stress::stress_geometry(), 6, "caracal-stop-peer");
  ASSERT_TRUE(agent.ok()) << agent.status().message();
  Child peer;
  ASSERT_EQ(peer.start({CARACAL_SHM_PEER_PATH, "--fd", std::to_string(agent->fd()), "120", "1", "0",
                        "0", "0"},
                       agent->fd()),
            "");
  RegionView(agent->data()).request_stop();
  ASSERT_TRUE(peer.wait(std::chrono::seconds(60)));
  EXPECT_EQ(peer.exit_code(), 1) << peer.describe_status();
}

}  // namespace
}  // namespace caracal::mqueue
