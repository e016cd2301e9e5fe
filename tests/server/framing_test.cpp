#include "framing.hpp"

#include <gtest/gtest.h>

#include "config.hpp"

#include <string>
#include <vector>

namespace caracal::server {
namespace {

std::vector<std::byte> bytes(const std::string& s) {
  std::vector<std::byte> v(s.size());
  for (size_t i = 0; i < s.size(); ++i)
    v[i] = static_cast<std::byte>(s[i]);
  return v;
}

std::string text(std::span<const std::byte> b, size_t offset, size_t n) {
  return std::string(reinterpret_cast<const char*>(b.data()) + offset, n);
}

Codec make(const FramingConfig& c) {
  Result<Codec> r = Codec::make(c);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return std::move(r).value();
}

TEST(Framing, FixedSizeSplitsAStream) {
  Codec codec = make({.kind = FramingKind::kFixed, .fixed_bytes = 4, .max_message_bytes = 16});
  auto buf = bytes("abcdefghij");
  Decoded d = codec.decode(buf);
  ASSERT_EQ(d.status, DecodeStatus::kMessage);
  EXPECT_EQ(text(buf, d.payload_offset, d.payload_bytes), "abcd");
  EXPECT_EQ(d.consumed, 4u);
  d = codec.decode(std::span(buf).subspan(8));
  EXPECT_EQ(d.status, DecodeStatus::kNeedMore);
  EXPECT_TRUE(codec.can_frame(4));
  EXPECT_FALSE(codec.can_frame(5));
  std::byte header[Codec::header_capacity()];
  EXPECT_EQ(codec.encode_header(4, header), 0u);
  EXPECT_TRUE(codec.trailer().empty());
}

TEST(Framing, FixedSizeLargerThanMaxMessageIsRefused) {
  Result<Codec> r =
      Codec::make({.kind = FramingKind::kFixed, .fixed_bytes = 64, .max_message_bytes = 32});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("fixed size 64"), std::string::npos);
}

TEST(Framing, LengthPrefixBigEndianRoundTrip) {
  Codec codec = make({.kind = FramingKind::kLengthPrefixed,
                      .prefix_bytes = 2,
                      .byte_order = ByteOrder::kBig,
                      .max_message_bytes = 1000});
  std::byte header[Codec::header_capacity()];
  ASSERT_EQ(codec.encode_header(300, header), 2u);
  EXPECT_EQ(header[0], std::byte{0x01});
  EXPECT_EQ(header[1], std::byte{0x2C});
  std::vector<std::byte> buf(header, header + 2);
  buf.resize(2 + 300, std::byte{'x'});
  // Every strict prefix of the message needs more bytes.
  for (size_t n = 0; n < buf.size(); ++n) {
    EXPECT_EQ(codec.decode(std::span(buf).first(n)).status, DecodeStatus::kNeedMore) << n;
  }
  Decoded d = codec.decode(buf);
  ASSERT_EQ(d.status, DecodeStatus::kMessage);
  EXPECT_EQ(d.payload_offset, 2u);
  EXPECT_EQ(d.payload_bytes, 300u);
  EXPECT_EQ(d.consumed, 302u);
}

TEST(Framing, LengthPrefixLittleEndianCountingItself) {
  Codec codec = make({.kind = FramingKind::kLengthPrefixed,
                      .prefix_bytes = 4,
                      .byte_order = ByteOrder::kLittle,
                      .prefix_counts_itself = true,
                      .max_message_bytes = 64});
  std::byte header[Codec::header_capacity()];
  ASSERT_EQ(codec.encode_header(5, header), 4u);
  EXPECT_EQ(header[0], std::byte{9});
  EXPECT_EQ(header[3], std::byte{0});
  std::vector<std::byte> buf(header, header + 4);
  for (char c : std::string("hello"))
    buf.push_back(static_cast<std::byte>(c));
  Decoded d = codec.decode(buf);
  ASSERT_EQ(d.status, DecodeStatus::kMessage);
  EXPECT_EQ(text(buf, d.payload_offset, d.payload_bytes), "hello");
}

TEST(Framing, LengthPrefixSmallerThanItselfIsMalformed) {
  Codec codec = make({.kind = FramingKind::kLengthPrefixed,
                      .prefix_bytes = 4,
                      .prefix_counts_itself = true,
                      .max_message_bytes = 64});
  const std::vector<std::byte> buf{std::byte{0}, std::byte{0}, std::byte{0}, std::byte{3}};
  Decoded d = codec.decode(buf);
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_NE(d.error.find("smaller than the 4-byte prefix"), std::string::npos) << d.error;
}

TEST(Framing, OversizeLengthPrefixIsMalformedBeforeThePayloadArrives) {
  Codec codec =
      make({.kind = FramingKind::kLengthPrefixed, .prefix_bytes = 4, .max_message_bytes = 1024});
  std::byte header[Codec::header_capacity()];
  codec.encode_header(1025, header);
  Decoded d = codec.decode(std::span<const std::byte>(header, 4));
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_NE(d.error.find("1025"), std::string::npos) << d.error;
  EXPECT_NE(d.error.find("1024"), std::string::npos) << d.error;
}

TEST(Framing, PrefixWidthsOtherThan1248AreRefused) {
  Result<Codec> r = Codec::make(
      {.kind = FramingKind::kLengthPrefixed, .prefix_bytes = 3, .max_message_bytes = 64});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("3 bytes"), std::string::npos);
}

