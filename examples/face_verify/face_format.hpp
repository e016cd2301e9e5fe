// Face verification: the wire formats and the arithmetic every side shares (the handler on the
// CPU and the GPU, the baseline servers, the loader, the load generator and the tests).
// Host/device code, plain data, fixed-width fields, little-endian (every host and GPU Caracal
// runs on).
//
// The method is GPUnet's face verification server, the one Lynx measured: a 64x64 8-bit
// grayscale image is cut into 8x8 cells of 8x8 pixels; each pixel gets its local binary pattern
// (LBP: 8 neighbours at radius 1, bit k set when neighbour k is at least the centre; pixels past
// the border are the nearest border pixel), and each cell a histogram of the uniform patterns
// (58 patterns with at most two 0/1 transitions around the circle, each its own bin, and one bin
// for all the others: 59 bins). Two faces are compared by the chi-square distance of their 64
// histograms, sum of (a - b)^2 / (a + b) over every bin with a + b > 0. Each term is computed in
// fixed point, floor((a - b)^2 * 2^16 / (a + b)), and summed in 64 bits: the distance is the same
// integer on every backend and in every order, so a reply is checked exactly.
//
// Request (kRequestBytes = 4104):
//   offset 0  u32 magic        kRequestMagic ("FVQ1")
//   offset 4  u32 person_id    whose reference to compare with
//   offset 8  u8  pixels[4096] row-major, row 0 first
//
// Reply (kReplyHeaderBytes = 24, then reason_bytes of text on an error status):
//   offset 0  u32 magic        kReplyMagic ("FVR1")
//   offset 4  u16 status       ReplyStatus
//   offset 6  u16 reason_bytes length of the reason text after the header (0 for a verdict)
//   offset 8  u32 person_id    from the request (0 when the request was too short to carry one)
//   offset 12 u32 reserved     0
//   offset 16 u64 distance     chi-square distance in units of 2^-16 (kMatch, kNoMatch; else 0)
//
// Stored reference (memcached key "face:<person_id>", value kReferenceBytes = 3800):
//   offset 0  u32 magic          kReferenceMagic ("FVH1")
//   offset 4  u16 version        kReferenceVersion
//   offset 6  u16 header_bytes   24
//   offset 8  u16 cells          64
//   offset 10 u16 bins           59
//   offset 12 u32 person_id      whose histogram this is
//   offset 16 u32 histogram_bytes 3776
//   offset 20 u32 checksum       reference_checksum(person_id, histogram)
//   offset 24 u8  histogram[64][59]  counts per cell (row-major cells), each 0 to 64
// A value that differs in any of these (a short or long value, another person's, a flipped byte)
// is a corrupt reference, answered as such: never compared.
#pragma once

#include <cstdint>

#include "caracal/mqueue/platform.hpp"

