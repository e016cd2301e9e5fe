// caracal_dictionary_agent: serves the dictionary handler (dictionary.hpp), a handler with
// settings and state. Next to a server started with configs/dictionary-server.yaml:
//
//   caracal_dictionary_agent --config configs/dictionary-agent.yaml
//   printf 'caracal\n' | nc -q1 127.0.0.1 7300
//
// Its settings, under each service's `handler:` (or --set NAME=VALUE):
//   words: PATH             required: `word<TAB>definition` lines (relative to the config file)
//   buckets: 4096           hash table slots, a power of two in [16, 2^24], at least twice the
//   words case_sensitive: false   whether "Cat" is "cat" not_found: NOT_FOUND    the reply to a
//   word the dictionary lacks
#include <caracal/agent/agent.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>

#include "dictionary.hpp"
#include "dictionary_table.hpp"

namespace caracal::examples::dictionary {

// The state of one service: the table in the accelerator's memory (owned by the SetupContext,
// freed after teardown) and the view of it that every worker copies.
class Dictionary {
 public:
  struct Config {
    std::filesystem::path words;
    uint32_t buckets;
    bool case_sensitive;
    std::string not_found;
  };

  static Config configure(agent::Settings& s) {
    Config c;
    c.words = s.path("words");
    c.buckets = s.integer<uint32_t>("buckets", 4096, 16, 1u << 24);
    if ((c.buckets & (c.buckets - 1)) != 0)
      s.fail("buckets", std::to_string(c.buckets) + " is not a power of two");
    c.case_sensitive = s.boolean("case_sensitive", false);
    c.not_found = s.string("not_found", "NOT_FOUND");
    return c;
  }

  static Dictionary setup(const Config& c, agent::SetupContext& ctx) {
    std::ifstream in(c.words);
    if (!in) throw agent::SetupError("cannot open " + c.words.string());
    const uint32_t max_reply = ctx.service().max_message_bytes;
    if (c.not_found.size() > max_reply) {
      throw agent::SetupError("not_found is longer than a reply (" + std::to_string(max_reply) +
                              " bytes)");
    }
    const Table t =
        build_table(in, c.words.string(), c.buckets, c.case_sensitive, c.not_found, max_reply);
    Dictionary d;
    d.view_.buckets = ctx.upload(t.buckets, "dictionary buckets");
    d.view_.bucket_mask = c.buckets - 1;
    d.view_.text = ctx.upload(t.text, "dictionary text");
    d.view_.not_found_offset = t.not_found_offset;
    d.view_.not_found_bytes = t.not_found_bytes;
    d.view_.case_sensitive = c.case_sensitive;
    d.view_.counters = ctx.allocate<Counters>(1, "dictionary counters");
    std::fprintf(stderr, "dictionary '%s': %llu words from %s, %llu bytes on %s\n",
                 ctx.service().name.c_str(), static_cast<unsigned long long>(t.entries),
                 c.words.c_str(), static_cast<unsigned long long>(ctx.allocated_bytes()),
                 ctx.accelerator().str().c_str());
    return d;
  }

  Lookup handler() const { return view_; }

  // The workers have stopped: their counts are final.
  void teardown(agent::SetupContext& ctx) {
    Counters c{};
    ctx.copy_to_host(std::span<Counters>(&c, 1), view_.counters, "dictionary counters");
    std::fprintf(stderr, "dictionary '%s': %llu lookups, %llu not found\n",
                 ctx.service().name.c_str(), static_cast<unsigned long long>(c.lookups),
                 static_cast<unsigned long long>(c.misses));
  }

 private:
  Lookup view_;
};

}  // namespace caracal::examples::dictionary

int main(int argc, char** argv) {
  return caracal::agent::agent_main<caracal::examples::dictionary::Dictionary>(argc, argv);
}
