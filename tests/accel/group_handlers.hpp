// Handlers that split their work over their group and combine it with the group collectives
// (Group::sum, exclusive_sum, broadcast, ...): run by the group harness on the CPU
// (group_harness_test.cpp) and on a GPU (gpu_group_harness_test.cu), with the same expected
// replies. Host/device code.
#pragma once

#include <cstdint>

#include "caracal/accel/handler.hpp"

namespace caracal::accel::test {

// The request without its spaces. Rank r keeps the non-space bytes of its own contiguous
// chunk; exclusive_sum says where its bytes go, sum how many there are in all.
template <Granularity G, uint32_t kThreads = 0>
struct Compact {
  static constexpr Granularity kGranularity = G;
  CARACAL_HOST_DEVICE void operator()(const Request& req, Response& resp, Context& ctx) const {
    const Group& g = ctx.group();
    const uint32_t chunk = (req.size + g.size() - 1) / g.size();
    const uint32_t begin = g.rank() * chunk < req.size ? g.rank() * chunk : req.size;
    const uint32_t end = begin + chunk < req.size ? begin + chunk : req.size;
    uint32_t kept = 0;
    for (uint32_t i = begin; i < end; ++i)
      kept += req.data[i] != std::byte{' '} ? 1 : 0;
    uint32_t at = g.exclusive_sum(kept);
    const uint32_t total = g.sum(kept);
    for (uint32_t i = begin; i < end; ++i) {
      if (req.data[i] != std::byte{' '}) resp.data[at++] = req.data[i];
    }
    if (g.leader()) resp.size = total;
  }
};
template <>
struct Compact<Granularity::kBlock, 64> {
  static constexpr Granularity kGranularity = Granularity::kBlock;
  static constexpr uint32_t kBlockThreads = 64;
  CARACAL_HOST_DEVICE void operator()(const Request& req, Response& resp, Context& ctx) const {
    Compact<Granularity::kBlock>{}(req, resp, ctx);
  }
};

// Figures of the request's bytes, each rank taking every size()-th byte: their sum, largest
// and smallest, whether any is 'z' and all are printable, and rank 5's count (broadcast).
// The reply: seven little-endian uint64 values.
template <Granularity G>
struct Figures {
  static constexpr Granularity kGranularity = G;
  CARACAL_HOST_DEVICE void operator()(const Request& req, Response& resp, Context& ctx) const {
    const Group& g = ctx.group();
    uint64_t sum = 0;
    uint32_t high = 0;
    uint32_t low = 255;
    bool z = false;
    bool printable = true;
    uint32_t mine = 0;
    for (uint32_t i = g.rank(); i < req.size; i += g.size()) {
      const auto b = static_cast<uint32_t>(req.data[i]);
      sum += b;
      high = b > high ? b : high;
      low = b < low ? b : low;
      z = z || b == 'z';
      printable = printable && b >= 0x20 && b < 0x7f;
      ++mine;
    }
    const uint64_t out[7] = {g.sum(sum),
                             g.max(high),
                             g.min(low),
                             g.any(z) ? 1u : 0u,
                             g.all(printable) ? 1u : 0u,
                             g.broadcast(uint64_t{mine}, g.size() > 5 ? 5 : 0),
                             static_cast<uint64_t>(g.sum(1.0f * mine))};
    if (!g.leader()) return;
    for (uint32_t k = 0; k < 7; ++k) {
      for (uint32_t b = 0; b < 8; ++b)
        resp.data[8 * k + b] = static_cast<std::byte>((out[k] >> (8 * b)) & 0xff);
    }
    resp.size = 56;
  }
};

// Batched: each request's byte sum over a warp, as 8 little-endian bytes.
struct BatchSums {
  static constexpr Granularity kGranularity = Granularity::kWarp;
  static constexpr uint32_t kBatch = 4;
  CARACAL_HOST_DEVICE void operator()(const Request* reqs, Response* resps, uint32_t count,
                                      Context& ctx) const {
    const Group& g = ctx.group();
    for (uint32_t r = 0; r < count; ++r) {
      uint64_t sum = 0;
      for (uint32_t i = g.rank(); i < reqs[r].size; i += g.size())
        sum += static_cast<uint32_t>(reqs[r].data[i]);
      sum = g.sum(sum);
      if (!g.leader()) continue;
      for (uint32_t b = 0; b < 8; ++b)
        resps[r].data[b] = static_cast<std::byte>((sum >> (8 * b)) & 0xff);
      resps[r].size = 8;
    }
  }
};

}  // namespace caracal::accel::test
