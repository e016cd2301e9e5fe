// One control connection, either end: frames (protocol.hpp) over a TCP socket with Boost.Asio.
//
// Once started it reads continuously: each frame is decoded and handed to on_message, in
// order, until on_message returns false or the connection ends. Sends are queued and written
// in order. The connection ends once, with the reason, through on_end:
//   kClosed     the peer closed its side (end of stream);
//   kBroken     a read or a write failed;
//   kMalformed  the peer sent a frame that does not decode. The socket still writes, so the
//               owner may answer (a Refused) before close_after_sending().
// Completion handlers hold a shared_ptr, so the object outlives its last pending operation
// after close(), and no callback runs once close() has returned. The callbacks may hold their
// owner: close() drops them (the one running, if close() was called from it, is freed once it
// returns). Every member is
// called on the one thread (or strand) that runs the socket's executor.
#pragma once

#include <array>
#include <boost/asio/ip/tcp.hpp>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "caracal/control/protocol.hpp"

namespace caracal::control {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class Ending { kClosed, kBroken, kMalformed };
  struct Callbacks {
    // Returns whether to go on reading.
    std::function<bool(Message&&)> on_message;
    // `why`: empty for kClosed; what failed for kBroken ("read failed: ..."); for kMalformed
    // the frame's error (a decode error names the origin, a bad length prefix does not).
    std::function<void(Ending, const std::string& why)> on_end;
  };

  // `socket` may be connected later (connect it through socket(), then start()).
  explicit Connection(boost::asio::ip::tcp::socket socket);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  boost::asio::ip::tcp::socket& socket() { return socket_; }
  // "control ADDRESS:PORT" of the peer once connected ("control ?" before): the origin that
  // decode errors and logs name.
  const std::string& origin() const { return origin_; }

  void start(Callbacks callbacks);
  void send(const Message& message);
  // Closes once every queued frame has been written (at once when none is).
  void close_after_sending();
  void close();
  bool closed() const { return closed_; }

 private:
  void read_prefix();
  void read_payload();
  void write_next();
  void end(Ending ending, const std::string& why);

  boost::asio::ip::tcp::socket socket_;
  std::string origin_ = "control ?";
  // Shared so that a callback running when close() drops them lives until it returns.
  std::shared_ptr<const Callbacks> callbacks_;
  std::array<std::byte, kFramePrefixBytes> prefix_{};
  std::string payload_;
  std::deque<std::string> outbox_;  // front: being written
  bool writing_ = false;
  bool close_after_sending_ = false;
  bool closed_ = false;
  bool ended_ = false;
};

}  // namespace caracal::control
