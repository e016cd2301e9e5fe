#include "control_endpoint.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "blocking_worker.hpp"
#include "caracal/control/connection.hpp"
#include "caracal/control/protocol.hpp"
#include "front/listeners.hpp"
#include "mqueue_manager/region_setup.hpp"
#include "tunables.hpp"

namespace caracal::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

class ControlSession : public std::enable_shared_from_this<ControlSession> {
 public:
  ControlSession(ControlEndpoint& endpoint, tcp::socket socket)
      : ep_(endpoint),
        conn_(std::make_shared<control::Connection>(std::move(socket))),
        timer_(conn_->socket().get_executor()) {}

  void start() {
    error_code ec;
    const tcp::endpoint peer = conn_->socket().remote_endpoint(ec);
    if (!ec) peer_ = peer.address();
    last_heard_ = Clock::now();
    arm_timer();
    // The callbacks hold the session until the connection closes (control::Connection).
    conn_->start({
        .on_message =
            [self = shared_from_this()](control::Message&& m) {
              self->last_heard_ = Clock::now();
              return self->handle(m);
            },
        .on_end =
            [self = shared_from_this()](control::Connection::Ending ending,
                                        const std::string& why) {
              switch (ending) {
                case control::Connection::Ending::kClosed:
                  return self->lose("connection closed");
                case control::Connection::Ending::kBroken:
                  return self->lose(why);
                case control::Connection::Ending::kMalformed:
                  if (!self->hello_done_) {
                    if (self->throttled()) return;
                    self->ep_.throttle_fail(self->peer_, Refusal::kMalformed);
                  }
                  return self->refuse_and_close(Refusal::kMalformed, "", why);
              }
            },
    });
    origin_ = conn_->origin();
  }

  // Drops the session from outside (server shutdown, or replaced by a new epoch); `then` runs
  // after, on the session's strand.
  void lose_later(std::string reason, std::function<void()> then = {}) {
    asio::post(conn_->socket().get_executor(),
               [self = shared_from_this(), r = std::move(reason), then = std::move(then)] {
                 self->lose(r);
                 if (then) then();
               });
  }

  // refuse_and_close() on the session's own executor (from another session's).
  void refuse_later(Refusal why, std::string message) {
    asio::post(conn_->socket().get_executor(),
               [self = shared_from_this(), why, m = std::move(message)] {
                 if (!self->closed_) self->refuse_and_close(why, "", m);
               });
  }

  const std::string& agent() const { return hello_.agent; }

