// The SmartNIC's handle on one agent's region, reached through a Transport: it reads and
// validates the header, takes over every ring at its current indexes, and fetches all TX tails
// with one read.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/remote_ring.hpp"
#include "caracal/mqueue/transport.hpp"
#include "caracal/mqueue/validate.hpp"

namespace caracal::mqueue {

template <Transport T>
class RemoteRegion {
 public:
  // Reads the header and control area through `transport` (which must outlive the region),
  // validates every header field, and sets up producers for the RX rings and consumers for the
  // TX rings at the indexes found there.
  static Result<RemoteRegion> attach(T* transport,
                                     std::chrono::nanoseconds timeout = std::chrono::seconds(2)) {
    if (transport->region_bytes() < kPageBytes) {
      return invalid_argument(std::string(transport->name()) + " region of " +
                              std::to_string(transport->region_bytes()) +
                              " bytes is smaller than a header page");
    }
    CARACAL_RETURN_IF_ERROR(
        wait_for(*transport, transport->post_read(0, sizeof(RegionHeader)), timeout));
    RemoteRegion r;
    r.t_ = transport;
    std::memcpy(&r.header_, transport->staging(0), sizeof(RegionHeader));
    CARACAL_RETURN_IF_ERROR(validate_region(r.header_, transport->region_bytes()));
    const RegionHeader& h = r.header_;
    CARACAL_RETURN_IF_ERROR(wait_for(
        *transport, transport->post_read(h.control_offset, static_cast<uint32_t>(h.control_bytes)),
        timeout));
    const RingGeometry g = ring_geometry(h);
    const uint32_t queues = mqueue::queue_count(h);
    r.rx_.reserve(queues);
    r.tx_.reserve(queues);
    for (uint32_t q = 0; q < queues; ++q) {
      const RemoteRingAddress rx{rx_ring_offset(h, q), index_offset(h, IndexArray::kRxTail, q),
                                 index_offset(h, IndexArray::kRxHead, q),
                                 has_rx_lines(h) ? rx_lines_offset(h, q) : 0};
      const RemoteRingAddress tx{tx_ring_offset(h, q), index_offset(h, IndexArray::kTxTail, q),
                                 index_offset(h, IndexArray::kTxHead, q),
                                 has_tx_lines(h) ? tx_lines_offset(h, q) : 0};
      r.rx_.emplace_back(
          transport, rx, g, transport->load_index(rx.tail_offset),
          transport->load_index(rx.head_offset),
          has_rx_lines(h) ? transport->load_index(rx.tail_offset + kEntriesWordOffset) : 0);
      r.tx_.emplace_back(
          transport, tx, g, transport->load_index(tx.head_offset),
          has_tx_lines(h) ? transport->load_index(tx.head_offset + kEntriesWordOffset) : 0);
    }
    return r;
  }

  const RegionHeader& header() const { return header_; }
  uint32_t queue_count() const { return static_cast<uint32_t>(rx_.size()); }
  RemoteRingProducer<T>& rx(uint32_t queue) { return rx_[queue]; }
  RemoteRingConsumer<T>& tx(uint32_t queue) { return tx_[queue]; }
  T& transport() { return *t_; }

  // Posts one read of every TX tail (they are contiguous) unless one is still in flight; when
  // it has completed, deliver_tx_tails() hands each consumer its tail. Returns the read's
  // ticket. A poll loop may call fetch and deliver every round.
  uint64_t fetch_tx_tails() {
    if (tails_ticket_ == 0) {
      tails_ticket_ = t_->post_read(index_offset(header_, IndexArray::kTxTail, 0),
                                    queue_count() * header_.control_line_bytes);
    }
    return tails_ticket_;
  }
  // True when the last fetch had completed and its tails were delivered.
  bool deliver_tx_tails() {
    if (tails_ticket_ == 0 || t_->completed() < tails_ticket_) return false;
    for (uint32_t q = 0; q < queue_count(); ++q) {
      tx_[q].observe_tail(t_->load_index(index_offset(header_, IndexArray::kTxTail, q)));
    }
    tails_ticket_ = 0;
    return true;
  }

  // One queue's TX tail, loaded and handed to its consumer at once. Only for a transport
  // whose loads complete when they return (shm): there a thread serving some of a region's
  // queues reads just their tails, without the shared ticket of fetch_tx_tails().
  void observe_tx_tail(uint32_t queue) {
    tx_[queue].observe_tail(t_->load_index(index_offset(header_, IndexArray::kTxTail, queue)));
  }

  // Asks every poller of the region to return (the agent's runtime watches this word). Returns
  // the publish's ticket.
  uint64_t request_stop() { return t_->publish_index(stop_word_offset(header_), 1); }

 private:
  T* t_ = nullptr;
  RegionHeader header_{};
  std::vector<RemoteRingProducer<T>> rx_;
  std::vector<RemoteRingConsumer<T>> tx_;
  uint64_t tails_ticket_ = 0;
};

}  // namespace caracal::mqueue
