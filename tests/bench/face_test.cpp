// The face verification handler's functions (examples/face_verify/face_verify.hpp) against the
// CPU reference (face_reference.hpp): patterns, histograms, distances and every error status.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "face_reference.hpp"
#include "face_verify.hpp"

namespace caracal::examples::face {
namespace {

TEST(FaceVerify, UniformBinsMatchTheEnumeratedTable) {
  const std::array<uint8_t, 256> bins = reference_bins();
  for (uint32_t code = 0; code < 256; ++code)
    EXPECT_EQ(uniform_bin(code), bins[code]) << code;
}

// The handler's answer (on the CPU: a group of one) to `request` given a stored `value`.
Decoded answer(const std::vector<uint8_t>& request, Fetched fetched,
               const std::vector<uint8_t>& value) {
  std::vector<uint8_t> histograms(kHistogramBytes);
  std::byte out[kMaxReplyBytes];
  accel::Response resp{out, kMaxReplyBytes};
  answer_fetched(accel::Group(), reinterpret_cast<const std::byte*>(request.data()),
                 static_cast<uint32_t>(request.size()), fetched, value.data(),
                 static_cast<uint32_t>(value.size()), histograms.data(), nullptr, resp);
  return decode_reply(out, resp.size);
}

TEST(FaceVerify, VerdictsAreTheReferencesExactly) {
  uint32_t genuine_matches = 0, impostor_matches = 0;
  for (uint32_t p = 0; p < 40; ++p) {
    const std::vector<uint8_t> hist =
        reference_histograms(synthetic_face(kDefaultSeed, p, 0).data());
    const std::vector<uint8_t> value = encode_reference(p, hist);
    for (const uint32_t face_of : {p, (p + 17) % 40}) {
      const Image image = synthetic_face(kDefaultSeed, face_of, 1 + p % 3);
      const std::vector<uint8_t> request = encode_request(p, image);
      const Expected want = reference_answer(p, image.data(), &hist);
      std::vector<uint8_t> reply(kMaxReplyBytes);
      std::byte out[kMaxReplyBytes];
      std::vector<uint8_t> scratch(kHistogramBytes);
      accel::Response resp{out, kMaxReplyBytes};
      answer_fetched(accel::Group(), reinterpret_cast<const std::byte*>(request.data()),
                     kRequestBytes, Fetched::kFound, value.data(), kReferenceBytes, scratch.data(),
                     nullptr, resp);
      EXPECT_EQ(check_reply(out, resp.size, want), "") << "person " << p << " face " << face_of;
      const bool match = want.status == ReplyStatus::kMatch;
      (face_of == p ? genuine_matches : impostor_matches) += match ? 1 : 0;
    }
  }
  // The threshold parts the synthetic set's captures of a person from other people's faces.
  EXPECT_GE(genuine_matches, 36u);
  EXPECT_LE(impostor_matches, 4u);
}

TEST(FaceVerify, EveryFailureIsAnErrorStatusNeverAVerdict) {
  const uint32_t p = 7;
  const std::vector<uint8_t> hist = reference_histograms(synthetic_face(kDefaultSeed, p, 0).data());
  const std::vector<uint8_t> good = encode_reference(p, hist);
  const std::vector<uint8_t> request = encode_request(p, synthetic_face(kDefaultSeed, p, 1));
  auto status = [&](const std::vector<uint8_t>& req, Fetched f, const std::vector<uint8_t>& v) {
    const Decoded d = answer(req, f, v);
    EXPECT_EQ(d.error, "");
    if (d.status != ReplyStatus::kMatch && d.status != ReplyStatus::kNoMatch) {
      EXPECT_FALSE(d.reason.empty());
      EXPECT_EQ(d.distance, 0u);
    }
    return d.status;
  };
  EXPECT_EQ(status(request, Fetched::kFound, good), ReplyStatus::kMatch);
  EXPECT_EQ(status(request, Fetched::kMissing, {}), ReplyStatus::kUnknownPerson);
  EXPECT_EQ(status(request, Fetched::kFailed, {}), ReplyStatus::kStoreUnavailable);
  std::vector<uint8_t> bad = request;
  bad.resize(100);
  EXPECT_EQ(status(bad, Fetched::kFound, good), ReplyStatus::kBadRequest);
  bad = request;
  bad[0] ^= 1;
  EXPECT_EQ(status(bad, Fetched::kFound, good), ReplyStatus::kBadRequest);
  // Each field of the stored value, and any byte of its histograms.
  for (const size_t at : {0u, 4u, 6u, 8u, 10u, 12u, 16u, 20u, 24u, 1000u, 3799u}) {
    std::vector<uint8_t> v = good;
    v[at] ^= 0x10;
    EXPECT_EQ(status(request, Fetched::kFound, v), ReplyStatus::kCorruptReference) << at;
  }
  std::vector<uint8_t> v = good;
  v.pop_back();
  EXPECT_EQ(status(request, Fetched::kFound, v), ReplyStatus::kCorruptReference);
  v = good;
  v.push_back(0);
  EXPECT_EQ(status(request, Fetched::kFound, v), ReplyStatus::kCorruptReference);
  // Another person's whole, valid reference.
  EXPECT_EQ(
      status(request, Fetched::kFound,
             encode_reference(8, reference_histograms(synthetic_face(kDefaultSeed, 8, 0).data()))),
      ReplyStatus::kCorruptReference);
}

TEST(FaceVerify, MemcachedRepliesAreParsed) {
  const std::string miss = "END\r\n";
  EXPECT_EQ(parse_get_reply(miss.data(), 5, 5).status, ReplyStatus::kUnknownPerson);
  const std::string hit = "VALUE face:1 0 5\r\nhello\r\nEND\r\n";
  const Lookup l = parse_get_reply(hit.data(), static_cast<uint32_t>(hit.size()),
                                   static_cast<uint32_t>(hit.size()));
  ASSERT_EQ(l.status, ReplyStatus::kMatch);
  EXPECT_EQ(hit.substr(l.value_offset, l.value_bytes), "hello");
  const std::string error = "SERVER_ERROR out of memory\r\n";
  EXPECT_EQ(parse_get_reply(error.data(), static_cast<uint32_t>(error.size()),
                            static_cast<uint32_t>(error.size()))
                .status,
            ReplyStatus::kStoreUnavailable);
  // A value longer than the handler copied is not a reference (the stored value is too long).
  EXPECT_EQ(parse_get_reply(hit.data(), 20, 40).status, ReplyStatus::kCorruptReference);
  char key[kMaxKeyBytes];
  EXPECT_EQ(std::string(key, reference_key(4294967295u, key)), "face:4294967295");
  EXPECT_EQ(std::string(key, reference_key(0, key)), "face:0");
}

}  // namespace
}  // namespace caracal::examples::face
