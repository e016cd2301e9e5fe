// The measurements: the cross-process flag ping-pong floor, round-trip latency through the
// `shm` rings and the CPU accelerator, and throughput with the rings kept full.
//
// The SmartNIC side runs on the calling thread, against a RemoteRegion<ShmTransport> attached
// to its own mapping of the region's memfd; the accelerator side is a CpuAccelerator<Echo> on
// the agent's mapping, in a forked child (or a thread). Every reply is checked (token, length,
// flags, bytes); a wrong, lost or late reply ends the measurement with an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "caracal/core/status.hpp"
#include "latency.hpp"
#include "peer.hpp"

namespace caracal::bench {

// Where the two sides run and how the region is shaped.
struct BenchSetup {
  Peer::Mode mode = Peer::Mode::kProcess;
  int snic_cpu = -1;             // -1: the SmartNIC thread is not pinned
  std::vector<int> worker_cpus;  // accelerator workers (and the floor's responder); empty: not
                                 // pinned
  // The SmartNIC thread shares a CPU with a poller of the other side, so it yields while it
  // waits instead of spinning its time slice away.
  bool snic_yields = false;
  uint32_t slot_bytes = 256;
  uint32_t ring_capacity = 256;
  uint32_t accel_burst = 32;                // CpuOptions::burst
  uint32_t idle_yield_rounds = 256;         // CpuOptions::idle_rounds_before_yield
  std::chrono::milliseconds timeout{2000};  // longest wait for any single reply or step
};

struct LatencyResult {
  uint32_t payload_bytes = 0;
  LatencySummary summary;
  PeerReport peer;
};

// Pins the calling thread to `cpu` (nothing for -1); `who` names it in the error.
Status pin_current_thread(int cpu, const std::string& who);

// Median cost of one steady_clock::now(), which every latency sample includes twice.
double clock_overhead_ns();

// Ping-pong of two flags on separate cache lines of a shared memfd mapping: this side stores
// `i` to one with release and spins with acquire loads until the other side (forked, or a
// thread) echoes `i` in the second. The floor under any cross-core message round trip.
Result<LatencyResult> measure_floor(const BenchSetup& setup, uint64_t warmup, uint64_t iterations);

// One request in flight on server queue 0 of a one-queue region: push + publish the request,
// poll the TX tails until the echo arrives, check it, give the TX slots back.
Result<LatencyResult> measure_round_trip(const BenchSetup& setup, uint32_t payload_bytes,
                                         uint64_t warmup, uint64_t iterations);

struct ThroughputParams {
  uint32_t queues = 1;
  uint32_t workers = 1;  // accelerator threads (the caller caps it at `queues`)
  uint32_t batch = 1;    // requests pushed into one RX ring per publish of its tail
  uint32_t payload_bytes = 64;
  std::chrono::milliseconds warmup{100};
  std::chrono::milliseconds duration{1000};
};

struct ThroughputRun {
  double msgs_per_s = 0;
  uint64_t messages = 0;        // replies received inside the measured window
  double seconds = 0;           // length of the measured window
  uint64_t total_messages = 0;  // every request of the run, warm-up and drain included
  uint64_t snic_rounds = 0;     // SmartNIC loop iterations in the window
  // Share of the window the SmartNIC thread spent in rounds that pushed or received something;
  // the rest it spent polling for the accelerator. Near 1: the SmartNIC side is the bottleneck.
  double snic_busy = 0;
  uint64_t rx_publishes = 0;  // RX tail publications in the window
  PeerReport peer;
};

// Keeps every RX ring as full as its credits allow, publishing each ring's tail after every
// `batch` requests (and at the end of a fill), drains the replies of every queue after each fill
// round, and counts replies per second over `duration` after `warmup`.
Result<ThroughputRun> measure_throughput(const BenchSetup& setup, const ThroughputParams& params);

}  // namespace caracal::bench
