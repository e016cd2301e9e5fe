// The SmartNIC side of the CPU accelerator tests, as real code: a region created the way an
// agent creates it (create_shm_region), a second mapping of it through its fd (what the server
// gets over the control channel), and RemoteRegion<ShmTransport> on that mapping pushing
// requests into RX rings and reading TX rings after fetch_tx_tails()/deliver_tx_tails().
//
// The accelerator side of a test runs CpuAccelerator on region(), the agent's mapping; the two
// sides share nothing but the memory behind the two mappings.
//
// Also here: bounded waits, so that a test fails instead of hanging.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "caracal/accel/cpu.hpp"
#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/remote_ring.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/shm.hpp"

namespace caracal::accel::test {

using Clock = std::chrono::steady_clock;

// Generous: a healthy run takes milliseconds; sanitizers on a loaded 2-core machine are slower.
inline constexpr std::chrono::seconds kWaitLimit{60};

// Polls `done` until it holds or `limit` passes; false on timeout.
template <class Pred>
bool wait_until(Pred&& done, std::chrono::nanoseconds limit = kWaitLimit) {
  const auto deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// Runs `fn` on another thread and waits for it at most `limit`. A call that does not return
// cannot be cancelled, so a timeout aborts the test binary (a failure, not a hang).
template <class Fn>
void finish_within(const char* what, Fn&& fn, std::chrono::nanoseconds limit = kWaitLimit) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread runner([&] {
    fn();
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, limit, [&] { return done; })) {
      std::fprintf(stderr, "FATAL: %s did not return within %lld ms\n", what,
                   static_cast<long long>(
                       std::chrono::duration_cast<std::chrono::milliseconds>(limit).count()));
      std::fflush(stderr);
      std::abort();
    }
  }
  runner.join();
}

// CpuAccelerator::stop(), bounded like every other wait.
template <class Accelerator>
void stop_within(Accelerator& acc) {
  finish_within("CpuAccelerator::stop()", [&] { acc.stop(); });
}

// Threads of this process, from /proc: back at a baseline once workers are gone.
inline size_t thread_count() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

// The thread count to come back to after workers are gone. One thread is started and joined
// first: a sanitizer runtime starts its own helper thread with the first one, and keeps it. A
// joined thread may still be listed in /proc for a moment (the kernel reaps it after join
// returns; under qemu's user-mode emulation long enough to be counted), so the count is taken
// once it is back to what it was before, or has held still for 100 ms (a sanitizer's helper
// stays).
inline size_t baseline_thread_count() {
  using Clock = std::chrono::steady_clock;
  const size_t before = thread_count();
  std::thread([] {}).join();
  size_t n = thread_count();
  Clock::time_point still_since = Clock::now();
  for (const Clock::time_point until = still_since + std::chrono::seconds(2);
       n != before && Clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (const size_t m = thread_count(); m != n) {
      n = m;
      still_since = Clock::now();
    } else if (Clock::now() - still_since >= std::chrono::milliseconds(100)) {
      break;
    }
  }
  return n;
}

inline std::vector<std::byte> to_bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

