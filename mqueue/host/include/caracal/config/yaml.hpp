// Reading YAML configuration with errors a user can act on: every error names the file, the
// line and column, and the path of the offending key (`services[1].listeners[0].listen`).
// Unknown keys are errors too, so a typo never silently falls back to a default.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace caracal::config {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A node of a loaded document together with where it came from.
class Field {
 public:
  // A YAML::Node is a handle to a shared node (it has no move constructor): copied, not moved.
  Field(const YAML::Node& node, std::string path, std::shared_ptr<const std::string> file)
      : node_(node), path_(std::move(path)), file_(std::move(file)) {}

  // A value given outside a file (a command-line option): `text` parsed as YAML, its errors
  // reported as "ORIGIN: PATH: message", without a line and column.
  static Field from_text(const std::string& text, std::string path, const std::string& origin);

  // Throws ConfigError "FILE:LINE:COL: PATH: message".
  [[noreturn]] void fail(const std::string& message) const;

  const std::string& path() const { return path_; }
  const YAML::Node& node() const { return node_; }
  bool is_map() const { return node_.IsMap(); }

  // The value under `key` of this map; missing is an error naming the key.
  Field required(const std::string& key) const;
  std::optional<Field> optional(const std::string& key) const;
  // Refuses keys other than these (the error lists the ones it knows).
  void allow_only(std::initializer_list<const char*> keys) const;
  void allow_only(const std::vector<std::string>& keys) const;
  // The elements of a sequence (an error if this is not one).
  std::vector<Field> items() const;

  std::string as_string() const;
  bool as_bool() const;
  // An unsigned integer in [min, max].
  uint64_t as_uint(uint64_t min = 0, uint64_t max = UINT64_MAX) const;
  // A signed integer in [min, max].
  int64_t as_int(int64_t min = INT64_MIN, int64_t max = INT64_MAX) const;
  // A finite number (integer or decimal, with an optional exponent) in [min, max].
  double as_double(double min, double max) const;
  // One of the named choices.
  template <class E>
  E as_choice(std::initializer_list<std::pair<const char*, E>> choices) const {
    const std::string v = as_string();
    std::string known;
    for (const auto& [name, value] : choices) {
      if (v == name) return value;
      known += (known.empty() ? "" : ", ") + std::string(name);
    }
    fail("'" + v + "' is not one of: " + known);
  }

 private:
  void expect_map() const;

  YAML::Node node_;
  std::string path_;
  std::shared_ptr<const std::string> file_;
  bool positions_ = true;  // false: from_text, whose line and column mean nothing to a user
};

// Parses a file (or, for tests, text with a name to report) into its root Field. Syntax errors
// become ConfigError with the parser's line and column.
Field load_yaml_file(const std::string& path);
Field load_yaml_text(const std::string& text, const std::string& name);

// "host:port" or "[v6addr]:port"; port 0-65535 (0 asks the OS for one).
struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string str() const;
};
HostPort as_host_port(const Field& f);

}  // namespace caracal::config
