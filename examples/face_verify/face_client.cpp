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
// Exits 0 when a reply came (and was as expected), 1 when none came within --timeout-ms, it was
// malformed or not as expected; other codes are usage errors (CLI11's).
#include <array>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "face_reference.hpp"

namespace face = caracal::examples::face;

namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using udp = net::ip::udp;
using error_code = boost::system::error_code;

constexpr size_t kMaxReplyBytes = 65536;

// "HOST:PORT" into its parts; throws with the text when it is not one.
std::pair<std::string, std::string> split_host_port(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw std::invalid_argument("'" + text + "' is not HOST:PORT");
  return {text.substr(0, colon), text.substr(colon + 1)};
}

// Runs the operation just started on `socket` to its end, which sets `ec`. Past `timeout`,
// closes the socket (the operation then ends with operation_aborted) and throws.
template <typename Socket>
void finish(net::io_context& io, Socket& socket, std::chrono::milliseconds timeout,
            const error_code& ec, const std::string& what) {
  io.restart();
  io.run_for(timeout);
  if (!io.stopped()) {
    error_code ignored;
    socket.close(ignored);
    io.run();
    throw std::runtime_error(what + ": no answer within " + std::to_string(timeout.count()) +
                             " ms");
  }
  if (ec == net::error::eof) throw std::runtime_error(what + ": the server closed the connection");
  if (ec) throw std::runtime_error(what + ": " + ec.message());
}

// Sends `request` with a 4-byte big-endian length; returns the reply's size, read into `reply`.
size_t ask_tcp(const std::string& host_port, const std::vector<uint8_t>& request,
               std::vector<uint8_t>& reply, std::chrono::milliseconds timeout) {
  const auto [host, port] = split_host_port(host_port);
  net::io_context io;
  tcp::socket socket(io);
  error_code ec;
  const auto endpoints = tcp::resolver(io).resolve(host, port, ec);
  if (ec) throw std::runtime_error(host_port + ": " + ec.message());
  net::async_connect(socket, endpoints, [&ec](error_code e, const tcp::endpoint&) { ec = e; });
  finish(io, socket, timeout, ec, "cannot connect to " + host_port);
  socket.set_option(tcp::no_delay(true));

  const auto n = static_cast<uint32_t>(request.size());
  const std::array<uint8_t, 4> prefix = {static_cast<uint8_t>(n >> 24),
                                         static_cast<uint8_t>(n >> 16),
                                         static_cast<uint8_t>(n >> 8), static_cast<uint8_t>(n)};
  const std::array<net::const_buffer, 2> out = {net::buffer(prefix), net::buffer(request)};
  net::async_write(socket, out, [&ec](error_code e, size_t) { ec = e; });
  finish(io, socket, timeout, ec, "send");

  std::array<uint8_t, 4> got{};
  net::async_read(socket, net::buffer(got), [&ec](error_code e, size_t) { ec = e; });
  finish(io, socket, timeout, ec, "the reply's length");
  const uint32_t size =
      uint32_t{got[0]} << 24 | uint32_t{got[1]} << 16 | uint32_t{got[2]} << 8 | got[3];
  if (size > reply.size())
    throw std::runtime_error("a reply of " + std::to_string(size) + " bytes");
  net::async_read(socket, net::buffer(reply.data(), size), [&ec](error_code e, size_t) { ec = e; });
  finish(io, socket, timeout, ec, "the reply");
  return size;
}

