// caracal_pipeline_client: load and correctness client for an echo service over TCP.
//
// Opens --connections connections; each sends --requests requests of random size and content,
// keeping --pipeline of them in flight, and checks that every reply equals its request and that
// replies come back in request order. Requests are framed with a 4-byte big-endian length or
// end in "\n" (then they are printable random characters).
//
// Connections are opened --connect-window at a time (a connect that completes starts the next),
// so that thousands of them do not overflow the server's accept backlog at once. With
// --together, no connection sends before every connection is open, and none closes before every
// connection has its replies: all --connections are open at once while requests flow, and stay
// open --hold-s seconds more (a line on stdout says when the hold starts, for a script that
// measures the server then).
//
// With --error-prefix, the summary line also gives the longest time an error reply took from
// its request being queued for sending (error_max_ms), and the first error reply is printed:
// what a script checks a timeout bound by.
//
// Exit status: 0 when every reply on every connection was correct; 1 when any was wrong or a
// connection failed (the first problem of each connection is printed); 2 when --timeout-s ran
// out with replies still missing (how many is printed). Other codes are usage errors.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>

namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

enum class Framing { kLengthPrefixed, kLine };

struct Options {
  std::string connect;
  uint32_t connections = 1;
  uint64_t requests = 100;
  uint32_t pipeline = 1;
  uint32_t min_bytes = 1;
  uint32_t max_bytes = 1024;
  Framing framing = Framing::kLengthPrefixed;
  uint64_t seed = 1;
  double timeout_s = 30;
  uint32_t threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
  // A reply that starts with this text is the server's error reply for that request: counted,
  // not a failure (for runs where requests may fail visibly, such as losing an agent).
  std::string error_prefix;
  uint32_t connect_window = 512;     // connects in progress at once
  size_t read_buffer_bytes = 65536;  // each connection's read buffer
  bool together = false;
  double hold_s = 0;
};

constexpr size_t kPrefixBytes = 4;
// Parsed replies are erased from the input once this many bytes of them have piled up.
constexpr size_t kInputCompactBytes = size_t{64} * 1024;

std::string hex_byte(unsigned char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", c);
  return buf;
}

// Why `got` is not `expected`: sizes and the first differing byte.
std::string describe_difference(const std::string& expected, const std::string& got) {
  std::string out =
      "expected " + std::to_string(expected.size()) + " bytes, got " + std::to_string(got.size());
  const size_t n = std::min(expected.size(), got.size());
  size_t i = 0;
  while (i < n && expected[i] == got[i])
    ++i;
  if (i < n) {
    out += "; first difference at byte " + std::to_string(i) + ": expected " +
           hex_byte(static_cast<unsigned char>(expected[i])) + ", got " +
           hex_byte(static_cast<unsigned char>(got[i]));
  } else {
    out += "; equal up to byte " + std::to_string(n);
  }
  return out;
}

// What a connection reports to the run: its connect completed (`ok` or not), and it is done
// (every reply, or a failure). Any thread.
struct Hooks {
  std::function<void(bool ok)> on_connected;
  std::function<void()> on_finish;
};