TEST(Framing, OneBytePrefixCannotFrameLongReplies) {
  Codec codec =
      make({.kind = FramingKind::kLengthPrefixed, .prefix_bytes = 1, .max_message_bytes = 1000});
  EXPECT_TRUE(codec.can_frame(255));
  EXPECT_FALSE(codec.can_frame(256));
}

TEST(Framing, LinesWithCrLf) {
  Codec codec = make({.kind = FramingKind::kLine, .delimiter = "\r\n", .max_message_bytes = 16});
  auto buf = bytes("get k\r\nset");
  Decoded d = codec.decode(buf);
  ASSERT_EQ(d.status, DecodeStatus::kMessage);
  EXPECT_EQ(text(buf, d.payload_offset, d.payload_bytes), "get k");
  EXPECT_EQ(d.consumed, 7u);
  EXPECT_EQ(codec.decode(std::span(buf).subspan(7)).status, DecodeStatus::kNeedMore);
  EXPECT_EQ(text(codec.trailer(), 0, codec.trailer().size()), "\r\n");
}

TEST(Framing, EmptyLineIsAMessage) {
  Codec codec = make({.kind = FramingKind::kLine, .max_message_bytes = 16});
  auto buf = bytes("\nx");
  Decoded d = codec.decode(buf);
  ASSERT_EQ(d.status, DecodeStatus::kMessage);
  EXPECT_EQ(d.payload_bytes, 0u);
  EXPECT_EQ(d.consumed, 1u);
}

TEST(Framing, AtTheStreamsEndTheLastLineNeedsNoDelimiter) {
  Codec line = make({.kind = FramingKind::kLine, .delimiter = "\r\n", .max_message_bytes = 8});
  auto buf = bytes("a\r\nlast");
  Decoded d = line.decode_at_end(buf);
  ASSERT_EQ(d.status, DecodeStatus::kMessage);  // whole lines first
  EXPECT_EQ(d.consumed, 3u);
  d = line.decode_at_end(std::span(buf).subspan(3));
  ASSERT_EQ(d.status, DecodeStatus::kMessage);
  EXPECT_EQ(text(buf, 3 + d.payload_offset, d.payload_bytes), "last");
  EXPECT_EQ(d.consumed, 4u);
  EXPECT_EQ(line.decode_at_end({}).status, DecodeStatus::kNeedMore);  // nothing left
  // Over max_message_bytes: no line, at the end either.
  EXPECT_EQ(line.decode_at_end(bytes("123456789")).status, DecodeStatus::kNeedMore);
  // A length prefix's partial message stays partial.
  Codec prefixed = make({.kind = FramingKind::kLengthPrefixed, .max_message_bytes = 8});
  std::byte header[Codec::header_capacity()];
  std::vector<std::byte> partial(header, header + prefixed.encode_header(5, header));
  partial.resize(partial.size() + 2, std::byte{'x'});  // 2 of the 5 bytes
  EXPECT_EQ(prefixed.decode_at_end(partial).status, DecodeStatus::kNeedMore);
}

