// The CPU group harness (caracal/accel/group_harness.hpp): handlers whose groups split the work
// and combine it with the collectives run with a thread per rank and real barriers, and get
// the replies a single thread computes; a handler that breaks the group contract (a rank that
// skips a collective, ranks that call different ones) is reported with the request and ranks,
// and never hangs the run.
#include "caracal/accel/group_harness.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "group_handlers.hpp"

namespace caracal::accel::test {
namespace {

std::vector<std::string> some_requests(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  const std::string alphabet = "abc xyz  ";
  for (size_t i = 0; i < n; ++i) {
    std::string s(rng() % 300, ' ');
    for (char& c : s)
      c = alphabet[rng() % alphabet.size()];
    out.push_back(std::move(s));
  }
  out.push_back("");                   // nothing to split
  out.push_back("   ");                // nothing kept
  out.push_back(std::string(1, 'q'));  // fewer bytes than ranks
  return out;
}

std::string without_spaces(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  return s;
}

uint64_t le64(const std::string& bytes, size_t k) {
  uint64_t v = 0;
  std::memcpy(&v, bytes.data() + 8 * k, 8);
  return v;
}

// The same handler as a group of one (what the CPU accelerator runs): the reference.
template <class H>
std::string alone(const std::string& request, uint32_t capacity = 4096) {
  std::vector<std::byte> out(capacity);
  Request req{reinterpret_cast<const std::byte*>(request.data()),
              static_cast<uint32_t>(request.size()), 0, 0};
  Response resp{out.data(), capacity, 0, 0};
  Context ctx(Group(granularity_of<H>(), 0, 1), nullptr, 0, 0);
  H{}(req, resp, ctx);
  return std::string(reinterpret_cast<const char*>(out.data()), resp.size);
}

template <class H>
class CompactTest : public ::testing::Test {};
using Compacts = ::testing::Types<Compact<Granularity::kThread>, Compact<Granularity::kWarp>,
                                  Compact<Granularity::kBlock>, Compact<Granularity::kBlock, 64>>;
TYPED_TEST_SUITE(CompactTest, Compacts);

// exclusive_sum and sum over a group: each rank's bytes land where the ranks below it end.
TYPED_TEST(CompactTest, RanksAppendTheirPartsInRankOrder) {
  const std::vector<std::string> requests = some_requests(200, 7);
  const std::vector<HarnessReply> replies = run_on_cpu(TypeParam{}, requests);
  ASSERT_EQ(replies.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_FALSE(replies[i].error()) << replies[i].bytes;
    EXPECT_EQ(replies[i].bytes, without_spaces(requests[i])) << "request " << i;
    EXPECT_EQ(replies[i].bytes, alone<TypeParam>(requests[i])) << "request " << i;
  }
}

TEST(GroupHarness, GroupSizesAreTheGpusOnes) {
  EXPECT_EQ(detail::harness_group_size<Compact<Granularity::kThread>>({}), 1u);
  EXPECT_EQ(detail::harness_group_size<Compact<Granularity::kWarp>>({}), 32u);
  EXPECT_EQ(detail::harness_group_size<Compact<Granularity::kBlock>>({}), 128u);
  EXPECT_EQ((detail::harness_group_size<Compact<Granularity::kBlock, 64>>({})), 64u);
  HarnessOptions o;
  o.block_threads = 256;
  EXPECT_EQ(detail::harness_group_size<Compact<Granularity::kBlock>>(o), 256u);
  // Run at 256: eight warps' parts.
  const std::string text = std::string(1000, 'x') + " y " + std::string(700, 'z');
  const auto replies = run_on_cpu(Compact<Granularity::kBlock>{}, {text}, o);
  EXPECT_EQ(replies[0].bytes, without_spaces(text));
  o.block_threads = 48;
  EXPECT_THROW(run_on_cpu(Compact<Granularity::kBlock>{}, {text}, o), std::invalid_argument);
}

template <class H>
class FiguresTest : public ::testing::Test {};
using AllFigures = ::testing::Types<Figures<Granularity::kThread>, Figures<Granularity::kWarp>,
                                    Figures<Granularity::kBlock>>;
TYPED_TEST_SUITE(FiguresTest, AllFigures);

// sum, max, min, any, all and broadcast: every rank gets the whole group's answer.
TYPED_TEST(FiguresTest, EveryCollectiveGivesTheGroupsAnswer) {
  const std::vector<std::string> requests = {"hello", std::string(500, 'a') + "z", "\x01\x7f",
                                             std::string(64, 'm')};
  const std::vector<HarnessReply> replies = run_on_cpu(TypeParam{}, requests);
  const uint32_t ranks = detail::harness_group_size<TypeParam>({});
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const std::string& r = requests[i];
    ASSERT_EQ(replies[i].bytes.size(), 56u);
    uint64_t sum = 0;
    for (unsigned char c : r)
      sum += c;
    const auto [lo, hi] = std::minmax_element(r.begin(), r.end(), [](char a, char b) {
      return static_cast<unsigned char>(a) < static_cast<unsigned char>(b);
    });
    const bool printable =
        std::all_of(r.begin(), r.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
    const uint32_t from = ranks > 5 ? 5 : 0;
    const uint64_t from_count = r.size() > from ? (r.size() - from + ranks - 1) / ranks : 0;
    EXPECT_EQ(le64(replies[i].bytes, 0), sum);
    EXPECT_EQ(le64(replies[i].bytes, 1), static_cast<unsigned char>(*hi));
    EXPECT_EQ(le64(replies[i].bytes, 2), static_cast<unsigned char>(*lo));
    EXPECT_EQ(le64(replies[i].bytes, 3), r.find('z') != std::string::npos ? 1u : 0u);
    EXPECT_EQ(le64(replies[i].bytes, 4), printable ? 1u : 0u);
    EXPECT_EQ(le64(replies[i].bytes, 5), from_count);
    EXPECT_EQ(le64(replies[i].bytes, 6), r.size());  // a float sum of small integers is exact
  }
}

// kBatch requests at a time, the last batch short.
TEST(GroupHarness, BatchedHandlersTakeTheirRequestsInBatches) {
  std::vector<std::string> requests;
  for (int i = 0; i < 10; ++i)
    requests.push_back(std::string(static_cast<size_t>(i * 37), static_cast<char>('a' + i)));
  const std::vector<HarnessReply> replies = run_on_cpu(BatchSums{}, requests);
  ASSERT_EQ(replies.size(), 10u);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(le64(replies[i].bytes, 0), requests[i].size() * static_cast<unsigned char>('a' + i));
}

// Rank 3 of a warp skips the sum the others make.
struct SkipsACollective {
  static constexpr Granularity kGranularity = Granularity::kWarp;
  void operator()(const Request&, Response& resp, Context& ctx) const {
    if (ctx.group().rank() == 3) return;
    const uint32_t n = ctx.group().sum(1u);
    if (ctx.group().leader()) resp.size = n > 0 ? 1 : 0;
  }
};

// Even ranks sum, odd ranks take the maximum.
struct MixesCollectives {
  static constexpr Granularity kGranularity = Granularity::kWarp;
  void operator()(const Request&, Response&, Context& ctx) const {
    const Group& g = ctx.group();
    if (g.rank() % 2 == 0) {
      (void)g.sum(1u);
    } else {
      (void)g.max(1u);
    }
  }
};

// An extra sync on rank 0 only, at the second request.
struct ExtraSync {
  static constexpr Granularity kGranularity = Granularity::kBlock;
  static constexpr uint32_t kBlockThreads = 64;
  void operator()(const Request& req, Response&, Context& ctx) const {
    ctx.group().sync();
    if (req.token == 1 && ctx.group().leader()) ctx.group().sync();
  }
};

struct ThrowsOnRank2 {
  static constexpr Granularity kGranularity = Granularity::kWarp;
  void operator()(const Request&, Response&, Context& ctx) const {
    if (ctx.group().rank() == 2) throw std::runtime_error("rank 2 gave up");
    ctx.group().sync();
  }
};

// Each of these would hang its group or read garbage on a GPU: here the run ends and says what.
TEST(GroupHarness, ABrokenGroupContractIsReportedNotHung) {
  try {
    run_on_cpu(SkipsACollective{}, {"a"});
    ADD_FAILURE() << "a skipped collective went unnoticed";
  } catch (const GroupContractError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("request 0"), std::string::npos) << e.what();
  }
  try {
    run_on_cpu(MixesCollectives{}, {"a"});
    ADD_FAILURE() << "mixed collectives went unnoticed";
  } catch (const GroupContractError& e) {
    EXPECT_NE(std::string(e.what()).find("(max)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(sum)"), std::string::npos) << e.what();
  }
  try {
    run_on_cpu(ExtraSync{}, {"a", "b", "c"});
    ADD_FAILURE() << "an extra sync went unnoticed";
  } catch (const GroupContractError& e) {
    EXPECT_NE(std::string(e.what()).find("request 1"), std::string::npos) << e.what();
  }
  try {
    run_on_cpu(ThrowsOnRank2{}, {"a", "b"});
    ADD_FAILURE() << "an exception went unnoticed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("request 0: the handler threw: rank 2 gave up"),
              std::string::npos)
        << e.what();
  }
}

// An overrun is the accelerator's error reply, as in an agent.
struct Overruns {
  static constexpr uint32_t kMaxResponseBytes = 16;
  void operator()(const Request&, Response& resp, Context&) const { resp.size = 17; }
};

TEST(GroupHarness, AnOverrunIsAnErrorReply) {
  const auto replies = run_on_cpu(Overruns{}, {"x"});
  EXPECT_TRUE(replies[0].error());
  EXPECT_EQ(replies[0].bytes, "handler wrote 17 bytes into a 16-byte response");
}

}  // namespace
}  // namespace caracal::accel::test
