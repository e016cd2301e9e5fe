#include "reply_routing.hpp"

#include <algorithm>
#include <stdexcept>

#include "thread_shard.hpp"

namespace caracal::server {

ReplyTable::ReplyTable(uint32_t capacity) : slots_(capacity) {
  if (capacity == 0 || capacity > kMaxReplySlots) {
    throw std::invalid_argument("reply table capacity " + std::to_string(capacity) +
                                " is not in [1, " + std::to_string(kMaxReplySlots) + "]");
  }
  shard_count_ = std::min<size_t>(kThreadShards, capacity);
  per_shard_ = capacity / static_cast<uint32_t>(shard_count_);
  shards_ = std::make_unique<Shard[]>(shard_count_);
  for (size_t k = 0; k < shard_count_; ++k) {
    Shard& sh = shards_[k];
    sh.first = static_cast<uint32_t>(k) * per_shard_;
    const uint32_t end = k + 1 == shard_count_ ? capacity : sh.first + per_shard_;
    sh.free.resize(end - sh.first);
    for (uint32_t i = sh.first; i < end; ++i)
      sh.free[i - sh.first] = i;
    sh.count = sh.free.size();
  }
}

std::optional<uint64_t> ReplyTable::acquire(std::shared_ptr<ReplySink> sink,
                                            const boost::asio::ip::udp::endpoint& peer,
                                            bool one_shot) {
  // This thread's shard first, then the others in turn: a shard running dry does not make the
  // table refuse while other shards have room.
  const size_t start = thread_shard() % shard_count_;
  std::optional<uint32_t> index;
  for (size_t n = 0; n < shard_count_ && !index; ++n) {
    Shard& sh = shards_[(start + n) % shard_count_];
    std::lock_guard lock(sh.m);
    if (sh.count == 0) continue;
    index = sh.free[sh.head];
    sh.head = (sh.head + 1) % sh.free.size();
    --sh.count;
  }
  if (!index) return std::nullopt;
  Slot& s = slots_[*index];
  std::lock_guard lock(s.m);
  s.bound = true;
  s.one_shot = one_shot;
  s.sink = std::move(sink);
  s.peer = peer;
  return make_token(*index, s.generation, 0);
}

void ReplyTable::put_free(uint32_t slot) {
  Shard& sh = owner(slot);
  std::lock_guard lock(sh.m);
  sh.free[(sh.head + sh.count) % sh.free.size()] = slot;
  ++sh.count;
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
  put_free(t.slot);
}

std::optional<ReplyTable::Route> ReplyTable::route(uint64_t token) {
  const TokenParts t = split_token(token);
  if (t.slot >= slots_.size()) return std::nullopt;
  Slot& s = slots_[t.slot];
  Route r;
  {
    std::lock_guard lock(s.m);
    if (!s.bound || s.generation != t.generation) return std::nullopt;
    r.peer = s.peer;
    if (!s.one_shot) {
      r.sink = s.sink;
      return r;
    }
    // Released here: the route takes the slot's reference, and the generation moves on, so a
    // second reply with this token finds nothing.
    s.bound = false;
    s.generation = (s.generation + 1) & kTokenGenerationMask;
    r.sink = std::move(s.sink);
  }
  put_free(t.slot);
  return r;
}

uint32_t ReplyTable::in_use() const {
  size_t free = 0;
  for (size_t k = 0; k < shard_count_; ++k) {
    Shard& sh = shards_[k];
    std::lock_guard lock(sh.m);
    free += sh.count;
  }
  return static_cast<uint32_t>(slots_.size() - free);
}

}  // namespace caracal::server
