// caracal_host_centric_server: the GPU serving design Lynx replaced. Kernel sockets on the
// host (Boost.Asio, UDP and length-prefixed TCP, N I/O threads); each request's bytes are copied
// into a pinned batch buffer; a GPU thread takes a batch when it holds --batch requests or its
// first request has waited --batch-timeout-us, copies it to the GPU in one cudaMemcpy, runs one
// kernel launch over it (a warp per request for the echo and matvec handlers, as their
// granularity says), copies the replies back in one cudaMemcpy and sends them (UDP: sendto from
// the GPU thread; TCP: posted to the connection's I/O thread, which writes them in order).
// Two batch buffers: the I/O threads fill one while the GPU runs the other; when both are
// taken, an I/O thread waits (and the kernel's socket buffers take the backlog).
//
// With several GPUs (`--gpus 0,1`) each has its own batches and GPU thread, and the requests are
// spread over them: over UDP each I/O thread hands its requests to the GPUs in turn; over TCP a
// connection stays on one GPU (connections in turn, by the order they were accepted), so that
// its replies leave in request order.
//
// Face verification (examples/face_verify): each I/O thread first fetches the request's
// reference from memcached on its own pipelined connection (common/memcached_client.hpp); when
// it is in, the request and the reference go into the batch as one item
// (common/face_items.hpp), and the GPU computes the histograms and the distance, a block per
// request. Misses and failed fetches go through the batch too, so replies keep request order.
//
//   caracal_host_centric_server --handler matvec --udp-port 7000 --tcp-port 7001 --threads 2
//       --batch 64 --batch-timeout-us 20 --gpus 0,1 [--matvec-rounds 1]
//   caracal_host_centric_server --handler face --memcached 127.0.0.1:11211 --threads 2 --gpu 0
//
// Prints "listening udp PORT tcp PORT" once it serves; SIGINT/SIGTERM stop it.
#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "face_fetch.hpp"
#include "frontend.hpp"
#include "gpu_batch.hpp"

namespace caracal::bench::baseline {
namespace {

using Clock = std::chrono::steady_clock;

struct BatchOptions {
  uint32_t max_batch = 64;
  std::chrono::microseconds timeout{20};
  size_t data_bytes = 4 << 20;
  std::vector<int> devices{0};
  std::string handler = "echo";
  HandlerParams params;
  uint32_t reply_capacity = 0;  // reply bytes reserved per request; 0: the request's, at least 256
};

constexpr uint32_t align16(uint32_t n) {
  return (n + 15) & ~15u;
}

class Batcher {
 public:
  Batcher(const BatchOptions& o, GpuBatchRunner& gpu, FrontendStats& stats)
      : o_(o), gpu_(gpu), stats_(stats) {}

  // On an I/O thread: copies the request into the filling batch.
  void submit(const std::byte* data, uint32_t size, ReplyTo to) {
    const uint32_t in_need = align16(size);
    const uint32_t capacity =
        o_.reply_capacity != 0 ? o_.reply_capacity
                               : std::max<uint32_t>(align16(size), 256);  // room for an error text
    std::unique_lock lock(mutex_);
    // Waits while the filling batch has no room (the GPU thread then takes it soon).
    io_cv_.wait(lock, [&] { return stopping_ || fits(sets_[filling_], in_need, capacity); });
    if (stopping_) return;
    Set& s = sets_[filling_];
    std::byte* in = gpu_.host_in(filling_);
    auto* descs = reinterpret_cast<BatchDesc*>(in);
    std::byte* in_data = in + size_t{o_.max_batch} * sizeof(BatchDesc);
    std::memcpy(in_data + s.in_used, data, size);
    descs[s.count] = BatchDesc{static_cast<uint32_t>(s.in_used), size,
                               static_cast<uint32_t>(s.out_used), capacity};
    to.same_thread = false;
    s.to.push_back(std::move(to));
    if (s.count == 0) s.first = Clock::now();
    ++s.count;
    s.in_used += in_need;
    s.out_used += capacity;
  }