 private:
  void arm_timer() {
    timer_.expires_after(std::chrono::milliseconds(
        ep_.config_.control.agent_timeout_ms / tunables::kHeartbeatChecksPerTimeout + 1));
    timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->closed_) return;
      const auto silent = Clock::now() - self->last_heard_;
      const auto limit = std::chrono::milliseconds(self->ep_.config_.control.agent_timeout_ms);
      if (silent > limit) {
        self->lose(
            "no heartbeat for " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
            " ms");
        return;
      }
      self->arm_timer();
    });
  }

  // Before hello: refuses the session, unread, when its address is under penalty (and says so
  // once per penalty). Returns whether it did.
  bool throttled() {
    const AuthThrottle::Check c = ep_.throttle_check(peer_);
    if (c.left.count() == 0) return false;
    const std::string message = "throttled: too many failed hellos from " + peer_.to_string() +
                                "; try again in " + std::to_string(c.left.count()) + " ms";
    if (c.first)
      SPDLOG_WARN("{}: refusing hellos from {}: {}", origin_, peer_.to_string(), message);
    send(control::Refused{"", message, static_cast<uint32_t>(c.left.count())});
    close(/*after_sending=*/true);
    return true;
  }

  // A refusal before hello: counted for the address, then the session ends.
  bool refuse_unauthenticated(Refusal why, const std::string& message) {
    ep_.throttle_fail(peer_, why);
    refuse_and_close(why, "", message);
    return false;
  }

  // Returns whether to keep reading.
  bool handle(const control::Message& message) {
    if (!hello_done_) {
      if (throttled()) return false;
      const auto* hello = std::get_if<control::Hello>(&message);
      if (hello == nullptr) {
        return refuse_unauthenticated(
            Refusal::kNotHello,
            "the first message must be hello, not " + std::string(control::type_name(message)));
      }
      return on_hello(*hello);
    }
    if (const auto* region = std::get_if<control::RegionAnnounce>(&message)) {
      on_region(*region);
      return true;
    }
    if (std::holds_alternative<control::Heartbeat>(message)) {
      send(control::Heartbeat{});
      return true;
    }
    if (std::holds_alternative<control::Bye>(message)) {
      on_bye();
      return false;
    }
    refuse_and_close(Refusal::kUnexpectedMessage, "",
                     std::string("unexpected ") + control::type_name(message) + " message");
    return false;
  }

  bool on_hello(const control::Hello& hello) {
    if (hello.protocol != control::kProtocolVersion) {
      return refuse_unauthenticated(
          Refusal::kProtocolVersion,
          "agent '" + hello.agent + "': " + control::unsupported_protocol(hello.protocol));
    }
    if (!control::secrets_equal(hello.secret, ep_.config_.control.secret)) {
      SPDLOG_WARN("{}: agent '{}' refused: wrong secret", origin_, hello.agent);
      return refuse_unauthenticated(Refusal::kWrongSecret, "authentication failed: wrong secret");
    }
    ep_.throttle_succeed(peer_);
    hello_ = hello;
    hello_done_ = true;
    std::shared_ptr<ControlSession> previous = ep_.take_name(hello.agent, shared_from_this());
    if (previous) {
      if (previous->hello_.epoch == hello.epoch) {
        // Same name and epoch: a second connection of a live agent, not a restart.
        ep_.take_name(hello.agent, previous);
        hello_done_ = false;
        refuse_and_close(Refusal::kDuplicateAgent, "",
                         "agent '" + hello.agent + "' with this epoch is already registered");
        return false;
      }
      // A new epoch: the agent restarted, or a second agent has the same name. The old session
      // is refused rather than dropped, so that a live agent learns why and stops (two agents
      // of one name would otherwise replace each other on every reconnection).
      previous->refuse_later(
          Refusal::kReplaced,
          "agent '" + hello.agent + "' was registered again from " + peer_.to_string() +
              " (epoch " + fmt::format("{:016x}", hello.epoch) +
              "): this registration is replaced; is a second agent running with this name?");
    }
    spdlog::info("{}: agent '{}' registered (epoch {:016x}, accelerator {})", origin_, hello.agent,
                 hello.epoch, hello.accelerator.empty() ? "?" : hello.accelerator);
    send(control::Welcome{ep_.config_.control.heartbeat_interval_ms,
                          ep_.config_.control.agent_timeout_ms});
    return true;
  }

  void on_region(const control::RegionAnnounce& r) {
    const std::string what = "agent '" + hello_.agent + "' region for service '" + r.service + "'";
    auto svc = ep_.services_.find(r.service);
    if (svc == ep_.services_.end()) {
      std::string known;
      for (const auto& [name, s] : ep_.services_)
        known += (known.empty() ? "" : ", ") + name;
      return refuse_region(Refusal::kUnknownService, r.service,
                           what + ": no such service (configured: " + known + ")");
    }
    for (const Admitted& a : regions_) {
      if (a.service == svc->second) {
        return refuse_region(Refusal::kAlreadyServed, r.service,
                             what + ": this agent already serves the service");
      }
    }
    if (r.transport == "rdma" && !control::rdma_available()) {
      return refuse_region(Refusal::kRdmaUnavailable, r.service,
                           what +
                               ": transport rdma: this server was built without "
                               "rdma-core (libibverbs, librdmacm)");
    }
    for (size_t c = 0; c < r.destinations.size(); ++c) {
      if (!ep_.destinations_.has(r.destinations[c])) {
        return refuse_region(
            Refusal::kUnknownDestination, r.service,
            what + ": destinations[" + std::to_string(c) + "]: '" + r.destinations[c] +
                "' is not a destination (configured: " + ep_.destinations_.names() + ")");
      }
    }
    // Before anything is mapped or allocated for it: the server maps region_bytes (shm) or
    // allocates and registers a staging image of that size (rdma) before it reads the header.
    const uint64_t max_bytes = ep_.config_.control.max_region_bytes;
    if (r.region_bytes < mqueue::kPageBytes || r.region_bytes > max_bytes) {
      return refuse_region(Refusal::kRegionSize, r.service,
                           what + ": region_bytes " + std::to_string(r.region_bytes) +
                               " is outside " + std::to_string(mqueue::kPageBytes) + " to " +
                               std::to_string(max_bytes) +
                               " (a header page to control.max_region_bytes)");
    }
    if (r.transport == "rdma") {
      if (rdma_.contains(r.service)) {
        return refuse_region(Refusal::kAlreadyServed, r.service,
                             what + ": this agent already serves the service");
      }
      rdma_[r.service] = RdmaState{
          r, svc->second, std::make_shared<asio::steady_timer>(conn_->socket().get_executor())};
      spdlog::info("{}: {}: connecting to rdma {}:{}", origin_, what, r.rdma_host, r.rdma_port);
      connect_rdma(r.service, /*first=*/true);
      return;
    }
    Result<std::unique_ptr<RegionBinding>> binding = bind_shm_region(r.shm_name, r.region_bytes);
    admit(r, svc->second, std::move(binding), /*first=*/true);
  }

  // rdma: connects and attaches on the endpoint's connect thread, then admits (or retries)
  // back on this session's strand.
  void connect_rdma(const std::string& service, bool first) {
    const RdmaState& st = rdma_.at(service);
    const ControlConfig& c = ep_.config_.control;
    RdmaRegionTarget target{.host = st.announce.rdma_host,
                            .port = st.announce.rdma_port,
                            .address = st.announce.rdma_address,
                            .rkey = st.announce.rdma_rkey,
                            .region_bytes = st.announce.region_bytes,
                            .timeout = std::chrono::milliseconds(c.rdma_connect_timeout_ms),
                            .ack_timeout = c.rdma_ack_timeout,
                            .retry_count = c.rdma_retry_count};
    ep_.worker_->submit([self = shared_from_this(), target, service, first] {
      auto binding =
          std::make_shared<Result<std::unique_ptr<RegionBinding>>>(bind_rdma_region(target));
      asio::post(self->conn_->socket().get_executor(), [self, service, first, binding] {
        self->rdma_connected(service, first, std::move(*binding));
      });
    });
  }

  void rdma_connected(const std::string& service, bool first,
                      Result<std::unique_ptr<RegionBinding>> binding) {
    auto it = rdma_.find(service);
    if (closed_ || detaching_ || it == rdma_.end()) return;  // dropped meanwhile
    RdmaState& st = it->second;
    if (first) {
      if (!admit(st.announce, st.service, std::move(binding), true)) rdma_.erase(it);
      return;
    }
    const std::string what = "agent '" + hello_.agent + "' region for service '" + service + "'";
    if (!binding.ok()) {
      ep_.rdma_reconnect_failures_.inc();
      const uint32_t attempt = st.attempts;
      schedule_reconnect(service);  // sets the wait before the next try
      SPDLOG_WARN("{}: {}: reconnect {} failed: {}; next try in {} ms", origin_, what, attempt,
                  binding.status().message(), st.backoff.count());
      return;
    }
    if (admit(st.announce, st.service, std::move(binding), false)) {
      ep_.rdma_reconnects_.inc();
      st.backoff = std::chrono::milliseconds(0);
      st.attempts = 0;
    } else {
      rdma_.erase(it);  // admit logged why (a region that changed under us): no more tries
    }
  }

  // The engine dropped a region for a fault (engine thread -> posted here).
  void on_region_fault(const AgentRegion* region, const std::string& fault) {
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [&](const Admitted& a) { return a.region.get() == region; });
    if (closed_ || it == regions_.end()) return;
    const std::string service = it->service->name();
    regions_.erase(it);
    if (detaching_ || !rdma_.contains(service)) return;
    SPDLOG_WARN(
        "{}: agent '{}' region for service '{}' left dispatch ({}); the agent is still "
        "registered: reconnecting",
        origin_, hello_.agent, service, fault);
    schedule_reconnect(service);
  }

  void schedule_reconnect(const std::string& service) {
    RdmaState& st = rdma_.at(service);
    const auto max = std::chrono::milliseconds(ep_.config_.control.rdma_reconnect_max_ms);
    st.backoff =
        st.backoff.count() == 0 ? tunables::kRdmaReconnectFirst : std::min(st.backoff * 2, max);
    ++st.attempts;
    st.timer->expires_after(st.backoff);
    st.timer->async_wait([self = shared_from_this(), service](error_code ec) {
      if (ec || self->closed_ || self->detaching_ || !self->rdma_.contains(service)) return;
      self->connect_rdma(service, /*first=*/false);
    });
  }

  // Checks a bound region against the hello and the announcement and puts it into dispatch.
  // `first`: answer the announcement (attached or refused); otherwise a re-admission after a
  // reconnect, logged. Returns whether the region is in dispatch.
  bool admit(const control::RegionAnnounce& r, Service* svc,
             Result<std::unique_ptr<RegionBinding>> binding, bool first) {
    const std::string what = "agent '" + hello_.agent + "' region for service '" + r.service + "'";
    auto refuse = [&](Refusal why, const std::string& message) {
      if (first) {
        refuse_region(why, r.service, message);
      } else {
        SPDLOG_ERROR("{}: {}; not re-admitted", origin_, message);
      }
      return false;
    };
    if (!binding.ok()) {
      return refuse(binding.status().code() == StatusCode::kInvalidArgument
                        ? Refusal::kBadRegion
                        : Refusal::kRegionUnreachable,
                    what + ": " + binding.status().message());
    }
    const mqueue::RegionHeader& h = (*binding)->header();
    if (h.agent_epoch != hello_.epoch) {
      return refuse(Refusal::kEpochMismatch,
                    what + ": the region's epoch " + std::to_string(h.agent_epoch) +
                        " is not the agent's epoch " + std::to_string(hello_.epoch));
    }
    if (h.client_queue_count != r.destinations.size()) {
      return refuse(Refusal::kClientQueues,
                    what + ": the region has " + std::to_string(h.client_queue_count) +
                        " client queues but " + std::to_string(r.destinations.size()) +
                        " destinations were named");
    }
    auto region =
        std::make_shared<AgentRegion>(hello_.agent, hello_.epoch, svc, std::move(binding).value());
    // Placed first: the links go where the engine serves their client queues.
    ep_.engine_.place(*region);  // before dispatch and the engine index its queues by thread
    std::vector<std::shared_ptr<ClientLink>> links;
    for (uint32_t c = 0; c < h.client_queue_count; ++c) {
      const uint32_t q = mqueue::client_queue_index(h, c);
      links.push_back(ep_.destinations_.make_link(r.destinations[c], region->inbox_ptr(q),
                                                  ep_.engine_.thread_of(*region, q),
                                                  region->binding().shareable()));
    }
    region->set_links(std::move(links));
    if (r.transport == "rdma") {
      std::weak_ptr<ControlSession> weak = weak_from_this();
      const AgentRegion* raw = region.get();
      region->set_on_fault([weak, raw](const std::string& fault) {
        if (auto self = weak.lock()) {
          asio::post(self->conn_->socket().get_executor(),
                     [self, raw, fault] { self->on_region_fault(raw, fault); });
        }
      });
    }
    if (Status s = svc->add(region); !s.ok()) {
      return refuse(Refusal::kServiceRefused, what + ": " + s.message());
    }
    ep_.engine_.attach(region);
    regions_.push_back(Admitted{region, svc});
    if (first) {
      spdlog::info(
          "{}: {} attached: {} server queue(s), {} client queue(s), {} slots of {} B, "
          "messages up to {} B, transport {}{}",
          origin_, what, h.server_queue_count, h.client_queue_count, h.ring_capacity, h.slot_bytes,
          h.max_message_bytes, r.transport, mqueue::lines_suffix(h));
      send(control::Attached{r.service});
    } else {
      spdlog::info("{}: {} re-admitted after an rdma reconnect", origin_, what);
    }
    return true;
  }

  void refuse_region(Refusal why, const std::string& service, const std::string& message) {
    ep_.count(why);
    SPDLOG_WARN("{}: {}", origin_, message);
    send(control::Refused{service, message});
  }

  void on_bye() {
    spdlog::info("{}: agent '{}' is leaving; draining {} region(s)", origin_, hello_.agent,
                 regions_.size());
    detaching_ = true;
    timer_.cancel();
    auto remaining = std::make_shared<size_t>(regions_.size());
    if (regions_.empty()) {
      finish_bye();
      return;
    }
    for (Admitted& a : regions_) {
      a.service->remove(a.region.get());
      ep_.engine_.detach(a.region, tunables::kByeDrain, [self = shared_from_this(), remaining] {
        asio::post(self->conn_->socket().get_executor(), [self, remaining] {
          if (--*remaining == 0) self->finish_bye();
        });
      });
    }
  }

  void finish_bye() {
    regions_.clear();
    ep_.forget(hello_.agent, this);
    spdlog::info("{}: agent '{}' detached", origin_, hello_.agent);
    send(control::Bye{});
    close(/*after_sending=*/true);
  }

  // The agent is gone (or must go): out of dispatch, requests in flight failed.
  void lose(const std::string& reason) {
    if (closed_) return;
    if (!regions_.empty() || !rdma_.empty()) {
      SPDLOG_WARN("{}: agent '{}' lost: {}", origin_, hello_.agent, reason);
    } else {
      spdlog::info("{}: {}", origin_, reason);
    }
    for (Admitted& a : regions_) {
      a.service->remove(a.region.get());
      if (!detaching_) {
        ep_.engine_.fail(a.region, "agent " + hello_.agent + " lost: " + reason);
      }
    }
    regions_.clear();
    if (hello_done_) ep_.forget(hello_.agent, this);
    close();
  }

  void refuse_and_close(Refusal why, const std::string& service, const std::string& message) {
    ep_.count(why);
    SPDLOG_WARN("{}: {}", origin_, message);
    send(control::Refused{service, message});
    for (Admitted& a : regions_) {
      a.service->remove(a.region.get());
      ep_.engine_.fail(a.region, "agent " + hello_.agent + " refused: " + message);
    }
    regions_.clear();
    if (hello_done_) ep_.forget(hello_.agent, this);
    close(/*after_sending=*/true);
  }

  void send(const control::Message& m) { conn_->send(m); }

  // Ends the session: its timers stop and, once what was sent is written (a refusal, a bye),
  // the connection closes.
  void close(bool after_sending = false) {
    if (closed_) return;
    closed_ = true;
    timer_.cancel();
    for (auto& [service, st] : rdma_)
      st.timer->cancel();
    rdma_.clear();
    if (after_sending) {
      conn_->close_after_sending();
    } else {
      conn_->close();
    }
  }

  ControlEndpoint& ep_;
  std::shared_ptr<control::Connection> conn_;
  asio::steady_timer timer_;
  std::string origin_ = "control ?";
  asio::ip::address peer_;  // the address failures are counted under
  bool closed_ = false;
  bool hello_done_ = false;
  bool detaching_ = false;
  control::Hello hello_;
  Clock::time_point last_heard_;
  // The regions in dispatch, with the service each serves.
  struct Admitted {
    std::shared_ptr<AgentRegion> region;
    Service* service = nullptr;
  };
  std::vector<Admitted> regions_;
  // transport rdma, by service: the announcement, kept to reconnect with while the agent is
  // registered (from the announcement until the session ends or the region is refused).
  struct RdmaState {
    control::RegionAnnounce announce;
    Service* service = nullptr;
    std::shared_ptr<asio::steady_timer> timer;
    std::chrono::milliseconds backoff{0};
    uint32_t attempts = 0;
  };
  std::map<std::string, RdmaState> rdma_;
};

