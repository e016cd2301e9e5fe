// Blocking TCP and UDP sockets for the face tools (caracal_face_loader, caracal_face_client):
// small programs that send a few messages and exit, so plain POSIX calls.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace caracal::examples::face {

// "host:port" into its parts; throws with the text when it is not one.
inline std::pair<std::string, std::string> split_host_port(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw std::invalid_argument("'" + text + "' is not HOST:PORT");
  return {text.substr(0, colon), text.substr(colon + 1)};
}

// A connected socket of `type` (SOCK_STREAM, SOCK_DGRAM) to host:port, with `timeout_ms` on
// every send and receive.
inline int connect_to(const std::string& host_port, int type, int timeout_ms) {
  const auto [host, port] = split_host_port(host_port);
  addrinfo hints{};
  hints.ai_socktype = type;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw std::runtime_error(host_port + ": " + gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      if (type == SOCK_STREAM) {
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      }
      freeaddrinfo(found);
      return fd;
    }
    why = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  throw std::runtime_error("cannot connect to " + host_port + ": " + why);
}

inline void send_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n != 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

inline void recv_all(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n != 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw std::runtime_error("the peer closed the connection");
    if (r < 0) {
      throw std::runtime_error(errno == EAGAIN || errno == EWOULDBLOCK
                                   ? std::string("no answer in time")
                                   : std::string("recv: ") + std::strerror(errno));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

}  // namespace caracal::examples::face
