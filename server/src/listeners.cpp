#include "caracal/server/listeners.hpp"

#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "caracal/server/dpdk_port.hpp"
#include "caracal/server/framing.hpp"
#include "caracal/server/service.hpp"
#include "listener_stats.hpp"
#include "stream_writer.hpp"

namespace caracal::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using udp = asio::ip::udp;
using boost::system::error_code;

namespace {
Result<asio::ip::address> parse_address(const config::HostPort& hp) {
  error_code ec;
  const auto a = asio::ip::make_address(hp.host == "localhost" ? "127.0.0.1" : hp.host, ec);
  if (ec) return invalid_argument("'" + hp.host + "' is not an IP address");
  return a;
}
}  // namespace

Result<uint16_t> listen_tcp(tcp::acceptor& acceptor, const config::HostPort& at,
                            const std::string& what) {
  Result<asio::ip::address> address = parse_address(at);
  if (!address.ok()) return invalid_argument(what + ": " + address.status().message());
  const tcp::endpoint ep(*address, at.port);
  error_code ec;
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) {
    const uint16_t port = acceptor.local_endpoint(ec).port();
    if (!ec) return port;
  }
  return Status(StatusCode::kIoError,
                what + ": cannot listen on " + at.str() + ": " + ec.message());
}

std::optional<std::string> format_error_reply(const ListenerConfig& config,
                                              const std::string& reason) {
  if (!config.error_reply) return std::nullopt;
  std::string text = *config.error_reply;
  constexpr std::string_view kPlaceholder = "{reason}";
  const size_t at = text.find(kPlaceholder);
  if (at != std::string::npos) text.replace(at, kPlaceholder.size(), reason);
  return text;
}

namespace {

// -------------------------------------------------------------------------------------------
// TCP

class TcpConnection;

// What every connection of one TCP listener shares: its configuration and codec, the service it
// feeds, its counters, and the open connections (to close them at stop).
struct TcpListenerState {
  TcpListenerState(const ListenerConfig& c, const ListenerDeps& d, Codec codec)
      : config(c),
        codec(std::move(codec)),
        service(d.service),
        replies(d.replies),
        name(listener_name(c)),
        stats(d.metrics, d.service.name(), name) {}

  ListenerConfig config;
  Codec codec;
  Service& service;
  ReplyTable& replies;
  std::string name;
  ListenerStats stats;

  std::mutex m;
  std::unordered_map<uint64_t, std::weak_ptr<TcpConnection>> connections;
};

class TcpConnection final : public ReplySink, public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(std::shared_ptr<TcpListenerState> shared, tcp::socket socket, uint64_t id)
      : shared_(std::move(shared)), socket_(std::move(socket)), id_(id) {
    const FramingConfig& f = shared_->codec.config();
    buffer_.resize(size_t{f.max_message_bytes} + Codec::header_capacity() + f.delimiter.size() +
                   64 * 1024);
    error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : ep.address().to_string() + ":" + std::to_string(ep.port());
  }
  ~TcpConnection() override {
    if (token_base_) shared_->replies.release(*token_base_);
  }

