#include "metrics/metrics.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace caracal::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

TEST(Metrics, RendersASmallRegistryExactly) {
  Registry r;
  r.counter("caracal_requests_total", "Requests received.", {{"service", "echo"}}).inc(3);
  r.counter("caracal_requests_total", "Requests received.", {{"service", "kv"}}).inc();
  r.gauge("caracal_agents", "Agents registered.").set(2);
  Histogram& h = r.histogram("caracal_latency_seconds", "Request latency.", {{"service", "echo"}},
                             {0.001, 0.01, 0.1});
  h.observe(0.0005);
  h.observe(0.001);  // on a bound: counts in that bucket
  h.observe(0.05);
  h.observe(2.0);
  r.gauge_callback("caracal_rx_occupancy", "Slots in use.", {{"queue", "0"}}, [] { return 0.25; });
  EXPECT_EQ(r.render(),
            "# HELP caracal_agents Agents registered.\n"
            "# TYPE caracal_agents gauge\n"
            "caracal_agents 2\n"
            "# HELP caracal_latency_seconds Request latency.\n"
            "# TYPE caracal_latency_seconds histogram\n"
            "caracal_latency_seconds_bucket{service=\"echo\",le=\"0.001\"} 2\n"
            "caracal_latency_seconds_bucket{service=\"echo\",le=\"0.01\"} 2\n"
            "caracal_latency_seconds_bucket{service=\"echo\",le=\"0.1\"} 3\n"
            "caracal_latency_seconds_bucket{service=\"echo\",le=\"+Inf\"} 4\n"
            "caracal_latency_seconds_sum{service=\"echo\"} 2.0515\n"
            "caracal_latency_seconds_count{service=\"echo\"} 4\n"
            "# HELP caracal_requests_total Requests received.\n"
            "# TYPE caracal_requests_total counter\n"
            "caracal_requests_total{service=\"echo\"} 3\n"
            "caracal_requests_total{service=\"kv\"} 1\n"
            "# HELP caracal_rx_occupancy Slots in use.\n"
            "# TYPE caracal_rx_occupancy gauge\n"
            "caracal_rx_occupancy{queue=\"0\"} 0.25\n");
}

