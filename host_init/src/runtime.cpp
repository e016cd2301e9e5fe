#include "caracal/agent/runtime.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "caracal/agent/settings.hpp"
#include "caracal/agent/setup.hpp"
#include "caracal/agent/shm_region.hpp"
#include "caracal/control/connection.hpp"
#include "caracal/control/protocol.hpp"
#include "caracal/core/service_manager.hpp"
#include "caracal/mqueue/validate.hpp"
#ifdef CARACAL_HAVE_RDMA
#include <boost/asio/posix/stream_descriptor.hpp>

#include "caracal/mqueue/rdma.hpp"
#endif

namespace caracal::agent {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
// The least time between two log lines of one service's handler errors.
constexpr std::chrono::seconds kHandlerErrorLogPeriod{1};
using std::chrono::milliseconds;

long long to_milliseconds(Clock::duration d) {
  return std::chrono::duration_cast<milliseconds>(d).count();
}

// The agent's end of the control channel: a control::Connection whose frames queue in an
// inbox that the runtime drains, and whose end is kept as the error to report. Used only by
// the thread that runs the io_context.
class ServerLink : public std::enable_shared_from_this<ServerLink> {
 public:
  ServerLink(asio::io_context& io, std::string peer)
      : conn_(std::make_shared<control::Connection>(tcp::socket(io))), peer_(std::move(peer)) {}

  void start_connect(const tcp::resolver::results_type& endpoints) {
    asio::async_connect(
        conn_->socket(), endpoints,
        [self = shared_from_this()](const boost::system::error_code& ec, const tcp::endpoint&) {
          if (self->conn_->closed()) return;
          if (ec) return self->fail(ec.message());
          self->connected_ = true;
          // Weak: the runtime owns the link while it serves, and the connection's callbacks
          // must not keep it (and so themselves) alive after that.
          std::weak_ptr<ServerLink> weak = self;
          self->conn_->start({
              .on_message =
                  [weak](control::Message&& m) {
                    auto link = weak.lock();
                    if (!link) return false;
                    link->inbox_.push_back(std::move(m));
                    return true;
                  },
              .on_end =
                  [weak](control::Connection::Ending ending, const std::string& why) {
                    auto link = weak.lock();
                    if (!link) return;
                    link->fail(ending == control::Connection::Ending::kClosed
                                   ? "the server closed the connection"
                                   : link->peer_ + ": " + why);
                  },
          });
        });
  }

  bool connected() const { return connected_; }
  bool failed() const { return error_.has_value(); }
  const std::string& error() const { return *error_; }
  bool has_message() const { return !inbox_.empty(); }
  const std::string& peer() const { return peer_; }

  std::optional<control::Message> pop() {
    if (inbox_.empty()) return std::nullopt;
    control::Message m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }

  void send(const control::Message& m) {
    if (!failed()) conn_->send(m);
  }

  // Records why the connection is unusable (the first reason wins).
  void fail(std::string why) {
    if (!error_) error_ = std::move(why);
  }

  void close() { conn_->close(); }

 private:
  std::shared_ptr<control::Connection> conn_;
  std::string peer_;
  bool connected_ = false;
  std::optional<std::string> error_;
  std::deque<control::Message> inbox_;
};

#ifdef CARACAL_HAVE_RDMA
// transport rdma: a region's exporter and the watch on its event fd, serviced by the runtime's
// event loop (accepting the server's connections, cleaning up after disconnects). The watch
// gives the fd back (release) before the exporter closes it.
class ExporterWatch {
 public:
  ExporterWatch(asio::io_context& io, std::unique_ptr<mqueue::RdmaRegionExporter> exporter,
                std::string service)
      : exporter_(std::move(exporter)),
        events_(io, exporter_->event_fd()),
        service_(std::move(service)) {
    arm();
  }
  ExporterWatch(const ExporterWatch&) = delete;
  ExporterWatch& operator=(const ExporterWatch&) = delete;
  ~ExporterWatch() {
    boost::system::error_code ignored;
    events_.cancel(ignored);
    (void)events_.release();
  }
  mqueue::RdmaRegionExporter& exporter() { return *exporter_; }

