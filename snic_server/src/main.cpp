// snic_server: serves the services of a YAML config to TCP and UDP clients with the handlers
// of the agents that register with it.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <yaml-cpp/yaml.h>

#include <sys/resource.h>
#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <csignal>
#include <functional>
#include <iostream>
#include <string_view>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "caracal/core/service_manager.hpp"
#include "config.hpp"
#include "metrics/log_summary.hpp"
#include "server.hpp"
#include "tunables.hpp"

#ifndef CARACAL_VERSION
#define CARACAL_VERSION "unknown"
#endif

namespace {

// Every request and reply is a heap buffer that one thread allocates and another frees (an I/O
// thread and the engine, both ways). With glibc's defaults, a free that leaves more than
// 128 KiB at the top of an arena gives the pages back to the kernel, and the next allocations
// fault them in again, which at 16 KiB messages takes a large share of the engine thread's time
// (bench/results/EXPERIMENTS.md, engine-16k-h200). The server keeps more free per arena instead,
// and buffers below a larger threshold off mmap (tunables.hpp).
void keep_freed_memory() {
#ifdef __GLIBC__
  mallopt(M_TRIM_THRESHOLD, caracal::server::tunables::kMallocTrimThreshold);
  mallopt(M_MMAP_THRESHOLD, caracal::server::tunables::kMallocMmapThreshold);
#endif
}

// Each TCP connection is a file descriptor. Service managers give a low soft limit and a high
// hard one (systemd: 1024 and 524288) and expect a program that needs more, and never calls
// select(), to raise its own; snic_server uses epoll only.
void raise_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t was = limit.rlim_cur;
  if (limit.rlim_cur != limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = was;
  }
  if (limit.rlim_cur == was) {
    spdlog::info("open files: limit {}", static_cast<uint64_t>(limit.rlim_cur));
  } else {
    spdlog::info("open files: limit {} (raised from {})", static_cast<uint64_t>(limit.rlim_cur),
                 static_cast<uint64_t>(was));
  }
}

std::string serving_status(const caracal::server::ServerConfig& config) {
  return fmt::format("serving {} service(s), log level {}", config.services.size(),
                     spdlog::level::to_string_view(spdlog::get_level()));
}

// The configuration file's settings other than log_level, in one canonical text: what a reload
// compares to tell whether anything needing a restart changed.
std::string settings_but_log_level(const std::string& path) {
  YAML::Node root = YAML::LoadFile(path);
  if (root.IsMap()) root.remove("log_level");
  YAML::Emitter out;
  out << root;
  return out.c_str();
}

// SIGHUP: reads the configuration again. The log level takes effect (unless --log-level set
// it); a file that no longer parses is reported and changes nothing; other settings need a
// restart, which the log says when they differ from `started_with`.
void reload(const std::string& path, const std::string& level_override,
            const std::string& started_with) {
  caracal::server::ServerConfig next;
  std::string settings;
  try {
    next = caracal::server::load_server_config(path);
    settings = settings_but_log_level(path);
  } catch (const std::exception& e) {
    SPDLOG_ERROR("SIGHUP: {}; nothing reloaded", e.what());
    return;
  }
  if (level_override.empty()) spdlog::set_level(spdlog::level::from_str(next.log_level));
  spdlog::info("SIGHUP: {} reloaded; log level {}{}", path,
               spdlog::level::to_string_view(spdlog::get_level()),
               level_override.empty() ? "" : " (set by --log-level)");
  if (settings != started_with) {
    SPDLOG_WARN("SIGHUP: {} has changes other than log_level; they take effect at a restart", path);
  }
}