TEST(Framing, OverlongLineIsMalformed) {
  Codec codec = make({.kind = FramingKind::kLine, .max_message_bytes = 8});
  // Exactly max bytes and the delimiter: fine.
  EXPECT_EQ(codec.decode(bytes("12345678\n")).status, DecodeStatus::kMessage);
  // Nine bytes without a delimiter can never become a valid line.
  Decoded d = codec.decode(bytes("123456789"));
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_NE(d.error.find("max_message_bytes 8"), std::string::npos) << d.error;
  // A long line with its delimiter already buffered is refused too.
  EXPECT_EQ(codec.decode(bytes("123456789\n")).status, DecodeStatus::kMalformed);
}

// An overlong line can be skipped: decode says how much of it to drop, skip_line() the rest.
TEST(Framing, OverlongLineCanBeSkippedToItsDelimiter) {
  Codec codec = make({.kind = FramingKind::kLine, .delimiter = "\r\n", .max_message_bytes = 4});
  // Its delimiter buffered: the line and the delimiter go, the next line is whole.
  auto buf = bytes("123456\r\nok\r\n");
  Decoded d = codec.decode(buf);
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_TRUE(d.skippable);
  EXPECT_TRUE(d.line_ended);
  EXPECT_EQ(d.consumed, 8u);
  d = codec.decode(std::span(buf).subspan(8));
  ASSERT_EQ(d.status, DecodeStatus::kMessage);
  EXPECT_EQ(text(buf, 8, d.payload_bytes), "ok");

  // No delimiter yet: all but the last byte (it may begin "\r\n") go; skip_line() finds the
  // end in the next bytes, a delimiter split across them included.
  auto head = bytes("1234567\r");
  d = codec.decode(head);
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_TRUE(d.skippable);
  EXPECT_FALSE(d.line_ended);
  EXPECT_EQ(d.consumed, 7u);
  auto rest = bytes("\r\nnext\r\n");  // the byte kept, then the next read's
  LineSkip skip = codec.skip_line(rest);
  EXPECT_TRUE(skip.ended);
  EXPECT_EQ(skip.consumed, 2u);
  skip = codec.skip_line(bytes("xxxx\r"));
  EXPECT_FALSE(skip.ended);
  EXPECT_EQ(skip.consumed, 4u);
  EXPECT_EQ(codec.skip_line({}).consumed, 0u);

  // Other refusals cannot be skipped: a length prefix too large says nothing about the stream.
  Codec prefixed = make({.kind = FramingKind::kLengthPrefixed, .max_message_bytes = 4});
  std::byte header[Codec::header_capacity()];
  const size_t n = prefixed.encode_header(9, header);
  d = prefixed.decode(std::span<const std::byte>(header, n));
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_FALSE(d.skippable);
}

TEST(Framing, PartialDelimiterAtMaxLengthStillWaits) {
  Codec codec = make({.kind = FramingKind::kLine, .delimiter = "\r\n", .max_message_bytes = 4});
  EXPECT_EQ(codec.decode(bytes("abcd\r")).status, DecodeStatus::kNeedMore);
  EXPECT_EQ(codec.decode(bytes("abcd\r\n")).status, DecodeStatus::kMessage);
}

TEST(Framing, EmptyDelimiterAndZeroMaxAreRefused) {
  EXPECT_FALSE(
      Codec::make({.kind = FramingKind::kLine, .delimiter = "", .max_message_bytes = 8}).ok());
  EXPECT_FALSE(Codec::make({.kind = FramingKind::kLine, .max_message_bytes = 0}).ok());
}

// ---- memcached replies -------------------------------------------------------------------------

Codec memcached(uint32_t max = 1024) {
  return make({.kind = FramingKind::kMemcached, .max_message_bytes = max});
}