  // The GPU thread: takes batches until stop().
  void run() {
    for (;;) {
      int set;
      {
        std::unique_lock lock(mutex_);
        for (;;) {
          if (stopping_) return;
          Set& s = sets_[filling_];
          if (s.count > 0 && (s.count >= o_.max_batch || !fits(s, 16, 256) ||
                              Clock::now() - s.first >= o_.timeout)) {
            break;
          }
          // Spin (yielding): a dedicated thread polls, as Caracal's pollers do.
          lock.unlock();
          std::this_thread::yield();
          lock.lock();
        }
        set = filling_;
        filling_ = 1 - filling_;  // empty: the GPU finished it before this one was taken
      }
      io_cv_.notify_all();
      Set& s = sets_[set];
      const std::string error = gpu_.run(set, s.count, s.in_used, s.out_used);
      if (!error.empty()) {
        std::fprintf(stderr, "caracal_host_centric_server: %s\n", error.c_str());
        std::exit(1);
      }
      const std::byte* out = gpu_.host_out(set);
      const auto* results = reinterpret_cast<const BatchResult*>(out);
      const auto* descs = reinterpret_cast<const BatchDesc*>(gpu_.host_in(set));
      const std::byte* out_data = out + size_t{o_.max_batch} * sizeof(BatchResult);
      for (uint32_t i = 0; i < s.count; ++i) {
        if ((results[i].flags & (mqueue::kSlotNoReply | mqueue::kSlotError)) != 0) {
          ++stats_.dropped;
          continue;
        }
        send_reply(s.to[i], out_data + descs[i].out_offset, results[i].size, stats_);
      }
      ++batches_;
      requests_ += s.count;
      {
        std::lock_guard lock(mutex_);
        s.count = 0;
        s.in_used = 0;
        s.out_used = 0;
        s.to.clear();
      }
      io_cv_.notify_all();
    }
  }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    io_cv_.notify_all();
  }
  uint64_t batches() const { return batches_; }
  uint64_t requests() const { return requests_; }

 private:
  struct Set {
    uint32_t count = 0;
    size_t in_used = 0;
    size_t out_used = 0;
    std::vector<ReplyTo> to;
    Clock::time_point first;
  };
  bool fits(const Set& s, uint32_t in_need, uint32_t capacity) const {
    return s.count < o_.max_batch && s.in_used + in_need <= o_.data_bytes &&
           s.out_used + capacity <= o_.data_bytes;
  }

