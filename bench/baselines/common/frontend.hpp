// The network side the baseline servers share: kernel sockets through Boost.Asio, the same
// framing as snic_server's listeners (UDP: one datagram per message; TCP: a 4-byte big-endian
// length, then the message), N I/O threads. Each thread has its own io_context, its own UDP
// socket and its own TCP acceptor, all bound to the same ports with SO_REUSEPORT, so the kernel
// spreads peers over the threads and a thread's sockets are only ever touched by that thread.
//
// A request goes to the server's Submit function with a ReplyTo that says where its reply goes.
// ReplyTo::send may be called on the request's own I/O thread (inline handlers) or on any other
// thread (the host-centric server's GPU thread): UDP replies then go out with sendto(2) on the
// socket's descriptor (the kernel serialises datagrams; Asio only waits on that socket for
// reads), TCP replies are posted to the connection's thread, which writes them in the order they
// were posted.
#pragma once

#include <sys/socket.h>
#include <CLI/CLI.hpp>
#include <boost/asio.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace caracal::bench::baseline {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;

struct FrontendStats {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> replies{0};
  std::atomic<uint64_t> dropped{0};  // no reply: the handler asked for none, or an error
  std::atomic<uint64_t> bad_frames{0};

  // What the server ends with: "served requests R replies P dropped D bad_frames B".
  std::string served() const {
    char line[160];
    std::snprintf(
        line, sizeof(line), "served requests %lu replies %lu dropped %lu bad_frames %lu",
        static_cast<unsigned long>(requests.load()), static_cast<unsigned long>(replies.load()),
        static_cast<unsigned long>(dropped.load()), static_cast<unsigned long>(bad_frames.load()));
    return line;
  }
};

class TcpSession;

// Where one request's reply goes.
struct ReplyTo {
  udp::socket* udp_socket = nullptr;  // UDP: the socket it came in on, and the peer
  udp::endpoint peer;
  std::shared_ptr<TcpSession> session;  // TCP
  bool same_thread = true;              // called on the request's I/O thread
};

class TcpSession : public std::enable_shared_from_this<TcpSession> {
 public:
  using Submit = std::function<void(const std::byte*, uint32_t, ReplyTo)>;
  TcpSession(tcp::socket socket, uint32_t max_message, const Submit& submit, FrontendStats& stats)
      : socket_(std::move(socket)), max_message_(max_message), submit_(submit), stats_(stats) {}

  // The connection's number, in the order the server accepted them (from 0): a server that
  // spreads connections over GPUs keeps each on one, so that its replies stay in order.
  uint64_t id() const { return id_; }

  void start() {
    boost::system::error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    read_header();
  }

  // Queues a framed reply; on the session's thread only.
  void write(const std::byte* data, uint32_t n) {
    const uint8_t prefix[4] = {static_cast<uint8_t>(n >> 24), static_cast<uint8_t>(n >> 16),
                               static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)};
    const auto* raw = reinterpret_cast<const uint8_t*>(data);
    pending_.insert(pending_.end(), prefix, prefix + 4);
    pending_.insert(pending_.end(), raw, raw + n);
    if (!writing_) flush();
  }
  asio::any_io_executor executor() { return socket_.get_executor(); }

 private:
  void flush() {
    writing_ = true;
    writing_buf_.swap(pending_);
    pending_.clear();
    asio::async_write(socket_, asio::buffer(writing_buf_),
                      [self = shared_from_this()](boost::system::error_code ec, size_t) {
                        self->writing_ = false;
                        if (ec) return self->close();
                        if (!self->pending_.empty()) self->flush();
                      });
  }
  void read_header() {
    asio::async_read(socket_, asio::buffer(header_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (ec) return self->close();
                       const uint32_t n =
                           (uint32_t{self->header_[0]} << 24) | (uint32_t{self->header_[1]} << 16) |
                           (uint32_t{self->header_[2]} << 8) | uint32_t{self->header_[3]};
                       if (n > self->max_message_) {
                         ++self->stats_.bad_frames;
                         std::fprintf(stderr,
                                      "baseline: TCP frame of %u bytes is over the largest "
                                      "message (%u); closing the connection\n",
                                      n, self->max_message_);
                         return self->close();
                       }
                       self->body_.resize(n);
                       self->read_body();
                     });
  }
  void read_body() {
    asio::async_read(socket_, asio::buffer(body_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (ec) return self->close();
                       ++self->stats_.requests;
                       ReplyTo to;
                       to.session = self;
                       self->submit_(self->body_.data(), static_cast<uint32_t>(self->body_.size()),
                                     std::move(to));
                       self->read_header();
                     });
  }
  void close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  static uint64_t next_id() {
    static std::atomic<uint64_t> next{0};
    return next.fetch_add(1, std::memory_order_relaxed);  // a number, nothing to order
  }

  const uint64_t id_ = next_id();
  tcp::socket socket_;
  uint32_t max_message_;
  const Submit& submit_;
  FrontendStats& stats_;
  std::array<uint8_t, 4> header_{};
  std::vector<std::byte> body_;
  std::vector<uint8_t> pending_, writing_buf_;
  bool writing_ = false;
};

// The executor of the thread that read the request.
inline asio::any_io_executor executor_of(const ReplyTo& to) {
  return to.udp_socket != nullptr ? to.udp_socket->get_executor() : to.session->executor();
}

