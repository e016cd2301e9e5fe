// A handler's settings (settings.hpp): the `handler:` mapping of a service read as the handler
// declares it, with the agent configuration's errors (file, line, column, key), its defaults,
// lists and paths, the command line over the file, and HandlerFlags feeding the same settings.
#include "caracal/agent/settings.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "caracal/agent/agent.hpp"
#include "caracal/agent/config.hpp"
#include "caracal/agent/setup.hpp"

namespace caracal::agent {
namespace {

namespace fs = std::filesystem;

// What a word-count handler would declare.
struct WordsConfig {
  fs::path dictionary;
  uint32_t buckets = 0;
  int64_t offset = 0;
  double load_factor = 0;
  bool case_sensitive = false;
  std::string mode;
  std::vector<std::string> stop_words;
  std::vector<uint32_t> ports;
  std::string greeting;
};

WordsConfig configure_words(Settings& s) {
  WordsConfig c;
  c.dictionary = s.path("dictionary");
  c.buckets = s.integer<uint32_t>("buckets", 4096, 16, 1u << 24);
  c.offset = s.integer<int64_t>("offset", -1, -100, 100);
  c.load_factor = s.number("load_factor", 0.75, 0.1, 1.0);
  c.case_sensitive = s.boolean("case_sensitive", false);
  c.mode = s.choice("mode", "exact", {"exact", "prefix"});
  c.stop_words = s.strings("stop_words", std::vector<std::string>{"a", "the"});
  c.ports = s.integers<uint32_t>("ports", std::vector<uint32_t>{}, 1, 65535);
  c.greeting = s.string("greeting", "hello");
  return c;
}

// A directory with a dictionary file in it, removed at the end.
class HandlerSettings : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("caracal-settings-" + std::to_string(getpid()));
    fs::create_directories(dir_ / "data");
    std::ofstream(dir_ / "data" / "words.tsv") << "cat\tfeline\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The services of an agent configuration whose first service carries `handler`, the lines
  // of its mapping (each indented by 6 spaces in the file).
  AgentConfig config_with(const std::string& handler) {
    const std::string text = std::string(R"(agent: words-1
server: 127.0.0.1:7100
secret: change-me-0123456789
services:
  - name: words
    max_message_bytes: 200
)") + handler;
    return parse_agent_config(config::load_yaml_text(text, "agent.yaml"));
  }

  WordsConfig read(const std::string& handler, std::vector<SettingOverride> overrides = {}) {
    const AgentConfig c = config_with(handler);
    Settings s(SettingsSource{"words", c.services[0].handler, c.services[0].entry, dir_,
                              std::move(overrides)});
    WordsConfig out = configure_words(s);
    s.finish();
    summary_ = s.summary();
    return out;
  }

