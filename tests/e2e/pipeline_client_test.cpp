// caracal_pipeline_client against echo servers in this process: one that echoes correctly, and
// ones that get exactly one reply wrong in a known way, which the client must report (exit 1),
// or stop answering (exit 2).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>

namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

enum class Framing { kLengthPrefixed, kLine };

// What the server does to the message numbered `fault_at` on the first connection that gets
// that far; every other message on every connection is echoed.
enum class Fault {
  kNone,
  kCorrupt,   // flips the lowest bit of the middle byte of the reply
  kSwap,      // sends the reply after the next one
  kTruncate,  // leaves out the reply's last byte
  kStall,     // replies to nothing from there on
};

struct FaultState {
  Fault fault = Fault::kNone;
  uint64_t fault_at = 3;
  bool used = false;  // only the io thread touches it
};

class EchoSession : public std::enable_shared_from_this<EchoSession> {
 public:
  EchoSession(tcp::socket socket, Framing framing, FaultState& fault)
      : socket_(std::move(socket)), framing_(framing), fault_(fault) {}

  void read() {
    socket_.async_read_some(net::buffer(chunk_),
                            [self = shared_from_this()](const error_code& ec, size_t n) {
                              if (ec) return;
                              self->in_.append(self->chunk_.data(), n);
                              self->take_messages();
                              self->read();
                            });
  }

 private:
  void take_messages() {
    for (;;) {
      std::string payload;
      if (framing_ == Framing::kLengthPrefixed) {
        if (in_.size() < 4) break;
        const uint32_t n = (uint32_t{static_cast<unsigned char>(in_[0])} << 24) |
                           (uint32_t{static_cast<unsigned char>(in_[1])} << 16) |
                           (uint32_t{static_cast<unsigned char>(in_[2])} << 8) |
                           uint32_t{static_cast<unsigned char>(in_[3])};
        if (in_.size() < 4 + n) break;
        payload = in_.substr(4, n);
        in_.erase(0, 4 + n);
      } else {
        const size_t nl = in_.find('\n');
        if (nl == std::string::npos) break;
        payload = in_.substr(0, nl);
        in_.erase(0, nl + 1);
      }
      on_message(std::move(payload));
    }
    flush();
  }

  void on_message(std::string payload) {
    const uint64_t number = messages_++;
    if (stalled_) return;
    if (held_) {
      append_reply(payload);
      append_reply(*held_);
      held_.reset();
      return;
    }
    if (number == fault_.fault_at && !fault_.used && fault_.fault != Fault::kNone) {
      fault_.used = true;
      switch (fault_.fault) {
        case Fault::kNone:
          break;
        case Fault::kCorrupt:
          payload[payload.size() / 2] ^= 0x01;
          break;
        case Fault::kSwap:
          held_ = std::move(payload);
          return;
        case Fault::kTruncate:
          payload.pop_back();
          break;
        case Fault::kStall:
          stalled_ = true;
          return;
      }
    }
    append_reply(payload);
  }

  void append_reply(const std::string& payload) {
    if (framing_ == Framing::kLengthPrefixed) {
      const auto n = static_cast<uint32_t>(payload.size());
      const char prefix[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                              static_cast<char>(n >> 8), static_cast<char>(n)};
      outbox_.append(prefix, 4);
      outbox_ += payload;
    } else {
      outbox_ += payload;
      outbox_ += '\n';
    }
  }

  void flush() {
    if (writing_ || outbox_.empty()) return;
    writing_ = true;
    in_write_.swap(outbox_);
    outbox_.clear();
    net::async_write(socket_, net::buffer(in_write_),
                     [self = shared_from_this()](const error_code& ec, size_t) {
                       self->writing_ = false;
                       if (!ec) self->flush();
                     });
  }

  tcp::socket socket_;
  Framing framing_;
  FaultState& fault_;
  std::array<char, 65536> chunk_{};
  std::string in_;
  std::string outbox_;
  std::string in_write_;
  bool writing_ = false;
  uint64_t messages_ = 0;
  std::optional<std::string> held_;
  bool stalled_ = false;
};

