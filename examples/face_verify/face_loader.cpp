// caracal_face_loader: enrolls the synthetic face set (face_reference.hpp) in memcached: for each
// person 0 .. N-1 the reference histograms of their enrolled image, stored under "face:<id>" in
// the format of face_format.hpp. The servers' face handlers fetch them from there.
//
//   caracal_face_loader --memcached 127.0.0.1:11211 [--persons 1000] [--seed N]
//                       [--damage ID]... [--forget ID]...
//
// --damage ID stores that person's reference with one histogram byte changed (its checksum then
// fails: the handler answers corrupt_reference); --forget ID deletes it (unknown_person). Both are
// for tests. Prints "stored N references" and exits 0, or says what failed and exits 1.
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "face_net.hpp"
#include "face_reference.hpp"

namespace face = caracal::examples::face;

namespace {

int usage(const char* why) {
  std::fprintf(stderr,
               "caracal_face_loader: %s\n"
               "usage: caracal_face_loader --memcached HOST:PORT [--persons N] [--seed N] "
               "[--damage ID]... [--forget ID]...\n",
               why);
  return 2;
}

bool parse_u64(const char* text, uint64_t& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(text, &end, 0);
  return errno == 0 && end != text && *end == '\0';
}

// Reads one "\r\n"-terminated line.
std::string read_line(int fd) {
  std::string line;
  char c;
  while (line.size() < 1024) {
    face::recv_all(fd, &c, 1);
    line += c;
    if (line.size() >= 2 && line.compare(line.size() - 2, 2, "\r\n") == 0) {
      line.resize(line.size() - 2);
      return line;
    }
  }
  throw std::runtime_error("memcached sent a line over 1 KiB");
}

}  // namespace

int main(int argc, char** argv) {
  std::string memcached;
  uint64_t persons = face::kDefaultPersons;
  uint64_t seed = face::kDefaultSeed;
  std::set<uint64_t> damage, forget;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return usage(("missing the value of " + arg).c_str());
    const char* value = argv[++i];
    uint64_t n = 0;
    if (arg == "--memcached") {
      memcached = value;
    } else if (arg == "--persons" && parse_u64(value, n) && n >= 1 && n <= (1u << 24)) {
      persons = n;
    } else if (arg == "--seed" && parse_u64(value, n)) {
      seed = n;
    } else if (arg == "--damage" && parse_u64(value, n) && n <= UINT32_MAX) {
      damage.insert(n);
    } else if (arg == "--forget" && parse_u64(value, n) && n <= UINT32_MAX) {
      forget.insert(n);
    } else {
      return usage(("bad option " + arg + " " + value).c_str());
    }
  }
  if (memcached.empty()) return usage("--memcached is required");
  try {
    const int fd = face::connect_to(memcached, SOCK_STREAM, 5000);
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
      face::send_all(fd, out.data(), out.size());
      for (const uint32_t p : batch) {
        const std::string line = read_line(fd);
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
    for (uint64_t p = 0; p < persons; ++p) {
      batch.push_back(static_cast<uint32_t>(p));
      if (batch.size() == kPipeline) flush();
    }
    for (const uint64_t p : forget) {
      if (p >= persons) batch.push_back(static_cast<uint32_t>(p));
    }
    flush();
    close(fd);
    std::printf("stored %lu references (persons 0-%lu, seed %lu) in %s\n",
                static_cast<unsigned long>(stored), static_cast<unsigned long>(persons - 1),
                static_cast<unsigned long>(seed), memcached.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caracal_face_loader: %s\n", e.what());
    return 1;
  }
  return 0;
}
