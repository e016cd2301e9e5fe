// TCP listeners (front/listeners.hpp has the contract): a connection per client on the I/O
// threads in turn, the listener's framing cutting its stream into requests, replies written in
// request order.
//
// What bounds a connection: the listener's max_connections and max_connections_per_address at
// accept; a read buffer that starts at tunables::kTcpReadInitial and grows only as far as the
// largest message needs; max_pipeline requests in flight; max_queued_reply_bytes of replies not
// yet taken by the kernel, past which it stops reading; and three deadlines on one timer: idle
// (nothing in flight, no request), request (a request's first byte to its last) and send (no
// progress writing replies).
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include "../stream_writer.hpp"
#include "dispatch.hpp"
#include "framing.hpp"
#include "listener_common.hpp"
#include "memory_trim.hpp"
#include "mqueue_manager/engine.hpp"
#include "tunables.hpp"

namespace caracal::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using udp = asio::ip::udp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
// A connection's socket, with its strand's own type as executor rather than Asio's type-erased
// any_io_executor: every completion handler looks its executor up with prefer(), which copies an
// erased strand into a heap block; the concrete one is copied inline.
using StrandSocket = asio::basic_stream_socket<tcp, asio::strand<asio::io_context::executor_type>>;

namespace {

class TcpConnection;

// A TCP listener's counters of what happened to its connections, beyond ListenerStats: every
// series exists from the start.
struct TcpConnectionStats {
  TcpConnectionStats(Registry& registry, const Labels& labels)
      : refused_max_connections(refused(registry, labels, "max_connections")),
        refused_per_address(refused(registry, labels, "max_connections_per_address")),
        accept_fd_limit(accept_failed(registry, labels, "fd_limit")),
        accept_other(accept_failed(registry, labels, "other")),
        closed_idle(closed(registry, labels, "idle_timeout")),
        closed_request(closed(registry, labels, "request_timeout")),
        closed_send(closed(registry, labels, "send_timeout")),
        reply_pauses(registry.counter(
            "caracal_listener_reply_backlog_pauses_total",
            "Times a TCP connection stopped reading because its unsent replies reached "
            "max_queued_reply_bytes",
            labels)) {}

  Counter& refused_max_connections;
  Counter& refused_per_address;
  Counter& accept_fd_limit;
  Counter& accept_other;
  Counter& closed_idle;
  Counter& closed_request;
  Counter& closed_send;
  Counter& reply_pauses;

 private:
  static Labels with_reason(Labels labels, const char* reason) {
    labels.emplace_back("reason", reason);
    return labels;
  }
  static Counter& refused(Registry& r, const Labels& labels, const char* reason) {
    return r.counter("caracal_listener_refused_connections_total",
                     "TCP connections closed as they were accepted, by the limit they met",
                     with_reason(labels, reason));
  }
  static Counter& accept_failed(Registry& r, const Labels& labels, const char* reason) {
    return r.counter("caracal_listener_accept_failures_total",
                     "Times accepting a TCP connection failed: fd_limit (out of file "
                     "descriptors or socket memory) or other",
                     with_reason(labels, reason));
  }
  static Counter& closed(Registry& r, const Labels& labels, const char* reason) {
    return r.counter("caracal_listener_closed_connections_total",
                     "TCP connections the server closed for a timeout, by which",
                     with_reason(labels, reason));
  }
};

// A connection's requests read and not yet answered, oldest first: a ring of entries that are
// reused from one request to the next, replies' strings with their capacity, so that a
// connection in its steady state allocates nothing per request. It grows (doubling) only when
// more requests are open than ever before on the connection, up to max_pipeline and one more
// (the error that ends a stream).
template <class Entry>
class PendingQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  Entry& front() { return slots_[head_]; }
  Entry& operator[](size_t i) { return slots_[(head_ + i) % slots_.size()]; }
  // A new entry at the back, reset (Entry::reset()).
  Entry& push_back() {
    if (size_ == slots_.size()) grow();
    Entry& e = slots_[(head_ + size_) % slots_.size()];
    ++size_;
    e.reset();
    return e;
  }
  void pop_front() {
    slots_[head_].release();
    head_ = (head_ + 1) % slots_.size();
    --size_;
  }