  const BatchOptions& o_;
  GpuBatchRunner& gpu_;
  FrontendStats& stats_;
  std::mutex mutex_;
  std::condition_variable io_cv_;
  Set sets_[2];
  int filling_ = 0;
  bool stopping_ = false;
  uint64_t batches_ = 0;   // GPU thread only
  uint64_t requests_ = 0;  // GPU thread only
};

// The GPU whose batches take a request (see the top): a TCP connection's by its number, else
// the I/O thread's next in turn (a counter of its own: nothing shared per request).
Batcher& batcher_for(const std::vector<std::unique_ptr<Batcher>>& batchers, const ReplyTo& to) {
  const size_t n = batchers.size();
  if (n == 1) return *batchers[0];
  thread_local uint64_t turn = 0;
  return *batchers[to.session != nullptr ? to.session->id() % n : turn++ % n];
}

int serve(const Frontend::Options& fo, const BatchOptions& bo, const FaceOptions& face) {
  std::vector<std::unique_ptr<GpuBatchRunner>> gpus;
  std::string names;
  for (const int device : bo.devices) {
    std::string error;
    gpus.push_back(
        make_gpu_batch_runner(bo.handler, bo.params, device, bo.max_batch, bo.data_bytes, error));
    if (gpus.back() == nullptr) {
      std::fprintf(stderr, "caracal_host_centric_server: GPU %d: %s\n", device, error.c_str());
      return 1;
    }
    names += (names.empty() ? "" : ",") + std::to_string(device);
  }
  std::vector<std::unique_ptr<Batcher>> batchers;
  Frontend::Submit submit = [&batchers](const std::byte* data, uint32_t size, ReplyTo to) {
    batcher_for(batchers, to).submit(data, size, std::move(to));
  };
  if (bo.handler == "face") {
    // The fetch first, then the item into the batch (see the top of the file). The fetches of
    // an I/O thread complete in order on that thread, so a TCP connection's items reach its
    // GPU in request order.
    submit = [&batchers, memcached = face.endpoint(),
              timeout = std::chrono::milliseconds(face.timeout_ms)](const std::byte* data,
                                                                    uint32_t size, ReplyTo to) {
      auto request = std::make_shared<std::vector<std::byte>>(data, data + size);
      auto batch = [&batchers, request, to](const Fetch& f) mutable {
        thread_local std::vector<std::byte> item;
        make_face_item(request->data(), static_cast<uint32_t>(request->size()), fetched_of(f),
                       f.value, f.value_bytes, item);
        batcher_for(batchers, to)
            .submit(item.data(), static_cast<uint32_t>(item.size()), std::move(to));
      };
      fetch_reference(data, size, to, memcached, timeout, std::move(batch));
    };
  }
  Frontend frontend(fo, submit);
  for (auto& gpu : gpus)
    batchers.push_back(std::make_unique<Batcher>(bo, *gpu, frontend.stats()));
  std::printf("listening udp %u tcp %u threads %u batch %u timeout_us %ld gpus %s\n",
              frontend.udp_port(), frontend.tcp_port(), fo.threads, bo.max_batch,
              static_cast<long>(bo.timeout.count()), names.c_str());
  std::fflush(stdout);

  std::vector<std::thread> gpu_threads;
  for (auto& b : batchers)
    gpu_threads.emplace_back([b = b.get()] { b->run(); });
  const auto stop_batchers = [&batchers] {
    for (auto& b : batchers)
      b->stop();
  };
  frontend.run_until_signal(stop_batchers);
  stop_batchers();
  for (auto& t : gpu_threads)
    t.join();
  uint64_t batches = 0, requests = 0;
  std::string per_gpu;
  for (size_t i = 0; i < batchers.size(); ++i) {
    batches += batchers[i]->batches();
    requests += batchers[i]->requests();
    per_gpu +=
        " gpu" + std::to_string(bo.devices[i]) + " " + std::to_string(batchers[i]->requests());
  }
  std::printf("%s batches %lu (mean %.1f) requests by GPU:%s\n", frontend.stats().served().c_str(),
              static_cast<unsigned long>(batches),
              batches == 0 ? 0.0 : static_cast<double>(requests) / batches, per_gpu.c_str());
  return 0;
}

}  // namespace
}  // namespace caracal::bench::baseline

int main(int argc, char** argv) {
  using namespace caracal::bench::baseline;
  Frontend::Options fo;
  BatchOptions bo;
  FaceOptions face;
  uint32_t timeout_us = 20;
  uint32_t data_mib = 4;
  CLI::App app{"caracal_host_centric_server: kernel sockets, batches copied to the GPU (baseline)"};
  Frontend::add_options(app, fo, bo.handler, 1u << 22);
  app.add_option("--batch", bo.max_batch, "Most requests per batch")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--batch-timeout-us", timeout_us,
                 "Longest wait of a batch's first request before the batch goes")
      ->capture_default_str();
  app.add_option("--batch-mib", data_mib, "Request bytes (and reply bytes) per batch buffer")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  app.add_option("--gpu,--gpus", bo.devices,
                 "CUDA devices, comma-separated: a batching thread for each, requests spread "
                 "over them")
      ->delimiter(',')
      ->check(CLI::Range(0, 1023))
      ->capture_default_str();
  app.add_option("--matvec-rounds", bo.params.matvec_rounds, "matvec: networks per vector")
      ->check(CLI::Range(1u, caracal::examples::MatVecSpec::kMaxRounds))
      ->capture_default_str();
  face.add_to(app);
  CLI11_PARSE(app, argc, argv);
  if (bo.handler == "face") bo.reply_capacity = 256;  // a verdict or an error, not the request
  bo.timeout = std::chrono::microseconds(timeout_us);
  bo.data_bytes = size_t{data_mib} << 20;
  if (bo.data_bytes < size_t{fo.max_message} + 256) {
    std::fprintf(stderr,
                 "caracal_host_centric_server: --batch-mib %u cannot hold one %u-byte "
                 "request\n",
                 data_mib, fo.max_message);
    return 2;
  }
  try {
    return serve(fo, bo, face);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caracal_host_centric_server: %s\n", e.what());
    return 1;
  }
}
