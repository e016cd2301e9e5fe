// A minimal streaming JSON writer for benchmark reports: objects, arrays, strings, numbers and
// booleans, pretty-printed with two-space indentation. It tracks commas and nesting; it does not
// check that keys are used only inside objects.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace caracal::bench {

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  // An object or an array as the value of key `k`.
  void begin_object(std::string_view k) {
    key(k);
    begin_object();
  }
  void begin_array(std::string_view k) {
    key(k);
    begin_array();
  }

  // The key of the next value inside an object.
  void key(std::string_view k) {
    separate();
    write_string(k);
    out_ << ": ";
    after_key_ = true;
  }

  void value(std::string_view v) {
    separate();
    write_string(v);
  }
  void value(const char* v) { value(std::string_view(v)); }
  void value(const std::string& v) { value(std::string_view(v)); }
  void value(bool v) {
    separate();
    out_ << (v ? "true" : "false");
  }
  void value(uint64_t v) {
    separate();
    out_ << v;
  }
  void value(uint32_t v) { value(uint64_t{v}); }
  void value(int64_t v) {
    separate();
    out_ << v;
  }
  void value(int v) { value(int64_t{v}); }
  // Non-finite numbers have no JSON form; they are written as null.
  void value(double v) {
    separate();
    if (!std::isfinite(v)) {
      out_ << "null";
      return;
    }
    const auto flags = out_.flags();
    const auto precision = out_.precision();
    out_.precision(6);
    out_ << std::fixed << v;
    out_.flags(flags);
    out_.precision(precision);
  }
  void null() {
    separate();
    out_ << "null";
  }
  // A value that may be missing: null then.
  template <class T>
  void value(const std::optional<T>& v) {
    if (v) {
      value(*v);
    } else {
      null();
    }
  }

  template <class T>
  void field(std::string_view k, const T& v) {
    key(k);
    value(v);
  }
  // An array of every element of `range` under key `k`.
  template <class Range>
  void array(std::string_view k, const Range& range) {
    begin_array(k);
    for (const auto& v : range)
      value(v);
    end_array();
  }

 private:
  void open(char bracket) {
    separate();
    out_ << bracket;
    first_.push_back(true);
  }
  void close(char bracket) {
    const bool empty = first_.back();
    first_.pop_back();
    if (!empty) newline();
    out_ << bracket;
    if (first_.empty()) out_ << '\n';
  }
  // Writes the comma and line break that come before a value or key, unless the value follows
  // its key.
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) out_ << ',';
    first_.back() = false;
    newline();
  }
  void newline() {
    out_ << '\n';
    for (size_t i = 0; i < first_.size(); ++i)
      out_ << "  ";
  }
  void write_string(std::string_view s) {
    static const char* hex = "0123456789abcdef";
    out_ << '"';
    for (const char c : s) {
      switch (c) {
        case '"':
          out_ << "\\\"";
          break;
        case '\\':
          out_ << "\\\\";
          break;
        case '\n':
          out_ << "\\n";
          break;
        case '\r':
          out_ << "\\r";
          break;
        case '\t':
          out_ << "\\t";
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            out_ << "\\u00" << hex[(c >> 4) & 0xF] << hex[c & 0xF];
          } else {
            out_ << c;
          }
      }
    }
    out_ << '"';
  }

  std::ostream& out_;
  std::vector<bool> first_;  // per open container: nothing written in it yet
  bool after_key_ = false;
};

}  // namespace caracal::bench
