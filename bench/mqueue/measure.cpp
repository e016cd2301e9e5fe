#include "measure.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "caracal/accel/cpu.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/platform.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"

namespace caracal::bench {
namespace {

namespace mq = caracal::mqueue;
using Clock = std::chrono::steady_clock;

// The trivial handler the accelerator runs: the reply is the request.
struct Echo {
  void operator()(const accel::Request& req, accel::Response& resp, accel::Context&) const {
    if (req.size > resp.capacity) {
      resp.set_error("echo: request larger than the response buffer");
      return;
    }
    std::memcpy(resp.data, req.data, req.size);
    resp.size = req.size;
  }
};

// A bounded spin: spin() pauses (or yields the CPU, when a poller of the other side shares it)
// and returns false once `timeout` has passed. The clock is read only every 256 spins, and the
// first read starts the count, so a wait that ends quickly costs no clock read.
class SpinWait {
 public:
  SpinWait(std::chrono::nanoseconds timeout, bool yield) : timeout_(timeout), yield_(yield) {}

  bool spin() {
    if (yield_) {
      sched_yield();
    } else {
      mq::spin_pause();
    }
    if (++spins_ % 256 != 0) return true;
    const Clock::time_point now = Clock::now();
    if (!started_) {
      started_ = true;
      start_ = now;
      return true;
    }
    return now - start_ <= timeout_;
  }
  void reset() {
    spins_ = 0;
    started_ = false;
  }

 private:
  std::chrono::nanoseconds timeout_;
  bool yield_;
  uint32_t spins_ = 0;
  bool started_ = false;
  Clock::time_point start_{};
};

uint64_t elapsed_ns(Clock::time_point from, Clock::time_point to) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
}

// A request body: a fixed byte pattern with the request's token stamped over its first and last
// 8 bytes, so an echo of a stale slot, of another request, or a torn copy is caught.
class PayloadPattern {
 public:
  explicit PayloadPattern(uint32_t size) : bytes_(size), scratch_(size) {
    for (uint32_t i = 0; i < size; ++i)
      bytes_[i] = static_cast<std::byte>((i * 131u + 17u) & 0xFF);
  }

  uint32_t size() const { return static_cast<uint32_t>(bytes_.size()); }

  void write(std::byte* dst, uint64_t token) const {
    std::memcpy(dst, bytes_.data(), bytes_.size());
    stamp(dst, token);
  }

  bool matches(const std::byte* src, uint64_t token) {
    const uint32_t n = size();
    if (n >= 2 * sizeof(uint64_t)) {
      uint64_t head = 0;
      uint64_t tail = 0;
      std::memcpy(&head, src, sizeof(head));
      std::memcpy(&tail, src + n - sizeof(tail), sizeof(tail));
      return head == token && tail == token &&
             std::memcmp(src + sizeof(head), bytes_.data() + sizeof(head),
                         n - 2 * sizeof(uint64_t)) == 0;
    }
    write(scratch_.data(), token);
    return std::memcmp(src, scratch_.data(), n) == 0;
  }

 private:
  void stamp(std::byte* dst, uint64_t token) const {
    const uint32_t n = size();
    const uint32_t k = n < sizeof(token) ? n : static_cast<uint32_t>(sizeof(token));
    std::memcpy(dst, &token, k);
    std::memcpy(dst + n - k, &token, k);
  }

  std::vector<std::byte> bytes_;
  std::vector<std::byte> scratch_;
};

// Checks one reply against the request it answers; empty when it is right, else what is wrong.
std::string check_reply(const mq::Entry& e, uint64_t token, PayloadPattern& pattern) {
  if ((e.flags & mq::kSlotError) != 0) {
    return "reply is an error: " +
           std::string(reinterpret_cast<const char*>(e.payload), std::min<uint32_t>(e.length, 200));
  }
  if (e.flags != 0) return "reply has flags " + std::to_string(e.flags) + ", expected none";
  if (e.token != token) {
    return "reply token " + std::to_string(e.token) + ", expected " + std::to_string(token) +
           " (a reply was lost or reordered)";
  }
  if (e.length != pattern.size()) {
    return "reply of " + std::to_string(e.length) + " bytes to a request of " +
           std::to_string(pattern.size());
  }
  if (!pattern.matches(e.payload, token)) return "reply bytes differ from the request";
  return {};
}

// Leaks a mapping on purpose: an accelerator thread that would not stop may still poll it, and
// the program is about to exit with an error anyway.
void keep_mapped(mq::ShmMapping&& mapping) {
  new mq::ShmMapping(std::move(mapping));
}

Status failure(const std::string& what) {
  return Status(StatusCode::kInternal, what);
}

// The accelerator side of a measurement and the SmartNIC's handle on its region.
struct AccelSide {
  mq::ShmMapping agent_mapping;  // the agent's mapping (inherited by the child in process mode)
  mq::ShmMapping snic_mapping;   // the SmartNIC's own mapping of the same memfd
  std::unique_ptr<mq::ShmTransport> transport;
  mq::RemoteRegion<mq::ShmTransport> remote;
  Peer peer;
  std::chrono::milliseconds timeout{};
  bool stopped = false;

