#include "mqueue_manager/region.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace caracal::server {

bool QueueInbox::submit(Message& m) {
  std::lock_guard lock(m_);
  if (!open_) return false;
  items_.push_back(std::move(m));
  queued_.store(true, std::memory_order_relaxed);  // see queued_
  waiting.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::vector<Message> QueueInbox::close() {
  std::lock_guard lock(m_);
  open_ = false;
  waiting.fetch_sub(static_cast<uint32_t>(items_.size()), std::memory_order_relaxed);
  std::vector<Message> left;
  left.swap(items_);
  queued_.store(false, std::memory_order_relaxed);
  return left;
}

bool QueueInbox::take_locked(std::deque<Message>& out) {
  std::lock_guard lock(m_);
  if (items_.empty()) return false;
  for (Message& m : items_)
    out.push_back(std::move(m));
  items_.clear();
  queued_.store(false, std::memory_order_relaxed);
  return true;
}

AgentRegion::AgentRegion(std::string agent, uint64_t epoch, EngineEvents* events,
                         std::unique_ptr<RegionBinding> binding)
    : agent_(std::move(agent)), epoch_(epoch), events_(events), binding_(std::move(binding)) {
  const uint32_t queues = mqueue::queue_count(binding_->header());
  for (uint32_t q = 0; q < queues; ++q)
    inboxes_.push_back(std::make_shared<QueueInbox>());
}

AgentRegion::~AgentRegion() {
  for (auto& l : links_) {
    if (l) l->close();
  }
}

void AgentRegion::set_reply_timeout(std::chrono::milliseconds bound) {
  reply_timeout_ = bound;
  timeout_reason_ =
      "agent '" + agent_ + "' did not answer within " + std::to_string(bound.count()) + " ms";
}

void AgentRegion::set_ejected_until(std::optional<std::chrono::steady_clock::time_point> until) {
  int64_t ns = 0;
  if (until) {
    // Never 0 (which means "in dispatch"), whatever the clock's epoch.
    ns = std::max<int64_t>(
        1, std::chrono::duration_cast<std::chrono::nanoseconds>(until->time_since_epoch()).count());
  }
  ejected_until_ns_.store(ns, std::memory_order_relaxed);  // a hint: see ejected_until()
}

std::string AgentRegion::label() const {
  char epoch[24];
  std::snprintf(epoch, sizeof(epoch), "%016llx", static_cast<unsigned long long>(epoch_));
  return "agent " + agent_ + " epoch " + epoch + ", service " +
         (events_ != nullptr ? events_->name() : std::string("?"));
}

}  // namespace caracal::server
