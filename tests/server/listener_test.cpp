// The Asio UDP listener inside a real Server: the socket options it sets, and a burst of
// datagrams larger than one recvmmsg() batch, each answered.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "caracal/config/yaml.hpp"
#include "caracal/server/config.hpp"
#include "caracal/server/server.hpp"
#include "caracal/server/tunables.hpp"

namespace caracal::server {
namespace {

ServerConfig udp_config(const std::string& listener_extra) {
  const std::string text = R"(io_threads: 2
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
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  int big = 1 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(server.listener_port("e", 0));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
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

}  // namespace
}  // namespace caracal::server