  AccelSide() = default;
  AccelSide(const AccelSide&) = delete;
  AccelSide& operator=(const AccelSide&) = delete;
  // On an early return the accelerator is still polling: raise the stop word (through the
  // agent's mapping, which exists even when attaching failed) and wait, bounded, for it before
  // `peer` is destroyed, which kills a child that is still there.
  ~AccelSide() {
    if (!stopped && agent_mapping.data() != nullptr) {
      mq::RegionView(agent_mapping.data()).request_stop();
      (void)peer.wait(timeout);
    }
    if (peer.abandoned()) {
      keep_mapped(std::move(snic_mapping));
      keep_mapped(std::move(agent_mapping));
    }
  }

  // Raises the stop word and collects the accelerator's report.
  Result<PeerReport> finish() {
    remote.request_stop();
    stopped = true;
    Result<PeerReport> r = peer.wait(timeout);
    if (!r.ok()) return r;
    const PeerReport& p = r.value();
    if (p.ok == 0) return failure(std::string("accelerator failed: ") + p.error);
    if (p.handler_errors != 0 || p.corrupt_entries != 0) {
      return failure("accelerator counted " + std::to_string(p.handler_errors) +
                     " handler errors and " + std::to_string(p.corrupt_entries) +
                     " corrupt RX entries");
    }
    return r;
  }

  Status timed_out(const std::string& what) {
    return Status(StatusCode::kUnavailable,
                  what + " within " + std::to_string(timeout.count()) + " ms; " + peer.describe());
  }
};

uint64_t next_epoch() {
  static uint64_t epoch = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return ++epoch;
}

// Creates a region, starts CpuAccelerator<Echo> on it on the far side, and attaches the
// SmartNIC side to a second mapping of the memfd.
Result<std::unique_ptr<AccelSide>> launch_accelerator(const BenchSetup& setup,
                                                      const mq::RegionGeometry& geometry,
                                                      uint32_t workers) {
  auto side = std::make_unique<AccelSide>();
  side->timeout = setup.timeout;
  Result<mq::ShmMapping> region = mq::create_shm_region(geometry, next_epoch(), "caracal-bench");
  if (!region.ok()) return region.status();
  side->agent_mapping = std::move(region.value());

  accel::CpuOptions options;
  options.workers = workers;
  options.cpus = setup.worker_cpus;
  options.burst = setup.accel_burst;
  options.idle_rounds_before_yield = setup.idle_yield_rounds;
  std::byte* base = side->agent_mapping.data();
  Result<Peer> peer = Peer::start(setup.mode, [base, options] {
    PeerReport report;
    accel::CpuAccelerator<Echo> accelerator(mq::RegionView(base), Echo{}, options);
    if (Status s = accelerator.start(); !s.ok()) {
      report.set_error(s.message());
      return report;
    }
    accelerator.join();  // the workers return once the SmartNIC side raises the stop word
    for (uint32_t w = 0; w < accelerator.workers(); ++w) {
      const accel::WorkerStats& s = accelerator.stats(w);
      report.requests += s.requests.load(std::memory_order_relaxed);
      report.handler_errors += s.handler_errors.load(std::memory_order_relaxed);
      report.reply_ring_full += s.reply_ring_full.load(std::memory_order_relaxed);
      report.corrupt_entries += s.corrupt_entries.load(std::memory_order_relaxed);
    }
    return report;
  });
  if (!peer.ok()) return peer.status();
  side->peer = std::move(peer.value());

  Result<mq::ShmMapping> view = mq::ShmMapping::open_fd(side->agent_mapping.fd());
  if (!view.ok()) return view.status();
  side->snic_mapping = std::move(view.value());
  side->transport =
      std::make_unique<mq::ShmTransport>(side->snic_mapping.data(), side->snic_mapping.size());
  Result<mq::RemoteRegion<mq::ShmTransport>> remote =
      mq::RemoteRegion<mq::ShmTransport>::attach(side->transport.get(), setup.timeout);
  if (!remote.ok()) return remote.status();
  side->remote = std::move(remote.value());
  return side;
}

mq::RegionGeometry region_geometry(const BenchSetup& setup, uint32_t queues,
                                   uint32_t payload_bytes) {
  mq::RegionGeometry g;
  g.server_queue_count = queues;
  g.client_queue_count = 0;
  g.slot_bytes = setup.slot_bytes;
  g.ring_capacity = setup.ring_capacity;
  // A service's largest message: at least one slot's worth, as a server would configure it.
  g.max_message_bytes = std::max(payload_bytes, setup.slot_bytes - mq::kSlotHeaderBytes);
  return g;
}

}  // namespace

