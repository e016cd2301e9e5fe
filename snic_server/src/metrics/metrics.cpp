#include "metrics/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string_view>

namespace caracal::server {

enum class Registry::Type : uint8_t { kCounter, kGauge, kHistogram };

struct Registry::Series {
  Labels labels;  // in the order of the first registration
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
  std::function<double()> callback;
};

struct Registry::Family {
  std::string name;
  std::string help;
  Type type;
  std::vector<double> bounds;       // histograms
  std::map<Labels, Series> series;  // by series_key(labels)
};

namespace {

const char* type_name(int type) {
  static constexpr const char* kNames[] = {"counter", "gauge", "histogram"};
  return kNames[type];
}

bool valid_metric_name(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool valid_label_name(std::string_view n) {
  if (n.empty() || n.starts_with("__")) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Labels sorted by name: the same set in any order is the same series.
Labels series_key(const Labels& labels) {
  Labels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

void append_escaped(std::string& out, std::string_view s, bool quote) {
  for (const char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

std::string format_double(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// `{a="x",b="y"}`, with `le` appended when given; nothing for no labels at all.
void append_labels(std::string& out, const Labels& labels, const std::string* le = nullptr) {
  if (labels.empty() && le == nullptr) return;
  out += '{';
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out += ',';
    first = false;
    out += name;
    out += "=\"";
    append_escaped(out, value, true);
    out += '"';
  }
  if (le != nullptr) {
    if (!first) out += ',';
    out += "le=\"";
    out += *le;
    out += '"';
  }
  out += '}';
}

void append_sample(std::string& out, const std::string& name, const Labels& labels,
                   const std::string& value, const std::string* le = nullptr) {
  out += name;
  append_labels(out, labels, le);
  out += ' ';
  out += value;
  out += '\n';
}

// Checked before the family is created, so that a refused series leaves no trace.
void check_labels(const std::string& metric, const Labels& labels, bool histogram) {
  std::set<std::string_view> seen;
  for (const auto& [label, value] : labels) {
    if (!valid_label_name(label)) {
      throw std::invalid_argument("metric '" + metric + "': label name '" + label +
                                  "' does not match [a-zA-Z_][a-zA-Z0-9_]* or starts with __");
    }
    if (histogram && label == "le") {
      throw std::invalid_argument("histogram '" + metric +
                                  "': label 'le' is reserved for bucket bounds");
    }
    if (!seen.insert(label).second) {
      throw std::invalid_argument("metric '" + metric + "': label '" + label + "' given twice");
    }
  }
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  if (!bounds_.empty() && std::isinf(bounds_.back()) && bounds_.back() > 0) bounds_.pop_back();
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i])) {
      throw std::invalid_argument("histogram bound " + std::to_string(i) + " is " +
                                  format_double(bounds_[i]) + "; bounds must be finite");
    }
    if (i > 0 && !(bounds_[i - 1] < bounds_[i])) {
      throw std::invalid_argument("histogram bounds must increase strictly: bound " +
                                  std::to_string(i) + " (" + format_double(bounds_[i]) +
                                  ") follows " + format_double(bounds_[i - 1]));
    }
  }
  lines_per_shard_ = (bounds_.size() + 1 + 7) / 8;
  // Value-initialized: every count starts at zero.
  lines_ = std::make_unique<Line[]>(lines_per_shard_ * kThreadShards);
}

void Histogram::observe(double v) {
  // First bound with v <= bound; a NaN compares false everywhere and lands in +Inf.
  const auto it = std::partition_point(bounds_.begin(), bounds_.end(),
                                       [v](double bound) { return !(v <= bound); });
  const uint32_t shard = thread_shard();
  bucket(shard, static_cast<size_t>(it - bounds_.begin())).fetch_add(1, std::memory_order_relaxed);
  sums_[shard].sum.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    for (uint32_t shard = 0; shard < kThreadShards; ++shard)
      total += bucket(shard, i).load(std::memory_order_relaxed);
    out[i] = total;
  }
  return out;
}

double Histogram::sum() const {
  double total = 0;
  for (const SumCell& c : sums_)
    total += c.sum.load(std::memory_order_relaxed);
  return total;
}

uint64_t Counter::value() const {
  uint64_t total = 0;
  for (const Cell& c : cells_)
    total += c.value.load(std::memory_order_relaxed);
  return total;
}

uint64_t Histogram::count() const {
  return cumulative_counts().back();
}

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Family& Registry::family_locked(const std::string& name, const std::string& help,
                                          Type type, const std::vector<double>* bounds) {
  const int t = static_cast<int>(type);
  if (auto it = families_.find(name); it != families_.end()) {
    Family& f = *it->second;
    if (f.type != type) {
      throw std::logic_error("metric '" + name + "' is a " + type_name(static_cast<int>(f.type)) +
                             ", not a " + type_name(t));
    }
    if (f.help != help) {
      throw std::logic_error("metric '" + name + "' was registered with help '" + f.help +
                             "', now '" + help + "'");
    }
    if (bounds != nullptr && f.bounds != *bounds) {
      throw std::logic_error("histogram '" + name + "' was registered with other bucket bounds");
    }
    return f;
  }
  if (!valid_metric_name(name)) {
    throw std::invalid_argument("metric name '" + name +
                                "' does not match [a-zA-Z_:][a-zA-Z0-9_:]*");
  }
  // A histogram's samples are named <name>_bucket, _sum and _count; no other family may use
  // those names, and a new histogram may not take a name whose samples another family has.
  static constexpr const char* kSuffixes[] = {"_bucket", "_sum", "_count"};
  for (const auto& [other, family] : families_) {
    for (const char* suffix : kSuffixes) {
      if (family->type == Type::kHistogram && name == other + suffix) {
        throw std::logic_error("metric '" + name + "' clashes with the samples of histogram '" +
                               other + "'");
      }
      if (type == Type::kHistogram && other == name + suffix) {
        throw std::logic_error("histogram '" + name + "' would name samples '" + other +
                               "', already a " + type_name(static_cast<int>(family->type)));
      }
    }
  }
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->type = type;
  if (bounds != nullptr) f->bounds = *bounds;
  return *families_.emplace(name, std::move(f)).first->second;
}

Registry::Series& Registry::series_locked(Family& family, const Labels& labels, bool* created) {
  auto [it, inserted] = family.series.try_emplace(series_key(labels));
  if (inserted) it->second.labels = labels;
  *created = inserted;
  return it->second;
}

Counter& Registry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  check_labels(name, labels, false);
  std::lock_guard lock(mutex_);
  Family& f = family_locked(name, help, Type::kCounter, nullptr);
  bool created = false;
  Series& s = series_locked(f, labels, &created);
  if (created) {
    s.counter = std::make_unique<Counter>();
  } else if (!s.counter) {
    throw std::logic_error("counter '" + name + "': these labels belong to a callback counter");
  }
  return *s.counter;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  check_labels(name, labels, false);
  std::lock_guard lock(mutex_);
  Family& f = family_locked(name, help, Type::kGauge, nullptr);
  bool created = false;
  Series& s = series_locked(f, labels, &created);
  if (created) {
    s.gauge = std::make_unique<Gauge>();
  } else if (!s.gauge) {
    throw std::logic_error("gauge '" + name + "': these labels belong to a callback gauge");
  }
  return *s.gauge;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help,
                               const Labels& labels, std::vector<double> bounds) {
  // Normalises and checks the bounds before they are compared with the family's.
  auto h = std::make_unique<Histogram>(std::move(bounds));
  check_labels(name, labels, true);
  std::lock_guard lock(mutex_);
  Family& f = family_locked(name, help, Type::kHistogram, &h->bounds());
  bool created = false;
  Series& s = series_locked(f, labels, &created);
  if (created) s.histogram = std::move(h);
  return *s.histogram;
}

uint64_t Registry::gauge_callback(const std::string& name, const std::string& help,
                                  const Labels& labels, std::function<double()> fn) {
  return callback(name, help, labels, Type::kGauge, std::move(fn));
}

uint64_t Registry::counter_callback(const std::string& name, const std::string& help,
                                    const Labels& labels, std::function<double()> fn) {
  return callback(name, help, labels, Type::kCounter, std::move(fn));
}

uint64_t Registry::callback(const std::string& name, const std::string& help, const Labels& labels,
                            Type type, std::function<double()> fn) {
  const std::string what =
      std::string(type_name(static_cast<int>(type))) + " callback '" + name + "'";
  if (!fn) throw std::invalid_argument(what + " has no function");
  check_labels(name, labels, false);
  std::lock_guard lock(mutex_);
  Family& f = family_locked(name, help, type, nullptr);
  bool created = false;
  Series& s = series_locked(f, labels, &created);
  if (!created) throw std::logic_error(what + ": a series with these labels is already registered");
  s.callback = std::move(fn);
  const uint64_t id = next_callback_id_++;
  callbacks_.emplace(id, std::make_pair(&f, series_key(labels)));
  return id;
}

void Registry::remove_callback(uint64_t id) {
  std::function<double()> fn;  // destroyed after the lock is released
  {
    std::lock_guard lock(mutex_);
    const auto it = callbacks_.find(id);
    if (it == callbacks_.end()) return;
    auto& [family, key] = it->second;
    const auto s = family->series.find(key);
    fn = std::move(s->second.callback);
    family->series.erase(s);
    callbacks_.erase(it);
  }
}

std::string Registry::render() const {
  std::string out;
  std::lock_guard lock(mutex_);
  for (const auto& [name, family] : families_) {
    if (family->series.empty()) continue;
    out += "# HELP ";
    out += name;
    out += ' ';
    append_escaped(out, family->help, false);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type_name(static_cast<int>(family->type));
    out += '\n';
    for (const auto& [key, s] : family->series) {
      if (s.counter) {
        append_sample(out, name, s.labels, std::to_string(s.counter->value()));
      } else if (s.gauge) {
        append_sample(out, name, s.labels, std::to_string(s.gauge->value()));
      } else if (s.callback) {
        double v = 0;
        try {
          v = s.callback();
        } catch (...) {
          continue;  // a failing callback leaves out its sample, not the whole scrape
        }
        append_sample(out, name, s.labels, format_double(v));
      } else if (s.histogram) {
        const Histogram& h = *s.histogram;
        const std::vector<uint64_t> counts = h.cumulative_counts();
        const std::string bucket = name + "_bucket";
        for (size_t i = 0; i < counts.size(); ++i) {
          const std::string le = i < h.bounds().size() ? format_double(h.bounds()[i]) : "+Inf";
          append_sample(out, bucket, s.labels, std::to_string(counts[i]), &le);
        }
        append_sample(out, name + "_sum", s.labels, format_double(h.sum()));
        append_sample(out, name + "_count", s.labels, std::to_string(counts.back()));
      }
    }
  }
  return out;
}

std::vector<double> latency_buckets_seconds() {
  return {1e-6,   2.5e-6, 5e-6, 1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
          2.5e-3, 5e-3,   1e-2, 2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1.0};
}

}  // namespace caracal::server
