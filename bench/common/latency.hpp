// A latency distribution as the benchmark reports give it (count, percentiles, extremes, mean),
// its nearest-rank summary of raw samples, and its JSON fields.
#pragma once

#include <cstdint>
#include <vector>

#include "json_writer.hpp"

namespace caracal::bench {

struct LatencySummary {
  uint64_t samples = 0;
  uint64_t min_ns = 0;
  uint64_t p50_ns = 0;
  uint64_t p90_ns = 0;
  uint64_t p99_ns = 0;
  uint64_t p999_ns = 0;
  uint64_t max_ns = 0;
  double mean_ns = 0;
};

// Sorts `samples_ns` and summarises it.
LatencySummary summarize(std::vector<uint64_t>& samples_ns);

// The median of `v` (the mean of the middle two for an even count); 0 when it is empty.
double median_of(std::vector<double> v);

// Writes the summary's fields into the open object: samples, min_ns (unless `with_min` is
// false), p50_ns, p90_ns, p99_ns, p999_ns, max_ns, mean_ns.
void write_fields(JsonWriter& j, const LatencySummary& s, bool with_min = true);

}  // namespace caracal::bench
