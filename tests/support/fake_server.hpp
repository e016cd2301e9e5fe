// The server's side of the agent tests, as far as the agent can see it: a control endpoint
// that speaks the control protocol from a test script (FakeControlServer), and the server's
// view of an announced region, opened by name and driven through RemoteRegion<ShmTransport>
// (RegionPeer). Every wait is bounded, so a test fails instead of hanging.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "caracal/control/protocol.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "caracal/mqueue/validate.hpp"
#include "snic_driver.hpp"

namespace caracal::agent::test {

using accel::test::kWaitLimit;
using accel::test::TxEntry;
using accel::test::wait_until;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Whether a POSIX shm object of this name exists.
inline bool shm_exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

class FakeControlServer {
 public:
  // Listens on 127.0.0.1 at `port` (0: any free port).
  explicit FakeControlServer(uint16_t port = 0) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener_ < 0) throw std::runtime_error("socket: " + std::string(strerror(errno)));
    const int one = 1;
    setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(listener_, 8) != 0) {
      const int err = errno;
      close(listener_);
      throw std::runtime_error("bind/listen: " + std::string(strerror(err)));
    }
    socklen_t len = sizeof(a);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  FakeControlServer(const FakeControlServer&) = delete;
  FakeControlServer& operator=(const FakeControlServer&) = delete;
  ~FakeControlServer() {
    drop_client();
    if (listener_ >= 0) close(listener_);
  }

  uint16_t port() const { return port_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

  // Accepts the next connection (dropping the current one). False on timeout.
  bool accept_agent(std::chrono::nanoseconds limit = kWaitLimit) {
    drop_client();
    if (!wait_readable(listener_, limit)) return false;
    client_ = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    buffer_.clear();
    closed_ = false;
    return client_ >= 0;
  }
  void drop_client() {
    if (client_ >= 0) close(client_);
    client_ = -1;
  }

  void send(const control::Message& m) {
    const std::string frame = control::encode(m);
    size_t sent = 0;
    while (sent < frame.size()) {
      const ssize_t n = ::send(client_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send to agent: " + std::string(strerror(errno)));
      sent += static_cast<size_t>(n);
    }
  }

  // The next message, or nullopt on timeout or when the agent closed the connection
  // (closed() tells which). Malformed frames throw.
  std::optional<control::Message> receive(std::chrono::nanoseconds limit = kWaitLimit) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      if (buffer_.size() >= control::kFramePrefixBytes) {
        Result<uint32_t> n =
            control::frame_length(reinterpret_cast<const std::byte*>(buffer_.data()));
        if (!n.ok()) throw std::runtime_error(n.status().message());
        if (buffer_.size() >= control::kFramePrefixBytes + *n) {
          const std::string payload = buffer_.substr(control::kFramePrefixBytes, *n);
          buffer_.erase(0, control::kFramePrefixBytes + *n);
          Result<control::Message> m = control::decode(payload, "agent");
          if (!m.ok()) throw std::runtime_error(m.status().message());
          return *m;
        }
      }
      const auto left = deadline - Clock::now();
      if (left <= std::chrono::nanoseconds::zero() || !wait_readable(client_, left)) {
        return std::nullopt;
      }
      char chunk[4096];
      const ssize_t n = recv(client_, chunk, sizeof(chunk), 0);
      if (n <= 0) {
        closed_ = true;
        return std::nullopt;
      }
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  // The next message that is not a heartbeat; heartbeats met on the way are answered when
  // `answer_heartbeats`, and counted.
  std::optional<control::Message> receive_skipping_heartbeats(
      bool answer_heartbeats = true, std::chrono::nanoseconds limit = kWaitLimit) {
    const auto deadline = Clock::now() + limit;
    for (;;) {
      std::optional<control::Message> m = receive(deadline - Clock::now());
      if (!m || !std::holds_alternative<control::Heartbeat>(*m)) return m;
      ++heartbeats_;
      if (answer_heartbeats) send(control::Heartbeat{});
    }
  }

  // Receives a message of type M (heartbeats skipped and answered); throws on anything else.
  template <class M>
  M expect(std::chrono::nanoseconds limit = kWaitLimit) {
    std::optional<control::Message> m = receive_skipping_heartbeats(true, limit);
    if (!m) throw std::runtime_error(closed_ ? "agent closed the connection" : "timed out");
    if (!std::holds_alternative<M>(*m)) {
      throw std::runtime_error(std::string("unexpected '") + control::type_name(*m) + "'");
    }
    return std::get<M>(*m);
  }

  // Waits until the agent closes the connection, answering heartbeats meanwhile.
  bool wait_closed(std::chrono::nanoseconds limit = kWaitLimit) {
    const auto deadline = Clock::now() + limit;
    while (!closed_ && Clock::now() < deadline) {
      receive_skipping_heartbeats(true, deadline - Clock::now());
    }
    return closed_;
  }

  bool closed() const { return closed_; }
  uint64_t heartbeats() const { return heartbeats_; }

 private:
  static bool wait_readable(int fd, std::chrono::nanoseconds limit) {
    pollfd p{fd, POLLIN, 0};
    const auto ms = std::chrono::duration_cast<milliseconds>(limit).count();
    return poll(&p, 1, static_cast<int>(ms < 1 ? 1 : ms)) == 1;
  }

  int listener_ = -1;
  int client_ = -1;
  uint16_t port_ = 0;
  std::string buffer_;
  bool closed_ = false;
  uint64_t heartbeats_ = 0;
};

// The server's view of an announced region: its own mapping, opened by name, checked with
// validate_region and driven through RemoteRegion<ShmTransport>.
class RegionPeer {
 public:
  using Remote = mqueue::RemoteRegion<mqueue::ShmTransport>;

  explicit RegionPeer(const std::string& shm_name) {
    Result<mqueue::ShmMapping> m = mqueue::ShmMapping::open_named(shm_name);
    if (!m.ok()) throw std::runtime_error(m.status().message());
    mapping_ = std::move(m).value();
    transport_.emplace(mapping_.data(), mapping_.size());
    Result<Remote> r = Remote::attach(&*transport_);
    if (!r.ok()) throw std::runtime_error("attach: " + r.status().message());
    remote_.emplace(std::move(r).value());
  }

  const mqueue::RegionHeader& header() const { return remote_->header(); }
  uint64_t mapped_bytes() const { return mapping_.size(); }
  uint32_t stop_word() { return transport_->load_index(mqueue::stop_word_offset(header())); }

  // Sends payloads[i] with token i on server queue i % queues, as fast as credits allow, and
  // collects the replies by token. Throws on timeout or a corrupt TX entry.
  std::map<uint64_t, TxEntry> exchange(const std::vector<std::vector<std::byte>>& payloads) {
    const uint32_t queues = header().server_queue_count;
    std::map<uint64_t, TxEntry> replies;
    size_t sent = 0;
    const bool done = wait_until([&] {
      while (sent < payloads.size()) {
        const uint32_t q = static_cast<uint32_t>(sent % queues);
        const auto& p = payloads[sent];
        if (!remote_->rx(q).push(p.data(), static_cast<uint32_t>(p.size()), sent, 0)) break;
        remote_->rx(q).publish();
        ++sent;
      }
      // With TX lines: first every reply announced by its line (the tail that covers it may
      // already be out as well: the CPU workers publish right after), then by the tails.
      auto take = [&](uint32_t q, bool by_line) {
        auto& tx = remote_->tx(q);
        mqueue::Entry e;
        for (;;) {
          const mqueue::PollResult r = by_line ? tx.next_by_line(e) : tx.next(e);
          if (r == mqueue::PollResult::kEmpty) break;
          if (r == mqueue::PollResult::kCorrupt) throw std::runtime_error("corrupt TX entry");
          replies[e.token] = TxEntry{q, e.token, e.flags, {e.payload, e.payload + e.length}};
          if (by_line) ++by_line_;
        }
      };
      for (uint32_t q = 0; q < queues; ++q)
        take(q, true);
      remote_->fetch_tx_tails();
      remote_->deliver_tx_tails();
      for (uint32_t q = 0; q < queues; ++q) {
        take(q, false);
        remote_->tx(q).release();
        remote_->tx(q).publish();
      }
      return replies.size() >= payloads.size();
    });
    if (!done) {
      throw std::runtime_error("only " + std::to_string(replies.size()) + " of " +
                               std::to_string(payloads.size()) + " replies arrived");
    }
    return replies;
  }

  // Replies exchange() took from TX lines.
  uint64_t replies_by_line() const { return by_line_; }

 private:
  mqueue::ShmMapping mapping_;
  std::optional<mqueue::ShmTransport> transport_;
  std::optional<Remote> remote_;
  uint64_t by_line_ = 0;
};

}  // namespace caracal::agent::test