TEST(Metrics, EscapesLabelValuesAndHelp) {
  Registry r;
  r.counter("odd_total", "Help with \\ and\na newline \"quoted\".",
            {{"path", "C:\\dir"}, {"quote", "say \"hi\""}, {"text", "two\nlines"}})
      .inc(7);
  EXPECT_EQ(r.render(),
            "# HELP odd_total Help with \\\\ and\\na newline \"quoted\".\n"
            "# TYPE odd_total counter\n"
            "odd_total{path=\"C:\\\\dir\",quote=\"say \\\"hi\\\"\",text=\"two\\nlines\"} 7\n");
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({1, 2, 4});
  for (double v : {0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, -1.0})
    h.observe(v);
  EXPECT_EQ(h.cumulative_counts(), (std::vector<uint64_t>{3, 5, 7, 8}));
  EXPECT_EQ(h.count(), 8u);
  EXPECT_DOUBLE_EQ(h.sum(), 16.0);
  h.observe(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(h.cumulative_counts(), (std::vector<uint64_t>{3, 5, 7, 9}));
  EXPECT_TRUE(std::isnan(h.sum()));
}

TEST(Metrics, HistogramBoundsAreChecked) {
  EXPECT_THROW(Histogram({1, 1}), std::invalid_argument);
  EXPECT_THROW(Histogram({2, 1}), std::invalid_argument);
  EXPECT_THROW(Histogram({1, std::numeric_limits<double>::quiet_NaN()}), std::invalid_argument);
  // A final +Inf is implied and may be given.
  Histogram h({1, std::numeric_limits<double>::infinity()});
  EXPECT_EQ(h.bounds(), (std::vector<double>{1}));
}

TEST(Metrics, SameNameAndLabelsGiveTheSameObject) {
  Registry r;
  Counter& a = r.counter("c_total", "C.", {{"a", "1"}, {"b", "2"}});
  Counter& b = r.counter("c_total", "C.", {{"b", "2"}, {"a", "1"}});
  Counter& other = r.counter("c_total", "C.", {{"a", "1"}, {"b", "3"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &other);
  a.inc(2);
  EXPECT_EQ(b.value(), 2u);
  Gauge& g = r.gauge("g", "G.");
  EXPECT_EQ(&g, &r.gauge("g", "G."));
  g.set(10);
  g.add(-15);
  EXPECT_EQ(g.value(), -5);
  Histogram& h = r.histogram("h", "H.", {}, {1, 2});
  EXPECT_EQ(&h, &r.histogram("h", "H.", {}, {1, 2}));
  // Labels render in the order of the first registration.
  EXPECT_NE(r.render().find("c_total{a=\"1\",b=\"2\"} 2\n"), std::string::npos) << r.render();
}

TEST(Metrics, ConflictingRegistrationsAreLogicErrors) {
  Registry r;
  r.counter("x_total", "X.");
  r.histogram("lat", "L.", {}, {1, 2});
  EXPECT_THROW(r.gauge("x_total", "X."), std::logic_error);
  EXPECT_THROW(r.counter("x_total", "Other help."), std::logic_error);
  EXPECT_THROW(r.histogram("lat", "L.", {}, {1, 3}), std::logic_error);
  EXPECT_THROW(r.counter("lat_count", "Clash."), std::logic_error);
  EXPECT_NO_THROW(r.histogram("x", "No clash with x_total.", {}, {1}));
  r.counter("y_sum", "Y.");
  EXPECT_THROW(r.histogram("y", "Clash.", {}, {1}), std::logic_error);
  EXPECT_THROW(r.counter("9lives", "Bad name."), std::invalid_argument);
  EXPECT_THROW(r.counter("has space", "Bad name."), std::invalid_argument);
  EXPECT_THROW(r.counter("ok_total", "Bad label.", {{"__reserved", "v"}}), std::invalid_argument);
  EXPECT_THROW(r.counter("ok_total", "Bad label.", {{"a-b", "v"}}), std::invalid_argument);
  EXPECT_THROW(r.counter("ok_total", "Twice.", {{"a", "1"}, {"a", "2"}}), std::invalid_argument);
  EXPECT_THROW(r.histogram("h2", "H.", {{"le", "1"}}, {1}), std::invalid_argument);
  // A refused registration leaves nothing behind: the name is still free for any type.
  r.gauge("ok_total", "Now a gauge.");
  try {
    r.gauge("x_total", "X.");
    FAIL() << "no exception";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("'x_total' is a counter, not a gauge"), std::string::npos)
        << e.what();
  }
}

TEST(Metrics, CallbacksAreReadAtScrapeAndRemoved) {
  Registry r;
  std::atomic<int> occupancy{3};
  const uint64_t a = r.gauge_callback("ring_occupancy", "Slots in use.", {{"agent", "a"}},
                                      [&] { return static_cast<double>(occupancy.load()); });
  const uint64_t b = r.gauge_callback("ring_occupancy", "Slots in use.", {{"agent", "b"}},
                                      [] { return std::numeric_limits<double>::infinity(); });
  EXPECT_NE(a, b);
  EXPECT_NE(r.render().find("ring_occupancy{agent=\"a\"} 3\n"), std::string::npos);
  occupancy = 17;
  EXPECT_NE(r.render().find("ring_occupancy{agent=\"a\"} 17\n"), std::string::npos);
  EXPECT_NE(r.render().find("ring_occupancy{agent=\"b\"} +Inf\n"), std::string::npos);
  EXPECT_THROW(
      r.gauge_callback("ring_occupancy", "Slots in use.", {{"agent", "a"}}, [] { return 0.0; }),
      std::logic_error);
  EXPECT_THROW(r.gauge("ring_occupancy", "Slots in use.", {{"agent", "a"}}), std::logic_error);
  r.remove_callback(a);
  EXPECT_EQ(r.render().find("agent=\"a\""), std::string::npos);
  r.remove_callback(a);  // twice: ignored
  r.remove_callback(b);
  EXPECT_EQ(r.render(), "") << "a family with no series is left out";
  // The agent comes back with the same labels.
  r.gauge_callback("ring_occupancy", "Slots in use.", {{"agent", "a"}}, [] { return 1.5; });
  EXPECT_NE(r.render().find("ring_occupancy{agent=\"a\"} 1.5\n"), std::string::npos);
}

TEST(Metrics, ACounterCallbackIsACounterReadAtScrape) {
  Registry r;
  double seconds = 0.25;
  const uint64_t id = r.counter_callback("busy_seconds_total", "Seconds busy.", {{"thread", "0"}},
                                         [&] { return seconds; });
  std::string text = r.render();
  EXPECT_NE(text.find("# TYPE busy_seconds_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("busy_seconds_total{thread=\"0\"} 0.25\n"), std::string::npos) << text;
  seconds = 3.5;
  EXPECT_NE(r.render().find("busy_seconds_total{thread=\"0\"} 3.5\n"), std::string::npos);
  // A plain counter of the same family has series of its own; not these labels.
  r.counter("busy_seconds_total", "Seconds busy.", {{"thread", "1"}}).inc(2);
  EXPECT_NE(r.render().find("busy_seconds_total{thread=\"1\"} 2\n"), std::string::npos);
  EXPECT_THROW(r.counter("busy_seconds_total", "Seconds busy.", {{"thread", "0"}}),
               std::logic_error);
  EXPECT_THROW(r.counter_callback("busy_seconds_total", "Seconds busy.", {{"thread", "0"}},
                                  [] { return 0.0; }),
               std::logic_error);
  // Neither a gauge's name nor an empty function.
  r.gauge("occupancy", "Slots in use.").set(1);
  try {
    r.counter_callback("occupancy", "Slots in use.", {}, [] { return 0.0; });
    ADD_FAILURE() << "a gauge's name was taken for a counter";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("is a gauge, not a counter"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(r.counter_callback("other_total", "Other.", {}, nullptr), std::invalid_argument);
  r.remove_callback(id);
  EXPECT_EQ(r.render().find("thread=\"0\""), std::string::npos);
}

TEST(Metrics, LatencyBucketsSpanOneMicrosecondToOneSecond) {
  const std::vector<double> b = latency_buckets_seconds();
  ASSERT_GE(b.size(), 10u);
  EXPECT_DOUBLE_EQ(b.front(), 1e-6);
  EXPECT_DOUBLE_EQ(b.back(), 1.0);
  for (size_t i = 1; i < b.size(); ++i) {
    const double step = b[i] / b[i - 1];
    EXPECT_GE(step, 1.9) << i;
    EXPECT_LE(step, 2.6) << i;
  }
  EXPECT_NO_THROW(Histogram{b});
}

// Writers on several threads while another thread renders and registers: no update is lost and
// every scrape sees counters that never go backwards. Run under TSan by scripts/test.sh.
TEST(Metrics, ConcurrentUpdatesWhileRendering) {
  Registry r;
  constexpr int kThreads = 4;
  constexpr int kIterations = 20000;
  Counter& shared = r.counter("shared_total", "Shared.");
  Gauge& level = r.gauge("level", "Level.");
  Histogram& h = r.histogram("lat_seconds", "Latency.", {}, latency_buckets_seconds());
  std::atomic<bool> done{false};

  auto value_of = [](const std::string& text, const std::string& series) -> uint64_t {
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return 0;
    return std::stoull(text.substr(at + series.size() + 2));
  };
  std::thread scraper([&] {
    uint64_t last = 0;
    uint64_t last_count = 0;
    int scrapes = 0;
    while (!done.load() || scrapes < 3) {
      const std::string text = r.render();
      const uint64_t now = value_of(text, "shared_total");
      const uint64_t count = value_of(text, "lat_seconds_count");
      EXPECT_GE(now, last);
      EXPECT_GE(count, last_count);
      EXPECT_EQ(value_of(text, "lat_seconds_bucket{le=\"+Inf\"}"), count);
      last = now;
      last_count = count;
      const uint64_t id = r.gauge_callback("scrape_cb", "Cb.", {{"n", std::to_string(scrapes)}},
                                           [] { return 1.0; });
      r.remove_callback(id);
      ++scrapes;
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      Counter& mine = r.counter("per_thread_total", "Per thread.", {{"t", std::to_string(t)}});
      for (int i = 0; i < kIterations; ++i) {
        shared.inc();
        mine.inc(2);
        level.add(1);
        h.observe(1e-6 * (i % 1000));
      }
    });
  }
  for (auto& w : writers)
    w.join();
  done = true;
  scraper.join();

  EXPECT_EQ(shared.value(), uint64_t{kThreads} * kIterations);
  EXPECT_EQ(level.value(), int64_t{kThreads} * kIterations);
  EXPECT_EQ(h.count(), uint64_t{kThreads} * kIterations);
  const std::string text = r.render();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_NE(text.find("per_thread_total{t=\"" + std::to_string(t) + "\"} " +
                        std::to_string(2 * kIterations) + "\n"),
              std::string::npos);
  }
}

// ---- the HTTP endpoint -------------------------------------------------------------------------

class MetricsHttp : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.counter("requests_total", "Requests.", {{"service", "echo"}}).inc(42);
    Status s = server_.listen("127.0.0.1", 0);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_NE(server_.port(), 0);
    io_thread_ = std::thread([this] { io_.run(); });
  }

  void TearDown() override { stop_and_join(); }

  // stop() must leave the io_context without work, so run() returns by itself.
  void stop_and_join() {
    if (!io_thread_.joinable()) return;
    server_.stop();
    auto done = std::async(std::launch::async, [this] { io_thread_.join(); });
    if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "io_context still has work 10 s after stop()";
      io_.stop();
      done.wait();
    }
  }

  tcp::socket connect() {
    tcp::socket s(client_io_);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_.port()));
    return s;
  }

  static http::response<http::string_body> exchange(tcp::socket& s, http::verb method,
                                                    const std::string& target,
                                                    bool keep_alive = true) {
    http::request<http::string_body> req(method, target, 11);
    req.set(http::field::host, "127.0.0.1");
    req.keep_alive(keep_alive);
    http::write(s, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.skip(method == http::verb::head);
    http::read(s, buffer, parser);
    return parser.release();
  }

  Registry registry_;
  net::io_context io_;
  net::io_context client_io_;
  MetricsServer server_{io_, registry_};
  std::thread io_thread_;
};

