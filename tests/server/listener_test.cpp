// The Asio listeners inside a real Server. UDP: the socket options it sets, a burst of
// datagrams larger than one recvmmsg() batch, each answered, and how datagrams are dealt among
// the sockets. TCP: a stop that finds a request
// half read and a read in flight takes nothing that read brings (caracal_matvec_agent, slowed
// down, keeps a request in flight across the stop).
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "caracal/config/yaml.hpp"
#include "config.hpp"
#include "server.hpp"
#include "tunables.hpp"

extern char** environ;

namespace caracal::server {
namespace {

ServerConfig udp_config(const std::string& listener_extra, uint32_t io_threads = 2) {
  const std::string text = "io_threads: " + std::to_string(io_threads) + R"(
control: { listen: 127.0.0.1:0, secret: 0123456789abcdef }
services:
  - name: e
    max_message_bytes: 64
    listeners:
      - { protocol: udp, listen: 127.0.0.1:0, error_reply: "ERR {reason}")" +
                           listener_extra + R"( }
)";
  return parse_server_config(config::load_yaml_text(text, "t.yaml"));
}

// SO_RCVBUF and SO_SNDBUF of every UDP descriptor of this process bound to `port`.
std::vector<std::pair<int, int>> udp_buffers_on(uint16_t port) {
  std::vector<std::pair<int, int>> out;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const int fd = std::atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(d)) continue;
    int type = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_DGRAM) continue;
    sockaddr_in a{};
    len = sizeof(a);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET ||
        ntohs(a.sin_port) != port) {
      continue;
    }
    int rcv = 0, snd = 0;
    len = sizeof(rcv);
    getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len);
    len = sizeof(snd);
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &len);
    out.emplace_back(rcv, snd);
  }
  closedir(d);
  return out;
}

// 127.0.0.1:port.
sockaddr_in loopback(uint16_t port) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return to;
}

// A UDP client socket with a 5 s receive timeout.
int udp_client() {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  timeval tv{5, 0};
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

TEST(UdpListener, SocketBuffersAreTheConfiguredSize) {
  Server server(udp_config(", socket_buffer_bytes: 65536"));
  ASSERT_TRUE(server.start().ok());
  const std::vector<std::pair<int, int>> buffers = udp_buffers_on(server.listener_port("e", 0));
  // Two sockets (one per I/O thread), each with its duplicate for replies.
  ASSERT_EQ(buffers.size(), 4u);
  for (const auto& [rcv, snd] : buffers) {
    // Linux reports twice the size asked for (socket(7)); 64 KiB is below any rmem_max.
    EXPECT_EQ(rcv, 2 * 65536);
    EXPECT_EQ(snd, 2 * 65536);
  }
  server.stop();
}

// 200 datagrams sent at once, more than one turn of the socket's I/O thread takes (tunables.hpp:
// kUdpReceiveBatch x kUdpDrainRounds): with no agent attached, each gets the error reply, so
// every one of them was received.
TEST(UdpListener, ABurstIsReceivedWhole) {
  Server server(udp_config(""));
  ASSERT_TRUE(server.start().ok());
  const int fd = udp_client();
  ASSERT_GE(fd, 0);
  int big = 1 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  sockaddr_in to = loopback(server.listener_port("e", 0));
  constexpr int kBurst = 200;
  static_assert(kBurst > tunables::kUdpReceiveBatch * tunables::kUdpDrainRounds);
  for (int i = 0; i < kBurst; ++i) {
    const std::string m = "request " + std::to_string(i);
    ASSERT_EQ(sendto(fd, m.data(), m.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof(to)),
              static_cast<ssize_t>(m.size()));
  }
  int replies = 0;
  char buf[256];
  for (; replies < kBurst; ++replies) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0) break;  // the timeout: a datagram went unanswered
    EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "ERR no agent serves service e");
  }
  EXPECT_EQ(replies, kBurst);
  close(fd);
  server.stop();
}

