// Metrics for Prometheus: counters, gauges and histograms kept in a Registry, rendered in the
// text exposition format 0.0.4 and served over HTTP by MetricsServer (GET /metrics).
//
// The data path only touches the metric objects: Counter::inc, Gauge::set/add and
// Histogram::observe are relaxed atomic updates that never lock, allocate or throw. Counters and
// histograms keep a cell per thread shard (thread_shard.hpp), which a scrape adds up, so that the
// I/O and engine threads counting every request do not pass one cache line between their cores.
// Registration and rendering are setup and scrape work: they take the registry's lock.
//
// A scrape reads each value once without stopping writers, so values taken together (two
// counters, or a histogram's buckets and its sum) may be from slightly different instants; each
// histogram's +Inf bucket always equals its _count.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "caracal/core/status.hpp"
#include "thread_shard.hpp"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace caracal::server {

// Label name/value pairs of one series, e.g. {{"service", "echo"}, {"queue", "3"}}. Rendered in
// the order given; the order does not make a different series.
using Labels = std::vector<std::pair<std::string, std::string>>;

// Each metric sits on its own cache lines: counters of different I/O threads do not share one.
class Counter {
 public:
  void inc(uint64_t n = 1) { cells_[thread_shard()].value.fetch_add(n, std::memory_order_relaxed); }
  // The sum of the cells. Each cell only grows, so successive reads never go down.
  uint64_t value() const;

 private:
  struct alignas(64) Cell {
    std::atomic<uint64_t> value{0};
  };
  std::array<Cell, kThreadShards> cells_;
};

class alignas(64) Gauge {
 public:
  void set(int64_t v) { value_.store(v, std::memory_order_relaxed); }
  void add(int64_t d) { value_.fetch_add(d, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Observations counted in buckets by upper bound (an observation v lands in the first bucket
// with v <= bound, else in +Inf); rendered cumulatively, with the sum and count of all
// observations. A NaN observation counts in +Inf and makes the sum NaN.
class alignas(64) Histogram {
 public:
  // `bounds` strictly increasing and finite (a final +Inf may be given; it is implied anyway).
  // Throws std::invalid_argument otherwise.
  explicit Histogram(std::vector<double> bounds);

  void observe(double v);

  const std::vector<double>& bounds() const { return bounds_; }
  // Observations <= bounds()[i] for each i, then all observations (the +Inf bucket): one more
  // entry than bounds().
  std::vector<uint64_t> cumulative_counts() const;
  uint64_t count() const;
  double sum() const;

 private:
  struct alignas(64) Line {
    std::atomic<uint64_t> counts[8];
  };
  struct alignas(64) SumCell {
    std::atomic<double> sum{0.0};
  };
  std::atomic<uint64_t>& bucket(uint32_t shard, size_t i) const {
    return lines_[shard * lines_per_shard_ + i / 8].counts[i % 8];
  }

  std::vector<double> bounds_;
  // Per shard, lines_per_shard_ lines of bucket counts (per bucket, not cumulative; +Inf last),
  // so that no two shards share a line.
  size_t lines_per_shard_ = 0;
  std::unique_ptr<Line[]> lines_;
  std::array<SumCell, kThreadShards> sums_;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The same name and labels return the same object; references stay valid for the registry's
  // life. Thread-safe. A name must match [a-zA-Z_:][a-zA-Z0-9_:]*, a label name
  // [a-zA-Z_][a-zA-Z0-9_]* (not starting with "__", not repeated; "le" is taken by histograms).
  // Throws std::logic_error (std::invalid_argument for a malformed name) when the name is
  // malformed, or was registered with another type, help text or histogram bounds, or when its
  // series would clash with another family's (a histogram `x` owns x_bucket, x_sum, x_count).
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const Labels& labels,
                       std::vector<double> bounds);

  // A gauge whose value `fn` computes at scrape time (e.g. the occupancy of a ring). `fn` runs
  // under the registry's lock, so it must not call the registry. Same checks as gauge(); the
  // name and labels must not already be in use by another series. Returns an id for
  // remove_callback().
  uint64_t gauge_callback(const std::string& name, const std::string& help, const Labels& labels,
                          std::function<double()> fn);
  // The same for a counter kept elsewhere (e.g. seconds spent, as a double): `fn` must never
  // return less than it returned before.
  uint64_t counter_callback(const std::string& name, const std::string& help, const Labels& labels,
                            std::function<double()> fn);
  // Once this returns, the callback is not running and will not run again, so what it reads
  // may be freed. An unknown or already removed id is ignored.
  void remove_callback(uint64_t id);

  // Text exposition format 0.0.4: families sorted by name, each with one HELP and TYPE line;
  // families with no series are left out.
  std::string render() const;

 private:
  enum class Type : uint8_t;
  struct Family;
  struct Series;

  // The family `name`, created if new; checks name, type, help and bounds. Caller holds mutex_.
  Family& family_locked(const std::string& name, const std::string& help, Type type,
                        const std::vector<double>* bounds);
  // The series of `labels` in `family`, created empty if new. Caller holds mutex_.
  Series& series_locked(Family& family, const Labels& labels, bool* created);

  // gauge_callback() and counter_callback().
  uint64_t callback(const std::string& name, const std::string& help, const Labels& labels,
                    Type type, std::function<double()> fn);

  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Family>> families_;
  std::map<uint64_t, std::pair<Family*, Labels>> callbacks_;  // id -> family, series key
  uint64_t next_callback_id_ = 1;
};

// 1 us to 1 s in 1-2.5-5 steps: bounds for latencies measured in seconds.
std::vector<double> latency_buckets_seconds();

// Serves GET (and HEAD) /metrics with the registry's text (Content-Type text/plain;
// version=0.0.4), 404 for any other path, 405 for other methods on /metrics, 413 for a request
// over 8 KiB. Connections are kept alive as HTTP/1.1 asks and closed after 60 s idle.
//
// Runs on the given io_context, which may be run by several threads (each connection has its own
// strand). The registry must outlive every handler this server leaves in the io_context.
class MetricsServer {
 public:
  MetricsServer(boost::asio::io_context& io, const Registry& registry);
  ~MetricsServer();  // stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds and starts accepting. `host` is an IP address or a name resolved once; port 0 asks the
  // OS for one (see port()). The error names the address.
  Status listen(const std::string& host, uint16_t port);
  // The bound port; 0 before a successful listen().
  uint16_t port() const;
  // Closes the listening socket and every open connection. Safe from any thread; the closing
  // runs on the io_context, which then has no work left from this server.
  void stop();

 private:
  struct State;
  class Session;
  std::shared_ptr<State> state_;
};

}  // namespace caracal::server
