#include "destinations.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <deque>

#include "caracal/mqueue/layout.hpp"
#include "framing.hpp"
#include "stream_writer.hpp"
#include "tunables.hpp"

namespace caracal::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

class TcpClientLink final : public ClientLink, public std::enable_shared_from_this<TcpClientLink> {
 public:
  TcpClientLink(asio::io_context& io, const DestinationConfig& config, Codec codec,
                std::shared_ptr<QueueInbox> inbox, Engine& engine, uint32_t engine_thread,
                Registry& metrics)
      : config_(config),
        codec_(std::move(codec)),
        inbox_(std::move(inbox)),
        engine_(engine),
        engine_thread_(engine_thread),
        strand_(asio::make_strand(io)),
        socket_(strand_),
        resolver_(strand_),
        calls_(metrics.counter("caracal_destination_calls_total",
                               "Requests handlers sent to the destination",
                               {{"destination", config.name}})),
        failures_(metrics.counter("caracal_destination_failures_total",
                                  "Calls answered with an error (connection failed, bad reply)",
                                  {{"destination", config.name}})),
        disconnects_(metrics.counter(
            "caracal_destination_disconnects_total",
            "Connections dropped for an error: a malformed or unexpected reply, a read or write "
            "failure, a timeout, the destination closing",
            {{"destination", config.name}})),
        call_seconds_(
            metrics.histogram("caracal_destination_call_seconds",
                              "Time from a call reaching the destination's connection to its reply",
                              {{"destination", config.name}}, latency_buckets_seconds())),
        timer_(strand_) {
    buffer_.resize(size_t{config_.framing.max_message_bytes} + tunables::kStreamReadSlack);
  }

  void send(uint64_t token, std::string bytes) override {
    asio::post(strand_, [self = shared_from_this(), token, b = std::move(bytes)] {
      self->enqueue(token, b);
    });
  }

  void close() override {
    asio::post(strand_, [self = shared_from_this()] {
      self->closed_ = true;
      self->timer_.cancel();
      error_code ec;
      self->socket_.close(ec);
    });
  }

 private:
  std::string where() const {
    return "destination " + config_.name + " (" + config_.connect.str() + ")";
  }

  void enqueue(uint64_t token, const std::string& bytes) {
    if (closed_) return;
    calls_.inc();
    if (!codec_.can_frame(bytes.size())) {
      answer(token,
             where() + ": a request of " + std::to_string(bytes.size()) + " bytes cannot be framed",
             mqueue::kSlotError);
      return;
    }
    codec_.append_framed(writer_.pending(), bytes);
    waiting_.push_back({token, std::chrono::steady_clock::now()});
    arm_timer();
    if (connected_) {
      write();
    } else {
      connect();
    }
  }

  void connect() {
    if (connecting_) return;
    connecting_ = true;
    resolver_.async_resolve(
        config_.connect.host, std::to_string(config_.connect.port),
        [self = shared_from_this()](error_code ec, const tcp::resolver::results_type& results) {
          if (self->closed_) return;
          if (ec) {
            self->fail_all("cannot resolve: " + ec.message());
            return;
          }
          asio::async_connect(self->socket_, results, [self](error_code ec2, const tcp::endpoint&) {
            if (self->closed_) return;
            self->connecting_ = false;
            if (ec2) {
              self->fail_all("cannot connect: " + ec2.message());
              return;
            }
            error_code ignored;
            self->socket_.set_option(tcp::no_delay(true), ignored);
            self->connected_ = true;
            spdlog::info("{}: connected", self->where());
            self->read();
            self->write();
          });
        });
  }

  void write() {
    if (!connected_) return;
    writer_.write(socket_, [self = shared_from_this()](error_code ec) {
      if (self->closed_) return;
      if (ec) {
        self->fail_all("write failed: " + ec.message());
        return;
      }
      self->write();
    });
  }

  void read() {
    if (end_ == buffer_.size() && begin_ != 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    socket_.async_read_some(asio::buffer(buffer_.data() + end_, buffer_.size() - end_),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              if (self->closed_ || !self->connected_) return;
                              if (ec) {
                                self->fail_all(ec == asio::error::eof
                                                   ? "closed the connection"
                                                   : "read failed: " + ec.message());
                                return;
                              }
                              self->end_ += n;
                              self->on_bytes();
                            });
  }