 private:
  void arm() {
    // The handler of a cancelled wait runs after this object is gone: it touches nothing then.
    events_.async_wait(
        asio::posix::stream_descriptor::wait_read, [this](const boost::system::error_code& ec) {
          if (ec) return;
          const uint32_t before = exporter_->connections();
          if (Status s = exporter_->poll(); !s.ok()) {
            spdlog::warn("service '{}': rdma: {}", service_, s.message());
          }
          const uint32_t after = exporter_->connections();
          if (after != before) {
            spdlog::info("service '{}': rdma: {} server connection(s)", service_, after);
          }
          arm();
        });
  }

  std::unique_ptr<mqueue::RdmaRegionExporter> exporter_;
  asio::posix::stream_descriptor events_;
  std::string service_;
};
#endif

// One region with the accelerator serving it. Members are destroyed in reverse order: the
// exporter first (its queue pairs and its registration of the region go before the memory they
// name), then the accelerator (stopped, and with region_memory gpu its region in device memory
// freed, or kept if the kernel did not return), then the host memory.
struct ServedRegion {
  const ServiceConfig* service = nullptr;
  NamedShmRegion region;      // transport shm
  mqueue::ShmMapping memory;  // transport rdma: host memory (an anonymous memfd mapping)
  std::unique_ptr<ServingAccelerator> accelerator;
  // The handler errors the log has told of (Session::log_handler_errors), and when it may next.
  uint64_t errors_logged = 0;
  Clock::time_point next_error_log{};
  // transport rdma with region_memory gpu: `accelerator`, which owns the region in device memory.
  DeviceRegionServing* device_region = nullptr;
#ifdef CARACAL_HAVE_RDMA
  std::unique_ptr<ExporterWatch> rdma;
#endif

  // A region in host memory (shm, or rdma with region_memory host).
  std::byte* data() const {
    return memory.data() != nullptr ? memory.data() : region.data();
  }
  uint64_t bytes() const {
    if (device_region != nullptr) return device_region->header().region_bytes;
    return memory.data() != nullptr ? memory.size() : region.bytes();
  }
  const mqueue::RegionHeader& header() const {
    if (device_region != nullptr) return device_region->header();
    return *reinterpret_cast<const mqueue::RegionHeader*>(data());
  }
};

// Everything one registration created. Stopping it stops every accelerator, then unmaps the
// regions (removing any name still there).
class Session {
 public:
  // The first accelerator that fails to stop is recorded in `stop_failure`.
  explicit Session(Status& stop_failure) : stop_failure_(stop_failure) {}
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() { stop(); }

  void add(ServedRegion served) { served_.push_back(std::move(served)); }
  ServedRegion& back() { return served_.back(); }
  size_t size() const { return served_.size(); }

  // Stops every accelerator, then drops the regions. An accelerator that cannot be stopped
  // (a GPU kernel that ignores its stop word) is logged and recorded; the run ends with it.
  void stop() {
    log_handler_errors(Clock::now(), true);
    for (ServedRegion& s : served_) {
      if (!s.accelerator) continue;
      if (Status st = s.accelerator->stop(); !st.ok()) {
        spdlog::error("service '{}': {}", s.service->name, st.message());
        if (stop_failure_.ok()) stop_failure_ = st;
      }
    }
    served_.clear();
  }

  // Requests the handlers failed since the last such line, at most a line per service and
  // kHandlerErrorLogPeriod: the clients were told only that the handler failed.
  // `flush`: whatever the time (the session is ending).
  void log_handler_errors(Clock::time_point now, bool flush = false) {
    for (ServedRegion& s : served_) {
      if (!s.accelerator || (!flush && now < s.next_error_log)) continue;
      const ServingAccelerator::HandlerErrors e = s.accelerator->handler_errors();
      if (e.count <= s.errors_logged) continue;
      spdlog::warn(
          "service '{}': the handler failed {} request(s), each answered with an error "
          "reply; the last: {}",
          s.service->name, e.count - s.errors_logged, e.last);
      s.errors_logged = e.count;
      s.next_error_log = now + kHandlerErrorLogPeriod;
    }
  }

  // The first accelerator that stopped serving on its own, with why.
  Status health() {
    for (ServedRegion& s : served_) {
      if (!s.accelerator) continue;
      if (Status st = s.accelerator->health(); !st.ok()) {
        return Status(st.code(), "service '" + s.service->name + "': the accelerator (" +
                                     s.accelerator->describe() + ") stopped: " + st.message());
      }
    }
    return Status::ok_status();
  }