// Sends a reply from wherever it is called (see the file comment).
inline void send_reply(ReplyTo& to, const std::byte* data, uint32_t n, FrontendStats& stats) {
  ++stats.replies;
  if (to.udp_socket != nullptr) {
    if (to.same_thread) {
      boost::system::error_code ec;
      to.udp_socket->send_to(asio::buffer(data, n), to.peer, 0, ec);
    } else {
      ::sendto(to.udp_socket->native_handle(), data, n, 0, to.peer.data(), to.peer.size());
    }
    return;
  }
  if (to.same_thread) {
    to.session->write(data, n);
    return;
  }
  asio::post(to.session->executor(),
             [s = to.session, bytes = std::vector<std::byte>(data, data + n)] {
               s->write(bytes.data(), static_cast<uint32_t>(bytes.size()));
             });
}

class Frontend {
 public:
  using Submit = TcpSession::Submit;

  struct Options {
    std::string address = "127.0.0.1";
    uint16_t udp_port = 0;  // 0: the OS picks (printed)
    uint16_t tcp_port = 0;
    uint32_t threads = 1;
    uint32_t max_message = 65536;
  };

  // The command-line options every baseline server shares: --handler, --address, the ports,
  // --threads and --max-message-bytes (at most max_message_limit).
  static void add_options(CLI::App& app, Options& o, std::string& handler,
                          uint32_t max_message_limit) {
    app.add_option("--handler", handler, "echo, matvec or face")
        ->check(CLI::IsMember({"echo", "matvec", "face"}))
        ->capture_default_str();
    app.add_option("--address", o.address, "Address to bind")->capture_default_str();
    app.add_option("--udp-port", o.udp_port, "UDP port (0: any)")->capture_default_str();
    app.add_option("--tcp-port", o.tcp_port, "TCP port, length-prefixed (0: any)")
        ->capture_default_str();
    app.add_option("--threads", o.threads, "I/O threads")
        ->check(CLI::Range(1u, 256u))
        ->capture_default_str();
    app.add_option("--max-message-bytes", o.max_message, "Largest request")
        ->check(CLI::Range(1u, max_message_limit))
        ->capture_default_str();
  }

  Frontend(const Options& o, Submit submit) : o_(o), submit_(std::move(submit)) {
    using reuse_port = asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;
    const auto address = asio::ip::make_address(o.address);
    udp_port_ = o.udp_port;
    tcp_port_ = o.tcp_port;
    for (uint32_t t = 0; t < o.threads; ++t) {
      auto w = std::make_unique<Worker>();
      w->udp_socket = std::make_unique<udp::socket>(w->io);
      w->udp_socket->open(address.is_v6() ? udp::v6() : udp::v4());
      w->udp_socket->set_option(reuse_port(true));
      w->udp_socket->set_option(asio::socket_base::receive_buffer_size(4 << 20));
      w->udp_socket->set_option(asio::socket_base::send_buffer_size(4 << 20));
      w->udp_socket->bind(udp::endpoint(address, udp_port_));
      udp_port_ = w->udp_socket->local_endpoint().port();
      w->acceptor = std::make_unique<tcp::acceptor>(w->io);
      w->acceptor->open(address.is_v6() ? tcp::v6() : tcp::v4());
      w->acceptor->set_option(reuse_port(true));
      w->acceptor->set_option(asio::socket_base::reuse_address(true));
      w->acceptor->bind(tcp::endpoint(address, tcp_port_));
      w->acceptor->listen();
      tcp_port_ = w->acceptor->local_endpoint().port();
      w->buf.resize(o.max_message + 1);
      workers_.push_back(std::move(w));
    }
  }
  // The ports bound: with port 0 the first thread's socket picks it and the others share it.
  uint16_t udp_port() const { return udp_port_; }
  uint16_t tcp_port() const { return tcp_port_; }
  FrontendStats& stats() { return stats_; }

  // Serves until stop(); returns when every thread has ended.
  void run() {
    std::vector<std::thread> threads;
    for (auto& w : workers_) {
      receive(*w);
      accept(*w);
      threads.emplace_back([&io = w->io] { io.run(); });
    }
    for (auto& t : threads)
      t.join();
  }
  void stop() {
    for (auto& w : workers_)
      w->io.stop();
  }
  // run() until SIGINT or SIGTERM, which call `on_signal` (when given) and stop().
  void run_until_signal(const std::function<void()>& on_signal = {}) {
    asio::io_context signals_io;
    asio::signal_set signals(signals_io, SIGINT, SIGTERM);
    signals.async_wait([&](boost::system::error_code, int) {
      if (on_signal) on_signal();
      stop();
    });
    std::thread signal_thread([&signals_io] { signals_io.run(); });
    run();
    signals_io.stop();
    signal_thread.join();
  }

 private:
  struct Worker {
    asio::io_context io;
    std::unique_ptr<udp::socket> udp_socket;
    std::unique_ptr<tcp::acceptor> acceptor;
    std::vector<std::byte> buf;
    udp::endpoint peer;
  };

  void receive(Worker& w) {
    w.udp_socket->async_receive_from(
        asio::buffer(w.buf), w.peer, [this, &w](boost::system::error_code ec, size_t n) {
          if (ec == asio::error::operation_aborted) return;
          if (!ec) {
            if (n > o_.max_message) {
              ++stats_.bad_frames;  // oversize, dropped
            } else {
              ++stats_.requests;
              ReplyTo to;
              to.udp_socket = w.udp_socket.get();
              to.peer = w.peer;
              submit_(w.buf.data(), static_cast<uint32_t>(n), std::move(to));
            }
          }
          receive(w);
        });
  }
  void accept(Worker& w) {
    w.acceptor->async_accept([this, &w](boost::system::error_code ec, tcp::socket s) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) std::make_shared<TcpSession>(std::move(s), o_.max_message, submit_, stats_)->start();
      accept(w);
    });
  }

  Options o_;
  Submit submit_;
  FrontendStats stats_;
  uint16_t udp_port_ = 0;
  uint16_t tcp_port_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace caracal::bench::baseline