  // Any thread: the connection starts on its own strand, like everything else it does, so a
  // shutdown() posted right after it finds it started.
  void start() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->begin(); });
  }

  // Engine threads (see ReplySink): a burst's replies reach the strand in one post. Replies of
  // one connection may come from several engine threads, in any order: on_reply() puts them
  // back in request order by their sequence numbers.
  void deliver(uint32_t thread, uint64_t token, const udp::endpoint&, Reply reply) override {
    outgoing_[thread].emplace_back(token, std::move(reply));
  }
  void end_burst(uint32_t thread) override {
    auto& outgoing = outgoing_[thread];
    if (outgoing.empty()) return;
    asio::post(socket_.get_executor(),
               [self = shared_from_this(), batch = std::move(outgoing)]() mutable {
                 for (auto& [token, reply] : batch)
                   self->on_reply(token, std::move(reply));
               });
    outgoing.clear();  // moved-from: make it empty and usable again
  }

  // Server shutdown: stop reading; close once the replies in flight are written.
  void shutdown() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      self->read_done_ = true;
      error_code ec;
      self->socket_.shutdown(tcp::socket::shutdown_receive, ec);
      self->maybe_finish();
    });
  }
  void close_later() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->close_now(); });
  }

 private:
  // The connection's strand (see start()).
  void begin() {
    token_base_ = shared_->replies.acquire(shared_from_this());
    if (!token_base_) {
      SPDLOG_WARN("{}: connection from {} refused: every reply slot is in use", shared_->name,
                  peer_);
      shared_->stats.drop(DropReason::kReplySlots);
      close_now();
      return;
    }
    shared_->stats.connections.add(1);
    counted_ = true;
    error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    read();
  }

  struct Pending {
    bool done = false;
    bool fatal = false;  // close the connection after this one
    Reply reply;
  };

  void read() {
    if (reading_ || read_done_ || closed_) return;
    if (begin_ != 0 && begin_ == end_) begin_ = end_ = 0;
    if (end_ == buffer_.size() && begin_ != 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    reading_ = true;
    socket_.async_read_some(asio::buffer(buffer_.data() + end_, buffer_.size() - end_),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              self->reading_ = false;
                              self->on_read(ec, n);
                            });
  }

  void on_read(error_code ec, size_t n) {
    if (closed_) return;
    if (ec) {
      read_done_ = true;
      if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
        spdlog::debug("{}: {} read failed: {}", shared_->name, peer_, ec.message());
        close_now();
        return;
      }
      // The client finished sending (or half-closed): answer what it sent, then close.
      process();
      maybe_finish();
      return;
    }
    end_ += n;
    resume();
  }

  // Serves what is buffered, then reads more unless something holds it back.
  void resume() {
    process();
    if (closed_ || read_done_) {
      maybe_finish();
      return;
    }
    if (pending_.size() >= shared_->config.max_pipeline) return;  // on_reply resumes
    if (congested_) {
      congested_ = false;
      std::weak_ptr<TcpConnection> weak = weak_from_this();
      shared_->service.park([weak] {
        if (auto self = weak.lock()) {
          asio::post(self->socket_.get_executor(), [self] { self->resume(); });
        }
      });
      return;
    }
    if (end_ == buffer_.size() && begin_ == 0) {
      fail_stream("a message is larger than the read buffer");
      return;
    }
    read();
  }

  void process() {
    const Codec& codec = shared_->codec;
    while (!closing_ && pending_.size() < shared_->config.max_pipeline) {
      const Decoded d = codec.decode(std::span<const std::byte>(
          reinterpret_cast<const std::byte*>(buffer_.data() + begin_), end_ - begin_));
      if (d.status == DecodeStatus::kNeedMore) {
        if (read_done_ && end_ != begin_) {
          spdlog::info("{}: {} closed its side with a partial message of {} bytes; dropped",
                       shared_->name, peer_, end_ - begin_);
          shared_->stats.drop(DropReason::kPartialMessage);
          begin_ = end_;
        }
        return;
      }
      if (d.status == DecodeStatus::kMalformed) {
        fail_stream(d.error);
        return;
      }
      std::string bytes(buffer_.data() + begin_ + d.payload_offset, d.payload_bytes);
      begin_ += d.consumed;
      const uint32_t seq = next_seq_;
      next_seq_ = (next_seq_ + 1) & kTokenSequenceMask;
      pending_.emplace_back();
      shared_->stats.requests.inc();
      switch (shared_->service.dispatch(*token_base_ | seq, std::move(bytes), id_, true)) {
        case DispatchStatus::kQueued:
          break;
        case DispatchStatus::kCongested:
          congested_ = true;
          break;
        case DispatchStatus::kFull:  // not returned when may_exceed is set
        case DispatchStatus::kNoAgent:
          shared_->stats.drop(DropReason::kNoAgent);
          complete(seq, Reply{Reply::Kind::kError,
                              "no agent serves service " + shared_->service.name()});
          break;
      }
    }
  }

  // Malformed or oversize input: nothing after it can be framed, so the connection ends after
  // the replies before it (and an error reply, if the listener has one).
  void fail_stream(const std::string& reason) {
    SPDLOG_WARN("{}: closing the connection from {}: {}", shared_->name, peer_, reason);
    shared_->stats.drop(DropReason::kMalformed);
    closing_ = true;
    read_done_ = true;
    Pending p;
    p.done = true;
    p.fatal = true;
    p.reply = Reply{Reply::Kind::kError, reason};
    pending_.push_back(std::move(p));
    next_seq_ = (next_seq_ + 1) & kTokenSequenceMask;
    write_ready();
  }

  void on_reply(uint64_t token, Reply reply) {
    if (closed_) return;
    const uint32_t seq = split_token(token).sequence;
    complete(seq, std::move(reply));
    if (!read_done_ && !reading_ && pending_.size() <= shared_->config.max_pipeline / 2) {
      resume();
    }
  }

  void complete(uint32_t seq, Reply reply) {
    const uint32_t first =
        (next_seq_ - static_cast<uint32_t>(pending_.size())) & kTokenSequenceMask;
    const uint32_t index = (seq - first) & kTokenSequenceMask;
    if (index >= pending_.size() || pending_[index].done) {
      shared_->stats.drop(DropReason::kStaleReply);
      return;
    }
    pending_[index].done = true;
    pending_[index].reply = std::move(reply);
    write_ready();
  }

  void frame(const std::string& payload) {
    shared_->codec.append_framed(writer_.pending(), payload);
    shared_->stats.replies.inc();
  }

  // Moves the replies at the front that are complete into the output, in request order.
  void write_ready() {
    while (!pending_.empty() && pending_.front().done && !closing_after_write_) {
      Pending& p = pending_.front();
      bool fatal = p.fatal;
      if (p.reply.kind == Reply::Kind::kData && !shared_->codec.can_frame(p.reply.bytes.size())) {
        shared_->stats.drop(DropReason::kReplyUnframeable);
        p.reply = Reply{Reply::Kind::kError, "a reply of " + std::to_string(p.reply.bytes.size()) +
                                                 " bytes cannot be framed by this listener"};
      }
      switch (p.reply.kind) {
        case Reply::Kind::kData:
          frame(p.reply.bytes);
          break;
        case Reply::Kind::kNoReply:
          break;
        case Reply::Kind::kError: {
          const std::optional<std::string> text =
              format_error_reply(shared_->config, p.reply.bytes);
          if (text && shared_->codec.can_frame(text->size())) {
            frame(*text);
          } else {
            if (!fatal) {
              SPDLOG_WARN(
                  "{}: closing the connection from {}: a request failed ({}) and the "
                  "listener has no error_reply",
                  shared_->name, peer_, p.reply.bytes);
              shared_->stats.drop(DropReason::kRequestFailed);
            }
            fatal = true;
          }
          break;
        }
      }
      pending_.pop_front();
      if (fatal) {
        closing_after_write_ = true;
        closing_ = true;
        read_done_ = true;
      }
    }
    write();
  }

  void write() {
    if (writer_.writing() || closed_) return;
    if (!writer_.has_pending()) {
      maybe_finish();
      return;
    }
    writer_.write(socket_, [self = shared_from_this()](error_code ec) {
      if (ec) {
        spdlog::debug("{}: {} write failed: {}", self->shared_->name, self->peer_, ec.message());
        self->close_now();
        return;
      }
      self->write();
    });
  }

  void maybe_finish() {
    if (closed_ || writer_.writing() || writer_.has_pending()) return;
    if (closing_after_write_ || (read_done_ && pending_.empty())) {
      error_code ec;
      socket_.shutdown(tcp::socket::shutdown_send, ec);
      close_now();
    }
  }

  void close_now() {
    if (closed_) return;
    closed_ = true;
    error_code ec;
    socket_.close(ec);
    if (counted_) shared_->stats.connections.add(-1);
    if (token_base_) shared_->replies.release(*token_base_);  // late replies now drop
    std::lock_guard lock(shared_->m);
    shared_->connections.erase(id_);
  }

  std::shared_ptr<TcpListenerState> shared_;
  tcp::socket socket_;
  uint64_t id_;
  // Replies delivered by the engine and not yet flushed to the strand, per engine thread:
  // element i is used by engine thread i only.
  std::array<std::vector<std::pair<uint64_t, Reply>>, kMaxEngineThreads> outgoing_;
  std::string peer_;
  std::optional<uint64_t> token_base_;
  bool counted_ = false;

  std::vector<char> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  bool reading_ = false;
  bool read_done_ = false;
  bool congested_ = false;
  bool closing_ = false;              // no more requests are taken
  bool closing_after_write_ = false;  // close once the output is written
  bool closed_ = false;

  std::deque<Pending> pending_;  // requests read and not yet answered, oldest first
  uint32_t next_seq_ = 0;
  StreamWriter writer_;  // framed replies, written in request order
};