 private:
  Status& stop_failure_;
  std::vector<ServedRegion> served_;
};

// How a registration ended.
struct Outcome {
  enum Kind { kStopped, kLost, kFatal } kind;
  std::string why;  // kLost
  Status status;    // kFatal
  // kLost: the server throttles this address and asked for this long before the next try.
  std::chrono::milliseconds retry_after{0};
};

Outcome stopped() {
  return Outcome{Outcome::kStopped, {}, {}};
}
Outcome lost(std::string why) {
  return Outcome{Outcome::kLost, std::move(why), {}};
}
Outcome fatal(Status status) {
  return Outcome{Outcome::kFatal, {}, std::move(status)};
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "a signal";
  }
}

}  // namespace

struct AgentRuntime::Impl {
  Impl(AgentConfig c, HandlerBackends b, RuntimeOptions o)
      : config(std::move(c)), backends(std::move(b)), options(o), pid(getpid()) {}

  Status run();

  // Runs handlers until `done()` holds, `deadline` passes, or (when `interruptible`) a stop is
  // requested.
  template <class Done>
  void pump_until(Clock::time_point deadline, Done done, bool interruptible = true) {
    while (!done() && !(interruptible && stop_requested) && Clock::now() < deadline) {
      io.run_one_until(deadline);
    }
  }
  void sleep_for(milliseconds d) {
    pump_until(Clock::now() + d, [] { return false; });
  }

  std::shared_ptr<ServerLink> connect();
  Status serve_until_stopped();
  Outcome serve(ServerLink& conn);
  // The handler backends that start service `index`: its own, made by setup, or the agent's.
  const HandlerBackends& backends_of(size_t index) const {
    return handlers.empty() ? backends : handlers[index].backends;
  }
  Status set_up_services();
  void wait_for_signal();
  void tear_down_services();
  Status start_service(size_t index, uint64_t epoch, Session& session);
  Status start_in_device_memory(size_t index, uint64_t epoch, ServedRegion& served);
  void goodbye(ServerLink& conn, Session& session);

  AgentConfig config;
  HandlerBackends backends;
  RuntimeOptions options;
  pid_t pid;
  AcceleratorChoice accelerator;
  // A handler with state: each service's, by service index, from set_up_services() until
  // tear_down_services(). Empty for a handler without state.
  std::vector<ServiceHandler> handlers;

  asio::io_context io;
  // Keeps run_one_until() waiting for the deadline when nothing is pending.
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::optional<asio::signal_set> signals;
  // Set by handlers, which run on the thread in run() only; other threads post them.
  bool stop_requested = false;
  // The first failure to stop an accelerator: the run ends with it.
  Status stop_status;
  // Written by run(), read by anyone for reporting: relaxed is enough.
  std::atomic<uint64_t> registrations{0};
};

std::shared_ptr<ServerLink> AgentRuntime::Impl::connect() {
  auto conn = std::make_shared<ServerLink>(io, config.server.str());
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  const auto endpoints =
      resolver.resolve(config.server.host, std::to_string(config.server.port), ec);
  if (ec) {
    conn->fail("cannot resolve '" + config.server.host + "': " + ec.message());
    return conn;
  }
  conn->start_connect(endpoints);
  pump_until(Clock::now() + options.connect_timeout,
             [&] { return conn->connected() || conn->failed(); });
  if (!conn->connected() && !conn->failed()) {
    conn->fail(stop_requested ? "stopped while connecting"
                              : "no connection within " +
                                    std::to_string(options.connect_timeout.count()) + " ms");
  }
  return conn;
}

