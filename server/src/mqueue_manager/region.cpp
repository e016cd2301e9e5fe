#include "caracal/server/mqueue_manager/region.hpp"

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

std::string AgentRegion::label() const {
  char epoch[24];
  std::snprintf(epoch, sizeof(epoch), "%016llx", static_cast<unsigned long long>(epoch_));
  return "agent " + agent_ + " epoch " + epoch + ", service " +
         (events_ != nullptr ? events_->name() : std::string("?"));
}

}  // namespace caracal::server
