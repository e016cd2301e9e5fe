#include "peer.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <system_error>
#include <utility>

namespace caracal::bench {
namespace {

using Clock = std::chrono::steady_clock;

Status io_error(const std::string& what, int err) {
  return Status(StatusCode::kIoError, what + ": " + std::strerror(err));
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

bool write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes != 0) {
    const ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

PeerReport run_body(const std::function<PeerReport()>& body) {
  try {
    return body();
  } catch (const std::exception& ex) {
    PeerReport r;
    r.set_error(std::string("exception: ") + ex.what());
    return r;
  } catch (...) {
    PeerReport r;
    r.set_error("non-standard exception");
    return r;
  }
}

}  // namespace

void PeerReport::set_error(const std::string& text) {
  ok = 0;
  const size_t n = text.size() < sizeof(error) - 1 ? text.size() : sizeof(error) - 1;
  std::memcpy(error, text.data(), n);
  error[n] = '\0';
}

Peer::Peer(Peer&& other) noexcept {
  *this = std::move(other);
}

Peer& Peer::operator=(Peer&& other) noexcept {
  if (this != &other) {
    release();
    mode_ = other.mode_;
    pid_ = std::exchange(other.pid_, -1);
    abandoned_ = std::exchange(other.abandoned_, false);
    report_fd_ = std::exchange(other.report_fd_, -1);
    thread_ = std::move(other.thread_);
    state_ = std::move(other.state_);
  }
  return *this;
}

Peer::~Peer() {
  release();
}

void Peer::release() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  if (report_fd_ >= 0) {
    close(report_fd_);
    report_fd_ = -1;
  }
  if (thread_.joinable()) thread_.join();
}

Result<Peer> Peer::start(Mode mode, std::function<PeerReport()> body) {
  Peer p;
  p.mode_ = mode;
  if (mode == Mode::kThread) {
    p.state_ = std::make_shared<ThreadState>();
    try {
      p.thread_ = std::thread([state = p.state_, body = std::move(body)] {
        state->report = run_body(body);
        state->done.store(true, std::memory_order_release);  // pairs with the acquire in wait()
      });
    } catch (const std::system_error& e) {
      return Status(StatusCode::kUnavailable,
                    std::string("cannot start the accelerator thread: ") + e.what());
    }
    return p;
  }

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return io_error("pipe2 for the peer's report", errno);
  // Buffered output would otherwise be written twice, once by each process.
  std::fflush(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    return io_error("fork of the accelerator process", err);
  }
  if (pid == 0) {
    close(fds[0]);
    // Dies with the benchmark, whatever way it ends; the check closes the race with a parent
    // that died before prctl.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(3);
    const PeerReport report = run_body(body);
    const bool sent = write_all(fds[1], &report, sizeof(report));
    // _exit: the parent's atexit handlers and static destructors are not ours to run.
    _exit(sent && report.ok != 0 ? 0 : 1);
  }
  close(fds[1]);
  p.pid_ = pid;
  p.report_fd_ = fds[0];
  return p;
}

Result<PeerReport> Peer::wait(std::chrono::milliseconds timeout) {
  if (mode_ == Mode::kThread) {
    if (!state_) return Status(StatusCode::kInternal, "peer was not started");
    const auto deadline = Clock::now() + timeout;
    while (!state_->done.load(std::memory_order_acquire)) {
      if (Clock::now() > deadline) {
        // A thread cannot be killed: leave it running, detached, and say so; the caller must
        // keep the memory it polls mapped (see abandoned()).
        thread_.detach();
        state_.reset();
        abandoned_ = true;
        return Status(StatusCode::kUnavailable, "the accelerator thread did not return within " +
                                                    std::to_string(timeout.count()) +
                                                    " ms of being asked to stop");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    thread_.join();
    PeerReport r = state_->report;
    state_.reset();
    return r;
  }

  if (pid_ <= 0) return Status(StatusCode::kInternal, "peer was not started");
  PeerReport report;
  size_t got = 0;
  const auto deadline = Clock::now() + timeout;
  while (got < sizeof(report)) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    pollfd pfd{report_fd_, POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    const ssize_t n =
        read(report_fd_, reinterpret_cast<char*>(&report) + got, sizeof(report) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child ended without a (full) report
    got += static_cast<size_t>(n);
  }
  // The child exits right after writing its report; give it the rest of the timeout to do so.
  int status = 0;
  pid_t waited = 0;
  while ((waited = waitpid(pid_, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (waited == 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return Status(StatusCode::kUnavailable, "the accelerator process did not finish within " +
                                                std::to_string(timeout.count()) +
                                                " ms of being asked to stop (killed)");
  }
  pid_ = -1;
  close(report_fd_);
  report_fd_ = -1;
  if (got < sizeof(report)) {
    return Status(StatusCode::kUnavailable,
                  "the accelerator process " + describe_wait_status(status) + " without reporting");
  }
  return report;
}

std::string Peer::describe() {
  if (mode_ == Mode::kThread) {
    if (state_ && state_->done.load(std::memory_order_acquire)) {
      return state_->report.ok != 0
                 ? std::string("the accelerator thread has returned")
                 : std::string("the accelerator thread failed: ") + state_->report.error;
    }
    return "the accelerator thread is still running";
  }
  if (pid_ <= 0) return "the accelerator process is not running";
  int status = 0;
  const pid_t waited = waitpid(pid_, &status, WNOHANG);
  if (waited == 0) return "the accelerator process is still running";
  if (waited < 0) return "the accelerator process cannot be waited for";
  pid_ = -1;
  std::string text = "the accelerator process " + describe_wait_status(status);
  PeerReport report;
  const ssize_t n = read(report_fd_, &report, sizeof(report));
  if (n == static_cast<ssize_t>(sizeof(report)) && report.ok == 0) {
    text += ": " + std::string(report.error);
  }
  return text;
}

}  // namespace caracal::bench