// An echo server on 127.0.0.1 (an OS-chosen port), served by one thread of its own.
class EchoServer {
 public:
  EchoServer(Framing framing, Fault fault) : framing_(framing) {
    fault_.fault = fault;
    acceptor_.open(tcp::v4());
    acceptor_.set_option(net::socket_base::reuse_address(true));
    acceptor_.bind(tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
    acceptor_.listen(net::socket_base::max_listen_connections);
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }

  ~EchoServer() {
    io_.stop();
    thread_.join();
  }

  uint16_t port() const { return acceptor_.local_endpoint().port(); }

 private:
  void accept() {
    acceptor_.async_accept([this](const error_code& ec, tcp::socket socket) {
      if (ec) return;
      socket.set_option(tcp::no_delay(true));
      std::make_shared<EchoSession>(std::move(socket), framing_, fault_)->read();
      accept();
    });
  }

  Framing framing_;
  FaultState fault_;
  net::io_context io_;
  tcp::acceptor acceptor_{io_};
  std::thread thread_;
};

struct ClientRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

ClientRun run_client(const std::string& args) {
  const std::string cmd = std::string(CARACAL_PIPELINE_CLIENT) + " " + args + " 2>&1";
  ClientRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot run " << cmd;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0)
    r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string at(const EchoServer& s) {
  return "--connect 127.0.0.1:" + std::to_string(s.port()) + " --timeout-s 60 ";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(PipelineClient, PassesAgainstACorrectLengthPrefixedEcho) {
  EchoServer server(Framing::kLengthPrefixed, Fault::kNone);
  const ClientRun r = run_client(at(server) +
                                 "--connections 50 --requests 200 --pipeline 8 --min-bytes 0 "
                                 "--max-bytes 3000 --framing length_prefixed --seed 7");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "connections=50 replies=10000 ")) << r.output;
}

TEST(PipelineClient, PassesAgainstACorrectLineEcho) {
  EchoServer server(Framing::kLine, Fault::kNone);
  const ClientRun r = run_client(at(server) +
                                 "--connections 20 --requests 100 --pipeline 4 --min-bytes 0 "
                                 "--max-bytes 500 --framing line");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "connections=20 replies=2000 ")) << r.output;
}

TEST(PipelineClient, FiveHundredConnections) {
  EchoServer server(Framing::kLengthPrefixed, Fault::kNone);
  const ClientRun r = run_client(at(server) +
                                 "--connections 500 --requests 20 --pipeline 4 --min-bytes 1 "
                                 "--max-bytes 256");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "connections=500 replies=10000 ")) << r.output;
}

TEST(PipelineClient, OneCorruptedReplyFails) {
  for (const auto& [framing, name] : {std::pair{Framing::kLengthPrefixed, "length_prefixed"},
                                      std::pair{Framing::kLine, "line"}}) {
    EchoServer server(framing, Fault::kCorrupt);
    const ClientRun r = run_client(at(server) + "--framing " + name +
                                   " --connections 10 --requests 20 --pipeline 4 "
                                   "--min-bytes 1 --max-bytes 100");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, ", request 3: expected ")) << r.output;
    EXPECT_TRUE(contains(r.output, "first difference at byte ")) << r.output;
    EXPECT_TRUE(contains(r.output, "1 of 10 connections")) << r.output;
  }
}

TEST(PipelineClient, SwappedRepliesFail) {
  for (const auto& [framing, name] : {std::pair{Framing::kLengthPrefixed, "length_prefixed"},
                                      std::pair{Framing::kLine, "line"}}) {
    EchoServer server(framing, Fault::kSwap);
    const ClientRun r = run_client(at(server) + "--framing " + name +
                                   " --connections 10 --requests 20 --pipeline 4 "
                                   "--min-bytes 1 --max-bytes 100");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, ", request 3: ")) << r.output;
    EXPECT_TRUE(contains(r.output, "of request 4")) << r.output;
    EXPECT_TRUE(contains(r.output, "out of order")) << r.output;
  }
}

TEST(PipelineClient, TruncatedReplyFails) {
  {
    EchoServer server(Framing::kLine, Fault::kTruncate);
    const ClientRun r = run_client(at(server) +
                                   "--framing line --connections 3 --requests 10 --pipeline 2 "
                                   "--min-bytes 5 --max-bytes 5");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "request 3: expected 5 bytes, got 4")) << r.output;
  }
  {
    EchoServer server(Framing::kLengthPrefixed, Fault::kTruncate);
    const ClientRun r = run_client(at(server) +
                                   "--connections 3 --requests 10 --pipeline 2 "
                                   "--min-bytes 5 --max-bytes 5");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "request 3: expected 5 bytes, the reply's prefix says 4"))
        << r.output;
  }
}

TEST(PipelineClient, MissingRepliesTimeOut) {
  EchoServer server(Framing::kLengthPrefixed, Fault::kStall);
  const ClientRun r = run_client("--connect 127.0.0.1:" + std::to_string(server.port()) +
                                 " --timeout-s 1 --connections 2 --requests 10 --pipeline 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "7 replies missing on 1 connections")) << r.output;
  EXPECT_TRUE(contains(r.output, "connections=2 replies=13 ")) << r.output;
}

TEST(PipelineClient, RefusedConnectionFails) {
  uint16_t port;
  {
    net::io_context io;
    tcp::acceptor a(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  const ClientRun r = run_client("--connect 127.0.0.1:" + std::to_string(port) +
                                 " --connections 2 --requests 1 --timeout-s 10");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "connect to 127.0.0.1:" + std::to_string(port) + ": "))
      << r.output;
}

TEST(PipelineClient, BadArgumentsAreRefused) {
  ClientRun r = run_client("--connect 127.0.0.1:1 --min-bytes 10 --max-bytes 5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, 1);
  EXPECT_NE(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "--min-bytes")) << r.output;
  r = run_client("--connect 127.0.0.1:1 --framing chunked");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "chunked")) << r.output;
}

}  // namespace
