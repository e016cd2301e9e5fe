// caracal_loadgen: drives a UDP or TCP request/reply service (Caracal's snic_server, or the
// baselines under bench/baselines) and measures latency and throughput, checking every reply.
//
//   caracal_loadgen --port 7000 --proto udp --handler echo --size 64 --duration 2
//   caracal_loadgen --port 7001 --proto tcp --handler matvec --sizes 64:1,16384:1
//       --mode open --rate 50000 --connections 8 --json out.json
//
// Framing: UDP, one datagram per message; TCP, a 4-byte big-endian length, then the message
// (the server's `length_prefixed` framing with prefix_bytes 4, byte_order big).
//
// Load: `--connections` N, each with `--window` W places for requests in flight. A TCP
// connection is one socket whose replies come back in request order; a UDP "connection" is W
// connected sockets with one request in flight each, so a reply always belongs to its socket's
// request. Closed loop: a place sends its next request as soon as its reply arrives. Open loop:
// `--rate` requests per second in total, spread evenly over the connections, each sent at its
// intended time when a place is free and later (when the W places are all taken) otherwise;
// latency is measured from the intended time, so queueing in the server or here is counted.
// Latency is recorded for requests whose send (closed) or intended (open) time lies in the
// measured window [warm-up, warm-up + duration); throughput is those requests' replies over the
// window's length.
//
// A UDP request unanswered after `--timeout-ms` is lost and its place sends again; a reply
// that comes after that is counted late. Every reply is verified (workload.hpp); a wrong one is
// counted and the first few are printed. Exit status: 0 when nothing was wrong and every
// connection stayed up (with --strict, also nothing lost, late or unanswered and at least one
// reply measured; with --reconnect-ms, broken connections are counted, not failures); 1
// otherwise; 2 for a bad command line.
//
// `--error-prefix TEXT`: a reply that starts with TEXT is the server's error reply (snic_server's
// `error_reply`, e.g. "ERROR {reason}"): counted as an error reply, not as wrong, and its place
// goes on; `--face-store-outage` does the same for a face reply of status store_unavailable or
// unknown_person (what the handler answers while memcached is down, or restarted and not yet
// reloaded). `--timeline-ms N`: the JSON also has the right replies and error replies of every
// N ms of the run, from its start (warm-up included), to show throughput over time across an
// event such as an agent lost mid-run, and the requests lost (UDP, by when they were sent) and
// lost with a broken connection (TCP, by when it broke). `--matvec-rounds R`: the matvec handler's
// rounds.
//
// Across faults (bench/chaos): `--client-id N` puts N in the top 8 bits of every slot id, so
// that the echo replies of clients running at once tell whose they are (a reply carrying another
// client's id is counted wrong, as such). `--reconnect-ms M` (closed loop): a TCP connection that
// fails or is closed by the server counts its requests in flight as connection_lost, not as a
// failure of the run, and connects again every M ms until it succeeds; each connection's
// sessions (connected from, until, what was sent and answered in between) are in the JSON.
// `--until-signal`: SIGINT or SIGTERM ends the run (or --duration, if it comes first): no new
// requests, those in flight get up to --timeout-ms for their replies, and the counts are
// written. Every request sent ends in exactly one of: a right reply, an error reply, a wrong
// reply, lost (UDP timeout), connection_lost (TCP) or unanswered (in flight at the end); the
// JSON's `unaccounted` is what is left (0 unless the tool itself is wrong).
//
// The client's own CPU time over the measured window is reported too (each client thread reads
// its own CPU clock at the window's start and end): a busiest thread near 1.0 core means this
// client, not the server, may be what limits a saturation point.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <signal.h>
#include <time.h>

#include "histogram.hpp"
#include "json_writer.hpp"
#include "latency.hpp"
#include "machine_info.hpp"
#include "matvec.hpp"
#include "workload.hpp"

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;
using Clock = std::chrono::steady_clock;

namespace caracal::bench {
namespace {

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string proto = "udp";
  std::string handler = "echo";
  FaceSet faces;
  std::string mode = "closed";
  uint32_t connections = 1;
  uint32_t window = 1;
  double rate = 0;
  std::string sizes = "64";
  double warmup_s = 0.5;
  double duration_s = 2;
  uint32_t threads = 1;
  uint32_t timeout_ms = 1000;
  uint64_t seed = 1;
  std::string json_path;
  std::string label;
  bool strict = false;
  bool busy_poll = false;
  uint32_t matvec_rounds = 1;
  std::string error_prefix;
  bool face_store_outage = false;  // face: store_unavailable, unknown_person are error replies
  uint32_t timeline_ms = 0;
  uint32_t client_id = 0;
  uint32_t reconnect_ms = 0;  // 0: a broken TCP connection stays broken (and fails the run)
  bool until_signal = false;
};

// Set by SIGINT or SIGTERM with --until-signal; each runner looks at it every kStopPoll.
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");
constexpr auto kStopPoll = std::chrono::milliseconds(20);

extern "C" void on_stop_signal(int) {
  g_stop_requested.store(true, std::memory_order_relaxed);
}

struct Counters {
  uint64_t sent = 0;        // requests sent, whole run
  uint64_t replies = 0;     // right replies, whole run
  uint64_t measured = 0;    // right replies of requests in the measured window
  uint64_t wrong = 0;       // replies that failed verification (wrong_* says which kind)
  uint64_t late = 0;        // UDP replies after their request was given up
  uint64_t lost = 0;        // UDP requests unanswered within the timeout
  uint64_t unanswered = 0;  // requests still in flight when the run ended
  uint64_t send_errors = 0;
  uint64_t connection_errors = 0;
  uint64_t error_replies = 0;  // error replies (--error-prefix) that answered a request in flight
  // Error replies that came for a request already given up (UDP, after its timeout).
  uint64_t late_error_replies = 0;
  uint64_t wrong_answered = 0;  // wrong replies that ended a request in flight
  uint64_t wrong_other_client = 0;
  uint64_t wrong_other_slot = 0;
  uint64_t wrong_other_request = 0;
  uint64_t wrong_corrupt = 0;
  uint64_t wrong_unsolicited = 0;  // TCP: a reply with no request in flight
  uint64_t connection_lost = 0;    // TCP: requests in flight on a connection that broke
  uint64_t receive_errors = 0;     // UDP: errors a receive reported (ICMP port unreachable)
  uint64_t reconnects = 0;         // TCP: connections made again after a break
  uint64_t connect_failures = 0;   // TCP: connects that failed (and were tried again)

