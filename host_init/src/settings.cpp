#include "caracal/agent/settings.hpp"

#include <unistd.h>

#include <algorithm>
#include <stdexcept>
#include <system_error>

namespace caracal::agent {
namespace {

bool is_setting_name(const std::string& name) {
  if (name.empty() || name.size() > 64 || name[0] < 'a' || name[0] > 'z') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

Settings::Settings(SettingsSource source) : source_(std::move(source)) {
  if (source_.mapping && !source_.mapping->is_map()) {
    source_.mapping->fail("expected a mapping of the handler's settings (name: value)");
  }
}

std::optional<config::Field> Settings::declare(const std::string& name, const std::string& type,
                                               const std::optional<std::string>& fallback_shown) {
  // A bad name or a name read twice as different types is the handler's bug, not the user's.
  if (!is_setting_name(name)) {
    throw std::logic_error("handler setting name '" + name +
                           "' is not a lower-case word (a-z, 0-9, _; a letter first)");
  }
  for (const Declared& d : declared_) {
    if (d.name == name) throw std::logic_error("handler setting '" + name + "' read twice");
  }
  declared_.push_back(Declared{name, type, fallback_shown.value_or(""), true});
  last_from_command_line_ = false;
  // The last override of a name wins, as on any command line.
  for (auto o = source_.overrides.rbegin(); o != source_.overrides.rend(); ++o) {
    if (o->name == name) {
      declared_.back().from_default = false;
      last_from_command_line_ = true;
      return config::Field::from_text(o->text, name, "command line (" + o->origin + ")");
    }
  }
  if (source_.mapping) {
    if (std::optional<config::Field> f = source_.mapping->optional(name)) {
      declared_.back().from_default = false;
      return f;
    }
  }
  if (!fallback_shown && first_missing_.empty()) first_missing_ = name;
  return std::nullopt;
}

void Settings::shown(const std::string& name, std::string value) {
  for (Declared& d : declared_) {
    if (d.name == name) {
      d.shown = std::move(value);
      return;
    }
  }
}

std::string Settings::string(const std::string& name, std::optional<std::string> fallback) {
  const std::optional<config::Field> f = declare(name, "string", fallback);
  if (!f) return std::move(fallback).value_or("");
  std::string v = f->as_string();
  shown(name, v);
  return v;
}

std::string Settings::choice(const std::string& name, std::optional<std::string> fallback,
                             const std::vector<std::string>& choices) {
  const std::optional<config::Field> f = declare(name, "string", fallback);
  if (!f) return std::move(fallback).value_or("");
  std::string v = f->as_string();
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
    f->fail("'" + v + "' is not one of: " + joined(choices));
  }
  shown(name, v);
  return v;
}

bool Settings::boolean(const std::string& name, std::optional<bool> fallback) {
  const std::optional<config::Field> f = declare(name, "boolean", fallback_text(fallback));
  if (!f) return fallback.value_or(false);
  const bool v = f->as_bool();
  shown(name, v ? "true" : "false");
  return v;
}

double Settings::number(const std::string& name, std::optional<double> fallback, double min,
                        double max) {
  const std::optional<config::Field> f = declare(name, "number", fallback_text(fallback));
  if (!f) return fallback.value_or(min);
  const double v = f->as_double(min, max);
  shown(name, f->as_string());
  return v;
}

std::filesystem::path Settings::path(const std::string& name,
                                     std::optional<std::filesystem::path> fallback, PathKind kind) {
  namespace fs = std::filesystem;
  const std::optional<config::Field> f =
      declare(name, "path", fallback ? std::optional<std::string>(fallback->string()) : kRequired);
  if (!f && !fallback) return {};
  const fs::path given = f ? fs::path(f->as_string()) : *fallback;
  if (given.empty()) {
    if (f) f->fail("the path is empty");
    fail(name, "the default path is empty");
  }
  // Relative paths from the file start at its directory (as an include would), those from the
  // command line at the working directory.
  const bool from_file = f && !last_from_command_line_;
  const fs::path p =
      given.is_absolute() ? given : ((from_file ? source_.base_dir : fs::current_path()) / given);
  fs::path resolved = p.lexically_normal();
  shown(name, resolved.string());
  const auto refuse = [&](const std::string& why) {
    const std::string where =
        given.is_absolute()
            ? ""
            : " (from '" + given.string() + "', relative to " +
                  (from_file ? source_.base_dir.string() : "the working directory") + ")";
    if (f) f->fail("'" + resolved.string() + "'" + where + " " + why);
    fail(name, "the default '" + resolved.string() + "' " + why);
  };
  if (kind == PathKind::kAny) return resolved;
  std::error_code ec;
  const fs::file_status st = fs::status(resolved, ec);
  if (ec || !fs::exists(st)) refuse("does not exist");
  if (kind == PathKind::kFile) {
    if (fs::is_directory(st)) refuse("is a directory, not a file");
    if (::access(resolved.c_str(), R_OK) != 0) {
      refuse("cannot be read by this process (uid " + std::to_string(::getuid()) + ")");
    }
  } else if (!fs::is_directory(st)) {
    refuse("is not a directory");
  }
  return resolved;
}

std::vector<std::string> Settings::strings(const std::string& name,
                                           std::optional<std::vector<std::string>> fallback) {
  const std::optional<config::Field> f = declare(
      name, "list", fallback ? std::optional<std::string>(list_text(*fallback)) : kRequired);
  if (!f) return fallback.value_or(std::vector<std::string>{});
  std::vector<std::string> out;
  for (const config::Field& item : f->items())
    out.push_back(item.as_string());
  shown(name, list_text(out));
  return out;
}

void Settings::fail(const std::string& name, const std::string& message) const {
  for (auto o = source_.overrides.rbegin(); o != source_.overrides.rend(); ++o) {
    if (o->name == name) {
      throw config::ConfigError("command line (" + o->origin + "): " + name + ": " + message);
    }
  }
  if (source_.mapping) {
    if (std::optional<config::Field> f = source_.mapping->optional(name)) f->fail(message);
    source_.mapping->fail(name + ": " + message);
  }
  if (source_.entry) source_.entry->fail("handler." + name + ": " + message);
  throw config::ConfigError("service '" + source_.service + "': handler setting '" + name +
                            "': " + message);
}

void Settings::finish() const {
  const std::vector<std::string> names = declared();
  if (source_.mapping) source_.mapping->allow_only(names);
  for (const SettingOverride& o : source_.overrides) {
    if (std::find(names.begin(), names.end(), o.name) == names.end()) {
      throw config::ConfigError("command line (" + o.origin + "): unknown handler setting '" +
                                o.name + "' (" +
                                (names.empty() ? std::string("this handler declares no settings")
                                               : "known here: " + joined(names)) +
                                ")");
    }
  }
  if (first_missing_.empty()) return;
  if (source_.mapping) source_.mapping->fail("missing required setting '" + first_missing_ + "'");
  const std::string what = "missing required handler setting '" + first_missing_ +
                           "' (give it under 'handler:', or with --set " + first_missing_ +
                           "=VALUE)";
  if (source_.entry) source_.entry->fail(what);
  throw config::ConfigError("service '" + source_.service + "': " + what);
}

std::vector<std::string> Settings::declared() const {
  std::vector<std::string> names;
  for (const Declared& d : declared_)
    names.push_back(d.name);
  return names;
}

std::string Settings::summary() const {
  std::string out;
  for (const Declared& d : declared_) {
    if (!out.empty()) out += ", ";
    out += d.name + "=" + d.shown + (d.from_default ? " (default)" : "");
  }
  return out.empty() ? "none" : out;
}

}  // namespace caracal::agent