// The counters of requests, replies and drops that this process counted, logged once it has
// stopped: the metrics endpoint is gone with the process, and a scrape before the stop misses
// what the drain answered. One line per nonzero counter sample of the services and listeners.
void log_final_counters(const caracal::server::Registry& metrics) {
  const std::string text = metrics.render();
  std::string_view rest = text;
  std::string_view counter_family;  // the counter whose samples follow, if any
  while (!rest.empty()) {
    const size_t eol = rest.find('\n');
    const std::string_view line = rest.substr(0, eol);
    rest = eol == std::string_view::npos ? std::string_view{} : rest.substr(eol + 1);
    if (line.starts_with("# TYPE ")) {
      const std::string_view decl = line.substr(7);
      const size_t space = decl.find(' ');
      const bool counter = space != std::string_view::npos && decl.substr(space + 1) == "counter";
      const std::string_view name = decl.substr(0, space);
      counter_family =
          counter && (name.starts_with("caracal_service_") || name.starts_with("caracal_listener_"))
              ? name
              : std::string_view{};
      continue;
    }
    if (counter_family.empty() || line.starts_with('#') || line.ends_with(" 0")) continue;
    spdlog::info("final counter {}", line);
  }
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  CLI::App app{
      "snic_server: Caracal's network server (serves TCP and UDP clients with handlers "
      "that run on accelerators)",
      "snic_server"};
  std::string config_path;
  bool check_only = false;
  std::string log_level;
  app.add_option("-c,--config", config_path, "YAML configuration file")->required();
  app.add_flag("--check-config", check_only, "Validate the configuration and exit");
  app.add_option("--log-level", log_level, "Override log_level (trace, debug, info, warn, error)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.set_version_flag("--version", std::string("snic_server ") + CARACAL_VERSION);
  CLI11_PARSE(app, argc, argv);

  caracal::server::ServerConfig config;
  std::string started_with;
  try {
    config = caracal::server::load_server_config(config_path);
    started_with = settings_but_log_level(config_path);
  } catch (const std::exception& e) {
    std::cerr << "snic_server: " << e.what() << "\n";
    return 2;
  }
  if (check_only) {
    std::cout << config_path << ": OK (" << config.services.size() << " service(s), "
              << config.destinations.size() << " destination(s))\n";
    return 0;
  }
  const std::string level = log_level.empty() ? config.log_level : log_level;
  // Warnings repeated from one place are summarised once a second (log_summary.hpp); the
  // periodic flush (below) writes a summary that no later line brings out.
  auto summary = std::make_shared<caracal::server::RepeatSummarySink>();
  summary->add_sink(std::make_shared<spdlog::sinks::stdout_color_sink_mt>());
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("snic_server", summary));
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");

  raise_file_limit();

  // Signals are taken by a signal_set before any thread starts, so every thread inherits the
  // mask Asio sets up and only this io_context sees them.
  boost::asio::io_context signals_io;
  boost::asio::signal_set signals(signals_io, SIGINT, SIGTERM, SIGHUP);
  int received = 0;
  // SIGHUP reloads what can change safely while serving: the log level. The rest of the file
  // is checked, and a change to it is named as one that needs a restart.
  std::function<void()> wait_for_signal = [&] {
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      if (sig != SIGHUP) {
        received = sig;
        return;
      }
      caracal::notify_reloading();
      reload(config_path, log_level, started_with);
      caracal::notify_ready(serving_status(config));
      wait_for_signal();
    });
  };
  wait_for_signal();
  // A thread: after the signal_set, as above.
  spdlog::flush_every(caracal::server::tunables::kLogFlushPeriod);

  caracal::server::Server server(config);
  if (caracal::Status s = server.start(); !s.ok()) {
    SPDLOG_ERROR("{}", s.message());
    server.stop();
    summary->summarise_now();
    return 1;
  }
  const std::string engine = config.engine_threads == 0
                                 ? std::string("the engine run by the I/O threads")
                                 : fmt::format("{} engine thread(s)", config.engine_threads);
  spdlog::info(
      "snic_server {} serving {} service(s) with {} I/O thread(s) and {}; SIGINT or "
      "SIGTERM stops it, SIGHUP reloads the log level",
      CARACAL_VERSION, config.services.size(), config.io_threads, engine);
  caracal::notify_ready(serving_status(config));
  signals_io.run();
  spdlog::info("{} received: draining requests in flight",
               received == SIGINT ? "SIGINT" : "SIGTERM");
  caracal::notify_stopping();
  server.stop();
  summary->summarise_now();
  log_final_counters(server.metrics());
  spdlog::info("stopped");
  return 0;
}