// One reply of every kind the text and meta protocols send.
const std::vector<std::string> kMemcachedReplies = {
    "VALUE k 0 5\r\nhello\r\nEND\r\n",
    "VALUE a 1 3 99\r\nabc\r\nVALUE b 4294967295 0\r\n\r\nEND\r\n",
    "VALUE k 0 7\r\nEND\r\n\r\n\r\nEND\r\n",  // the data looks like framing; its size decides
    std::string("VALUE bin 0 4\r\n\r\n\0\n\r\nEND\r\n", 26),  // binary data, NUL included
    "END\r\n",
    "STORED\r\n",
    "NOT_STORED\r\n",
    "EXISTS\r\n",
    "NOT_FOUND\r\n",
    "DELETED\r\n",
    "TOUCHED\r\n",
    "OK\r\n",
    "RESET\r\n",
    "ERROR\r\n",
    "CLIENT_ERROR bad data chunk\r\n",
    "SERVER_ERROR out of memory storing object\r\n",
    "VERSION 1.6.21\r\n",
    "0\r\n",
    "18446744073709551615\r\n",
    "STAT pid 4242\r\nSTAT uptime 17\r\nEND\r\n",
    "VA 5 f30 c123\r\nhello\r\n",
    "VA 0\r\n\r\n",
    "VA 4 kkey Oq1\r\nEN\r\n\r\n",
    "HD\r\n",
    "HD c99 Oab t-1\r\n",
    "EN\r\n",
    "NF\r\n",
    "NF Oab\r\n",
    "NS\r\n",
    "EX c7\r\n",
    "MN\r\n",
    "ME key exp=-1 la=2 cas=3 fetch=no cls=1 size=63\r\n",
};

TEST(Framing, MemcachedEveryReplyKindAtEverySplitPoint) {
  Codec codec = memcached();
  for (const std::string& reply : kMemcachedReplies) {
    const auto buf = bytes(reply);
    for (size_t n = 0; n < buf.size(); ++n) {
      const Decoded d = codec.decode(std::span(buf).first(n));
      EXPECT_EQ(d.status, DecodeStatus::kNeedMore)
          << "reply " << testing::PrintToString(reply) << " cut at " << n << ": " << d.error;
    }
    const Decoded d = codec.decode(buf);
    ASSERT_EQ(d.status, DecodeStatus::kMessage) << testing::PrintToString(reply) << ": " << d.error;
    EXPECT_EQ(d.payload_offset, 0u);
    EXPECT_EQ(d.payload_bytes, buf.size());
    EXPECT_EQ(d.consumed, buf.size());
  }
}

TEST(Framing, MemcachedPipelinedRepliesComeOneAtATime) {
  Codec codec = memcached();
  std::string stream;
  for (const std::string& r : kMemcachedReplies)
    stream += r;
  const auto buf = bytes(stream);
  size_t at = 0;
  for (const std::string& r : kMemcachedReplies) {
    const Decoded d = codec.decode(std::span(buf).subspan(at));
    ASSERT_EQ(d.status, DecodeStatus::kMessage) << testing::PrintToString(r) << ": " << d.error;
    EXPECT_EQ(text(buf, at + d.payload_offset, d.payload_bytes), r);
    at += d.consumed;
  }
  EXPECT_EQ(at, buf.size());
}

TEST(Framing, MemcachedAddsNoFraming) {
  Codec codec = memcached();
  std::byte header[Codec::header_capacity()];
  EXPECT_EQ(codec.encode_header(9, header), 0u);
  EXPECT_TRUE(codec.trailer().empty());
  EXPECT_TRUE(codec.can_frame(1u << 20));
}