// One client connection. All of its handlers run on its own strand; the main thread reads its
// results only after the io_context threads have been joined.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(net::io_context& io, const Options& options, uint32_t index, const Hooks& hooks)
      : socket_(net::make_strand(io)), options_(options), index_(index), hooks_(hooks) {
    // Each connection its own stream of sizes and contents, reproducible from --seed.
    std::seed_seq seq{static_cast<uint32_t>(options.seed),
                      static_cast<uint32_t>(options.seed >> 32), index};
    rng_.seed(seq);
  }

  void start(const std::vector<tcp::endpoint>& endpoints) {
    net::async_connect(socket_, endpoints,
                       [self = shared_from_this()](const error_code& ec, const tcp::endpoint&) {
                         if (ec) {
                           self->fail("connect to " + self->options_.connect + ": " + ec.message());
                           self->hooks_.on_connected(false);
                           return;
                         }
                         error_code ignored;
                         self->socket_.set_option(tcp::no_delay(true), ignored);
                         self->chunk_.resize(self->options_.read_buffer_bytes);
                         if (!self->options_.together) self->begin();
                         self->hooks_.on_connected(true);
                       });
  }

  // Starts sending and reading. Any thread: it runs on the connection's strand.
  void post_begin() {
    net::post(socket_.get_executor(), [self = shared_from_this()] { self->begin(); });
  }

  uint64_t replies() const { return replies_; }
  uint64_t errors() const { return errors_; }
  double error_max_ms() const { return error_max_ms_; }
  const std::string& first_error() const { return first_error_; }
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  uint32_t index() const { return index_; }

 private:
  void begin() {
    if (done_) return;
    fill_window();
    read();
  }

  std::string make_request() {
    std::uniform_int_distribution<uint32_t> size(options_.min_bytes, options_.max_bytes);
    std::string r(size(rng_), '\0');
    if (options_.framing == Framing::kLine) {
      std::uniform_int_distribution<int> printable(0x20, 0x7e);
      for (char& c : r)
        c = static_cast<char>(printable(rng_));
    } else {
      for (size_t i = 0; i < r.size(); i += 8) {
        const uint64_t word = rng_();
        for (size_t k = 0; k < 8 && i + k < r.size(); ++k)
          r[i + k] = static_cast<char>(word >> (8 * k));
      }
    }
    return r;
  }

  // Queues requests until --pipeline are outstanding, then starts a write if none is running.
  void fill_window() {
    while (outstanding_.size() < options_.pipeline && sent_ < options_.requests) {
      std::string r = make_request();
      if (options_.framing == Framing::kLengthPrefixed) {
        const auto n = static_cast<uint32_t>(r.size());
        const char prefix[kPrefixBytes] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                                           static_cast<char>(n >> 8), static_cast<char>(n)};
        outbox_.append(prefix, kPrefixBytes);
        outbox_ += r;
      } else {
        outbox_ += r;
        outbox_ += '\n';
      }
      outstanding_.push_back(std::move(r));
      sent_at_.push_back(std::chrono::steady_clock::now());
      ++sent_;
    }
    if (!writing_ && !outbox_.empty()) {
      writing_ = true;
      in_write_.swap(outbox_);
      outbox_.clear();
      net::async_write(socket_, net::buffer(in_write_),
                       [self = shared_from_this()](const error_code& ec, size_t) {
                         self->writing_ = false;
                         if (self->done_) return;
                         if (ec) return self->fail("write: " + ec.message());
                         self->fill_window();
                       });
    }
  }

  void read() {
    socket_.async_read_some(
        net::buffer(chunk_), [self = shared_from_this()](const error_code& ec, size_t n) {
          if (self->done_) return;
          if (ec == net::error::eof) {
            return self->fail("closed by the server after " + std::to_string(self->replies_) +
                              " of " + std::to_string(self->options_.requests) + " replies");
          }
          if (ec) return self->fail("read: " + ec.message());
          self->in_.append(self->chunk_.data(), n);
          self->take_replies();
          if (!self->done_) self->read();
        });
  }

  // Checks every whole reply buffered against the oldest outstanding request.
  void take_replies() {
    for (;;) {
      const size_t available = in_.size() - in_pos_;
      if (available == 0) break;
      if (outstanding_.empty()) {
        return fail("request " + std::to_string(replies_) + ": " + std::to_string(available) +
                    " bytes arrived with no request outstanding");
      }
      const std::string& expected = outstanding_.front();
      const char* p = in_.data() + in_pos_;
      std::string got;
      size_t frame = 0;
      if (options_.framing == Framing::kLengthPrefixed) {
        if (available < kPrefixBytes) break;
        const uint32_t n = (uint32_t{static_cast<unsigned char>(p[0])} << 24) |
                           (uint32_t{static_cast<unsigned char>(p[1])} << 16) |
                           (uint32_t{static_cast<unsigned char>(p[2])} << 8) |
                           uint32_t{static_cast<unsigned char>(p[3])};
        if (n != expected.size() && options_.error_prefix.empty()) {
          return fail("request " + std::to_string(replies_) + ": expected " +
                      std::to_string(expected.size()) + " bytes, the reply's prefix says " +
                      std::to_string(n) + size_hint(n));
        }
        if (available < kPrefixBytes + n) break;
        got.assign(p + kPrefixBytes, n);
        frame = kPrefixBytes + n;
      } else {
        // A reply ends at its first newline; no correct reply is longer than --max-bytes.
        const size_t look = std::min(available, size_t{options_.max_bytes} + 1);
        const void* nl = std::memchr(p, '\n', look);
        if (nl == nullptr) {
          if (available <= options_.max_bytes) break;
          return fail("request " + std::to_string(replies_) + ": no newline within --max-bytes " +
                      std::to_string(options_.max_bytes) + "; " +
                      describe_difference(expected + '\n', std::string(p, look)));
        }
        got.assign(p, static_cast<const char*>(nl) - p);
        frame = got.size() + 1;
      }
      if (got != expected) {
        if (options_.error_prefix.empty() || got.rfind(options_.error_prefix, 0) != 0) {
          return fail("request " + std::to_string(replies_) + ": " +
                      describe_difference(expected, got) + out_of_order_hint(got));
        }
        ++errors_;
        const double ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - sent_at_.front())
                              .count();
        error_max_ms_ = std::max(error_max_ms_, ms);
        if (first_error_.empty()) first_error_ = got;
      }
      in_pos_ += frame;
      outstanding_.pop_front();
      sent_at_.pop_front();
      ++replies_;
      if (replies_ == options_.requests) {
        if (in_pos_ != in_.size()) {
          return fail(std::to_string(in_.size() - in_pos_) +
                      " unexpected bytes after the last reply");
        }
        return finish();
      }
    }
    if (in_pos_ > kInputCompactBytes) {
      in_.erase(0, in_pos_);
      in_pos_ = 0;
    }
    fill_window();
  }

  // Names the outstanding request a wrong reply belongs to, if any: replies out of order.
  std::string out_of_order_hint(const std::string& got) const {
    for (size_t k = 1; k < outstanding_.size(); ++k) {
      if (outstanding_[k] == got) {
        return " (the reply is that of request " + std::to_string(replies_ + k) +
               ": replies out of order)";
      }
    }
    return "";
  }
  std::string size_hint(uint32_t size) const {
    for (size_t k = 1; k < outstanding_.size(); ++k) {
      if (outstanding_[k].size() == size) {
        return " (the size of request " + std::to_string(replies_ + k) + ": replies out of order?)";
      }
    }
    return "";
  }

  void fail(std::string what) {
    if (done_) return;
    error_ = std::move(what);
    finish();
  }

  void finish() {
    done_ = true;
    // With --together a connection that got its replies stays open until the run ends (the
    // socket closes when the connection is destroyed).
    if (!error_.empty() || !options_.together) {
      error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_both, ignored);
      socket_.close(ignored);
    }
    hooks_.on_finish();
  }

  tcp::socket socket_;
  const Options& options_;
  const uint32_t index_;
  std::mt19937_64 rng_;
  const Hooks& hooks_;

  std::deque<std::string> outstanding_;  // sent (or queued), not yet answered; oldest first
  std::deque<std::chrono::steady_clock::time_point> sent_at_;  // when each was queued
  double error_max_ms_ = 0;                                    // the longest an error reply took
  std::string first_error_;                                    // the first error reply
  uint64_t sent_ = 0;
  uint64_t replies_ = 0;  // correct replies (error replies included, see --error-prefix)
  uint64_t errors_ = 0;   // error replies
  std::string outbox_;    // framed requests waiting for the running write to finish
  std::string in_write_;  // what the running write sends
  bool writing_ = false;
  std::vector<char> chunk_;  // --read-buffer-bytes, once connected
  std::string in_;
  size_t in_pos_ = 0;
  bool done_ = false;
  std::string error_;
};