  void add(const Counters& o);
  // Requests sent whose end is none of the ends a request can have: 0 unless the counting
  // itself is wrong.
  int64_t unaccounted() const {
    return static_cast<int64_t>(sent) -
           static_cast<int64_t>(replies + error_replies + wrong_answered + lost + connection_lost +
                                unanswered);
  }
};

// Every count with its JSON key, in the report's order; add() merges by this list too.
constexpr std::pair<const char*, uint64_t Counters::*> kCounts[] = {
    {"sent", &Counters::sent},
    {"replies", &Counters::replies},
    {"measured", &Counters::measured},
    {"wrong", &Counters::wrong},
    {"lost", &Counters::lost},
    {"late", &Counters::late},
    {"unanswered", &Counters::unanswered},
    {"send_errors", &Counters::send_errors},
    {"connection_errors", &Counters::connection_errors},
    {"error_replies", &Counters::error_replies},
    {"late_error_replies", &Counters::late_error_replies},
    {"wrong_answered", &Counters::wrong_answered},
    {"wrong_other_client", &Counters::wrong_other_client},
    {"wrong_other_slot", &Counters::wrong_other_slot},
    {"wrong_other_request", &Counters::wrong_other_request},
    {"wrong_corrupt", &Counters::wrong_corrupt},
    {"wrong_unsolicited", &Counters::wrong_unsolicited},
    {"connection_lost", &Counters::connection_lost},
    {"receive_errors", &Counters::receive_errors},
    {"reconnects", &Counters::reconnects},
    {"connect_failures", &Counters::connect_failures},
};

static_assert(std::size(kCounts) * sizeof(uint64_t) == sizeof(Counters),
              "every count is in kCounts");

void Counters::add(const Counters& o) {
  for (const auto& [name, count] : kCounts)
    this->*count += o.*count;
}

// Times shared, read-only, by every thread.
struct Plan {
  const Options* opt = nullptr;
  const Workload* workload = nullptr;
  bool open = false;
  Clock::time_point start, measure_begin, measure_end;
  Clock::duration timeout{};
};

// One TCP connection's time between a connect and its break (or the run's end), with
// --reconnect-ms: what was sent on it and how those requests ended.
struct Session {
  uint32_t connection = 0;
  double start_unix_s = 0;
  double end_unix_s = 0;
  std::string end;  // "closed by the server", "read: ...", "run end"
  uint64_t sent = 0;
  uint64_t replies = 0;
  uint64_t error_replies = 0;
  uint64_t wrong = 0;
  uint64_t connection_lost = 0;
  uint64_t unanswered = 0;
};

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What one thread measures; merged after the threads are joined.
struct ThreadState {
  LatencyHistogram hist;
  Counters c;
  std::vector<std::string> errors;  // the first few, with where
  uint64_t in_flight = 0;
  // --timeline-ms: per interval since the run's start, right replies and error replies (when
  // they came), UDP requests lost (when they were sent) and TCP requests lost with their
  // connection (when it broke).
  std::vector<uint64_t> timeline_replies, timeline_errors, timeline_lost, timeline_connection_lost;
  std::vector<Session> sessions;
  // Error replies that answered a request in flight, by their reason (the text after
  // --error-prefix up to its first ':', at most kReasonBytes): "no agent serves service echo",
  // "agent echo-1 lost", ...
  std::map<std::string, uint64_t> error_reasons;
  static constexpr size_t kReasonBytes = 64;

  void error(std::string text) {
    if (errors.size() < 5) errors.push_back(std::move(text));
  }
};

class Runner;

// How often a UDP connection looks for requests past the timeout.
Clock::duration sweep_period(Clock::duration timeout) {
  return std::max<Clock::duration>(timeout / 4, std::chrono::milliseconds(1));
}

// One connection's places and schedule; the socket side is in the subclasses.
class Conn {
 public:
  Conn(Runner& runner, uint32_t index, uint32_t first_slot_id);
  virtual ~Conn() = default;
  virtual void start();
  virtual void close() = 0;

 protected:
  struct Place {
    Workload::Slot w;
    bool busy = false;
    bool measured = false;
    Clock::time_point origin;  // latency is measured from here (intended time in open loop)
    Clock::time_point sent;    // when it went out (for the UDP timeout)
  };
  enum class Answer { kRight, kError, kWrong };

  virtual void transmit(uint32_t place) = 0;
  void issue(uint32_t place, Clock::time_point origin);
  // The reply of `place`'s request arrived: right, an error reply, or wrong.
  virtual void complete(uint32_t place, Answer answer);
  // Counts an event in its interval of a timeline (see ThreadState).
  void note_in_timeline(std::vector<uint64_t>& series, Clock::time_point at);
  // The place's request is given up (lost, or the connection failed).
  void give_up(uint32_t place);
  void refill(uint32_t place);
  void pump();
  void on_reply(uint32_t place, const std::byte* data, uint32_t size);
  // An error reply (`reason`: its cause, for the counts; `text`: for the log). It answers the
  // request in flight; a place whose request was given up (UDP) has none, and the error was
  // that request's.
  void on_error_reply(uint32_t place, std::string_view reason, const std::string& text);
  void count_wrong(WrongKind kind, const std::string& why);
  std::string where() const;

