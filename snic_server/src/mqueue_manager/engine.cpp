#include "mqueue_manager/engine.hpp"

#include <algorithm>
#include <atomic>
#include <utility>

#include "engine_thread.hpp"

namespace caracal::server {

Engine::Engine(ReplyTable& replies, EngineOptions options) : replies_(replies), options_(options) {
  options_.threads = std::clamp<uint32_t>(options_.threads, 1, kMaxEngineThreads);
  for (uint32_t i = 0; i < options_.threads; ++i)
    threads_.push_back(std::make_unique<EngineThread>(*this, i));
}

Engine::~Engine() {
  stop();
}

thread_local int Engine::hosted_index_ = -1;
thread_local uint64_t Engine::hosted_dispatches_ = 0;

int Engine::hosted_thread() {
  return hosted_index_;
}

void Engine::host(uint32_t thread, boost::asio::io_context& io) {
  threads_.at(thread)->set_host(io);
}

void Engine::run_hosted(uint32_t thread) {
  threads_.at(thread)->run_hosted();
}

void Engine::start() {
  for (auto& t : threads_)
    t->start();
}

void Engine::stop() {
  for (auto& t : threads_)
    t->request_stop();
  for (auto& t : threads_)
    t->join();
}

void Engine::place(AgentRegion& region) {
  const auto n = static_cast<uint32_t>(threads_.size());
  if (!region.binding().shareable()) return;  // served by thread 0 whatever its base
  // Relaxed: a counter; the base reaches the threads that read it through the locks of dispatch
  // and attach, which come after this.
  const uint32_t dealt = next_base_.fetch_add(region.server_queues(), std::memory_order_relaxed);
  region.set_engine_base(dealt % n);
}

uint32_t Engine::thread_of(const AgentRegion& region, uint32_t queue) const {
  const auto n = static_cast<uint32_t>(threads_.size());
  const uint32_t servers = region.server_queues();
  if (n == 1 || queue >= servers + region.client_queues() || !region.binding().shareable()) {
    return 0;
  }
  // Client queue c goes where server queue c goes: a handler that calls out on the client queue
  // of its own server queue has both served by one thread. Both terms below n: no overflow.
  const uint32_t index = queue < servers ? queue : queue - servers;
  return (region.engine_base() % n + index % n) % n;
}

std::vector<std::vector<uint32_t>> Engine::queues_by_thread(const AgentRegion& region) const {
  std::vector<std::vector<uint32_t>> parts(threads_.size());
  const uint32_t queues = region.server_queues() + region.client_queues();
  for (uint32_t q = 0; q < queues; ++q)
    parts[thread_of(region, q)].push_back(q);
  return parts;
}

void Engine::attach(const std::shared_ptr<AgentRegion>& region) {
  std::vector<std::vector<uint32_t>> parts = queues_by_thread(*region);
  for (size_t i = 0; i < threads_.size(); ++i) {
    if (parts[i].empty()) continue;
    threads_[i]->post(EngineThread::Command{
        EngineThread::Command::Kind::kAttach, region, std::move(parts[i]), {}, {}, {}});
  }
}

void Engine::detach(const std::shared_ptr<AgentRegion>& region, std::chrono::milliseconds drain,
                    std::function<void()> done) {
  const std::vector<std::vector<uint32_t>> parts = queues_by_thread(*region);
  const auto holders = static_cast<uint32_t>(
      std::count_if(parts.begin(), parts.end(), [](const auto& p) { return !p.empty(); }));
  if (holders == 0) {
    if (done) done();
    return;
  }
  // Every thread that serves part of the region drains its part; the last one to finish calls
  // `done`. acq_rel: that thread's call comes after every other thread's part was failed.
  auto remaining = std::make_shared<std::atomic<uint32_t>>(holders);
  auto shared_done = std::make_shared<std::function<void()>>(std::move(done));
  for (size_t i = 0; i < threads_.size(); ++i) {
    if (parts[i].empty()) continue;
    threads_[i]->post(EngineThread::Command{
        EngineThread::Command::Kind::kDetach,
        region,
        {},
        drain,
        [remaining, shared_done] {
          if (remaining->fetch_sub(1, std::memory_order_acq_rel) == 1 && *shared_done) {
            (*shared_done)();
          }
        },
        {}});
  }
}

void Engine::fail(const std::shared_ptr<AgentRegion>& region, const std::string& reason) {
  fail_elsewhere(region, reason, kNoThread);
}

void Engine::fail_elsewhere(const std::shared_ptr<AgentRegion>& region, const std::string& reason,
                            uint32_t except) {
  const std::vector<std::vector<uint32_t>> parts = queues_by_thread(*region);
  for (uint32_t i = 0; i < threads_.size(); ++i) {
    if (parts[i].empty() || i == except) continue;
    threads_[i]->post(
        EngineThread::Command{EngineThread::Command::Kind::kFail, region, {}, {}, {}, reason});
  }
}

void Engine::note_dispatched(const AgentRegion& region, uint32_t queue) {
  if (hosted_index_ >= 0) ++hosted_dispatches_;
  const uint32_t thread = thread_of(region, queue);
  threads_[thread]->note_dispatched(hosted_index_ == static_cast<int>(thread));
}

void Engine::notify(uint32_t thread) {
  threads_.at(thread)->notify();
}

double Engine::idle_seconds(uint32_t thread) const {
  return threads_.at(thread)->idle_seconds();
}

int64_t Engine::in_flight() const {
  int64_t n = 0;
  for (const auto& t : threads_)
    n += t->in_flight();
  return n;
}

}  // namespace caracal::server