// transport rdma with region_memory gpu: the region in the memory of the agent's GPU, with the
// handler's kernel serving it (GpuDeviceServing in gpu_backend.cuh says how the ordering holds
// against the NIC). The device's write-ordering attribute is checked first: the kernel's
// acquire of an RX tail sees the slots the NIC wrote before it only where the GPU orders remote
// writes for its own kernels.
Status AgentRuntime::Impl::start_in_device_memory(size_t index, uint64_t epoch,
                                                  ServedRegion& served) {
  const ServiceConfig& service = config.services[index];
  const HandlerBackends& started = backends_of(index);
  const std::string who = "service '" + service.name + "': ";
  if (accelerator.kind != AcceleratorKind::kGpu || !started.gpu ||
      !started.gpu->start_in_device_memory) {
    return Status(StatusCode::kInvalidArgument,
                  who +
                      "rdma.region_memory gpu needs the GPU accelerator, and this agent runs on " +
                      accelerator.str());
  }
  Result<std::string> caps = backends.gpu->check_rdma_memory(accelerator.gpu);
  if (!caps.ok()) {
    return Status(caps.status().code(),
                  who + "cannot place its region in GPU memory: " + caps.status().message());
  }
  Result<std::unique_ptr<DeviceRegionServing>> serving = started.gpu->start_in_device_memory(
      service.geometry(/*gpu_across_pcie=*/false), epoch, accelerator.gpu, config.gpu);
  if (!serving.ok()) {
    return Status(serving.status().code(),
                  who + "cannot start the " + accelerator.str() +
                      " accelerator on a region in its memory: " + serving.status().message());
  }
  served.device_region = serving->get();
  served.accelerator = std::move(serving).value();
  spdlog::info("service '{}': region of {} bytes in {} memory at {} ({})", service.name,
               served.bytes(), accelerator.str(),
               static_cast<void*>(served.device_region->region()), *caps);
  return Status::ok_status();
}

Status AgentRuntime::Impl::start_service(size_t index, uint64_t epoch, Session& session) {
  const ServiceConfig& service = config.services[index];
  const HandlerBackends& started = backends_of(index);
  ServedRegion served;
  served.service = &service;
  const bool in_device_memory =
      config.transport == TransportKind::kRdma && config.rdma.region_memory == RegionMemory::kGpu;
  const mqueue::RegionGeometry geometry =
      service.geometry(accelerator.kind == AcceleratorKind::kGpu && !in_device_memory,
                       config.transport == TransportKind::kShm);
  if (in_device_memory) {
    CARACAL_RETURN_IF_ERROR(start_in_device_memory(index, epoch, served));
  } else if (config.transport == TransportKind::kShm) {
    const std::string name = region_shm_name(config.agent, pid, service.name);
    Result<NamedShmRegion> region = NamedShmRegion::create(name, geometry, epoch);
    if (!region.ok()) {
      return Status(
          region.status().code(),
          "service '" + service.name + "': cannot create its region: " + region.status().message());
    }
    served.region = std::move(region).value();
  } else {
    // rdma: the region in host memory (a memfd mapping, so it shows in /proc/PID/fd), written
    // before the exporter registers it and before the announcement: plain stores suffice.
    CARACAL_RETURN_IF_ERROR(mqueue::validate_geometry(geometry));
    const mqueue::RegionHeader header = mqueue::compute_layout(geometry, epoch);
    Result<mqueue::ShmMapping> m = mqueue::ShmMapping::create_memfd(
        "caracal-" + config.agent + "-" + service.name, header.region_bytes);
    if (!m.ok()) {
      return Status(
          m.status().code(),
          "service '" + service.name + "': cannot allocate its region: " + m.status().message());
    }
    served.memory = std::move(m).value();
    mqueue::initialize_region(served.memory.data(), header);
  }
  if (!in_device_memory) {
    StartResult serving = Status(StatusCode::kInternal, "no backend for " + accelerator.str());
    if (accelerator.kind == AcceleratorKind::kCpu && started.cpu) {
      serving = started.cpu(mqueue::RegionView(served.data()), config.cpu);
    } else if (accelerator.kind == AcceleratorKind::kGpu && started.gpu && started.gpu->start) {
      serving = started.gpu->start(served.data(), served.bytes(), accelerator.gpu, config.gpu);
    }
    if (!serving.ok()) {
      return Status(serving.status().code(), "service '" + service.name + "': cannot start the " +
                                                 accelerator.str() +
                                                 " accelerator: " + serving.status().message());
    }
    served.accelerator = std::move(serving).value();
  }
#ifdef CARACAL_HAVE_RDMA
  if (config.transport == TransportKind::kRdma) {
    mqueue::RdmaExportOptions o;
    o.bind_address = config.rdma.bind_address;
    o.port = config.rdma.port;
    o.max_connections = config.rdma.max_connections;
    mqueue::RdmaMemory memory{mqueue::RdmaMemory::Kind::kHost, served.memory.data(),
                              served.memory.size(), -1, 0};
    int dma_buf = -1;
    if (in_device_memory) {
      // The dma-buf covers the whole allocation (DeviceRegion rounds it to 2 MiB); the region
      // starts at its offset 0. The registration falls back to peer memory on the device
      // pointer where the NIC's driver refuses the dma-buf (registration() says which).
      Result<int> fd = served.device_region->export_dma_buf();
      if (!fd.ok()) {
        (void)served.accelerator->stop();
        return Status(fd.status().code(),
                      "service '" + service.name + "': rdma: " + fd.status().message());
      }
      dma_buf = *fd;
      memory = mqueue::RdmaMemory{mqueue::RdmaMemory::Kind::kGpuDmabuf,
                                  served.device_region->region(), served.bytes(), dma_buf, 0};
    }
    Result<std::unique_ptr<mqueue::RdmaRegionExporter>> x =
        mqueue::RdmaRegionExporter::listen(o, memory);
    // A registration holds its own reference to the dma-buf: the fd is not needed after it.
    if (dma_buf >= 0) close(dma_buf);
    if (!x.ok()) {
      (void)served.accelerator->stop();
      return Status(x.status().code(),
                    "service '" + service.name + "': rdma: " + x.status().message());
    }
    served.rdma = std::make_unique<ExporterWatch>(io, std::move(x).value(), service.name);
    mqueue::RdmaRegionExporter& e = served.rdma->exporter();
    spdlog::info("service '{}': region of {} bytes exported over rdma on {}:{} (device {}, {})",
                 service.name, served.bytes(), config.rdma.bind_address, e.port(), e.device_name(),
                 e.registration());
  }
#endif
  spdlog::info("service '{}': serving on {}", service.name, served.accelerator->describe());
  session.add(std::move(served));
  return Status::ok_status();
}

