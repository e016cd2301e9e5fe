// The control channel as the server reads it from an agent (control/): a stream of frames, each
// a 4-byte big-endian length and a YAML payload, read as control::Connection reads them:
// frame_length() on the prefix, then decode() on the payload, until a frame is refused or the
// bytes run out. The region message's field checks (transport, shm name, rdma address and
// size, destinations) are part of decode().
//
// Besides sanitizer findings:
//  - a refused length is 0 or over kMaxFrameBytes, and an accepted one is neither;
//  - decode() returns an error (never throws) that names the peer;
//  - a decoded message encodes to a frame whose prefix is its payload's length, which decodes
//    back to a message that encodes the same (what one side says, the other reads).
#include <cstddef>
#include <cstdint>
#include <string>

#include "caracal/control/protocol.hpp"
#include "fuzz_check.hpp"

namespace {

namespace control = caracal::control;

const std::string kOrigin = "control 192.0.2.1:40000";

void check_round_trip(const control::Message& m) {
  const std::string frame = control::encode(m);
  CARACAL_FUZZ_CHECK(frame.size() > control::kFramePrefixBytes, "empty %s frame",
                     control::type_name(m));
  caracal::Result<uint32_t> n =
      control::frame_length(reinterpret_cast<const std::byte*>(frame.data()));
  CARACAL_FUZZ_CHECK(n.ok() && *n == frame.size() - control::kFramePrefixBytes,
                     "a %s frame's prefix does not give its length", control::type_name(m));
  const std::string payload = frame.substr(control::kFramePrefixBytes);
  caracal::Result<control::Message> again = control::decode(payload, kOrigin);
  CARACAL_FUZZ_CHECK(again.ok(), "a %s message encoded as '%s' does not decode: %s",
                     control::type_name(m), payload.c_str(), again.status().message().c_str());
  CARACAL_FUZZ_CHECK(again->index() == m.index(), "a %s message decodes as a %s",
                     control::type_name(m), control::type_name(*again));
  CARACAL_FUZZ_CHECK(control::encode(*again) == frame,
                     "a %s message encoded as '%s' encodes differently once decoded",
                     control::type_name(m), payload.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  caracal::fuzz::Input in(data, size);
  while (in.left() >= control::kFramePrefixBytes) {
    const std::span<const std::byte> prefix = in.bytes(control::kFramePrefixBytes);
    uint32_t announced = 0;
    for (const std::byte b : prefix)
      announced = (announced << 8) | std::to_integer<uint32_t>(b);
    caracal::Result<uint32_t> n = control::frame_length(prefix.data());
    const bool in_range = announced != 0 && announced <= control::kMaxFrameBytes;
    CARACAL_FUZZ_CHECK(n.ok() == in_range, "frame length %u %s", announced,
                       n.ok() ? "accepted" : "refused");
    if (!n.ok()) {
      CARACAL_FUZZ_CHECK(!n.status().message().empty(), "a refused length says nothing");
      break;
    }
    if (in.left() < *n) break;  // cut short: the connection ends as broken
    const std::string payload(caracal::fuzz::as_text(in.bytes(*n)));
    caracal::Result<control::Message> m = control::decode(payload, kOrigin);
    if (!m.ok()) {
      CARACAL_FUZZ_CHECK(m.status().message().starts_with(kOrigin),
                         "the error does not name the peer: %s", m.status().message().c_str());
      break;  // the connection ends after the refusal
    }
    check_round_trip(*m);
  }
  return 0;
}
