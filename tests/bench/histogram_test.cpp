// The loadgen latency histogram: bucket boundaries, percentiles within the stated relative
// error of the exact ones, merging, and the extremes of uint64_t.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "histogram.hpp"

namespace caracal::bench {
namespace {

TEST(LatencyHistogram, BucketsTileTheValues) {
  // Every value falls in the bucket whose [low, low + width) holds it, and buckets are ordered.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t v = rng() >> (rng() % 64);
    const uint32_t b = LatencyHistogram::bucket_of(v);
    ASSERT_LT(b, LatencyHistogram::kBuckets);
    ASSERT_LE(LatencyHistogram::bucket_low(b), v) << v;
    ASSERT_LT(v - LatencyHistogram::bucket_low(b), LatencyHistogram::bucket_width(b)) << v;
    // Relative width at most 1/128 above the linear range.
    if (v >= LatencyHistogram::kLinear) {
      ASSERT_LE(LatencyHistogram::bucket_width(b) * 128, LatencyHistogram::bucket_low(b)) << v;
    }
  }
  for (uint32_t b = 1; b < LatencyHistogram::kBuckets; ++b) {
    ASSERT_EQ(LatencyHistogram::bucket_low(b - 1) + LatencyHistogram::bucket_width(b - 1),
              LatencyHistogram::bucket_low(b))
        << b;
  }
  EXPECT_EQ(LatencyHistogram::bucket_of(UINT64_MAX), LatencyHistogram::kBuckets - 1);
  EXPECT_EQ(LatencyHistogram::bucket_of(255), 255u);
  EXPECT_EQ(LatencyHistogram::bucket_of(256), 256u);
}

TEST(LatencyHistogram, PercentilesWithinRelativeError) {
  // A long-tailed distribution: log-normal around 20 us with outliers to 10 ms.
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> lat(std::log(20000.0), 0.6);
  std::vector<uint64_t> values;
  LatencyHistogram h;
  for (int i = 0; i < 100000; ++i) {
    uint64_t v = static_cast<uint64_t>(lat(rng));
    if (i % 997 == 0) v = 10'000'000 + i;
    values.push_back(v);
    h.record(v);
  }
  std::sort(values.begin(), values.end());
  for (const double p : {1.0, 10.0, 50.0, 90.0, 99.0, 99.9, 99.99}) {
    const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * values.size()));
    const double exact = static_cast<double>(values[rank - 1]);
    const double got = static_cast<double>(h.percentile(p));
    EXPECT_LE(std::fabs(got - exact), exact / 256.0 + 1) << "p" << p;
  }
  EXPECT_EQ(h.count(), values.size());
  EXPECT_EQ(h.min(), values.front());
  EXPECT_EQ(h.max(), values.back());
  EXPECT_EQ(h.percentile(100), values.back());
  EXPECT_EQ(h.percentile(0), values.front());
}

TEST(LatencyHistogram, SmallValuesAreExact) {
  LatencyHistogram h;
  for (uint64_t v = 1; v <= 100; ++v)
    h.record(v);
  EXPECT_EQ(h.percentile(50), 50u);
  EXPECT_EQ(h.percentile(99), 99u);
  EXPECT_DOUBLE_EQ(h.mean(), 50.5);
}

TEST(LatencyHistogram, MergeEqualsRecordingTogether) {
  std::mt19937_64 rng(3);
  LatencyHistogram a, b, all;
  for (int i = 0; i < 50000; ++i) {
    const uint64_t v = rng() % 5'000'000;
    (i % 3 == 0 ? a : b).record(v);
    all.record(v);
  }
  LatencyHistogram empty;
  a.merge(empty);
  a.merge(b);
  EXPECT_EQ(a.count(), all.count());
  EXPECT_EQ(a.min(), all.min());
  EXPECT_EQ(a.max(), all.max());
  for (const double p : {50.0, 90.0, 99.0, 99.9})
    EXPECT_EQ(a.percentile(p), all.percentile(p)) << p;
  empty.merge(all);
  EXPECT_EQ(empty.percentile(50), all.percentile(50));
}

TEST(LatencyHistogram, EmptyAndHuge) {
  LatencyHistogram h;
  EXPECT_EQ(h.percentile(50), 0u);
  EXPECT_EQ(h.count(), 0u);
  h.record(UINT64_MAX);
  h.record(0);
  EXPECT_EQ(h.percentile(100), UINT64_MAX);
  EXPECT_EQ(h.percentile(1), 0u);
}

}  // namespace
}  // namespace caracal::bench
