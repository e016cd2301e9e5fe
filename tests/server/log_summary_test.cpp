// RepeatSummarySink: the first lines from one place in a window pass, the rest are counted and
// come out as one summary line; other places, and lines below warn, are not held back.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "metrics/log_summary.hpp"

namespace caracal::server {
namespace {

class LogSummaryTest : public ::testing::Test {
 protected:
  void make(uint32_t burst, std::chrono::milliseconds window) {
    sink_ = std::make_shared<RepeatSummarySink>(burst, window);
    auto out = std::make_shared<spdlog::sinks::ostream_sink_mt>(text_);
    out->set_pattern("%l %v");
    sink_->add_sink(out);
    logger_ = std::make_shared<spdlog::logger>("test", sink_);
    logger_->set_level(spdlog::level::trace);
  }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::istringstream in(text_.str());
    for (std::string l; std::getline(in, l);)
      out.push_back(l);
    return out;
  }

  std::ostringstream text_;
  std::shared_ptr<RepeatSummarySink> sink_;
  std::shared_ptr<spdlog::logger> logger_;
};

// The loop body is one place in the code: 100 lines from it make `burst` lines and a summary.
TEST_F(LogSummaryTest, RepeatsFromOnePlaceAreSummarised) {
  make(3, std::chrono::hours(1));
  for (int i = 0; i < 100; ++i)
    SPDLOG_LOGGER_WARN(logger_, "connection {} closed", i);
  EXPECT_EQ(lines(),
            (std::vector<std::string>{"warning connection 0 closed", "warning connection 1 closed",
                                      "warning connection 2 closed"}));
  EXPECT_EQ(sink_->suppressed(), 97u);
  sink_->summarise_now();
  const auto out = lines();
  ASSERT_EQ(out.size(), 4u);
  EXPECT_NE(out[3].find("warning 97 more like this in the last "), std::string::npos) << out[3];
  EXPECT_NE(out[3].find("; the last: connection 99 closed"), std::string::npos) << out[3];
  // Nothing left to summarise: a second call writes nothing.
  sink_->summarise_now();
  EXPECT_EQ(lines().size(), 4u);
}

TEST_F(LogSummaryTest, OtherPlacesAndLowerLevelsAreNotHeldBack) {
  make(1, std::chrono::hours(1));
  for (int i = 0; i < 3; ++i) {
    SPDLOG_LOGGER_WARN(logger_, "a {}", i);
    SPDLOG_LOGGER_ERROR(logger_, "b {}", i);
    logger_->info("c {}", i);  // info: never summarised
  }
  EXPECT_EQ(lines(), (std::vector<std::string>{"warning a 0", "error b 0", "info c 0", "info c 1",
                                               "info c 2"}));
  EXPECT_EQ(sink_->suppressed(), 4u);
  sink_->summarise_now();
  const auto out = lines();
  ASSERT_EQ(out.size(), 7u);
  // Each summary keeps the level of the lines it counts.
  EXPECT_EQ(out[5].rfind("warning 2 more like this", 0), 0u) << out[5];
  EXPECT_EQ(out[6].rfind("error 2 more like this", 0), 0u) << out[6];
}

// Once a window has passed, the next line from the place brings out the summary of the last
// window and passes itself; so does flush() (spdlog::flush_every) with no later line.
TEST_F(LogSummaryTest, AWindowThatEndsBringsOutItsSummary) {
  make(2, std::chrono::milliseconds(20));
  auto burst = [&](int n) {
    for (int i = 0; i < n; ++i)
      SPDLOG_LOGGER_WARN(logger_, "agent lost {}", i);
  };
  burst(5);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  burst(1);
  auto out = lines();
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2].rfind("warning 3 more like this in the last ", 0), 0u) << out[2];
  EXPECT_EQ(out[3], "warning agent lost 0");

  burst(4);  // one more passes (2 a window), three are counted
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  logger_->flush();
  out = lines();
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(out[5].rfind("warning 3 more like this", 0), 0u) << out[5];
  EXPECT_EQ(sink_->suppressed(), 6u);
}

}  // namespace
}  // namespace caracal::server