TEST_F(MetricsHttp, GetMetricsKeepsTheConnectionAlive) {
  tcp::socket s = connect();
  auto res = exchange(s, http::verb::get, "/metrics");
  EXPECT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(res[http::field::content_type], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res.body(), registry_.render());
  EXPECT_NE(res.body().find("requests_total{service=\"echo\"} 42\n"), std::string::npos);
  EXPECT_TRUE(res.keep_alive());
  // The same connection serves the next scrape, which sees the new value.
  registry_.counter("requests_total", "Requests.", {{"service", "echo"}}).inc();
  res = exchange(s, http::verb::get, "/metrics?format=text");
  EXPECT_EQ(res.result(), http::status::ok);
  EXPECT_NE(res.body().find("requests_total{service=\"echo\"} 43\n"), std::string::npos);
  res = exchange(s, http::verb::head, "/metrics");
  EXPECT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(res[http::field::content_length], std::to_string(registry_.render().size()));
  EXPECT_TRUE(res.body().empty());
  // HEAD sent no body: the next reply on the connection is parsed from its first byte.
  res = exchange(s, http::verb::get, "/metrics");
  EXPECT_EQ(res.result(), http::status::ok);
  EXPECT_EQ(res.body(), registry_.render());
}

TEST_F(MetricsHttp, OtherPathsAreNotFound) {
  tcp::socket s = connect();
  auto res = exchange(s, http::verb::get, "/");
  EXPECT_EQ(res.result(), http::status::not_found);
  res = exchange(s, http::verb::get, "/metricsx");
  EXPECT_EQ(res.result(), http::status::not_found);
  EXPECT_NE(res.body().find("/metricsx"), std::string::npos);
  // Still usable after an error reply.
  res = exchange(s, http::verb::get, "/metrics");
  EXPECT_EQ(res.result(), http::status::ok);
}

