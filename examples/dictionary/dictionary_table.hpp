// Building the dictionary's table on the host (host code only): what the setup step uploads,
// and what the tests check a Lookup against.
#pragma once

#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dictionary.hpp"

namespace caracal::examples::dictionary {

struct Table {
  std::vector<Bucket> buckets;  // a power of two of them
  std::vector<uint8_t> text;    // the words, the definitions and the not_found text
  uint32_t not_found_offset = 0;
  uint32_t not_found_bytes = 0;
  uint64_t entries = 0;
};

// Reads `word<TAB>definition` lines (empty lines and lines starting with # skipped) into a
// table of `buckets` slots, at most half full. Throws std::runtime_error naming `source`, the
// line and what is wrong.
inline Table build_table(std::istream& in, const std::string& source, uint32_t buckets,
                         bool case_sensitive, const std::string& not_found,
                         uint32_t max_definition_bytes) {
  Table t;
  t.buckets.assign(buckets, Bucket{0, 0, 0, 0});
  const auto append = [&t](const std::string& s) {
    const auto offset = static_cast<uint32_t>(t.text.size());
    t.text.insert(t.text.end(), s.begin(), s.end());
    return offset;
  };
  t.not_found_offset = append(not_found);
  t.not_found_bytes = static_cast<uint32_t>(not_found.size());
  std::string line;
  for (uint64_t number = 1; std::getline(in, line); ++number) {
    const std::string where = source + ":" + std::to_string(number) + ": ";
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.find('\t');
    if (tab == std::string::npos)
      throw std::runtime_error(where + "no tab between word and definition");
    const std::string word = line.substr(0, tab);
    const std::string definition = line.substr(tab + 1);
    if (word.empty() || word.size() > kMaxWordBytes) {
      throw std::runtime_error(where + "a word is 1-" + std::to_string(kMaxWordBytes) + " bytes");
    }
    if (definition.size() > max_definition_bytes) {
      throw std::runtime_error(where + "the definition of '" + word + "' is " +
                               std::to_string(definition.size()) + " bytes, more than a reply (" +
                               std::to_string(max_definition_bytes) + ")");
    }
    if (2 * (t.entries + 1) > buckets) {
      throw std::runtime_error(where + "more words than " + std::to_string(buckets) +
                               " buckets hold at most half full: raise the `buckets` setting");
    }
    const auto* w = reinterpret_cast<const uint8_t*>(word.data());
    const auto size = static_cast<uint32_t>(word.size());
    uint32_t at = word_hash(w, size, case_sensitive) & (buckets - 1);
    for (; t.buckets[at].key_bytes != 0; at = (at + 1) & (buckets - 1)) {
      const Bucket& b = t.buckets[at];
      if (b.key_bytes == size && same_word(t.text.data() + b.key_offset, w, size, case_sensitive)) {
        throw std::runtime_error(where + "'" + word + "' is defined twice");
      }
    }
    const uint32_t key = append(word);
    const uint32_t value = append(definition);
    t.buckets[at] = Bucket{key, size, value, static_cast<uint32_t>(definition.size())};
    ++t.entries;
  }
  if (in.bad()) throw std::runtime_error(source + ": read error");
  return t;
}

}  // namespace caracal::examples::dictionary
