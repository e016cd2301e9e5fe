#include "datapath.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "caracal/mqueue/shm.hpp"
#include "mqueue_manager/flights.hpp"
#include "tunables.hpp"
#ifdef CARACAL_HAVE_RDMA
#include "caracal/mqueue/rdma.hpp"
#endif
#include "engine_thread.hpp"
#include "profile.hpp"

namespace caracal::server {

namespace prof = engine_profile;
using Clock = std::chrono::steady_clock;

namespace {

template <mqueue::Transport T>
class TransportBinding final : public RegionBinding {
 public:
  TransportBinding(std::unique_ptr<T> transport, mqueue::RemoteRegion<T> region,
                   std::shared_ptr<void> memory)
      : memory_(std::move(memory)),
        transport_(std::move(transport)),
        region_(std::move(region)),
        backlog_(mqueue::queue_count(region_.header())) {
    // Each queue's flights sized for a ring's worth of requests (QueueFlights).
    server_.reserve(region_.header().server_queue_count);
    for (uint32_t q = 0; q < region_.header().server_queue_count; ++q)
      server_.emplace_back(region_.header().ring_capacity);
  }

  const mqueue::RegionHeader& header() const override { return region_.header(); }

  bool shareable() const override { return kLocal; }

  bool serve(EngineThread& engine, AgentRegion& r, std::span<const uint32_t> queues,
             std::string& fault) override {
    bool busy = false;
    const mqueue::RegionHeader& h = region_.header();
    if (Status s = transport_->progress(); !s.ok()) {
      fault = "transport: " + s.message();
      return true;
    }
    // Inboxes to RX rings, as far as credits go; one tail publication per ring per round.
    for (const uint32_t q : queues) {
      QueueInbox& inbox = r.inbox(q);
      std::deque<Message>& backlog = backlog_[q];
      {
        prof::Scope t(prof::kInboxTake);
        busy |= inbox.take(backlog);
      }
      // Entries write_now() left for this round to publish.
      const bool written_now =
          q < h.server_queue_count && std::exchange(server_[q].unpublished, false);
      if (backlog.empty() && !written_now) continue;
      auto& rx = region_.rx(q);
      const bool server_queue = q < h.server_queue_count;
      const bool with_deadlines = r.reply_timeout().count() != 0;
      uint32_t written = 0;
      prof::Scope rx_write(prof::kRxWrite);
      while (!backlog.empty()) {
        const Message& m = backlog.front();
        // No credits yet (a read of the head is in flight): the rest waits for the next round.
        if (!write_entry(rx, m.token, m.flags, m.bytes)) break;
        if (server_queue) server_[q].flights.add(m.token, m.submitted, with_deadlines);
        {
          prof::Scope t(prof::kRequestFree);
          backlog.pop_front();
        }
        ++written;
      }
      if (written != 0 || written_now) {
        prof::Scope publish(prof::kRxPublish);
        rx.publish();
        busy = true;
      }
      if (written != 0) {
        inbox.waiting.fetch_sub(written, std::memory_order_relaxed);
        if (server_queue && r.events() != nullptr) r.events()->on_room();
      }
      inbox.ring_slots_in_use.store(rx.outstanding_slots(), std::memory_order_relaxed);
    }
    // TX rings. Local: a load of each of this thread's tails, as it goes (below). Remote: one
    // read of every tail (the region is served by one thread).
    if constexpr (!kLocal) {
      prof::Scope tx_fetch(prof::kTxFetch);
      if (should_fetch_tx_tails()) region_.fetch_tx_tails();
      if (Status s = transport_->progress(); !s.ok()) {
        fault = "transport: " + s.message();
        return true;
      }
      if (!region_.deliver_tx_tails()) return busy;
    }
    bool delivered_any = false;
    bool answered_in_time = false;
    for (const uint32_t q : queues) {
      auto& tx = region_.tx(q);
      const bool server_queue = q < h.server_queue_count;
      mqueue::Entry e;
      mqueue::PollResult pr;
      bool any = false;
      for (;;) {
        bool by_line = false;
        {
          prof::Scope t(prof::kTxNext);
          if constexpr (kLocal) {
            // With TX lines, an entry the accelerator has announced in its line first: it lands
            // before the tail that covers it is published (mqueue/layout.hpp). Then the tail,
            // loaded now, for entries without a line (none without TX lines).
            pr = tx.next_by_line(e);
            by_line = pr == mqueue::PollResult::kReady;
            if (pr == mqueue::PollResult::kEmpty) {
              region_.observe_tx_tail(q);
              pr = tx.next(e);
            }
          } else {
            pr = tx.next(e);
          }
        }
        if (pr != mqueue::PollResult::kReady) break;
        any = true;
        if (server_queue) {
          if (by_line && r.events() != nullptr) r.events()->on_line_reply();
          answered_in_time |= reply(engine, r, q, e);
        } else {
          call_out(r, q - h.server_queue_count, e);
        }
      }
      if (any) {
        prof::Scope t(prof::kTxRelease);
        tx.release();
        tx.publish();
        busy = true;
        delivered_any = true;
      }
      if (pr == mqueue::PollResult::kCorrupt) {
        fault = std::string(server_queue ? "server" : "client") + " queue " + std::to_string(q) +
                ": corrupt TX entry (" + mqueue::entry_check_name(tx.last_check()) + ")";
        return true;
      }
    }
    note_tx_fetch(delivered_any);
    // An ejected region that answers in time may go back into dispatch (one relaxed load per
    // round that had answers).
    if (answered_in_time && r.events() != nullptr && r.ejected_until()) {
      r.events()->on_ejection_over(r, /*answered=*/true);
    }
    return busy;
  }

