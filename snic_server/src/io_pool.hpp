// The server's I/O threads' io_contexts: the listeners' sockets and the destinations'
// connections, and on the first one the control and metrics endpoints.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace caracal::server {

// The server's I/O contexts, one per I/O thread (the io_context-per-thread design). Context 0
// also carries the control and metrics endpoints and the listening sockets; the destinations'
// connections go to the contexts in turn. Any thread may post to any context.
class IoPool {
 public:
  explicit IoPool(uint32_t threads) {
    for (uint32_t i = 0; i < (threads == 0 ? 1 : threads); ++i) {
      contexts_.push_back(std::make_unique<Context>());
    }
  }
  // Handlers still queued when the pool goes (a listener's close, a burst of replies) may hold
  // the last reference to a listener whose sockets belong to other contexts of the pool, and
  // destroying it then touches those contexts' services. So every context is shut down first,
  // which destroys the queued handlers while all the services still exist, and only then are
  // the contexts destroyed (their own shutdown then finds nothing left to do).
  ~IoPool() {
    for (auto& c : contexts_)
      c->shutdown();
  }
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;
  size_t size() const { return contexts_.size(); }
  boost::asio::io_context& main() { return *contexts_[0]; }
  boost::asio::io_context& at(size_t i) { return *contexts_[i % contexts_.size()]; }
  // The contexts in turn, for new connections. Any thread.
  boost::asio::io_context& next() { return at(next_index()); }
  // The index of the next context in turn (at(), and the I/O thread that runs it).
  uint32_t next_index() {
    // A counter: no ordering needed.
    return static_cast<uint32_t>(next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size());
  }
  void stop() {
    for (auto& c : contexts_)
      c->stop();
  }

 private:
  class Context : public boost::asio::io_context {
   public:
    // Concurrency hint 1: one thread runs each context (locking stays on, for the posts from
    // the engine and from the other contexts).
    Context() : boost::asio::io_context(1) {}
    using boost::asio::execution_context::shutdown;
  };
  std::vector<std::unique_ptr<Context>> contexts_;
  std::atomic<size_t> next_{0};
};

}  // namespace caracal::server
