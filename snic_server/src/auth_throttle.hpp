// Per-address penalties for failed hellos at the control endpoint, the way sshd's
// PerSourcePenalties work: an address that fails `failures` hellos, with no gap of `window`
// between them, is refused for `penalty`; every failure after that, once the penalty is over,
// doubles it, up to `max_penalty`. While an address is under penalty the endpoint answers its
// connections with a throttled refusal and compares nothing, so a guesser gets about
// `failures` tries at once and then one per penalty. An address quiet for `window` after its
// last failure and penalty is forgiven; a successful hello forgives it at once.
//
// Failures are counted per address (IPv6 by its /64, which one host usually holds whole), at
// most `max_addresses` of them: past that the address that failed longest ago is forgotten
// first, so memory stays bounded whatever the number of sources.
//
// Plain bookkeeping with the time passed in: no timers, no sleeping, no lock (the control
// endpoint holds its own). A penalty only refuses; it never delays a thread, so one throttled
// address costs other addresses and the data path nothing but the refusals themselves.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>

namespace caracal::server {

struct AuthThrottleConfig {
  uint32_t failures = 5;  // 0: no throttling
  std::chrono::milliseconds window{60'000};
  std::chrono::milliseconds penalty{1'000};
  std::chrono::milliseconds max_penalty{60'000};
  uint32_t max_addresses = 4096;
};

class AuthThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  using Address = boost::asio::ip::address;

  explicit AuthThrottle(AuthThrottleConfig config) : config_(config) {}

  bool enabled() const { return config_.failures != 0; }

  struct Check {
    std::chrono::milliseconds left{0};  // 0: the address may try now
    bool first = false;  // the first connection refused in this penalty (log it, once)
  };
  // Whether `address` is under penalty at `now`, and for how long still.
  Check check(const Address& address, Clock::time_point now);

  struct Failure {
    uint32_t failures = 0;                 // in a row, this one included
    std::chrono::milliseconds penalty{0};  // nonzero: this failure started a penalty
  };
  // A failed hello from `address` (one not under penalty: see check()).
  Failure fail(const Address& address, Clock::time_point now);
  // A successful hello: the address is forgotten.
  void succeed(const Address& address);

  size_t tracked() const { return entries_.size(); }
  uint64_t evicted() const { return evicted_; }

  // The key an address is counted under: IPv4 as it is (an IPv4-mapped IPv6 address as its
  // IPv4 address), IPv6 by its /64.
  static Address key_of(const Address& address);

 private:
  struct Entry {
    uint32_t failures = 0;
    uint32_t penalties = 0;  // in a row: the next penalty is penalty * 2^penalties
    Clock::time_point last_failure{};
    Clock::time_point penalty_until{};
    bool logged = false;  // this penalty's first refusal was reported
    std::list<Address>::iterator lru;
  };
  // Forgotten once quiet for the window after its last failure and its penalty.
  bool expired(const Entry& e, Clock::time_point now) const;
  Entry& entry_for(const Address& key, Clock::time_point now);

  AuthThrottleConfig config_;
  std::map<Address, Entry> entries_;
  std::list<Address> lru_;  // least recently failed first
  uint64_t evicted_ = 0;
};

}  // namespace caracal::server
