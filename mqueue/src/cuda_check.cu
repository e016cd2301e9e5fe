// Compiles the shared mqueue headers for the device (and the host pass of nvcc): a device
// echo loop over one queue built only from the contract's own types. The build of this object
// is the proof that layout.hpp, ring.hpp and region.hpp stay device-clean.
#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/ring.hpp"

namespace caracal::mqueue {

static_assert(sizeof(RegionHeader) == 112, "device and host agree on the header");
static_assert(sizeof(SlotHeader) == kSlotHeaderBytes, "device and host agree on slots");

__global__ void mqueue_device_echo_check(std::byte* region, uint32_t queue) {
  if (threadIdx.x != 0) return;
  RegionView view(region);
  RingConsumer rx = view.rx_consumer(queue);
  RingProducer tx = view.tx_producer(queue);
  uint32_t spins = 0;
  while (!(++spins % 4096 == 0 && view.stop_requested())) {
    Entry e;
    if (rx.next(e) != PollResult::kReady) {
      spin_pause(200);
      continue;
    }
    std::byte* out = tx.reserve(e.length);
    if (out == nullptr) break;
    for (uint32_t i = 0; i < e.length; ++i)
      out[i] = e.payload[i];
    tx.commit(e.length, e.token, e.flags);
    rx.release();
    tx.publish();
    rx.publish();
  }
}

}  // namespace caracal::mqueue
