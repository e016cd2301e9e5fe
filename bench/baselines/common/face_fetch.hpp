// The baselines' side of face verification that talks to memcached (host code): where it is,
// the key of a request, and what a fetch gave in face terms.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "face_items.hpp"
#include "frontend.hpp"
#include "memcached_client.hpp"

namespace caracal::bench::baseline {

// Where the references are (--memcached, --memcached-timeout-ms).
struct FaceOptions {
  std::string memcached = "127.0.0.1:11211";
  uint32_t timeout_ms = 1000;

  void add_to(CLI::App& app) {
    app.add_option("--memcached", memcached, "memcached with the face references (face handler)")
        ->capture_default_str();
    app.add_option("--memcached-timeout-ms", timeout_ms,
                   "A get unanswered for this long fails (0: no limit)")
        ->capture_default_str();
  }
  // The address, resolved once; throws when it does not resolve.
  boost::asio::ip::tcp::endpoint endpoint() const {
    const size_t colon = memcached.rfind(':');
    if (colon == std::string::npos)
      throw std::invalid_argument("--memcached " + memcached + " is not HOST:PORT");
    boost::asio::io_context io;
    boost::asio::ip::tcp::resolver r(io);
    return *r.resolve(memcached.substr(0, colon), memcached.substr(colon + 1)).begin();
  }
};

// The key of a request's reference ("face:<id>").
inline std::string face_key(const std::byte* request, uint32_t bytes) {
  char key[examples::face::kMaxKeyBytes];
  const uint32_t n = examples::face::reference_key(examples::face::person_of(request, bytes), key);
  return std::string(key, n);
}

// Fetches the reference of `request` on the calling I/O thread's own memcached connection and
// calls `then` with what came; a malformed request's `then` runs in order behind the fetches in
// flight, so that replies keep request order.
inline void fetch_reference(const std::byte* request, uint32_t bytes, const ReplyTo& to,
                            const boost::asio::ip::tcp::endpoint& memcached,
                            std::chrono::milliseconds timeout, MemcachedClient::Done then) {
  thread_local std::shared_ptr<MemcachedClient> client;
  if (!client) client = std::make_shared<MemcachedClient>(executor_of(to), memcached, timeout);
  if (examples::face::well_formed(request, bytes)) {
    client->get(face_key(request, bytes), std::move(then));
  } else {
    client->after_pending(std::move(then));
  }
}

inline examples::face::Fetched fetched_of(const Fetch& f) {
  switch (f.kind) {
    case Fetch::kFound:
      return examples::face::Fetched::kFound;
    case Fetch::kMissing:
      return examples::face::Fetched::kMissing;
    default:
      return examples::face::Fetched::kFailed;
  }
}

}  // namespace caracal::bench::baseline
