// The TCP framing codecs (snic_server/src/framing.cpp) on a byte stream from a client, or from a
// destination for the memcached reply codec. Built once per codec: CARACAL_FUZZ_FRAMING names
// the FramingKind. The first bytes of the input choose the codec's settings, the rest is the
// stream, decoded message after message as a TCP connection decodes its buffer.
//
// Besides sanitizer findings, every decode must keep what the connections rely on:
//  - a message takes at least one byte and no more than is buffered, its payload lies inside
//    what it took and is at most max_message_bytes (a memcached reply: framing included);
//  - streaming: the message's own bytes decode to the same message, and (for the first few
//    messages of an input) every shorter prefix needs more bytes: is neither a message nor
//    malformed;
//  - kNeedMore never holds more than the connection's read buffer has room for;
//  - a decoded payload framed again (append_framed) decodes to the same payload;
//  - a refusal says why;
//  - an overlong line that can be skipped (a line listener with error_reply) is dropped up to
//    and including its first delimiter, no further, and the stream decodes on after it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "framing.hpp"
#include "fuzz_check.hpp"

namespace {

using caracal::server::ByteOrder;
using caracal::server::Codec;
using caracal::server::Decoded;
using caracal::server::DecodeStatus;
using caracal::server::FramingConfig;
using caracal::server::FramingKind;
using Bytes = std::span<const std::byte>;

constexpr FramingKind kKind = FramingKind::CARACAL_FUZZ_FRAMING;
// Decoded messages per input at most: enough to walk a pipelined stream, bounded in time.
constexpr int kMaxMessages = 4096;
// Messages of an input whose prefixes are all decoded too (the costly check).
constexpr int kPrefixChecked = 4;

FramingConfig config_from(caracal::fuzz::Input& in) {
  FramingConfig c;
  c.kind = kKind;
  c.max_message_bytes = 1 + in.u16();
  switch (kKind) {
    case FramingKind::kFixed:
      c.fixed_bytes = 1 + in.u16() % c.max_message_bytes;
      break;
    case FramingKind::kLengthPrefixed: {
      const uint8_t b = in.u8();
      static constexpr uint32_t kWidths[] = {1, 2, 4, 8};
      c.prefix_bytes = kWidths[b & 3];
      c.byte_order = (b & 4) != 0 ? ByteOrder::kLittle : ByteOrder::kBig;
      c.prefix_counts_itself = (b & 8) != 0;
      break;
    }
    case FramingKind::kLine: {
      const size_t n = 1 + in.u8() % 4;
      c.delimiter = std::string(caracal::fuzz::as_text(in.bytes(n)));
      if (c.delimiter.empty()) c.delimiter = "\n";
      break;
    }
    case FramingKind::kMemcached:
      break;
  }
  return c;
}

bool same(const Decoded& a, const Decoded& b) {
  return a.status == b.status && a.payload_offset == b.payload_offset &&
         a.payload_bytes == b.payload_bytes && a.consumed == b.consumed;
}

// Dropping `consumed` bytes of an overlong line at the front of `buf`: through its first
// delimiter when `ended`, else none of the delimiter (the bytes kept may begin one).
void check_skip(const FramingConfig& c, Bytes buf, size_t consumed, bool ended) {
  const std::string_view text = caracal::fuzz::as_text(buf);
  const size_t end = text.find(c.delimiter);
  if (ended) {
    CARACAL_FUZZ_CHECK(end != std::string_view::npos && consumed == end + c.delimiter.size(),
                       "skipped %zu bytes, the first delimiter ends at %zu", consumed,
                       end == std::string_view::npos ? 0 : end + c.delimiter.size());
  } else {
    CARACAL_FUZZ_CHECK(end == std::string_view::npos, "skipping on past a delimiter at %zu", end);
    CARACAL_FUZZ_CHECK(consumed <= buf.size() && buf.size() - consumed < c.delimiter.size(),
                       "skipped %zu of %zu bytes, keeping more than a delimiter's start", consumed,
                       buf.size());
  }
}

// What one decode at the front of `buf` must keep whatever it says.
void check_decode(const Codec& codec, Bytes buf, const Decoded& d, bool prefixes) {
  const FramingConfig& c = codec.config();
  switch (d.status) {
    case DecodeStatus::kNeedMore: {
      // The connection's read buffer (front/tcp.cpp) holds max_message_bytes plus the framing
      // around one message; a codec that waits for more than that would wedge the connection.
      const size_t room = size_t{c.max_message_bytes} + Codec::header_capacity() +
                          (kKind == FramingKind::kLine ? c.delimiter.size() : 0);
      CARACAL_FUZZ_CHECK(buf.size() <= room, "waits for more with %zu bytes buffered (max %u)",
                         buf.size(), c.max_message_bytes);
      return;
    }
    case DecodeStatus::kMalformed:
      CARACAL_FUZZ_CHECK(!d.error.empty(), "malformed without a reason");
      CARACAL_FUZZ_CHECK(!d.skippable || kKind == FramingKind::kLine, "skippable but not a line");
      if (d.skippable) {
        CARACAL_FUZZ_CHECK(d.consumed > 0 && d.consumed <= buf.size(), "skips %zu of %zu",
                           d.consumed, buf.size());
        check_skip(c, buf, d.consumed, d.line_ended);
      }
      return;
    case DecodeStatus::kMessage:
      break;
  }
  CARACAL_FUZZ_CHECK(d.consumed > 0 && d.consumed <= buf.size(), "consumed %zu of %zu", d.consumed,
                     buf.size());
  CARACAL_FUZZ_CHECK(d.payload_offset + d.payload_bytes <= d.consumed,
                     "payload [%zu, +%zu) outside the %zu bytes taken", d.payload_offset,
                     d.payload_bytes, d.consumed);
  if (kKind == FramingKind::kMemcached) {
    CARACAL_FUZZ_CHECK(d.payload_offset == 0 && d.payload_bytes == d.consumed,
                       "a memcached reply is its own payload");
    CARACAL_FUZZ_CHECK(d.consumed <= c.max_message_bytes, "reply of %zu bytes over max %u",
                       d.consumed, c.max_message_bytes);
    const std::string_view text = caracal::fuzz::as_text(buf.first(d.consumed));
    CARACAL_FUZZ_CHECK(text.ends_with("\r\n"), "reply does not end in \\r\\n");
  } else {
    CARACAL_FUZZ_CHECK(d.payload_bytes <= c.max_message_bytes, "payload %zu over max %u",
                       d.payload_bytes, c.max_message_bytes);
  }
  if (kKind == FramingKind::kLine) {
    const std::string_view text = caracal::fuzz::as_text(buf);
    CARACAL_FUZZ_CHECK(text.substr(0, d.payload_bytes).find(c.delimiter) == std::string::npos,
                       "line payload holds its delimiter");
    CARACAL_FUZZ_CHECK(text.substr(d.payload_bytes, d.consumed - d.payload_bytes) == c.delimiter,
                       "line does not end in its delimiter");
  }

  // Streaming: the message's bytes alone are the same message, and any shorter prefix needs
  // more (all prefixes of short messages, an even sample of long ones, and the last few).
  CARACAL_FUZZ_CHECK(same(codec.decode(buf.first(d.consumed)), d),
                     "the message's own %zu bytes decode differently", d.consumed);
  const size_t step = d.consumed <= 256 ? 1 : d.consumed / 64;
  for (size_t n = 0; prefixes && n < d.consumed; n += (d.consumed - n <= 8 ? 1 : step)) {
    const Decoded p = codec.decode(buf.first(n));
    CARACAL_FUZZ_CHECK(p.status == DecodeStatus::kNeedMore,
                       "a %zu-byte prefix of a %zu-byte message is %s", n, d.consumed,
                       p.status == DecodeStatus::kMessage ? "a message" : "malformed");
  }

  // Framed again, the payload is the same message (what the server sends back is framed so).
  if (kKind != FramingKind::kMemcached) {
    const std::string_view payload =
        caracal::fuzz::as_text(buf.subspan(d.payload_offset, d.payload_bytes));
    CARACAL_FUZZ_CHECK(codec.can_frame(payload.size()), "cannot frame a decoded payload of %zu",
                       payload.size());
    std::string framed;
    codec.append_framed(framed, payload);
    const Decoded again =
        codec.decode(Bytes(reinterpret_cast<const std::byte*>(framed.data()), framed.size()));
    CARACAL_FUZZ_CHECK(again.status == DecodeStatus::kMessage && again.consumed == framed.size() &&
                           again.payload_bytes == payload.size() &&
                           framed.compare(again.payload_offset, again.payload_bytes, payload) == 0,
                       "a framed %zu-byte payload does not decode to itself", payload.size());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  caracal::fuzz::Input in(data, size);
  const FramingConfig config = config_from(in);
  caracal::Result<Codec> codec = Codec::make(config);
  CARACAL_FUZZ_CHECK(codec.ok(), "settings the harness made are refused: %s",
                     codec.status().message().c_str());
  const Bytes stream = in.rest();
  size_t begin = 0;
  for (int i = 0; i < kMaxMessages; ++i) {
    const Bytes buf = stream.subspan(begin);
    const Decoded d = codec->decode(buf);
    check_decode(*codec, buf, d, i < kPrefixChecked);
    if (d.skippable) {
      // As a line listener with error_reply goes on: past the line, then decoding again.
      begin += d.consumed;
      bool ended = d.line_ended;
      while (!ended) {
        const Bytes rest = stream.subspan(begin);
        const caracal::server::LineSkip skip = codec->skip_line(rest);
        check_skip(config, rest, skip.consumed, skip.ended);
        if (!skip.ended && skip.consumed == 0) break;  // the stream ends inside the line
        begin += skip.consumed;
        ended = skip.ended;
      }
      if (!ended) break;
      continue;
    }
    if (d.status != DecodeStatus::kMessage) {
      // Where the stream ends here: what decode_at_end takes as the last message lies within
      // what is buffered and within max_message_bytes, and a whole message is decode's.
      const Decoded e = codec->decode_at_end(buf);
      if (e.status == DecodeStatus::kMessage) {
        CARACAL_FUZZ_CHECK(d.status == DecodeStatus::kNeedMore && e.consumed == buf.size() &&
                               e.payload_offset + e.payload_bytes <= buf.size() &&
                               e.payload_bytes <= config.max_message_bytes,
                           "a last message of %zu bytes out of %zu buffered", e.consumed,
                           buf.size());
      }
      break;
    }
    begin += d.consumed;
  }
  return 0;
}