// Sends `count` datagrams from one client socket (one flow) to the listener of `server` and
// waits for each error reply (no agent is attached), so that every one was received; returns
// caracal_listener_socket_datagrams_total of each of the listener's sockets, by socket.
std::map<std::string, uint64_t> datagrams_by_socket(Server& server, int count) {
  const int fd = udp_client();
  EXPECT_GE(fd, 0);
  sockaddr_in to = loopback(server.listener_port("e", 0));
  char buf[256];
  int replies = 0;
  // A few at a time, so that no socket buffer overflows.
  for (int sent = 0; sent < count; sent += 10) {
    for (int i = 0; i < 10; ++i)
      sendto(fd, "x", 1, 0, reinterpret_cast<sockaddr*>(&to), sizeof(to));
    for (int i = 0; i < 10 && recv(fd, buf, sizeof(buf), 0) > 0; ++i)
      ++replies;
  }
  close(fd);
  EXPECT_EQ(replies, count);
  std::map<std::string, uint64_t> out;
  const std::string text = server.metrics().render();
  const std::string name = "caracal_listener_socket_datagrams_total{";
  for (size_t at = text.find('\n' + name); at != std::string::npos;
       at = text.find('\n' + name, at + 1)) {
    const std::string line = text.substr(at + 1, text.find('\n', at + 1) - at - 1);
    const size_t socket = line.find("socket=\"") + 8;
    out[line.substr(socket, line.find('"', socket) - socket)] =
        std::stoull(line.substr(line.rfind(' ') + 1));
  }
  return out;
}

// How many of a 4-socket listener's sockets received one client's 400 datagrams, with
// `spread` (empty: the default). A socket left out by chance where every socket may get each
// datagram has a chance of 4 x 0.75^400, about 10^-50. -1 where the listener cannot start
// because the kernel (or qemu-user, under which the arm64 build's tests run) lacks
// SO_ATTACH_REUSEPORT_CBPF.
int sockets_reached(const std::string& spread) {
  Server server(udp_config(spread.empty() ? "" : ", spread: " + spread, 4));
  const Status started = server.start();
  if (!started.ok() && started.message().find(std::strerror(ENOPROTOOPT)) != std::string::npos) {
    return -1;
  }
  EXPECT_TRUE(started.ok()) << started.message();
  if (!started.ok()) return 0;
  const std::map<std::string, uint64_t> got = datagrams_by_socket(server, 400);
  server.stop();
  EXPECT_EQ(got.size(), 4u) << "a series per socket";
  uint64_t total = 0;
  int busy = 0;
  for (const auto& [socket, n] : got) {
    total += n;
    busy += n > 0 ? 1 : 0;
  }
  EXPECT_EQ(total, 400u);
  return busy;
}

// The kernel's hash (spread: flows, the default): all of one client's datagrams to one socket.
TEST(UdpListener, SpreadFlowsKeepsOneClientOnOneSocket) {
  EXPECT_EQ(sockets_reached(""), 1);
  EXPECT_EQ(sockets_reached("flows"), 1);
}

// spread: datagrams: one client's datagrams to every socket.
TEST(UdpListener, SpreadDatagramsDealsOneClientToEverySocket) {
  const int reached = sockets_reached("datagrams");
  if (reached < 0) GTEST_SKIP() << "no SO_ATTACH_REUSEPORT_CBPF here (qemu-user lacks it)";
  EXPECT_EQ(reached, 4);
}

