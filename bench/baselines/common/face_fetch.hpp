// The baselines' side of face verification that talks to memcached (host code): where it is,
// the key of a request, and what a fetch gave in face terms.
#pragma once

#include <CLI/CLI.hpp>

#include <stdexcept>
#include <string>

#include "face_items.hpp"
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