  Runner& runner_;
  const Plan& plan_;
  ThreadState& st_;
  uint32_t index_;
  std::vector<Place> places_;
  std::vector<uint32_t> free_;
  asio::steady_timer pace_;
  Clock::time_point next_intended_;
  Clock::duration interval_{};
  bool pace_armed_ = false;
  bool closed_ = false;
};

class Runner {
 public:
  Runner(const Plan& plan)
      : plan(plan), stop_timer(io), begin_sample(io), end_sample(io), stop_poll(io) {}
  void run() {
    for (auto& c : conns)
      asio::post(io, [c = c.get()] { c->start(); });
    stop_timer.expires_at(plan.measure_end + plan.timeout);
    stop_timer.async_wait([this](boost::system::error_code ec) {
      if (!ec) finish();
    });
    begin_sample.expires_at(plan.measure_begin);
    begin_sample.async_wait([this](boost::system::error_code ec) {
      if (!ec) cpu_at_begin = thread_cpu_seconds();
    });
    end_sample.expires_at(plan.measure_end);
    end_sample.async_wait([this](boost::system::error_code ec) {
      if (!ec) cpu_at_end = thread_cpu_seconds();
    });
    if (plan.opt->until_signal) watch_for_stop();
    if (plan.opt->busy_poll) {
      // Never sleeps in the kernel between replies: a reply is taken as soon as it arrives,
      // without the wake-up of a thread blocked in epoll_wait (on a virtual machine, the wake-up
      // of an idle vCPU). Costs one core per thread.
      while (!io.stopped()) {
        io.poll();
      }
    } else {
      io.run();
    }
  }
  // Whether requests are still to be sent: before the window's end and no stop asked for.
  bool sending(Clock::time_point now) const { return now < plan.measure_end && !stopping; }
  // Ends the run on this thread: whatever is still in flight is unanswered.
  void finish() {
    if (finished) return;
    finished = true;
    stop_timer.cancel();
    stop_poll.cancel();
    // The last reply can come in the same instant the window ends, before the end's sample.
    if (cpu_at_end < 0 && Clock::now() >= plan.measure_end) cpu_at_end = thread_cpu_seconds();
    begin_sample.cancel();
    end_sample.cancel();
    st.c.unanswered += st.in_flight;
    st.in_flight = 0;
    for (auto& c : conns)
      c->close();
  }
  void maybe_done() {
    if (st.in_flight == 0 && !sending(Clock::now())) finish();
  }

  const Plan& plan;
  asio::io_context io;
  ThreadState st;
  std::vector<std::unique_ptr<Conn>> conns;
  asio::steady_timer stop_timer;
  // This thread's CPU clock at the measured window's start and end (negative: not read).
  asio::steady_timer begin_sample;
  asio::steady_timer end_sample;
  asio::steady_timer stop_poll;  // --until-signal: looks at g_stop_requested
  double cpu_at_begin = -1;
  double cpu_at_end = -1;
  bool stopping = false;           // a stop signal came: no new requests
  Clock::time_point stopped_at{};  // when this thread saw it

  static double thread_cpu_seconds() {
    timespec ts{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  bool finished = false;

 private:
  // --until-signal: once the signal is seen, no place sends again; the requests in flight get
  // the timeout for their replies, as at the window's end.
  void watch_for_stop() {
    stop_poll.expires_after(kStopPoll);
    stop_poll.async_wait([this](boost::system::error_code ec) {
      if (ec || finished) return;
      if (!g_stop_requested.load(std::memory_order_relaxed)) return watch_for_stop();
      const auto now = Clock::now();
      stopping = true;
      stopped_at = now;
      if (cpu_at_end < 0 && now >= plan.measure_begin) cpu_at_end = thread_cpu_seconds();
      end_sample.cancel();
      if (now < plan.measure_end) {
        // One UDP sweep past the timeout, so that a request sent just before the stop is counted
        // lost (or answered), not unanswered.
        stop_timer.expires_at(now + plan.timeout + sweep_period(plan.timeout) +
                              std::chrono::milliseconds(10));
        stop_timer.async_wait([this](boost::system::error_code e) {
          if (!e) finish();
        });
      }
      maybe_done();
    });
  }
};

Conn::Conn(Runner& runner, uint32_t index, uint32_t first_slot_id)
    : runner_(runner), plan_(runner.plan), st_(runner.st), index_(index), pace_(runner.io) {
  const uint32_t w = plan_.opt->window;
  for (uint32_t i = 0; i < w; ++i) {
    Place p;
    p.w = plan_.workload->make_slot(first_slot_id + i);
    places_.push_back(std::move(p));
  }
  if (plan_.open) {
    const double per_conn = plan_.opt->rate / plan_.opt->connections;
    interval_ =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / per_conn));
  }
}

std::string Conn::where() const {
  return "connection " + std::to_string(index_);
}

void Conn::start() {
  if (plan_.open) {
    // Connections start staggered across one interval, so their sends interleave.
    next_intended_ = plan_.start + interval_ * index_ / plan_.opt->connections;
    for (uint32_t i = places_.size(); i > 0; --i)
      free_.push_back(i - 1);
    pump();
  } else {
    const auto now = Clock::now();
    for (uint32_t i = 0; i < places_.size(); ++i)
      issue(i, now);
  }
}

void Conn::issue(uint32_t i, Clock::time_point origin) {
  Place& p = places_[i];
  plan_.workload->next_request(p.w);
  p.busy = true;
  p.origin = origin;
  p.measured = origin >= plan_.measure_begin && origin < plan_.measure_end;
  p.sent = Clock::now();
  ++st_.c.sent;
  ++st_.in_flight;
  transmit(i);
}

void Conn::note_in_timeline(std::vector<uint64_t>& series, Clock::time_point at) {
  const uint32_t ms = plan_.opt->timeline_ms;
  if (ms == 0) return;
  const auto since = at - plan_.start;
  if (since < Clock::duration::zero()) return;
  const auto k = static_cast<size_t>(since / std::chrono::milliseconds(ms));
  if (series.size() <= k) series.resize(k + 1, 0);
  ++series[k];
}

void Conn::complete(uint32_t i, Answer answer) {
  Place& p = places_[i];
  const auto now = Clock::now();
  switch (answer) {
    case Answer::kRight:
      note_in_timeline(st_.timeline_replies, now);
      ++st_.c.replies;
      if (p.measured) {
        ++st_.c.measured;
        st_.hist.record(static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - p.origin).count()));
      }
      break;
    case Answer::kError:
      note_in_timeline(st_.timeline_errors, now);
      ++st_.c.error_replies;
      break;
    case Answer::kWrong:
      ++st_.c.wrong_answered;
      break;
  }
  p.busy = false;
  --st_.in_flight;
  refill(i);
}

void Conn::give_up(uint32_t i) {
  places_[i].busy = false;
  --st_.in_flight;
}

void Conn::refill(uint32_t i) {
  if (closed_) return;
  const auto now = Clock::now();
  if (!runner_.sending(now)) {
    runner_.maybe_done();
    return;
  }
  if (!plan_.open) {
    issue(i, now);
    return;
  }
  free_.push_back(i);
  pump();
}

