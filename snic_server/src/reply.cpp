#include "caracal/server/reply.hpp"

#include <stdexcept>

namespace caracal::server {

ReplyTable::ReplyTable(uint32_t capacity) : slots_(capacity), free_(capacity) {
  if (capacity == 0 || capacity > kMaxReplySlots) {
    throw std::invalid_argument("reply table capacity " + std::to_string(capacity) +
                                " is not in [1, " + std::to_string(kMaxReplySlots) + "]");
  }
  for (uint32_t i = 0; i < capacity; ++i)
    free_[i] = i;
  free_count_ = capacity;
}

std::optional<uint64_t> ReplyTable::acquire(std::shared_ptr<ReplySink> sink,
                                            const boost::asio::ip::udp::endpoint& peer) {
  uint32_t index = 0;
  {
    std::lock_guard lock(free_m_);
    if (free_count_ == 0) return std::nullopt;
    index = free_[free_head_];
    free_head_ = (free_head_ + 1) % free_.size();
    --free_count_;
  }
  Slot& s = slots_[index];
  std::lock_guard lock(s.m);
  s.bound = true;
  s.sink = std::move(sink);
  s.peer = peer;
  return make_token(index, s.generation, 0);
}

void ReplyTable::release(uint64_t token) {
  const TokenParts t = split_token(token);
  if (t.slot >= slots_.size()) return;
  Slot& s = slots_[t.slot];
  std::shared_ptr<ReplySink> dropped;  // destroyed outside the slot's lock
  {
    std::lock_guard lock(s.m);
    if (!s.bound || s.generation != t.generation) return;
    s.bound = false;
    s.generation = (s.generation + 1) & kTokenGenerationMask;
    dropped = std::move(s.sink);
  }
  std::lock_guard lock(free_m_);
  free_[(free_head_ + free_count_) % free_.size()] = t.slot;
  ++free_count_;
}

std::optional<ReplyTable::Route> ReplyTable::route(uint64_t token) const {
  const TokenParts t = split_token(token);
  if (t.slot >= slots_.size()) return std::nullopt;
  const Slot& s = slots_[t.slot];
  std::lock_guard lock(s.m);
  if (!s.bound || s.generation != t.generation) return std::nullopt;
  return Route{s.sink, s.peer};
}

uint32_t ReplyTable::in_use() const {
  std::lock_guard lock(free_m_);
  return static_cast<uint32_t>(slots_.size() - free_count_);
}

}  // namespace caracal::server