  void expire(EngineThread& engine, AgentRegion& r, std::span<const uint32_t> queues,
              Clock::time_point now) override {
    const Clock::duration bound = r.reply_timeout();
    const uint32_t server_queues = region_.header().server_queue_count;
    for (const uint32_t q : queues) {
      if (q >= server_queues) continue;
      QueueInbox& inbox = r.inbox(q);
      const auto time_out = [&](uint64_t token, Clock::time_point submitted) {
        inbox.outstanding.fetch_sub(1, std::memory_order_relaxed);
        engine.answer(r.events(), token, ReplyView{Reply::Kind::kError, r.timeout_reason()},
                      submitted);
      };
      // In the ring (the oldest), then waiting for room in it.
      ServerQueue& sq = server_[q];
      uint32_t expired = sq.flights.expire(now, bound, time_out);
      uint32_t waited = 0;
      std::deque<Message>& backlog = backlog_[q];
      while (!backlog.empty() && now - backlog.front().submitted >= bound) {
        const Message m = std::move(backlog.front());
        backlog.pop_front();
        inbox.waiting.fetch_sub(1, std::memory_order_relaxed);
        time_out(m.token, m.submitted);
        ++waited;
      }
      if (expired + waited == 0) continue;
      expired += waited;
      uint32_t& in_a_row = sq.timeouts_in_a_row;
      in_a_row = expired > UINT32_MAX - in_a_row ? UINT32_MAX : in_a_row + expired;
      if (r.events() != nullptr) {
        r.events()->on_reply_timeouts(r, expired, in_a_row);
        // The backlog shrank: a queue that was congested may be no longer.
        if (waited != 0) r.events()->on_room();
      }
    }
  }

  void take_in_flight(std::span<const uint32_t> queues,
                      std::vector<std::pair<uint64_t, Clock::time_point>>& out) override {
    for (const uint32_t q : queues) {
      if (q >= region_.header().server_queue_count) continue;
      server_[q].flights.take_all(out);
      for (Message& m : backlog_[q])
        out.emplace_back(m.token, m.submitted);
      backlog_[q].clear();
    }
  }