void Conn::pump() {
  if (closed_) return;
  const auto now = Clock::now();
  while (!free_.empty() && next_intended_ <= now && next_intended_ < plan_.measure_end &&
         !runner_.stopping) {
    const uint32_t i = free_.back();
    free_.pop_back();
    issue(i, next_intended_);
    next_intended_ += interval_;
  }
  if (next_intended_ >= plan_.measure_end || runner_.stopping) {
    // Nothing more to send. The last reply can come before the window ends, when the run is
    // not done yet; then the window's end is when to look again (otherwise only the stop
    // timer, the timeout after it, would end a run with nothing in flight).
    if (!runner_.stopping && now < plan_.measure_end && !pace_armed_) {
      pace_armed_ = true;
      pace_.expires_at(plan_.measure_end);
      pace_.async_wait([this](boost::system::error_code ec) {
        pace_armed_ = false;
        if (!ec && !closed_) runner_.maybe_done();
      });
    }
    runner_.maybe_done();
    return;
  }
  // Wait for the next intended time; with every place taken, a reply calls pump() instead.
  if (!free_.empty() && !pace_armed_) {
    pace_armed_ = true;
    pace_.expires_at(next_intended_);
    pace_.async_wait([this](boost::system::error_code ec) {
      pace_armed_ = false;
      if (!ec) pump();
    });
  }
}

void Conn::count_wrong(WrongKind kind, const std::string& why) {
  ++st_.c.wrong;
  switch (kind) {
    case WrongKind::kCorrupt:
      ++st_.c.wrong_corrupt;
      break;
    case WrongKind::kOtherClient:
      ++st_.c.wrong_other_client;
      break;
    case WrongKind::kOtherSlot:
      ++st_.c.wrong_other_slot;
      break;
    case WrongKind::kOtherRequest:
      ++st_.c.wrong_other_request;
      break;
  }
  st_.error(where() + ": " + why);
}

void Conn::on_error_reply(uint32_t i, std::string_view reason, const std::string& text) {
  if (st_.errors.size() < 5) st_.error(where() + ": error reply: " + text);
  if (places_[i].busy) {
    ++st_.error_reasons[std::string(reason.substr(0, ThreadState::kReasonBytes))];
    complete(i, Answer::kError);
  } else {
    ++st_.c.late_error_replies;
  }
}

void Conn::on_reply(uint32_t i, const std::byte* data, uint32_t size) {
  Place& p = places_[i];
  const std::string& prefix = plan_.opt->error_prefix;
  if (!prefix.empty() && size >= prefix.size() &&
      std::memcmp(data, prefix.data(), prefix.size()) == 0) {
    // The server's error reply.
    std::string_view reason(reinterpret_cast<const char*>(data) + prefix.size(),
                            size - prefix.size());
    on_error_reply(i, reason.substr(0, reason.find(':')),
                   std::string(reinterpret_cast<const char*>(data), std::min<uint32_t>(size, 120)));
    return;
  }
  if (plan_.opt->face_store_outage) {
    using examples::face::ReplyStatus;
    const examples::face::Decoded d = examples::face::decode_reply(data, size);
    if (d.error.empty() && !d.reason.empty() &&
        (d.status == ReplyStatus::kStoreUnavailable || d.status == ReplyStatus::kUnknownPerson)) {
      on_error_reply(i, d.reason,
                     std::string(examples::face::status_name(d.status)) + ": " + d.reason);
      return;
    }
  }
  std::string why;
  WrongKind kind = WrongKind::kCorrupt;
  const Verdict v = plan_.workload->verify(p.w, data, size, why, &kind);
  if (!p.busy) {
    // Its request was given up; a reply now is late (or wrong).
    if (v == Verdict::kWrong) {
      count_wrong(kind, why);
    } else {
      ++st_.c.late;
    }
    return;
  }
  switch (v) {
    case Verdict::kOk:
      complete(i, Answer::kRight);
      break;
    case Verdict::kLate:
      ++st_.c.late;
      break;
    case Verdict::kWrong:
      count_wrong(kind, why);
      complete(i, Answer::kWrong);
      break;
  }
}

