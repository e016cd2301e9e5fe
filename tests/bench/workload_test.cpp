// What loadgen sends and how it judges replies: size lists, echo replies (right, altered,
// truncated, late), and matvec replies against the CPU reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "matvec.hpp"
#include "matvec_reference.hpp"
#include "workload.hpp"

namespace caracal::bench {
namespace {

TEST(ParseSizes, FixedAndDistribution) {
  std::string error;
  auto one = parse_sizes("64", error);
  ASSERT_EQ(one.size(), 1u) << error;
  EXPECT_EQ(one[0].bytes, 64u);
  auto dist = parse_sizes("64:0.5,1024:0.3,16384:2", error);
  ASSERT_EQ(dist.size(), 3u) << error;
  EXPECT_EQ(dist[2].bytes, 16384u);
  EXPECT_DOUBLE_EQ(dist[1].weight, 0.3);
}

TEST(ParseSizes, BadTextSaysWhat) {
  std::string error;
  EXPECT_TRUE(parse_sizes("64,x", error).empty());
  EXPECT_NE(error.find("'x'"), std::string::npos) << error;
  EXPECT_TRUE(parse_sizes("64:-1", error).empty());
  EXPECT_NE(error.find("weight '-1'"), std::string::npos) << error;
  EXPECT_TRUE(parse_sizes("0", error).empty());
  EXPECT_TRUE(parse_sizes("", error).empty());
}

TEST(CheckSizes, MatVecNeedsWholeVectors) {
  EXPECT_EQ(check_sizes(HandlerKind::kMatVec, {{64, 1}, {16384, 1}}), "");
  EXPECT_NE(check_sizes(HandlerKind::kMatVec, {{100, 1}}).find("not a multiple of 64"),
            std::string::npos);
  EXPECT_NE(check_sizes(HandlerKind::kEcho, {{8, 1}}), "");
}

TEST(Workload, EchoRepliesAreJudged) {
  const Workload w(HandlerKind::kEcho, {{64, 1}, {1024, 1}}, 5);
  Workload::Slot s = w.make_slot(3);
  w.next_request(s);
  std::vector<std::byte> first = s.bytes;
  ASSERT_TRUE(first.size() == 64 || first.size() == 1024);
  EXPECT_EQ(first[8], std::byte{0});
  EXPECT_EQ(first[9], std::byte{0});
  std::string why;
  EXPECT_EQ(w.verify(s, first.data(), first.size(), why), Verdict::kOk);

  std::vector<std::byte> bad = first;
  bad[20] ^= std::byte{1};
  EXPECT_EQ(w.verify(s, bad.data(), bad.size(), why), Verdict::kWrong);
  EXPECT_NE(why.find("at byte 20"), std::string::npos) << why;
  EXPECT_EQ(w.verify(s, first.data(), first.size() - 1, why), Verdict::kWrong);
  EXPECT_NE(why.find("bytes"), std::string::npos) << why;

  // The next request has a new id; the old reply is now late, not right.
  w.next_request(s);
  EXPECT_EQ(w.verify(s, first.data(), first.size(), why), Verdict::kLate);
  EXPECT_EQ(w.verify(s, s.bytes.data(), s.bytes.size(), why), Verdict::kOk);
  // Another slot's reply is wrong here.
  Workload::Slot other = w.make_slot(4);
  w.next_request(other);
  EXPECT_EQ(w.verify(s, other.bytes.data(), other.bytes.size(), why), Verdict::kWrong);
}

// A wrong echo reply is named by the id it carries: another client's (the slot id's top 8
// bits), another slot's of this client, another request of this slot, or this request's id with
// other bytes.
TEST(Workload, WrongEchoRepliesSayWhose) {
  const Workload w(HandlerKind::kEcho, {{64, 1}}, 5);
  const uint32_t client1 = 1u << kSlotClientShift;
  const uint32_t client2 = 2u << kSlotClientShift;
  Workload::Slot s = w.make_slot(client1 + 7);
  w.next_request(s);
  w.next_request(s);  // request 2: request 1's reply is late
  std::string why;
  WrongKind kind = WrongKind::kCorrupt;

  Workload::Slot same_place_other_client = w.make_slot(client2 + 7);
  w.next_request(same_place_other_client);
  w.next_request(same_place_other_client);
  const auto& foreign = same_place_other_client.bytes;
  EXPECT_EQ(w.verify(s, foreign.data(), foreign.size(), why, &kind), Verdict::kWrong);
  EXPECT_EQ(kind, WrongKind::kOtherClient) << why;
  EXPECT_NE(why.find("another client"), std::string::npos) << why;

  Workload::Slot neighbour = w.make_slot(client1 + 8);
  w.next_request(neighbour);
  EXPECT_EQ(w.verify(s, neighbour.bytes.data(), neighbour.bytes.size(), why, &kind),
            Verdict::kWrong);
  EXPECT_EQ(kind, WrongKind::kOtherSlot) << why;

  // This slot's id with a later sequence number: no request of this slot has it yet.
  std::vector<std::byte> ahead = s.bytes;
  const uint64_t id = (uint64_t{s.slot_id} << 32) | (s.seq + 5);
  std::memcpy(ahead.data(), &id, sizeof id);
  EXPECT_EQ(w.verify(s, ahead.data(), ahead.size(), why, &kind), Verdict::kWrong);
  EXPECT_EQ(kind, WrongKind::kOtherRequest) << why;

  std::vector<std::byte> altered = s.bytes;
  altered[30] ^= std::byte{0x40};
  EXPECT_EQ(w.verify(s, altered.data(), altered.size(), why, &kind), Verdict::kWrong);
  EXPECT_EQ(kind, WrongKind::kCorrupt) << why;
  EXPECT_EQ(w.verify(s, s.bytes.data(), s.bytes.size(), why, &kind), Verdict::kOk);
}

TEST(Workload, SizeDistributionIsFollowed) {
  const Workload w(HandlerKind::kEcho, {{64, 3}, {1024, 1}}, 9);
  Workload::Slot s = w.make_slot(0);
  int small = 0;
  for (int i = 0; i < 4000; ++i) {
    w.next_request(s);
    small += s.bytes.size() == 64;
  }
  EXPECT_GT(small, 2700);
  EXPECT_LT(small, 3300);
}

// The handler's answer, computed the way a CPU worker calls it (a group of one thread).
std::vector<std::byte> run_handler(const std::vector<std::byte>& request, uint32_t group_size,
                                   uint16_t* flags = nullptr,
                                   examples::MatVec handler = examples::MatVec{}) {
  std::vector<std::byte> out(request.size() + 64);
  accel::Response resp{out.data(), static_cast<uint32_t>(out.size())};
  for (uint32_t rank = 0; rank < group_size; ++rank) {
    // A warp's threads each take their vectors; run them one after another.
    accel::Request req{request.data(), static_cast<uint32_t>(request.size())};
    accel::Context ctx(accel::Group(accel::Granularity::kWarp, rank, group_size), nullptr, 0, 0);
    handler(req, resp, ctx);
  }
  if (flags != nullptr) *flags = resp.flags;
  out.resize(resp.size);
  return out;
}

TEST(Workload, MatVecRepliesMatchTheReference) {
  for (const uint32_t size : {64u, 1024u, 16384u}) {
    const Workload w(HandlerKind::kMatVec, {{size, 1}}, 21);
    Workload::Slot s = w.make_slot(0);
    w.next_request(s);
    std::string why;
    for (const uint32_t group : {1u, 32u}) {
      const auto reply = run_handler(s.bytes, group);
      EXPECT_EQ(w.verify(s, reply.data(), reply.size(), why), Verdict::kOk)
          << size << " bytes, group " << group << ": " << why;
    }
    auto reply = run_handler(s.bytes, 1);
    float f;
    std::memcpy(&f, reply.data() + size - 4, 4);
    f += 0.01f;
    std::memcpy(reply.data() + size - 4, &f, 4);
    EXPECT_EQ(w.verify(s, reply.data(), reply.size(), why), Verdict::kWrong);
    EXPECT_NE(why.find("output " + std::to_string(size / 4 - 1)), std::string::npos) << why;
    // The reply of the previous request is late.
    const auto previous = run_handler(s.bytes, 1);
    w.next_request(s);
    EXPECT_EQ(w.verify(s, previous.data(), previous.size(), why), Verdict::kLate);
  }
}

// More rounds: another answer, which the reference with as many rounds expects and the one with
// another count refuses; a delay leaves the answer as it is.
TEST(MatVec, RoundsChangeTheAnswerAndDelayDoesNot) {
  for (const uint32_t rounds : {2u, 7u}) {
    const Workload w(HandlerKind::kMatVec, {{1024, 1}}, 23, rounds);
    const Workload one(HandlerKind::kMatVec, {{1024, 1}}, 23);
    Workload::Slot s = w.make_slot(0);
    Workload::Slot s1 = one.make_slot(0);
    w.next_request(s);
    one.next_request(s1);
    ASSERT_EQ(s.bytes, s1.bytes);  // the same request, checked against two references
    std::string why;
    for (const uint32_t group : {1u, 32u}) {
      const auto reply = run_handler(s.bytes, group, nullptr, examples::MatVec{rounds});
      EXPECT_EQ(w.verify(s, reply.data(), reply.size(), why), Verdict::kOk)
          << rounds << " rounds, group " << group << ": " << why;
      EXPECT_EQ(one.verify(s1, reply.data(), reply.size(), why), Verdict::kWrong) << rounds;
    }
    const auto slow = run_handler(s.bytes, 1, nullptr, examples::MatVec{rounds, 200000});
    EXPECT_EQ(w.verify(s, slow.data(), slow.size(), why), Verdict::kOk) << why;
  }
  uint16_t flags = 0;
  const std::vector<std::byte> request(64);
  run_handler(request, 1, &flags, examples::MatVec{0});
  EXPECT_NE(flags & mqueue::kSlotError, 0);
}

TEST(MatVec, ReferenceIsNotTrivial) {
  // Different inputs give different outputs, and outputs are neither zero nor the input.
  const Workload w(HandlerKind::kMatVec, {{64, 1}}, 2);
  Workload::Slot s = w.make_slot(0);
  w.next_request(s);
  const auto y = examples::matvec_reference(s.bytes.data(), 64);
  ASSERT_EQ(y.size(), 16u);
  int nonzero = 0;
  for (const float v : y)
    nonzero += v != 0.0f;
  EXPECT_GT(nonzero, 8);
  EXPECT_NE(std::memcmp(y.data(), s.bytes.data(), 64), 0);
}

// The check compares every output in one pass and names the first wrong one: a NaN is never
// close, an output just inside the tolerance passes and one just outside does not.
TEST(MatVec, CheckNamesTheFirstWrongOutputAndRefusesNaN) {
  const std::vector<float> expected(4096, 0.5f);
  std::vector<float> reply = expected;
  const uint32_t bytes = static_cast<uint32_t>(reply.size() * sizeof(float));
  EXPECT_EQ(examples::matvec_check(reply.data(), bytes, expected), "");
  reply[100] = 0.5f + 1.4e-4f;  // tolerance 1e-4 * (1 + 0.5) = 1.5e-4
  EXPECT_EQ(examples::matvec_check(reply.data(), bytes, expected), "");
  reply[100] = 0.5f + 1.6e-4f;
  reply[4000] = std::nanf("");
  std::string why = examples::matvec_check(reply.data(), bytes, expected);
  EXPECT_NE(why.find("output 100 (vector 6)"), std::string::npos) << why;
  reply[100] = 0.5f;
  why = examples::matvec_check(reply.data(), bytes, expected);
  EXPECT_NE(why.find("output 4000 (vector 250)"), std::string::npos) << why;
  EXPECT_NE(examples::matvec_check(reply.data(), bytes - 4, expected).find("reply is 16380 bytes"),
            std::string::npos);
}

TEST(MatVec, BadSizesGetAnError) {
  for (const uint32_t size : {0u, 63u, 100u}) {
    std::vector<std::byte> request(size);
    uint16_t flags = 0;
    const auto reply = run_handler(request, 1, &flags);
    EXPECT_NE(flags & mqueue::kSlotError, 0) << size;
    const std::string text(reinterpret_cast<const char*>(reply.data()), reply.size());
    EXPECT_NE(text.find("multiple of 64"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace caracal::bench
