// Which thread runs an engine thread's loop, so that the functions only that thread may call can
// assert it (eRPC's in_dispatch()): an engine thread of its own, or the I/O thread that hosts
// it. Checked in builds without NDEBUG (the sanitizer and debug builds); empty otherwise.
#pragma once

#include <atomic>
#include <cassert>
#include <thread>

namespace caracal::server {

class OwnerThread {
 public:
  // The calling thread starts the loop.
  void enter() {
#ifndef NDEBUG
    id_.store(std::this_thread::get_id(), std::memory_order_relaxed);
#endif
  }
  // The loop has ended.
  void leave() {
#ifndef NDEBUG
    id_.store(std::thread::id(), std::memory_order_relaxed);
#endif
  }
  // On the owner, or while no thread owns the loop: before it starts and after it ended, when
  // the thread that stops the engine settles what is left (under the engine thread's command
  // lock). Relaxed: a thread compares its own id, or reads the value the ended loop left, which
  // the join (or, hosted, the command lock) orders before the read.
  bool here() const {
#ifndef NDEBUG
    const std::thread::id owner = id_.load(std::memory_order_relaxed);
    return owner == std::thread::id() || owner == std::this_thread::get_id();
#else
    return true;
#endif
  }

 private:
#ifndef NDEBUG
  std::atomic<std::thread::id> id_{};
#endif
};

}  // namespace caracal::server

// In a function only the engine thread that owns `owner` may call.
#define CARACAL_ASSERT_OWNER_THREAD(owner) assert((owner).here())