Status pin_current_thread(int cpu, const std::string& who) {
  if (cpu < 0) return Status::ok_status();
  cpu_set_t set;
  CPU_ZERO(&set);
  if (cpu >= CPU_SETSIZE)
    return invalid_argument(who + ": CPU " + std::to_string(cpu) + " is out of range");
  CPU_SET(cpu, &set);
  if (const int err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); err != 0) {
    return Status(StatusCode::kInvalidArgument,
                  who + ": cannot pin to CPU " + std::to_string(cpu) + ": " + std::strerror(err));
  }
  return Status::ok_status();
}

double clock_overhead_ns() {
  std::vector<uint64_t> deltas(20000);
  for (uint64_t& d : deltas) {
    const Clock::time_point a = Clock::now();
    const Clock::time_point b = Clock::now();
    d = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
  }
  const auto middle = deltas.begin() + static_cast<std::ptrdiff_t>(deltas.size() / 2);
  std::nth_element(deltas.begin(), middle, deltas.end());
  return static_cast<double>(*middle);
}

Result<LatencyResult> measure_floor(const BenchSetup& setup, uint64_t warmup, uint64_t iterations) {
  // Three words, each on its own line: ping (written here), pong (written by the responder),
  // stop (written here at the end).
  constexpr uint64_t kPing = 0;
  constexpr uint64_t kPong = uint64_t{mq::kControlLineBytes};
  constexpr uint64_t kStop = 2 * uint64_t{mq::kControlLineBytes};
  Result<mq::ShmMapping> agent =
      mq::ShmMapping::create_memfd("caracal-bench-floor", mq::kPageBytes);
  if (!agent.ok()) return agent.status();

  std::byte* responder_base = agent->data();
  const int responder_cpu = setup.worker_cpus.empty() ? -1 : setup.worker_cpus.front();
  const bool yield = setup.snic_yields;
  const std::chrono::milliseconds timeout = setup.timeout;
  Result<Peer> peer = Peer::start(setup.mode, [=] {
    PeerReport report;
    if (Status s = pin_current_thread(responder_cpu, "floor responder"); !s.ok()) {
      report.set_error(s.message());
      return report;
    }
    uint32_t* ping = reinterpret_cast<uint32_t*>(responder_base + kPing);
    uint32_t* pong = reinterpret_cast<uint32_t*>(responder_base + kPong);
    uint32_t* stop = reinterpret_cast<uint32_t*>(responder_base + kStop);
    SpinWait wait(timeout, yield);
    for (uint32_t expect = 1;; ++expect) {
      wait.reset();
      // Pairs with the store_release of ping below (the SmartNIC side's).
      while (mq::load_acquire(ping) != expect) {
        if (mq::load_relaxed(stop) != 0) return report;
        if (!wait.spin()) {
          report.set_error("no ping " + std::to_string(expect) + " within " +
                           std::to_string(timeout.count()) + " ms");
          return report;
        }
      }
      mq::store_release(pong, expect);  // pairs with the load_acquire of pong below
      ++report.requests;
    }
  });
  if (!peer.ok()) return peer.status();

  Result<mq::ShmMapping> view = mq::ShmMapping::open_fd(agent->fd());
  if (!view.ok()) return view.status();
  uint32_t* ping = reinterpret_cast<uint32_t*>(view->data() + kPing);
  uint32_t* pong = reinterpret_cast<uint32_t*>(view->data() + kPong);
  uint32_t* stop = reinterpret_cast<uint32_t*>(view->data() + kStop);

  std::vector<uint64_t> samples(iterations);
  SpinWait wait(timeout, yield);
  const uint64_t total = warmup + iterations;
  Status error;
  for (uint64_t i = 0; i < total && error.ok(); ++i) {
    const uint32_t value = static_cast<uint32_t>(i + 1);
    wait.reset();
    const Clock::time_point t0 = Clock::now();
    mq::store_release(ping, value);  // pairs with the responder's load_acquire of ping
    // Pairs with the responder's store_release of pong.
    while (mq::load_acquire(pong) != value) {
      if (!wait.spin()) {
        error = Status(StatusCode::kUnavailable, "floor: no pong " + std::to_string(value) +
                                                     " within " + std::to_string(timeout.count()) +
                                                     " ms; " + peer->describe());
        break;
      }
    }
    const Clock::time_point t1 = Clock::now();
    if (i >= warmup) {
      samples[i - warmup] = elapsed_ns(t0, t1);
    }
  }
  mq::store_release(stop, 1);
  Result<PeerReport> report = peer->wait(timeout);
  if (peer->abandoned()) {
    keep_mapped(std::move(view.value()));
    keep_mapped(std::move(agent.value()));
  }
  if (!error.ok()) return error;
  if (!report.ok()) return report.status();
  if (report->ok == 0) return failure(std::string("floor responder failed: ") + report->error);
  if (report->requests != total) {
    return failure("floor responder answered " + std::to_string(report->requests) + " pings of " +
                   std::to_string(total));
  }
  LatencyResult r;
  r.payload_bytes = sizeof(uint32_t);
  r.summary = summarize(samples);
  r.peer = report.value();
  return r;
}

