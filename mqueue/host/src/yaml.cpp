#include "caracal/config/yaml.hpp"

#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

namespace caracal::config {
namespace {

std::string where(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null()) return file;
  return file + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

Field load(const std::string& text, const std::string& name) {
  auto file = std::make_shared<const std::string>(name);
  try {
    YAML::Node root = YAML::Load(text);
    Field f(root, "", file);
    if (!root.IsMap()) {
      throw ConfigError(name + ": expected a mapping of settings at the top level");
    }
    return f;
  } catch (const YAML::ParserException& ex) {
    throw ConfigError(where(name, ex.mark) + ": YAML syntax: " + ex.msg);
  }
}

}  // namespace

Field Field::from_text(const std::string& text, std::string path, const std::string& origin) {
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::ParserException& ex) {
    throw ConfigError(origin + ": " + path + ": YAML syntax: " + ex.msg);
  }
  Field f(node, std::move(path), std::make_shared<const std::string>(origin));
  f.positions_ = false;
  return f;
}

void Field::fail(const std::string& message) const {
  std::string prefix = positions_ ? where(*file_, node_.Mark()) : *file_;
  if (!path_.empty()) prefix += ": " + path_;
  throw ConfigError(prefix + ": " + message);
}

void Field::expect_map() const {
  if (!node_.IsMap()) fail("expected a mapping of settings");
}

Field Field::required(const std::string& key) const {
  std::optional<Field> f = optional(key);
  if (!f) fail("missing required setting '" + key + "'");
  return *f;
}

std::optional<Field> Field::optional(const std::string& key) const {
  expect_map();
  YAML::Node child = node_[key];
  if (!child.IsDefined() || child.IsNull()) return std::nullopt;
  Field out(child, path_.empty() ? key : path_ + "." + key, file_);
  out.positions_ = positions_;
  return out;
}

void Field::allow_only(std::initializer_list<const char*> keys) const {
  allow_only(std::vector<std::string>(keys.begin(), keys.end()));
}

void Field::allow_only(const std::vector<std::string>& keys) const {
  expect_map();
  for (const auto& kv : node_) {
    // A key is a name; YAML also allows a list or a mapping as one ("? [a, b]: ..."), which
    // names no setting.
    if (!kv.first.IsScalar()) {
      Field(kv.first, path_, file_)
          .fail("a setting's name must be a single word, not a list or a mapping");
    }
    const std::string k = kv.first.as<std::string>();
    bool known = false;
    for (const std::string& allowed : keys)
      known = known || k == allowed;
    if (!known) {
      std::string list;
      for (const std::string& allowed : keys) {
        if (!list.empty()) list += ", ";
        list += allowed;
      }
      Field key(kv.first, path_, file_);
      key.positions_ = positions_;
      key.fail("unknown setting '" + k + "' (" +
               (list.empty() ? std::string("no settings are known here") : "known here: " + list) +
               ")");
    }
  }
}

std::vector<Field> Field::items() const {
  if (!node_.IsSequence()) fail("expected a list");
  std::vector<Field> out;
  for (size_t i = 0; i < node_.size(); ++i) {
    out.emplace_back(node_[i], path_ + "[" + std::to_string(i) + "]", file_);
    out.back().positions_ = positions_;
  }
  return out;
}

std::string Field::as_string() const {
  if (!node_.IsScalar()) fail("expected a single value");
  return node_.Scalar();
}

bool Field::as_bool() const {
  const std::string v = as_string();
  if (v == "true" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "no" || v == "off") return false;
  fail("'" + v + "' is not a boolean (true or false)");
}

uint64_t Field::as_uint(uint64_t min, uint64_t max) const {
  const std::string v = as_string();
  uint64_t out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size()) {
    fail("'" + v + "' is not a non-negative integer");
  }
  if (out < min || out > max) {
    fail(v + " is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return out;
}

int64_t Field::as_int(int64_t min, int64_t max) const {
  const std::string v = as_string();
  int64_t out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec == std::errc::result_out_of_range) {
    fail(v + " is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  if (ec != std::errc() || end != v.data() + v.size()) fail("'" + v + "' is not an integer");
  if (out < min || out > max) {
    fail(v + " is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return out;
}

double Field::as_double(double min, double max) const {
  const std::string v = as_string();
  double out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(out)) {
    fail("'" + v + "' is not a number");
  }
  if (out < min || out > max) {
    std::ostringstream range;
    range << "[" << min << ", " << max << "]";
    fail(v + " is out of range " + range.str());
  }
  return out;
}

Field load_yaml_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the configuration file");
  std::ostringstream text;
  text << in.rdbuf();
  return load(text.str(), path);
}

Field load_yaml_text(const std::string& text, const std::string& name) {
  return load(text, name);
}

std::string HostPort::str() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

HostPort as_host_port(const Field& f) {
  const std::string v = f.as_string();
  HostPort hp;
  std::string port;
  if (!v.empty() && v.front() == '[') {
    const size_t close = v.find(']');
    if (close == std::string::npos || close + 1 >= v.size() || v[close + 1] != ':') {
      f.fail("'" + v + "' is not [address]:port");
    }
    hp.host = v.substr(1, close - 1);
    port = v.substr(close + 2);
  } else {
    const size_t colon = v.rfind(':');
    if (colon == std::string::npos || v.find(':') != colon) {
      f.fail("'" + v + "' is not host:port (write IPv6 addresses as [address]:port)");
    }
    hp.host = v.substr(0, colon);
    port = v.substr(colon + 1);
  }
  if (hp.host.empty()) f.fail("'" + v + "' has no host");
  uint64_t p = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p > 65535) {
    f.fail("'" + v + "' has no valid port (0-65535)");
  }
  hp.port = static_cast<uint16_t>(p);
  return hp;
}

}  // namespace caracal::config
