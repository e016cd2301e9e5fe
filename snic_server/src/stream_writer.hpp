// The write side of one TCP socket: one async_write in flight at a time. What is appended while
// a write is in flight waits in the pending buffer, and the next write takes all of it; the two
// buffers swap, so bytes are copied once, into pending(). A written buffer larger than
// tunables::kStreamWriteKeep is freed rather than kept for the next write. Used by the socket's
// own thread (or strand) only.
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/asio/completion_condition.hpp>
#include <boost/asio/write.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstddef>
#include <new>
#include <string>
#include <utility>

#include "tunables.hpp"

namespace caracal::server {

// Memory for one asynchronous operation at a time, as Asio's handler allocation lets a handler
// bring its own (the `allocator_type` of the handler): the write in flight takes it, so that a
// connection's writes allocate nothing. A request for more than it holds, or while it is taken,
// goes to the heap. Used by one thread (or strand) only.
class HandlerSlot {
 public:
  void* allocate(size_t bytes) {
    if (!taken_ && bytes <= sizeof(storage_)) {
      taken_ = true;
      return storage_;
    }
    return ::operator new(bytes);
  }
  void deallocate(void* p) {
    if (p == storage_) {
      taken_ = false;
    } else {
      ::operator delete(p);
    }
  }

 private:
  alignas(std::max_align_t) unsigned char storage_[512];
  bool taken_ = false;
};

template <class T>
class SlotAllocator {
 public:
  using value_type = T;
  explicit SlotAllocator(HandlerSlot* slot) : slot_(slot) {}
  template <class U>
  SlotAllocator(const SlotAllocator<U>& other) noexcept : slot_(other.slot()) {}
  T* allocate(size_t n) { return static_cast<T*>(slot_->allocate(sizeof(T) * n)); }
  void deallocate(T* p, size_t) { slot_->deallocate(p); }
  HandlerSlot* slot() const { return slot_; }
  template <class U>
  bool operator==(const SlotAllocator<U>& other) const noexcept {
    return slot_ == other.slot();
  }

 private:
  HandlerSlot* slot_;
};

// A completion handler whose operation's memory is a HandlerSlot's.
template <class Handler>
struct SlotHandler {
  Handler handler;
  HandlerSlot* slot;
  using allocator_type = SlotAllocator<void>;
  allocator_type get_allocator() const noexcept { return allocator_type(slot); }
  template <class... Args>
  void operator()(Args&&... args) {
    handler(std::forward<Args>(args)...);
  }
};
// Spelled out: clang before 17 deduces no aggregate's template arguments (P1816).
template <class Handler>
SlotHandler(Handler, HandlerSlot*) -> SlotHandler<Handler>;

class StreamWriter {
 public:
  // Where to append the bytes to send next.
  std::string& pending() { return pending_; }
  bool has_pending() const { return !pending_.empty(); }
  bool writing() const { return writing_; }
  // Bytes appended and not yet taken by the kernel (what is pending and what is in flight,
  // counted whole until its write completes).
  size_t queued_bytes() const { return pending_.size() + in_flight_.size(); }
  // When the write in flight last moved bytes into the kernel (or started).
  std::chrono::steady_clock::time_point last_progress() const { return progress_at_; }

  // Starts writing everything pending, unless a write is in flight or nothing is pending (then
  // returns false). `done(error_code)` runs when the write completes, with the writer ready for
  // the next one; it must keep the socket and this writer alive until then (the owner captures
  // a shared_ptr to itself in it).
  template <class Socket, class Done>
  bool write(Socket& socket, Done done) {
    if (writing_ || pending_.empty()) return false;
    writing_ = true;
    in_flight_.swap(pending_);
    // The completion condition runs before each write_some of the composed write and after it
    // returns: each call is progress (or the start).
    boost::asio::async_write(
        socket, boost::asio::buffer(in_flight_),
        [this](const boost::system::error_code& ec, size_t n) {
          progress_at_ = std::chrono::steady_clock::now();
          return boost::asio::transfer_all()(ec, n);
        },
        SlotHandler{[this, done = std::move(done)](boost::system::error_code ec, size_t) mutable {
                      writing_ = false;
                      if (in_flight_.capacity() > tunables::kStreamWriteKeep) {
                        std::string().swap(in_flight_);
                      } else {
                        in_flight_.clear();
                      }
                      done(ec);
                    },
                    &slot_});
    return true;
  }

 private:
  HandlerSlot slot_;  // the write in flight's operation
  std::string pending_;
  std::string in_flight_;
  bool writing_ = false;
  std::chrono::steady_clock::time_point progress_at_{};
};

}  // namespace caracal::server