// TCP: one socket; replies come back in request order. With --reconnect-ms a break ends the
// connection's session, its requests in flight counted connection_lost, and a timer connects it
// again; every handler carries the session it was started in (gen_) and one of an older
// session does nothing but hand the write buffer back.
class TcpConn final : public Conn {
 public:
  TcpConn(Runner& runner, uint32_t index, uint32_t first_slot, const tcp::endpoint& server)
      : Conn(runner, index, first_slot),
        socket_(runner.io),
        server_(server),
        reconnect_(plan_.opt->reconnect_ms != 0),
        retry_(runner.io) {
    if (reconnect_) return;  // connects in start(), and again after every break
    socket_.connect(server);
    socket_.set_option(tcp::no_delay(true));
    connected_ = true;
    read_header();
  }
  void start() override {
    if (reconnect_) {
      connect();
    } else {
      Conn::start();
    }
  }
  void close() override {
    if (closed_) return;
    closed_ = true;
    pace_.cancel();
    retry_.cancel();
    if (reconnect_ && connected_) end_session("run end", false);
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

 private:
  void connect() {
    boost::system::error_code ignored;
    socket_.close(ignored);
    ++gen_;
    socket_.async_connect(server_, [this, g = gen_](boost::system::error_code ec) {
      if (g != gen_ || closed_) return;
      if (ec) {
        ++st_.c.connect_failures;
        return retry_later();
      }
      if (!runner_.sending(Clock::now())) {
        runner_.maybe_done();
        return;
      }
      boost::system::error_code ignored_ec;
      socket_.set_option(tcp::no_delay(true), ignored_ec);
      connected_ = true;
      write_broken_ = false;
      if (sessions_ > 0) ++st_.c.reconnects;
      ++sessions_;
      session_ = Session{};
      session_.connection = index_;
      session_.start_unix_s = unix_now();
      read_header();
      const auto now = Clock::now();
      for (uint32_t i = 0; i < places_.size(); ++i) {
        if (!places_[i].busy && connected_) issue(i, now);
      }
    });
  }
  void retry_later() {
    retry_.expires_after(std::chrono::milliseconds(plan_.opt->reconnect_ms));
    retry_.async_wait([this](boost::system::error_code ec) {
      if (ec || closed_) return;
      if (!runner_.sending(Clock::now())) {
        runner_.maybe_done();
        return;
      }
      connect();
    });
  }

  void transmit(uint32_t i) override {
    const auto& bytes = places_[i].w.bytes;
    const uint32_t n = static_cast<uint32_t>(bytes.size());
    const uint8_t prefix[4] = {static_cast<uint8_t>(n >> 24), static_cast<uint8_t>(n >> 16),
                               static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)};
    const auto* raw = reinterpret_cast<const uint8_t*>(bytes.data());
    pending_.insert(pending_.end(), prefix, prefix + 4);
    pending_.insert(pending_.end(), raw, raw + n);
    fifo_.push_back(i);
    ++session_.sent;
    if (!writing_) write();
  }
  void complete(uint32_t i, Answer answer) override {
    switch (answer) {
      case Answer::kRight:
        ++session_.replies;
        break;
      case Answer::kError:
        ++session_.error_replies;
        break;
      case Answer::kWrong:
        ++session_.wrong;
        break;
    }
    Conn::complete(i, answer);
  }
  void write() {
    if (write_broken_) return;  // what is queued now is lost with the session
    writing_ = true;
    writing_buf_.swap(pending_);
    pending_.clear();
    asio::async_write(socket_, asio::buffer(writing_buf_),
                      [this, g = gen_](boost::system::error_code ec, size_t) {
                        writing_ = false;
                        if (g != gen_) {
                          // A write of a broken session: requests of the new one may wait.
                          if (connected_ && !closed_ && !pending_.empty()) write();
                          return;
                        }
                        if (ec) return write_failed("write: " + ec.message());
                        if (!pending_.empty()) write();
                      });
  }
  // A write failed: the server closed or reset the connection. Replies it sent before that may
  // still be in this socket's receive buffer; with --reconnect-ms they are read until the read
  // side ends the session (or the timeout does), so that they count as answered.
  void write_failed(const std::string& what) {
    if (!reconnect_) return fail(what);
    write_broken_ = true;
    retry_.expires_after(plan_.timeout);
    retry_.async_wait([this, g = gen_, what](boost::system::error_code ec) {
      if (ec || g != gen_ || closed_) return;
      fail(what);
    });
  }
  void read_header() {
    asio::async_read(
        socket_, asio::buffer(header_), [this, g = gen_](boost::system::error_code ec, size_t) {
          if (g != gen_) return;
          if (ec) return fail(read_error(ec));
          const uint32_t n = (uint32_t{header_[0]} << 24) | (uint32_t{header_[1]} << 16) |
                             (uint32_t{header_[2]} << 8) | uint32_t{header_[3]};
          if (n > (64u << 20)) {
            return fail("reply length " + std::to_string(n) + " is not plausible");
          }
          body_.resize(n);
          read_body();
        });
  }
  void read_body() {
    asio::async_read(socket_, asio::buffer(body_),
                     [this, g = gen_](boost::system::error_code ec, size_t) {
                       if (g != gen_) return;
                       if (ec) return fail(read_error(ec));
                       if (fifo_.empty()) {
                         ++st_.c.wrong;
                         ++st_.c.wrong_unsolicited;
                         st_.error(where() + ": a reply with no request in flight");
                       } else {
                         const uint32_t i = fifo_.front();
                         fifo_.pop_front();
                         on_reply(i, body_.data(), static_cast<uint32_t>(body_.size()));
                       }
                       if (!closed_ && g == gen_) read_header();
                     });
  }
  static std::string read_error(const boost::system::error_code& ec) {
    if (ec == asio::error::eof) return "closed by the server";
    return "read: " + ec.message();
  }
  // The session ends: its requests in flight are lost with it (or, at the run's end, counted
  // unanswered by the runner).
  void end_session(const std::string& why, bool lost) {
    session_.end_unix_s = unix_now();
    session_.end = why;
    if (lost) {
      session_.connection_lost = fifo_.size();
    } else {
      session_.unanswered = fifo_.size();
    }
    st_.sessions.push_back(session_);
    connected_ = false;
  }
  void fail(const std::string& what) {
    if (closed_) return;                    // the run's end closed it
    if (reconnect_ && !connected_) return;  // this session's break is counted already
    ++st_.c.connection_errors;
    st_.error(where() + ": " + what);
    if (reconnect_) {
      end_session(what, true);
      const auto now = Clock::now();
      for (const uint32_t i : fifo_) {
        ++st_.c.connection_lost;
        note_in_timeline(st_.timeline_connection_lost, now);
        give_up(i);
      }
      fifo_.clear();
      pending_.clear();
      ++gen_;  // handlers of the broken session now do nothing
      boost::system::error_code ignored;
      socket_.close(ignored);
      if (runner_.sending(now)) retry_later();
      runner_.maybe_done();
      return;
    }
    closed_ = true;
    for (const uint32_t i : fifo_) {
      ++st_.c.connection_lost;
      give_up(i);
    }
    fifo_.clear();
    boost::system::error_code ignored;
    socket_.close(ignored);
    runner_.maybe_done();
  }

  tcp::socket socket_;
  tcp::endpoint server_;
  bool reconnect_;
  asio::steady_timer retry_;
  uint64_t gen_ = 0;  // the session handlers belong to (see the class comment)
  bool connected_ = false;
  bool write_broken_ = false;  // a write of this session failed; nothing more is written
  uint64_t sessions_ = 0;
  Session session_;
  std::vector<uint8_t> pending_, writing_buf_;
  bool writing_ = false;
  std::deque<uint32_t> fifo_;
  std::array<uint8_t, 4> header_{};
  std::vector<std::byte> body_;
};

// UDP: one connected socket per place.
class UdpConn final : public Conn {
 public:
  UdpConn(Runner& runner, uint32_t index, uint32_t first_slot, const udp::endpoint& server)
      : Conn(runner, index, first_slot), sweep_(runner.io) {
    for (uint32_t i = 0; i < places_.size(); ++i) {
      auto s = std::make_unique<Sock>(runner.io);
      s->socket.open(server.protocol());
      s->socket.set_option(asio::socket_base::receive_buffer_size(1 << 20));
      s->socket.connect(server);
      s->buf.resize(65536);
      socks_.push_back(std::move(s));
      receive(i);
    }
    arm_sweep();
  }
  void close() override {
    closed_ = true;
    pace_.cancel();
    sweep_.cancel();
    boost::system::error_code ignored;
    for (auto& s : socks_)
      s->socket.close(ignored);
  }

