#include "auth_throttle.hpp"

#include <algorithm>

namespace caracal::server {

using std::chrono::milliseconds;

AuthThrottle::Address AuthThrottle::key_of(const Address& address) {
  if (address.is_v4()) return address;
  const boost::asio::ip::address_v6 v6 = address.to_v6();
  if (v6.is_v4_mapped()) {
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, v6);
  }
  boost::asio::ip::address_v6::bytes_type bytes = v6.to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), 0);
  return boost::asio::ip::address_v6(bytes);
}

bool AuthThrottle::expired(const Entry& e, Clock::time_point now) const {
  return now >= std::max(e.last_failure, e.penalty_until) + config_.window;
}

AuthThrottle::Check AuthThrottle::check(const Address& address, Clock::time_point now) {
  if (!enabled()) return {};
  auto it = entries_.find(key_of(address));
  if (it == entries_.end() || now >= it->second.penalty_until) return {};
  Entry& e = it->second;
  Check c;
  c.left = std::chrono::ceil<milliseconds>(e.penalty_until - now);
  c.first = !e.logged;
  e.logged = true;
  return c;
}

AuthThrottle::Entry& AuthThrottle::entry_for(const Address& key, Clock::time_point now) {
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    Entry& e = it->second;
    if (expired(e, now)) {
      e.failures = 0;
      e.penalties = 0;
    }
    lru_.splice(lru_.end(), lru_, e.lru);
    return e;
  }
  while (!entries_.empty() && entries_.size() >= std::max<uint32_t>(config_.max_addresses, 1)) {
    // Full: the least recently failed goes, counted as an eviction unless it had expired.
    auto victim = entries_.find(lru_.front());
    if (!expired(victim->second, now)) ++evicted_;
    entries_.erase(victim);
    lru_.pop_front();
  }
  Entry& e = entries_[key];
  e.lru = lru_.insert(lru_.end(), key);
  return e;
}

AuthThrottle::Failure AuthThrottle::fail(const Address& address, Clock::time_point now) {
  if (!enabled()) return {};
  Entry& e = entry_for(key_of(address), now);
  ++e.failures;
  e.last_failure = now;
  Failure f{e.failures, milliseconds(0)};
  if (e.failures >= config_.failures) {
    // penalty * 2^penalties, capped, without overflowing the shift.
    milliseconds p = config_.penalty;
    for (uint32_t i = 0; i < e.penalties && p < config_.max_penalty; ++i)
      p *= 2;
    p = std::min(p, config_.max_penalty);
    ++e.penalties;
    e.penalty_until = now + p;
    e.logged = false;
    f.penalty = p;
  }
  return f;
}

void AuthThrottle::succeed(const Address& address) {
  auto it = entries_.find(key_of(address));
  if (it == entries_.end()) return;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

}  // namespace caracal::server