namespace caracal::examples::face {

inline constexpr uint32_t kImageSide = 64;
inline constexpr uint32_t kImageBytes = kImageSide * kImageSide;
inline constexpr uint32_t kCellSide = 8;
inline constexpr uint32_t kCellsPerSide = kImageSide / kCellSide;
inline constexpr uint32_t kCells = kCellsPerSide * kCellsPerSide;
inline constexpr uint32_t kBins = 59;
inline constexpr uint32_t kHistogramBytes = kCells * kBins;

inline constexpr uint32_t kRequestMagic = 0x31515646u;    // "FVQ1"
inline constexpr uint32_t kReplyMagic = 0x31525646u;      // "FVR1"
inline constexpr uint32_t kReferenceMagic = 0x31485646u;  // "FVH1"
inline constexpr uint16_t kReferenceVersion = 1;

inline constexpr uint32_t kRequestHeaderBytes = 8;
inline constexpr uint32_t kRequestBytes = kRequestHeaderBytes + kImageBytes;
inline constexpr uint32_t kReplyHeaderBytes = 24;
inline constexpr uint32_t kMaxReasonBytes = 96;
inline constexpr uint32_t kMaxReplyBytes = kReplyHeaderBytes + kMaxReasonBytes;
inline constexpr uint32_t kReferenceHeaderBytes = 24;
inline constexpr uint32_t kReferenceBytes = kReferenceHeaderBytes + kHistogramBytes;

// A distance at or below this is a match (units of 2^-16). On the synthetic face set
// (face_reference.hpp) it parts nearly all later captures of a person from other people's faces.
inline constexpr uint64_t kMatchThreshold = uint64_t{800} << 16;

enum class ReplyStatus : uint16_t {
  kMatch = 0,
  kNoMatch = 1,
  kUnknownPerson = 2,     // memcached holds no reference for the id
  kStoreUnavailable = 3,  // memcached down, slow (the server's call timed out) or unreadable
  kCorruptReference = 4,  // the stored value fails its checks
  kBadRequest = 5,        // not a face request (size, magic)
};

// The key of a person's reference: "face:<decimal id>". Writes it at `out` (room for
// kMaxKeyBytes) and returns its length.
inline constexpr uint32_t kMaxKeyBytes = 5 + 10;
CARACAL_INLINE uint32_t reference_key(uint32_t person_id, char* out) {
  out[0] = 'f';
  out[1] = 'a';
  out[2] = 'c';
  out[3] = 'e';
  out[4] = ':';
  char digits[10];
  uint32_t n = 0;
  do {
    digits[n++] = static_cast<char>('0' + person_id % 10);
    person_id /= 10;
  } while (person_id != 0);
  for (uint32_t i = 0; i < n; ++i)
    out[5 + i] = digits[n - 1 - i];
  return 5 + n;
}

CARACAL_INLINE uint32_t load_u32(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}
CARACAL_INLINE uint16_t load_u16(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  return static_cast<uint16_t>(b[0] | b[1] << 8);
}
CARACAL_INLINE void store_u32(void* p, uint32_t v) {
  auto* b = static_cast<uint8_t*>(p);
  for (uint32_t i = 0; i < 4; ++i)
    b[i] = static_cast<uint8_t>(v >> (8 * i));
}
CARACAL_INLINE void store_u16(void* p, uint16_t v) {
  auto* b = static_cast<uint8_t*>(p);
  b[0] = static_cast<uint8_t>(v);
  b[1] = static_cast<uint8_t>(v >> 8);
}
CARACAL_INLINE void store_u64(void* p, uint64_t v) {
  store_u32(p, static_cast<uint32_t>(v));
  store_u32(static_cast<uint8_t*>(p) + 4, static_cast<uint32_t>(v >> 32));
}

CARACAL_INLINE uint32_t popcount8(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__popc(v & 0xFFu));
#else
  return static_cast<uint32_t>(__builtin_popcount(v & 0xFFu));
#endif
}

// The index of the lowest set bit of `v` (not 0).
CARACAL_INLINE uint32_t lowest_bit(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__ffs(static_cast<int>(v)) - 1);
#else
  return static_cast<uint32_t>(__builtin_ctz(v));
#endif
}

// The bin of an 8-bit pattern: 0 for 0x00; 1 + (ones - 1) * 8 + start for a single run of
// `ones` (1 to 7) set bits whose first bit (going up, around the circle) is `start`; 57 for
// 0xFF; 58 for every pattern with more than two transitions.
CARACAL_INLINE uint32_t uniform_bin(uint32_t code) {
  if (code == 0) return 0;
  if (code == 0xFFu) return 57;
  const uint32_t rotated = ((code << 1) | (code >> 7)) & 0xFFu;  // bit i: code's bit i - 1
  if (popcount8(code ^ rotated) > 2) return 58;
  const uint32_t start_mask = code & ~rotated & 0xFFu;  // the set bit after a clear one
  return 1 + (popcount8(code) - 1) * 8 + lowest_bit(start_mask);
}

// Bit k of an LBP code: whether neighbour k is at least the centre.
CARACAL_INLINE uint32_t lbp_bit(uint8_t centre, uint8_t neighbour, uint32_t k) {
  return (neighbour >= centre ? 1u : 0u) << k;
}

