// caracal_mqueue_bench: the `shm` transport with the CPU accelerator, measured the way the
// server uses it. The SmartNIC side (this thread) drives a RemoteRegion<ShmTransport>; the
// accelerator side is CpuAccelerator<Echo> in a forked process on the same memfd (or, with
// --same-process, in threads of this one).
//
// Prints a markdown report to stdout (progress goes to stderr) and, with --json, writes the
// same results as JSON. Exits non-zero when any reply is wrong, lost or late.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/validate.hpp"
#include "json_writer.hpp"
#include "machine_info.hpp"
#include "measure.hpp"

namespace caracal::bench {
namespace {

struct Options {
  bool same_process = false;
  bool quick = false;
  uint64_t iterations = 100000;
  uint64_t warmup = 10000;
  std::vector<uint32_t> sizes{64, 1024};
  uint32_t duration_ms = 1000;
  uint32_t repetitions = 3;
  std::vector<uint32_t> batches{1, 8, 32, 128};
  std::vector<uint32_t> queues{1, 2, 4};
  uint32_t workers = 0;  // 0: one per CPU left after the SmartNIC thread's
  uint32_t tput_size = 64;
  std::string cpus = "auto";
  uint32_t slot_bytes = 256;
  uint32_t ring_capacity = 256;
  uint32_t accel_burst = 32;
  uint32_t idle_yield_rounds = 256;
  uint32_t timeout_ms = 2000;
  std::string json_path;
  std::string commit;
  std::string note;
};

struct Throughput {
  ThroughputParams params;
  std::vector<ThroughputRun> runs;
  double median = 0;
  double min = 0;
  double max = 0;
};

[[noreturn]] void die(const std::string& message) {
  std::cout.flush();
  std::cerr << "error: " << message << std::endl;
  // _Exit: a thread-mode accelerator may still be running over memory that destructors would
  // unmap; forked accelerators die with us (PR_SET_PDEATHSIG).
  std::_Exit(1);
}

// "auto", "none", or a comma-separated list of CPUs and ranges ("0,2-3").
std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t dash = item.find('-');
    try {
      if (dash == std::string::npos) {
        cpus.push_back(std::stoi(item));
      } else {
        const int first = std::stoi(item.substr(0, dash));
        const int last = std::stoi(item.substr(dash + 1));
        if (last < first) throw std::invalid_argument("range");
        for (int c = first; c <= last; ++c)
          cpus.push_back(c);
      }
    } catch (const std::exception&) {
      die("--cpus: '" + item + "' is not a CPU number or range (expected e.g. 0,1 or 0-3)");
    }
  }
  return cpus;
}

BenchSetup make_setup(const Options& o, const MachineInfo& machine) {
  BenchSetup s;
  s.mode = o.same_process ? Peer::Mode::kThread : Peer::Mode::kProcess;
  std::vector<int> cpus;
  if (o.cpus == "auto") {
    // Apart when there are two CPUs or more: the SmartNIC thread and every poller of the other
    // side each need a core of their own, or a spinning side starves the one it waits for.
    if (machine.allowed_cpus.size() >= 2) cpus = machine.allowed_cpus;
  } else if (o.cpus != "none") {
    cpus = parse_cpu_list(o.cpus);
    if (cpus.empty()) die("--cpus lists no CPU");
  }
  if (!cpus.empty()) {
    s.snic_cpu = cpus.front();
    s.worker_cpus.assign(cpus.begin() + (cpus.size() > 1 ? 1 : 0), cpus.end());
    s.snic_yields =
        std::find(s.worker_cpus.begin(), s.worker_cpus.end(), s.snic_cpu) != s.worker_cpus.end();
  } else {
    s.snic_yields = machine.allowed_cpus.size() < 2;
  }
  s.slot_bytes = o.slot_bytes;
  s.ring_capacity = o.ring_capacity;
  s.accel_burst = o.accel_burst;
  s.idle_yield_rounds = o.idle_yield_rounds;
  s.timeout = std::chrono::milliseconds(o.timeout_ms);
  return s;
}

