#include "server.hpp"

#include <pthread.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <algorithm>

#include <boost/asio/executor_work_guard.hpp>

#include "tunables.hpp"

namespace caracal::server {

namespace {

// The help texts of the engine's counters say how long its spins are cut and its sleeps last.
static_assert(tunables::kContendedHold == std::chrono::seconds(1),
              "caracal_engine_spins_cut_total's help says 'for the next second'");
std::string engine_sleeps_help() {
  return fmt::format(
      "Times an engine thread (or an I/O thread running the engine) ran out of rounds to spin and "
      "went to sleep until work came, or for at most {} ms ({} us while replies were "
      "outstanding)",
      tunables::kIdleSleep.count(), tunables::kMaxPollSleep.count());
}

}  // namespace

Server::Server(ServerConfig config, ServerOptions options)
    : config_(std::move(config)),
      options_(options),
      replies_(options.reply_slots),
      engine_(
          replies_,
          EngineOptions{
              .threads = config_.engine_threads == 0 ? config_.io_threads : config_.engine_threads,
              .spins_cut = &metrics_.counter(
                  "caracal_engine_spins_cut_total",
                  "Times an engine thread (or an I/O thread running the engine) found that "
                  "other threads had taken its core for a good part of the time while it "
                  "polled, and spun short for the next second: more runnable threads than "
                  "cores"),
              .sleeps = &metrics_.counter("caracal_engine_sleeps_total", engine_sleeps_help())}),
      io_(config_.io_threads),
      memory_trim_(io_.main(), metrics_) {
  for (uint32_t i = 0; i < engine_.threads(); ++i) {
    idle_callbacks_.push_back(metrics_.counter_callback(
        "caracal_engine_idle_seconds_total",
        "Seconds an engine thread (with engine_threads 0, the I/O thread that runs it) spent in "
        "rounds that found no work: spinning, yielding or asleep. A polling thread's CPU time "
        "counts these as busy; 1 - rate(this) is the share of the thread that served requests",
        {{"thread", std::to_string(i)}}, [this, i] { return engine_.idle_seconds(i); }));
  }
  // engine_threads 0: every I/O thread hosts an engine thread (kMaxEngineThreads leaves room
  // for one per I/O thread).
  if (config_.engine_threads == 0) {
    for (uint32_t i = 0; i < io_.size(); ++i)
      engine_.host(i, io_.at(i));
  }
  for (const ServiceConfig& s : config_.services) {
    services_.push_back(std::make_unique<Service>(s, engine_, metrics_));
  }
  destinations_ = std::make_unique<Destinations>(io_, config_.destinations, engine_, metrics_,
                                                 config_.engine_threads == 0);
}

Server::~Server() {
  stop();
  for (uint64_t id : idle_callbacks_)
    metrics_.remove_callback(id);
}

void Server::warn_if_more_threads_than_cpus() const {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  const auto cpus = static_cast<uint32_t>(CPU_COUNT(&set));
  const uint32_t pollers = config_.io_threads + config_.engine_threads;
  if (pollers <= cpus) return;
  // Each I/O thread (and engine thread) polls while it has requests in flight: beyond one per
  // CPU they take turns, and a reply waits for its thread's next turn.
  SPDLOG_WARN(
      "{} I/O thread(s) and {} engine thread(s) of their own, on {} CPU(s) this process may "
      "run on: threads that poll take turns on the CPUs, which serves less than one thread per "
      "CPU and adds milliseconds to replies; give io_threads at most {}",
      config_.io_threads, config_.engine_threads, cpus,
      cpus > config_.engine_threads ? cpus - config_.engine_threads : 1);
}

void Server::warn_if_connections_exceed_file_limit() const {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  uint64_t connections = 0;
  for (const ServiceConfig& s : config_.services) {
    for (const ListenerConfig& l : s.listeners) {
      if (l.protocol == Protocol::kTcp) connections += l.max_connections;
    }
  }
  if (connections <= limit.rlim_cur) return;
  // Each connection is a descriptor; past the limit accept() fails (EMFILE), and the listeners
  // wait and retry while connections queue in their backlog.
  SPDLOG_WARN(
      "the TCP listeners take up to {} connections (max_connections), but this process may open "
      "{} files (RLIMIT_NOFILE, hard limit {}): past about that many, connections wait in the "
      "listen backlog until others close. Raise the limit (LimitNOFILE= in a systemd unit, "
      "ulimit -n) or lower max_connections",
      connections, static_cast<uint64_t>(limit.rlim_cur), static_cast<uint64_t>(limit.rlim_max));
}

Status Server::start() {
  if (started_) return invalid_argument("server already started");
  started_ = true;
  if (config_.dpdk) {
    Result<std::unique_ptr<DpdkPort>> port =
        DpdkPort::open(*config_.dpdk, replies_, metrics_, engine_.threads());
    if (!port.ok()) return port.status();
    dpdk_ = std::move(port).value();
    spdlog::info("dpdk port {}", dpdk_->description());
  }
  std::map<std::string, Service*> by_name;
  for (auto& s : services_) {
    by_name[s->name()] = s.get();
    for (const ListenerConfig& l : s->config().listeners) {
      ListenerDeps deps{io_,
                        *s,
                        replies_,
                        metrics_,
                        dpdk_.get(),
                        config_.engine_threads == 0,
                        engine_.threads(),
                        &memory_trim_};
      std::unique_ptr<Listener> listener = make_listener(l, deps);
      CARACAL_RETURN_IF_ERROR(listener->start());
      spdlog::info("service {}: listening on {} (port {})", s->name(), listener->name(),
                   listener->port());
      listeners_[s->name()].push_back(std::move(listener));
    }
  }
  control_ = std::make_unique<ControlEndpoint>(io_.main(), config_, engine_, by_name,
                                               *destinations_, metrics_);
  CARACAL_RETURN_IF_ERROR(control_->listen());
  spdlog::info("control endpoint on {} (port {})", config_.control.listen.str(), control_->port());
  if (!is_loopback_host(config_.control.listen.host)) {
    // The secret is required (parse_control), so no one registers without it; but it crosses
    // the network in the clear.
    spdlog::info(
        "control endpoint on {}, not loopback: agents there present the secret in the clear; "
        "keep this address on a link only the agents' hosts reach",
        config_.control.listen.str());
  }
  if (config_.metrics_listen) {
    metrics_server_ = std::make_unique<MetricsServer>(io_.main(), metrics_);
    CARACAL_RETURN_IF_ERROR(
        metrics_server_->listen(config_.metrics_listen->host, config_.metrics_listen->port));
    spdlog::info("metrics on http://{}:{}/metrics", config_.metrics_listen->host,
                 metrics_server_->port());
    if (!is_loopback_host(config_.metrics_listen->host)) {
      SPDLOG_WARN(
          "metrics on {}, not loopback: /metrics has no authentication, so anyone who reaches "
          "that address reads the server's counters (agents, services, refusals); leave "
          "metrics.listen out for 127.0.0.1:9100, or firewall the port",
          config_.metrics_listen->str());
    }
  }
  warn_if_more_threads_than_cpus();
  warn_if_connections_exceed_file_limit();
  memory_trim_.start();
  engine_.start();
  if (dpdk_) {
    CARACAL_RETURN_IF_ERROR(dpdk_->run());
  }
  const bool hosted = config_.engine_threads == 0;
  for (size_t i = 0; i < io_.size(); ++i) {
    threads_.emplace_back([this, hosted, i, &io = io_.at(i)] {
      pthread_setname_np(pthread_self(), "caracal-io");  // for top -H and the benchmarks
      auto guard = boost::asio::make_work_guard(io);
      if (hosted) {
        engine_.run_hosted(static_cast<uint32_t>(i));
      } else {
        io.run();
      }
    });
  }
  return Status::ok_status();
}

void Server::stop() {
  if (stopped_ || !started_) return;
  stopped_ = true;
  // 1. No new requests: listeners stop accepting and reading.
  for (auto& [name, list] : listeners_) {
    for (auto& l : list)
      l->stop();
  }
  // 2. Requests in flight get their replies, up to the drain time.
  const auto deadline = std::chrono::steady_clock::now() + options_.drain;
  while (engine_.in_flight() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(tunables::kStopPoll);
  }
  if (engine_.in_flight() > 0) {
    SPDLOG_WARN("{} request(s) still in flight after {} ms; failing them", engine_.in_flight(),
                options_.drain.count());
  }
  // 3. Agents are dropped, the engine fails what is left, connections close once written.
  if (control_) control_->stop();
  for (auto& s : services_)
    s->remove_all();
  engine_.stop();
  // Connections close by themselves once their last replies are written (each releases its
  // reply slot); whatever is still open after a moment is closed.
  const auto close_deadline = std::chrono::steady_clock::now() + tunables::kStopCloseWait;
  while (replies_.in_use() > 0 && std::chrono::steady_clock::now() < close_deadline) {
    std::this_thread::sleep_for(tunables::kStopPoll);
  }
  // The DPDK workers sent the replies of the drain; now they stop and the port closes.
  if (dpdk_) dpdk_->stop();
  for (auto& [name, list] : listeners_) {
    for (auto& l : list)
      l->close_all();
  }
  if (metrics_server_) metrics_server_->stop();
  memory_trim_.stop();
  io_.stop();
  for (auto& t : threads_)
    t.join();
  threads_.clear();
}

uint16_t Server::listener_port(const std::string& service, size_t index) const {
  auto it = listeners_.find(service);
  if (it == listeners_.end() || index >= it->second.size()) return 0;
  return it->second[index]->port();
}

uint16_t Server::metrics_port() const {
  return metrics_server_ ? metrics_server_->port() : 0;
}

}  // namespace caracal::server
