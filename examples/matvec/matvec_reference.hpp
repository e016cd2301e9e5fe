// The CPU reference of the matvec handler (matvec.hpp): the same network in double precision,
// written as plainly as possible, and the check that a reply matches it. Used by the tests and
// by caracal_loadgen to verify every compute reply.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "matvec.hpp"

namespace caracal::examples {

// y for every 64-byte vector of `request` (size a multiple of 64), as floats: the mean of
// `rounds` networks, as MatVec with that many rounds answers.
inline std::vector<float> matvec_reference(const void* request, uint32_t size,
                                           uint32_t rounds = 1) {
  constexpr uint32_t kDim = MatVecSpec::kDim;
  const uint32_t vectors = size / MatVecSpec::kVectorBytes;
  std::vector<float> out(static_cast<size_t>(vectors) * kDim);
  for (uint32_t v = 0; v < vectors; ++v) {
    float in[kDim];
    std::memcpy(in, static_cast<const char*>(request) + v * MatVecSpec::kVectorBytes,
                MatVecSpec::kVectorBytes);
    double mean[kDim] = {};
    for (uint32_t pass = 0; pass < rounds; ++pass) {
      double x[kDim];
      for (uint32_t i = 0; i < kDim; ++i)
        x[i] = in[i];
      for (uint32_t layer = 0; layer < MatVecSpec::kLayers; ++layer) {
        double y[kDim];
        for (uint32_t i = 0; i < kDim; ++i) {
          y[i] = 0;
          for (uint32_t j = 0; j < kDim; ++j)
            y[i] += static_cast<double>(MatVecSpec::weight(pass, layer, i, j)) * x[j];
        }
        const bool last = layer + 1 == MatVecSpec::kLayers;
        for (uint32_t i = 0; i < kDim; ++i)
          x[i] = (last || y[i] > 0) ? y[i] : 0;
      }
      for (uint32_t i = 0; i < kDim; ++i)
        mean[i] += x[i];
    }
    for (uint32_t i = 0; i < kDim; ++i)
      out[static_cast<size_t>(v) * kDim + i] = static_cast<float>(mean[i] / rounds);
  }
  return out;
}

// Tolerance of one output: float accumulation over kLayers sums of kDim terms, with or without
// fused multiply-adds, stays far inside it for inputs in [-1, 1]. In float: near the tolerance
// the difference of two floats is exact, so double would decide nothing differently, and float
// vectorizes twice as wide. A NaN is never close.
inline bool matvec_close(float got, float want) {
  return std::fabs(got - want) <= 1e-4f * (1.0f + std::fabs(want));
}

// Empty when `reply` (`reply_size` bytes) is the answer `expected` describes; otherwise what
// is wrong and where.
inline std::string matvec_check(const void* reply, uint32_t reply_size,
                                const std::vector<float>& expected) {
  const size_t want_bytes = expected.size() * sizeof(float);
  if (reply_size != want_bytes) {
    return "reply is " + std::to_string(reply_size) + " bytes, expected " +
           std::to_string(want_bytes);
  }
  // One pass without a branch per output, which the compiler can vectorize (a load generator
  // checks every reply, 4096 outputs at 16 KiB), then the search for the first wrong output
  // only when there is one.
  const auto output = [reply](size_t i) {
    float got;
    std::memcpy(&got, static_cast<const char*>(reply) + i * sizeof(float), sizeof(float));
    return got;
  };
  uint32_t wrong = 0;
  for (size_t i = 0; i < expected.size(); ++i)
    wrong |= matvec_close(output(i), expected[i]) ? 0u : 1u;
  if (wrong == 0) return {};
  for (size_t i = 0; i < expected.size(); ++i) {
    const float got = output(i);
    if (!matvec_close(got, expected[i])) {
      return "output " + std::to_string(i) + " (vector " + std::to_string(i / MatVecSpec::kDim) +
             ") is " + std::to_string(got) + ", expected " + std::to_string(expected[i]);
    }
  }
  return {};
}

}  // namespace caracal::examples
