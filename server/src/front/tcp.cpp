// TCP listeners (front/listeners.hpp has the contract): a connection per client on the I/O
// threads in turn, the listener's framing cutting its stream into requests, replies written in
// request order.
#include <spdlog/spdlog.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include <array>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "../stream_writer.hpp"
#include "caracal/server/dispatch.hpp"
#include "caracal/server/framing.hpp"
#include "caracal/server/tunables.hpp"
#include "listener_common.hpp"

namespace caracal::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using udp = asio::ip::udp;
using boost::system::error_code;

namespace {

class TcpConnection;

// What every connection of one TCP listener shares: its configuration and codec, the service it
// feeds, its counters, and the open connections (to close them at stop).
struct TcpListenerState {
  TcpListenerState(const ListenerConfig& c, const ListenerDeps& d, Codec codec)
      : config(c),
        codec(std::move(codec)),
        service(d.service),
        replies(d.replies),
        engine_threads(d.engine_threads),
        name(listener_name(c)),
        stats(d.metrics, d.service.name(), name) {}

  ListenerConfig config;
  Codec codec;
  Service& service;
  ReplyTable& replies;
  uint32_t engine_threads;  // the lanes of each connection's ReplySink
  std::string name;
  ListenerStats stats;

  std::mutex m;
  std::unordered_map<uint64_t, std::weak_ptr<TcpConnection>> connections;
};

class TcpConnection final : public ReplySink, public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(std::shared_ptr<TcpListenerState> shared, tcp::socket socket, uint64_t id)
      : ReplySink(shared->engine_threads),
        shared_(std::move(shared)),
        socket_(std::move(socket)),
        id_(id),
        outgoing_(lanes()) {
    const FramingConfig& f = shared_->codec.config();
    buffer_.resize(size_t{f.max_message_bytes} + Codec::header_capacity() + f.delimiter.size() +
                   tunables::kStreamReadSlack);
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
  std::vector<std::vector<std::pair<uint64_t, Reply>>> outgoing_;
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

}  // namespace

std::unique_ptr<Listener> make_tcp_listener(const ListenerConfig& config,
                                            const ListenerDeps& deps) {
  FramingConfig framing = config.framing;
  framing.max_message_bytes = deps.service.config().max_message_bytes;
  Result<Codec> codec = Codec::make(framing);
  if (!codec.ok()) {
    throw std::invalid_argument(listener_name(config) + ": " + codec.status().message());
  }
  return std::make_unique<TcpListener>(config, deps, std::move(codec).value());
}

}  // namespace caracal::server
