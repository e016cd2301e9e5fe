// MetricsServer: the /metrics endpoint on Boost.Beast.
//
// Ownership: State (the acceptor and the set of open sessions) is shared by the MetricsServer
// and every pending handler, and each Session by its pending handlers, so stop() and the
// destructor never leave a handler pointing at freed memory. Each connection runs on its own
// strand; the acceptor on another.
#include <chrono>
#include <map>
#include <optional>
#include <string_view>

#include <spdlog/spdlog.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "metrics/metrics.hpp"
#include "tunables.hpp"

namespace caracal::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

using tunables::kMetricsAcceptRetry;
using tunables::kMetricsIdleTimeout;
using tunables::kMetricsMaxRequestBytes;  // header and body each
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

struct MetricsServer::State : std::enable_shared_from_this<MetricsServer::State> {
  State(net::io_context& io, const Registry& registry)
      : io(io),
        registry(registry),
        acceptor_strand(net::make_strand(io)),
        acceptor(acceptor_strand),
        retry_timer(acceptor_strand) {}

  void accept();

  net::io_context& io;
  const Registry& registry;
  net::strand<net::io_context::executor_type> acceptor_strand;
  tcp::acceptor acceptor;  // used on acceptor_strand once listen() has started it
  net::steady_timer retry_timer;
  std::atomic<uint16_t> port{0};

  std::mutex mutex;  // guards what follows
  bool listening = false;
  bool stopped = false;
  std::map<const void*, std::function<void()>> closers;  // per open session: close it
};

class MetricsServer::Session : public std::enable_shared_from_this<MetricsServer::Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<State> state)
      : stream_(std::move(socket)), state_(std::move(state)) {}

  ~Session() {
    std::lock_guard lock(state_->mutex);
    state_->closers.erase(this);
  }

  // Registers with the server (refused once it is stopping) and starts reading.
  void start() {
    {
      std::lock_guard lock(state_->mutex);
      if (state_->stopped) return;
      std::weak_ptr<Session> weak = weak_from_this();
      state_->closers.emplace(this, [weak] {
        if (auto self = weak.lock()) {
          net::post(self->stream_.get_executor(), [self] { self->stream_.close(); });
        }
      });
    }
    read();
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(kMetricsMaxRequestBytes);
    parser_->body_limit(kMetricsMaxRequestBytes);
    stream_.expires_after(kMetricsIdleTimeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::header_limit || ec == http::error::body_limit ||
        ec == http::error::buffer_overflow) {
      respond_error(http::status::payload_too_large, 11, false,
                    "request over " + std::to_string(kMetricsMaxRequestBytes) + " bytes\n");
      return;
    }
    if (ec) {
      // The peer closed, the idle timer fired, stop() closed us, or the request was not HTTP.
      if (ec != http::error::end_of_stream && ec != net::error::operation_aborted &&
          ec != beast::error::timeout && ec != net::error::connection_reset) {
        spdlog::debug("metrics: dropping connection: {}", ec.message());
      }
      stream_.close();
      return;
    }
    const http::request<http::string_body>& req = parser_->get();
    std::string_view target(req.target().data(), req.target().size());
    if (const size_t q = target.find('?'); q != std::string_view::npos)
      target = target.substr(0, q);
    if (target != "/metrics") {
      respond_error(http::status::not_found, req.version(), req.keep_alive(),
                    "not found: " + std::string(target) + " (metrics are at /metrics)\n");
      return;
    }
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      respond_error(http::status::method_not_allowed, req.version(), req.keep_alive(),
                    std::string(req.method_string()) + " is not allowed on /metrics\n");
      return;
    }
    response_ = {};
    response_.result(http::status::ok);
    response_.version(req.version());
    response_.keep_alive(req.keep_alive());
    response_.set(http::field::content_type, kContentType);
    std::string body = state_->registry.render();
    response_.content_length(body.size());
    if (req.method() == http::verb::get) response_.body() = std::move(body);
    write();
  }

  void respond_error(http::status status, unsigned version, bool keep_alive, std::string text) {
    response_ = {};
    response_.result(status);
    response_.version(version);
    response_.keep_alive(keep_alive);
    response_.set(http::field::content_type, "text/plain; charset=utf-8");
    if (status == http::status::method_not_allowed) response_.set(http::field::allow, "GET, HEAD");
    response_.body() = std::move(text);
    response_.prepare_payload();
    write();
  }

  void write() {
    stream_.expires_after(kMetricsIdleTimeout);
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec || !self->response_.keep_alive()) {
                          beast::error_code ignored;
                          self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
                          self->stream_.close();
                          return;
                        }
                        self->read();
                      });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kMetricsMaxRequestBytes * 2};
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
  std::shared_ptr<State> state_;
};