Result<LatencyResult> measure_round_trip(const BenchSetup& setup, uint32_t payload_bytes,
                                         uint64_t warmup, uint64_t iterations) {
  Result<std::unique_ptr<AccelSide>> launched =
      launch_accelerator(setup, region_geometry(setup, 1, payload_bytes), 1);
  if (!launched.ok()) return launched.status();
  AccelSide& side = *launched.value();
  mq::RemoteRegion<mq::ShmTransport>& remote = side.remote;
  mq::RemoteRingProducer<mq::ShmTransport>& rx = remote.rx(0);
  mq::RemoteRingConsumer<mq::ShmTransport>& tx = remote.tx(0);

  PayloadPattern pattern(payload_bytes);
  std::vector<uint64_t> samples(iterations);
  SpinWait wait(setup.timeout, setup.snic_yields);
  const uint64_t total = warmup + iterations;
  for (uint64_t i = 0; i < total; ++i) {
    const uint64_t token = i + 1;
    wait.reset();
    const Clock::time_point t0 = Clock::now();
    std::byte* request = rx.reserve(payload_bytes);
    // With one request in flight there is room unless the accelerator has not yet given the
    // last one's slots back.
    while (request == nullptr) {
      if (!wait.spin()) return side.timed_out("round trip: no RX credits");
      request = rx.reserve(payload_bytes);
    }
    pattern.write(request, token);
    rx.commit(payload_bytes, token);
    rx.publish();
    mq::Entry reply;
    for (;;) {
      remote.fetch_tx_tails();
      remote.deliver_tx_tails();
      const mq::PollResult r = tx.next(reply);
      if (r == mq::PollResult::kReady) break;
      if (r == mq::PollResult::kCorrupt) {
        return failure(std::string("round trip: corrupt TX entry: ") +
                       mq::entry_check_name(tx.last_check()));
      }
      if (!wait.spin()) {
        return side.timed_out("round trip: no reply to request " + std::to_string(token));
      }
    }
    const Clock::time_point t1 = Clock::now();
    if (std::string wrong = check_reply(reply, token, pattern); !wrong.empty()) {
      return failure("round trip, request " + std::to_string(token) + ": " + wrong);
    }
    tx.release();
    tx.publish();
    if (i >= warmup) samples[i - warmup] = elapsed_ns(t0, t1);
  }
  Result<PeerReport> report = side.finish();
  if (!report.ok()) return report.status();
  if (report->requests != total) {
    return failure("round trip: the accelerator served " + std::to_string(report->requests) +
                   " requests of " + std::to_string(total));
  }
  LatencyResult r;
  r.payload_bytes = payload_bytes;
  r.summary = summarize(samples);
  r.peer = report.value();
  return r;
}