inline std::string to_text(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

inline std::vector<std::byte> random_bytes(std::mt19937& rng, uint32_t n) {
  std::vector<std::byte> out(n);
  std::uniform_int_distribution<int> byte(0, 255);
  for (std::byte& b : out)
    b = static_cast<std::byte>(byte(rng));
  return out;
}

// One TX entry as the SmartNIC read it, copied out of staging before the head moves past it.
struct TxEntry {
  uint32_t queue = 0;
  uint64_t token = 0;
  uint16_t flags = 0;
  std::vector<std::byte> data;

  std::string text() const { return to_text(data); }
  bool is_error() const { return (flags & mqueue::kSlotError) != 0; }
};

// A request a test queues for exchange().
struct PendingRequest {
  std::vector<std::byte> payload;
  uint64_t token = 0;
};

// The SmartNIC side over any transport: RemoteRegion<T> pushing requests into RX rings and
// reading TX rings, as the server's mqueue manager does.
template <mqueue::Transport T>
class RemoteDriver {
 public:
  using Remote = mqueue::RemoteRegion<T>;

  RemoteDriver() = default;
  RemoteDriver(const RemoteDriver&) = delete;
  RemoteDriver& operator=(const RemoteDriver&) = delete;

  const mqueue::RegionHeader& header() const { return remote_->header(); }
  uint32_t server_queues() const { return header().server_queue_count; }
  Remote& remote() { return *remote_; }
  T& transport() { return *transport_; }

  // --- RX: requests into a ring the accelerator consumes ---------------------------------

  // Writes one entry into RX ring `queue` without publishing it; false when the ring has no
  // credits now (RemoteRingProducer::reserve re-reads the head first).
  bool try_push(uint32_t queue, std::span<const std::byte> payload, uint64_t token,
                uint16_t flags = 0) {
    return remote_->rx(queue).push(payload.data(), static_cast<uint32_t>(payload.size()), token,
                                   flags);
  }
  // Makes every entry written into RX ring `queue` visible to the accelerator.
  void publish(uint32_t queue) { remote_->rx(queue).publish(); }

  // try_push + publish, retried until credits come back. False on timeout.
  bool push(uint32_t queue, std::span<const std::byte> payload, uint64_t token,
            uint16_t flags = 0) {
    const bool ok = wait_until([&] {
      progress();
      return try_push(queue, payload, token, flags);
    });
    publish(queue);
    return ok;
  }

  // Publishes an entry of RX ring `queue` whose header is `bad` instead of what the payload
  // needs: room for `payload_bytes` is reserved and committed the normal way (so the producer's
  // bookkeeping stays sane), then the header is overwritten in staging before the tail moves.
  // Returns the entry's ring position.
  uint32_t push_raw_header(uint32_t queue, const mqueue::SlotHeader& bad, uint32_t payload_bytes) {
    auto& rx = remote_->rx(queue);
    std::byte* payload = rx.reserve(payload_bytes);
    if (payload == nullptr) throw std::runtime_error("push_raw_header: no room");
    std::memset(payload, 0, payload_bytes);
    if (!rx.commit(payload_bytes, bad.token)) throw std::runtime_error("push_raw_header: commit");
    std::byte* slot = payload - mqueue::kSlotHeaderBytes;
    std::memcpy(slot, &bad, sizeof(bad));
    const uint64_t offset = static_cast<uint64_t>(slot - transport_->staging(0));
    transport_->post_write(offset, mqueue::kSlotHeaderBytes);
    rx.publish();
    const uint64_t ring = mqueue::rx_ring_offset(header(), queue);
    return static_cast<uint32_t>((offset - ring) / header().slot_bytes);
  }

  // --- TX: entries the accelerator produced ---------------------------------------------

  // Lets an asynchronous transport retire completed operations (credits and reads depend on
  // them); a failed completion fails the test.
  void progress() {
    if (Status s = transport_->progress(); !s.ok()) {
      throw std::runtime_error(std::string(transport_->name()) + ": " + s.message());
    }
  }

  // One read of every TX tail, handed to every TX consumer.
  void fetch_tails() {
    const uint64_t ticket = remote_->fetch_tx_tails();
    if (Status s = mqueue::wait_for(*transport_, ticket, kWaitLimit); !s.ok()) {
      throw std::runtime_error("fetch_tx_tails: " + s.message());
    }
    if (!remote_->deliver_tx_tails()) throw std::runtime_error("deliver_tx_tails refused");
  }

  // Copies out every TX entry of `queue` that has arrived since the last fetch_tails(), then
  // gives the slots back (one head publish). A corrupt entry throws. A transport that reads
  // asynchronously gets the entries' slots read first (RemoteRingConsumer::next says when).
  size_t take_tx(uint32_t queue, std::vector<TxEntry>& out) {
    auto& tx = remote_->tx(queue);
    size_t n = 0;
    mqueue::Entry e;
    for (;;) {
      mqueue::PollResult r = tx.next(e);
      while (r == mqueue::PollResult::kEmpty && tx.reading()) {
        progress();
        r = tx.next(e);
      }
      if (r == mqueue::PollResult::kEmpty) break;
      if (r == mqueue::PollResult::kCorrupt) {
        throw std::runtime_error("TX ring " + std::to_string(queue) +
                                 " corrupt: " + mqueue::entry_check_name(tx.last_check()));
      }
      out.push_back(TxEntry{queue, e.token, e.flags, {e.payload, e.payload + e.length}});
      ++n;
    }
    tx.release();
    tx.publish();
    return n;
  }

  // Entries take_tx_lines() took from TX lines.
  uint64_t taken_by_line() const { return by_line_; }

  // With TX lines over shm (as snic_server polls them): every entry of `queue` announced by its
  // line, ahead of the tail that covers it.
  size_t take_tx_lines(uint32_t queue, std::vector<TxEntry>& out) {
    size_t n = 0;
    if constexpr (std::is_same_v<T, mqueue::ShmTransport>) {
      auto& tx = remote_->tx(queue);
      mqueue::Entry e;
      for (;;) {
        const mqueue::PollResult r = tx.next_by_line(e);
        if (r == mqueue::PollResult::kEmpty) break;
        if (r == mqueue::PollResult::kCorrupt) {
          throw std::runtime_error("TX line " + std::to_string(queue) +
                                   " corrupt: " + mqueue::entry_check_name(tx.last_check()));
        }
        out.push_back(TxEntry{queue, e.token, e.flags, {e.payload, e.payload + e.length}});
        ++n;
        ++by_line_;
      }
    }
    return n;
  }

  // take_tx_lines, then fetch_tails + take_tx, of every server queue.
  size_t poll_replies(std::vector<TxEntry>& out) {
    size_t n = 0;
    for (uint32_t q = 0; q < server_queues(); ++q)
      n += take_tx_lines(q, out);
    fetch_tails();
    for (uint32_t q = 0; q < server_queues(); ++q)
      n += take_tx(q, out);
    return n;
  }

  // Polls until `out` holds at least `count` entries. False on timeout.
  bool collect_replies(size_t count, std::vector<TxEntry>& out) {
    return wait_until([&] {
      poll_replies(out);
      return out.size() >= count;
    });
  }

  // What a dispatcher does with a fixed workload: pushes requests[q] into server queue q in
  // order, as fast as credits allow (one publish per queue per round), while reading replies
  // into replies[q]. The first `already_queued` requests of each queue were pushed by the
  // caller. `each_round`, when given, runs once per round after the pushes (a test plays the
  // destination of client queues there). Returns when every request has its reply; false on
  // timeout.
  using PendingRequest = test::PendingRequest;
  bool exchange(const std::vector<std::vector<PendingRequest>>& requests,
                std::vector<std::vector<TxEntry>>& replies, size_t already_queued = 0,
                const std::function<void()>& each_round = {}) {
    const uint32_t queues = static_cast<uint32_t>(requests.size());
    replies.resize(queues);
    std::vector<size_t> sent(queues, already_queued);
    size_t expected = 0;
    for (const auto& r : requests)
      expected += r.size();
    size_t received = 0;
    std::vector<TxEntry> batch;
    return wait_until([&] {
      for (uint32_t q = 0; q < queues; ++q) {
        while (sent[q] < requests[q].size() &&
               try_push(q, requests[q][sent[q]].payload, requests[q][sent[q]].token)) {
          ++sent[q];
        }
        publish(q);
      }
      if (each_round) each_round();
      batch.clear();
      poll_replies(batch);
      for (TxEntry& e : batch)
        replies[e.queue].push_back(std::move(e));
      received += batch.size();
      return received >= expected;
    });
  }

  // --- Client queues: the test plays the destination ------------------------------------

  uint32_t client_queue(uint32_t client) const {
    return mqueue::client_queue_index(header(), client);
  }
  // Requests handlers sent on client queue `client` (its TX ring).
  size_t take_client_requests(uint32_t client, std::vector<TxEntry>& out) {
    fetch_tails();
    return take_tx(client_queue(client), out);
  }
  // Answers into client queue `client`'s RX ring and publishes. False on timeout.
  bool answer(uint32_t client, uint64_t token, std::span<const std::byte> payload,
              uint16_t flags = 0) {
    return push(client_queue(client), payload, token, flags);
  }

  // --- Control words ----------------------------------------------------------------------

  uint32_t index(mqueue::IndexArray array, uint32_t queue) {
    return transport_->load_index(mqueue::index_offset(header(), array, queue));
  }
  void request_stop() { remote_->request_stop(); }

 protected:
  std::optional<T> transport_;
  std::optional<Remote> remote_;
  uint64_t by_line_ = 0;
};

// The shm setup: a region created the way an agent creates it, and the SmartNIC side attached
// to a second mapping of it.
class SnicDriver : public RemoteDriver<mqueue::ShmTransport> {
 public:
  // Creates the region for `geometry` and attaches the SmartNIC side to a second mapping.
  // Throws (which fails the test) when any step does.
  explicit SnicDriver(const mqueue::RegionGeometry& geometry, uint64_t epoch = 1) {
    Result<mqueue::ShmMapping> agent = mqueue::create_shm_region(geometry, epoch, "accel-test");
    if (!agent.ok()) throw std::runtime_error("create_shm_region: " + agent.status().message());
    agent_ = std::move(agent).value();
    Result<mqueue::ShmMapping> snic = mqueue::ShmMapping::open_fd(agent_.fd());
    if (!snic.ok()) throw std::runtime_error("ShmMapping::open_fd: " + snic.status().message());
    snic_ = std::move(snic).value();
    if (snic_.data() == agent_.data()) throw std::runtime_error("second mapping is not distinct");
    transport_.emplace(snic_.data(), snic_.size());
    Result<Remote> remote = Remote::attach(&*transport_);
    if (!remote.ok())
      throw std::runtime_error("RemoteRegion::attach: " + remote.status().message());
    remote_.emplace(std::move(remote).value());
  }

  // The accelerator's view: the agent's own mapping.
  mqueue::RegionView region() const { return mqueue::RegionView(agent_.data()); }
  // The agent's mapping itself (what a GPU agent registers with CUDA).
  std::byte* agent_data() const { return agent_.data(); }
  uint64_t agent_bytes() const { return agent_.size(); }

 private:
  mqueue::ShmMapping agent_;  // the accelerator's mapping
  mqueue::ShmMapping snic_;   // the SmartNIC's mapping of the same memory
};

// Tokens the tests put on server requests: queue in the high half, sequence in the low half.
inline constexpr uint64_t request_token(uint32_t queue, uint32_t seq) {
  return (uint64_t{queue} << 32) | seq;
}
inline constexpr uint32_t token_queue(uint64_t token) {
  return static_cast<uint32_t>(token >> 32);
}
inline constexpr uint32_t token_seq(uint64_t token) {
  return static_cast<uint32_t>(token);
}

inline CpuOptions workers_options(uint32_t workers) {
  CpuOptions o;
  o.workers = workers;
  return o;
}

// Sum of one counter over every worker.
template <class Accelerator, class Field>
uint64_t sum_stat(const Accelerator& acc, Field field) {
  uint64_t n = 0;
  for (uint32_t w = 0; w < acc.workers(); ++w) {
    n += (acc.stats(w).*field).load(std::memory_order_relaxed);
  }
  return n;
}

}  // namespace caracal::accel::test