  // The ConfigError's text, or "" when it was accepted.
  std::string error_of(const std::string& handler, std::vector<SettingOverride> overrides = {}) {
    try {
      read(handler, std::move(overrides));
    } catch (const config::ConfigError& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  std::string summary_;
};

constexpr const char* kDictionary = "    handler:\n      dictionary: data/words.tsv\n";

void expect_starts_with(const std::string& text, const std::string& prefix) {
  EXPECT_EQ(text.rfind(prefix, 0), 0u) << text;
}
void expect_has(const std::string& text, const std::string& needle) {
  EXPECT_NE(text.find(needle), std::string::npos) << "'" << needle << "' not in: " << text;
}

TEST_F(HandlerSettings, DefaultsApplyWhereTheMappingIsSilent) {
  const WordsConfig c = read(kDictionary);
  EXPECT_EQ(c.buckets, 4096u);
  EXPECT_EQ(c.offset, -1);
  EXPECT_DOUBLE_EQ(c.load_factor, 0.75);
  EXPECT_FALSE(c.case_sensitive);
  EXPECT_EQ(c.mode, "exact");
  EXPECT_EQ(c.stop_words, (std::vector<std::string>{"a", "the"}));
  EXPECT_TRUE(c.ports.empty());
  EXPECT_EQ(c.greeting, "hello");
  expect_has(summary_, "buckets=4096 (default)");
  expect_has(summary_, "dictionary=" + (dir_ / "data" / "words.tsv").string());
  EXPECT_EQ(summary_.find("dictionary=" + (dir_ / "data" / "words.tsv").string() + " (default)"),
            std::string::npos);
}

TEST_F(HandlerSettings, EveryTypeIsRead) {
  const WordsConfig c = read(std::string(kDictionary) + R"(      buckets: 1024
      offset: -7
      load_factor: 0.5
      case_sensitive: true
      mode: prefix
      stop_words: [an, of, to]
      ports:
        - 11211
        - 6379
      greeting: "hi there"
)");
  EXPECT_EQ(c.buckets, 1024u);
  EXPECT_EQ(c.offset, -7);
  EXPECT_DOUBLE_EQ(c.load_factor, 0.5);
  EXPECT_TRUE(c.case_sensitive);
  EXPECT_EQ(c.mode, "prefix");
  EXPECT_EQ(c.stop_words, (std::vector<std::string>{"an", "of", "to"}));
  EXPECT_EQ(c.ports, (std::vector<uint32_t>{11211, 6379}));
  EXPECT_EQ(c.greeting, "hi there");
  expect_has(summary_, "stop_words=[an, of, to]");
  expect_has(summary_, "ports=[11211, 6379]");
}

TEST_F(HandlerSettings, RelativePathsStartAtTheConfigurationsDirectory) {
  EXPECT_EQ(read(kDictionary).dictionary, dir_ / "data" / "words.tsv");
  const std::string absolute = (dir_ / "data" / "words.tsv").string();
  EXPECT_EQ(read("    handler:\n      dictionary: " + absolute + "\n").dictionary, absolute);
}

TEST_F(HandlerSettings, APathThatIsNotAReadableFileIsRefusedAtItsLine) {
  const std::string e = error_of("    handler:\n      dictionary: data/nope.tsv\n");
  expect_starts_with(e, "agent.yaml:8:19: services[0].handler.dictionary: '");
  expect_has(e, (dir_ / "data" / "nope.tsv").string() + "' (from 'data/nope.tsv', relative to " +
                    dir_.string() + ") does not exist");
  expect_has(error_of("    handler:\n      dictionary: data\n"), "is a directory, not a file");
}

TEST_F(HandlerSettings, UnknownKeyIsRefusedAtItsLineNamingTheKnownOnes) {
  const std::string e = error_of(std::string(kDictionary) + "      bukets: 1024\n");
  expect_starts_with(e,
                     "agent.yaml:9:7: services[0].handler: unknown setting 'bukets' (known here: "
                     "dictionary, buckets, offset, load_factor, case_sensitive, mode, "
                     "stop_words, ports, greeting)");
}

TEST_F(HandlerSettings, AMisspeltKeyIsReportedBeforeTheRequiredSettingItMisses) {
  const std::string e = error_of("    handler:\n      dictonary: data/words.tsv\n");
  expect_starts_with(e, "agent.yaml:8:7: services[0].handler: unknown setting 'dictonary'");
}

TEST_F(HandlerSettings, AMissingRequiredSettingIsRefused) {
  expect_starts_with(error_of("    handler:\n      buckets: 64\n"),
                     "agent.yaml:8:7: services[0].handler: missing required setting 'dictionary'");
  // No mapping at all: at the service's entry.
  expect_starts_with(error_of(""),
                     "agent.yaml:5:5: services[0]: missing required handler setting "
                     "'dictionary' (give it under 'handler:', or with --set dictionary=VALUE)");
}

TEST_F(HandlerSettings, AValueOutOfItsRangeIsRefusedAtItsLine) {
  expect_starts_with(error_of(std::string(kDictionary) + "      buckets: 8\n"),
                     "agent.yaml:9:16: services[0].handler.buckets: 8 is out of range [16, "
                     "16777216]");
  expect_starts_with(error_of(std::string(kDictionary) + "      offset: -101\n"),
                     "agent.yaml:9:15: services[0].handler.offset: -101 is out of range [-100, "
                     "100]");
  expect_starts_with(error_of(std::string(kDictionary) + "      load_factor: 1.5\n"),
                     "agent.yaml:9:20: services[0].handler.load_factor: 1.5 is out of range [0.1, "
                     "1]");
  expect_starts_with(error_of(std::string(kDictionary) + "      ports: [80, 70000]\n"),
                     "agent.yaml:9:19: services[0].handler.ports[1]: 70000 is out of range [1, "
                     "65535]");
  expect_starts_with(error_of(std::string(kDictionary) + "      mode: fuzzy\n"),
                     "agent.yaml:9:13: services[0].handler.mode: 'fuzzy' is not one of: exact, "
                     "prefix");
}

TEST_F(HandlerSettings, AValueOfTheWrongTypeIsRefusedAtItsLine) {
  expect_starts_with(error_of(std::string(kDictionary) + "      buckets: many\n"),
                     "agent.yaml:9:16: services[0].handler.buckets: 'many' is not a non-negative "
                     "integer");
  expect_starts_with(error_of(std::string(kDictionary) + "      offset: 1.5\n"),
                     "agent.yaml:9:15: services[0].handler.offset: '1.5' is not an integer");
  expect_starts_with(error_of(std::string(kDictionary) + "      case_sensitive: maybe\n"),
                     "agent.yaml:9:23: services[0].handler.case_sensitive: 'maybe' is not a "
                     "boolean");
  expect_starts_with(error_of(std::string(kDictionary) + "      stop_words: the\n"),
                     "agent.yaml:9:19: services[0].handler.stop_words: expected a list");
  expect_starts_with(error_of(std::string(kDictionary) + "      greeting: [a, b]\n"),
                     "agent.yaml:9:17: services[0].handler.greeting: expected a single value");
  expect_starts_with(error_of("    handler: [dictionary]\n"),
                     "agent.yaml:7:14: services[0].handler: expected a mapping of the handler's "
                     "settings");
}

TEST_F(HandlerSettings, TheCommandLineOverridesTheFile) {
  const WordsConfig c = read(
      std::string(kDictionary) + "      buckets: 1024\n",
      {{"buckets", "64", "--set buckets=64"}, {"stop_words", "[x, y]", "--set stop_words=[x, y]"}});
  EXPECT_EQ(c.buckets, 64u);
  EXPECT_EQ(c.stop_words, (std::vector<std::string>{"x", "y"}));
  expect_starts_with(error_of(kDictionary, {{"buckets", "8", "--set buckets=8"}}),
                     "command line (--set buckets=8): buckets: 8 is out of range [16, 16777216]");
  expect_starts_with(error_of(kDictionary, {{"bukets", "8", "--set bukets=8"}}),
                     "command line (--set bukets=8): unknown handler setting 'bukets' (known "
                     "here: dictionary, buckets,");
}

// The plain and the flag forms of agent_main go through the same reader.
TEST_F(HandlerSettings, AHandlerWithoutSettingsRefusesAnyKey) {
  HandlerBackends none;
  const AgentConfig c = config_with("    handler:\n      rounds: 2\n");
  try {
    configure_services(c, none, {dir_, {}});
    FAIL() << "accepted";
  } catch (const config::ConfigError& e) {
    expect_starts_with(e.what(),
                       "agent.yaml:8:7: services[0].handler: unknown setting 'rounds' "
                       "(no settings are known here)");
  }
}

struct Rounds {
  uint32_t rounds = 0;
  void operator()(const accel::Request&, accel::Response& resp, accel::Context&) const {
    resp.size = rounds;
  }
};

TEST_F(HandlerSettings, HandlerFlagsAreSettingsOfEveryService) {
  EXPECT_EQ(flag_setting_name("--delay-us"), "delay_us");
  uint32_t rounds = 1;
  // What agent_main<H>(argc, argv, flags, make_handler) builds.
  HandlerBackends b = make_configured_backends<Rounds>([&rounds](Settings& s) {
    rounds = s.integer<uint32_t>("rounds", 1, 1, 64);
    return Rounds{rounds};
  });
  const AgentConfig c = parse_agent_config(config::load_yaml_text(R"(agent: words-1
server: 127.0.0.1:7100
secret: change-me-0123456789
services:
  - name: one
    max_message_bytes: 200
    handler: { rounds: 8 }
  - name: two
    max_message_bytes: 200
)",
                                                                  "agent.yaml"));
  const std::vector<std::string> summaries = configure_services(c, b, {dir_, {}});
  EXPECT_EQ(summaries, (std::vector<std::string>{"rounds=8", "rounds=1 (default)"}));
  EXPECT_EQ(std::any_cast<const Rounds&>(b.configured.at("one")).rounds, 8u);
  EXPECT_EQ(std::any_cast<const Rounds&>(b.configured.at("two")).rounds, 1u);
  // `--rounds 3` on the command line is an override of both.
  configure_services(c, b, {dir_, {{"rounds", "3", "--rounds 3"}}});
  EXPECT_EQ(std::any_cast<const Rounds&>(b.configured.at("one")).rounds, 3u);
  EXPECT_EQ(std::any_cast<const Rounds&>(b.configured.at("two")).rounds, 3u);
}

}  // namespace
}  // namespace caracal::agent