class TcpListener final : public Listener {
 public:
  TcpListener(const ListenerConfig& config, const ListenerDeps& deps, Codec codec)
      : io_(deps.io),
        shared_(std::make_shared<TcpListenerState>(config, deps, std::move(codec))),
        acceptor_(deps.io.main()) {}
  ~TcpListener() override { stop(); }

  Status start() override {
    Result<uint16_t> port = listen_tcp(acceptor_, shared_->config.listen, shared_->name);
    if (!port.ok()) return port.status();
    port_ = *port;
    accept();
    return Status::ok_status();
  }

  void stop() override {
    error_code ec;
    acceptor_.close(ec);
    for (auto& c : connections())
      c->shutdown();
  }

  void close_all() override {
    for (auto& c : connections())
      c->close_later();
  }

  uint16_t port() const override { return port_; }
  const std::string& name() const override { return shared_->name; }

 private:
  std::vector<std::shared_ptr<TcpConnection>> connections() {
    std::vector<std::shared_ptr<TcpConnection>> out;
    std::lock_guard lock(shared_->m);
    for (auto& [id, weak] : shared_->connections) {
      if (auto c = weak.lock()) out.push_back(std::move(c));
    }
    return out;
  }

  void accept() {
    // The connection goes to the next I/O context: its reads, writes and replies run there.
    acceptor_.async_accept(
        asio::make_strand(io_.next()), [this](error_code ec, tcp::socket socket) {
          if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
          if (ec) {
            // Out of descriptors, for instance: log and keep accepting.
            SPDLOG_WARN("{}: accept failed: {}", shared_->name, ec.message());
          } else {
            const uint64_t id = ++next_id_;
            auto c = std::make_shared<TcpConnection>(shared_, std::move(socket), id);
            {
              std::lock_guard lock(shared_->m);
              shared_->connections.emplace(id, c);
            }
            c->start();
          }
          accept();
        });
  }

