// The accelerator side of the rdma tests that need two processes (rdma_transport_test.cpp): a
// region in this process's host memory, exported with RdmaRegionExporter, and the echo
// accelerator of stress_protocol.hpp polling it locally. The SmartNIC side reaches it with
// one-sided RDMA only; this process's CPU only polls its own memory (and a thread services
// connection events).
//
//   caracal_rdma_peer BIND_ADDRESS PORT TIMEOUT_S COUNT_Q0 [COUNT_Q1 ...]
//
// Once listening it prints one line to stdout: "READY <port> <address> <rkey> <bytes>".
// Exit status: 0 when every expected request was answered; 1 on a check failure, a stop
// request or the timeout (the reason on stderr); 2 on bad arguments or a failed setup.
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "caracal/mqueue/rdma.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "stress_protocol.hpp"

namespace {

using namespace caracal;
using namespace caracal::mqueue;
using stress::parse_u64;

int usage(const char* why) {
  std::fprintf(stderr,
               "rdma_peer: %s\nusage: caracal_rdma_peer BIND_ADDRESS PORT TIMEOUT_S COUNT_Q0 "
               "[COUNT_Q1 ...]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return usage("too few arguments");
  uint64_t port = 0;
  uint64_t timeout_s = 0;
  if (!parse_u64(argv[2], port) || port > 65535) return usage("bad port");
  if (!parse_u64(argv[3], timeout_s)) return usage("bad timeout");
  std::vector<uint64_t> expected;
  for (int i = 4; i < argc; ++i) {
    uint64_t n = 0;
    if (!parse_u64(argv[i], n)) return usage("bad count");
    expected.push_back(n);
  }

  const RegionHeader header = compute_layout(stress::stress_geometry(), 9);
  auto* base = static_cast<std::byte*>(std::aligned_alloc(
      kPageBytes, (header.region_bytes + kPageBytes - 1) / kPageBytes * kPageBytes));
  std::memset(base, 0, header.region_bytes);
  initialize_region(base, header);

  RdmaExportOptions options;
  options.bind_address = argv[1];
  options.port = static_cast<uint16_t>(port);
  Result<std::unique_ptr<RdmaRegionExporter>> exporter = RdmaRegionExporter::listen(
      options, RdmaMemory{RdmaMemory::Kind::kHost, base, header.region_bytes, -1, 0});
  if (!exporter.ok()) {
    std::fprintf(stderr, "rdma_peer: %s\n", exporter.status().message().c_str());
    return 2;
  }
  RdmaRegionExporter& x = **exporter;
  const RdmaRegionAddress a = x.exported();
  std::printf("READY %u %llu %u %llu\n", x.port(), static_cast<unsigned long long>(a.address),
              a.rkey, static_cast<unsigned long long>(a.bytes));
  std::fflush(stdout);

  // Connection events only; the data path needs nothing from this process but its memory.
  std::atomic<bool> done{false};
  std::atomic<uint32_t> live{0};  // connections, as the event thread last saw them
  std::atomic<bool> seen{false};  // whether there ever was one
  std::thread events([&] {
    while (!done.load(std::memory_order_relaxed)) {
      pollfd p{x.event_fd(), POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        if (Status s = x.poll(); !s.ok()) {
          std::fprintf(stderr, "rdma_peer: %s\n", s.message().c_str());
        }
        const uint32_t n = x.connections();
        live.store(n, std::memory_order_relaxed);
        if (n != 0) seen.store(true, std::memory_order_relaxed);
      }
    }
  });

  const RegionView view(base);
  const auto deadline = stress::Clock::now() + std::chrono::seconds(timeout_s);
  const std::string error = stress::run_echo_accelerator(view, expected, deadline);
  // The last replies are in this process's memory and the SmartNIC reads them after we return:
  // stay until it raises the stop word (it has read everything), or its connection, once seen,
  // is gone, or the deadline.
  while (error.empty() && !view.stop_requested() &&
         !(seen.load(std::memory_order_relaxed) && live.load(std::memory_order_relaxed) == 0) &&
         stress::Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  done.store(true, std::memory_order_relaxed);
  events.join();
  if (!error.empty()) {
    std::fprintf(stderr, "rdma_peer: %s\n", error.c_str());
    return 1;
  }
  return 0;
}