// The announcement of a started service's region.
static control::RegionAnnounce announcement(const AgentConfig& config, const ServiceConfig& s,
                                            ServedRegion& served) {
  control::RegionAnnounce a;
  a.service = s.name;
  a.transport = "shm";
  a.shm_name = served.region.name();
  a.region_bytes = served.bytes();
  a.destinations = s.destinations();
#ifdef CARACAL_HAVE_RDMA
  if (config.transport == TransportKind::kRdma) {
    const mqueue::RdmaRegionAddress x = served.rdma->exporter().exported();
    a.transport = "rdma";
    a.shm_name.clear();
    a.rdma_host = config.rdma.bind_address;
    a.rdma_port = served.rdma->exporter().port();
    a.rdma_address = x.address;
    a.rdma_rkey = x.rkey;
  }
#else
  (void)config;
#endif
  return a;
}

void AgentRuntime::Impl::goodbye(ServerLink& conn, Session& session) {
  conn.send(control::Bye{});
  const auto deadline = Clock::now() + options.bye_timeout;
  bool confirmed = false;
  // The accelerators keep serving meanwhile: the server sends its bye once the replies in
  // flight have come back. Heartbeat answers and late messages are dropped.
  while (!confirmed && !conn.failed() && Clock::now() < deadline) {
    pump_until(
        deadline, [&] { return conn.has_message() || conn.failed(); },
        /*interruptible=*/false);
    while (auto m = conn.pop()) {
      if (std::holds_alternative<control::Bye>(*m)) confirmed = true;
    }
  }
  if (confirmed) {
    spdlog::info("the server confirmed the detach");
  } else {
    spdlog::warn("no bye from the server within {} ms ({}); detaching anyway",
                 options.bye_timeout.count(),
                 conn.failed() ? conn.error() : std::string("no answer"));
  }
  session.stop();
}

