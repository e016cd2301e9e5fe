#include "latency.hpp"

#include <algorithm>
#include <numeric>

namespace caracal::bench {

LatencySummary summarize(std::vector<uint64_t>& samples_ns) {
  LatencySummary s;
  s.samples = samples_ns.size();
  if (samples_ns.empty()) return s;
  std::sort(samples_ns.begin(), samples_ns.end());
  const auto rank = [&](double q) {
    // Nearest rank: the smallest sample with at least q of all samples at or below it.
    const double r = q * static_cast<double>(samples_ns.size());
    size_t index = static_cast<size_t>(r);
    if (static_cast<double>(index) < r) ++index;
    return samples_ns[index == 0 ? 0 : std::min(index, samples_ns.size()) - 1];
  };
  s.min_ns = samples_ns.front();
  s.max_ns = samples_ns.back();
  s.p50_ns = rank(0.50);
  s.p90_ns = rank(0.90);
  s.p99_ns = rank(0.99);
  s.p999_ns = rank(0.999);
  const long double sum =
      std::accumulate(samples_ns.begin(), samples_ns.end(), static_cast<long double>(0));
  s.mean_ns = static_cast<double>(sum / static_cast<long double>(samples_ns.size()));
  return s;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  if (n == 0) return 0;
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void write_fields(JsonWriter& j, const LatencySummary& s, bool with_min) {
  j.field("samples", s.samples);
  if (with_min) j.field("min_ns", s.min_ns);
  j.field("p50_ns", s.p50_ns);
  j.field("p90_ns", s.p90_ns);
  j.field("p99_ns", s.p99_ns);
  j.field("p999_ns", s.p999_ns);
  j.field("max_ns", s.max_ns);
  j.field("mean_ns", s.mean_ns);
}

}  // namespace caracal::bench