ControlEndpoint::ControlEndpoint(asio::io_context& io, const ServerConfig& config, Engine& engine,
                                 std::map<std::string, Service*> services,
                                 Destinations& destinations, Registry& metrics)
    : io_(io),
      config_(config),
      engine_(engine),
      services_(std::move(services)),
      destinations_(destinations),
      metrics_(metrics),
      acceptor_(io),
      agents_gauge_(metrics.gauge("caracal_agents", "Agents registered now")),
      rdma_reconnects_(metrics.counter("caracal_rdma_reconnects_total",
                                       "rdma regions re-admitted after their transport failed")),
      rdma_reconnect_failures_(metrics.counter("caracal_rdma_reconnect_failures_total",
                                               "Failed tries to reconnect an rdma region")),
      throttled_(metrics.counter("caracal_control_throttled_total",
                                 "Control connections refused unread because their address was "
                                 "under penalty for failed hellos")),
      penalties_(metrics.counter("caracal_control_penalties_total",
                                 "Penalties an address got for failed hellos")),
      throttle_tracked_(metrics.gauge("caracal_control_tracked_addresses",
                                      "Addresses whose failed hellos the control endpoint "
                                      "remembers")),
      worker_(std::make_unique<BlockingWorker>()),
      throttle_(config.control.auth) {
  for (size_t i = 0; i < refusals_.size(); ++i) {
    refusals_[i] =
        &metrics.counter("caracal_control_refusals_total",
                         "Hellos, regions and sessions the control endpoint refused, by reason",
                         {{"reason", refusal_name(static_cast<Refusal>(i))}});
  }
}

