// The baselines' memcached client: one pipelined connection per I/O thread (a pool of one per
// thread), plain Asio on that thread's executor, the memcached text protocol's `get`. Replies
// come back in request order, so each completes the oldest call waiting; a call with no reply
// after the timeout fails with every call waiting on the connection, which is closed (a late
// reply could not be told from the next call's), and the next call connects again. The same
// rules as snic_server's destinations (snic_server/README.md, Destinations and client queues).
//
// Callbacks run on the connection's thread, in call order; after_pending() queues one that runs
// in that order without a call, so a server can answer requests that need no fetch without
// overtaking those that do (TCP replies leave in request order).
#pragma once

#include <boost/asio.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace caracal::bench::baseline {

struct Fetch {
  enum Kind { kFound, kMissing, kFailed, kNone } kind = kNone;
  const uint8_t* value = nullptr;  // kFound: valid during the callback
  uint32_t value_bytes = 0;
  std::string error;  // kFailed: why
};

class MemcachedClient : public std::enable_shared_from_this<MemcachedClient> {
 public:
  using Done = std::function<void(const Fetch&)>;

  MemcachedClient(boost::asio::any_io_executor executor, boost::asio::ip::tcp::endpoint server,
                  std::chrono::milliseconds timeout)
      : executor_(executor),
        server_(server),
        timeout_(timeout),
        socket_(executor),
        timer_(executor) {}

  // On the executor's thread.
  void get(const std::string& key, Done done) {
    out_ += "get " + key + "\r\n";
    waiting_.push_back({std::move(done), false, std::chrono::steady_clock::now()});
    arm_timer();
    if (connected_) {
      write();
    } else {
      connect();
    }
  }
  void after_pending(Done done) {
    if (waiting_.empty()) return done(Fetch{});
    waiting_.push_back({std::move(done), true, {}});
  }

 private:
  struct Call {
    Done done;
    bool marker;  // after_pending(): no reply of its own
    std::chrono::steady_clock::time_point sent;
  };

  void connect() {
    if (connecting_) return;
    connecting_ = true;
    socket_.async_connect(
        server_, [self = shared_from_this(), gen = generation_](boost::system::error_code ec) {
          if (gen != self->generation_) return;
          self->connecting_ = false;
          if (ec) return self->fail_all("cannot connect to memcached: " + ec.message());
          boost::system::error_code ignored;
          self->socket_.set_option(boost::asio::ip::tcp::no_delay(true), ignored);
          self->connected_ = true;
          self->read();
          self->write();
        });
  }

  void write() {
    if (writing_ || out_.empty()) return;
    writing_ = true;
    sending_.swap(out_);
    out_.clear();
    boost::asio::async_write(
        socket_, boost::asio::buffer(sending_),
        [self = shared_from_this(), gen = generation_](boost::system::error_code ec, size_t) {
          if (gen != self->generation_) return;
          self->writing_ = false;
          if (ec) return self->fail_all("write to memcached: " + ec.message());
          self->write();
        });
  }

  void read() {
    if (in_.size() - end_ < 65536) in_.resize(end_ + 65536);
    socket_.async_read_some(
        boost::asio::buffer(in_.data() + end_, in_.size() - end_),
        [self = shared_from_this(), gen = generation_](boost::system::error_code ec, size_t n) {
          if (gen != self->generation_) return;
          if (ec) return self->fail_all("memcached closed the connection");
          self->end_ += n;
          self->on_bytes();
        });
  }

  void on_bytes() {
    for (;;) {
      const char* p = reinterpret_cast<const char*>(in_.data()) + begin_;
      const size_t have = end_ - begin_;
      const void* crlf = memmem(p, have, "\r\n", 2);
      if (crlf == nullptr) break;
      const size_t line = static_cast<const char*>(crlf) - p;
      Fetch f;
      size_t used = line + 2;
      if (line == 3 && std::memcmp(p, "END", 3) == 0) {
        f.kind = Fetch::kMissing;
      } else if (line > 6 && std::memcmp(p, "VALUE ", 6) == 0) {
        size_t field = line;
        while (field > 0 && p[field - 1] != ' ')
          --field;
        const uint64_t bytes =
            std::strtoull(std::string(p + field, line - field).c_str(), nullptr, 10);
        if (have < line + 2 + bytes + 7) break;  // the data, "\r\n", "END\r\n"
        if (std::memcmp(p + line + 2 + bytes, "\r\nEND\r\n", 7) != 0)
          return fail_all("malformed reply from memcached");
        f.kind = Fetch::kFound;
        f.value = reinterpret_cast<const uint8_t*>(p + line + 2);
        f.value_bytes = static_cast<uint32_t>(bytes);
        used = line + 2 + bytes + 7;
      } else {
        f.kind = Fetch::kFailed;
        f.error = "memcached: " + std::string(p, line);
      }
      if (waiting_.empty()) return fail_all("memcached sent a reply nobody asked for");
      Call call = std::move(waiting_.front());
      waiting_.pop_front();
      call.done(f);
      begin_ += used;
      complete_markers();
    }
    if (begin_ == end_) {
      begin_ = end_ = 0;
    } else if (begin_ > in_.size() / 2) {
      std::memmove(in_.data(), in_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    read();
  }

  void complete_markers() {
    while (!waiting_.empty() && waiting_.front().marker) {
      Call call = std::move(waiting_.front());
      waiting_.pop_front();
      call.done(Fetch{});
    }
  }

  void fail_all(const std::string& why) {
    Fetch f;
    f.kind = Fetch::kFailed;
    f.error = why;
    std::deque<Call> calls;
    calls.swap(waiting_);
    ++generation_;  // handlers of the closed connection see it is gone
    connected_ = false;
    connecting_ = false;
    writing_ = false;
    out_.clear();
    begin_ = end_ = 0;
    boost::system::error_code ignored;
    socket_.close(ignored);
    socket_ = boost::asio::ip::tcp::socket(executor_);
    for (Call& c : calls)
      c.done(c.marker ? Fetch{} : f);
  }

  void arm_timer() {
    if (timeout_.count() == 0 || timer_armed_) return;
    const Call* oldest = nullptr;
    for (const Call& c : waiting_) {
      if (!c.marker) {
        oldest = &c;
        break;
      }
    }
    if (oldest == nullptr) return;
    timer_armed_ = true;
    timer_.expires_at(oldest->sent + timeout_);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      self->timer_armed_ = false;
      if (ec) return;
      for (const Call& c : self->waiting_) {
        if (c.marker) continue;
        if (std::chrono::steady_clock::now() >= c.sent + self->timeout_) {
          return self->fail_all("memcached did not answer within " +
                                std::to_string(self->timeout_.count()) + " ms");
        }
        break;
      }
      self->arm_timer();
    });
  }

  boost::asio::any_io_executor executor_;
  boost::asio::ip::tcp::endpoint server_;
  std::chrono::milliseconds timeout_;
  boost::asio::ip::tcp::socket socket_;
  boost::asio::steady_timer timer_;
  bool timer_armed_ = false;
  uint64_t generation_ = 0;
  bool connected_ = false;
  bool connecting_ = false;
  bool writing_ = false;
  std::string out_, sending_;
  std::vector<uint8_t> in_;
  size_t begin_ = 0, end_ = 0;
  std::deque<Call> waiting_;
};

}  // namespace caracal::bench::baseline
