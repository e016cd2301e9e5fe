#include "caracal/server/framing.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace caracal::server
