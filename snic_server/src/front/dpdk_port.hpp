// The server's DPDK port: UDP for `kind: dpdk` listeners on one ethdev, with kernel bypass.
//
// One port per process (rte_eal_init runs once per process): every dpdk listener shares its
// IPv4 address and queues and is told apart by its UDP port. Each RX/TX queue pair is polled
// by its own worker lcore, which receives a burst, answers ARP requests for the port's address,
// parses and checks IPv4/UDP (dpdk_packet.hpp), dispatches datagrams to the listener's service
// exactly as the Asio UDP listener does, and sends the replies that the engine delivered to it
// in bursts from the same queue. A reply goes to the address, port and MAC that the request
// came from, from the listener's UDP port. Every mbuf is sent or freed on every path.
//
// This header does not include DPDK, so the server builds without it; open() then fails.
#pragma once

#include <memory>
#include <string>

#include "caracal/core/status.hpp"
#include "config.hpp"
#include "metrics/metrics.hpp"
#include "reply_routing.hpp"

namespace caracal::server {

class Listener;
class Service;
struct DpdkPortState;

class DpdkPort {
 public:
  // Initialises the EAL with config.eal_args (once per process: a second call fails), finds
  // and configures the ethdev, its queues, offloads and mempool, and starts it. Nothing is
  // polled until run(). The error says what failed and what to change. `engine_threads`: the
  // engine's threads, each of which has a lane in every worker (ReplySink).
  static Result<std::unique_ptr<DpdkPort>> open(const DpdkConfig& config, ReplyTable& replies,
                                                Registry& metrics, uint32_t engine_threads);
  ~DpdkPort();  // stop()
  DpdkPort(const DpdkPort&) = delete;
  DpdkPort& operator=(const DpdkPort&) = delete;

  // A listener on the UDP port of `config.listen`; only before run().
  std::unique_ptr<Listener> make_listener(const ListenerConfig& config, Service& service);
  // Launches a worker lcore per queue pair; it announces the address with a gratuitous ARP.
  Status run();
  // Stops the workers (replies delivered afterwards are dropped and counted `send_failed`),
  // stops and closes the ethdev and frees the mempool once every mbuf is back. Idempotent.
  void stop();

  // "net_af_packet0 (net_af_packet) 192.0.2.2 02:..:.. mtu 1500, 2 queue(s), ..." for the log.
  const std::string& description() const;

 private:
  explicit DpdkPort(std::shared_ptr<DpdkPortState> state);
  std::shared_ptr<DpdkPortState> state_;
};

}  // namespace caracal::server
