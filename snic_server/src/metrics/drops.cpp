#include "metrics/drops.hpp"

#include <iterator>
#include <utility>

namespace caracal::server {

const char* drop_reason_name(DropReason reason) {
  static constexpr const char* kNames[] = {
      "connection_closed", "malformed",       "no_agent",      "oversize",
      "partial_message",   "queue_full",      "reply_slots",   "reply_unframeable",
      "request_failed",    "stale_reply",     "unknown_token", "send_buffer_full",
      "send_failed",       "reply_too_large", "no_mbufs",      "late"};
  static_assert(std::size(kNames) == static_cast<size_t>(DropReason::kCount));
  return kNames[static_cast<size_t>(reason)];
}

DropCounters::DropCounters(Registry& registry, std::string name, std::string help, Labels labels)
    : registry_(registry),
      name_(std::move(name)),
      help_(std::move(help)),
      labels_(std::move(labels)) {}

void DropCounters::inc(DropReason reason) {
  std::atomic<Counter*>& slot = series_[static_cast<size_t>(reason)];
  // Pairs with the release store below, made by the thread that counted the reason first: a
  // series seen here is a whole Counter.
  Counter* c = slot.load(std::memory_order_acquire);
  if (c == nullptr) {
    Labels l = labels_;
    l.emplace_back("reason", drop_reason_name(reason));
    c = &registry_.counter(name_, help_, l);
    slot.store(c, std::memory_order_release);  // pairs with the acquire load above
  }
  c->inc();
}

}  // namespace caracal::server
