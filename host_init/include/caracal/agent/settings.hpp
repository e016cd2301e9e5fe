// A handler's settings: what it reads from the `handler:` mapping of its service in the agent's
// configuration, or from the command line (`--set NAME=VALUE`, or one of the handler's own
// flags, which override the file for every service).
//
//   services:
//     - name: words
//       max_message_bytes: 256
//       handler:                     # the handler's settings, as it declares them
//         dictionary: words.tsv      # a path: relative to the configuration file's directory
//         buckets: 4096
//         case_sensitive: false
//         stop_words: [a, an, the]
//
// A handler reads them in its `configure` step (agent.hpp), one call per setting, and the call
// is the declaration: its type, its default (or kRequired) and its range:
//
//   static Config configure(caracal::agent::Settings& s) {
//     Config c;
//     c.dictionary = s.path("dictionary");                         // required, a readable file
//     c.buckets = s.integer<uint32_t>("buckets", 4096, 16, 1u << 24);
//     c.case_sensitive = s.boolean("case_sensitive", false);
//     c.stop_words = s.strings("stop_words", {});
//     return c;
//   }
//
// A value of the wrong type or out of its range is refused at once, at its line and column
// ("agent.yaml:14:18: services[0].handler.buckets: 8 is out of range [16, 16777216]"). After
// configure returns, the agent refuses every key of the mapping that configure did not read,
// naming the ones it did ("unknown setting 'bukets' (known here: dictionary, buckets, ...)"),
// and only then a required setting that is missing: a misspelt key is the likelier cause.
// configure runs for every service before anything is set up, under --check-config too, so it
// must only read and check: no files opened beyond what a path check does, no memory.
//
// Names are lower case words: a-z, 0-9 and _, starting with a letter.
#pragma once

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "caracal/config/yaml.hpp"

namespace caracal::agent {

// The "default" of a setting that has none: the configuration must give it.
inline constexpr std::nullopt_t kRequired = std::nullopt;

// What a path setting must name.
enum class PathKind : uint8_t {
  kFile,       // an existing regular file this process can read
  kDirectory,  // an existing directory
  kAny,        // anything, existing or not (a file the handler creates)
};

// A setting given on the command line; it overrides the configuration for every service.
struct SettingOverride {
  std::string name;    // the setting's name
  std::string text;    // its value, read as YAML: 4, true, /srv/words, [a, b]
  std::string origin;  // as the command line said it, for errors: "--set rows=4", "--rounds 4"
};

// Where one service's settings come from.
struct SettingsSource {
  std::string service;                   // the service's name, for messages
  std::optional<config::Field> mapping;  // its `handler:` mapping; none: nothing in the file
  std::optional<config::Field> entry;    // its entry in `services`, where errors point without one
  std::filesystem::path base_dir;        // where relative paths start: the file's directory
  std::vector<SettingOverride> overrides;
};

class Settings {
 public:
  explicit Settings(SettingsSource source);

  const std::string& service() const { return source_.service; }

  std::string string(const std::string& name, std::optional<std::string> fallback = kRequired);
  // One of `choices`.
  std::string choice(const std::string& name, std::optional<std::string> fallback,
                     const std::vector<std::string>& choices);
  bool boolean(const std::string& name, std::optional<bool> fallback = kRequired);
  // An integer in [min, max]; T is deduced from min and max, or named: integer<uint32_t>(...).
  template <std::integral T>
  T integer(const std::string& name, std::type_identity_t<std::optional<T>> fallback,
            T min = std::numeric_limits<T>::min(), T max = std::numeric_limits<T>::max()) {
    const std::optional<config::Field> f = declare(name, "integer", fallback_text(fallback));
    if (!f) return fallback.value_or(min);
    const T v = read_integer<T>(*f, min, max);
    shown(name, std::to_string(v));
    return v;
  }
  // A number in [min, max] (YAML's integers and decimals: 3, 0.25, 1e-3).
  double number(const std::string& name, std::optional<double> fallback, double min, double max);
  // A path, made absolute (relative ones start at the configuration file's directory) and
  // checked as `kind` says.
  std::filesystem::path path(const std::string& name,
                             std::optional<std::filesystem::path> fallback = kRequired,
                             PathKind kind = PathKind::kFile);
  // A list of strings: `[a, b]` or one item a line. A single value is not a list.
  std::vector<std::string> strings(const std::string& name,
                                   std::optional<std::vector<std::string>> fallback = kRequired);
  // A list of integers, each in [min, max].
  template <std::integral T>
  std::vector<T> integers(const std::string& name,
                          std::type_identity_t<std::optional<std::vector<T>>> fallback,
                          T min = std::numeric_limits<T>::min(),
                          T max = std::numeric_limits<T>::max()) {
    const std::optional<config::Field> f = declare(
        name, "list", fallback ? std::optional<std::string>(list_text(*fallback)) : std::nullopt);
    if (!f) return fallback.value_or(std::vector<T>{});
    std::vector<T> out;
    for (const config::Field& item : f->items())
      out.push_back(read_integer<T>(item, min, max));
    shown(name, list_text(out));
    return out;
  }

  // Refuses the configuration at the setting `name` (or, where it was not given, at the
  // service's settings): for a check across settings ("buckets must be at least ...").
  [[noreturn]] void fail(const std::string& name, const std::string& message) const;

  // After configure: refuses keys of the mapping and overrides that no call read, then a
  // required setting that is missing. Throws config::ConfigError.
  void finish() const;

  // The names read so far, in order (each may be read once).
  std::vector<std::string> declared() const;
  // What each setting came to, for the log: "buckets=4096 (default), dictionary=/srv/words".
  std::string summary() const;

 private:
  struct Declared {
    std::string name;
    std::string type;
    std::string shown;  // the value, as the summary shows it
    bool from_default = false;
  };

  // Records `name` as a setting of `type` and finds its value: an override, else the
  // mapping's key; none: the fallback applies (`fallback_shown`), or it is required.
  std::optional<config::Field> declare(const std::string& name, const std::string& type,
                                       const std::optional<std::string>& fallback_shown);
  void shown(const std::string& name, std::string value);

  template <std::integral T>
  static T read_integer(const config::Field& f, T min, T max) {
    if constexpr (std::is_unsigned_v<T>) {
      return static_cast<T>(f.as_uint(min, max));
    } else {
      return static_cast<T>(f.as_int(min, max));
    }
  }
  template <class T>
  static std::string list_text(const std::vector<T>& items) {
    std::string out;
    for (const T& v : items) {
      if (!out.empty()) out += ", ";
      if constexpr (std::is_arithmetic_v<T>) {
        out += std::to_string(v);
      } else {
        out += v;
      }
    }
    return "[" + out + "]";
  }
  template <class T>
  static std::optional<std::string> fallback_text(const std::optional<T>& v) {
    if (!v) return std::nullopt;
    if constexpr (std::is_same_v<T, bool>) {
      return *v ? "true" : "false";
    } else if constexpr (std::is_arithmetic_v<T>) {
      return std::to_string(*v);
    } else {
      return std::string(*v);
    }
  }

  SettingsSource source_;
  std::vector<Declared> declared_;
  bool last_from_command_line_ = false;  // the value declare() found came from an override
  std::string first_missing_;            // the first required setting that was not given
};

}  // namespace caracal::agent