  IoPool& io_;
  std::shared_ptr<TcpListenerState> shared_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  uint64_t next_id_ = 0;
};

// -------------------------------------------------------------------------------------------
// UDP

// A UDP listener's sockets (one per I/O thread) and the sink its replies come back to; owned
// by UdpListener and kept alive by the receives and sends in flight.
class UdpListenerCore final : public ReplySink,
                              public std::enable_shared_from_this<UdpListenerCore> {
 public:
  UdpListenerCore(const ListenerConfig& config, const ListenerDeps& deps)
      : config_(config),
        io_(deps.io),
        service_(deps.service),
        replies_(deps.replies),
        name_(listener_name(config)),
        stats_(deps.metrics, deps.service.name(), name_),
        sockets_count_(static_cast<uint32_t>(deps.io.size())),
        engine_hosted_(deps.engine_hosted) {}

  Status open() {
    Result<asio::ip::address> address = parse_address(config_.listen);
    if (!address.ok()) return invalid_argument(name_ + ": " + address.status().message());
    udp::endpoint ep(*address, config_.listen.port);
    for (uint32_t i = 0; i < sockets_count_; ++i) {
      auto s = std::make_unique<Socket>(io_.at(i), service_.config().max_message_bytes);
      error_code ec;
      s->socket.open(ep.protocol(), ec);
      if (!ec && sockets_count_ > 1) {
        s->socket.set_option(asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>(true),
                             ec);
      }
      if (!ec) size_buffers(*s, i == 0, ec);
      if (!ec) s->socket.bind(ep, ec);
      if (!ec) s->socket.non_blocking(true, ec);
      if (ec) {
        return Status(StatusCode::kIoError,
                      name_ + ": cannot bind " + config_.listen.str() + ": " + ec.message());
      }
      s->reply_fd = ::fcntl(s->socket.native_handle(), F_DUPFD_CLOEXEC, 0);
      if (s->reply_fd < 0) {
        return Status(StatusCode::kIoError,
                      name_ + ": dup of the socket for replies: " + std::strerror(errno));
      }
      // Port 0: the first socket got a port from the OS; the others share it.
      ep.port(s->socket.local_endpoint(ec).port());
      sockets_.push_back(std::move(s));
    }
    port_ = ep.port();
    for (uint32_t i = 0; i < sockets_.size(); ++i)
      receive(i);
    return Status::ok_status();
  }

  void close() {
    for (auto& s : sockets_) {
      asio::post(s->socket.get_executor(), [self = shared_from_this(), s = s.get()] {
        error_code ec;
        s->socket.close(ec);
      });
    }
  }

  // Engine threads (see ReplySink). A datagram needs no ordering with anything else on the
  // socket, so replies go out from the engine thread itself, a burst per sendmmsg() through the
  // socket's reply descriptor (see Socket): handing each to the I/O thread would cost a wake-up
  // of that thread, and one system call per reply the engine's time.
  // The slot was one-shot (see on_datagram()): route() released it already.
  void deliver(uint32_t thread, uint64_t token, const udp::endpoint& peer, Reply reply) override {
    // A counter only: nothing is published through it.
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
    const uint32_t i = split_token(token).slot % static_cast<uint32_t>(sockets_.size());
    Socket& s = *sockets_[i];
    switch (reply.kind) {
      case Reply::Kind::kNoReply:
        return;
      case Reply::Kind::kData:
        s.outgoing[thread].push_back(Datagram{peer, std::move(reply.bytes)});
        break;
      case Reply::Kind::kError:
        if (!config_.error_reply) stats_.drop(DropReason::kRequestFailed);
        if (auto text = format_error_reply(config_, reply.bytes)) {
          s.outgoing[thread].push_back(Datagram{peer, std::move(*text)});
        }
        break;
    }
  }

  // Engine thread. With few requests outstanding the engine sends the burst itself: handing it
  // to the socket's I/O thread would add that thread's wake-up to every reply's latency. Under
  // load the sends go to the I/O threads, one post per socket and burst: a send costs the sender
  // the network stack's work for the datagram (on loopback likely the receiver's as well), and the
  // engine, which serves every socket, would otherwise be the serial stage.
  // With the engine in the I/O threads, the sender is an I/O thread: it always sends itself.
  void end_burst(uint32_t thread) override {
    const bool hand_off =
        !engine_hosted_ && outstanding_.load(std::memory_order_relaxed) >= kHandOffOutstanding;
    for (auto& s : sockets_) {
      std::vector<Datagram>& outgoing = s->outgoing[thread];
      if (outgoing.empty()) continue;
      if (!hand_off) {
        send_outgoing(*s, outgoing);
        outgoing.clear();
        continue;
      }
      asio::post(s->socket.get_executor(),
                 [self = shared_from_this(), s = s.get(), burst = std::move(outgoing)]() mutable {
                   self->send_outgoing(*s, burst);
                 });
      outgoing = {};
    }
  }

  uint16_t port() const { return port_; }
  const std::string& name() const { return name_; }

 private:
  struct Datagram {
    udp::endpoint peer;
    std::string bytes;
  };
  // Requests outstanding on this listener from which the engine hands reply bursts to the I/O
  // threads instead of sending them itself (see end_burst()).
  static constexpr int64_t kHandOffOutstanding = 16;
  // Datagrams taken per recvmmsg() once a receive has completed (see drain()).
  static constexpr size_t kReceiveBatch = 16;
  // recvmmsg() calls per drain: a socket that never runs dry gives its thread back after this
  // many datagrams (kReceiveBatch each), so that the other handlers queued there get a turn.
  static constexpr int kDrainRounds = 8;

  struct Socket {
    Socket(asio::io_context& io, uint32_t max_message_bytes)
        : socket(asio::make_strand(io)),
          // One byte more than the largest message detects an oversize datagram. No UDP
          // datagram is longer than 65,507 bytes, so no buffer needs more than 64 KiB.
          stride(std::min<size_t>(size_t{max_message_bytes} + 1, 65536)),
          buffers(stride * kReceiveBatch) {}
    Socket(const Socket&) = delete;
    Socket& operator=(const Socket&) = delete;
    ~Socket() {
      if (reply_fd >= 0) ::close(reply_fd);
    }
    char* buffer(size_t k) { return buffers.data() + k * stride; }

    udp::socket socket;  // receives; used by its strand only
    // A duplicate of the socket's descriptor that every send goes through, from the I/O thread
    // (error replies) and from the engine thread (replies) alike. A udp::socket object may not
    // be used from two threads at once, but the kernel socket may: sendto() is one system call
    // on an open descriptor. Being a duplicate, it stays valid until this object is destroyed,
    // even once `socket` is closed, so a reply racing with close() still has a socket.
    int reply_fd = -1;
    // Replies not yet flushed, per engine thread: element i is used by engine thread i only.
    std::array<std::vector<Datagram>, kMaxEngineThreads> outgoing;
    // Receive state, used by the socket's strand only: kReceiveBatch buffers of `stride` bytes,
    // their senders, and the recvmmsg() vectors that point at them.
    size_t stride;
    std::vector<char> buffers;
    std::array<udp::endpoint, kReceiveBatch> peers;
    std::array<mmsghdr, kReceiveBatch> headers{};
    std::array<iovec, kReceiveBatch> pieces{};
  };

  // Asks for config_.socket_buffer_bytes of receive and send buffer. `report`: say what the
  // kernel gave (once per listener), as a warning where it cut a size the config asked for.
  void size_buffers(Socket& s, bool report, error_code& ec) {
    const int want = static_cast<int>(config_.socket_buffer_bytes);
    s.socket.set_option(asio::socket_base::receive_buffer_size(want), ec);
    if (!ec) s.socket.set_option(asio::socket_base::send_buffer_size(want), ec);
    if (ec || !report) return;
    asio::socket_base::receive_buffer_size rcv;
    asio::socket_base::send_buffer_size snd;
    s.socket.get_option(rcv, ec);
    if (!ec) s.socket.get_option(snd, ec);
    if (ec) return;
    // Linux reports twice the size it took (the other half is its bookkeeping, socket(7));
    // Asio halves the value again on Linux, so these are the sizes asked for after the cap.
    const int rcv_usable = rcv.value();
    const int snd_usable = snd.value();
    if (rcv_usable >= want && snd_usable >= want) {
      spdlog::debug("{}: socket buffers of {} bytes", name_, want);
      return;
    }
    const std::string text = fmt::format(
        "{}: asked for {} byte socket buffers, the kernel gave {} (receive) and {} (send); it "
        "caps them at net.core.rmem_max and net.core.wmem_max (sysctl), and large datagrams "
        "that find a full buffer are dropped by the kernel",
        name_, want, rcv_usable, snd_usable);
    if (config_.socket_buffer_set) {
      SPDLOG_WARN("{}", text);
    } else {
      spdlog::info("{}", text);
    }
  }

  // The first datagram of a turn comes through Asio (which waits on the reactor when the socket
  // is empty); drain() then takes what else has queued up in batches, so that under load a
  // completion handler, and a system call, serve many datagrams instead of one.
  void receive(uint32_t i) {
    Socket* s = sockets_[i].get();
    s->socket.async_receive_from(asio::buffer(s->buffer(0), s->stride), s->peers[0],
                                 [self = shared_from_this(), s, i](error_code ec, size_t n) {
                                   if (ec == asio::error::operation_aborted || !s->socket.is_open())
                                     return;
                                   if (!ec) {
                                     self->on_datagram(*s, s->buffer(0), n, s->peers[0]);
                                     self->drain(*s);
                                   }
                                   self->receive(i);
                                 });
  }

  // The socket's strand: receives without waiting until the socket is empty or kDrainRounds
  // batches were taken. Either way receive() follows, and Asio's own receive tries the socket
  // before it waits for the reactor, so a datagram left behind is never stranded.
  void drain(Socket& s) {
    const int fd = s.socket.native_handle();
    for (int round = 0; round < kDrainRounds; ++round) {
      for (size_t k = 0; k < kReceiveBatch; ++k) {
        s.pieces[k] = iovec{s.buffer(k), s.stride};
        s.headers[k] = mmsghdr{};
        s.headers[k].msg_hdr.msg_name = s.peers[k].data();
        s.headers[k].msg_hdr.msg_namelen = static_cast<socklen_t>(s.peers[k].capacity());
        s.headers[k].msg_hdr.msg_iov = &s.pieces[k];
        s.headers[k].msg_hdr.msg_iovlen = 1;
      }
      int got;
      do {
        got = ::recvmmsg(fd, s.headers.data(), kReceiveBatch, MSG_DONTWAIT, nullptr);
      } while (got < 0 && errno == EINTR);
      // EAGAIN: the socket is empty. Another error is left to the next receive, which reports
      // it through Asio like any receive error.
      if (got <= 0) return;
      for (int k = 0; k < got; ++k) {
        s.peers[k].resize(s.headers[k].msg_hdr.msg_namelen);
        on_datagram(s, s.buffer(k), s.headers[k].msg_len, s.peers[k]);
      }
      if (static_cast<size_t>(got) < kReceiveBatch) return;
    }
  }

  void on_datagram(Socket& s, const char* data, size_t n, const udp::endpoint& peer) {
    stats_.requests.inc();
    if (n > service_.config().max_message_bytes) {
      stats_.drop(DropReason::kOversize);
      spdlog::debug("{}: datagram from {} is longer than max_message_bytes ({}); dropped", name_,
                    peer.address().to_string(), service_.config().max_message_bytes);
      send_error(
          s, peer,
          "message longer than " + std::to_string(service_.config().max_message_bytes) + " bytes");
      return;
    }
    // One-shot: the engine's route() frees the slot as it takes the reply, so the engine takes
    // one slot lock per reply instead of two.
    std::optional<uint64_t> token = replies_.acquire(shared_from_this(), peer, true);
    if (!token) {
      stats_.drop(DropReason::kReplySlots);
      return;
    }
    // Before the dispatch, so that the engine's decrement in deliver() never comes first.
    outstanding_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t flow = flow_of(peer);
    switch (service_.dispatch(*token, std::string(data, n), flow, false)) {
      case DispatchStatus::kQueued:
      case DispatchStatus::kCongested:
        return;
      case DispatchStatus::kFull:
        outstanding_.fetch_sub(1, std::memory_order_relaxed);
        replies_.release(*token);
        stats_.drop(DropReason::kQueueFull);
        return;
      case DispatchStatus::kNoAgent:
        outstanding_.fetch_sub(1, std::memory_order_relaxed);
        replies_.release(*token);
        stats_.drop(DropReason::kNoAgent);
        send_error(s, peer, "no agent serves service " + service_.name());
        return;
    }
  }

  void send_error(Socket& s, const udp::endpoint& peer, const std::string& reason) {
    if (auto text = format_error_reply(config_, reason)) send(s, peer, *text);
  }

  // The engine thread, or the socket's I/O thread for a handed-off burst: sends `burst`, up to
  // kSendBatch datagrams per sendmmsg() through the reply descriptor. Never blocks: a full send
  // buffer drops what is left of the burst, another error the datagram it hit.
  void send_outgoing(Socket& s, std::vector<Datagram>& burst) {
    constexpr size_t kSendBatch = 64;
    std::array<mmsghdr, kSendBatch> headers;
    std::array<iovec, kSendBatch> pieces;
    size_t next = 0;
    while (next < burst.size()) {
      const size_t n = std::min(kSendBatch, burst.size() - next);
      for (size_t k = 0; k < n; ++k) {
        Datagram& d = burst[next + k];
        pieces[k] = iovec{d.bytes.data(), d.bytes.size()};
        headers[k] = mmsghdr{};
        headers[k].msg_hdr.msg_name = d.peer.data();
        headers[k].msg_hdr.msg_namelen = static_cast<socklen_t>(d.peer.size());
        headers[k].msg_hdr.msg_iov = &pieces[k];
        headers[k].msg_hdr.msg_iovlen = 1;
      }
      const int sent =
          ::sendmmsg(s.reply_fd, headers.data(), static_cast<unsigned>(n), MSG_DONTWAIT);
      if (sent > 0) {
        stats_.replies.inc(static_cast<uint64_t>(sent));
        next += static_cast<size_t>(sent);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        for (; next < burst.size(); ++next)
          stats_.drop(DropReason::kSendBufferFull);
      } else if (errno != EINTR) {
        stats_.drop(DropReason::kSendFailed);
        ++next;
      }
    }
  }

  // Any thread (see Socket::reply_fd). Never blocks: a full send buffer drops the reply.
  void send(Socket& s, const udp::endpoint& peer, const std::string& bytes) {
    ssize_t n;
    do {
      n = ::sendto(s.reply_fd, bytes.data(), bytes.size(), MSG_DONTWAIT, peer.data(),
                   static_cast<socklen_t>(peer.size()));
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      stats_.drop(errno == EAGAIN || errno == EWOULDBLOCK ? DropReason::kSendBufferFull
                                                          : DropReason::kSendFailed);
      return;
    }
    stats_.replies.inc();
  }

  ListenerConfig config_;
  IoPool& io_;
  Service& service_;
  ReplyTable& replies_;
  std::string name_;
  ListenerStats stats_;
  uint32_t sockets_count_;
  bool engine_hosted_;
  std::vector<std::unique_ptr<Socket>> sockets_;
  uint16_t port_ = 0;
  // Requests dispatched and not yet answered: incremented by the I/O threads, decremented by
  // the engine; it only chooses who sends the replies (see end_burst()).
  std::atomic<int64_t> outstanding_{0};
};