Outcome AgentRuntime::Impl::serve(ServerLink& conn) {
  Session session(stop_status);
  const uint64_t epoch = fresh_epoch();
  conn.send(control::Hello{control::kProtocolVersion, config.secret, config.agent, epoch,
                           accelerator.str()});
  pump_until(Clock::now() + options.handshake_timeout,
             [&] { return conn.has_message() || conn.failed(); });
  if (stop_requested) return stopped();  // not registered yet: nothing to detach
  if (!conn.has_message()) {
    return lost(conn.failed() ? conn.error()
                              : "no answer to hello within " +
                                    std::to_string(options.handshake_timeout.count()) + " ms");
  }
  const control::Message first = *conn.pop();
  if (const auto* r = std::get_if<control::Refused>(&first)) {
    if (r->retry_after_ms != 0) {
      // Throttled: failed hellos from this address (ours or another process's); the secret was
      // not even compared. For now, not for good.
      Outcome o = lost("the server at " + conn.peer() + " refused agent '" + config.agent +
                       "' for now: " + r->message);
      o.retry_after = milliseconds(r->retry_after_ms);
      return o;
    }
    return fatal(Status(
        StatusCode::kUnavailable,
        "the server at " + conn.peer() + " refused agent '" + config.agent + "': " + r->message));
  }
  const auto* welcome = std::get_if<control::Welcome>(&first);
  if (welcome == nullptr) {
    return lost(std::string("protocol error: the server answered hello with '") +
                control::type_name(first) + "'");
  }
  const milliseconds heartbeat_interval(welcome->heartbeat_interval_ms);
  const milliseconds timeout(welcome->agent_timeout_ms);
  spdlog::info("registered with {} as '{}' (epoch {:016x}); heartbeat every {} ms, timeout {} ms",
               conn.peer(), config.agent, epoch, heartbeat_interval.count(), timeout.count());

  auto last_heard = Clock::now();
  auto next_heartbeat = last_heard + heartbeat_interval;
  size_t next_service = 0;  // the service announced (awaiting) or to announce next
  bool awaiting = false;
  for (;;) {
    if (!awaiting && next_service < config.services.size()) {
      const ServiceConfig& s = config.services[next_service];
      if (Status st = start_service(next_service, epoch, session); !st.ok()) {
        goodbye(conn, session);
        return fatal(st);
      }
      conn.send(announcement(config, s, session.back()));
      awaiting = true;
    }

    pump_until(std::min(next_heartbeat, last_heard + timeout),
               [&] { return conn.has_message() || conn.failed(); });
    if (stop_requested) {
      spdlog::info("detaching from {}", conn.peer());
      goodbye(conn, session);
      return stopped();
    }
    while (std::optional<control::Message> m = conn.pop()) {
      last_heard = Clock::now();
      if (std::holds_alternative<control::Heartbeat>(*m)) continue;
      if (const auto* a = std::get_if<control::Attached>(&*m)) {
        if (!awaiting || a->service != config.services[next_service].name) {
          return lost("protocol error: 'attached' for service '" + a->service +
                      "', which is not awaiting attachment");
        }
        ServedRegion& served = session.back();
        if (Status st = served.region.unlink(); !st.ok()) {
          spdlog::warn("service '{}': {}", a->service, st.message());
        }
        const mqueue::RegionHeader& h = served.header();
        spdlog::info(
            "service '{}' attached: region {} ({} bytes, {} server queue(s), {} client "
            "queue(s), {} slots of {} bytes{}){}",
            a->service,
            config.transport == TransportKind::kShm ? served.region.name()
            : served.device_region != nullptr       ? "in " + accelerator.str() + " memory"
                                                    : std::string("in host memory"),
            served.bytes(), h.server_queue_count, h.client_queue_count, h.ring_capacity,
            h.slot_bytes, mqueue::lines_suffix(h),
            config.transport == TransportKind::kShm ? "; name removed" : ", transport rdma");
        awaiting = false;
        ++next_service;
        if (next_service == config.services.size()) {
          registrations.fetch_add(1, std::memory_order_relaxed);
          spdlog::info("serving {} service(s) on {}", config.services.size(), accelerator.str());
          notify_status(fmt::format("serving {} service(s) on {} for {}", config.services.size(),
                                    accelerator.str(), config.server.str()));
        }
        continue;
      }
      if (const auto* r = std::get_if<control::Refused>(&*m)) {
        const std::string what = r->service.empty() ? "agent '" + config.agent + "'"
                                                    : "the region of service '" + r->service + "'";
        Status st(StatusCode::kUnavailable,
                  "the server at " + conn.peer() + " refused " + what + ": " + r->message);
        goodbye(conn, session);
        return fatal(st);
      }
      if (std::holds_alternative<control::Bye>(*m)) {
        return lost("the server ended the session (bye)");
      }
      return lost(std::string("protocol error: unexpected '") + control::type_name(*m) +
                  "' message from the server");
    }
    if (conn.failed()) return lost(conn.error());
    // An accelerator that stopped serving on its own cannot be restarted in this process (a
    // failed kernel poisons the CUDA context): leave without bye, so the server fails what was
    // in flight to this agent right away, and exit with the error. The connection closes before
    // the session stops its accelerators: tearing down a faulted GPU context can take a while,
    // and the server hears of the loss from the close.
    if (Status st = session.health(); !st.ok()) {
      conn.close();
      return fatal(st);
    }

    const auto now = Clock::now();
    session.log_handler_errors(now);
    if (now - last_heard >= timeout) {
      return lost("no answer from the server for " +
                  std::to_string(to_milliseconds(now - last_heard)) + " ms");
    }
    if (now >= next_heartbeat) {
      conn.send(control::Heartbeat{});
      next_heartbeat = now + heartbeat_interval;
    }
  }
}

