// wordcount: a client sends a line of text and gets back how many of its words count: those
// of at least `min_length` bytes that are not in the stop-word file. The template of
// README.md (the first-handler guide): copy it, rename it, change the handler.
//
// The parts of a handler with state and settings:
//   Config / configure()  the settings, read from the service's `handler:` mapping in the
//                         agent's YAML (or --set NAME=VALUE), with types, defaults and ranges;
//   setup()               runs once per service on the host before the agent registers: reads
//                         the stop words and puts them in the accelerator's memory (device
//                         memory on a GPU, host memory on the CPU);
//   Count                 the handler every worker copies: plain data and pointers into that
//                         memory, with a call operator that runs on the CPU and on the GPU;
//   teardown()            after every worker has stopped: reads the shared counters back.
#include <caracal/accel/bytes.hpp>
#include <caracal/accel/handler.hpp>
#include <caracal/agent/agent.hpp>
#include <caracal/mqueue/platform.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace wordcount {

inline constexpr uint32_t kWordBytes = 32;  // a stop word is 1-31 bytes, zero-padded

struct StopWord {
  char text[kWordBytes];
};

// Shared by every worker and updated with relaxed atomic adds (only the totals matter; the
// teardown reads them after the workers stopped).
struct Totals {
  uint64_t lines;
  uint64_t counted;
};

CARACAL_INLINE bool is_word_byte(uint8_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '\'' ||
         c >= 0x80;
}

CARACAL_INLINE uint8_t lower(uint8_t c) {
  return c >= 'A' && c <= 'Z' ? static_cast<uint8_t>(c + ('a' - 'A')) : c;
}

// What every worker copies. The handler is passed by value into each GPU thread: it must be
// trivially copyable and hold only pointers the accelerator can read.
struct Count {
  const StopWord* stop_words = nullptr;  // sorted, in the accelerator's memory
  uint32_t stop_word_count = 0;
  uint32_t min_length = 1;
  bool ignore_case = true;
  Totals* totals = nullptr;

  // word[0, bytes) against a zero-padded stop word: <0, 0, >0 as the word sorts.
  CARACAL_INLINE int compare(const uint8_t* word, uint32_t bytes, const StopWord& s) const {
    for (uint32_t i = 0; i < kWordBytes; ++i) {
      const uint8_t a = i < bytes ? (ignore_case ? lower(word[i]) : word[i]) : 0;
      const uint8_t b = static_cast<uint8_t>(s.text[i]);
      if (a != b) return a < b ? -1 : 1;
    }
    return 0;
  }

  CARACAL_INLINE bool is_stop_word(const uint8_t* word, uint32_t bytes) const {
    if (bytes >= kWordBytes) return false;
    uint32_t lo = 0, hi = stop_word_count;
    while (lo < hi) {
      const uint32_t mid = (lo + hi) / 2;
      const int c = compare(word, bytes, stop_words[mid]);
      if (c == 0) return true;
      if (c < 0) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return false;
  }

  CARACAL_HOST_DEVICE void operator()(const caracal::accel::Request& req,
                                      caracal::accel::Response& resp,
                                      caracal::accel::Context&) const {
    const auto* text = reinterpret_cast<const uint8_t*>(req.data);
    uint32_t words = 0, counted = 0;
    for (uint32_t i = 0; i < req.size;) {
      if (!is_word_byte(text[i])) {
        ++i;
        continue;
      }
      const uint32_t start = i;
      while (i < req.size && is_word_byte(text[i]))
        ++i;
      ++words;
      if (i - start >= min_length && !is_stop_word(text + start, i - start)) ++counted;
    }
    caracal::mqueue::SystemAtomicRef<uint64_t>(totals->lines)
        .fetch_add(1, caracal::mqueue::mo::memory_order_relaxed);
    caracal::mqueue::SystemAtomicRef<uint64_t>(totals->counted)
        .fetch_add(counted, caracal::mqueue::mo::memory_order_relaxed);
    // "4 of 6 words": the reply, written in place (no allocation on the accelerator).
    char digits[2][10];
    uint32_t lengths[2] = {0, 0};
    const uint32_t values[2] = {counted, words};
    for (int k = 0; k < 2; ++k) {
      uint32_t v = values[k];
      do {
        digits[k][lengths[k]++] = static_cast<char>('0' + v % 10);
        v /= 10;
      } while (v != 0);
    }
    const char of[] = " of ";
    const char tail[] = " words";
    if (resp.capacity < 2 * 10 + 4 + 6) return resp.set_error("a reply needs 30 bytes");
    uint32_t n = 0;
    for (uint32_t k = lengths[0]; k > 0; --k)
      resp.data[n++] = static_cast<std::byte>(digits[0][k - 1]);
    for (uint32_t k = 0; k < 4; ++k)
      resp.data[n++] = static_cast<std::byte>(of[k]);
    for (uint32_t k = lengths[1]; k > 0; --k)
      resp.data[n++] = static_cast<std::byte>(digits[1][k - 1]);
    for (uint32_t k = 0; k < 6; ++k)
      resp.data[n++] = static_cast<std::byte>(tail[k]);
    resp.size = n;
  }
};

// The state of one service: what setup() made, and the view every worker copies.
class WordCount {
 public:
  struct Config {
    std::filesystem::path stop_words;
    uint32_t min_length;
    bool ignore_case;
  };