class UdpListener final : public Listener {
 public:
  UdpListener(const ListenerConfig& config, const ListenerDeps& deps)
      : core_(std::make_shared<UdpListenerCore>(config, deps)) {}
  ~UdpListener() override { stop(); }
  Status start() override { return core_->open(); }
  void stop() override {
    if (!stopped_) core_->close();
    stopped_ = true;
  }
  void close_all() override { stop(); }
  uint16_t port() const override { return core_->port(); }
  const std::string& name() const override { return core_->name(); }

 private:
  std::shared_ptr<UdpListenerCore> core_;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<Listener> make_listener(const ListenerConfig& config, const ListenerDeps& deps) {
  if (config.kind == ListenerKind::kDpdk) {
    if (deps.dpdk != nullptr) return deps.dpdk->make_listener(config, deps.service);
    throw std::invalid_argument(listener_name(config) + ": the server has no DPDK port");
  }
  if (config.protocol == Protocol::kUdp) return std::make_unique<UdpListener>(config, deps);
  FramingConfig framing = config.framing;
  framing.max_message_bytes = deps.service.config().max_message_bytes;
  Result<Codec> codec = Codec::make(framing);
  if (!codec.ok()) {
    throw std::invalid_argument(listener_name(config) + ": " + codec.status().message());
  }
  return std::make_unique<TcpListener>(config, deps, std::move(codec).value());
}

}  // namespace caracal::server
