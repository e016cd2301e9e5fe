// The accelerator side of the cross-process stress test (stress_process_test.cpp): maps the
// region the test created, then echoes every request with the checks of stress_protocol.hpp.
//
//   caracal_mqueue_shm_peer (--fd N | --name /shm-name) TIMEOUT_S COUNT_Q0 [COUNT_Q1 ...]
//
// Exit status: 0 when every expected request was answered; 1 on a check failure, a stop
// request or the timeout (the reason on stderr); 2 on bad arguments or a region it cannot map.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "caracal/mqueue/validate.hpp"
#include "stress_protocol.hpp"

namespace {

using namespace caracal;
using namespace caracal::mqueue;
using stress::parse_u64;

int usage(const char* why) {
  std::fprintf(stderr,
               "shm_peer: %s\nusage: shm_peer (--fd N | --name /shm-name) TIMEOUT_S COUNT_Q0 "
               "[COUNT_Q1 ...]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return usage("too few arguments");
  const std::string how = argv[1];
  Result<ShmMapping> mapping = Status(StatusCode::kInvalidArgument, "unset");
  if (how == "--fd") {
    uint64_t fd = 0;
    if (!parse_u64(argv[2], fd)) return usage("bad fd");
    mapping = ShmMapping::open_fd(static_cast<int>(fd));
    close(static_cast<int>(fd));  // open_fd keeps its own copy
  } else if (how == "--name") {
    mapping = ShmMapping::open_named(argv[2]);
  } else {
    return usage("expected --fd or --name");
  }
  if (!mapping.ok()) {
    std::fprintf(stderr, "shm_peer: %s\n", mapping.status().message().c_str());
    return 2;
  }
  uint64_t timeout_s = 0;
  if (!parse_u64(argv[3], timeout_s)) return usage("bad timeout");
  std::vector<uint64_t> expected;
  for (int i = 4; i < argc; ++i) {
    uint64_t n = 0;
    if (!parse_u64(argv[i], n)) return usage("bad count");
    expected.push_back(n);
  }

  // The agent made this region, but a peer checks what it maps before trusting it.
  RegionHeader header;
  std::memcpy(&header, mapping->data(), sizeof(header));
  if (Status s = validate_region(header, mapping->size()); !s.ok()) {
    std::fprintf(stderr, "shm_peer: %s\n", s.message().c_str());
    return 2;
  }
  const RegionView view(mapping->data());
  const auto deadline = stress::Clock::now() + std::chrono::seconds(timeout_s);
  const std::string error = stress::run_echo_accelerator(view, expected, deadline);
  if (!error.empty()) {
    std::fprintf(stderr, "shm_peer: %s\n", error.c_str());
    return 1;
  }
  return 0;
}
