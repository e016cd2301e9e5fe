// The DPDK port's data path: each worker lcore polls its RX/TX queue pair, answers ARP for the
// port's address, parses and checks frames (dpdk_packet.hpp), dispatches datagrams as the Asio
// UDP listener does, and sends the replies the engine delivered to it in bursts from the same
// queue. Every mbuf is sent or freed on every path. The port's setup is dpdk_port.cpp.
#include <rte_byteorder.h>
#include <rte_ethdev.h>
#include <sys/prctl.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <span>
#include <thread>

#include "dpdk_port_state.hpp"
#include "tunables.hpp"

namespace caracal::server {

using dpdk::FrameDrop;
using dpdk::RxFrame;
using udp = boost::asio::ip::udp;

DpdkWorker::DpdkWorker(std::shared_ptr<DpdkPortState> state, uint16_t queue)
    : ReplySink(state->engine_threads),
      state_(std::move(state)),
      queue_(queue),
      slot_peer_(state_->replies.capacity()),
      rx_(state_->config.burst),
      tx_(state_->config.burst),
      tx_binding_(state_->config.burst) {
  const Labels labels{{"port", state_->port_name}, {"queue", std::to_string(queue)}};
  rx_frames_ = &state_->metrics.counter("caracal_dpdk_rx_frames_total",
                                        "Frames the DPDK port received, by queue", labels);
  tx_frames_ = &state_->metrics.counter("caracal_dpdk_tx_frames_total",
                                        "Frames the DPDK port sent, by queue", labels);
}

void DpdkWorker::deliver(uint32_t /*thread*/, uint64_t token, const udp::endpoint& peer,
                         ReplyView reply) {
  const SlotPeer sp = slot_peer_[split_token(token).slot];
  state_->replies.release(token);
  outstanding_.fetch_sub(1, std::memory_order_relaxed);
  if (state_->stopped.load(std::memory_order_acquire)) {
    if (reply.kind != Reply::Kind::kNoReply && sp.binding != kNoBinding) {
      state_->bindings[sp.binding]->stats.drop(DropReason::kSendFailed);
    }
    return;
  }
  std::lock_guard lock(pending_m_);
  if (pending_used_ == pending_.size()) pending_.emplace_back();
  PendingReply& p = pending_[pending_used_++];
  p.slot = sp;
  p.peer = peer;
  p.kind = reply.kind;
  p.bytes.assign(reply.bytes);
  // Pairs with the acquire load in drain_replies(): a worker that sees the count then takes
  // the lock, which is what orders the vector's contents.
  pending_count_.store(static_cast<uint32_t>(pending_used_), std::memory_order_release);
}

void DpdkWorker::discard_pending() {
  std::lock_guard lock(pending_m_);
  for (size_t i = 0; i < pending_used_; ++i) {
    const PendingReply& p = pending_[i];
    if (p.kind != Reply::Kind::kNoReply) {
      state_->bindings[p.slot.binding]->stats.drop(DropReason::kSendFailed);
    }
  }
  pending_used_ = 0;
  pending_count_.store(0, std::memory_order_relaxed);
}

int DpdkWorker::run() {
  DpdkPortState& s = *state_;
  if (queue_ == 0) announce();
  // Idle sleeps are short; the default timer slack (50 us) would stretch each of them.
  if (s.config.idle_sleep_us > 0) {
    prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(tunables::kDpdkTimerSlack.count()), 0, 0,
          0);
  }
  uint32_t empty_polls = 0;
  while (!s.quit.load(std::memory_order_acquire)) {
    const uint16_t n = rte_eth_rx_burst(s.port_id, queue_, rx_.data(), s.config.burst);
    if (n > 0) rx_frames_->inc(n);
    for (uint16_t i = 0; i < n; ++i)
      on_frame(rx_[i]);
    const bool replied = drain_replies();
    flush();
    // Sleep only with no request of this queue in flight: a reply is then on its way and
    // should leave at once.
    if (n == 0 && !replied) {
      if (s.config.idle_sleep_us > 0 && ++empty_polls >= tunables::kDpdkEmptyPollsBeforeSleep &&
          outstanding_.load(std::memory_order_relaxed) == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(s.config.idle_sleep_us));
      }
    } else {
      empty_polls = 0;
    }
  }
  flush();
  return 0;
}

void DpdkWorker::announce() {
  if (rte_mbuf* m = dpdk::build_gratuitous_arp(state_->pool, state_->me)) push(m, kNoBinding);
  flush();
}