void AgentRuntime::Impl::wait_for_signal() {
  signals->async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {
      spdlog::warn(
          "received SIGHUP: an agent does not reload its configuration; restart it to apply a "
          "change (systemctl restart caracal-agent@NAME)");
      wait_for_signal();
      return;
    }
    spdlog::info("received {}; stopping", signal_name(sig));
    stop_requested = true;
  });
}

Status AgentRuntime::Impl::run() {
  // Signals first: setting up a GPU takes a moment, and a SIGINT meanwhile must stop the agent
  // cleanly rather than kill it.
  // SIGHUP, which reloads the server, must not end an agent: it is said and ignored.
  if (options.handle_signals) {
    signals.emplace(io, SIGINT, SIGTERM, SIGHUP);
    wait_for_signal();
  }
  Result<AcceleratorChoice> choice = resolve_accelerator(config.accelerator, backends);
  if (!choice.ok()) return choice.status();
  accelerator = *choice;
  std::string described = accelerator.str();
  AcceleratorFacts facts{accelerator.kind, accelerator.str(), 0};
  if (accelerator.kind == AcceleratorKind::kGpu) {
    std::vector<std::string> warnings;
    Result<GpuBackend::Prepared> gpu = backends.gpu->prepare(accelerator.gpu, warnings);
    if (!gpu.ok()) return gpu.status();
    described = gpu->description;
    facts.multiprocessors = gpu->multiprocessors;
    for (const std::string& w : warnings)
      spdlog::warn("{}", w);
  }
  spdlog::info(
      "agent '{}' (pid {}): {} service(s) on accelerator {} (configured: {}), transport {}, "
      "server {}",
      config.agent, pid, config.services.size(), described, config.accelerator.str(),
      config.transport == TransportKind::kShm           ? "shm"
      : config.rdma.region_memory == RegionMemory::kGpu ? "rdma (regions in GPU memory)"
                                                        : "rdma",
      config.server.str());
  // What the configuration left to the agent, sized for this accelerator, and said.
  for (const std::string& line : size_services(config, facts))
    spdlog::info("{}", line);
  for (const std::string& w : configuration_warnings(config, accelerator.kind))
    spdlog::warn("{}", w);
  // The handlers' state, before anything is registered: a setup that fails leaves the server
  // untouched.
  if (Status st = set_up_services(); !st.ok()) {
    tear_down_services();
    return st;
  }
  io.poll();  // a signal or request_stop() that came during setup
  if (stop_requested) {
    tear_down_services();
    spdlog::info("agent '{}' stopped", config.agent);
    return Status::ok_status();
  }
  Status served = serve_until_stopped();
  tear_down_services();
  return served;
}

Status AgentRuntime::Impl::serve_until_stopped() {
  // Ready for the service manager once the configuration and the accelerator are good: a
  // server that is not up yet does not hold up `systemctl start`; the status line says what the
  // agent is doing.
  notify_ready("connecting to the server at " + config.server.str());
  bool unreachable_logged = false;
  while (!stop_requested) {
    std::shared_ptr<ServerLink> conn = connect();
    if (!conn->connected()) {
      conn->close();
      if (stop_requested) break;
      if (!unreachable_logged) {
        spdlog::warn("server {} is not reachable ({}); retrying every {} ms", config.server.str(),
                     conn->error(), config.reconnect_interval_ms);
        notify_status(fmt::format("server {} is not reachable ({}); retrying every {} ms",
                                  config.server.str(), conn->error(),
                                  config.reconnect_interval_ms));
        unreachable_logged = true;
      } else {
        spdlog::debug("server {} is not reachable ({})", config.server.str(), conn->error());
      }
      sleep_for(milliseconds(config.reconnect_interval_ms));
      continue;
    }
    unreachable_logged = false;
    spdlog::info("connected to {}", conn->peer());
    Outcome outcome = serve(*conn);
    conn->close();
    if (outcome.kind == Outcome::kFatal) return outcome.status;
    if (!stop_status.ok()) return stop_status;  // something may still poll a region
    if (outcome.kind == Outcome::kStopped) break;
    if (outcome.retry_after.count() != 0) {
      const milliseconds wait =
          std::max(outcome.retry_after, milliseconds(config.reconnect_interval_ms));
      spdlog::warn("{}; trying again in {} ms", outcome.why, wait.count());
      notify_status(fmt::format("{}; trying again in {} ms", outcome.why, wait.count()));
      sleep_for(wait);
      continue;
    }
    spdlog::warn(
        "lost the server: {}; accelerators stopped and regions dropped, registering "
        "again with a new epoch",
        outcome.why);
    notify_status("lost the server (" + outcome.why + "); registering again");
    sleep_for(milliseconds(config.reconnect_interval_ms));
  }
  notify_stopping();
  spdlog::info("agent '{}' stopped", config.agent);
  return Status::ok_status();
}

