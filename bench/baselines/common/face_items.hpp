// Face verification in the baseline servers: they fetch each request's reference from memcached
// themselves (face_fetch.hpp) and then answer it with the handler's own functions
// (examples/face_verify/face_verify.hpp: answer_fetched). The host-centric server sends the GPU
// an item per request, the request and what its fetch gave (host and device code, no Asio):
//
//   offset 0  u32 fetched        face::Fetched
//   offset 4  u32 value_bytes    the stored value's length (kFound), else 0
//   offset 8  u32 request_bytes
//   offset 12 u32 reserved
//   offset 16 the request, then zeros to a multiple of 16, then the value
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "caracal/accel/handler.hpp"
#include "face_verify.hpp"

namespace caracal::bench::baseline {

inline constexpr uint32_t kFaceItemHeaderBytes = 16;

// The item of `request` and what its fetch gave (`value`: kFound only), into `out` (resized).
inline void make_face_item(const std::byte* request, uint32_t request_bytes,
                           examples::face::Fetched fetched, const uint8_t* value,
                           uint32_t value_bytes, std::vector<std::byte>& out) {
  if (fetched != examples::face::Fetched::kFound) value_bytes = 0;
  const uint32_t padded = (request_bytes + 15) & ~15u;
  out.assign(kFaceItemHeaderBytes + padded + value_bytes, std::byte{0});
  examples::face::store_u32(out.data(), static_cast<uint32_t>(fetched));
  examples::face::store_u32(out.data() + 4, value_bytes);
  examples::face::store_u32(out.data() + 8, request_bytes);
  std::memcpy(out.data() + kFaceItemHeaderBytes, request, request_bytes);
  if (value_bytes != 0) std::memcpy(out.data() + kFaceItemHeaderBytes + padded, value, value_bytes);
}

// The host-centric server's GPU handler: one item, a block of 64 threads (a thread per cell).
struct FaceItemHandler {
  static constexpr accel::Granularity kGranularity = accel::Granularity::kBlock;
  static constexpr uint32_t kBlockThreads = 64;
  static constexpr uint32_t kMaxResponseBytes = examples::face::kMaxReplyBytes;

  CARACAL_HOST_DEVICE void operator()(const accel::Request& req, accel::Response& resp,
                                      accel::Context& ctx) const {
    namespace face = examples::face;
#if defined(__CUDA_ARCH__)
    __shared__ uint8_t histograms[face::kHistogramBytes];
    __shared__ uint64_t partial[32];
#else
    thread_local uint8_t histograms[face::kHistogramBytes];
    uint64_t* partial = nullptr;
#endif
    const uint32_t request_bytes = face::load_u32(req.data + 8);
    const uint32_t padded = (request_bytes + 15) & ~15u;
    face::answer_fetched(ctx.group(), req.data + kFaceItemHeaderBytes, request_bytes,
                         static_cast<face::Fetched>(face::load_u32(req.data)),
                         reinterpret_cast<const uint8_t*>(req.data) + kFaceItemHeaderBytes + padded,
                         face::load_u32(req.data + 4), histograms, partial, resp);
  }
};

}  // namespace caracal::bench::baseline
