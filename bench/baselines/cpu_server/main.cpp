// caracal_cpu_server: the plain CPU baseline. Kernel sockets through Boost.Asio (UDP, and TCP
// with the 4-byte big-endian length prefix), N I/O threads, and the handler called inline on
// the thread that read the request, with the reply sent from there: no queues, no other
// processor. Serves the same handler types as Caracal's agents (echo, matvec), so the echo
// handler answers sockperf too. Face verification (examples/face_verify) fetches each reference
// from memcached on the I/O thread's own connection (common/memcached_client.hpp) and answers
// on that thread when it arrives, with the handler's functions.
//
//   caracal_cpu_server --handler echo --udp-port 7000 --tcp-port 7001 --threads 2
//   caracal_cpu_server --handler face --memcached 127.0.0.1:11211 --threads 2
//
// Prints "listening udp PORT tcp PORT" once it serves; SIGINT/SIGTERM stop it, and it then
// prints what it served.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <thread>

#include "caracal/accel/handler.hpp"
#include "face_fetch.hpp"
#include "frontend.hpp"
#include "handlers.hpp"

namespace caracal::bench::baseline {
namespace {

// Serves `frontend` until SIGINT or SIGTERM.
void run_until_signal(Frontend& frontend, uint32_t threads) {
  std::printf("listening udp %u tcp %u threads %u\n", frontend.udp_port(), frontend.tcp_port(),
              threads);
  std::fflush(stdout);
  frontend.run_until_signal();
  std::printf("%s\n", frontend.stats().served().c_str());
}

int serve_face(const Frontend::Options& o, const FaceOptions& fo) {
  namespace face = examples::face;
  const asio::ip::tcp::endpoint memcached = fo.endpoint();
  const std::chrono::milliseconds timeout(fo.timeout_ms);
  FrontendStats* stats = nullptr;
  auto submit = [&](const std::byte* data, uint32_t size, ReplyTo to) {
    // The Frontend's buffer is reused once this returns: the request is copied until its
    // reference is in.
    auto request = std::make_shared<std::vector<std::byte>>(data, data + size);
    auto answer = [request, to, stats](const Fetch& f) mutable {
      thread_local uint8_t histograms[face::kHistogramBytes];
      std::byte out[face::kMaxReplyBytes];
      accel::Response resp{out, face::kMaxReplyBytes};
      face::answer_fetched(accel::Group(), request->data(), static_cast<uint32_t>(request->size()),
                           fetched_of(f), f.value, f.value_bytes, histograms, nullptr, resp);
      send_reply(to, resp.data, resp.size, *stats);
    };
    fetch_reference(data, size, to, memcached, timeout, std::move(answer));
  };
  Frontend frontend(o, submit);
  stats = &frontend.stats();
  run_until_signal(frontend, o.threads);
  return 0;
}

template <class H>
int serve(const Frontend::Options& o, const HandlerParams& params) {
  std::atomic<uint32_t> next_worker{0};
  FrontendStats* stats = nullptr;
  // Each I/O thread keeps its own handler copy and reply buffer (thread_local: the submit
  // function runs on whichever thread read the request).
  auto submit = [&o, &params, &stats, &next_worker](const std::byte* data, uint32_t size,
                                                    ReplyTo to) {
    thread_local H handler = make_handler<H>(params);
    thread_local std::vector<std::byte> out(accel::max_response_of<H>(o.max_message));
    thread_local const uint32_t worker = next_worker.fetch_add(1, std::memory_order_relaxed);
    accel::Request req{data, size, 0, 0};
    accel::Response resp{out.data(), static_cast<uint32_t>(out.size())};
    accel::Context ctx(accel::Group(accel::granularity_of<H>(), 0, 1), nullptr, 0, worker);
    if constexpr (accel::batch_of<H>() > 1) {
      handler(&req, &resp, 1, ctx);
    } else {
      handler(req, resp, ctx);
    }
    if ((resp.flags & (mqueue::kSlotNoReply | mqueue::kSlotError)) != 0) {
      ++stats->dropped;
      return;
    }
    send_reply(to, resp.data, resp.size, *stats);
  };
  Frontend frontend(o, submit);
  stats = &frontend.stats();
  run_until_signal(frontend, o.threads);
  return 0;
}

}  // namespace
}  // namespace caracal::bench::baseline

int main(int argc, char** argv) {
  using namespace caracal::bench::baseline;
  Frontend::Options o;
  std::string handler = "echo";
  FaceOptions fo;
  CLI::App app{"caracal_cpu_server: handlers inline on Asio I/O threads (baseline)"};
  Frontend::add_options(app, o, handler, 1u << 26);
  fo.add_to(app);
  HandlerParams params;
  app.add_option("--matvec-rounds", params.matvec_rounds, "matvec: networks per vector")
      ->check(CLI::Range(1u, caracal::examples::MatVecSpec::kMaxRounds))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  int rc = 1;
  try {
    if (handler == "face") return serve_face(o, fo);
    with_handler(handler, [&]<class H>() { rc = serve<H>(o, params); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caracal_cpu_server: %s\n", e.what());
    return 1;
  }
  return rc;
}
