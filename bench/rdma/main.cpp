// caracal_rdma_bench: an mqueue round trip over the `rdma` transport next to perftest's
// ib_write_lat and ib_read_lat on the same device in the same run. Meant to run inside the
// Soft-RoCE VM (bench/rdma/run.sh does it in one call); runs on any machine with an RDMA device
// and perftest.
//
//   caracal_rdma_bench [--ip A] [--device D] [--gid-index N] [--warmup N] [--iterations N]
//                      [--sizes 64,1024] [--json FILE] [--md FILE] [--header TEXT]...
//   caracal_rdma_bench --peer IP           (internal: the accelerator side, started by the above)
//
// The SmartNIC side (this process) holds a RemoteRegion<RdmaTransport>; the accelerator side is
// a forked-and-exec'ed copy of this program that exports a one-queue region in its host memory
// and echoes every request on a CPU thread, polling its own memory only. One round trip: push
// the request into RX and publish the tail (two RDMA WRITEs in one post list), then fetch the
// TX tails with one RDMA READ until the reply's tail shows, then READ its slot, check the reply
// (token, length, bytes) and give the slot back (an index WRITE, outside the timed part).
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/rdma.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/shm.hpp"
#include "json_writer.hpp"
#include "latency.hpp"

namespace {

using namespace caracal;
using namespace caracal::mqueue;
using Clock = std::chrono::steady_clock;

constexpr RegionGeometry kGeometry{1, 0, 256, 64, 8 * 256 - kSlotHeaderBytes};

// Microseconds, as perftest reports them.
double us(uint64_t ns) {
  return static_cast<double>(ns) / 1e3;
}

// ---- the accelerator side --------------------------------------------------------------------

// Pins the calling thread (and what it starts later) to `cpu` when there is more than one CPU:
// the two sides stand for two machines, and sharing one vCPU makes each wait for the other's
// time slice (milliseconds in the VM).
void pin_to(int cpu) {
  if (std::thread::hardware_concurrency() < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)sched_setaffinity(0, sizeof(set), &set);
}

int run_peer(const std::string& ip) {
  pin_to(1);
  const RegionHeader header = compute_layout(kGeometry, 1);
  const uint64_t bytes = (header.region_bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  auto* base = static_cast<std::byte*>(std::aligned_alloc(kPageBytes, bytes));
  std::memset(base, 0, bytes);
  initialize_region(base, header);
  RdmaExportOptions options;
  options.bind_address = ip;
  Result<std::unique_ptr<RdmaRegionExporter>> x = RdmaRegionExporter::listen(
      options, RdmaMemory{RdmaMemory::Kind::kHost, base, header.region_bytes});
  if (!x.ok()) {
    std::fprintf(stderr, "rdma bench peer: %s\n", x.status().message().c_str());
    return 2;
  }
  const RdmaRegionAddress a = (*x)->exported();
  std::printf("READY %u %llu %u %llu\n", (*x)->port(), static_cast<unsigned long long>(a.address),
              a.rkey, static_cast<unsigned long long>(a.bytes));
  std::fflush(stdout);
  std::atomic<bool> done{false};
  std::thread events([&] {
    while (!done.load(std::memory_order_relaxed)) {
      pollfd p{(*x)->event_fd(), POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) (void)(*x)->poll();
    }
  });
  // The echo handler: polls RX in local memory, copies each request into a TX reply.
  const RegionView view(base);
  RingConsumer rx = view.rx_consumer(0);
  RingProducer tx = view.tx_producer(0);
  uint32_t idle = 0;
  for (;;) {
    Entry e;
    if (rx.next(e) == PollResult::kReady) {
      std::byte* out = tx.reserve(e.length);
      if (out == nullptr) {
        rx.unread();
        continue;
      }
      std::memcpy(out, e.payload, e.length);
      tx.commit(e.length, e.token);
      rx.release();
      tx.publish();
      rx.publish();
      idle = 0;
      continue;
    }
    // Two vCPUs carry both sides and the rxe kernel threads: yield now and then.
    if (++idle % 64 == 0) sched_yield();
    if (idle % 4096 == 0 && view.stop_requested()) break;
  }
  done.store(true);
  events.join();
  return 0;
}

// ---- the SmartNIC side -----------------------------------------------------------------------

struct Options {
  std::string ip = "192.0.2.1";
  std::string device = "rxe0";
  std::string gid_index = "1";
  uint64_t warmup = 200;
  uint64_t iterations = 3000;
  std::vector<uint32_t> sizes{64, 1024};
  std::string json_path;
  std::string md_path;
  std::vector<std::string> header;  // "key=value" lines for the report (machine, commit, ...)
};

struct RoundTrip {
  uint32_t payload = 0;
  caracal::bench::LatencySummary s;
  double tail_reads_per_rt = 0;  // TX-tail READs per round trip (polls until the reply shows)
};

Result<RoundTrip> measure(RdmaTransport& t, RemoteRegion<RdmaTransport>& region, uint32_t payload,
                          uint64_t warmup, uint64_t iterations) {
  std::vector<std::byte> request(payload);
  std::vector<uint64_t> ns;
  ns.reserve(iterations);
  uint64_t tail_reads = 0;
  const auto give_up = std::chrono::seconds(10);
  // Progress while waiting; the two vCPUs of the VM also carry the peer and rxe's kernel
  // work, so yield now and then (the peer does too) instead of spinning a time slice away.
  uint32_t spins = 0;
  auto step = [&]() {
    if (++spins % 16 == 0) sched_yield();
    return t.progress();
  };
  for (uint64_t i = 0; i < warmup + iterations; ++i) {
    for (uint32_t b = 0; b < payload; ++b)
      request[b] = static_cast<std::byte>((i + b) & 0xFF);
    const auto t0 = Clock::now();
    // Out of credits now and then: reserve posts a READ of the accelerator's RX head, and the
    // push succeeds once it has come back (part of the protocol's cost, so inside the timing).
    while (!region.rx(0).push(request.data(), payload, i)) {
      if (Status s = step(); !s.ok()) return s;
      if (Clock::now() - t0 > give_up)
        return Status(StatusCode::kUnavailable, "no RX credits in 10 s");
    }
    region.rx(0).publish();
    Entry e;
    uint64_t reads = 0;
    for (;;) {
      region.fetch_tx_tails();
      ++reads;
      while (!region.deliver_tx_tails()) {
        if (Status s = step(); !s.ok()) return s;
        if (Clock::now() - t0 > give_up)
          return Status(StatusCode::kUnavailable, "no reply in 10 s");
      }
      PollResult r;
      while ((r = region.tx(0).next(e)) == PollResult::kEmpty && region.tx(0).reading()) {
        if (Status s = step(); !s.ok()) return s;
      }
      if (r == PollResult::kCorrupt) return Status(StatusCode::kInternal, "corrupt reply");
      if (r == PollResult::kReady) break;
    }
    const auto t1 = Clock::now();
    if (e.token != i || e.length != payload ||
        std::memcmp(e.payload, request.data(), payload) != 0) {
      return Status(StatusCode::kInternal, "wrong reply to request " + std::to_string(i));
    }
    region.tx(0).release();
    region.tx(0).publish();
    if (i >= warmup) {
      ns.push_back(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
      tail_reads += reads;
    }
  }
  RoundTrip out;
  out.payload = payload;
  out.s = caracal::bench::summarize(ns);
  out.tail_reads_per_rt = static_cast<double>(tail_reads) / static_cast<double>(iterations);
  return out;
}

struct Perftest {
  std::string tool;
  uint32_t bytes = 0;
  uint64_t iterations = 0;
  double min_us = 0, typical_us = 0, avg_us = 0, p99_us = 0, max_us = 0;
  bool ok = false;
  std::string error;
};

// Runs `tool` as server and client on this host and parses the client's result line.
Perftest run_perftest(const Options& o, const std::string& tool, uint32_t bytes, uint64_t n) {
  Perftest r;
  r.tool = tool;
  r.bytes = bytes;
  r.iterations = n;
  const std::string common = tool + " -d " + o.device + " -x " + o.gid_index + " -s " +
                             std::to_string(bytes) + " -n " + std::to_string(n);
  // The client retries until the server listens (slow to start in a loaded, emulated VM).
  const std::string cmd = "(" + common + " >/dev/null 2>&1 & for i in 1 2 3 4 5 6 7 8 9 10; do " +
                          "sleep 1; " + common + " " + o.ip + " >/tmp/perftest.out 2>&1 && " +
                          "grep -q '#bytes' /tmp/perftest.out && break; done; " +
                          "cat /tmp/perftest.out; wait)";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    r.error = "popen failed";
    return r;
  }
  char line[1024];
  bool next_is_result = false;
  std::string last;
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    const std::string l = line;
    if (l.find_first_not_of(" \t\r\n-") != std::string::npos) last = l;
    if (l.find("#bytes") != std::string::npos) {
      next_is_result = true;
      continue;
    }
    if (next_is_result) {
      next_is_result = false;
      // Parsed as words: perftest prints "-nan" for a standard deviation it cannot compute.
      std::istringstream in(l);
      std::vector<std::string> f;
      for (std::string w; in >> w;)
        f.push_back(w);
      if (f.size() >= 9) {
        r.min_us = std::strtod(f[2].c_str(), nullptr);
        r.max_us = std::strtod(f[3].c_str(), nullptr);
        r.typical_us = std::strtod(f[4].c_str(), nullptr);
        r.avg_us = std::strtod(f[5].c_str(), nullptr);
        r.p99_us = std::strtod(f[7].c_str(), nullptr);
        r.ok = std::isfinite(r.typical_us) && r.typical_us > 0;  // "inf" after long stalls
      }
    }
  }
  const int status = pclose(p);
  if (!r.ok) {
    while (!last.empty() && (last.back() == '\n' || last.back() == '\r'))
      last.pop_back();
    r.error = tool + " gave no result line (exit status " + std::to_string(status) +
              "; last line: " + last + ")";
  }
  return r;
}

struct Child {
  pid_t pid = -1;
  int out = -1;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out >= 0) close(out);
  }
};