Status AgentRuntime::Impl::set_up_services() {
  if (!backends.setup) return Status::ok_status();
  for (size_t i = 0; i < config.services.size(); ++i) {
    const ServiceConfig& service = config.services[i];
    const std::string where =
        "service '" + service.name + "': handler setup on " + accelerator.str() + " failed: ";
    std::any configured;
    try {
      if (auto c = backends.configured.find(service.name); c != backends.configured.end()) {
        configured = c->second;
      } else {
        // Embedded without configure_services: the settings of the mapping alone.
        Settings settings(SettingsSource{service.name, service.handler, service.entry, {}, {}});
        if (backends.configure) configured = backends.configure(settings);
        settings.finish();
      }
      AcceleratorMemory memory =
          accelerator.kind == AcceleratorKind::kGpu && backends.gpu && backends.gpu->memory
              ? backends.gpu->memory(accelerator.gpu)
              : host_memory();
      auto context = std::make_unique<SetupContext>(service, accelerator, std::move(memory),
                                                    config.cpu.workers);
      const auto began = Clock::now();
      Result<ServiceHandler> made = backends.setup(configured, std::move(context));
      if (!made.ok()) return Status(made.status().code(), where + made.status().message());
      handlers.push_back(std::move(made).value());
      spdlog::info("service '{}': handler set up on {} in {} ms", service.name, accelerator.str(),
                   to_milliseconds(Clock::now() - began));
    } catch (const std::exception& e) {
      return Status(StatusCode::kInvalidArgument, where + e.what());
    } catch (...) {
      return Status(StatusCode::kInvalidArgument, where + "a non-standard exception");
    }
  }
  return Status::ok_status();
}

// After every accelerator stopped (each Session stops its own before it goes). Where one could
// not be stopped, a kernel may still read the state: it is kept, allocated, until the process
// exits.
void AgentRuntime::Impl::tear_down_services() {
  if (handlers.empty()) return;
  if (!stop_status.ok()) {
    spdlog::warn("handler state not torn down: an accelerator may still be running ({})",
                 stop_status.message());
    // Deliberately leaked: freeing memory that a running kernel reads is worse.
    static_cast<void>(new std::vector<ServiceHandler>(std::move(handlers)));
    handlers.clear();
    return;
  }
  for (size_t i = handlers.size(); i-- > 0;) {
    if (!handlers[i].teardown) continue;
    try {
      handlers[i].teardown();
    } catch (const std::exception& e) {
      spdlog::error("service '{}': handler teardown failed: {}", config.services[i].name, e.what());
    } catch (...) {
      spdlog::error("service '{}': handler teardown failed with a non-standard exception",
                    config.services[i].name);
    }
  }
  handlers.clear();
}

AgentRuntime::AgentRuntime(AgentConfig config, HandlerBackends backends, RuntimeOptions options)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(backends), options)) {}

AgentRuntime::~AgentRuntime() = default;

Status AgentRuntime::run() {
  return impl_->run();
}

void AgentRuntime::request_stop() {
  Impl* impl = impl_.get();
  asio::post(impl->io, [impl] { impl->stop_requested = true; });
}

uint64_t AgentRuntime::registrations() const {
  return impl_->registrations.load(std::memory_order_relaxed);
}

}  // namespace caracal::agent