  // The settings under the service's `handler:` (a wrong type, a value out of range or an
  // unknown key stops the agent with the file, line and column).
  static Config configure(caracal::agent::Settings& s) {
    Config c;
    c.stop_words = s.path("stop_words");  // required; relative to the agent's YAML
    c.min_length = s.integer<uint32_t>("min_length", 1, 1, 64);
    c.ignore_case = s.boolean("ignore_case", true);
    return c;
  }

  // Once per service, before the agent registers. An exception stops the agent with
  // "service 'NAME': handler setup failed: ..." and nothing registered.
  static WordCount setup(const Config& c, caracal::agent::SetupContext& ctx) {
    std::ifstream in(c.stop_words);
    if (!in) throw caracal::agent::SetupError("cannot open " + c.stop_words.string());
    std::vector<StopWord> words;
    std::string line;
    for (uint32_t number = 1; std::getline(in, line); ++number) {
      if (line.empty() || line[0] == '#') continue;
      if (line.size() >= kWordBytes) {
        throw caracal::agent::SetupError(c.stop_words.string() + ":" + std::to_string(number) +
                                         ": a stop word is 1-31 bytes");
      }
      StopWord w{};
      for (size_t i = 0; i < line.size(); ++i) {
        const auto b = static_cast<uint8_t>(line[i]);
        w.text[i] = static_cast<char>(c.ignore_case ? lower(b) : b);
      }
      words.push_back(w);
    }
    std::sort(words.begin(), words.end(), [](const StopWord& a, const StopWord& b) {
      return std::memcmp(a.text, b.text, kWordBytes) < 0;
    });
    WordCount state;
    state.view_.stop_words = words.empty() ? nullptr : ctx.upload(words, "stop words");
    state.view_.stop_word_count = static_cast<uint32_t>(words.size());
    state.view_.min_length = c.min_length;
    state.view_.ignore_case = c.ignore_case;
    state.view_.totals = ctx.allocate<Totals>(1, "totals");
    std::fprintf(stderr, "wordcount '%s': %zu stop words from %s on %s\n",
                 ctx.service().name.c_str(), words.size(), c.stop_words.c_str(),
                 ctx.accelerator().str().c_str());
    return state;
  }

  Count handler() const { return view_; }

  void teardown(caracal::agent::SetupContext& ctx) {
    Totals t{};
    ctx.copy_to_host(std::span<Totals>(&t, 1), view_.totals, "totals");
    std::fprintf(stderr, "wordcount '%s': %llu lines, %llu words counted\n",
                 ctx.service().name.c_str(), static_cast<unsigned long long>(t.lines),
                 static_cast<unsigned long long>(t.counted));
  }

 private:
  Count view_;
};

}  // namespace wordcount

int main(int argc, char** argv) {
  return caracal::agent::agent_main<wordcount::WordCount>(argc, argv);
}