  size_t in_flight(std::span<const uint32_t> queues) const override {
    size_t n = 0;
    for (const uint32_t q : queues) {
      if (q >= region_.header().server_queue_count) continue;
      n += backlog_[q].size() + server_[q].flights.live();
    }
    return n;
  }

  void request_stop() override { region_.request_stop(); }

  bool write_now(AgentRegion& r, uint32_t q, uint64_t token, std::string_view bytes,
                 Clock::time_point submitted) override {
    if constexpr (!kLocal) {
      return false;  // rdma: one thread serves the region and posts its writes in its rounds
    } else {
      QueueInbox& inbox = r.inbox(q);
      // Requests that came first are written first; a closed queue takes nothing more.
      if (!backlog_[q].empty() || inbox.maybe_waiting() || !inbox.open_for_owner()) return false;
      if (!write_entry(region_.rx(q), token, 0, bytes)) return false;
      server_[q].flights.add(token, submitted, r.reply_timeout().count() != 0);
      server_[q].unpublished = true;
      return true;
    }
  }

 private:
  // One entry into an RX ring, unpublished: its slots reserved, the bytes copied, the header
  // committed. False, and nothing written, when the ring has no room for it.
  template <typename Rx>
  static bool write_entry(Rx& rx, uint64_t token, uint16_t flags, std::string_view bytes) {
    const auto n = static_cast<uint32_t>(bytes.size());
    std::byte* dst = nullptr;
    {
      prof::Scope t(prof::kRxReserve);
      dst = rx.reserve(n);
    }
    if (dst == nullptr) return false;
    if (n != 0) {
      prof::Scope t(prof::kRxCopy);
      std::memcpy(dst, bytes.data(), n);
    }
    prof::Scope t(prof::kRxCommit);
    rx.commit(n, token, flags);
    return true;
  }

  // A local transport (shm) reads a tail with a load: several engine threads may share the
  // region, each serving its own queues, and every round reads the tails of its queues. A
  // remote one (rdma) pays a READ per fetch of every tail: fetch every round while requests are
  // outstanding, back off while none are (see bind_rdma_region).
  static constexpr bool kLocal = std::is_same_v<T, mqueue::ShmTransport>;

  // Remote only (the region is served by one thread). Late answers, which may still come for
  // requests that timed out, are found by the idle fetches.
  bool any_in_flight() const {
    return std::any_of(server_.begin(), server_.end(),
                       [](const ServerQueue& sq) { return sq.flights.live() != 0; });
  }

  bool should_fetch_tx_tails() {
    if (any_in_flight()) {
      idle_fetch_gap_ = std::chrono::microseconds{0};
      return true;
    }
    return Clock::now() >= next_idle_fetch_;
  }

  // After a fetch was delivered: anything found keeps polling busy; an empty fetch with
  // nothing outstanding doubles the gap to the next one, up to tunables::kRdmaIdleFetchMax.
  void note_tx_fetch(bool found) {
    if constexpr (!kLocal) {
      if (found || any_in_flight()) {
        idle_fetch_gap_ = std::chrono::microseconds{0};
      } else {
        idle_fetch_gap_ = std::clamp(idle_fetch_gap_ * 2, tunables::kRdmaIdleFetchMin,
                                     tunables::kRdmaIdleFetchMax);
      }
      next_idle_fetch_ = Clock::now() + idle_fetch_gap_;
    } else {
      (void)found;
    }
  }

