// The dictionary example's table (examples/dictionary): built on the host from its file, read
// by the Lookup view the workers copy; the file's errors name their line.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>

#include "dictionary.hpp"
#include "dictionary_table.hpp"

namespace caracal::examples::dictionary {
namespace {

struct Built {
  Table table;
  Counters counters{};
  Lookup view() {
    Lookup l;
    l.buckets = table.buckets.data();
    l.bucket_mask = static_cast<uint32_t>(table.buckets.size() - 1);
    l.text = table.text.data();
    l.not_found_offset = table.not_found_offset;
    l.not_found_bytes = table.not_found_bytes;
    l.case_sensitive = false;
    l.counters = &counters;
    return l;
  }
};

std::string ask(Lookup& lookup, const std::string& word) {
  std::byte out[64];
  accel::Request req{reinterpret_cast<const std::byte*>(word.data()),
                     static_cast<uint32_t>(word.size()), 0, 0};
  accel::Response resp{out, sizeof(out), 0, 0};
  accel::Context ctx;
  lookup(req, resp, ctx);
  const std::string text(reinterpret_cast<const char*>(out), resp.size);
  return (resp.flags & mqueue::kSlotError) != 0 ? "error: " + text : text;
}

std::string error_of(const std::string& text, uint32_t buckets = 16) {
  std::istringstream in(text);
  try {
    build_table(in, "words.tsv", buckets, false, "NOT_FOUND", 64);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(DictionaryTable, LookupsFoldCaseAndCountHitsAndMisses) {
  std::istringstream in("# comment\n\ncaracal\ta wild cat\nLynx\ta northern cat\n");
  Built b{build_table(in, "words.tsv", 16, false, "NOT_FOUND", 64)};
  EXPECT_EQ(b.table.entries, 2u);
  Lookup l = b.view();
  EXPECT_EQ(ask(l, "caracal"), "a wild cat");
  EXPECT_EQ(ask(l, "CARACAL"), "a wild cat");
  EXPECT_EQ(ask(l, "lynx"), "a northern cat");
  EXPECT_EQ(ask(l, "puma"), "NOT_FOUND");
  EXPECT_EQ(ask(l, ""), "error: a word is 1-64 bytes");
  EXPECT_EQ(b.counters.lookups, 4u);
  EXPECT_EQ(b.counters.misses, 1u);
}

TEST(DictionaryTable, FileErrorsNameTheirLine) {
  EXPECT_EQ(error_of("cat\tfeline\nno tab\n"), "words.tsv:2: no tab between word and definition");
  EXPECT_EQ(error_of("cat\tfeline\nCat\tagain\n"), "words.tsv:2: 'Cat' is defined twice");
  EXPECT_EQ(error_of(std::string(65, 'w') + "\tlong\n"), "words.tsv:1: a word is 1-64 bytes");
  EXPECT_EQ(error_of("cat\t" + std::string(65, 'd') + "\n"),
            "words.tsv:1: the definition of 'cat' is 65 bytes, more than a reply (64)");
  std::string many;
  for (int i = 0; i < 9; ++i)
    many += "w" + std::to_string(i) + "\tx\n";
  EXPECT_EQ(error_of(many),
            "words.tsv:9: more words than 16 buckets hold at most half full: raise the `buckets` "
            "setting");
}

}  // namespace
}  // namespace caracal::examples::dictionary
