// What the fuzz targets share: a check that stops the run with a message (libFuzzer keeps the
// input that failed it; the replay driver stops at it), and a reader of the fuzz input that
// takes fixed-width values off its front and never fails (missing bytes read as zeros).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

// A property every input must keep; on failure prints where and why, then aborts.
#define CARACAL_FUZZ_CHECK(cond, ...)                                                    \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                 \
      std::fprintf(stderr, "\n");                                                        \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace caracal::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // The next `n` bytes (fewer at the end) as an unsigned little-endian value.
  uint64_t take(size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n && pos_ < size_; ++i, ++pos_) {
      v |= uint64_t{data_[pos_]} << (8 * i);
    }
    return v;
  }
  uint8_t u8() { return static_cast<uint8_t>(take(1)); }
  uint16_t u16() { return static_cast<uint16_t>(take(2)); }
  uint32_t u32() { return static_cast<uint32_t>(take(4)); }
  uint64_t u64() { return take(8); }
  // Up to `n` bytes as they are.
  std::span<const std::byte> bytes(size_t n) {
    const size_t k = n < size_ - pos_ ? n : size_ - pos_;
    const auto* p = reinterpret_cast<const std::byte*>(data_ + pos_);
    pos_ += k;
    return {p, k};
  }
  std::span<const std::byte> rest() { return bytes(size_ - pos_); }
  bool empty() const { return pos_ == size_; }
  size_t left() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

inline std::string_view as_text(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

}  // namespace caracal::fuzz