const char* refusal_name(Refusal r) {
  static constexpr const char* kNames[] = {
      "wrong_secret",       "malformed",        "protocol_version",    "not_hello",
      "duplicate_agent",    "replaced",         "unexpected_message",  "unknown_service",
      "already_served",     "rdma_unavailable", "unknown_destination", "region_size",
      "region_unreachable", "bad_region",       "epoch_mismatch",      "client_queues",
      "service_refused"};
  static_assert(std::size(kNames) == static_cast<size_t>(Refusal::kCount));
  return kNames[static_cast<size_t>(r)];
}

AuthThrottle::Check ControlEndpoint::throttle_check(const asio::ip::address& peer) {
  AuthThrottle::Check c;
  {
    std::lock_guard lock(m_);
    c = throttle_.check(peer, Clock::now());
  }
  if (c.left.count() != 0) throttled_.inc();
  return c;
}

void ControlEndpoint::throttle_fail(const asio::ip::address& peer, Refusal why) {
  AuthThrottle::Failure f;
  {
    std::lock_guard lock(m_);
    f = throttle_.fail(peer, Clock::now());
    throttle_tracked_.set(static_cast<int64_t>(throttle_.tracked()));
  }
  if (f.penalty.count() == 0) return;
  penalties_.inc();
  SPDLOG_WARN(
      "control endpoint: {} failed hellos in a row from {} (the last: {}); its connections are "
      "refused for {} ms",
      f.failures, peer.to_string(), refusal_name(why), f.penalty.count());
}

