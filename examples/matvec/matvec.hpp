// The compute handler: a small dense network applied to every 16-float vector of a request.
// Host/device code, so the same type runs on the CPU accelerator, in the GPU's persistent
// kernel and in the baseline servers under bench/baselines.
//
// Request: n vectors of kDim = 16 floats (IEEE 754 binary32, little-endian: the byte order of
// every host and GPU Caracal runs on), n >= 1, so 64 bytes per vector: a 64-byte request is one
// vector, 1 KiB sixteen, 16 KiB 256. More bytes mean proportionally more work.
// Reply: n vectors, y = W4 relu(W3 relu(W2 relu(W1 x))) for each x, in request order.
// A request whose size is not a nonzero multiple of 64 bytes gets an error reply.
//
// The weights are not stored: W_l[i][j] is a hash of (seed, l, i, j) scaled to [-0.25, 0.25),
// so the network is the same everywhere without a table in device memory, and every call costs
// kLayers * kDim * kDim multiply-adds plus as many hashes per vector. The reference
// (matvec_reference.hpp) computes the same network in double precision for tests and loadgen.
//
// Two settings of the handler object (the agent's `--rounds` and `--delay-us`, the baselines'
// `--matvec-rounds`), both 1 and 0 by default, which is the network above:
//  - rounds: y is the mean of `rounds` such networks, network p with the weights of pass p
//    (pass 0's are the ones above), so a request costs `rounds` times the work of one and its
//    answer changes with it: whoever checks replies must use the same rounds. The passes are
//    independent (each starts from x), so float error does not grow with their number.
//  - delay_ns: every request takes at least this much longer, by a wait on the accelerator's
//    clock before the work (a spin on a GPU, a sleep on the CPU), and its answer does not
//    change: an accelerator made slower on purpose, for dispatch across unequal agents.
#pragma once

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <chrono>
#include <thread>
#endif

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/platform.hpp"

namespace caracal::examples {

struct MatVecSpec {
  static constexpr uint32_t kDim = 16;
  static constexpr uint32_t kLayers = 4;
  static constexpr uint32_t kVectorBytes = kDim * sizeof(float);
  static constexpr uint32_t kSeed = 0x5eed1234u;

  static constexpr uint32_t kMaxRounds = 1u << 16;

  // W_layer[row][col] of pass `pass`, in [-0.25, 0.25): 24 bits of a hash of the position.
  CARACAL_INLINE static float weight(uint32_t pass, uint32_t layer, uint32_t row, uint32_t col) {
    uint32_t h = kSeed ^ (((pass * kLayers + layer) * kDim + row) * kDim + col) * 0x9E3779B1u;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return static_cast<float>(h >> 8) * (1.0f / 16777216.0f) * 0.5f - 0.25f;
  }

  // Waits at least `ns` nanoseconds: on a GPU by spinning on its global timer (the thread
  // holds its warp slot, as a slower handler would), on the CPU by sleeping.
  CARACAL_INLINE static void wait_ns(uint32_t ns) {
#if defined(__CUDA_ARCH__)
    uint64_t start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (;;) {
      uint64_t now;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - start >= ns) break;
    }
#else
    std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
#endif
  }
};

struct MatVec {
  // A warp per request on a GPU (its threads take vectors in turn); one thread on the CPU.
  static constexpr accel::Granularity kGranularity = accel::Granularity::kWarp;

  uint32_t rounds = 1;    // networks averaged per vector, 1 to MatVecSpec::kMaxRounds
  uint32_t delay_ns = 0;  // added to every request

  CARACAL_HOST_DEVICE void operator()(const accel::Request& req, accel::Response& resp,
                                      accel::Context& ctx) const {
    constexpr uint32_t kDim = MatVecSpec::kDim;
    constexpr uint32_t kBytes = MatVecSpec::kVectorBytes;
    if (req.size == 0 || req.size % kBytes != 0) {
      if (ctx.group().leader())
        resp.set_error("matvec: request must be a nonzero multiple of 64 bytes");
      return;
    }
    if (resp.capacity < req.size) {
      if (ctx.group().leader()) resp.set_error("matvec: reply does not fit the response");
      return;
    }
    if (rounds == 0 || rounds > MatVecSpec::kMaxRounds) {
      if (ctx.group().leader()) resp.set_error("matvec: rounds out of range");
      return;
    }
    if (delay_ns != 0) MatVecSpec::wait_ns(delay_ns);
    const uint32_t vectors = req.size / kBytes;
    for (uint32_t v = ctx.group().rank(); v < vectors; v += ctx.group().size()) {
      // 16-byte aligned, so the copies from and to the rings move 16 bytes per access (ring
      // payloads are 16-byte aligned): four reads and four writes across PCIe per vector,
      // not 64 of each.
      alignas(16) float in[kDim];
      alignas(16) float out[kDim];
      accel::copy_bytes(in, req.data + v * kBytes, kBytes);
      for (uint32_t i = 0; i < kDim; ++i)
        out[i] = 0.0f;
      for (uint32_t pass = 0; pass < rounds; ++pass) {
        float x[kDim];
        float y[kDim];
        for (uint32_t i = 0; i < kDim; ++i)
          x[i] = in[i];
        for (uint32_t layer = 0; layer < MatVecSpec::kLayers; ++layer) {
          for (uint32_t i = 0; i < kDim; ++i) {
            float sum = 0.0f;
            for (uint32_t j = 0; j < kDim; ++j)
              sum += MatVecSpec::weight(pass, layer, i, j) * x[j];
            y[i] = sum;
          }
          const bool last = layer + 1 == MatVecSpec::kLayers;
          for (uint32_t i = 0; i < kDim; ++i)
            x[i] = (last || y[i] > 0.0f) ? y[i] : 0.0f;
        }
        for (uint32_t i = 0; i < kDim; ++i)
          out[i] += x[i];  // exact for one pass: 0 + x
      }
      if (rounds > 1) {
        const float scale = 1.0f / static_cast<float>(rounds);
        for (uint32_t i = 0; i < kDim; ++i)
          out[i] *= scale;
      }
      accel::copy_bytes(resp.data + v * kBytes, out, kBytes);
    }
    ctx.group().sync();
    resp.size = req.size;
  }
};

}  // namespace caracal::examples