void DpdkWorker::on_frame(rte_mbuf* m) {
  DpdkPortState& s = *state_;
  const RxFrame f = dpdk::parse_frame(m, s.me);
  switch (f.kind) {
    case RxFrame::Kind::kDrop:
      s.drop(f.drop);
      rte_pktmbuf_free(m);
      return;
    case RxFrame::Kind::kArpRequest:
      dpdk::arp_request_to_reply(m, s.me);
      s.arp_replies->inc();
      push(m, kNoBinding);
      return;
    case RxFrame::Kind::kUdp:
      break;
  }
  const uint16_t b = s.binding_by_udp_port[f.dst_port];
  if (b == kNoBinding || !s.bindings[b]->open.load(std::memory_order_relaxed)) {
    s.drop(FrameDrop::kNoListener);
    rte_pktmbuf_free(m);
    return;
  }
  DpdkBinding& binding = *s.bindings[b];
  binding.stats.requests.inc();
  const udp::endpoint peer(boost::asio::ip::address_v4(rte_be_to_cpu_32(f.src_ip_be)), f.src_port);
  const SlotPeer from{f.src_mac, b};
  const uint32_t max = binding.service.config().max_message_bytes;
  if (f.payload_bytes > max) {
    rte_pktmbuf_free(m);
    binding.stats.drop(DropReason::kOversize);
    send_error(from, peer, "message longer than " + std::to_string(max) + " bytes");
    return;
  }
  std::string bytes(f.payload_bytes, '\0');
  dpdk::copy_payload(m, f, reinterpret_cast<std::byte*>(bytes.data()));
  rte_pktmbuf_free(m);

  std::optional<uint64_t> token = s.replies.acquire(shared_from_this(), peer);
  if (!token) {
    binding.stats.drop(DropReason::kReplySlots);
    return;
  }
  slot_peer_[split_token(*token).slot] = from;
  // Counted before dispatch: the reply may be delivered (and counted down) before it returns.
  outstanding_.fetch_add(1, std::memory_order_relaxed);
  switch (binding.service.dispatch(*token, bytes, flow_of(peer), false)) {
    case DispatchStatus::kQueued:
    case DispatchStatus::kCongested:
      return;
    case DispatchStatus::kFull:
      outstanding_.fetch_sub(1, std::memory_order_relaxed);
      s.replies.release(*token);
      binding.stats.drop(DropReason::kQueueFull);
      return;
    case DispatchStatus::kNoAgent:
      outstanding_.fetch_sub(1, std::memory_order_relaxed);
      s.replies.release(*token);
      binding.stats.drop(DropReason::kNoAgent);
      send_error(from, peer, "no agent serves service " + binding.service.name());
      return;
  }
}

bool DpdkWorker::drain_replies() {
  // Pairs with the release store in deliver().
  if (pending_count_.load(std::memory_order_acquire) == 0) return false;
  // The engine's list and this lcore's trade places: the entries of both keep their buffers.
  size_t taken = 0;
  {
    std::lock_guard lock(pending_m_);
    taken_.swap(pending_);
    taken = pending_used_;
    pending_used_ = 0;
    pending_count_.store(0, std::memory_order_relaxed);
  }
  for (size_t i = 0; i < taken; ++i) {
    const PendingReply& p = taken_[i];
    DpdkBinding& binding = *state_->bindings[p.slot.binding];
    switch (p.kind) {
      case Reply::Kind::kNoReply:
        break;
      case Reply::Kind::kData:
        send(p.slot, p.peer, p.bytes);
        break;
      case Reply::Kind::kError:
        if (!binding.config.error_reply) binding.stats.drop(DropReason::kRequestFailed);
        send_error(p.slot, p.peer, p.bytes);
        break;
    }
  }
  return true;
}

void DpdkWorker::send_error(const SlotPeer& to, const udp::endpoint& peer,
                            const std::string& reason) {
  if (auto text = format_error_reply(state_->bindings[to.binding]->config, reason)) {
    send(to, peer, *text);
  }
}

void DpdkWorker::send(const SlotPeer& to, const udp::endpoint& peer, const std::string& bytes) {
  DpdkPortState& s = *state_;
  DpdkBinding& binding = *s.bindings[to.binding];
  if (bytes.size() > s.max_payload) {
    binding.stats.drop(DropReason::kReplyTooLarge);
    return;
  }
  dpdk::UdpTo dst;
  dst.dst_mac = to.mac;
  dst.dst_ip_be = rte_cpu_to_be_32(peer.address().to_v4().to_uint());
  dst.src_port = binding.config.listen.port;
  dst.dst_port = peer.port();
  rte_mbuf* m = dpdk::build_udp(
      s.pool, s.me, dst,
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
      next_ip_id_++, s.tx_offload);
  if (m == nullptr) {
    binding.stats.drop(DropReason::kNoMbufs);
    return;
  }
  push(m, to.binding);
}

void DpdkWorker::push(rte_mbuf* m, uint16_t binding) {
  tx_[tx_count_] = m;
  tx_binding_[tx_count_] = binding;
  if (++tx_count_ == tx_.size()) flush();
}

void DpdkWorker::flush() {
  if (tx_count_ == 0) return;
  DpdkPortState& s = *state_;
  const uint16_t sent = rte_eth_tx_burst(s.port_id, queue_, tx_.data(), tx_count_);
  if (sent > 0) tx_frames_->inc(sent);
  for (uint16_t i = 0; i < sent; ++i) {
    if (tx_binding_[i] != kNoBinding) s.bindings[tx_binding_[i]]->stats.replies.inc();
  }
  for (uint16_t i = sent; i < tx_count_; ++i) {
    rte_pktmbuf_free(tx_[i]);
    if (tx_binding_[i] != kNoBinding) {
      s.bindings[tx_binding_[i]]->stats.drop(DropReason::kSendBufferFull);
    }
  }
  tx_count_ = 0;
}

}  // namespace caracal::server