// A TCP client socket connected to 127.0.0.1:port, with a receive timeout.
int connect_tcp(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in to = loopback(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

std::string length_prefixed(const std::string& payload) {
  const auto n = static_cast<uint32_t>(payload.size());
  const char prefix[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                          static_cast<char>(n >> 8), static_cast<char>(n)};
  return std::string(prefix, 4) + payload;
}

// The sum of the samples of `name` in the registry's text.
uint64_t metric_sum(Registry& metrics, const std::string& name) {
  const std::string text = metrics.render();
  uint64_t sum = 0;
  size_t at = 0;
  while ((at = text.find('\n' + name, at)) != std::string::npos) {
    const size_t eol = text.find('\n', at + 1);
    const std::string line = text.substr(at + 1, eol - at - 1);
    sum += std::stoull(line.substr(line.rfind(' ') + 1));
    at = eol;
  }
  return sum;
}

// caracal_matvec_agent against the server, every request slowed down by `delay_us`; killed and
// reaped on destruction.
class SlowAgent {
 public:
  SlowAgent(uint16_t control_port, const std::string& secret, uint32_t delay_us) {
    config_ = "/tmp/caracal-listener-test-" + std::to_string(getpid()) + ".yaml";
    std::ofstream(config_) << "agent: slow\nserver: 127.0.0.1:" << control_port
                           << "\nsecret: " << secret
                           << "\naccelerator: cpu\ntransport: shm\nservices:\n"
                              "  - { name: m, queues: 1, ring_capacity: 64, slot_bytes: 256, "
                              "max_message_bytes: 1024 }\n";
    std::string delay = std::to_string(delay_us);
    std::vector<std::string> args = {CARACAL_MATVEC_AGENT, "--config", config_, "--delay-us",
                                     delay};
    std::vector<char*> argv;
    for (std::string& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~SlowAgent() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    unlink(config_.c_str());
  }
  bool started() const { return pid_ > 0; }

 private:
  std::string config_;
  pid_t pid_ = -1;
};

// The server stops while a connection has a request in flight (its reply still to come), the
// first bytes of the next request buffered and a read waiting for more. The stop drops the
// buffered bytes; the read then brings the rest of that request, which begins inside it. None
// of it may be taken for a request: here the rest is made to frame a whole request of its own
// (a 40-byte message), which a server that took it would dispatch and answer as if it were the
// client's next request (and other bytes would make a "malformed" error reply instead).
//
// The order is made certain by holding the only I/O thread in a metrics scrape (a gauge whose
// callback waits) while the rest is sent and the stop posts its shutdown to the connection:
// the read's completion can only queue behind it.
TEST(TcpListener, AStopTakesNothingFromAReadInFlight) {
  const std::string secret = "0123456789abcdef-listener";
  const std::string text = R"(io_threads: 1
engine_threads: 1
control: { listen: 127.0.0.1:0, secret: )" +
                           secret + R"( }
metrics: { listen: 127.0.0.1:0 }
services:
  - name: m
    max_message_bytes: 1024
    listeners:
      - { protocol: tcp, listen: 127.0.0.1:0, framing: { kind: length_prefixed, prefix_bytes: 4 }, error_reply: "ERR {reason}" }
)";
  Server server(parse_server_config(config::load_yaml_text(text, "t.yaml")));
  ASSERT_TRUE(server.start().ok());
  SlowAgent agent(server.control_port(), secret, 1000000);
  ASSERT_TRUE(agent.started());
  const auto attached = [&server] {
    return server.metrics().render().find("caracal_queue_ring_slots_in_use{") != std::string::npos;
  };
  for (int i = 0; i < 400 && !attached(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(attached()) << "the agent's region was never attached";

  const int fd = connect_tcp(server.listener_port("m", 0));
  ASSERT_GE(fd, 0);
  // Request 1 (a 64-byte vector): in flight for a second.
  ASSERT_TRUE(send_all(fd, length_prefixed(std::string(64, '\0'))));
  // Request 2, a 64-byte message, of which the prefix and 20 bytes go now. The other 44 bytes,
  // read from where they start, frame a message of 40 bytes.
  const std::string rest = length_prefixed(std::string(40, 'x'));
  ASSERT_EQ(rest.size(), 44u);
  const std::string second = length_prefixed(std::string(20, 'y') + rest);
  ASSERT_TRUE(send_all(fd, second.substr(0, 4 + 20)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // read; the next read waits

  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  bool once = false;
  const uint64_t hold =
      server.metrics().gauge_callback("test_hold_io_thread", "Holds the scrape", {}, [&] {
        if (!once) {
          once = true;
          entered.set_value();
          released.wait();
        }
        return 0.0;
      });
  std::thread scrape([port = server.metrics_port()] {
    const int m = connect_tcp(port);
    if (m < 0) return;
    send_all(m, "GET /metrics HTTP/1.0\r\n\r\n");
    char buf[4096];
    while (recv(m, buf, sizeof buf, 0) > 0) {
    }
    close(m);
  });
  ASSERT_EQ(entered.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_TRUE(send_all(fd, second.substr(4 + 20)));
  std::thread stopper([&server] { server.stop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the shutdown is posted
  release.set_value();

  // Request 1's reply, then the end of the connection: nothing else was taken.
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0)
    got.append(buf, static_cast<size_t>(n));
  close(fd);
  stopper.join();
  scrape.join();
  server.metrics().remove_callback(hold);
  ASSERT_GE(got.size(), 4u);
  const uint32_t first = (uint32_t{static_cast<unsigned char>(got[0])} << 24) |
                         (uint32_t{static_cast<unsigned char>(got[1])} << 16) |
                         (uint32_t{static_cast<unsigned char>(got[2])} << 8) |
                         uint32_t{static_cast<unsigned char>(got[3])};
  EXPECT_EQ(got.size(), 4 + first) << "more than request 1's reply came back";
  EXPECT_EQ(metric_sum(server.metrics(), "caracal_listener_requests_total"), 1u);
  EXPECT_EQ(metric_sum(server.metrics(), "caracal_listener_drops_total"), 0u);
}

}  // namespace
}  // namespace caracal::server