// "host:port" or "[v6]:port".
bool split_host_port(const std::string& s, std::string* host, std::string* port) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  *host = s.substr(0, colon);
  *port = s.substr(colon + 1);
  if (host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return true;
}

int run(const Options& options) {
  std::string host, port;
  if (!split_host_port(options.connect, &host, &port)) {
    std::fprintf(stderr, "pipeline_client: --connect '%s' is not host:port\n",
                 options.connect.c_str());
    return 1;
  }
  net::io_context io;
  error_code ec;
  tcp::resolver resolver(io);
  std::vector<tcp::endpoint> endpoints;
  for (const auto& r : resolver.resolve(host, port, ec))
    endpoints.push_back(r.endpoint());
  if (ec || endpoints.empty()) {
    std::fprintf(stderr, "pipeline_client: cannot resolve %s: %s\n", options.connect.c_str(),
                 ec ? ec.message().c_str() : "no address");
    return 1;
  }

  std::atomic<uint32_t> running{options.connections};
  std::promise<void> all_done;
  std::vector<std::shared_ptr<Connection>> connections;
  std::atomic<uint32_t> next_connect{0};
  std::atomic<uint32_t> connects_done{0};
  std::atomic<uint32_t> connected{0};
  std::chrono::steady_clock::time_point start;
  const auto connect_next = [&] {
    // Relaxed: a ticket counter; each index is taken once.
    const uint32_t i = next_connect.fetch_add(1, std::memory_order_relaxed);
    if (i < connections.size()) connections[i]->start(endpoints);
  };
  Hooks hooks;
  hooks.on_finish = [&] {
    // acq_rel: the last finisher sees every other connection's results before it releases main.
    if (running.fetch_sub(1, std::memory_order_acq_rel) == 1) all_done.set_value();
  };
  hooks.on_connected = [&](bool ok) {
    if (ok) connected.fetch_add(1, std::memory_order_relaxed);
    // acq_rel: the last connect sees every earlier one's count of `connected`.
    const uint32_t done = connects_done.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (done == options.connections) {
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("pipeline_client: %u of %u connections open after %.3f s\n",
                  connected.load(std::memory_order_relaxed), options.connections, s);
      std::fflush(stdout);
      if (options.together) {
        for (auto& c : connections)
          c->post_begin();
      }
    }
    connect_next();
  };
  for (uint32_t i = 0; i < options.connections; ++i) {
    connections.push_back(std::make_shared<Connection>(io, options, i, hooks));
  }
  start = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < std::min(options.connect_window, options.connections); ++i)
    connect_next();
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < options.threads; ++t)
    threads.emplace_back([&io] { io.run(); });

  const bool in_time =
      all_done.get_future().wait_for(std::chrono::duration<double>(options.timeout_s)) ==
      std::future_status::ready;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (in_time && options.hold_s > 0) {
    uint32_t open = 0;
    for (const auto& c : connections)
      open += c->failed() ? 0 : 1;
    std::printf("pipeline_client: holding %u open connections for %.1f s\n", open, options.hold_s);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(options.hold_s));
  }
  io.stop();
  for (auto& t : threads)
    t.join();

  uint64_t replies = 0;
  uint64_t errors = 0;
  double error_max_ms = 0;
  std::string first_error;
  uint64_t missing = 0;
  uint32_t waiting = 0;
  std::vector<const Connection*> failed;
  for (const auto& c : connections) {
    replies += c->replies();
    errors += c->errors();
    error_max_ms = std::max(error_max_ms, c->error_max_ms());
    if (first_error.empty()) first_error = c->first_error();
    if (c->failed()) {
      failed.push_back(c.get());
    } else if (c->replies() < options.requests) {
      missing += options.requests - c->replies();
      ++waiting;
    }
  }
  std::printf(
      "pipeline_client: connections=%u replies=%llu errors=%llu seconds=%.3f replies/s=%.0f "
      "error_max_ms=%.1f\n",
      options.connections, static_cast<unsigned long long>(replies),
      static_cast<unsigned long long>(errors), seconds,
      seconds > 0 ? static_cast<double>(replies) / seconds : 0.0, error_max_ms);
  if (!first_error.empty())
    std::printf("pipeline_client: first error reply: %s\n", first_error.c_str());
  std::fflush(stdout);  // before the diagnostics on stderr, when both go to one pipe
  constexpr size_t kShown = 20;
  for (size_t i = 0; i < failed.size() && i < kShown; ++i) {
    std::fprintf(stderr, "pipeline_client: connection %u, %s\n", failed[i]->index(),
                 failed[i]->error().c_str());
  }
  if (failed.size() > kShown) {
    std::fprintf(stderr, "pipeline_client: ... and %zu more connections failed\n",
                 failed.size() - kShown);
  }
  if (!in_time) {
    std::fprintf(stderr,
                 "pipeline_client: timeout after %.1f s: %llu replies missing on %u connections\n",
                 options.timeout_s, static_cast<unsigned long long>(missing), waiting);
  }
  if (!failed.empty()) {
    std::fprintf(stderr,
                 "pipeline_client: FAILED: %zu of %u connections had a wrong reply or "
                 "an error\n",
                 failed.size(), options.connections);
    return 1;
  }
  return in_time ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Sends pipelined random requests to an echo service and checks every reply."};
  app.add_option("--connect", o.connect, "host:port of the echo service")->required();
  app.add_option("--connections", o.connections, "concurrent connections")
      ->check(CLI::Range(1u, 100000u));
  app.add_option("--requests", o.requests, "requests per connection")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40));
  app.add_option("--pipeline", o.pipeline, "requests in flight per connection")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--min-bytes", o.min_bytes, "smallest request payload");
  app.add_option("--max-bytes", o.max_bytes, "largest request payload")
      ->check(CLI::Range(0u, 1u << 30));
  app.add_option("--framing", o.framing, "length_prefixed (4-byte big-endian) or line (\\n)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, Framing>{
          {"length_prefixed", Framing::kLengthPrefixed}, {"line", Framing::kLine}}));
  app.add_option("--seed", o.seed, "seed of the random sizes and contents");
  app.add_option("--timeout-s", o.timeout_s, "give up (exit 2) after this many seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "I/O threads")->check(CLI::Range(1u, 256u));
  app.add_option("--error-prefix", o.error_prefix,
                 "replies starting with this text are error replies: counted, not failures");
  app.add_option("--connect-window", o.connect_window, "connects in progress at once")
      ->check(CLI::Range(1u, 100000u));
  app.add_option("--read-buffer-bytes", o.read_buffer_bytes, "each connection's read buffer")
      ->check(CLI::Range(size_t{64}, size_t{1} << 26));
  app.add_flag("--together", o.together,
               "no connection sends before all are open, none closes before all are answered");
  app.add_option("--hold-s", o.hold_s,
                 "keep every connection open this long after the last reply (implies --together)")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
    if (o.min_bytes > o.max_bytes) {
      throw CLI::ValidationError("--min-bytes", std::to_string(o.min_bytes) +
                                                    " is larger than --max-bytes " +
                                                    std::to_string(o.max_bytes));
    }
    if (o.hold_s > 0) o.together = true;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_client: %s\n", e.what());
    return 1;
  }
}
