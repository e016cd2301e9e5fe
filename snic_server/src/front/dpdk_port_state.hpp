// The DPDK port's state, shared by its setup (dpdk_port.cpp: the EAL, the ethdev, the mempool,
// the listeners' bindings) and its workers' data path (dpdk_worker.cpp: one lcore per RX/TX queue
// pair). Private to the DPDK object library: it includes DPDK, which only the sources compiled
// with DPDK's flags see.
#pragma once

#include <rte_ether.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <array>
#include <atomic>
#include <boost/asio/ip/udp.hpp>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config.hpp"
#include "dispatch.hpp"
#include "front/dpdk_packet.hpp"
#include "listener_common.hpp"
#include "metrics/metrics.hpp"
#include "reply_routing.hpp"

namespace caracal::server {

// No dpdk listener: a UDP port no binding serves, or a frame that is not a reply (ARP).
inline constexpr uint16_t kNoBinding = 0xFFFF;

// One dpdk listener: the UDP port it serves and where its datagrams go.
struct DpdkBinding {
  DpdkBinding(const ListenerConfig& c, Service& s, Registry& metrics)
      : config(c), service(s), name(listener_name(c)), stats(metrics, s.name(), name) {}
  ListenerConfig config;
  Service& service;
  std::string name;
  ListenerStats stats;
  // Cleared by Listener::stop() (any thread), read by the workers; relaxed: it orders nothing,
  // datagrams that race with it are served or dropped either way.
  std::atomic<bool> open{true};
};

class DpdkWorker;

struct DpdkPortState {
  DpdkPortState(const DpdkConfig& c, ReplyTable& r, Registry& m, uint32_t threads)
      : config(c), replies(r), metrics(m), engine_threads(threads) {
    binding_by_udp_port.fill(kNoBinding);
  }

  DpdkConfig config;
  ReplyTable& replies;
  Registry& metrics;
  uint32_t engine_threads;  // the lanes of each worker's ReplySink

  uint16_t port_id = 0;
  std::string port_name;
  std::string description;
  dpdk::PortAddress me;
  rte_mempool* pool = nullptr;
  uint32_t max_payload = 0;  // the longest UDP payload one frame of the MTU carries
  bool tx_offload = false;
  bool port_started = false;

  // Written before run() launches the workers, read-only afterwards. rte_eal_remote_launch
  // publishes them: it hands the function to the worker with a release store that the worker's
  // acquire load pairs with (eal_thread_loop), so a worker sees every binding made before.
  std::vector<std::unique_ptr<DpdkBinding>> bindings;
  std::array<uint16_t, 65536> binding_by_udp_port{};

  std::vector<std::shared_ptr<DpdkWorker>> workers;
  std::vector<unsigned> lcores;
  bool running = false;
  // Set by stop(); the workers' acquire load pairs with its release store, and stop() then
  // waits for them with rte_eal_wait_lcore.
  std::atomic<bool> quit{false};
  // Set once the workers are gone: deliver() drops what comes later.
  std::atomic<bool> stopped{false};

  std::array<Counter*, static_cast<size_t>(dpdk::FrameDrop::kCount)> frame_drops{};
  Counter* arp_replies = nullptr;
  uint64_t mbufs_callback = 0;

  void drop(dpdk::FrameDrop why) { frame_drops[static_cast<size_t>(why)]->inc(); }
};

// One RX/TX queue pair and the lcore that polls it. It is the ReplySink of the requests it
// received, so replies go back out of the queue they came in on.
class DpdkWorker final : public ReplySink, public std::enable_shared_from_this<DpdkWorker> {
 public:
  DpdkWorker(std::shared_ptr<DpdkPortState> state, uint16_t queue);

  // Engine threads (pending_m_ orders them): hands the reply to this worker's lcore. The slot's MAC
  // and listener are read before the slot is released (after that, this lcore may give the slot to
  // another request). They were written by this lcore before the request was dispatched; the inbox
  // mutex between dispatch and the engine orders that write before this read.
  void deliver(uint32_t /*thread*/, uint64_t token, const boost::asio::ip::udp::endpoint& peer,
               ReplyView reply) override;

  static int lcore_main(void* self) { return static_cast<DpdkWorker*>(self)->run(); }

  // Replies still waiting when the workers stopped: dropped, counted.
  void discard_pending();

 private:
  struct SlotPeer {
    rte_ether_addr mac{};
    uint16_t binding = kNoBinding;
  };
  // A delivered reply. The lists of them are reused from burst to burst, each entry keeping
  // its buffer's capacity, so that once the bursts reached their largest count and size a
  // reply is copied without an allocation.
  struct PendingReply {
    SlotPeer slot;
    boost::asio::ip::udp::endpoint peer;
    Reply::Kind kind = Reply::Kind::kData;
    std::string bytes;
  };

  // The lcore's loop (lcore_main()): bursts in, replies out, until the port quits.
  int run();

  // A gratuitous ARP, so that neighbours map the port's address to its MAC.
  void announce();

  // One received frame: answered (ARP), dispatched (UDP to a listener) or dropped, counted.
  void on_frame(rte_mbuf* m);

  // Takes the replies the engine delivered and queues their frames. True if there were any.
  bool drain_replies();

  void send_error(const SlotPeer& to, const boost::asio::ip::udp::endpoint& peer,
                  const std::string& reason);

  void send(const SlotPeer& to, const boost::asio::ip::udp::endpoint& peer,
            const std::string& bytes);

  // Queues a frame to send; a full burst is flushed.
  void push(rte_mbuf* m, uint16_t binding);

  // Sends what is queued; what the TX queue does not take is freed and counted.
  void flush();

  std::shared_ptr<DpdkPortState> state_;
  uint16_t queue_;
  // By reply slot: the MAC a request came from and its listener (see deliver()).
  std::vector<SlotPeer> slot_peer_;

  std::mutex pending_m_;
  // Delivered by the engine, under pending_m_: [0, pending_used_) of pending_.
  std::vector<PendingReply> pending_;
  size_t pending_used_ = 0;
  std::atomic<uint32_t> pending_count_{0};  // pending_used_, for a look without the lock
  // Requests of this queue dispatched and not yet delivered back; only steers idle sleeping,
  // so relaxed.
  std::atomic<int64_t> outstanding_{0};

  // The lcore's own.
  std::vector<PendingReply> taken_;  // drain_replies()'s list, all of whose entries it sends
  std::vector<rte_mbuf*> rx_;
  std::vector<rte_mbuf*> tx_;
  std::vector<uint16_t> tx_binding_;
  uint16_t tx_count_ = 0;
  uint16_t next_ip_id_ = 0;
  Counter* rx_frames_ = nullptr;
  Counter* tx_frames_ = nullptr;
};

}  // namespace caracal::server
