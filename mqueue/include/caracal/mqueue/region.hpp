// The accelerator's view of a region it holds in its own memory: typed access to the header,
// the control words and the rings. Host/device code; see layout.hpp for the layout and
// ring.hpp for the protocol.
#pragma once

#include <cstdint>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/platform.hpp"
#include "caracal/mqueue/ring.hpp"

namespace caracal::mqueue {

class RegionView {
 public:
  CARACAL_HOST_DEVICE RegionView() {}
  // `base` points at a region whose header has been written (and, when it came from a peer,
  // validated with validate_region).
  CARACAL_HOST_DEVICE explicit RegionView(std::byte* base)
      : base_(base), header_(*reinterpret_cast<const RegionHeader*>(base)) {}

  CARACAL_INLINE const RegionHeader& header() const { return header_; }
  CARACAL_INLINE std::byte* base() const { return base_; }
  CARACAL_INLINE uint32_t server_queue_count() const { return header_.server_queue_count; }
  CARACAL_INLINE uint32_t client_queue_count() const { return header_.client_queue_count; }

  CARACAL_INLINE uint32_t* index_word(IndexArray array, uint32_t queue) const {
    return reinterpret_cast<uint32_t*>(base_ + index_offset(header_, array, queue));
  }
  CARACAL_INLINE uint32_t* stop_word() const {
    return reinterpret_cast<uint32_t*>(base_ + stop_word_offset(header_));
  }

  // The stop word carries no data, so pollers read it relaxed; the release store only keeps
  // whatever the stopper wrote before it (say, a reason) ordered ahead of it.
  CARACAL_INLINE bool stop_requested() const { return load_relaxed(stop_word()) != 0; }
  CARACAL_INLINE void request_stop() const { store_release(stop_word(), 1); }
  CARACAL_INLINE void clear_stop() const { store_release(stop_word(), 0); }

  // Queue `queue`'s RX lines, or nullptr when the region has none.
  CARACAL_INLINE const uint64_t* rx_lines(uint32_t queue) const {
    if (!has_rx_lines(header_)) return nullptr;
    return reinterpret_cast<const uint64_t*>(base_ + rx_lines_offset(header_, queue));
  }

  // Queue `queue`'s TX lines, or nullptr when the region has none.
  CARACAL_INLINE uint64_t* tx_lines(uint32_t queue) const {
    if (!has_tx_lines(header_)) return nullptr;
    return reinterpret_cast<uint64_t*>(base_ + tx_lines_offset(header_, queue));
  }

  // The accelerator consumes RX and produces TX, for server and client queues alike.
  CARACAL_INLINE RingConsumer rx_consumer(uint32_t queue) const {
    return RingConsumer(base_ + rx_ring_offset(header_, queue), ring_geometry(header_),
                        index_word(IndexArray::kRxTail, queue),
                        index_word(IndexArray::kRxHead, queue), rx_lines(queue));
  }
  CARACAL_INLINE RingProducer tx_producer(uint32_t queue) const {
    return RingProducer(base_ + tx_ring_offset(header_, queue), ring_geometry(header_),
                        index_word(IndexArray::kTxTail, queue),
                        index_word(IndexArray::kTxHead, queue), tx_lines(queue));
  }

 private:
  std::byte* base_ = nullptr;
  RegionHeader header_{};
};

}  // namespace caracal::mqueue
