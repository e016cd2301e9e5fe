// caracal_face_client: sends one face verification request and prints the reply, decoded:
//
//   caracal_face_client --udp 127.0.0.1:7020 --person 3             # person 3's face, claimed as 3
//   caracal_face_client --tcp 127.0.0.1:7021 --person 3 --face 8    # person 8's face, claimed as 3
//
// TCP uses snic_server's length-prefixed framing (a 4-byte big-endian length). The face is
// capture --variant (1) of person --face (default: --person) from the synthetic set of --seed.
// --bad sends a request that is not a face request. With --expect S the reply must have status S
// (match, no_match, unknown_person, store_unavailable, corrupt_reference, bad_request), or with
// --expect verdict the CPU reference's verdict and distance exactly; exit 1 when it does not.
// Prints "STATUS person ID distance D" (D in chi-square units), then ": REASON" on an error.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "face_net.hpp"
#include "face_reference.hpp"

namespace face = caracal::examples::face;

namespace {

int usage(const char* why) {
  std::fprintf(stderr,
               "caracal_face_client: %s\n"
               "usage: caracal_face_client (--udp|--tcp) HOST:PORT --person ID [--face ID] "
               "[--variant N] [--seed N] [--bad] [--expect STATUS|verdict] [--timeout-ms N]\n",
               why);
  return 2;
}

bool parse_u64(const char* text, uint64_t& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(text, &end, 0);
  return errno == 0 && end != text && *end == '\0';
}

}  // namespace

int main(int argc, char** argv) {
  std::string udp, tcp, expect;
  uint64_t person = UINT64_MAX, face_of = UINT64_MAX, variant = 1, seed = face::kDefaultSeed;
  uint64_t timeout_ms = 5000;
  bool bad = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--bad") {
      bad = true;
      continue;
    }
    if (i + 1 >= argc) return usage(("missing the value of " + arg).c_str());
    const char* value = argv[++i];
    uint64_t n = 0;
    if (arg == "--udp") {
      udp = value;
    } else if (arg == "--tcp") {
      tcp = value;
    } else if (arg == "--expect") {
      expect = value;
    } else if (arg == "--person" && parse_u64(value, n) && n <= UINT32_MAX) {
      person = n;
    } else if (arg == "--face" && parse_u64(value, n) && n <= UINT32_MAX) {
      face_of = n;
    } else if (arg == "--variant" && parse_u64(value, n) && n <= UINT32_MAX) {
      variant = n;
    } else if (arg == "--seed" && parse_u64(value, n)) {
      seed = n;
    } else if (arg == "--timeout-ms" && parse_u64(value, n) && n >= 1 && n <= 600000) {
      timeout_ms = n;
    } else {
      return usage(("bad option " + arg + " " + value).c_str());
    }
  }
  if (udp.empty() == tcp.empty()) return usage("give one of --udp and --tcp");
  if (person == UINT64_MAX) return usage("--person is required");
  if (face_of == UINT64_MAX) face_of = person;
  const face::Image image =
      face::synthetic_face(seed, static_cast<uint32_t>(face_of), static_cast<uint32_t>(variant));
  std::vector<uint8_t> request = face::encode_request(static_cast<uint32_t>(person), image);
  if (bad) request.resize(10);
  try {
    const bool is_tcp = !tcp.empty();
    const int fd = face::connect_to(is_tcp ? tcp : udp, is_tcp ? SOCK_STREAM : SOCK_DGRAM,
                                    static_cast<int>(timeout_ms));
    std::vector<uint8_t> reply(65536);
    uint32_t size = 0;
    if (is_tcp) {
      const uint32_t n = static_cast<uint32_t>(request.size());
      const uint8_t prefix[4] = {static_cast<uint8_t>(n >> 24), static_cast<uint8_t>(n >> 16),
                                 static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)};
      face::send_all(fd, prefix, 4);
      face::send_all(fd, request.data(), request.size());
      uint8_t got[4];
      face::recv_all(fd, got, 4);
      size = uint32_t{got[0]} << 24 | uint32_t{got[1]} << 16 | uint32_t{got[2]} << 8 | got[3];
      if (size > reply.size())
        throw std::runtime_error("a reply of " + std::to_string(size) + " bytes");
      face::recv_all(fd, reply.data(), size);
    } else {
      face::send_all(fd, request.data(), request.size());
      const ssize_t r = recv(fd, reply.data(), reply.size(), 0);
      if (r < 0) throw std::runtime_error("no reply in time");
      size = static_cast<uint32_t>(r);
    }
    close(fd);
    const face::Decoded d = face::decode_reply(reply.data(), size);
    if (!d.error.empty()) {
      std::printf("malformed reply (%u bytes): %s: %.*s\n", size, d.error.c_str(),
                  static_cast<int>(size), reinterpret_cast<const char*>(reply.data()));
      return 1;
    }
    std::printf("%s person %u distance %.2f%s%s\n", face::status_name(d.status), d.person_id,
                static_cast<double>(d.distance) / 65536.0, d.reason.empty() ? "" : ": ",
                d.reason.c_str());
    if (expect.empty()) return 0;
    if (expect == "verdict") {
      const std::vector<uint8_t> reference = face::reference_histograms(
          face::synthetic_face(seed, static_cast<uint32_t>(person), 0).data());
      const std::string why = face::check_reply(
          reply.data(), size,
          face::reference_answer(static_cast<uint32_t>(person), image.data(), &reference));
      if (why.empty()) return 0;
      std::printf("not the reference's verdict: %s\n", why.c_str());
      return 1;
    }
    if (expect == face::status_name(d.status)) return 0;
    std::printf("expected %s\n", expect.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caracal_face_client: %s\n", e.what());
    return 1;
  }
}
