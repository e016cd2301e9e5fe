#include "caracal/server/framing.hpp"

#include <string_view>

namespace caracal::server {
namespace {

uint64_t read_prefix(const std::byte* p, uint32_t width, ByteOrder order) {
  uint64_t v = 0;
  for (uint32_t i = 0; i < width; ++i) {
    const uint32_t k = order == ByteOrder::kBig ? i : width - 1 - i;
    v = (v << 8) | std::to_integer<uint64_t>(p[k]);
  }
  return v;
}

uint64_t prefix_limit(uint32_t width) {
  return width >= 8 ? UINT64_MAX : (uint64_t{1} << (8 * width)) - 1;
}

}  // namespace

Result<Codec> Codec::make(const FramingConfig& c) {
  if (c.max_message_bytes == 0) {
    return invalid_argument("framing: max_message_bytes must be at least 1");
  }
  switch (c.kind) {
    case FramingKind::kFixed:
      if (c.fixed_bytes == 0 || c.fixed_bytes > c.max_message_bytes) {
        return invalid_argument("framing: fixed size " + std::to_string(c.fixed_bytes) +
                                " must be between 1 and max_message_bytes (" +
                                std::to_string(c.max_message_bytes) + ")");
      }
      break;
    case FramingKind::kLengthPrefixed:
      if (c.prefix_bytes != 1 && c.prefix_bytes != 2 && c.prefix_bytes != 4 &&
          c.prefix_bytes != 8) {
        return invalid_argument("framing: length prefix of " + std::to_string(c.prefix_bytes) +
                                " bytes; must be 1, 2, 4 or 8");
      }
      break;
    case FramingKind::kLine:
      if (c.delimiter.empty()) return invalid_argument("framing: line delimiter is empty");
      break;
  }
  return Codec(c);
}

Decoded Codec::decode(std::span<const std::byte> buf) const {
  Decoded d;
  const FramingConfig& c = config_;
  switch (c.kind) {
    case FramingKind::kFixed:
      if (buf.size() >= c.fixed_bytes) {
        d.status = DecodeStatus::kMessage;
        d.payload_offset = 0;
        d.payload_bytes = c.fixed_bytes;
        d.consumed = c.fixed_bytes;
      }
      return d;

    case FramingKind::kLengthPrefixed: {
      if (buf.size() < c.prefix_bytes) return d;
      uint64_t length = read_prefix(buf.data(), c.prefix_bytes, c.byte_order);
      if (c.prefix_counts_itself) {
        if (length < c.prefix_bytes) {
          d.status = DecodeStatus::kMalformed;
          d.error = "length prefix " + std::to_string(length) + " is smaller than the " +
                    std::to_string(c.prefix_bytes) + "-byte prefix it includes";
          return d;
        }
        length -= c.prefix_bytes;
      }
      if (length > c.max_message_bytes) {
        d.status = DecodeStatus::kMalformed;
        d.error = "length prefix announces " + std::to_string(length) +
                  " bytes, over max_message_bytes " + std::to_string(c.max_message_bytes);
        return d;
      }
      if (buf.size() - c.prefix_bytes < length) return d;
      d.status = DecodeStatus::kMessage;
      d.payload_offset = c.prefix_bytes;
      d.payload_bytes = length;
      d.consumed = c.prefix_bytes + length;
      return d;
    }

    case FramingKind::kLine: {
      const std::string_view text(reinterpret_cast<const char*>(buf.data()), buf.size());
      const size_t end = text.find(c.delimiter);
      if (end == std::string_view::npos) {
        // No delimiter yet: malformed once more than a whole message (and a partial delimiter)
        // is buffered without one.
        if (buf.size() > c.max_message_bytes + c.delimiter.size() - 1) {
          d.status = DecodeStatus::kMalformed;
          d.error =
              "no line delimiter within max_message_bytes " + std::to_string(c.max_message_bytes);
        }
        return d;
      }
      if (end > c.max_message_bytes) {
        d.status = DecodeStatus::kMalformed;
        d.error = "line of " + std::to_string(end) + " bytes, over max_message_bytes " +
                  std::to_string(c.max_message_bytes);
        return d;
      }
      d.status = DecodeStatus::kMessage;
      d.payload_offset = 0;
      d.payload_bytes = end;
      d.consumed = end + c.delimiter.size();
      return d;
    }
  }
  return d;
}

size_t Codec::encode_header(uint64_t payload_bytes, std::byte* out) const {
  if (config_.kind != FramingKind::kLengthPrefixed) return 0;
  const uint32_t width = config_.prefix_bytes;
  const uint64_t v = payload_bytes + (config_.prefix_counts_itself ? width : 0);
  for (uint32_t i = 0; i < width; ++i) {
    const uint32_t shift = 8 * (width - 1 - i);
    const uint32_t k = config_.byte_order == ByteOrder::kBig ? i : width - 1 - i;
    out[k] = static_cast<std::byte>((v >> shift) & 0xFF);
  }
  return width;
}

std::span<const std::byte> Codec::trailer() const {
  if (config_.kind != FramingKind::kLine) return {};
  return std::as_bytes(std::span<const char>(config_.delimiter.data(), config_.delimiter.size()));
}

bool Codec::can_frame(uint64_t payload_bytes) const {
  switch (config_.kind) {
    case FramingKind::kFixed:
      return payload_bytes == config_.fixed_bytes;
    case FramingKind::kLengthPrefixed:
      return payload_bytes + (config_.prefix_counts_itself ? config_.prefix_bytes : 0) <=
             prefix_limit(config_.prefix_bytes);
    case FramingKind::kLine:
      return true;
  }
  return false;
}

}  // namespace caracal::server
