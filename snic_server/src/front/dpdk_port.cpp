// The DPDK port's setup: the EAL, the ethdev and its queues, offloads and mempool, the listeners'
// bindings, launching and stopping the workers. What a worker does with its queue pair is
// dpdk_worker.cpp.
#include <pthread.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <string>
#include <vector>

#include "dpdk_port_state.hpp"
#include "front/dpdk_port.hpp"
#include "front/listeners.hpp"

namespace caracal::server {

namespace {

using dpdk::FrameDrop;

// rte_eal_init may run once per process, successful or not.
std::atomic<bool> g_eal_tried{false};

Status dpdk_error(const std::string& what, int err) {
  return Status(StatusCode::kIoError, "dpdk: " + what + ": " + rte_strerror(err < 0 ? -err : err));
}

bool names_a_device(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--no-pci" || a.rfind("-a", 0) == 0 || a.rfind("-b", 0) == 0 ||
        a.rfind("--allow", 0) == 0 || a.rfind("--block", 0) == 0) {
      return true;
    }
  }
  return false;
}

std::string mac_text(const rte_ether_addr& mac) {
  char buf[RTE_ETHER_ADDR_FMT_SIZE];
  rte_ether_format_addr(buf, sizeof buf, &mac);
  return buf;
}

std::string port_names() {
  std::string out;
  uint16_t id = 0;
  RTE_ETH_FOREACH_DEV(id) {
    char name[RTE_ETH_NAME_MAX_LEN];
    if (rte_eth_dev_get_name_by_port(id, name) == 0)
      out += (out.empty() ? "" : ", ") + std::string(name);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

namespace {

class DpdkListener final : public Listener {
 public:
  explicit DpdkListener(DpdkBinding& binding) : binding_(binding) {}
  Status start() override { return Status::ok_status(); }
  // New datagrams to the port are dropped (`no_listener`); replies to requests in flight are
  // still sent until the server stops the port.
  void stop() override { binding_.open.store(false, std::memory_order_relaxed); }
  void close_all() override { stop(); }
  uint16_t port() const override { return binding_.config.listen.port; }
  const std::string& name() const override { return binding_.name; }

 private:
  DpdkBinding& binding_;
};

// rte_eal_init pins the calling thread to the main lcore's CPU, and every thread it starts
// afterwards would inherit that. The server's own threads (I/O, engine) are not lcores: give
// the calling thread back the CPUs it had.
class AffinityKeeper {
 public:
  AffinityKeeper() { ok_ = pthread_getaffinity_np(pthread_self(), sizeof set_, &set_) == 0; }
  ~AffinityKeeper() {
    if (ok_) pthread_setaffinity_np(pthread_self(), sizeof set_, &set_);
  }

 private:
  cpu_set_t set_{};
  bool ok_ = false;
};

Status init_eal(const DpdkConfig& c) {
  if (g_eal_tried.exchange(true)) {
    return Status(StatusCode::kInvalidArgument,
                  "dpdk: the EAL was already initialised in this process (rte_eal_init runs "
                  "once per process: one dpdk section per server)");
  }
  std::vector<std::string> args{"snic_server"};
  args.insert(args.end(), c.eal_args.begin(), c.eal_args.end());
  if (!names_a_device(c.eal_args)) args.emplace_back("--no-pci");
  std::vector<char*> argv;
  std::string joined;
  for (std::string& a : args) {
    argv.push_back(a.data());
    joined += (joined.empty() ? "" : " ") + a;
  }
  argv.push_back(nullptr);
  spdlog::info("dpdk: rte_eal_init {}", joined);
  AffinityKeeper keep;
  if (rte_eal_init(static_cast<int>(args.size()), argv.data()) < 0) {
    return dpdk_error(
        "rte_eal_init failed (EAL arguments: " + joined + "; see the EAL lines above)", rte_errno);
  }
  return Status::ok_status();
}

}  // namespace

DpdkPort::DpdkPort(std::shared_ptr<DpdkPortState> state) : state_(std::move(state)) {}

DpdkPort::~DpdkPort() {
  stop();
}

const std::string& DpdkPort::description() const {
  return state_->description;
}

Result<std::unique_ptr<DpdkPort>> DpdkPort::open(const DpdkConfig& config, ReplyTable& replies,
                                                 Registry& metrics, uint32_t engine_threads) {
  CARACAL_RETURN_IF_ERROR(init_eal(config));
  auto state = std::make_shared<DpdkPortState>(config, replies, metrics, engine_threads);
  std::unique_ptr<DpdkPort> port(new DpdkPort(state));  // stop() cleans up on failure
  DpdkPortState& s = *state;

  // The port.
  if (config.port.empty()) {
    if (rte_eth_dev_count_avail() != 1) {
      return invalid_argument(
          "dpdk: " + std::to_string(rte_eth_dev_count_avail()) + " ethdev ports (" + port_names() +
          "): name one with dpdk.port, or give the EAL one device (--vdev or -a)");
    }
    RTE_ETH_FOREACH_DEV(s.port_id) break;
  } else if (rte_eth_dev_get_port_by_name(config.port.c_str(), &s.port_id) != 0) {
    return invalid_argument("dpdk: no ethdev port named '" + config.port +
                            "' (there are: " + port_names() + ")");
  }
  char name[RTE_ETH_NAME_MAX_LEN] = {};
  rte_eth_dev_get_name_by_port(s.port_id, name);
  s.port_name = name;

  rte_eth_dev_info info{};
  if (int rc = rte_eth_dev_info_get(s.port_id, &info); rc != 0)
    return dpdk_error("dev_info_get", rc);
  const uint16_t q = config.queues;
  if (q > info.max_rx_queues || q > info.max_tx_queues) {
    return invalid_argument("dpdk: queues: " + std::to_string(q) + " but " + s.port_name + " (" +
                            info.driver_name + ") has at most " +
                            std::to_string(std::min(info.max_rx_queues, info.max_tx_queues)) +
                            " (for net_af_packet, give qpairs=N in its --vdev)");
  }
  for (unsigned lcore = rte_get_next_lcore(-1, 1, 0); lcore < RTE_MAX_LCORE && s.lcores.size() < q;
       lcore = rte_get_next_lcore(lcore, 1, 0)) {
    s.lcores.push_back(lcore);
  }
  if (s.lcores.size() < q) {
    return invalid_argument("dpdk: queues: " + std::to_string(q) + " needs " + std::to_string(q) +
                            " worker lcores but the EAL has " +
                            std::to_string(rte_lcore_count() - 1) +
                            " (the first lcore of -l/--lcores is the main one and polls no queue)");
  }

  rte_eth_conf conf{};
  std::string rss = "no RSS";
  if (q > 1) {
    const uint64_t want = RTE_ETH_RSS_IPV4 | RTE_ETH_RSS_NONFRAG_IPV4_UDP;
    const uint64_t hf = want & info.flow_type_rss_offloads;
    if (hf != 0) {
      conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
      conf.rx_adv_conf.rss_conf.rss_hf = hf;
      rss = "RSS";
    } else {
      rss = "no RSS (the PMD spreads flows, if at all)";
    }
  }
  const uint64_t rx_ck = RTE_ETH_RX_OFFLOAD_IPV4_CKSUM | RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
  const uint64_t tx_ck = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
  const bool rx_offload = config.checksum_offload && (info.rx_offload_capa & rx_ck) == rx_ck;
  s.tx_offload = config.checksum_offload && (info.tx_offload_capa & tx_ck) == tx_ck;
  if (rx_offload) conf.rxmode.offloads |= rx_ck;
  if (s.tx_offload) conf.txmode.offloads |= tx_ck;
  if (int rc = rte_eth_dev_configure(s.port_id, q, q, &conf); rc != 0) {
    return dpdk_error("configuring " + s.port_name + " with " + std::to_string(q) + " queue(s)",
                      rc);
  }

  uint16_t mtu = RTE_ETHER_MTU;
  rte_eth_dev_get_mtu(s.port_id, &mtu);
  const uint32_t data_room = std::max<uint32_t>(
      RTE_MBUF_DEFAULT_DATAROOM, uint32_t{mtu} + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN);
  s.max_payload = std::min<uint32_t>(mtu, data_room - RTE_ETHER_HDR_LEN) - 28;
  const int socket =
      rte_eth_dev_socket_id(s.port_id) < 0 ? SOCKET_ID_ANY : rte_eth_dev_socket_id(s.port_id);
  s.pool = rte_pktmbuf_pool_create("caracal_mbufs", config.mbufs, config.mbuf_cache, 0,
                                   static_cast<uint16_t>(data_room + RTE_PKTMBUF_HEADROOM), socket);
  if (s.pool == nullptr) {
    return dpdk_error("creating a pool of " + std::to_string(config.mbufs) +
                          " mbufs (give the EAL more memory with -m, or ask for fewer mbufs)",
                      rte_errno);
  }
  uint16_t rxd = config.rx_descriptors;
  uint16_t txd = config.tx_descriptors;
  rte_eth_dev_adjust_nb_rx_tx_desc(s.port_id, &rxd, &txd);
  for (uint16_t i = 0; i < q; ++i) {
    rte_eth_rxconf rxc = info.default_rxconf;
    rxc.offloads = conf.rxmode.offloads;
    if (int rc = rte_eth_rx_queue_setup(s.port_id, i, rxd, socket, &rxc, s.pool); rc != 0) {
      return dpdk_error("RX queue " + std::to_string(i) + " setup", rc);
    }
    rte_eth_txconf txc = info.default_txconf;
    txc.offloads = conf.txmode.offloads;
    if (int rc = rte_eth_tx_queue_setup(s.port_id, i, txd, socket, &txc); rc != 0) {
      return dpdk_error("TX queue " + std::to_string(i) + " setup", rc);
    }
  }
  if (int rc = rte_eth_dev_start(s.port_id); rc != 0)
    return dpdk_error("starting " + s.port_name, rc);
  s.port_started = true;
  rte_eth_macaddr_get(s.port_id, &s.me.mac);
  s.me.ipv4_be = config.ipv4_be;

  const Labels labels{{"port", s.port_name}};
  for (size_t i = 0; i < s.frame_drops.size(); ++i) {
    Labels l = labels;
    l.emplace_back("reason", dpdk::frame_drop_name(static_cast<FrameDrop>(i)));
    s.frame_drops[i] =
        &metrics.counter("caracal_dpdk_drops_total",
                         "Frames the DPDK port dropped before any listener, by reason", l);
  }
  s.arp_replies = &metrics.counter("caracal_dpdk_arp_replies_total",
                                   "ARP requests for the port's address that it answered", labels);
  metrics.gauge("caracal_dpdk_mbufs", "mbufs in the DPDK port's pool", labels).set(config.mbufs);
  rte_mempool* pool = s.pool;
  s.mbufs_callback = metrics.gauge_callback(
      "caracal_dpdk_mbufs_available",
      "mbufs in the DPDK port's pool that nothing holds (the rest: RX rings and packets in hand)",
      labels, [pool] { return static_cast<double>(rte_mempool_avail_count(pool)); });

  s.description = s.port_name + " (" + info.driver_name + ") " + config.ipv4 + " " +
                  mac_text(s.me.mac) + " mtu " + std::to_string(mtu) + ", " + std::to_string(q) +
                  " queue(s) on lcore(s)";
  for (unsigned l : s.lcores)
    s.description += " " + std::to_string(l);
  s.description += ", " + rss + ", checksums: RX " + (rx_offload ? "offloaded" : "software") +
                   ", TX " + (s.tx_offload ? "offloaded" : "software");
  for (uint16_t i = 0; i < q; ++i)
    s.workers.push_back(std::make_shared<DpdkWorker>(state, i));
  return port;
}

std::unique_ptr<Listener> DpdkPort::make_listener(const ListenerConfig& config, Service& service) {
  DpdkPortState& s = *state_;
  if (s.running) throw std::logic_error("dpdk listeners are made before the port runs");
  if (s.bindings.size() >= kNoBinding) throw std::invalid_argument("too many dpdk listeners");
  s.bindings.push_back(std::make_unique<DpdkBinding>(config, service, s.metrics));
  s.binding_by_udp_port[config.listen.port] = static_cast<uint16_t>(s.bindings.size() - 1);
  return std::make_unique<DpdkListener>(*s.bindings.back());
}

Status DpdkPort::run() {
  DpdkPortState& s = *state_;
  if (s.running) return Status::ok_status();
  for (size_t i = 0; i < s.workers.size(); ++i) {
    if (int rc = rte_eal_remote_launch(&DpdkWorker::lcore_main, s.workers[i].get(), s.lcores[i]);
        rc != 0) {
      stop();
      return dpdk_error("launching the worker of queue " + std::to_string(i) + " on lcore " +
                            std::to_string(s.lcores[i]),
                        rc);
    }
    s.running = true;
  }
  s.running = true;
  return Status::ok_status();
}

void DpdkPort::stop() {
  if (!state_) return;
  DpdkPortState& s = *state_;
  if (s.stopped.exchange(true, std::memory_order_acq_rel)) return;
  s.quit.store(true, std::memory_order_release);  // pairs with the workers' acquire load
  for (unsigned lcore : s.lcores)
    rte_eal_wait_lcore(lcore);
  for (auto& w : s.workers)
    w->discard_pending();
  if (s.mbufs_callback != 0) s.metrics.remove_callback(s.mbufs_callback);
  if (s.port_started) {
    rte_eth_dev_stop(s.port_id);
    rte_eth_dev_close(s.port_id);
  }
  // Closing the port freed what its rings held; every other mbuf was sent or freed by the
  // workers, so the pool is whole again.
  if (s.pool != nullptr) {
    const unsigned in_use = rte_mempool_in_use_count(s.pool);
    if (in_use != 0) SPDLOG_WARN("dpdk: {} mbuf(s) not returned to the pool at stop", in_use);
    rte_mempool_free(s.pool);
    s.pool = nullptr;
  }
}

}  // namespace caracal::server