TEST(Framing, MemcachedMalformedRepliesSayWhy) {
  Codec codec = memcached(64);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"FOO\r\n", "unknown reply line 'FOO'"},
      {"\r\n", "unknown reply line ''"},
      {"STORED extra\r\n", "unknown reply line 'STORED extra'"},
      {"HD  c1\r\n", "unknown reply line"},
      {"HD c1 \r\n", "unknown reply line"},
      {"HD 1x\r\n", "unknown reply line"},
      {"EN c1\r\n", "unknown reply line"},
      {"VERSION\r\n", "unknown reply line 'VERSION'"},
      {"99999999999999999999\r\n", "unknown reply line"},
      {"12a\r\n", "unknown reply line"},
      {std::string("\x01\x7f\r\n"), "'\\x01\\x7f'"},
      {"STORED\n", "ends in \\n without \\r"},
      {"VALUE k 0 abc\r\n", "bad VALUE line 'VALUE k 0 abc'"},
      {"VALUE k 0\r\n", "bad VALUE line"},
      {"VALUE k 0 1 2 3\r\n", "bad VALUE line"},
      {"VALUE k 4294967296 1\r\n", "bad VALUE line"},
      {"VALUE k 0 -1\r\n", "bad VALUE line"},
      {"VA x f1\r\n", "bad VA line 'VA x f1'"},
      {"VA 2 f1 \r\n", "bad VA line"},
      {"VALUE k 0 5\r\nhelloXXEND\r\n",
       "5-byte data block after 'VALUE k 0 5' is followed by 'XX'"},
      {"VA 2\r\nabc\r\n", "followed by 'c\\x0d'"},
      {"VALUE k 0 1\r\na\r\nSTORED\r\n", "expected VALUE or END after a data block, got 'STORED'"},
      {"VALUE k 0 1\r\na\r\nVA 1\r\nb\r\n", "expected VALUE or END"},
      {"STAT pid 1\r\nVALUE k 0 1\r\n", "expected STAT or END, got 'VALUE k 0 1'"},
      {"STAT\r\n", "bad STAT line"},
      {"VA 1\r\na\r\n", ""},  // fine: the control case
  };
  for (const auto& [reply, reason] : cases) {
    const Decoded d = codec.decode(bytes(reply));
    if (reason.empty()) {
      EXPECT_EQ(d.status, DecodeStatus::kMessage) << testing::PrintToString(reply);
      continue;
    }
    ASSERT_EQ(d.status, DecodeStatus::kMalformed) << testing::PrintToString(reply);
    EXPECT_NE(d.error.find(reason), std::string::npos)
        << testing::PrintToString(reply) << " -> " << d.error;
    EXPECT_TRUE(d.error.starts_with("memcached reply: ")) << d.error;
  }
}

TEST(Framing, MemcachedRepliesOverMaxMessageBytes) {
  const std::string reply = "VALUE k 0 5\r\nhello\r\nEND\r\n";  // 25 bytes
  EXPECT_EQ(memcached(25).decode(bytes(reply)).status, DecodeStatus::kMessage);
  Decoded d = memcached(24).decode(bytes(reply));
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_NE(d.error.find("longer than max_message_bytes 24"), std::string::npos) << d.error;
  // A data block that cannot fit is refused before its bytes arrive.
  d = memcached(64).decode(bytes("VALUE k 0 100\r\n"));
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_NE(d.error.find("announces 100 data bytes"), std::string::npos) << d.error;
  d = memcached(64).decode(bytes("VA 18446744073709551615\r\n"));
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_NE(d.error.find("announces 18446744073709551615"), std::string::npos) << d.error;
  // A line with no end in sight.
  d = memcached(64).decode(bytes("SERVER_ERROR " + std::string(52, 'x')));
  ASSERT_EQ(d.status, DecodeStatus::kMalformed);
  EXPECT_NE(d.error.find("max_message_bytes 64"), std::string::npos) << d.error;
  EXPECT_EQ(memcached(64).decode(bytes("SERVER_ERROR " + std::string(51, 'x'))).status,
            DecodeStatus::kNeedMore);
}

TEST(Framing, MemcachedKindInConfig) {
  const FramingConfig c =
      parse_framing(config::load_yaml_text("kind: memcached\n", "framing.yaml"), 4096);
  EXPECT_EQ(c.kind, FramingKind::kMemcached);
  EXPECT_EQ(c.max_message_bytes, 4096u);
  try {
    parse_framing(
        config::load_yaml_text("kind: memcached\ndelimiter: \"\\r\\n\"\n", "framing.yaml"), 4096);
    FAIL() << "a delimiter was accepted for memcached framing";
  } catch (const config::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("only applies to framing kind 'line'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace caracal::server
