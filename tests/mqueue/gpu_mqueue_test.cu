// The mqueue contract between a GPU poller and the SmartNIC side: a kernel polls an RX ring in
// a shared-memory region that this process registered with CUDA as mapped memory, echoes into
// TX with system-scope release, and the SmartNIC side (RemoteRegion over ShmTransport) checks
// every reply. Skipped where no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/shm.hpp"

namespace caracal::mqueue {
namespace {

// One thread per queue: poll RX, copy into TX, publish per message.
__global__ void echo_kernel(std::byte* region) {
  RegionView view(region);
  const uint32_t queue = blockIdx.x;
  if (threadIdx.x != 0 || queue >= view.server_queue_count()) return;
  RingConsumer rx = view.rx_consumer(queue);
  RingProducer tx = view.tx_producer(queue);
  uint32_t spins = 0;
  for (;;) {
    Entry e;
    const PollResult r = rx.next(e);
    if (r == PollResult::kCorrupt) return;
    if (r == PollResult::kEmpty) {
      if (++spins % 1024 == 0 && view.stop_requested()) return;
      spin_pause(100);
      continue;
    }
    std::byte* out = tx.reserve(e.length);
    while (out == nullptr) {
      if (view.stop_requested()) return;
      spin_pause(100);
      out = tx.reserve(e.length);
    }
    for (uint32_t i = 0; i < e.length; ++i)
      out[i] = e.payload[i];
    tx.commit(e.length, e.token, e.flags);
    rx.release();
    tx.publish();
    rx.publish();
  }
}

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::byte pattern(uint32_t queue, uint64_t seq, uint32_t i) {
  return static_cast<std::byte>((queue * 131 + seq * 31 + i * 7) & 0xFF);
}

TEST(GpuMqueue, EchoThroughMappedSharedMemory) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kQueues = 4;
  RegionGeometry g{kQueues, 0, 128, 64, 1000};
  Result<ShmMapping> region = create_shm_region(g, 1, "caracal-gpu-test");
  ASSERT_TRUE(region.ok()) << region.status().message();
  ASSERT_EQ(cudaHostRegister(region->data(), region->size(), cudaHostRegisterMapped), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&dev, region->data(), 0), cudaSuccess);
  echo_kernel<<<kQueues, 32>>>(static_cast<std::byte*>(dev));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);

  ShmTransport transport(region->data(), region->size());
  Result<RemoteRegion<ShmTransport>> remote = RemoteRegion<ShmTransport>::attach(&transport);
  ASSERT_TRUE(remote.ok()) << remote.status().message();

  constexpr uint64_t kPerQueue = 20000;
  std::vector<uint64_t> sent(kQueues, 0), received(kQueues, 0);
  std::vector<std::byte> buf(g.max_message_bytes);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool failed = false;
  while (!failed) {
    bool done = true;
    for (uint32_t q = 0; q < kQueues; ++q) {
      auto& rx = remote->rx(q);
      while (sent[q] < kPerQueue && sent[q] - received[q] < 32) {
        const uint32_t len = static_cast<uint32_t>((sent[q] * 37) % (g.max_message_bytes + 1));
        for (uint32_t i = 0; i < len; ++i)
          buf[i] = pattern(q, sent[q], i);
        if (!rx.push(buf.data(), len, sent[q])) break;
        ++sent[q];
      }
      rx.publish();
      done = done && received[q] == kPerQueue;
    }
    if (done) break;
    remote->fetch_tx_tails();
    ASSERT_TRUE(remote->deliver_tx_tails());
    for (uint32_t q = 0; q < kQueues && !failed; ++q) {
      auto& tx = remote->tx(q);
      Entry e;
      PollResult r;
      while ((r = tx.next(e)) == PollResult::kReady) {
        const uint64_t seq = received[q];
        const uint32_t len = static_cast<uint32_t>((seq * 37) % (g.max_message_bytes + 1));
        EXPECT_EQ(e.token, seq) << "queue " << q;
        EXPECT_EQ(e.length, len) << "queue " << q << " seq " << seq;
        for (uint32_t i = 0; i < e.length && i < len; ++i) {
          if (e.payload[i] != pattern(q, seq, i)) {
            ADD_FAILURE() << "queue " << q << " seq " << seq << " byte " << i;
            failed = true;
            break;
          }
        }
        ++received[q];
        if (e.token != seq) failed = true;
      }
      ASSERT_NE(r, PollResult::kCorrupt) << entry_check_name(tx.last_check());
      tx.release();
      tx.publish();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "timed out";
      break;
    }
  }
  remote->request_stop();
  // The kernel sees the stop word within a few thousand spins; bound the wait anyway.
  const auto stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  cudaError_t q;
  while ((q = cudaStreamQuery(nullptr)) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() < stop_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(q, cudaSuccess) << "kernel did not stop: " << cudaGetErrorString(q);
  EXPECT_EQ(cudaHostUnregister(region->data()), cudaSuccess);
  for (uint32_t qi = 0; qi < kQueues; ++qi)
    EXPECT_EQ(received[qi], kPerQueue);
}

}  // namespace
}  // namespace caracal::mqueue