// Sends `request` in one datagram; returns the size of the one that answers, read into `reply`.
size_t ask_udp(const std::string& host_port, const std::vector<uint8_t>& request,
               std::vector<uint8_t>& reply, std::chrono::milliseconds timeout) {
  const auto [host, port] = split_host_port(host_port);
  net::io_context io;
  udp::socket socket(io);
  error_code ec;
  const auto endpoints = udp::resolver(io).resolve(host, port, ec);
  if (ec) throw std::runtime_error(host_port + ": " + ec.message());
  net::connect(socket, endpoints, ec);
  if (ec) throw std::runtime_error("cannot connect to " + host_port + ": " + ec.message());
  socket.send(net::buffer(request));
  size_t size = 0;
  socket.async_receive(net::buffer(reply), [&](error_code e, size_t got) {
    ec = e;
    size = got;
  });
  finish(io, socket, timeout, ec, "the reply");
  return size;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sends one face verification request and prints the reply, decoded",
               "caracal_face_client"};
  std::string udp_to, tcp_to, expect;
  uint32_t person = 0, face_of = 0, variant = 1;
  uint64_t seed = face::kDefaultSeed;
  uint32_t timeout_ms = 5000;
  bool bad = false;
  app.set_version_flag("--version", "caracal_face_client (Caracal " CARACAL_VERSION ")");
  CLI::Option_group* to = app.add_option_group("server", "where to send the request (one of)");
  CLI::Option* udp_opt = to->add_option("--udp", udp_to, "a UDP listener (HOST:PORT)");
  CLI::Option* tcp_opt =
      to->add_option("--tcp", tcp_to, "a TCP listener with 4-byte length prefixes (HOST:PORT)");
  udp_opt->excludes(tcp_opt);
  to->require_option(1);
  app.add_option("--person", person, "the person id the request claims")->required();
  CLI::Option* face_opt =
      app.add_option("--face", face_of, "whose face to send (default: --person's)");
  app.add_option("--variant", variant, "which capture of that face")->capture_default_str();
  app.add_option("--seed", seed, "seed of the synthetic face set")->capture_default_str();
  app.add_flag("--bad", bad, "send a request that is not a face request");
  std::vector<std::string> expectable{"verdict"};  // and every status, kBadRequest the last
  for (uint16_t s = 0; s <= static_cast<uint16_t>(face::ReplyStatus::kBadRequest); ++s)
    expectable.emplace_back(face::status_name(static_cast<face::ReplyStatus>(s)));
  app.add_option("--expect", expect,
                 "the reply's status, or verdict: the CPU reference's verdict and distance "
                 "(else exit 1)")
      ->check(CLI::IsMember(expectable));
  app.add_option("--timeout-ms", timeout_ms,
                 "the most the connect, the send and the reply may each take")
      ->capture_default_str()
      ->check(CLI::Range(1u, 600000u));
  CLI11_PARSE(app, argc, argv);
  if (face_opt->count() == 0) face_of = person;

  const face::Image image = face::synthetic_face(seed, face_of, variant);
  std::vector<uint8_t> request = face::encode_request(person, image);
  if (bad) request.resize(10);
  try {
    std::vector<uint8_t> reply(kMaxReplyBytes);
    const std::chrono::milliseconds timeout{timeout_ms};
    const size_t size = tcp_to.empty() ? ask_udp(udp_to, request, reply, timeout)
                                       : ask_tcp(tcp_to, request, reply, timeout);
    const face::Decoded d = face::decode_reply(reply.data(), static_cast<uint32_t>(size));
    if (!d.error.empty()) {
      std::printf("malformed reply (%zu bytes): %s: %.*s\n", size, d.error.c_str(),
                  static_cast<int>(size), reinterpret_cast<const char*>(reply.data()));
      return 1;
    }
    std::printf("%s person %u distance %.2f%s%s\n", face::status_name(d.status), d.person_id,
                static_cast<double>(d.distance) / 65536.0, d.reason.empty() ? "" : ": ",
                d.reason.c_str());
    if (expect.empty()) return 0;
    if (expect == "verdict") {
      const std::vector<uint8_t> reference =
          face::reference_histograms(face::synthetic_face(seed, person, 0).data());
      const std::string why =
          face::check_reply(reply.data(), static_cast<uint32_t>(size),
                            face::reference_answer(person, image.data(), &reference));
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