  // Routes one answer of server queue q; returns whether it was in time (its request live).
  bool reply(EngineThread& engine, AgentRegion& r, uint32_t q, const mqueue::Entry& e) {
    Clock::time_point submitted;
    ServerQueue& sq = server_[q];
    switch (sq.flights.take(e.token, submitted)) {
      case QueueFlights::Answer::kLive:
        break;
      case QueueFlights::Answer::kLate:
        // Its request timed out and its client has had the error: never a second answer.
        if (r.events() != nullptr) r.events()->on_unrouted(DropReason::kLate);
        return false;
      case QueueFlights::Answer::kUnknown:
        // Not a token this queue was given (or one already answered): a handler bug, such as an
        // answer on another queue's TX ring. It cannot be routed safely, so it is dropped.
        if (r.events() != nullptr) r.events()->on_unrouted(DropReason::kUnknownToken);
        return false;
    }
    sq.timeouts_in_a_row = 0;
    QueueInbox& inbox = r.inbox(q);
    inbox.outstanding.fetch_sub(1, std::memory_order_relaxed);
    inbox.answered.store(inbox.answered.load(std::memory_order_relaxed) + 1,
                         std::memory_order_relaxed);  // this thread alone writes it
    // The payload stays in the TX slot until the ring is released after this round's entries:
    // the sink copies it from there (ReplyView).
    ReplyView rep;
    if ((e.flags & mqueue::kSlotNoReply) != 0) {
      rep.kind = Reply::Kind::kNoReply;
    } else {
      rep.kind = (e.flags & mqueue::kSlotError) != 0 ? Reply::Kind::kError : Reply::Kind::kData;
      rep.bytes = std::string_view(reinterpret_cast<const char*>(e.payload), e.length);
    }
    engine.answer(r.events(), e.token, rep, submitted);
    return true;
  }

  void call_out(AgentRegion& r, uint32_t client, const mqueue::Entry& e) {
    ClientLink* link = r.link(client);
    std::string bytes(reinterpret_cast<const char*>(e.payload), e.length);
    if (link == nullptr) {
      Message m{e.token, mqueue::kSlotError,
                "client queue " + std::to_string(client) + " has no destination", Clock::now()};
      (void)r.inbox(r.server_queues() + client).submit(m);
      return;
    }
    link->send(e.token, std::move(bytes));
  }

  std::shared_ptr<void> memory_;  // declared first: destroyed after the transport using it
  std::unique_ptr<T> transport_;
  mqueue::RemoteRegion<T> region_;
  // Per queue, each element used by the thread that serves the queue only.
  std::vector<std::deque<Message>> backlog_;

  // A server queue's requests in its ring, and how many timed out since its last answer in
  // time. A cache line (or more) each: the queues of one region are served by several threads,
  // and each writes its queues' state with every request and answer.
  struct alignas(64) ServerQueue {
    explicit ServerQueue(uint32_t ring_slots) : flights(ring_slots) {}
    QueueFlights flights;
    uint32_t timeouts_in_a_row = 0;
    bool unpublished = false;  // entries written by write_now() since the last publication
  };
  std::vector<ServerQueue> server_;
  std::chrono::microseconds idle_fetch_gap_{0};  // remote TX polling only
  Clock::time_point next_idle_fetch_{};
};

}  // namespace

template <mqueue::Transport T>
std::unique_ptr<RegionBinding> make_transport_binding(std::unique_ptr<T> transport,
                                                      mqueue::RemoteRegion<T> region,
                                                      std::shared_ptr<void> memory) {
  return std::make_unique<TransportBinding<T>>(std::move(transport), std::move(region),
                                               std::move(memory));
}

// The transports this server serves: the only instantiations of the data path.
template std::unique_ptr<RegionBinding> make_transport_binding<mqueue::ShmTransport>(
    std::unique_ptr<mqueue::ShmTransport>, mqueue::RemoteRegion<mqueue::ShmTransport>,
    std::shared_ptr<void>);
#ifdef CARACAL_HAVE_RDMA
template std::unique_ptr<RegionBinding> make_transport_binding<mqueue::RdmaTransport>(
    std::unique_ptr<mqueue::RdmaTransport>, mqueue::RemoteRegion<mqueue::RdmaTransport>,
    std::shared_ptr<void>);
#endif

}  // namespace caracal::server