uint32_t default_workers(const BenchSetup& setup, const MachineInfo& machine) {
  if (!setup.worker_cpus.empty()) return static_cast<uint32_t>(setup.worker_cpus.size());
  const size_t cpus = machine.allowed_cpus.size();
  return cpus > 1 ? static_cast<uint32_t>(cpus - 1) : 1;
}

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size(); ++i)
    text += (i ? "," : "") + std::to_string(cpus[i]);
  return text;
}

std::string fixed(double v, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << v;
  return out.str();
}

void write_json(std::ostream& out, const Options& o, const MachineInfo& m, const BenchSetup& s,
                double clock_ns, const LatencyResult& floor,
                const std::vector<LatencyResult>& round_trips,
                const std::vector<Throughput>& throughput) {
  JsonWriter j(out);
  j.begin_object();
  j.field("benchmark", "caracal_mqueue_bench");
  j.field("transport", "shm");
  j.field("accelerator", "cpu");
  j.field("date", m.date_utc);
  j.field("commit", o.commit.empty() ? std::nullopt : std::optional(o.commit));
  j.field("note", o.note);
  j.begin_object("machine");
  j.field("cpu_model", m.cpu_model);
  j.field("nproc", m.online_cpus);
  j.array("allowed_cpus", m.allowed_cpus);
  j.field("hypervisor", m.hypervisor);
  j.field("kernel", m.kernel);
  j.field("hostname", m.hostname);
  j.field("clocksource", m.clocksource);
  j.field("clock_overhead_ns", clock_ns);
  j.end_object();
  j.begin_object("config");
  j.field("mode", o.same_process ? "same-process" : "two-process");
  j.field("quick", o.quick);
  j.field("snic_cpu", s.snic_cpu);
  j.array("worker_cpus", s.worker_cpus);
  j.field("snic_yields", s.snic_yields);
  j.field("slot_bytes", s.slot_bytes);
  j.field("ring_capacity", s.ring_capacity);
  j.field("accel_burst", s.accel_burst);
  j.field("idle_yield_rounds", s.idle_yield_rounds);
  j.field("iterations", o.iterations);
  j.field("warmup", o.warmup);
  j.field("duration_ms", o.duration_ms);
  j.field("repetitions", o.repetitions);
  j.field("timeout_ms", o.timeout_ms);
  j.end_object();

  j.begin_object("latency");
  j.begin_object("floor");
  j.field("what", "cross-process flag ping-pong, release store / acquire load spin");
  j.field("payload_bytes", floor.payload_bytes);
  write_fields(j, floor.summary);
  j.end_object();
  j.begin_array("round_trip");
  for (const LatencyResult& r : round_trips) {
    j.begin_object();
    j.field("payload_bytes", r.payload_bytes);
    write_fields(j, r.summary);
    j.field("p50_over_floor", static_cast<double>(r.summary.p50_ns) /
                                  static_cast<double>(std::max<uint64_t>(floor.summary.p50_ns, 1)));
    j.field("mean_over_floor", r.summary.mean_ns / std::max(floor.summary.mean_ns, 1.0));
    j.end_object();
  }
  j.end_array();
  j.end_object();

  j.begin_array("throughput");
  for (const Throughput& t : throughput) {
    j.begin_object();
    j.field("queues", t.params.queues);
    j.field("workers", t.params.workers);
    j.field("batch", t.params.batch);
    j.field("payload_bytes", t.params.payload_bytes);
    j.field("warmup_ms", static_cast<uint64_t>(t.params.warmup.count()));
    j.field("duration_ms", static_cast<uint64_t>(t.params.duration.count()));
    j.field("median_msgs_per_s", t.median);
    j.field("min_msgs_per_s", t.min);
    j.field("max_msgs_per_s", t.max);
    j.begin_array("runs");
    for (const ThroughputRun& r : t.runs) {
      j.begin_object();
      j.field("msgs_per_s", r.msgs_per_s);
      j.field("messages", r.messages);
      j.field("seconds", r.seconds);
      j.field("total_messages", r.total_messages);
      j.field("snic_rounds", r.snic_rounds);
      j.field("snic_busy", r.snic_busy);
      j.field("rx_publishes", r.rx_publishes);
      j.field("accel_requests", r.peer.requests);
      j.field("accel_reply_ring_full", r.peer.reply_ring_full);
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

void print_markdown(std::ostream& out, const Options& o, const MachineInfo& m, const BenchSetup& s,
                    double clock_ns, const LatencyResult& floor,
                    const std::vector<LatencyResult>& round_trips,
                    const std::vector<Throughput>& throughput) {
  out << "# Caracal mqueue benchmark: `shm` transport, CPU accelerator\n\n";
  out << "- machine: " << m.cpu_model << ", " << m.online_cpus << " CPUs online ("
      << m.allowed_cpus.size() << " usable), "
      << (m.hypervisor ? "virtual machine (CPU reports the hypervisor flag)" : "bare metal") << ", "
      << m.kernel << ", clocksource " << m.clocksource << "\n";
  out << "- host " << m.hostname << ", " << m.date_utc;
  if (!o.commit.empty()) out << ", commit " << o.commit;
  out << "\n";
  if (!o.note.empty()) out << "- note: " << o.note << "\n";
  out << "- mode: "
      << (o.same_process ? "one process: the accelerator runs in threads of the benchmark"
                         : "two processes: the accelerator is forked onto the same memfd and "
                           "the SmartNIC side maps it a second time")
      << (o.quick ? " (--quick: small counts, a smoke run, not a measurement)" : "") << "\n";
  out << "- placement: SmartNIC thread "
      << (s.snic_cpu >= 0 ? "on CPU " + std::to_string(s.snic_cpu) : std::string("unpinned"))
      << ", accelerator workers "
      << (s.worker_cpus.empty() ? std::string("unpinned")
                                : "on CPUs " + cpu_list_text(s.worker_cpus))
      << (s.snic_yields ? " (shared CPU: waits yield)" : "") << "\n";
  out << "- region: " << s.slot_bytes << "-byte slots, " << s.ring_capacity
      << " slots per ring; accelerator burst " << s.accel_burst << ", idle yield after "
      << s.idle_yield_rounds << " empty rounds; handler: echo\n";
  out << "- every latency sample includes two `steady_clock::now()` calls, median cost "
      << fixed(clock_ns, 0) << " ns each\n\n";

  out << "## Round-trip latency, one request in flight (ns)\n\n";
  out << "Warm-up " << o.warmup << " round trips, then " << o.iterations
      << " measured. The floor is a cross-process ping-pong of two flags on separate cache "
         "lines (release store, acquire-load spin), measured in the same run.\n\n";
  out << "| path | payload B | p50 | p90 | p99 | p99.9 | mean | max | p50 / floor |\n";
  out << "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  const auto row = [&](const std::string& path, const LatencyResult& r) {
    const LatencySummary& x = r.summary;
    const double ratio = static_cast<double>(x.p50_ns) /
                         static_cast<double>(std::max<uint64_t>(floor.summary.p50_ns, 1));
    out << "| " << path << " | " << r.payload_bytes << " | " << x.p50_ns << " | " << x.p90_ns
        << " | " << x.p99_ns << " | " << x.p999_ns << " | " << fixed(x.mean_ns, 0) << " | "
        << x.max_ns << " | " << fixed(ratio, 2) << "x |\n";
  };
  row("flag ping-pong (floor)", floor);
  for (const LatencyResult& r : round_trips)
    row("RX ring -> echo -> TX ring", r);

  out << "\n## Throughput, rings kept full (million messages/s)\n\n";
  out << o.tput_size << "-byte requests; median of " << o.repetitions << " runs of "
      << o.duration_ms
      << " ms each (after a warm-up), min and max alongside. batch = requests pushed into one "
         "RX ring per tail publication; workers = accelerator threads (min(queues, --workers)). "
         "One SmartNIC round fills every RX ring as far as its credits go, then fetches all "
         "TX tails with one read and drains every queue's replies. \"SNIC busy\" (median "
         "over the runs) = share of the time the SmartNIC thread spent in rounds that pushed or "
         "received something, the rest it spent polling: near 100% means the SmartNIC side is "
         "the bottleneck, low means the accelerator is.\n\n";
  out << "| queues | workers | batch | median | min | max | spread | SNIC busy | publishes/msg |\n";
  out << "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const Throughput& t : throughput) {
    std::vector<double> busy;
    uint64_t publishes = 0;
    uint64_t messages = 0;
    for (const ThroughputRun& r : t.runs) {
      busy.push_back(r.snic_busy);
      publishes += r.rx_publishes;
      messages += r.messages;
    }
    const double spread = t.median > 0 ? (t.max - t.min) / t.median * 100 : 0;
    out << "| " << t.params.queues << " | " << t.params.workers << " | " << t.params.batch << " | "
        << fixed(t.median / 1e6, 2) << " | " << fixed(t.min / 1e6, 2) << " | "
        << fixed(t.max / 1e6, 2) << " | " << fixed(spread, 1) << "% | "
        << fixed(100 * median_of(busy), 0) << "% | "
        << fixed(messages ? static_cast<double>(publishes) / static_cast<double>(messages) : 0, 3)
        << " |\n";
  }
  out << std::flush;
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{
      "caracal_mqueue_bench: round-trip latency and throughput of the shm transport with the "
      "CPU accelerator (echo handler). Markdown to stdout, JSON with --json."};
  app.add_flag("--same-process", o.same_process,
               "Run the accelerator in threads of this process instead of a forked process");
  app.add_flag("--quick", o.quick,
               "Small counts for a CI smoke run (a few seconds); explicit options still win");
  CLI::Option* iterations =
      app.add_option("--iterations", o.iterations, "Measured round trips per latency test")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
  CLI::Option* warmup =
      app.add_option("--warmup", o.warmup, "Unmeasured round trips first")->capture_default_str();
  app.add_option("--sizes", o.sizes, "Payload sizes (bytes) for the latency tests")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  CLI::Option* duration =
      app.add_option("--duration-ms", o.duration_ms, "Measured time of one throughput run")
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
  CLI::Option* repetitions = app.add_option("-r,--repetitions", o.repetitions,
                                            "Runs per throughput point (median, min, max)")
                                 ->check(CLI::PositiveNumber)
                                 ->capture_default_str();
  CLI::Option* batches =
      app.add_option("--batches", o.batches, "Requests pushed per RX tail publication")
          ->delimiter(',')
          ->check(CLI::PositiveNumber)
          ->capture_default_str();
  CLI::Option* queues = app.add_option("--queues", o.queues, "Server queue counts")
                            ->delimiter(',')
                            ->check(CLI::Range(1u, mqueue::kMaxQueues))
                            ->capture_default_str();
  app.add_option("--workers", o.workers,
                 "Most accelerator worker threads (each run uses min(queues, this)); default: "
                 "one per CPU after the SmartNIC thread's");
  app.add_option("--tput-size", o.tput_size, "Payload bytes of the throughput tests")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--cpus", o.cpus,
                 "Pinning: 'auto' (SmartNIC thread on the first usable CPU, workers on the rest, "
                 "when there are two or more), 'none', or a list such as 0,1-3: the first CPU "
                 "runs the SmartNIC thread, the others the accelerator workers and the floor's "
                 "responder, round-robin (one CPU: all share it)")
      ->capture_default_str();
  app.add_option("--slot-bytes", o.slot_bytes, "Region slot size")->capture_default_str();
  app.add_option("--ring-capacity", o.ring_capacity, "Slots per ring")->capture_default_str();
  app.add_option("--accel-burst", o.accel_burst,
                 "Requests a worker takes from a queue before publishing (CpuOptions::burst)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--idle-yield-rounds", o.idle_yield_rounds,
                 "Empty polling rounds before a worker yields (0: never)")
      ->capture_default_str();
  app.add_option("--timeout-ms", o.timeout_ms,
                 "Longest wait for one reply (or for progress) before the run fails")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--json", o.json_path, "Also write the results as JSON to this file");
  app.add_option("--commit", o.commit, "Source revision to record in the report");
  app.add_option("--note", o.note, "Free text to record in the report (say, what else ran)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (o.quick) {
    if (iterations->count() == 0) o.iterations = 2000;
    if (warmup->count() == 0) o.warmup = 200;
    if (duration->count() == 0) o.duration_ms = 50;
    if (repetitions->count() == 0) o.repetitions = 1;
    if (batches->count() == 0) o.batches = {1, 32};
    if (queues->count() == 0) o.queues = {1, 2};
  }

  const MachineInfo machine = collect_machine_info();
  const BenchSetup setup = make_setup(o, machine);
  if (o.workers == 0) o.workers = default_workers(setup, machine);
  mqueue::RegionGeometry check;
  check.slot_bytes = o.slot_bytes;
  check.ring_capacity = o.ring_capacity;
  check.server_queue_count = *std::max_element(o.queues.begin(), o.queues.end());
  const uint32_t largest = std::max(o.tput_size, *std::max_element(o.sizes.begin(), o.sizes.end()));
  check.max_message_bytes = std::max(largest, o.slot_bytes - mqueue::kSlotHeaderBytes);
  if (Status s = mqueue::validate_geometry(check); !s.ok()) die("region: " + s.message());
  if (Status s = pin_current_thread(setup.snic_cpu, "SmartNIC thread"); !s.ok()) die(s.message());

  std::cerr << "caracal_mqueue_bench: " << (o.same_process ? "same process" : "two processes")
            << ", SmartNIC CPU " << setup.snic_cpu << ", worker CPUs "
            << (setup.worker_cpus.empty() ? "unpinned" : cpu_list_text(setup.worker_cpus))
            << std::endl;
  const double clock_ns = clock_overhead_ns();

  std::cerr << "latency: floor ping-pong" << std::endl;
  Result<LatencyResult> floor = measure_floor(setup, o.warmup, o.iterations);
  if (!floor.ok()) die(floor.status().message());
  std::vector<LatencyResult> round_trips;
  for (uint32_t size : o.sizes) {
    std::cerr << "latency: round trip, " << size << " B" << std::endl;
    Result<LatencyResult> r = measure_round_trip(setup, size, o.warmup, o.iterations);
    if (!r.ok()) die(r.status().message());
    round_trips.push_back(r.value());
  }

  std::vector<Throughput> throughput;
  const auto duration_of = std::chrono::milliseconds(o.duration_ms);
  const auto warmup_of =
      std::clamp(duration_of / 10, std::chrono::milliseconds(10), std::chrono::milliseconds(100));
  for (uint32_t q : o.queues) {
    for (uint32_t b : o.batches) {
      Throughput t;
      t.params.queues = q;
      t.params.workers = std::min(q, o.workers);
      t.params.batch = b;
      t.params.payload_bytes = o.tput_size;
      t.params.warmup = warmup_of;
      t.params.duration = duration_of;
      std::vector<double> rates;
      for (uint32_t rep = 0; rep < o.repetitions; ++rep) {
        std::cerr << "throughput: " << q << " queues, " << t.params.workers << " workers, batch "
                  << b << ", run " << rep + 1 << "/" << o.repetitions << std::endl;
        Result<ThroughputRun> r = measure_throughput(setup, t.params);
        if (!r.ok()) die(r.status().message());
        rates.push_back(r->msgs_per_s);
        t.runs.push_back(r.value());
      }
      t.median = median_of(rates);
      t.min = *std::min_element(rates.begin(), rates.end());
      t.max = *std::max_element(rates.begin(), rates.end());
      throughput.push_back(std::move(t));
    }
  }

  print_markdown(std::cout, o, machine, setup, clock_ns, floor.value(), round_trips, throughput);
  if (!o.json_path.empty()) {
    std::ofstream json(o.json_path);
    if (!json) die("cannot open " + o.json_path + " for writing");
    write_json(json, o, machine, setup, clock_ns, floor.value(), round_trips, throughput);
    json.close();
    if (!json) die("writing " + o.json_path + " failed");
  }
  return 0;
}

}  // namespace
}  // namespace caracal::bench

int main(int argc, char** argv) {
  try {
    return caracal::bench::run(argc, argv);
  } catch (const std::exception& e) {
    caracal::bench::die(std::string("unexpected exception: ") + e.what());
  }
}
