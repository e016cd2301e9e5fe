// The far side of a measurement (the accelerator, or the floor's responder), run either in a
// forked child process, which is the deployment (agent and server are different processes that
// map one memfd), or in a thread of this process (--same-process).
//
// In process mode the body runs in a child forked by start(): it sees a copy of this process's
// memory, so it may only communicate through MAP_SHARED mappings made before the fork, and it
// reports back through a pipe. The child gets SIGKILL if this process dies, so an error exit here
// leaves nothing spinning behind.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "caracal/core/status.hpp"

namespace caracal::bench {

// What the far side reports when it is done. Plain data: it crosses the pipe as bytes.
struct PeerReport {
  uint32_t ok = 1;
  uint64_t requests = 0;  // requests the accelerator served
  uint64_t handler_errors = 0;
  uint64_t reply_ring_full = 0;  // bursts cut short by a full TX ring
  uint64_t corrupt_entries = 0;
  char error[240] = {};  // why, when !ok

  void set_error(const std::string& text);
};

class Peer {
 public:
  enum class Mode { kProcess, kThread };

  Peer() = default;
  Peer(Peer&& other) noexcept;
  Peer& operator=(Peer&& other) noexcept;
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;
  // A child still running is killed; a thread still running is joined (it must have been asked
  // to stop; wait() first to bound the wait).
  ~Peer();

  static Result<Peer> start(Mode mode, std::function<PeerReport()> body);

  // Waits up to `timeout` for the body to return and gives its report. A child that does not
  // finish in time is killed; a thread is detached and left running (see abandoned()).
  Result<PeerReport> wait(std::chrono::milliseconds timeout);

  // A thread-mode body that did not return when waited for is still running: the memory it
  // polls must stay mapped until the program exits.
  bool abandoned() const { return abandoned_; }

  // A description of how the peer ended if it already has (for error messages when the near
  // side times out), else "still running". Never blocks.
  std::string describe();

 private:
  struct ThreadState {
    std::atomic<bool> done{false};
    PeerReport report;
  };

  void release();

  Mode mode_ = Mode::kProcess;
  pid_t pid_ = -1;
  int report_fd_ = -1;  // read end of the child's report pipe
  std::thread thread_;
  std::shared_ptr<ThreadState> state_;
  bool abandoned_ = false;
};

}  // namespace caracal::bench
