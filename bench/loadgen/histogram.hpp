// A latency histogram with bounded relative error, in the manner of HdrHistogram: values up to
// 255 have a bucket each; above that, every power-of-two range [2^k, 2^(k+1)) is split into 128
// equal buckets, so a bucket is at most 1/128 of its lowest value wide and a percentile read
// back (the middle of its bucket) is within 1/256 of a value that was recorded. Any uint64_t
// fits; the count, minimum, maximum and sum are exact. Not thread-safe: keep one per thread and
// merge them.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

namespace caracal::bench {

class LatencyHistogram {
 public:
  static constexpr uint32_t kSubBits = 7;              // 128 buckets per power of two
  static constexpr uint32_t kLinear = 2u << kSubBits;  // 0..255: one bucket per value
  static constexpr uint32_t kSub = 1u << kSubBits;     // 128
  static constexpr uint32_t kBuckets = kLinear + (64 - kSubBits - 1) * kSub;

  LatencyHistogram() : counts_(kBuckets, 0) {}

  static uint32_t bucket_of(uint64_t v) {
    if (v < kLinear) return static_cast<uint32_t>(v);
    const uint32_t shift = static_cast<uint32_t>(std::bit_width(v)) - (kSubBits + 1);  // >= 1
    return kLinear + (shift - 1) * kSub + static_cast<uint32_t>((v >> shift) - kSub);
  }
  // The lowest value of bucket b and the number of values it holds.
  static uint64_t bucket_low(uint32_t b) {
    if (b < kLinear) return b;
    const uint32_t shift = (b - kLinear) / kSub + 1;
    return (uint64_t{kSub} + (b - kLinear) % kSub) << shift;
  }
  static uint64_t bucket_width(uint32_t b) {
    return b < kLinear ? 1 : uint64_t{1} << ((b - kLinear) / kSub + 1);
  }

  void record(uint64_t v) {
    ++counts_[bucket_of(v)];
    if (count_ == 0 || v < min_) min_ = v;
    if (v > max_) max_ = v;
    ++count_;
    sum_ += static_cast<double>(v);
  }

  void merge(const LatencyHistogram& o) {
    if (o.count_ == 0) return;
    for (uint32_t b = 0; b < kBuckets; ++b)
      counts_[b] += o.counts_[b];
    if (count_ == 0 || o.min_ < min_) min_ = o.min_;
    max_ = std::max(max_, o.max_);
    count_ += o.count_;
    sum_ += o.sum_;
  }

  uint64_t count() const { return count_; }
  uint64_t min() const { return min_; }
  uint64_t max() const { return max_; }
  double mean() const { return count_ == 0 ? 0.0 : sum_ / static_cast<double>(count_); }

  // The value at `percentile` (0-100) by nearest rank: the middle of the bucket that holds the
  // ceil(p/100 * count)-th smallest value, clamped to [min, max]; 0 and 100 are the exact min
  // and max. 0 when empty.
  uint64_t percentile(double percentile) const {
    if (count_ == 0) return 0;
    if (percentile <= 0) return min_;
    if (percentile >= 100) return max_;
    const double p = percentile;
    uint64_t rank = static_cast<uint64_t>(p / 100.0 * static_cast<double>(count_) + 0.9999999);
    rank = std::clamp<uint64_t>(rank, 1, count_);
    uint64_t seen = 0;
    for (uint32_t b = 0; b < kBuckets; ++b) {
      seen += counts_[b];
      if (seen >= rank) {
        const uint64_t mid = bucket_low(b) + (bucket_width(b) - 1) / 2;
        return std::clamp(mid, min_, max_);
      }
    }
    return max_;
  }

 private:
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  uint64_t min_ = 0;
  uint64_t max_ = 0;
  double sum_ = 0;
};

}  // namespace caracal::bench
