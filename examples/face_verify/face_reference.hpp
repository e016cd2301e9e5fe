// The CPU reference of face verification (face_format.hpp, face_verify.hpp), written apart from
// the handler's code as plainly as possible: the uniform patterns from a table built by
// enumerating runs, the histograms and the distance with their own loops. The tests and
// caracal_loadgen check every reply against it.
//
// Also the synthetic face set that caracal_face_loader stores and the load generator sends: a
// person's face is a deterministic function of (seed, person id) in integer arithmetic (a
// background level, soft blobs, a striped texture), so every machine makes the same pixels;
// variant 0 is the enrolled image whose histograms are stored, and variants 1, 2, ... are later
// captures of the same face (brighter or darker, with noise).
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "face_format.hpp"

namespace caracal::examples::face {

inline constexpr uint64_t kDefaultSeed = 0x5eedface;
inline constexpr uint32_t kDefaultPersons = 1000;

using Image = std::array<uint8_t, kImageBytes>;

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Person `person`'s face as captured the `variant`-th time (0: the enrolled image).
inline Image synthetic_face(uint64_t seed, uint32_t person, uint32_t variant) {
  uint64_t state = splitmix64(seed ^ (uint64_t{person} * 0xD1B54A32D192ED03ull));
  auto next = [&state](uint32_t range) {
    state = splitmix64(state);
    return static_cast<int32_t>(state % range);
  };
  const int32_t level = 60 + next(80);
  struct Blob {
    int32_t cx, cy, r2, amp;
  };
  std::array<Blob, 7> blobs{};
  for (Blob& b : blobs) {
    const int32_t r = 5 + next(16);
    b = {4 + next(56), 4 + next(56), r * r, next(201) - 100};
  }
  const int32_t fx = 1 + next(6), fy = 1 + next(6), stripes = 16 + next(48), phase = next(64);
  // A later capture: another exposure, sensor noise.
  int32_t exposure = 0;
  uint64_t noise = 0;
  if (variant != 0) {
    uint64_t v = splitmix64(state ^ variant);
    exposure = static_cast<int32_t>((v >> 16) % 41) - 20;
    noise = splitmix64(v);
  }
  Image image{};
  for (int32_t y = 0; y < static_cast<int32_t>(kImageSide); ++y) {
    for (int32_t x = 0; x < static_cast<int32_t>(kImageSide); ++x) {
      const int32_t sx = x, sy = y;
      int32_t v = level;
      for (const Blob& b : blobs) {
        const int32_t d2 = (sx - b.cx) * (sx - b.cx) + (sy - b.cy) * (sy - b.cy);
        if (d2 < b.r2) v += b.amp * (b.r2 - d2) / b.r2;
      }
      const int32_t t = ((sx * fx + sy * fy) * 4 + phase) & 63;
      v += stripes * ((t < 32 ? t : 63 - t) - 16) / 16;
      if (variant != 0) {
        v += exposure;
        v += static_cast<int32_t>(splitmix64(noise ^ static_cast<uint64_t>(y * 64 + x)) % 3) - 1;
      }
      image[static_cast<size_t>(y) * kImageSide + x] =
          static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
  }
  return image;
}

// Bin of every 8-bit pattern, built by enumerating the uniform ones in bin order.
inline std::array<uint8_t, 256> reference_bins() {
  std::array<uint8_t, 256> bins;
  bins.fill(58);
  bins[0x00] = 0;
  for (uint32_t ones = 1; ones <= 7; ++ones) {
    for (uint32_t start = 0; start < 8; ++start) {
      uint32_t code = 0;
      for (uint32_t k = 0; k < ones; ++k)
        code |= 1u << ((start + k) % 8);
      bins[code] = static_cast<uint8_t>(1 + (ones - 1) * 8 + start);
    }
  }
  bins[0xFF] = 57;
  return bins;
}

// Histograms of every cell of `image`, [cell][bin].
inline std::vector<uint8_t> reference_histograms(const uint8_t* image) {
  static const std::array<uint8_t, 256> bins = reference_bins();
  const auto at = [image](int32_t x, int32_t y) {
    const int32_t last = static_cast<int32_t>(kImageSide) - 1;
    x = x < 0 ? 0 : (x > last ? last : x);
    y = y < 0 ? 0 : (y > last ? last : y);
    return image[static_cast<size_t>(y) * kImageSide + x];
  };
  // Neighbour k, clockwise from the top-left.
  static constexpr int32_t kDx[8] = {-1, 0, 1, 1, 1, 0, -1, -1};
  static constexpr int32_t kDy[8] = {-1, -1, -1, 0, 1, 1, 1, 0};
  std::vector<uint8_t> out(kHistogramBytes, 0);
  for (int32_t y = 0; y < static_cast<int32_t>(kImageSide); ++y) {
    for (int32_t x = 0; x < static_cast<int32_t>(kImageSide); ++x) {
      uint32_t code = 0;
      for (uint32_t k = 0; k < 8; ++k) {
        if (at(x + kDx[k], y + kDy[k]) >= at(x, y)) code |= 1u << k;
      }
      const uint32_t cell = (y / kCellSide) * kCellsPerSide + x / kCellSide;
      ++out[cell * kBins + bins[code]];
    }
  }
  return out;
}

inline uint64_t reference_distance(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  uint64_t sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t total = int64_t{a[i]} + b[i];
    if (total == 0) continue;
    const int64_t d = int64_t{a[i]} - b[i];
    sum += static_cast<uint64_t>((d * d * 65536) / total);
  }
  return sum;
}

inline uint32_t reference_checksum(uint32_t person_id, const uint8_t* histograms) {
  uint32_t sum = checksum_of_id(person_id);
  for (uint32_t i = 0; i < kHistogramWords; ++i) {
    uint32_t word;
    std::memcpy(&word, histograms + 4 * i, 4);
    sum += checksum_term(word, i);
  }
  return sum;
}

// The value stored for person_id (face_format.hpp).
inline std::vector<uint8_t> encode_reference(uint32_t person_id,
                                             const std::vector<uint8_t>& histograms) {
  std::vector<uint8_t> v(kReferenceBytes);
  store_u32(v.data(), kReferenceMagic);
  store_u16(v.data() + 4, kReferenceVersion);
  store_u16(v.data() + 6, kReferenceHeaderBytes);
  store_u16(v.data() + 8, kCells);
  store_u16(v.data() + 10, kBins);
  store_u32(v.data() + 12, person_id);
  store_u32(v.data() + 16, kHistogramBytes);
  store_u32(v.data() + 20, reference_checksum(person_id, histograms.data()));
  std::memcpy(v.data() + kReferenceHeaderBytes, histograms.data(), kHistogramBytes);
  return v;
}

inline std::vector<uint8_t> encode_request(uint32_t person_id, const Image& image) {
  std::vector<uint8_t> r(kRequestBytes);
  store_u32(r.data(), kRequestMagic);
  store_u32(r.data() + 4, person_id);
  std::memcpy(r.data() + kRequestHeaderBytes, image.data(), kImageBytes);
  return r;
}

// What a reply must say.
struct Expected {
  ReplyStatus status = ReplyStatus::kMatch;
  uint32_t person_id = 0;
  uint64_t distance = 0;  // kMatch and kNoMatch
};

// The answer to "is `image` person_id?" when the store holds `reference` (histograms) for
// them, or nothing (nullptr).
inline Expected reference_answer(uint32_t person_id, const uint8_t* image,
                                 const std::vector<uint8_t>* reference) {
  if (reference == nullptr) return {ReplyStatus::kUnknownPerson, person_id, 0};
  const uint64_t d = reference_distance(reference_histograms(image), *reference);
  return {d <= kMatchThreshold ? ReplyStatus::kMatch : ReplyStatus::kNoMatch, person_id, d};
}

inline const char* status_name(ReplyStatus s) {
  switch (s) {
    case ReplyStatus::kMatch:
      return "match";
    case ReplyStatus::kNoMatch:
      return "no_match";
    case ReplyStatus::kUnknownPerson:
      return "unknown_person";
    case ReplyStatus::kStoreUnavailable:
      return "store_unavailable";
    case ReplyStatus::kCorruptReference:
      return "corrupt_reference";
    case ReplyStatus::kBadRequest:
      return "bad_request";
  }
  return "?";
}

// A reply decoded; `error` says what is malformed about it (empty when it is well formed).
struct Decoded {
  ReplyStatus status = ReplyStatus::kBadRequest;
  uint32_t person_id = 0;
  uint64_t distance = 0;
  std::string reason;
  std::string error;
};

inline Decoded decode_reply(const void* reply, uint32_t size) {
  Decoded d;
  const auto* b = static_cast<const uint8_t*>(reply);
  if (size < kReplyHeaderBytes) {
    d.error = "reply is " + std::to_string(size) + " bytes, shorter than its 24-byte header";
    return d;
  }
  if (load_u32(b) != kReplyMagic) {
    d.error = "reply has a bad magic number";
    return d;
  }
  const uint16_t status = load_u16(b + 4);
  if (status > static_cast<uint16_t>(ReplyStatus::kBadRequest)) {
    d.error = "reply has an unknown status " + std::to_string(status);
    return d;
  }
  d.status = static_cast<ReplyStatus>(status);
  const uint32_t reason = load_u16(b + 6);
  if (size != kReplyHeaderBytes + reason) {
    d.error = "reply is " + std::to_string(size) + " bytes, its header says " +
              std::to_string(kReplyHeaderBytes + reason);
    return d;
  }
  d.person_id = load_u32(b + 8);
  d.distance = uint64_t{load_u32(b + 16)} | uint64_t{load_u32(b + 20)} << 32;
  d.reason.assign(reinterpret_cast<const char*>(b + kReplyHeaderBytes), reason);
  return d;
}

// Empty when `reply` says what `want` says (a verdict with exactly its distance, or its error
// status with a reason); otherwise what differs.
inline std::string check_reply(const void* reply, uint32_t size, const Expected& want) {
  const Decoded d = decode_reply(reply, size);
  if (!d.error.empty()) return d.error;
  if (d.status != want.status) {
    return std::string("status ") + status_name(d.status) + (d.reason.empty() ? "" : " (") +
           d.reason + (d.reason.empty() ? "" : ")") + ", expected " + status_name(want.status);
  }
  if (d.person_id != want.person_id) {
    return "person " + std::to_string(d.person_id) + ", expected " + std::to_string(want.person_id);
  }
  const bool verdict = want.status == ReplyStatus::kMatch || want.status == ReplyStatus::kNoMatch;
  if (verdict && (d.distance != want.distance || !d.reason.empty())) {
    return "distance " + std::to_string(d.distance) + ", expected " + std::to_string(want.distance);
  }
  if (!verdict && d.reason.empty()) return "an error status without a reason";
  return {};
}

}  // namespace caracal::examples::face
