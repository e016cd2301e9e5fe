// control::Connection over a real loopback TCP connection: one end is the Connection under
// test, the other a plain socket that writes and reads raw bytes.
#include "caracal/control/connection.hpp"

#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace caracal::control {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

// A connected pair on 127.0.0.1: `conn` (the Connection) and `peer` (a raw socket).
struct Pair {
  asio::io_context io;
  std::shared_ptr<Connection> conn;
  tcp::socket peer{io};
  std::vector<Message> received;
  std::optional<Connection::Ending> ending;
  std::string why;

  Pair() {
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    peer.connect(acceptor.local_endpoint());
    conn = std::make_shared<Connection>(acceptor.accept());
  }

  void start(bool keep_reading = true) {
    conn->start({
        .on_message =
            [this, keep_reading](Message&& m) {
              received.push_back(std::move(m));
              return keep_reading;
            },
        .on_end =
            [this](Connection::Ending e, const std::string& w) {
              ending = e;
              why = w;
            },
    });
  }

  // Runs the io_context until `done` or a second has passed.
  template <class Done>
  void run_until(Done done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      io.run_for(std::chrono::milliseconds(5));
      io.restart();
    }
  }

  // Reads one frame the Connection sent.
  Message read_frame() {
    std::array<std::byte, kFramePrefixBytes> prefix{};
    asio::read(peer, asio::buffer(prefix));
    Result<uint32_t> n = frame_length(prefix.data());
    EXPECT_TRUE(n.ok());
    std::string payload(*n, '\0');
    asio::read(peer, asio::buffer(payload));
    Result<Message> m = decode(payload, "peer");
    EXPECT_TRUE(m.ok()) << m.status().message();
    return *m;
  }
};

Hello hello(std::string agent, uint64_t epoch) {
  Hello h;
  h.agent = std::move(agent);
  h.epoch = epoch;
  return h;
}

TEST(ControlConnection, DeliversFramesInOrderAndNamesItsOrigin) {
  Pair p;
  p.start();
  EXPECT_EQ(p.conn->origin().rfind("control 127.0.0.1:", 0), 0u) << p.conn->origin();
  std::string bytes = encode(hello("a1", 7)) + encode(Heartbeat{}) + encode(Bye{});
  // Split across writes, one byte of the second prefix in the first: frames are reassembled.
  asio::write(p.peer, asio::buffer(bytes.data(), 5));
  asio::write(p.peer, asio::buffer(bytes.data() + 5, bytes.size() - 5));
  p.run_until([&] { return p.received.size() == 3; });
  ASSERT_EQ(p.received.size(), 3u);
  EXPECT_EQ(std::get<Hello>(p.received[0]).agent, "a1");
  EXPECT_TRUE(std::holds_alternative<Heartbeat>(p.received[1]));
  EXPECT_TRUE(std::holds_alternative<Bye>(p.received[2]));
  EXPECT_FALSE(p.ending.has_value());
}

TEST(ControlConnection, SendsInOrder) {
  Pair p;
  p.start();
  p.conn->send(Welcome{100, 400});
  p.conn->send(Attached{"echo"});
  p.run_until([] { return false; });  // let the writes go out
  EXPECT_EQ(std::get<Welcome>(p.read_frame()).agent_timeout_ms, 400u);
  EXPECT_EQ(std::get<Attached>(p.read_frame()).service, "echo");
}

TEST(ControlConnection, PeerCloseEndsClosed) {
  Pair p;
  p.start();
  p.peer.close();
  p.run_until([&] { return p.ending.has_value(); });
  ASSERT_TRUE(p.ending.has_value());
  EXPECT_EQ(*p.ending, Connection::Ending::kClosed);
  EXPECT_TRUE(p.why.empty());
}

TEST(ControlConnection, AFrameCutShortEndsBroken) {
  Pair p;
  p.start();
  const std::string frame = encode(hello("a1", 1));
  asio::write(p.peer, asio::buffer(frame.data(), frame.size() - 3));
  p.peer.close();
  p.run_until([&] { return p.ending.has_value(); });
  ASSERT_TRUE(p.ending.has_value());
  EXPECT_EQ(*p.ending, Connection::Ending::kBroken);
  EXPECT_NE(p.why.find("read failed"), std::string::npos) << p.why;
}

TEST(ControlConnection, AnOversizeLengthIsMalformedAndTheOwnerMayStillAnswer) {
  Pair p;
  p.start();
  const std::array<unsigned char, 4> huge{0x7f, 0xff, 0xff, 0xff};
  asio::write(p.peer, asio::buffer(huge));
  p.run_until([&] { return p.ending.has_value(); });
  ASSERT_TRUE(p.ending.has_value());
  EXPECT_EQ(*p.ending, Connection::Ending::kMalformed);
  EXPECT_FALSE(p.why.empty());
  // The refusal reaches the peer, then the connection closes.
  p.conn->send(Refused{"", p.why});
  p.conn->close_after_sending();
  p.run_until([&] { return p.conn->closed(); });
  EXPECT_TRUE(p.conn->closed());
  EXPECT_EQ(std::get<Refused>(p.read_frame()).message, p.why);
  std::array<char, 1> more{};
  boost::system::error_code ec;
  p.peer.read_some(asio::buffer(more), ec);
  EXPECT_EQ(ec, asio::error::eof);
}

TEST(ControlConnection, AnUndecodablePayloadNamesTheOrigin) {
  Pair p;
  p.start();
  const std::string yaml = "type: hello\nprotocol: [";
  std::string frame(4, '\0');
  const uint32_t n = yaml.size();
  frame[0] = static_cast<char>(n >> 24);
  frame[1] = static_cast<char>(n >> 16);
  frame[2] = static_cast<char>(n >> 8);
  frame[3] = static_cast<char>(n);
  frame += yaml;
  asio::write(p.peer, asio::buffer(frame));
  p.run_until([&] { return p.ending.has_value(); });
  ASSERT_TRUE(p.ending.has_value());
  EXPECT_EQ(*p.ending, Connection::Ending::kMalformed);
  EXPECT_NE(p.why.find(p.conn->origin()), std::string::npos) << p.why;
}

TEST(ControlConnection, StopsReadingWhenAskedAndNoCallbackRunsAfterClose) {
  Pair p;
  p.start(/*keep_reading=*/false);
  const std::string bytes = encode(Heartbeat{}) + encode(Heartbeat{});
  asio::write(p.peer, asio::buffer(bytes));
  p.run_until([&] { return !p.received.empty(); });
  p.run_until([] { return false; });
  EXPECT_EQ(p.received.size(), 1u);  // the second frame is never read
  p.conn->close();
  p.peer.close();
  p.run_until([] { return false; });
  EXPECT_FALSE(p.ending.has_value());
  EXPECT_TRUE(p.conn->closed());
}

}  // namespace
}  // namespace caracal::control