void ControlEndpoint::throttle_succeed(const asio::ip::address& peer) {
  std::lock_guard lock(m_);
  throttle_.succeed(peer);
  throttle_tracked_.set(static_cast<int64_t>(throttle_.tracked()));
}

void ControlEndpoint::publish_agent_count_locked() {
  agents_gauge_.set(static_cast<int64_t>(std::count_if(
      agents_.begin(), agents_.end(), [](const auto& kv) { return !kv.second.expired(); })));
}

ControlEndpoint::~ControlEndpoint() {
  stop();
}

Status ControlEndpoint::listen() {
  Result<uint16_t> port = listen_tcp(acceptor_, config_.control.listen, "control endpoint");
  if (!port.ok()) return port.status();
  port_ = *port;
  accept();
  return Status::ok_status();
}

void ControlEndpoint::accept() {
  acceptor_.async_accept(asio::make_strand(io_), [this](error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      SPDLOG_WARN("control endpoint: accept failed: {}", ec.message());
    } else {
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto s = std::make_shared<ControlSession>(*this, std::move(socket));
      {
        std::lock_guard lock(m_);
        std::erase_if(sessions_, [](const auto& w) { return w.expired(); });
        sessions_.push_back(s);
      }
      s->start();
    }
    accept();
  });
}