 private:
  struct Sock {
    explicit Sock(asio::io_context& io) : socket(io) {}
    udp::socket socket;
    std::vector<std::byte> buf;
  };

  void transmit(uint32_t i) override {
    boost::system::error_code ec;
    socks_[i]->socket.send(asio::buffer(places_[i].w.bytes), 0, ec);
    if (ec) {
      ++st_.c.send_errors;
      st_.error(where() + ": send: " + ec.message());
    }
    // A failed send is found by the sweep, like a lost datagram.
  }
  void receive(uint32_t i) {
    Sock& s = *socks_[i];
    s.socket.async_receive(asio::buffer(s.buf), [this, i](boost::system::error_code ec, size_t n) {
      if (closed_) return;
      if (ec) {
        // ICMP port unreachable reports itself here; keep receiving, the sweep counts the loss.
        if (ec == asio::error::operation_aborted) return;
        ++st_.c.receive_errors;
        st_.error(where() + ": receive: " + ec.message());
      } else {
        on_reply(i, socks_[i]->buf.data(), static_cast<uint32_t>(n));
      }
      if (!closed_) receive(i);
    });
  }
  void arm_sweep() {
    sweep_.expires_after(sweep_period(plan_.timeout));
    sweep_.async_wait([this](boost::system::error_code ec) {
      if (ec || closed_) return;
      const auto now = Clock::now();
      for (uint32_t i = 0; i < places_.size(); ++i) {
        if (places_[i].busy && now - places_[i].sent > plan_.timeout) {
          ++st_.c.lost;
          note_in_timeline(st_.timeline_lost, places_[i].sent);
          give_up(i);
          refill(i);
        }
      }
      if (!closed_) arm_sweep();
    });
  }

  asio::steady_timer sweep_;
  std::vector<std::unique_ptr<Sock>> socks_;
};

