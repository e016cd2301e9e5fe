// UDP listeners through Boost.Asio (front/listeners.hpp has the contract): a socket per I/O
// thread on one port, datagrams taken in batches with recvmmsg(), replies sent in bursts with
// sendmmsg() from the engine thread or, under load, from the socket's I/O thread.
#include <fcntl.h>
#include <linux/filter.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/udp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "dispatch.hpp"
#include "listener_common.hpp"
#include "tunables.hpp"

namespace caracal::server {

namespace asio = boost::asio;
using udp = asio::ip::udp;
using boost::system::error_code;

namespace {

// A UDP listener's sockets (one per I/O thread) and the sink its replies come back to; owned
// by UdpListener and kept alive by the receives and sends in flight.
class UdpListenerCore final : public ReplySink,
                              public std::enable_shared_from_this<UdpListenerCore> {
 public:
  UdpListenerCore(const ListenerConfig& config, const ListenerDeps& deps)
      : ReplySink(deps.engine_threads),
        config_(config),
        io_(deps.io),
        service_(deps.service),
        replies_(deps.replies),
        name_(listener_name(config)),
        stats_(deps.metrics, deps.service.name(), name_),
        metrics_(deps.metrics),
        sockets_count_(static_cast<uint32_t>(deps.io.size())),
        engine_hosted_(deps.engine_hosted) {}

  Status open() {
    Result<asio::ip::address> address = parse_address(config_.listen);
    if (!address.ok()) return invalid_argument(name_ + ": " + address.status().message());
    udp::endpoint ep(*address, config_.listen.port);
    for (uint32_t i = 0; i < sockets_count_; ++i) {
      auto s = std::make_unique<Socket>(io_.at(i), service_.config().max_message_bytes, lanes());
      Labels labels = stats_.labels;
      labels.emplace_back("socket", std::to_string(i));
      s->received = &metrics_.counter(
          "caracal_listener_socket_datagrams_total",
          "Datagrams each socket of a UDP listener received (a socket per I/O thread): how "
          "evenly the listener's spread deals them",
          labels);
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
    if (config_.spread == ListenerConfig::Spread::kDatagrams && sockets_.size() > 1) {
      if (Status st = spread_datagrams(); !st.ok()) return st;
    }
    for (uint32_t i = 0; i < sockets_.size(); ++i)
      receive(i);
    return Status::ok_status();
  }

  // spread: datagrams. A classic BPF program on the SO_REUSEPORT group picks the socket of each
  // datagram: a random number modulo the number of sockets, an index into the group, which
  // holds the sockets in the order they were bound (sockets_'s). Attached through any socket of
  // the group, it serves all of them; sockets of another process on the port would make the
  // group larger, but binding to a port another user holds fails, and this process binds all.
  Status spread_datagrams() {
    sock_filter code[] = {
        // The ancillary load: a negative offset, as the kernel reads it (filter.h).
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, static_cast<uint32_t>(SKF_AD_OFF + SKF_AD_RANDOM)),
        BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, static_cast<uint32_t>(sockets_.size())),
        BPF_STMT(BPF_RET | BPF_A, 0),
    };
    sock_fprog program{static_cast<unsigned short>(std::size(code)), code};
    if (::setsockopt(sockets_[0]->socket.native_handle(), SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF,
                     &program, sizeof program) != 0) {
      return Status(StatusCode::kIoError,
                    name_ +
                        ": spread: datagrams: cannot attach the program that deals "
                        "datagrams among the sockets (SO_ATTACH_REUSEPORT_CBPF, Linux 4.5 "
                        "and later): " +
                        std::strerror(errno));
    }
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
  void deliver(uint32_t thread, uint64_t token, const udp::endpoint& peer,
               ReplyView reply) override {
    // A counter only: nothing is published through it. Kept only where it chooses who sends
    // (see end_burst()): every I/O thread and every engine thread would write its line for
    // every request.
    if (!engine_hosted_) outstanding_.fetch_sub(1, std::memory_order_relaxed);
    Socket& s = *sockets_[socket_for(thread, token)];
    switch (reply.kind) {
      case Reply::Kind::kNoReply:
        return;
      case Reply::Kind::kData:
        s.outgoing[thread].add(peer, reply.bytes);
        break;
      case Reply::Kind::kError:
        if (!config_.error_reply) stats_.drop(DropReason::kRequestFailed);
        if (auto text = format_error_reply(config_, reply.bytes)) {
          s.outgoing[thread].add(peer, *text);
        }
        break;
    }
  }

  // Engine thread. With few requests outstanding the engine sends the burst itself: handing it
  // to the socket's I/O thread would add that thread's wake-up to every reply's latency. Under
  // load the sends go to the I/O threads, one post per socket and burst: a send costs the sender
  // the network stack's work for the datagram (on loopback likely the receiver's as well), and the
  // engine, which serves every socket, would otherwise be the serial stage.
  // With the engine in the I/O threads, the sender is an I/O thread: it always sends itself,
  // the whole burst through its own socket (see socket_for()).
  void end_burst(uint32_t thread) override {
    if (engine_hosted_) {
      Socket& s = *sockets_[thread % sockets_.size()];
      Outgoing& outgoing = s.outgoing[thread];
      if (outgoing.used != 0) send_outgoing(s, outgoing.burst());
      outgoing.used = 0;
      return;
    }
    const bool hand_off =
        outstanding_.load(std::memory_order_relaxed) >= tunables::kUdpHandOffOutstanding;
    for (auto& s : sockets_) {
      Outgoing& outgoing = s->outgoing[thread];
      if (outgoing.used == 0) continue;
      if (!hand_off) {
        send_outgoing(*s, outgoing.burst());
        outgoing.used = 0;
        continue;
      }
      // The burst goes to the I/O thread with its buffers; the next one starts anew.
      outgoing.items.resize(outgoing.used);
      asio::post(s->socket.get_executor(),
                 [self = shared_from_this(), s = s.get(),
                  burst = std::move(outgoing.items)]() mutable { self->send_outgoing(*s, burst); });
      outgoing.items = {};
      outgoing.used = 0;
    }
  }

  uint16_t port() const { return port_; }
  const std::string& name() const { return name_; }

 private:
  struct Datagram {
    udp::endpoint peer;
    std::string bytes;
  };
  // One engine thread's replies for one socket since its last end_burst(). The datagrams stay
  // when a burst has been sent, and the next burst copies into their strings, whose capacity
  // they keep: a thread that sends its bursts itself allocates nothing once its bursts have
  // reached their largest count and size.
  struct Outgoing {
    std::vector<Datagram> items;
    size_t used = 0;  // items [0, used) are this burst's
    void add(const udp::endpoint& peer, std::string_view bytes) {
      if (used == items.size()) items.emplace_back();
      Datagram& d = items[used++];
      d.peer = peer;
      d.bytes.assign(bytes);
    }
    std::span<Datagram> burst() { return {items.data(), used}; }
  };
  // Batches (tunables.hpp): kUdpHandOffOutstanding (see end_burst()), kUdpReceiveBatch and
  // kUdpDrainRounds (see drain()), kUdpSendBatch (see send_outgoing()).
  static constexpr size_t kReceiveBatch = tunables::kUdpReceiveBatch;

  struct Socket {
    Socket(asio::io_context& io, uint32_t max_message_bytes, uint32_t engine_threads)
        : socket(asio::make_strand(io)),
          outgoing(engine_threads),
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

    // Receives; used by its strand only. The strand's own type, not Asio's type-erased
    // any_io_executor: a completion handler looks its executor up with prefer(), which copies
    // an erased strand into a heap block (two per receive); the concrete one is copied inline.
    asio::basic_datagram_socket<udp, asio::strand<asio::io_context::executor_type>> socket;
    Counter* received = nullptr;  // caracal_listener_socket_datagrams_total of this socket
    // A duplicate of the socket's descriptor that every send goes through, from the I/O thread
    // (error replies) and from the engine thread (replies) alike. A udp::socket object may not
    // be used from two threads at once, but the kernel socket may: sendto() is one system call
    // on an open descriptor. Being a duplicate, it stays valid until this object is destroyed,
    // even once `socket` is closed, so a reply racing with close() still has a socket.
    int reply_fd = -1;
    // Replies not yet flushed, per engine thread: element i is used by engine thread i only.
    std::vector<Outgoing> outgoing;
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
                                     s->received->inc();
                                     self->on_datagram(*s, s->buffer(0), n, s->peers[0]);
                                     self->drain(*s);
                                   }
                                   self->receive(i);
                                 });
  }

  // The socket's strand: receives without waiting until the socket is empty or kUdpDrainRounds
  // batches were taken. Either way receive() follows, and Asio's own receive tries the socket
  // before it waits for the reactor, so a datagram left behind is never stranded.
  void drain(Socket& s) {
    const int fd = s.socket.native_handle();
    for (int round = 0; round < tunables::kUdpDrainRounds; ++round) {
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
      s.received->inc(static_cast<uint64_t>(got));
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
    if (!engine_hosted_) outstanding_.fetch_add(1, std::memory_order_relaxed);
    const uint64_t flow = flow_of(peer);
    switch (service_.dispatch(*token, std::string_view(data, n), flow, false)) {
      case DispatchStatus::kQueued:
      case DispatchStatus::kCongested:
        return;
      case DispatchStatus::kFull:
        if (!engine_hosted_) outstanding_.fetch_sub(1, std::memory_order_relaxed);
        replies_.release(*token);
        stats_.drop(DropReason::kQueueFull);
        return;
      case DispatchStatus::kNoAgent:
        if (!engine_hosted_) outstanding_.fetch_sub(1, std::memory_order_relaxed);
        replies_.release(*token);
        stats_.drop(DropReason::kNoAgent);
        send_error(s, peer, "no agent serves service " + service_.name());
        return;
    }
  }

  // The socket whose descriptor sends the reply (every socket has the listener's port, so the
  // client cannot tell). With the engine in the I/O threads, engine thread i is I/O thread i
  // and sends through socket i: one sendmmsg() per burst, however many sockets there are (the
  // replies spread over every socket cost a call per socket and burst, a call per reply or so
  // once there are as many sockets as a burst has replies). Otherwise by reply slot, which
  // spreads the bursts that end_burst() hands off over the I/O threads.
  size_t socket_for(uint32_t thread, uint64_t token) const {
    if (engine_hosted_) return thread % sockets_.size();
    return split_token(token).slot % sockets_.size();
  }

  void send_error(Socket& s, const udp::endpoint& peer, const std::string& reason) {
    if (auto text = format_error_reply(config_, reason)) send(s, peer, *text);
  }

  // The engine thread, or the socket's I/O thread for a handed-off burst: sends `burst`, up to
  // kUdpSendBatch datagrams per sendmmsg() through the reply descriptor. Never blocks: a full
  // send buffer drops what is left of the burst, another error the datagram it hit.
  void send_outgoing(Socket& s, std::span<Datagram> burst) {
    constexpr size_t kSendBatch = tunables::kUdpSendBatch;
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
  Registry& metrics_;
  uint32_t sockets_count_;
  bool engine_hosted_;
  std::vector<std::unique_ptr<Socket>> sockets_;
  uint16_t port_ = 0;
  // Requests dispatched and not yet answered: incremented by the I/O threads, decremented by
  // the engine; it only chooses who sends the replies (see end_burst()), and is not kept with
  // the engine in the I/O threads, where the engine always sends.
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

std::unique_ptr<Listener> make_udp_listener(const ListenerConfig& config,
                                            const ListenerDeps& deps) {
  return std::make_unique<UdpListener>(config, deps);
}

}  // namespace caracal::server
