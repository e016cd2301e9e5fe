// caracal_face_loader: enrolls the synthetic face set (face_reference.hpp) in memcached: for each
// person 0 .. N-1 the reference histograms of their enrolled image, stored under "face:<id>" in
// the format of face_format.hpp. The servers' face handlers fetch them from there.
//
//   caracal_face_loader --memcached 127.0.0.1:11211 [--persons 1000] [--seed N]
//                       [--damage ID]... [--forget ID]...
//
// --damage ID stores that person's reference with one histogram byte changed (its checksum then
// fails: the handler answers corrupt_reference); --forget ID deletes it (unknown_person). Both are
// for tests. Prints "stored N references" and exits 0, or says what failed and exits 1; other
// codes are usage errors (CLI11's).
#include <chrono>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/write.hpp>

#include "face_reference.hpp"

namespace face = caracal::examples::face;

namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

// Each step (the connect, a batch of commands sent, an answer read) must end in this time.
constexpr std::chrono::milliseconds kStepTimeout{5000};
constexpr size_t kMaxLineBytes = 1024;

// A connection to memcached's text protocol. Every step is an asynchronous operation run by
// io_context::run_for, so that a memcached that stops answering fails the loader, not hangs it.
class Memcached {
 public:
  explicit Memcached(const std::string& host_port) : host_port_(host_port) {
    const size_t colon = host_port.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size())
      throw std::invalid_argument("'" + host_port + "' is not HOST:PORT");
    error_code ec;
    tcp::resolver resolver(io_);
    const auto endpoints =
        resolver.resolve(host_port.substr(0, colon), host_port.substr(colon + 1), ec);
    if (ec) throw std::runtime_error(host_port + ": " + ec.message());
    net::async_connect(socket_, endpoints, [&ec](error_code e, const tcp::endpoint&) { ec = e; });
    finish(ec, "cannot connect to " + host_port);
    socket_.set_option(tcp::no_delay(true));
  }

  void send(const std::string& out) {
    error_code ec;
    net::async_write(socket_, net::buffer(out), [&ec](error_code e, size_t) { ec = e; });
    finish(ec, "send to " + host_port_);
  }

  // One answer line, without its "\r\n".
  std::string read_line() {
    error_code ec;
    size_t n = 0;
    net::async_read_until(socket_, net::dynamic_buffer(in_, kMaxLineBytes), "\r\n",
                          [&](error_code e, size_t got) {
                            ec = e;
                            n = got;
                          });
    finish(ec, "read from " + host_port_);
    std::string line = in_.substr(0, n - 2);
    in_.erase(0, n);
    return line;
  }

 private:
  // Runs the operation just started to its end. Past kStepTimeout, closes the socket (the
  // operation then ends with operation_aborted) and throws.
  void finish(const error_code& ec, const std::string& what) {
    io_.restart();
    io_.run_for(kStepTimeout);
    if (!io_.stopped()) {
      error_code ignored;
      socket_.close(ignored);
      io_.run();
      throw std::runtime_error(what + ": no answer within " + std::to_string(kStepTimeout.count()) +
                               " ms");
    }
    if (ec == net::error::eof) throw std::runtime_error(what + ": memcached closed the connection");
    if (ec == net::error::not_found)
      throw std::runtime_error("memcached sent a line over " + std::to_string(kMaxLineBytes) +
                               " bytes");
    if (ec) throw std::runtime_error(what + ": " + ec.message());
  }

  const std::string host_port_;
  net::io_context io_;
  tcp::socket socket_{io_};
  std::string in_;  // read, not yet taken by read_line
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Enrolls the synthetic face set in memcached: the references the face handler fetches",
      "caracal_face_loader"};
  std::string memcached;
  uint32_t persons = face::kDefaultPersons;
  uint64_t seed = face::kDefaultSeed;
  std::vector<uint32_t> damage_ids, forget_ids;
  app.set_version_flag("--version", "caracal_face_loader (Caracal " CARACAL_VERSION ")");
  app.add_option("--memcached", memcached, "memcached to store into (HOST:PORT)")->required();
  app.add_option("--persons", persons, "persons 0 .. N-1 to enroll")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 24));
  app.add_option("--seed", seed, "seed of the synthetic face set")->capture_default_str();
  app.add_option("--damage", damage_ids, "store this person's reference with a bad checksum")
      ->allow_extra_args(false);
  app.add_option("--forget", forget_ids, "delete this person's reference")->allow_extra_args(false);
  CLI11_PARSE(app, argc, argv);
  const std::set<uint32_t> damage(damage_ids.begin(), damage_ids.end());
  const std::set<uint32_t> forget(forget_ids.begin(), forget_ids.end());

  try {
    Memcached mc(memcached);
    // Pipelined: a batch of commands, then their answers.
    constexpr uint32_t kPipeline = 64;
    uint64_t stored = 0;
    std::vector<uint32_t> batch;
    auto flush = [&] {
      std::string out;
      for (const uint32_t p : batch) {
        char key[face::kMaxKeyBytes + 1];
        key[face::reference_key(p, key)] = '\0';
        if (forget.count(p) != 0) {
          out += std::string("delete ") + key + "\r\n";
          continue;
        }
        std::vector<uint8_t> hist =
            face::reference_histograms(face::synthetic_face(seed, p, 0).data());
        std::vector<uint8_t> value = face::encode_reference(p, hist);
        if (damage.count(p) != 0) value[face::kReferenceHeaderBytes + 100] ^= 0x01;
        out += std::string("set ") + key + " 0 0 " + std::to_string(value.size()) + "\r\n";
        out.append(reinterpret_cast<const char*>(value.data()), value.size());
        out += "\r\n";
      }
      mc.send(out);
      for (const uint32_t p : batch) {
        const std::string line = mc.read_line();
        if (forget.count(p) != 0) {
          if (line != "DELETED" && line != "NOT_FOUND")
            throw std::runtime_error("delete of person " + std::to_string(p) + ": " + line);
        } else if (line == "STORED") {
          ++stored;
        } else {
          throw std::runtime_error("set of person " + std::to_string(p) + ": " + line);
        }
      }
      batch.clear();
    };
    for (uint32_t p = 0; p < persons; ++p) {
      batch.push_back(p);
      if (batch.size() == kPipeline) flush();
    }
    for (const uint32_t p : forget) {
      if (p >= persons) batch.push_back(p);
    }
    flush();
    std::printf("stored %lu references (persons 0-%lu, seed %lu) in %s\n",
                static_cast<unsigned long>(stored), static_cast<unsigned long>(persons - 1),
                static_cast<unsigned long>(seed), memcached.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caracal_face_loader: %s\n", e.what());
    return 1;
  }
  return 0;
}