int run_bench(const Options& o) {
  pin_to(0);
  Child peer;
  int fds[2];
  if (pipe(fds) != 0) return 2;
  peer.pid = fork();
  if (peer.pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl("/proc/self/exe", "caracal_rdma_bench", "--peer", o.ip.c_str(), nullptr);
    _exit(127);
  }
  close(fds[1]);
  peer.out = fds[0];
  std::string line;
  char c;
  while (read(peer.out, &c, 1) == 1 && c != '\n')
    line += c;
  std::istringstream in(line);
  std::string ready;
  unsigned port = 0;
  RdmaRegionAddress a;
  in >> ready >> port >> a.address >> a.rkey >> a.bytes;
  if (ready != "READY") {
    std::fprintf(stderr, "rdma bench: the peer did not start (%s)\n", line.c_str());
    return 1;
  }
  RdmaConnectOptions co;
  co.host = o.ip;
  co.port = static_cast<uint16_t>(port);
  co.region = a;
  co.timeout = std::chrono::milliseconds(10000);
  Result<std::unique_ptr<RdmaTransport>> t = RdmaTransport::connect(co);
  if (!t.ok()) {
    std::fprintf(stderr, "rdma bench: %s\n", t.status().message().c_str());
    return 1;
  }
  Result<RemoteRegion<RdmaTransport>> region =
      RemoteRegion<RdmaTransport>::attach(t->get(), std::chrono::seconds(10));
  if (!region.ok()) {
    std::fprintf(stderr, "rdma bench: %s\n", region.status().message().c_str());
    return 1;
  }
  std::vector<RoundTrip> rts;
  for (uint32_t size : o.sizes) {
    Result<RoundTrip> r = measure(**t, *region, size, o.warmup, o.iterations);
    if (!r.ok()) {
      std::fprintf(stderr, "rdma bench: %u-byte round trip: %s\n", size,
                   r.status().message().c_str());
      return 1;
    }
    rts.push_back(*r);
  }
  region->request_stop();
  (void)wait_for(**t, (*t)->posted(), std::chrono::seconds(5));
  waitpid(peer.pid, nullptr, 0);
  peer.pid = -1;
  t = Status(StatusCode::kAborted, "done");

  // perftest places itself (two spinning processes): undo this process's pinning, which its
  // children would inherit, so that both do not share vCPU 0.
  {
    cpu_set_t all;
    CPU_ZERO(&all);
    for (unsigned c = 0; c < std::thread::hardware_concurrency(); ++c)
      CPU_SET(c, &all);
    (void)sched_setaffinity(0, sizeof(all), &all);
  }
  std::vector<Perftest> perf;
  for (uint32_t size : o.sizes) {
    perf.push_back(run_perftest(o, "ib_write_lat", size, o.iterations));
    perf.push_back(run_perftest(o, "ib_read_lat", size, o.iterations));
  }

  // ---- report ----
  auto find = [&](const std::string& tool, uint32_t bytes) -> const Perftest* {
    for (const Perftest& p : perf) {
      if (p.tool == tool && p.bytes == bytes && p.ok) return &p;
    }
    return nullptr;
  };
  std::ostringstream md;
  md << "# Caracal mqueue benchmark: `rdma` transport on Soft-RoCE\n\n";
  for (const std::string& h : o.header)
    md << "- " << h << "\n";
  md << "- SmartNIC side pinned to vCPU 0, the peer (accelerator) to vCPU 1\n";
  md << "- region: one server queue, 256-byte slots, 64 slots per ring; echo handler on a CPU "
        "thread of a second process\n";
  md << "- " << o.warmup << " warm-up round trips, then " << o.iterations
     << " measured, one request in flight; perftest with -n " << o.iterations << "\n\n";
  md << "One mqueue round trip = RDMA WRITE of the request + WRITE of the RX tail (one post "
        "list), then READs of the TX tails until the reply shows, then a READ of its slot. "
        "ib_write_lat reports half of a WRITE ping-pong; its round trip is twice that. "
        "ib_read_lat reports one READ. The VM is emulated (TCG) on a small shared host: a vCPU "
        "descheduled for a host time slice shows up as milliseconds, and repeated runs have "
        "differed by up to 10x; compare the ratios within one run, and say nothing about "
        "hardware from them.\n\n";
  md << "| path | payload B | p50 us | p90 us | p99 us | mean us | tail READs per round trip | "
        "p50 / (2 x ib_write_lat) | p50 / ib_read_lat |\n";
  md << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  char buf[512];
  for (const RoundTrip& r : rts) {
    const Perftest* w = find("ib_write_lat", r.payload);
    const Perftest* rd = find("ib_read_lat", r.payload);
    std::snprintf(
        buf, sizeof(buf),
        "| mqueue RX -> echo -> TX | %u | %.1f | %.1f | %.1f | %.1f | %.2f | %.2fx | %.2fx |\n",
        r.payload, us(r.s.p50_ns), us(r.s.p90_ns), us(r.s.p99_ns), r.s.mean_ns / 1e3,
        r.tail_reads_per_rt, w != nullptr ? us(r.s.p50_ns) / (2 * w->typical_us) : 0.0,
        rd != nullptr ? us(r.s.p50_ns) / rd->typical_us : 0.0);
    md << buf;
  }
  for (const Perftest& p : perf) {
    if (!p.ok) {
      md << "| " << p.tool << " | " << p.bytes << " | failed: " << p.error << " | | | | | | |\n";
      continue;
    }
    std::snprintf(buf, sizeof(buf), "| %s (t_typical) | %u | %.1f | | %.1f | %.1f | | | |\n",
                  p.tool.c_str(), p.bytes, p.typical_us, p.p99_us, p.avg_us);
    md << buf;
  }
  std::cout << md.str();
  if (!o.md_path.empty()) std::ofstream(o.md_path) << md.str();

  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    caracal::bench::JsonWriter j(f);
    j.begin_object();
    j.array("header", o.header);
    j.field("warmup", o.warmup);
    j.field("iterations", o.iterations);
    j.begin_array("mqueue_round_trip");
    for (const RoundTrip& r : rts) {
      j.begin_object();
      j.field("payload_bytes", r.payload);
      j.field("samples", r.s.samples);
      j.field("min_us", us(r.s.min_ns));
      j.field("p50_us", us(r.s.p50_ns));
      j.field("p90_us", us(r.s.p90_ns));
      j.field("p99_us", us(r.s.p99_ns));
      j.field("max_us", us(r.s.max_ns));
      j.field("mean_us", r.s.mean_ns / 1e3);
      j.field("tail_reads_per_round_trip", r.tail_reads_per_rt);
      const Perftest* w = find("ib_write_lat", r.payload);
      const Perftest* rd = find("ib_read_lat", r.payload);
      const double p50 = us(r.s.p50_ns);
      j.field("p50_over_2x_ib_write_lat",
              w != nullptr ? std::optional(p50 / (2 * w->typical_us)) : std::nullopt);
      j.field("p50_over_ib_read_lat",
              rd != nullptr ? std::optional(p50 / rd->typical_us) : std::nullopt);
      j.field("p99_over_ib_read_lat_p99",
              rd != nullptr ? std::optional(us(r.s.p99_ns) / rd->p99_us) : std::nullopt);
      j.end_object();
    }
    j.end_array();
    j.begin_array("perftest");
    for (const Perftest& p : perf) {
      j.begin_object();
      j.field("tool", p.tool);
      j.field("bytes", p.bytes);
      j.field("iterations", p.iterations);
      j.field("ok", p.ok);
      if (p.ok) {
        j.field("t_min_us", p.min_us);
        j.field("t_typical_us", p.typical_us);
        j.field("t_avg_us", p.avg_us);
        j.field("p99_us", p.p99_us);
        j.field("t_max_us", p.max_us);
      } else {
        j.field("error", p.error);
      }
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  for (const Perftest& p : perf) {
    if (!p.ok) return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string peer_ip;
  CLI::App app{"caracal_rdma_bench: an mqueue round trip over rdma next to perftest"};
  app.add_option("--peer", peer_ip, "Internal: be the accelerator side, listening on this IP");
  app.add_option("--ip", o.ip, "This host's address on the RDMA device")->capture_default_str();
  app.add_option("--device", o.device, "RDMA device, for perftest")->capture_default_str();
  app.add_option("--gid-index", o.gid_index, "GID index, for perftest")->capture_default_str();
  app.add_option("--warmup", o.warmup, "Unmeasured round trips first")->capture_default_str();
  app.add_option("--iterations", o.iterations, "Measured round trips per size")
      ->capture_default_str();
  app.add_option("--sizes", o.sizes, "Payload sizes (bytes)")
      ->delimiter(',')
      ->check(CLI::Range(kGeometry.max_message_bytes))
      ->capture_default_str();
  app.add_option("--json", o.json_path, "Write the results as JSON to this file");
  app.add_option("--md", o.md_path, "Write the markdown report to this file too");
  app.add_option("--header", o.header, "A line for the report (machine, commit, ...); repeatable");
  CLI11_PARSE(app, argc, argv);
  if (!peer_ip.empty()) return run_peer(peer_ip);
  return run_bench(o);
}