TEST_F(MetricsHttp, OtherMethodsAreNotAllowed) {
  tcp::socket s = connect();
  for (http::verb v : {http::verb::post, http::verb::put, http::verb::delete_}) {
    auto res = exchange(s, v, "/metrics");
    EXPECT_EQ(res.result(), http::status::method_not_allowed) << http::to_string(v);
    EXPECT_EQ(res[http::field::allow], "GET, HEAD");
  }
}

TEST_F(MetricsHttp, OversizedRequestIsRefusedAndClosed) {
  tcp::socket s = connect();
  http::request<http::string_body> req(http::verb::get, "/metrics", 11);
  req.set("X-Filler", std::string(16384, 'a'));
  http::write(s, req);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(s, buffer, res);
  EXPECT_EQ(res.result(), http::status::payload_too_large);
  EXPECT_FALSE(res.keep_alive());
  beast::error_code ec;
  http::read(s, buffer, res, ec);
  EXPECT_EQ(ec, http::error::end_of_stream) << ec.message();
}

TEST_F(MetricsHttp, ConnectionCloseIsHonoured) {
  tcp::socket s = connect();
  auto res = exchange(s, http::verb::get, "/metrics", /*keep_alive=*/false);
  EXPECT_EQ(res.result(), http::status::ok);
  EXPECT_FALSE(res.keep_alive());
  char byte;
  beast::error_code ec;
  s.read_some(net::buffer(&byte, 1), ec);
  EXPECT_EQ(ec, net::error::eof) << ec.message();
}

