// snic_server as a library: everything a config describes, started and stopped as one. main.cpp
// adds the command line and signals; tests start a Server in-process or run the binary.
#pragma once

#include <boost/asio/io_context.hpp>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "caracal/core/status.hpp"
#include "config.hpp"
#include "control_endpoint.hpp"
#include "destinations.hpp"
#include "dispatch.hpp"
#include "front/dpdk_port.hpp"
#include "front/listeners.hpp"
#include "memory_trim.hpp"
#include "metrics/metrics.hpp"
#include "mqueue_manager/engine.hpp"
#include "reply_routing.hpp"
#include "tunables.hpp"

namespace caracal::server {

struct ServerOptions {
  // Requests of one server in flight at once (TCP connections and UDP requests share them).
  uint32_t reply_slots = tunables::kReplySlots;
  // How long stop() waits for requests in flight before failing them.
  std::chrono::milliseconds drain = tunables::kStopDrain;
};

class Server {
 public:
  explicit Server(ServerConfig config, ServerOptions options = {});
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds every listener and the control and metrics endpoints, starts the I/O threads and the
  // engine. The error names what could not start.
  Status start();
  // Stops taking requests, waits (up to options.drain) for the ones in flight to be answered,
  // then closes connections, fails what is left and joins every thread.
  void stop();

  // Bound ports (useful with port 0 in tests): "service/protocol/index" -> port.
  uint16_t listener_port(const std::string& service, size_t index) const;
  uint16_t control_port() const { return control_ ? control_->port() : 0; }
  uint16_t metrics_port() const;
  Registry& metrics() { return metrics_; }
  const ServerConfig& config() const { return config_; }

 private:
  // A warning in the log when the I/O threads and engine threads outnumber the CPUs the
  // process may run on (its affinity mask: taskset, a cpuset).
  void warn_if_more_threads_than_cpus() const;
  // A warning in the log when the TCP listeners' max_connections add up to more than the
  // process may open files (RLIMIT_NOFILE).
  void warn_if_connections_exceed_file_limit() const;

  ServerConfig config_;
  ServerOptions options_;
  // Declaration order is teardown order in reverse: the I/O context goes before the services,
  // engine and reply table its pending handlers refer to.
  Registry metrics_;
  ReplyTable replies_;
  Engine engine_;
  std::vector<std::unique_ptr<Service>> services_;
  IoPool io_;
  MemoryTrim memory_trim_;  // on io_'s first context; the listeners' connections report to it
  std::unique_ptr<Destinations> destinations_;
  std::unique_ptr<DpdkPort> dpdk_;  // with a `dpdk:` section; its listeners refer to it
  std::map<std::string, std::vector<std::unique_ptr<Listener>>> listeners_;
  std::unique_ptr<ControlEndpoint> control_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::vector<std::thread> threads_;
  // caracal_engine_idle_seconds_total, one series per engine thread: removed in ~Server, before
  // the engine they read goes.
  std::vector<uint64_t> idle_callbacks_;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace caracal::server