Result<ThroughputRun> measure_throughput(const BenchSetup& setup, const ThroughputParams& params) {
  const uint32_t queues = params.queues;
  Result<std::unique_ptr<AccelSide>> launched = launch_accelerator(
      setup, region_geometry(setup, queues, params.payload_bytes), params.workers);
  if (!launched.ok()) return launched.status();
  AccelSide& side = *launched.value();
  mq::RemoteRegion<mq::ShmTransport>& remote = side.remote;

  // Replies come back in request order on each queue (one worker owns a queue and serves it
  // in order), so each queue's next reply must carry its oldest unanswered token.
  struct QueueState {
    uint64_t pushed = 0;
    uint64_t answered = 0;
  };
  std::vector<QueueState> state(queues);
  const auto token_of = [](uint32_t q, uint64_t seq) { return (uint64_t{q} << 48) | seq; };

  PayloadPattern pattern(params.payload_bytes);
  const uint32_t per_fill = setup.ring_capacity;  // at most a ring's worth per queue per round
  // Running totals; the measured window is the difference of two snapshots.
  struct Counters {
    uint64_t answered = 0;
    uint64_t rounds = 0;
    uint64_t rx_publishes = 0;
    Clock::duration busy{};  // time in rounds that pushed or received something
  };
  Counters total;
  Counters window;
  uint64_t pushed = 0;

  bool filling = true;
  bool measuring = false;
  const Clock::time_point begin = Clock::now();
  Clock::time_point window_start = begin;
  Clock::time_point window_end = begin;
  Clock::time_point last_progress = begin;
  Clock::time_point round_start = begin;
  mq::Entry reply;
  for (;;) {
    bool progress = false;
    if (filling) {
      for (uint32_t q = 0; q < queues; ++q) {
        mq::RemoteRingProducer<mq::ShmTransport>& rx = remote.rx(q);
        uint32_t in_batch = 0;
        uint32_t n = 0;
        for (; n < per_fill; ++n) {
          std::byte* request = rx.reserve(params.payload_bytes);
          if (request == nullptr) break;
          const uint64_t token = token_of(q, ++state[q].pushed);
          pattern.write(request, token);
          rx.commit(params.payload_bytes, token);
          if (++in_batch == params.batch) {
            rx.publish();
            ++total.rx_publishes;
            in_batch = 0;
          }
        }
        if (in_batch != 0) {
          rx.publish();
          ++total.rx_publishes;
        }
        pushed += n;
        progress |= n != 0;
      }
    }
    remote.fetch_tx_tails();
    remote.deliver_tx_tails();
    for (uint32_t q = 0; q < queues; ++q) {
      mq::RemoteRingConsumer<mq::ShmTransport>& tx = remote.tx(q);
      uint64_t n = 0;
      for (;;) {
        const mq::PollResult r = tx.next(reply);
        if (r == mq::PollResult::kEmpty) break;
        if (r == mq::PollResult::kCorrupt) {
          return failure("throughput: corrupt TX entry on queue " + std::to_string(q) + ": " +
                         mq::entry_check_name(tx.last_check()));
        }
        const uint64_t token = token_of(q, state[q].answered + 1);
        if (std::string wrong = check_reply(reply, token, pattern); !wrong.empty()) {
          return failure("throughput, queue " + std::to_string(q) + ": " + wrong);
        }
        ++state[q].answered;
        ++n;
      }
      if (n != 0) {
        tx.release();
        tx.publish();
        total.answered += n;
        progress = true;
      }
    }

    const Clock::time_point now = Clock::now();
    ++total.rounds;
    if (progress) {
      total.busy += now - round_start;
      last_progress = now;
    } else if (now - last_progress > setup.timeout) {
      return side.timed_out("throughput: no progress (" + std::to_string(pushed - total.answered) +
                            " requests unanswered)");
    }
    round_start = now;
    if (!progress) {
      if (setup.snic_yields) {
        sched_yield();
      } else {
        mq::spin_pause();
      }
    }
    if (!measuring && filling && now - begin >= params.warmup) {
      measuring = true;
      window_start = now;
      window = total;
    } else if (measuring && now - window_start >= params.duration) {
      measuring = false;
      filling = false;  // from here on only drain what is in flight
      window_end = now;
      window.answered = total.answered - window.answered;
      window.rounds = total.rounds - window.rounds;
      window.rx_publishes = total.rx_publishes - window.rx_publishes;
      window.busy = total.busy - window.busy;
    }
    if (!filling && !measuring && total.answered == pushed) break;
  }

  Result<PeerReport> report = side.finish();
  if (!report.ok()) return report.status();
  if (report->requests != pushed) {
    return failure("throughput: the accelerator served " + std::to_string(report->requests) +
                   " requests, the SmartNIC side pushed " + std::to_string(pushed));
  }
  ThroughputRun run;
  run.seconds = std::chrono::duration<double>(window_end - window_start).count();
  run.messages = window.answered;
  run.msgs_per_s = run.seconds > 0 ? static_cast<double>(window.answered) / run.seconds : 0;
  run.total_messages = pushed;
  run.snic_rounds = window.rounds;
  run.snic_busy =
      run.seconds > 0 ? std::chrono::duration<double>(window.busy).count() / run.seconds : 0;
  run.rx_publishes = window.rx_publishes;
  run.peer = report.value();
  return run;
}

}  // namespace caracal::bench