TEST_F(MetricsHttp, StopClosesOpenConnections) {
  tcp::socket s = connect();
  auto res = exchange(s, http::verb::get, "/metrics");
  ASSERT_EQ(res.result(), http::status::ok);
  stop_and_join();
  char byte;
  beast::error_code ec;
  s.read_some(net::buffer(&byte, 1), ec);
  EXPECT_TRUE(ec == net::error::eof || ec == net::error::connection_reset) << ec.message();
  tcp::socket again(client_io_);
  again.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), server_.port()), ec);
  EXPECT_TRUE(ec) << "still accepting after stop()";
}

TEST_F(MetricsHttp, Curl) {
  if (std::system("curl --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "curl not installed";
  const std::string out = ::testing::TempDir() + "caracal_metrics_curl.txt";
  const std::string url = "http://127.0.0.1:" + std::to_string(server_.port());
  const std::string cmd =
      "curl -sS --max-time 10 -o " + out + " -w '%{http_code} %{content_type}' " + url + "/metrics";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[256] = {};
  const size_t n = fread(line, 1, sizeof line - 1, p);
  ASSERT_EQ(pclose(p), 0) << cmd;
  EXPECT_EQ(std::string(line, n), "200 text/plain; version=0.0.4; charset=utf-8");
  std::ifstream f(out);
  std::stringstream body;
  body << f.rdbuf();
  EXPECT_EQ(body.str(), registry_.render());
  std::remove(out.c_str());

  const std::string code404 =
      "test \"$(curl -sS --max-time 10 -o /dev/null -w '%{http_code}' " + url + "/nope)\" = 404";
  EXPECT_EQ(std::system(code404.c_str()), 0) << code404;
  const std::string code405 = "test \"$(curl -sS --max-time 10 -o /dev/null -w '%{http_code}' " +
                              std::string("-X POST ") + url + "/metrics)\" = 405";
  EXPECT_EQ(std::system(code405.c_str()), 0) << code405;
}

TEST(MetricsServer, ListenErrorsNameTheAddress) {
  net::io_context io;
  Registry r;
  MetricsServer first(io, r);
  ASSERT_TRUE(first.listen("127.0.0.1", 0).ok());
  MetricsServer second(io, r);
  const Status busy = second.listen("127.0.0.1", first.port());
  ASSERT_FALSE(busy.ok());
  EXPECT_NE(busy.message().find("127.0.0.1:" + std::to_string(first.port())), std::string::npos)
      << busy.message();
  EXPECT_EQ(second.port(), 0);
  const Status twice = first.listen("127.0.0.1", 0);
  EXPECT_FALSE(twice.ok());
  const Status bad = MetricsServer(io, r).listen("no-such-host.invalid", 9100);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("no-such-host.invalid"), std::string::npos) << bad.message();
}

}  // namespace
}  // namespace caracal::server