std::string two_decimals(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

// The client threads' CPU use over the measured window, in cores.
struct ClientCpu {
  double cores = 0;           // all client threads together
  double busiest_thread = 0;  // the busiest one
  bool known = false;
};

// The report's "latency" object.
void write_latency(JsonWriter& j, const LatencyHistogram& h) {
  j.begin_object("latency");
  write_fields(j, LatencySummary{h.count(), h.min(), h.percentile(50), h.percentile(90),
                                 h.percentile(99), h.percentile(99.9), h.max(), h.mean()});
  // The distribution for a CDF plot: [percentile, ns] pairs.
  j.begin_array("cdf");
  static constexpr double kPoints[] = {0,  1,  5,  10, 20, 30,   40,   50,    60,    70, 80,
                                       90, 95, 97, 98, 99, 99.5, 99.9, 99.95, 99.99, 100};
  for (const double p : kPoints) {
    j.begin_array();
    j.value(p);
    j.value(p == 0 ? h.min() : h.percentile(p));
    j.end_array();
  }
  j.end_array();
  j.end_object();
}

int run(const Options& o) {
  std::string error;
  const auto sizes = parse_sizes(o.sizes, error);
  if (sizes.empty()) {
    std::cerr << "caracal_loadgen: --sizes: " << error << "\n";
    return 2;
  }
  const HandlerKind kind = o.handler == "echo"   ? HandlerKind::kEcho
                           : o.handler == "face" ? HandlerKind::kFace
                                                 : HandlerKind::kMatVec;
  error = check_sizes(kind, sizes);
  if (!error.empty()) {
    std::cerr << "caracal_loadgen: --sizes: " << error << "\n";
    return 2;
  }
  if (o.mode == "open" && !(o.rate > 0)) {
    std::cerr << "caracal_loadgen: --mode open needs --rate > 0 (requests per second)\n";
    return 2;
  }
  if (o.reconnect_ms != 0 && o.mode != "closed") {
    std::cerr << "caracal_loadgen: --reconnect-ms needs --mode closed\n";
    return 2;
  }
  if (uint64_t{o.connections} * o.window > kMaxSlotsPerClient) {
    std::cerr << "caracal_loadgen: --connections x --window is more than the " << kMaxSlotsPerClient
              << " slots a client id has\n";
    return 2;
  }
  const Workload workload(kind, sizes, o.seed, o.matvec_rounds, o.faces);
  const bool use_tcp = o.proto == "tcp";
  const MachineInfo machine = collect_machine_info();

  boost::system::error_code ec;
  const auto address = asio::ip::make_address(o.host, ec);
  if (ec) {
    std::cerr << "caracal_loadgen: --host '" << o.host << "' is not an IP address\n";
    return 2;
  }

  Plan plan;
  plan.opt = &o;
  plan.workload = &workload;
  plan.open = o.mode == "open";
  plan.timeout = std::chrono::milliseconds(o.timeout_ms);

  const uint32_t threads = std::min(o.threads, o.connections);
  std::vector<std::unique_ptr<Runner>> runners;
  for (uint32_t t = 0; t < threads; ++t)
    runners.push_back(std::make_unique<Runner>(plan));
  try {
    for (uint32_t c = 0; c < o.connections; ++c) {
      Runner& r = *runners[c % threads];
      const uint32_t first_slot = (o.client_id << kSlotClientShift) + c * o.window;
      if (use_tcp) {
        r.conns.push_back(
            std::make_unique<TcpConn>(r, c, first_slot, tcp::endpoint(address, o.port)));
      } else {
        r.conns.push_back(
            std::make_unique<UdpConn>(r, c, first_slot, udp::endpoint(address, o.port)));
      }
    }
  } catch (const boost::system::system_error& e) {
    std::cerr << "caracal_loadgen: cannot connect to " << o.host << ":" << o.port << " (" << o.proto
              << "): " << e.what() << "\n";
    return 1;
  }

  const auto to_dur = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  plan.start = Clock::now() + std::chrono::milliseconds(10);
  // The run's start on the wall clock, so that a timeline lines up with other processes' events.
  const auto start_unix = std::chrono::system_clock::now() + (plan.start - Clock::now());
  plan.measure_begin = plan.start + to_dur(o.warmup_s);
  plan.measure_end = plan.measure_begin + to_dur(o.duration_s);
  if (o.until_signal) {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  {
    std::this_thread::sleep_until(plan.start);
    std::vector<std::thread> workers;
    for (auto& r : runners)
      workers.emplace_back([&r] { r->run(); });
    for (auto& w : workers)
      w.join();
  }
  // The measured window, cut short where a stop signal came first.
  Clock::time_point window_end = plan.measure_end;
  bool stopped_by_signal = false;
  for (auto& r : runners) {
    if (r->stopping && r->stopped_at < window_end) {
      window_end = r->stopped_at;
      stopped_by_signal = true;
    }
  }
  const double window_s =
      std::max(0.0, std::chrono::duration<double>(window_end - plan.measure_begin).count());
  ClientCpu client_cpu;
  client_cpu.known = window_s > 0;
  for (auto& r : runners) {
    if (r->cpu_at_begin < 0 || r->cpu_at_end < 0) client_cpu.known = false;
    const double cores = (r->cpu_at_end - r->cpu_at_begin) / window_s;
    client_cpu.cores += cores;
    client_cpu.busiest_thread = std::max(client_cpu.busiest_thread, cores);
  }
  const std::string client_cpu_text =
      client_cpu.known ? "client " + two_decimals(client_cpu.cores) + " cores (busiest thread " +
                             two_decimals(client_cpu.busiest_thread) + ")"
                       : "client cores not known";

  LatencyHistogram hist;
  Counters c;
  std::vector<std::string> errors;
  std::vector<uint64_t> timeline_replies, timeline_errors, timeline_lost, timeline_connection_lost;
  std::vector<Session> sessions;
  std::map<std::string, uint64_t> error_reasons;
  const auto add_series = [](std::vector<uint64_t>& sum, const std::vector<uint64_t>& part) {
    if (sum.size() < part.size()) sum.resize(part.size(), 0);
    for (size_t k = 0; k < part.size(); ++k)
      sum[k] += part[k];
  };
  for (auto& r : runners) {
    hist.merge(r->st.hist);
    c.add(r->st.c);
    for (auto& e : r->st.errors)
      errors.push_back(e);
    add_series(timeline_replies, r->st.timeline_replies);
    add_series(timeline_errors, r->st.timeline_errors);
    add_series(timeline_lost, r->st.timeline_lost);
    add_series(timeline_connection_lost, r->st.timeline_connection_lost);
    sessions.insert(sessions.end(), r->st.sessions.begin(), r->st.sessions.end());
    for (const auto& [reason, n] : r->st.error_reasons)
      error_reasons[reason] += n;
  }
  std::sort(sessions.begin(), sessions.end(), [](const Session& a, const Session& b) {
    return a.connection != b.connection ? a.connection < b.connection
                                        : a.start_unix_s < b.start_unix_s;
  });
  const size_t intervals = std::max({timeline_replies.size(), timeline_errors.size(),
                                     timeline_lost.size(), timeline_connection_lost.size()});
  for (auto* series :
       {&timeline_replies, &timeline_errors, &timeline_lost, &timeline_connection_lost})
    series->resize(intervals, 0);
  const double throughput = window_s > 0 ? static_cast<double>(c.measured) / window_s : 0.0;

  std::printf(
      "%s %s %s sizes=%s conns=%u window=%u%s: %.0f req/s, p50 %.1f us, p99 %.1f us, p99.9 %.1f "
      "us, max %.1f us; sent %lu, wrong %lu, lost %lu, late %lu, unanswered %lu, send errors "
      "%lu, connection errors %lu, error replies %lu, connection lost %lu, unaccounted %ld; %s\n",
      o.proto.c_str(), o.handler.c_str(), o.mode.c_str(), o.sizes.c_str(), o.connections, o.window,
      plan.open ? (" rate=" + std::to_string(static_cast<uint64_t>(o.rate))).c_str() : "",
      throughput, hist.percentile(50) / 1e3, hist.percentile(99) / 1e3, hist.percentile(99.9) / 1e3,
      hist.max() / 1e3, static_cast<unsigned long>(c.sent), static_cast<unsigned long>(c.wrong),
      static_cast<unsigned long>(c.lost), static_cast<unsigned long>(c.late),
      static_cast<unsigned long>(c.unanswered), static_cast<unsigned long>(c.send_errors),
      static_cast<unsigned long>(c.connection_errors), static_cast<unsigned long>(c.error_replies),
      static_cast<unsigned long>(c.connection_lost), static_cast<long>(c.unaccounted()),
      client_cpu_text.c_str());
  for (const auto& e : errors)
    std::fprintf(stderr, "caracal_loadgen: %s\n", e.c_str());

  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    JsonWriter j(out);
    j.begin_object();
    j.field("tool", "caracal_loadgen");
    j.field("label", o.label);
    j.begin_object("config");
    j.field("host", o.host);
    j.field("port", uint32_t{o.port});
    j.field("proto", o.proto);
    j.field("handler", o.handler);
    j.field("mode", o.mode);
    j.field("connections", o.connections);
    j.field("window", o.window);
    j.field("busy_poll", o.busy_poll);
    j.field("rate", o.rate);
    j.field("sizes", o.sizes);
    j.field("warmup_s", o.warmup_s);
    j.field("duration_s", o.duration_s);
    j.field("threads", threads);
    j.field("timeout_ms", o.timeout_ms);
    j.field("matvec_rounds", o.matvec_rounds);
    j.field("error_prefix", o.error_prefix);
    j.field("face_store_outage", o.face_store_outage);
    j.field("client_id", o.client_id);
    j.field("reconnect_ms", o.reconnect_ms);
    j.field("until_signal", o.until_signal);
    j.end_object();
    j.begin_object("machine");
    j.field("cpu_model", machine.cpu_model);
    j.field("online_cpus", machine.online_cpus);
    j.field("hypervisor", machine.hypervisor);
    j.field("kernel", machine.kernel);
    j.field("hostname", machine.hostname);
    j.field("date_utc", machine.date_utc);
    j.end_object();
    j.field("stopped_by", stopped_by_signal ? "signal" : "duration");
    j.field("window_s", window_s);
    j.field("offered_rps", plan.open ? o.rate : 0.0);
    j.field("throughput_rps", throughput);
    write_latency(j, hist);
    j.begin_object("counts");
    for (const auto& [name, count] : kCounts)
      j.field(name, c.*count);
    j.field("unaccounted", c.unaccounted());
    j.end_object();
    j.begin_object("error_reasons");
    for (const auto& [reason, n] : error_reasons)
      j.field(reason, n);
    j.end_object();
    if (o.timeline_ms != 0) {
      // Interval k covers [k, k + 1) * interval_ms after the run's start (warm-up included).
      j.begin_object("timeline");
      j.field("interval_ms", o.timeline_ms);
      j.field("warmup_s", o.warmup_s);
      j.field("start_unix_s", std::chrono::duration<double>(start_unix.time_since_epoch()).count());
      j.array("replies", timeline_replies);
      j.array("error_replies", timeline_errors);
      j.array("lost", timeline_lost);
      j.array("connection_lost", timeline_connection_lost);
      j.end_object();
    }
    if (o.reconnect_ms != 0 && use_tcp) {
      j.begin_array("sessions");
      for (const Session& ss : sessions) {
        j.begin_object();
        j.field("connection", ss.connection);
        j.field("start_unix_s", ss.start_unix_s);
        j.field("end_unix_s", ss.end_unix_s);
        j.field("end", ss.end);
        j.field("sent", ss.sent);
        j.field("replies", ss.replies);
        j.field("error_replies", ss.error_replies);
        j.field("wrong", ss.wrong);
        j.field("connection_lost", ss.connection_lost);
        j.field("unanswered", ss.unanswered);
        j.end_object();
      }
      j.end_array();
    }
    if (client_cpu.known) {
      j.begin_object("client_cpu");
      j.field("cores", client_cpu.cores);
      j.field("busiest_thread_cores", client_cpu.busiest_thread);
      j.field("threads", threads);
      j.end_object();
    }
    j.array("errors", errors);
    j.end_object();
    out.close();
    if (!out) {
      std::cerr << "caracal_loadgen: writing " << o.json_path << " failed\n";
      return 1;
    }
  }

  // With --reconnect-ms a broken connection is an event of the run, counted, not a failure.
  bool ok =
      c.wrong == 0 && c.unaccounted() == 0 && (o.reconnect_ms != 0 || c.connection_errors == 0);
  if (o.strict) {
    ok = ok && c.lost == 0 && c.late == 0 && c.unanswered == 0 && c.send_errors == 0 &&
         c.measured > 0;
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace caracal::bench

int main(int argc, char** argv) {
  caracal::bench::Options o;
  CLI::App app{"caracal_loadgen: UDP/TCP load with latency percentiles and verified replies"};
  app.add_option("--host", o.host, "Server IP address")->capture_default_str();
  app.add_option("--port", o.port, "Server port")->required();
  app.add_option("--proto", o.proto, "udp or tcp (4-byte big-endian length prefix)")
      ->check(CLI::IsMember({"udp", "tcp"}))
      ->capture_default_str();
  app.add_option("--handler", o.handler, "What the service computes: echo, matvec or face")
      ->check(CLI::IsMember({"echo", "matvec", "face"}))
      ->capture_default_str();
  app.add_option("--face-persons", o.faces.persons,
                 "face: persons of the loaded face set (caracal_face_loader --persons)")
      ->check(CLI::Range(1u, 1u << 24))
      ->capture_default_str();
  app.add_option("--face-seed", o.faces.seed, "face: seed of the loaded face set")
      ->capture_default_str();
  app.add_option("--mode", o.mode, "closed (window per connection) or open (--rate)")
      ->check(CLI::IsMember({"closed", "open"}))
      ->capture_default_str();
  app.add_option("--connections", o.connections, "Connections")
      ->check(CLI::Range(1u, 100000u))
      ->capture_default_str();
  app.add_option("--window", o.window, "Requests in flight per connection (at most)")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  app.add_option("--rate", o.rate, "Open loop: requests per second over all connections");
  app.add_option("--sizes,--size", o.sizes,
                 "Message bytes, or a distribution: 64:0.5,1024:0.3,16384:0.2")
      ->capture_default_str();
  app.add_option("--warmup", o.warmup_s, "Seconds before the measured window")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_option("--duration", o.duration_s, "Seconds measured")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "Client threads (connections are spread over them)")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  app.add_option("--timeout-ms", o.timeout_ms, "UDP: a request unanswered this long is lost")
      ->check(CLI::Range(1u, 600000u))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the request pool")->capture_default_str();
  app.add_option("--json", o.json_path, "Write the results as JSON to this file");
  app.add_option("--label", o.label, "A name for this run, copied into the JSON");
  app.add_flag("--busy-poll", o.busy_poll,
               "Client threads poll their sockets without sleeping (one core each)");
  app.add_option("--matvec-rounds", o.matvec_rounds,
                 "The matvec handler's rounds (networks per vector), for checking its replies")
      ->check(CLI::Range(1u, caracal::examples::MatVecSpec::kMaxRounds))
      ->capture_default_str();
  app.add_option("--error-prefix", o.error_prefix,
                 "A reply starting with this text is an error reply: counted, not wrong");
  app.add_flag("--face-store-outage", o.face_store_outage,
               "face: a store_unavailable or unknown_person reply (memcached down, slow, or "
               "restarted and not yet reloaded) is an error reply, counted by reason, not wrong");
  app.add_option("--timeline-ms", o.timeline_ms,
                 "Replies and error replies per interval of this many ms, in the JSON")
      ->check(CLI::Range(0u, 60000u))
      ->capture_default_str();
  app.add_option("--client-id", o.client_id,
                 "This client's id, in the top 8 bits of every request's slot id (echo replies "
                 "then tell whose they are)")
      ->check(CLI::Range(0u, 255u))
      ->capture_default_str();
  app.add_option("--reconnect-ms", o.reconnect_ms,
                 "TCP, closed loop: connect again this long after a connection breaks (its "
                 "requests in flight are counted connection_lost); 0: a break fails the run")
      ->check(CLI::Range(0u, 60000u))
      ->capture_default_str();
  app.add_flag("--until-signal", o.until_signal,
               "SIGINT or SIGTERM ends the run (or --duration, whichever comes first)");
  app.add_flag("--strict", o.strict,
               "Also fail on lost, late or unanswered requests, and on no measured reply");
  CLI11_PARSE(app, argc, argv);
  try {
    return caracal::bench::run(o);
  } catch (const std::exception& e) {
    std::cerr << "caracal_loadgen: " << e.what() << "\n";
    return 1;
  }
}