  void on_bytes() {
    for (;;) {
      const Decoded d = codec_.decode(std::span<const std::byte>(
          reinterpret_cast<const std::byte*>(buffer_.data() + begin_), end_ - begin_));
      if (d.status == DecodeStatus::kNeedMore) break;
      if (d.status == DecodeStatus::kMalformed) {
        fail_all("malformed reply: " + d.error);
        return;
      }
      if (waiting_.empty()) {
        // Replies pair with calls by order: with none waiting, the pairing is lost.
        fail_all("sent a reply of " + std::to_string(d.consumed) +
                 " bytes with no call waiting for one (replies pair with calls in order)");
        return;
      }
      const Call call = waiting_.front();
      waiting_.pop_front();
      const auto now = std::chrono::steady_clock::now();  // one clock read for both
      call_seconds_.observe(std::chrono::duration<double>(now - call.sent).count());
      answer(call.token, std::string(buffer_.data() + begin_ + d.payload_offset, d.payload_bytes),
             0, now);
      begin_ += d.consumed;
    }
    if (begin_ == end_) begin_ = end_ = 0;
    if (end_ == buffer_.size() && begin_ == 0) {
      fail_all("a reply is larger than max_message_bytes");
      return;
    }
    read();
  }

  // The connection is unusable: every call waiting on it gets an error; the next request
  // connects again. Logged and counted, with calls waiting or not (a stray reply or a close
  // from the destination with nothing in flight says something about the destination too).
  void fail_all(const std::string& reason) {
    const std::string text = where() + ": " + reason;
    if (connected_) disconnects_.inc();
    SPDLOG_WARN("{}; {} call(s) waiting failed{}", text, waiting_.size(),
                connected_ ? ", the connection dropped" : "");
    for (const Call& call : waiting_)
      answer(call.token, text, mqueue::kSlotError);
    waiting_.clear();
    writer_.pending().clear();
    begin_ = end_ = 0;
    connected_ = false;
    connecting_ = false;
    error_code ec;
    socket_.close(ec);
  }

  // With timeout_ms, a timer runs while calls wait: it fires when the oldest one is due, and
  // fails the connection if that call is still unanswered (a reply in order could not tell a
  // late answer from the next call's).
  void arm_timer() {
    if (config_.timeout_ms == 0 || timer_armed_ || waiting_.empty()) return;
    timer_armed_ = true;
    timer_.expires_at(waiting_.front().sent + std::chrono::milliseconds(config_.timeout_ms));
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      self->timer_armed_ = false;
      if (ec || self->closed_ || self->waiting_.empty()) return;
      const auto due =
          self->waiting_.front().sent + std::chrono::milliseconds(self->config_.timeout_ms);
      if (std::chrono::steady_clock::now() >= due) {
        self->fail_all("no reply within " + std::to_string(self->config_.timeout_ms) + " ms");
        return;
      }
      self->arm_timer();  // the call it was set for was answered: now the next one
    });
  }

  void answer(uint64_t token, std::string bytes, uint16_t flags,
              std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    if ((flags & mqueue::kSlotError) != 0) failures_.inc();
    Message m{token, flags, std::move(bytes), now};
    if (inbox_->submit(m)) engine_.notify(engine_thread_);
  }

  DestinationConfig config_;
  Codec codec_;
  std::shared_ptr<QueueInbox> inbox_;
  Engine& engine_;
  uint32_t engine_thread_;  // serves the client queue (Engine::thread_of)
  asio::strand<asio::io_context::executor_type> strand_;
  tcp::socket socket_;
  tcp::resolver resolver_;
  Counter& calls_;
  Counter& failures_;
  Counter& disconnects_;
  Histogram& call_seconds_;  // answered calls only: failures are counted in failures_

  bool closed_ = false;
  bool connecting_ = false;
  bool connected_ = false;
  struct Call {
    uint64_t token;
    std::chrono::steady_clock::time_point sent;
  };
  std::deque<Call> waiting_;  // requests sent (or queued), oldest first
  asio::steady_timer timer_;
  bool timer_armed_ = false;
  StreamWriter writer_;
  std::vector<char> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace

Destinations::Destinations(IoPool& io, const std::vector<DestinationConfig>& config, Engine& engine,
                           Registry& metrics, bool engine_hosted)
    : io_(io), engine_(engine), metrics_(metrics), engine_hosted_(engine_hosted) {
  for (const DestinationConfig& d : config)
    config_.emplace(d.name, d);
}

std::string Destinations::names() const {
  std::string out;
  for (const auto& [name, c] : config_)
    out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? "(none configured)" : out;
}

std::shared_ptr<ClientLink> Destinations::make_link(const std::string& name,
                                                    std::shared_ptr<QueueInbox> inbox,
                                                    uint32_t engine_thread, bool colocate) {
  const DestinationConfig& c = config_.at(name);
  Result<Codec> codec = Codec::make(c.framing);
  if (!codec.ok())
    throw std::invalid_argument("destination " + name + ": " + codec.status().message());
  asio::io_context& io = engine_hosted_ && colocate ? io_.at(engine_thread) : io_.next();
  return std::make_shared<TcpClientLink>(io, c, std::move(codec).value(), std::move(inbox), engine_,
                                         engine_thread, metrics_);
}

}  // namespace caracal::server
