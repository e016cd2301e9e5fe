// One thread that runs blocking jobs in order, off the I/O threads: the control endpoint's rdma
// connects, each of which may block for seconds (control.rdma_connect_timeout_ms per step).
#pragma once

#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace caracal::server {

// stop() drops what has not started and joins the running job; submit() after it drops the job.
class BlockingWorker {
 public:
  BlockingWorker() : thread_([this] { run(); }) {}
  ~BlockingWorker() { stop(); }

  void submit(std::function<void()> job) {
    {
      std::lock_guard lock(m_);
      if (stopping_) return;
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  void stop() {
    {
      std::lock_guard lock(m_);
      stopping_ = true;
      jobs_.clear();
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    pthread_setname_np(pthread_self(), "caracal-connect");
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(m_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace caracal::server