 private:
  void grow() {
    std::vector<Entry> next(slots_.empty() ? 8 : slots_.size() * 2);
    for (size_t i = 0; i < size_; ++i)
      next[i] = std::move((*this)[i]);
    slots_ = std::move(next);
    head_ = 0;
  }

  std::vector<Entry> slots_;
  size_t head_ = 0;
  size_t size_ = 0;
};

// What every connection of one TCP listener shares: its configuration and codec, the service it
// feeds, its counters, and the open connections (to close them at stop, and to count them
// against the limits).
struct TcpListenerState {
  TcpListenerState(const ListenerConfig& c, const ListenerDeps& d, Codec codec)
      : config(c),
        codec(std::move(codec)),
        service(d.service),
        replies(d.replies),
        engine_threads(d.engine_threads),
        memory_trim(d.memory_trim),
        name(listener_name(c)),
        stats(d.metrics, d.service.name(), name),
        connection_stats(d.metrics, stats.labels) {}

  ListenerConfig config;
  Codec codec;
  Service& service;
  ReplyTable& replies;
  uint32_t engine_threads;  // the lanes of each connection's ReplySink
  MemoryTrim* memory_trim;  // told of every close; may be null
  std::string name;
  ListenerStats stats;
  TcpConnectionStats connection_stats;

  std::mutex m;  // guards what follows: the acceptor adds, each connection's close removes
  std::unordered_map<uint64_t, std::weak_ptr<TcpConnection>> connections;
  // Open connections by client address, with max_connections_per_address set.
  std::map<asio::ip::address, uint32_t> per_address;
};

class TcpConnection final : public ReplySink, public std::enable_shared_from_this<TcpConnection> {
 public:
  // `io_thread`: the I/O thread whose context the socket is on.
  TcpConnection(std::shared_ptr<TcpListenerState> shared, StrandSocket socket, uint64_t id,
                const tcp::endpoint& peer, uint32_t io_thread)
      : ReplySink(shared->engine_threads),
        shared_(std::move(shared)),
        socket_(std::move(socket)),
        id_(id),
        io_thread_(io_thread),
        flow_(flow_key(id)),
        outgoing_(lanes()),
        peer_address_(peer.address()),
        timer_(socket_.get_executor()) {
    const FramingConfig& f = shared_->codec.config();
    buffer_limit_ = size_t{f.max_message_bytes} + Codec::header_capacity() + f.delimiter.size() +
                    tunables::kStreamReadSlack;
    peer_ = peer.address().to_string() + ":" + std::to_string(peer.port());
  }
  ~TcpConnection() override {
    if (token_base_) shared_->replies.release(*token_base_);
  }