void MetricsServer::State::accept() {
  acceptor.async_accept(net::make_strand(io),
                        [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
                          if (ec == net::error::operation_aborted || !self->acceptor.is_open())
                            return;
                          if (ec) {
                            // Out of descriptors, for instance: keep serving once some are free.
                            SPDLOG_WARN("metrics: accept on port {} failed: {}; retrying",
                                        self->port.load(), ec.message());
                            self->retry_timer.expires_after(kMetricsAcceptRetry);
                            self->retry_timer.async_wait([self](beast::error_code wait_ec) {
                              if (!wait_ec && self->acceptor.is_open()) self->accept();
                            });
                            return;
                          }
                          std::make_shared<Session>(std::move(socket), self)->start();
                          self->accept();
                        });
}

MetricsServer::MetricsServer(net::io_context& io, const Registry& registry)
    : state_(std::make_shared<State>(io, registry)) {}

MetricsServer::~MetricsServer() {
  stop();
}

Status MetricsServer::listen(const std::string& host, uint16_t port) {
  const std::string where = host + ":" + std::to_string(port);
  std::lock_guard lock(state_->mutex);
  if (state_->stopped)
    return Status(StatusCode::kAborted, "metrics: listen on " + where + " after stop()");
  if (state_->listening) {
    return invalid_argument("metrics: listen on " + where + ": already listening on port " +
                            std::to_string(state_->port.load()));
  }
  beast::error_code ec;
  tcp::endpoint endpoint;
  const net::ip::address address = net::ip::make_address(host, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, port);
  } else {
    tcp::resolver resolver(state_->io);
    const auto results = resolver.resolve(host, std::to_string(port), ec);
    if (ec || results.empty()) {
      return Status(StatusCode::kInvalidArgument, "metrics: cannot resolve '" + host +
                                                      "': " + (ec ? ec.message() : "no address"));
    }
    endpoint = results.begin()->endpoint();
  }
  tcp::acceptor& acceptor = state_->acceptor;
  const auto fail = [&](const char* step) {
    beast::error_code ignored;
    acceptor.close(ignored);
    return Status(StatusCode::kIoError,
                  std::string("metrics: cannot ") + step + " " + where + ": " + ec.message());
  };
  if (acceptor.open(endpoint.protocol(), ec)) return fail("open a socket for");
  if (acceptor.set_option(net::socket_base::reuse_address(true), ec)) return fail("configure");
  if (acceptor.bind(endpoint, ec)) return fail("bind");
  if (acceptor.listen(net::socket_base::max_listen_connections, ec)) return fail("listen on");
  const tcp::endpoint bound = acceptor.local_endpoint(ec);
  if (ec) return fail("read the bound port of");
  state_->port = bound.port();
  state_->listening = true;
  // Every later use of the acceptor runs on its strand, after this.
  net::post(state_->acceptor_strand, [state = state_] { state->accept(); });
  return Status::ok_status();
}

uint16_t MetricsServer::port() const {
  return state_->port.load();
}

void MetricsServer::stop() {
  std::map<const void*, std::function<void()>> closers;
  {
    std::lock_guard lock(state_->mutex);
    if (state_->stopped) return;
    state_->stopped = true;
    closers.swap(state_->closers);
    if (state_->listening) {
      net::post(state_->acceptor_strand, [state = state_] {
        beast::error_code ignored;
        state->acceptor.close(ignored);
        state->retry_timer.cancel();
      });
    }
  }
  for (auto& [session, close] : closers)
    close();
}

}  // namespace caracal::server