// The LBP code of pixel (x, y) of a 64x64 image.
CARACAL_INLINE uint32_t lbp_code(const uint8_t* image, uint32_t x, uint32_t y) {
  const uint32_t xl = x == 0 ? 0 : x - 1;
  const uint32_t xr = x + 1 == kImageSide ? x : x + 1;
  const uint32_t yu = y == 0 ? 0 : y - 1;
  const uint32_t yd = y + 1 == kImageSide ? y : y + 1;
  const uint8_t c = image[y * kImageSide + x];
  // Clockwise from the top-left neighbour: bit 0 to bit 7. Written out, not a loop over an
  // array of the eight: GCC 12 miscompiles that loop under -fsanitize=bounds,shift (the
  // ASan+UBSan build), every code coming out 0x00 or 0xFF.
  return lbp_bit(c, image[yu * kImageSide + xl], 0) | lbp_bit(c, image[yu * kImageSide + x], 1) |
         lbp_bit(c, image[yu * kImageSide + xr], 2) | lbp_bit(c, image[y * kImageSide + xr], 3) |
         lbp_bit(c, image[yd * kImageSide + xr], 4) | lbp_bit(c, image[yd * kImageSide + x], 5) |
         lbp_bit(c, image[yd * kImageSide + xl], 6) | lbp_bit(c, image[y * kImageSide + xl], 7);
}

// Fills `bins` (kBins counts) with the uniform-LBP histogram of one cell.
CARACAL_INLINE void cell_histogram(const uint8_t* image, uint32_t cell, uint8_t* bins) {
  for (uint32_t b = 0; b < kBins; ++b)
    bins[b] = 0;
  const uint32_t x0 = (cell % kCellsPerSide) * kCellSide;
  const uint32_t y0 = (cell / kCellsPerSide) * kCellSide;
  for (uint32_t y = y0; y < y0 + kCellSide; ++y) {
    for (uint32_t x = x0; x < x0 + kCellSide; ++x)
      ++bins[uniform_bin(lbp_code(image, x, y))];
  }
}

// One cell's share of the distance, in units of 2^-16. A cell has kCellSide^2 = 64 pixels, so a
// bin's count is at most 64 and d^2 << 16 at most 2^28: the division is 32-bit (on a GPU a
// 64-bit one is emulated, several times the instructions).
static_assert(uint64_t{kCellSide} * kCellSide * kCellSide * kCellSide << 16 < (uint64_t{1} << 32));
CARACAL_INLINE uint64_t cell_chi_square(const uint8_t* a, const uint8_t* b) {
  // A term is at most |d| << 16 (|d| <= total), and the |d| of a cell's bins add up to at most
  // 128 (each histogram's counts add up to 64): the sum is below 2^24.
  uint32_t sum = 0;
  for (uint32_t i = 0; i < kBins; ++i) {
    const uint32_t total = uint32_t{a[i]} + b[i];
    if (total == 0) continue;
    const int32_t d = static_cast<int32_t>(a[i]) - static_cast<int32_t>(b[i]);
    sum += (static_cast<uint32_t>(d * d) << 16) / total;
  }
  return sum;
}

// The checksum's term for word `index` of the histogram (a bijection of the word for each index,
// so one changed word always changes the sum).
CARACAL_INLINE uint32_t checksum_term(uint32_t word, uint32_t index) {
  uint32_t h = word ^ (index * 0x9E3779B1u);
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  h ^= h >> 16;
  return h;
}
inline constexpr uint32_t kHistogramWords = kHistogramBytes / 4;
static_assert(kHistogramBytes % 4 == 0);

// The checksum of a reference: the person id's term plus every histogram word's, mod 2^32.
// `first` and `stride` let a group split it (each thread sums its words; the sums add up).
CARACAL_INLINE uint32_t checksum_part(const uint8_t* histogram, uint32_t first, uint32_t stride) {
  uint32_t sum = 0;
  for (uint32_t i = first; i < kHistogramWords; i += stride)
    sum += checksum_term(load_u32(histogram + 4 * i), i);
  return sum;
}
CARACAL_INLINE uint32_t checksum_of_id(uint32_t person_id) {
  return checksum_term(person_id, 0xFFFFFFFFu);
}

}  // namespace caracal::examples::face