  // Any thread: the connection starts on its own strand, like everything else it does, so a
  // shutdown() posted right after it finds it started.
  void start() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->begin(); });
  }

  // Engine threads (see ReplySink). Replies of one connection may come from several engine
  // threads, in any order: on_reply() puts them back in request order by their sequence
  // numbers.
  //
  // From the engine round of the connection's own I/O thread (the engine hosted in the I/O
  // threads, and the request's queue this thread's, as dispatch prefers), a reply goes into
  // the connection at once: its context has this one thread, which runs no handler of the
  // connection while it runs the round, so nothing else touches the connection now. The reply
  // is framed into the write buffer if it is the oldest unanswered request (else kept in its
  // request's entry), and the burst's write starts at end_burst(): no copy of it but those,
  // no allocation, no post. From any other engine thread, a burst's replies reach the strand
  // in one post.
  void deliver(uint32_t thread, uint64_t token, const udp::endpoint&, ReplyView reply) override {
    if (on_own_thread()) {
      in_burst_ = true;
      on_reply(token, reply.kind, reply.bytes);
      return;
    }
    outgoing_[thread].emplace_back(token, reply.owned());
  }
  void end_burst(uint32_t thread) override {
    if (in_burst_ && on_own_thread()) {
      in_burst_ = false;
      after_replies(/*in_round=*/true);
    }
    auto& outgoing = outgoing_[thread];
    if (outgoing.empty()) return;
    asio::post(socket_.get_executor(),
               [self = shared_from_this(), batch = std::move(outgoing)]() mutable {
                 for (auto& [token, reply] : batch)
                   self->on_reply(token, reply.kind, reply.bytes);
               });
    outgoing.clear();  // moved-from: make it empty and usable again
  }

  // Server shutdown: stop reading; close once the replies in flight are written.
  void shutdown() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      self->read_done_ = true;
      self->begin_ = self->end_;  // requests read and not yet taken are not taken now
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
    active_at_ = Clock::now();
    read();
  }

  struct Pending {
    bool done = false;
    bool fatal = false;  // close the connection after this one
    Reply reply;
    void reset() {
      done = false;
      fatal = false;
      reply.kind = Reply::Kind::kData;
      reply.bytes.clear();
    }
    // Answered and written: a large reply's buffer goes, a small one's stays for the next.
    void release() {
      if (reply.bytes.capacity() > tunables::kStreamWriteKeep) std::string().swap(reply.bytes);
    }
  };

  void read() {
    if (reading_ || read_done_ || closed_) return;
    if (begin_ != 0 && begin_ == end_) begin_ = end_ = 0;
    if (buffer_size_ == 0) {
      resize_buffer(std::min(tunables::kTcpReadInitial, buffer_limit_));
    } else if (end_ == buffer_size_ || grow_) {
      // Full, or the last read took all it was offered (a message longer than the buffer, or a
      // stream with more to read): a larger buffer while it may grow, else room at the front.
      if (buffer_size_ < buffer_limit_) {
        resize_buffer(std::min(buffer_size_ * 2, buffer_limit_));
      } else if (begin_ != 0) {
        std::memmove(buffer_.get(), buffer_.get() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      grow_ = false;
    } else if (begin_ == end_ && small_reads_ >= tunables::kTcpReadShrinkAfter &&
               buffer_size_ > tunables::kTcpReadInitial) {
      resize_buffer(tunables::kTcpReadInitial);
    }
    if (end_ == buffer_size_) {
      fail_stream("a message is larger than the read buffer", DropReason::kMalformed);
      return;
    }
    reading_ = true;
    socket_.async_read_some(asio::buffer(buffer_.get() + end_, buffer_size_ - end_),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              self->reading_ = false;
                              self->on_read(ec, n);
                            });
    schedule();
  }

  // A buffer of `size` bytes holding what the old one held, from its start.
  void resize_buffer(size_t size) {
    auto next = std::make_unique_for_overwrite<char[]>(size);
    if (end_ != begin_) std::memcpy(next.get(), buffer_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
    buffer_ = std::move(next);
    buffer_size_ = size;
  }

  void on_read(error_code ec, size_t n) {
    if (closed_) return;
    if (!ec && read_done_) {
      // Reading ended while this read was in flight: shutdown() (the server stopping) dropped
      // the part of a request that was buffered, so these bytes may begin inside a message, and
      // framing them would take a request's tail for a whole request. None of them is taken.
      maybe_finish();
      return;
    }
    if (!ec) {
      grow_ = end_ + n == buffer_size_;  // the read took all it was offered: there is more
      small_reads_ = n <= tunables::kTcpReadInitial / 4 ? small_reads_ + 1 : 0;
      if (begin_ == end_) partial_at_ = Clock::now();  // the first bytes of a request
    }
    if (ec) {
      read_done_ = true;
      if (ec != asio::error::eof && ec != asio::error::operation_aborted) {
        spdlog::debug("{}: {} read failed: {}", shared_->name, peer_, ec.message());
        close_now();
        return;
      }
      // The client finished sending (or half-closed): answer what it sent, then close.
      peer_finished_ = ec == asio::error::eof;
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
    if (replies_backlogged()) {
      // The client is not taking its replies: read nothing more until they drain (write()
      // resumes), and let the send deadline close the connection if they never do.
      if (!reply_paused_) shared_->connection_stats.reply_pauses.inc();
      reply_paused_ = true;
      return;
    }
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
    read();
  }

  bool replies_backlogged() const {
    return writer_.queued_bytes() >= shared_->config.max_queued_reply_bytes;
  }

  void process() {
    const Codec& codec = shared_->codec;
    while (!closing_ && pending_.size() < shared_->config.max_pipeline && !replies_backlogged()) {
      // After the client's own EOF, what ends its stream may be a message too (a last line
      // without its delimiter); not after a stop, which may have cut a read mid-message.
      const std::span<const std::byte> buffered(
          reinterpret_cast<const std::byte*>(buffer_.get() + begin_), end_ - begin_);
      if (skipping_line_) {
        // The rest of an overlong line, answered already (see below); at the stream's end, what
        // is buffered is all the line's.
        const LineSkip skip = codec.skip_line(buffered);
        begin_ += read_done_ && !skip.ended ? buffered.size() : skip.consumed;
        if (!skip.ended) return;
        skipping_line_ = false;
        continue;
      }
      const Decoded d = peer_finished_ ? codec.decode_at_end(buffered) : codec.decode(buffered);
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
        // A line that is only too long: with an error reply to answer it in its place, the
        // line is dropped and the requests after it are served. Without one, the client could
        // not tell which request went unanswered: the connection closes, as it does for one
        // that fails (write_ready()).
        if (d.skippable && shared_->config.error_reply) {
          spdlog::debug("{}: {}: {}; skipped", shared_->name, peer_, d.error);
          shared_->stats.drop(DropReason::kOversize);
          begin_ += d.consumed;
          skipping_line_ = !d.line_ended;
          const uint32_t seq = next_seq_;
          next_seq_ = (next_seq_ + 1) & kTokenSequenceMask;
          pending_.push_back();
          complete(seq, Reply::Kind::kError, d.error);
          continue;
        }
        fail_stream(d.error, DropReason::kMalformed);
        return;
      }
      // A view of the read buffer: dispatch() copies it before anything moves the buffer.
      const std::string_view bytes(buffer_.get() + begin_ + d.payload_offset, d.payload_bytes);
      begin_ += d.consumed;
      // A whole request: the connection is active, and what follows it in the buffer (if
      // anything) arrived with the last read.
      active_at_ = partial_at_ = Clock::now();
      const uint32_t seq = next_seq_;
      next_seq_ = (next_seq_ + 1) & kTokenSequenceMask;
      pending_.push_back();
      shared_->stats.requests.inc();
      switch (shared_->service.dispatch(*token_base_ | seq, bytes, flow_, true)) {
        case DispatchStatus::kQueued:
          break;
        case DispatchStatus::kCongested:
          congested_ = true;
          break;
        case DispatchStatus::kFull:  // not returned when may_exceed is set
        case DispatchStatus::kNoAgent:
          shared_->stats.drop(DropReason::kNoAgent);
          complete(seq, Reply::Kind::kError, "no agent serves service " + shared_->service.name());
          break;
      }
    }
  }

  // Malformed or oversize input (counted under `drop`), or a request that took too long
  // (counted by the caller): nothing after it can be framed, so the connection ends after the
  // replies before it (and an error reply, if the listener has one).
  void fail_stream(const std::string& reason, std::optional<DropReason> drop) {
    SPDLOG_WARN("{}: closing the connection from {}: {}", shared_->name, peer_, reason);
    if (drop) shared_->stats.drop(*drop);
    closing_ = true;
    read_done_ = true;
    Pending& p = pending_.push_back();
    p.done = true;
    p.fatal = true;
    p.reply.kind = Reply::Kind::kError;
    p.reply.bytes = reason;
    next_seq_ = (next_seq_ + 1) & kTokenSequenceMask;
    write_ready();
  }

  // The engine round of the connection's own I/O thread is running (see deliver()).
  bool on_own_thread() const { return Engine::hosted_thread() == static_cast<int>(io_thread_); }

  // The connection's strand, or its thread's engine round (see deliver()).
  void on_reply(uint64_t token, Reply::Kind kind, std::string_view bytes) {
    if (closed_) return;
    complete(split_token(token).sequence, kind, bytes);
    if (!in_burst_) after_replies(/*in_round=*/false);
  }

  // After replies were taken: after a half-close too, requests left in the buffer when
  // max_pipeline was reached are taken now. Not within an engine round (`in_round`): reading
  // on dispatches requests, which the round's own queues would take in the middle of the
  // round, so the strand does it.
  void after_replies(bool in_round) {
    if (in_round) write();
    if (closed_ || reading_ || closing_ || pending_.size() > shared_->config.max_pipeline / 2) {
      return;
    }
    if (in_round) {
      asio::post(socket_.get_executor(), [self = shared_from_this()] { self->resume(); });
    } else {
      resume();
    }
  }

  void complete(uint32_t seq, Reply::Kind kind, std::string_view bytes) {
    const uint32_t first =
        (next_seq_ - static_cast<uint32_t>(pending_.size())) & kTokenSequenceMask;
    const uint32_t index = (seq - first) & kTokenSequenceMask;
    if (index >= pending_.size() || pending_[index].done) {
      shared_->stats.drop(DropReason::kStaleReply);
      return;
    }
    if (index == 0 && !closing_after_write_) {
      // The oldest unanswered request: framed from where it is, not kept first.
      emit(kind, bytes, false);
      pending_.pop_front();
    } else {
      Pending& p = pending_[index];
      p.done = true;
      p.reply.kind = kind;
      p.reply.bytes.assign(bytes);
    }
    write_ready();
  }

  void frame(std::string_view payload) {
    shared_->codec.append_framed(writer_.pending(), payload);
    shared_->stats.replies.inc();
  }

  // Frames the reply of the oldest unanswered request into the output; `fatal`: the connection
  // closes after it (as it does after an error it cannot send).
  void emit(Reply::Kind kind, std::string_view bytes, bool fatal) {
    std::string unframeable;
    if (kind == Reply::Kind::kData && !shared_->codec.can_frame(bytes.size())) {
      shared_->stats.drop(DropReason::kReplyUnframeable);
      unframeable =
          "a reply of " + std::to_string(bytes.size()) + " bytes cannot be framed by this listener";
      kind = Reply::Kind::kError;
      bytes = unframeable;
    }
    switch (kind) {
      case Reply::Kind::kData:
        frame(bytes);
        break;
      case Reply::Kind::kNoReply:
        break;
      case Reply::Kind::kError: {
        const std::optional<std::string> text = format_error_reply(shared_->config, bytes);
        if (text && shared_->codec.can_frame(text->size())) {
          frame(*text);
        } else {
          if (!fatal) {
            SPDLOG_WARN(
                "{}: closing the connection from {}: a request failed ({}) and the "
                "listener has no error_reply",
                shared_->name, peer_, bytes);
            shared_->stats.drop(DropReason::kRequestFailed);
          }
          fatal = true;
        }
        break;
      }
    }
    if (fatal) {
      closing_after_write_ = true;
      closing_ = true;
      read_done_ = true;
    }
  }

  // Moves the replies at the front that are complete into the output, in request order, and
  // writes them (at the burst's end within an engine round: see deliver()).
  void write_ready() {
    while (!pending_.empty() && pending_.front().done && !closing_after_write_) {
      Pending& p = pending_.front();
      emit(p.reply.kind, p.reply.bytes, p.fatal);
      pending_.pop_front();
    }
    if (!in_burst_) write();
  }

  void write() {
    if (writer_.writing() || closed_) return;
    if (!writer_.has_pending()) {
      maybe_finish();
      schedule();  // nothing left to write: the idle deadline may apply now
      return;
    }
    writer_.write(socket_, [self = shared_from_this()](error_code ec) {
      if (ec) {
        spdlog::debug("{}: {} write failed: {}", self->shared_->name, self->peer_, ec.message());
        self->close_now();
        return;
      }
      if (!self->writer_.has_pending()) self->active_at_ = Clock::now();
      // Reading stopped for the unsent replies (or, after a half-close, taking the requests
      // still buffered did): go on now that they drained.
      if ((self->reply_paused_ || self->read_done_) && !self->reading_ && !self->closing_ &&
          !self->replies_backlogged()) {
        self->reply_paused_ = false;
        self->resume();
      }
      self->write();
    });
    schedule();
  }

  void maybe_finish() {
    if (closed_ || writer_.writing() || writer_.has_pending()) return;
    if (closing_after_write_ || (read_done_ && pending_.empty() && begin_ == end_)) {
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
    timer_.cancel();
    buffer_.reset();
    buffer_size_ = 0;
    if (counted_) shared_->stats.connections.add(-1);
    if (token_base_) shared_->replies.release(*token_base_);  // late replies now drop
    if (shared_->memory_trim != nullptr) shared_->memory_trim->note_closed();
    std::lock_guard lock(shared_->m);
    shared_->connections.erase(id_);
    if (shared_->config.max_connections_per_address != 0) {
      auto it = shared_->per_address.find(peer_address_);
      if (it != shared_->per_address.end() && --it->second == 0) shared_->per_address.erase(it);
    }
  }

  // ---- deadlines: one timer, set to the earliest that applies ----
  //
  // idle:    reading, nothing buffered, nothing in flight or being written: active_at_ plus
  //          idle_timeout_ms (active_at_: the last whole request, or the last write done).
  // request: reading with part of a request buffered: its first byte's arrival plus
  //          request_timeout_ms.
  // send:    a write in flight: its last progress plus send_timeout_ms.
  // The timer is set only when a deadline comes earlier than the one it waits for; when it
  // fires it looks again, so deadlines that move later (every request, every write) cost no
  // timer operation.
  enum class Deadline : uint8_t { kNone, kIdle, kRequest, kSend };

  std::pair<Deadline, Clock::time_point> deadline() const {
    const ListenerConfig& c = shared_->config;
    std::pair<Deadline, Clock::time_point> best{Deadline::kNone, Clock::time_point::max()};
    const auto consider = [&best](Deadline kind, Clock::time_point at) {
      if (at < best.second) best = {kind, at};
    };
    if (closed_) return best;
    if (writer_.writing() && c.send_timeout_ms != 0) {
      consider(Deadline::kSend,
               writer_.last_progress() + std::chrono::milliseconds(c.send_timeout_ms));
    }
    if (reading_) {
      if (begin_ != end_) {
        if (c.request_timeout_ms != 0) {
          consider(Deadline::kRequest,
                   partial_at_ + std::chrono::milliseconds(c.request_timeout_ms));
        }
      } else if (pending_.empty() && !writer_.writing() && !writer_.has_pending() &&
                 c.idle_timeout_ms != 0) {
        consider(Deadline::kIdle, active_at_ + std::chrono::milliseconds(c.idle_timeout_ms));
      }
    }
    return best;
  }

  void schedule() {
    const auto [kind, at] = deadline();
    if (kind == Deadline::kNone) return;  // a wait in progress finds none and stops
    if (timer_waits_ > 0 && timer_at_ <= at) return;
    timer_at_ = at;
    timer_.expires_at(at);  // cancels a wait in progress: its handler only counts itself out
    ++timer_waits_;
    timer_.async_wait([self = shared_from_this()](error_code) { self->on_timer(); });
  }

  void on_timer() {
    --timer_waits_;
    if (closed_ || timer_waits_ > 0) return;
    const auto [kind, at] = deadline();
    if (kind == Deadline::kNone) return;
    if (Clock::now() < at) {
      schedule();
      return;
    }
    expire(kind);
  }

  void expire(Deadline kind) {
    const ListenerConfig& c = shared_->config;
    switch (kind) {
      case Deadline::kNone:
        return;
      case Deadline::kIdle: {
        shared_->connection_stats.closed_idle.inc();
        spdlog::debug("{}: closing the connection from {}: idle for {} ms", shared_->name, peer_,
                      c.idle_timeout_ms);
        read_done_ = true;
        error_code ec;
        socket_.shutdown(tcp::socket::shutdown_send, ec);
        close_now();
        return;
      }
      case Deadline::kRequest:
        shared_->connection_stats.closed_request.inc();
        begin_ = end_;  // the partial request is dropped with the connection
        fail_stream("a request was not whole " + std::to_string(c.request_timeout_ms) +
                        " ms after its first byte (request_timeout_ms)",
                    std::nullopt);
        return;
      case Deadline::kSend:
        shared_->connection_stats.closed_send.inc();
        SPDLOG_WARN(
            "{}: closing the connection from {}: it took no reply bytes for {} ms "
            "(send_timeout_ms), {} bytes of replies queued",
            shared_->name, peer_, c.send_timeout_ms, writer_.queued_bytes());
        close_now();
        return;
    }
  }

  std::shared_ptr<TcpListenerState> shared_;
  StrandSocket socket_;
  uint64_t id_;
  uint32_t io_thread_;
  uint64_t flow_;  // the connection's flow for flow_affinity (flow_key of id_)
  // Replies delivered by the engine and not yet flushed to the strand, per engine thread:
  // element i is used by engine thread i only.
  std::vector<std::vector<std::pair<uint64_t, Reply>>> outgoing_;
  asio::ip::address peer_address_;
  std::string peer_;
  std::optional<uint64_t> token_base_;
  bool counted_ = false;

  // The read buffer: none until the first read, then kTcpReadInitial bytes, doubling up to
  // buffer_limit_ (the largest message, its framing and kStreamReadSlack).
  std::unique_ptr<char[]> buffer_;
  size_t buffer_size_ = 0;
  size_t buffer_limit_ = 0;
  size_t begin_ = 0;
  size_t end_ = 0;
  bool grow_ = false;         // the last read filled the buffer
  uint32_t small_reads_ = 0;  // reads in a row of at most a quarter of kTcpReadInitial
  bool reading_ = false;
  bool read_done_ = false;
  bool peer_finished_ = false;  // reading ended at the client's EOF (not a stop or an error)
  bool congested_ = false;
  bool closing_ = false;              // no more requests are taken
  bool closing_after_write_ = false;  // close once the output is written
  bool closed_ = false;
  bool reply_paused_ = false;   // not reading: max_queued_reply_bytes of replies are unsent
  bool skipping_line_ = false;  // dropping the rest of an overlong line, answered already

  PendingQueue<Pending> pending_;  // requests read and not yet answered, oldest first
  // Replies are being taken in an engine round of this connection's thread (see deliver()):
  // the write waits for end_burst().
  bool in_burst_ = false;
  uint32_t next_seq_ = 0;
  StreamWriter writer_;  // framed replies, written in request order

  asio::steady_timer timer_;  // on the connection's strand; see deadline()
  Clock::time_point timer_at_{};
  uint32_t timer_waits_ = 0;      // waits started and not yet run (one, or a cancelled one too)
  Clock::time_point active_at_;   // the last whole request or finished write (idle deadline)
  Clock::time_point partial_at_;  // when the buffered part of a request began to arrive
};

class TcpListener final : public Listener {
 public:
  TcpListener(const ListenerConfig& config, const ListenerDeps& deps, Codec codec)
      : io_(deps.io),
        shared_(std::make_shared<TcpListenerState>(config, deps, std::move(codec))),
        acceptor_(deps.io.main()),
        retry_timer_(deps.io.main()) {}
  ~TcpListener() override { stop(); }

  Status start() override {
    Result<uint16_t> port = listen_tcp(acceptor_, shared_->config.listen, shared_->name);
    if (!port.ok()) return port.status();
    port_ = *port;
    accept();
    return Status::ok_status();
  }

  void stop() override {
    // On the acceptor's thread: the acceptor and the retry timer belong to it.
    asio::post(acceptor_.get_executor(), [this] {
      error_code ec;
      acceptor_.close(ec);
      retry_timer_.cancel();
    });
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

  // Everything below runs on the acceptor's thread (the first I/O context's).
  void accept() {
    // The connection goes to the next I/O context: its reads, writes and replies run there.
    const uint32_t thread = io_.next_index();
    acceptor_.async_accept(asio::make_strand(io_.at(thread)),
                           [this, thread](error_code ec, StrandSocket socket) {
                             if (ec == asio::error::operation_aborted || !acceptor_.is_open()) {
                               return;
                             }
                             if (ec) {
                               accept_failed(ec);
                             } else {
                               admit(std::move(socket), thread);
                               accept();
                             }
                           });
  }

  // A connection past max_connections or max_connections_per_address is closed at once;
  // otherwise it starts.
  void admit(StrandSocket socket, uint32_t thread) {
    error_code ec;
    const tcp::endpoint peer = socket.remote_endpoint(ec);
    if (ec) return;  // gone already (reset before it was accepted): the socket closes
    const ListenerConfig& c = shared_->config;
    enum class Refused : uint8_t { kNo, kListener, kAddress } refused = Refused::kNo;
    std::shared_ptr<TcpConnection> connection;
    size_t open = 0;
    uint32_t from_address = 0;
    {
      std::lock_guard lock(shared_->m);
      open = shared_->connections.size();
      if (open >= c.max_connections) {
        refused = Refused::kListener;
      } else if (c.max_connections_per_address != 0) {
        uint32_t& n = shared_->per_address[peer.address()];  // a new entry: 0, under the limit
        from_address = n;
        if (n >= c.max_connections_per_address) {
          refused = Refused::kAddress;
        } else {
          ++n;  // given back by the connection's close_now()
        }
      }
      if (refused == Refused::kNo) {
        const uint64_t id = ++next_id_;
        connection = std::make_shared<TcpConnection>(shared_, std::move(socket), id, peer, thread);
        shared_->connections.emplace(id, connection);
      }
    }
    if (connection) {
      connection->start();
      return;
    }
    // NOLINTNEXTLINE(bugprone-use-after-move): moved only into a connection, which returned.
    socket.close(ec);
    if (refused == Refused::kListener) {
      shared_->connection_stats.refused_max_connections.inc();
      SPDLOG_WARN("{}: refused a connection from {}: {} connections open (max_connections)",
                  shared_->name, peer.address().to_string(), open);
    } else {
      shared_->connection_stats.refused_per_address.inc();
      SPDLOG_WARN(
          "{}: refused a connection from {}: {} connections open from that address "
          "(max_connections_per_address)",
          shared_->name, peer.address().to_string(), from_address);
    }
  }

  // Out of descriptors (EMFILE: the process's RLIMIT_NOFILE; ENFILE: the system's) or socket
  // memory: the connection stays in the listen backlog, and accepting again at once would fail
  // again at once, so the acceptor waits tunables::kAcceptRetry. Logged at most once per
  // tunables::kAcceptFailureLogInterval, with the count since the last line.
  void accept_failed(error_code ec) {
    const bool resources = ec == asio::error::no_descriptors || ec.value() == ENFILE ||
                           ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
    (resources ? shared_->connection_stats.accept_fd_limit : shared_->connection_stats.accept_other)
        .inc();
    ++failures_unlogged_;
    const auto now = Clock::now();
    if (now - failure_logged_at_ >= tunables::kAcceptFailureLogInterval) {
      failure_logged_at_ = now;
      if (resources) {
        rlimit limit{};
        getrlimit(RLIMIT_NOFILE, &limit);
        SPDLOG_WARN(
            "{}: cannot accept connections: {}{}; {} connection(s) open here, the process may "
            "open {} files (RLIMIT_NOFILE); new connections wait in the listen backlog, retried "
            "every {} ms ({} failure(s) since the last line). Raise the limit (LimitNOFILE= in a "
            "systemd unit, ulimit -n) or lower max_connections",
            shared_->name, ec.message(),
            ec.value() == ENFILE ? " (the system's limit, fs.file-max)" : "", open_connections(),
            static_cast<uint64_t>(limit.rlim_cur), tunables::kAcceptRetry.count(),
            failures_unlogged_);
      } else {
        SPDLOG_WARN("{}: accept failed: {}; retrying ({} failure(s) since the last line)",
                    shared_->name, ec.message(), failures_unlogged_);
      }
      failures_unlogged_ = 0;
    }
    if (!resources && ec == asio::error::connection_aborted) {
      accept();  // that one client gave up; the next may be waiting
      return;
    }
    retry_timer_.expires_after(tunables::kAcceptRetry);
    retry_timer_.async_wait([this](error_code wait_ec) {
      if (!wait_ec && acceptor_.is_open()) accept();
    });
  }

  size_t open_connections() {
    std::lock_guard lock(shared_->m);
    return shared_->connections.size();
  }

  IoPool& io_;
  std::shared_ptr<TcpListenerState> shared_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  uint16_t port_ = 0;
  uint64_t next_id_ = 0;
  uint64_t failures_unlogged_ = 0;
  Clock::time_point failure_logged_at_{};
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
