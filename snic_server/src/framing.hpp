// Framing of a TCP byte stream into messages, per listener: fixed size, length-prefixed
// (prefix width and byte order configurable) and line-delimited. UDP needs none: one datagram
// is one message. Destinations that speak memcached's text protocol use kMemcached: each
// message is one whole reply (a get's VALUE blocks up to END, or a single line), framing
// included, since the handler reads and writes the protocol bytes itself.
//
// A codec is stateless: decode() looks at the bytes buffered for a connection and says whether
// they start with a whole message, need more bytes, or are malformed (the connection is then
// closed with that reason, other connections unaffected; a line that is only too long can be
// skipped instead, see Decoded::skippable). Replies are framed the same way
// as requests: a prefix before, or a delimiter after, the handler's payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "caracal/core/status.hpp"

namespace caracal::server {

enum class FramingKind : uint8_t { kFixed, kLengthPrefixed, kLine, kMemcached };

enum class ByteOrder : uint8_t { kBig, kLittle };

struct FramingConfig {
  FramingKind kind = FramingKind::kLengthPrefixed;
  uint32_t fixed_bytes = 0;   // kFixed: every message is this long
  uint32_t prefix_bytes = 4;  // kLengthPrefixed: 1, 2, 4 or 8
  ByteOrder byte_order = ByteOrder::kBig;
  bool prefix_counts_itself = false;  // the length includes the prefix's own bytes
  std::string delimiter = "\n";       // kLine: ends every message (not part of the payload)
  uint32_t max_message_bytes = 0;     // largest payload; longer ones are refused (kMemcached:
                                      // the whole reply)
};

enum class DecodeStatus : uint8_t { kNeedMore, kMessage, kMalformed };

struct Decoded {
  DecodeStatus status = DecodeStatus::kNeedMore;
  size_t payload_offset = 0;  // kMessage: where the payload starts in the buffer
  size_t payload_bytes = 0;
  size_t consumed = 0;  // bytes the message took, framing included
  std::string error;    // kMalformed: what was wrong, for the log and the close reason
  // kMalformed under kLine for a line over max_message_bytes: the stream can go on after the
  // line, as memcached's does after a request it cannot take. `consumed` is then what to drop:
  // the line and its delimiter when `line_ended`, else every byte buffered but those that may
  // begin the delimiter (skip_line() finds the line's end in what comes next).
  bool skippable = false;
  bool line_ended = false;
};

// What skip_line() drops of the rest of an overlong line.
struct LineSkip {
  size_t consumed = 0;
  bool ended = false;  // the delimiter was among them: what follows is a new line
};

class Codec {
 public:
  // Checks the configuration; the error names the field.
  static Result<Codec> make(const FramingConfig& config);

  // Looks for one message at the start of `buffered`.
  Decoded decode(std::span<const std::byte> buffered) const;
  // The same, once the peer has ended its stream (EOF): under kLine, bytes after the last
  // delimiter (no more than max_message_bytes) are the last line, as line-oriented servers
  // take them (`printf word | nc -N`); the other kinds have no such message.
  Decoded decode_at_end(std::span<const std::byte> buffered) const;
  // kLine: the rest of a line decode() found overlong (skippable, not line_ended), at the start
  // of `buffered`: up to and including its delimiter, or all but the bytes that may begin one.
  LineSkip skip_line(std::span<const std::byte> buffered) const;

  // Framing bytes that go before a reply of `payload_bytes` (the prefix; none for the other
  // kinds), written to `out` (room for header_capacity()); returns how many.
  size_t encode_header(uint64_t payload_bytes, std::byte* out) const;
  // Framing bytes that go after a reply (the delimiter; none for the other kinds).
  std::span<const std::byte> trailer() const;
  static constexpr size_t header_capacity() { return 8; }

  // Appends `payload` with its framing (header before, trailer after) to `out`. The caller
  // has checked can_frame().
  void append_framed(std::string& out, std::string_view payload) const;

  // Whether a reply of this size can be framed (a fixed-size codec only frames its size; a
  // prefix only counts so far).
  bool can_frame(uint64_t payload_bytes) const;

  const FramingConfig& config() const { return config_; }

 private:
  explicit Codec(FramingConfig config) : config_(std::move(config)) {}

  FramingConfig config_;
};

}  // namespace caracal::server