void ControlEndpoint::stop() {
  error_code ec;
  acceptor_.close(ec);
  std::vector<std::shared_ptr<ControlSession>> live;
  {
    std::lock_guard lock(m_);
    for (auto& w : sessions_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
    sessions_.clear();
  }
  // Each session ends on its own strand. Wait for them (bounded): a session whose loss never
  // ran, its I/O thread stopped first, would stay held by its own connection's callbacks.
  struct Pending {
    std::mutex m;
    std::condition_variable cv;
    size_t left;
  };
  auto pending = std::make_shared<Pending>();
  pending->left = live.size();
  for (auto& s : live) {
    s->lose_later("server shutting down", [pending] {
      std::lock_guard lock(pending->m);
      if (--pending->left == 0) pending->cv.notify_all();
    });
  }
  live.clear();
  {
    std::unique_lock lock(pending->m);
    pending->cv.wait_for(lock, tunables::kStopCloseWait, [&] { return pending->left == 0; });
  }
  // A connect in progress finishes (its result is dropped: the sessions are closing).
  worker_->stop();
}

std::shared_ptr<ControlSession> ControlEndpoint::take_name(
    const std::string& agent, const std::shared_ptr<ControlSession>& session) {
  std::lock_guard lock(m_);
  std::weak_ptr<ControlSession>& slot = agents_[agent];
  std::shared_ptr<ControlSession> previous = slot.lock();
  slot = session;
  publish_agent_count_locked();
  return previous == session ? nullptr : previous;
}

void ControlEndpoint::forget(const std::string& agent, const ControlSession* session) {
  std::lock_guard lock(m_);
  auto it = agents_.find(agent);
  if (it != agents_.end()) {
    auto s = it->second.lock();
    if (!s || s.get() == session) agents_.erase(it);
  }
  publish_agent_count_locked();
}

size_t ControlEndpoint::agent_count() const {
  std::lock_guard lock(m_);
  return agents_.size();
}

}  // namespace caracal::server
