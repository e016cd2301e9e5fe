#include "framing.hpp"

#include <algorithm>
#include <charconv>
#include <string_view>

namespace caracal::server {
namespace {

uint64_t read_prefix(const std::byte* p, uint32_t width, ByteOrder order) {
  uint64_t v = 0;
  for (uint32_t i = 0; i < width; ++i) {
    const uint32_t k = order == ByteOrder::kBig ? i : width - 1 - i;
    v = (v << 8) | std::to_integer<uint64_t>(p[k]);
  }
  return v;
}

uint64_t prefix_limit(uint32_t width) {
  return width >= 8 ? UINT64_MAX : (uint64_t{1} << (8 * width)) - 1;
}

// ---- memcached text and meta protocol replies -------------------------------------------------

// A reply line for an error message: at most 64 bytes, non-printable bytes as \xNN.
std::string quoted(std::string_view line) {
  static constexpr size_t kShown = 64;
  std::string out = "'";
  for (size_t i = 0; i < line.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (line.size() > kShown) out += "...";
  return out + "'";
}

// Splits off the first space-separated token.
std::string_view next_token(std::string_view& rest) {
  const size_t sp = rest.find(' ');
  const std::string_view token = rest.substr(0, sp);
  rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
  return token;
}

bool parse_decimal(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
  }
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool is_visible(char c) {
  return c > 0x20 && c < 0x7f;
}

// A memcached key: 1 to 250 bytes, no spaces or control characters.
bool valid_key(std::string_view k) {
  if (k.empty() || k.size() > 250) return false;
  for (const char c : k) {
    if (!is_visible(c)) return false;
  }
  return true;
}

// Meta protocol return flags: each a letter followed by visible bytes (`c123`, `Oabc`, `k`).
bool valid_meta_flags(std::string_view rest) {
  while (!rest.empty()) {
    const std::string_view flag = next_token(rest);
    if (flag.empty()) return false;
    if (!((flag[0] >= 'a' && flag[0] <= 'z') || (flag[0] >= 'A' && flag[0] <= 'Z'))) return false;
    for (const char c : flag) {
      if (!is_visible(c)) return false;
    }
  }
  return true;
}

// Whether `line` (no \r\n) is a complete reply of one line.
bool single_line_reply(std::string_view line) {
  std::string_view rest = line;
  const std::string_view word = next_token(rest);
  const bool bare = line.size() == word.size();
  if (word == "STORED" || word == "NOT_STORED" || word == "EXISTS" || word == "NOT_FOUND" ||
      word == "DELETED" || word == "TOUCHED" || word == "OK" || word == "END" || word == "RESET" ||
      word == "EN" || word == "MN") {
    return bare;
  }
  if (word == "ERROR" || word == "CLIENT_ERROR" || word == "SERVER_ERROR") return true;
  if (word == "VERSION" || word == "ME") return !bare && !rest.empty();
  if (word == "HD" || word == "NF" || word == "NS" || word == "EX") {
    return bare || (!rest.empty() && line.back() != ' ' && valid_meta_flags(rest));
  }
  uint64_t number = 0;  // the new value after incr/decr
  return bare && parse_decimal(word, &number);
}

// One whole reply at the start of `all`: a single line; `VA <size> <flags>*` and its data
// block; `STAT` lines up to END; or `VALUE <key> <flags> <bytes> [<cas>]` blocks up to END.
Decoded decode_memcached(std::string_view all, uint64_t max) {
  Decoded d;
  const auto malformed = [&d](std::string why) {
    d.status = DecodeStatus::kMalformed;
    d.error = "memcached reply: " + std::move(why);
    return d;
  };
  const auto too_long = [&]() {
    return malformed("longer than max_message_bytes " + std::to_string(max));
  };
  const auto message = [&d](size_t end) {
    d.status = DecodeStatus::kMessage;
    d.payload_offset = 0;
    d.payload_bytes = end;
    d.consumed = end;
    return d;
  };
  // Everything buffered belongs to the unfinished reply, so it is too long once that is.
  const auto need_more = [&]() { return all.size() > max ? too_long() : d; };

  enum class Within : uint8_t { kStart, kValues, kStats } within = Within::kStart;
  size_t pos = 0;
  for (;;) {
    const size_t nl = all.find('\n', pos);
    if (nl == std::string_view::npos) return need_more();
    if (nl == pos || all[nl - 1] != '\r') {
      return malformed("line at byte " + std::to_string(pos) +
                       " ends in \\n without \\r: " + quoted(all.substr(pos, nl - pos)));
    }
    const std::string_view line = all.substr(pos, nl - 1 - pos);
    const size_t next = nl + 1;
    if (next > max) return too_long();
    std::string_view rest = line;
    const std::string_view word = next_token(rest);

    if ((word == "VALUE" && within != Within::kStats) ||
        (word == "VA" && within == Within::kStart)) {
      uint64_t size = 0;
      if (word == "VALUE") {
        const std::string_view key = next_token(rest);
        const std::string_view flags = next_token(rest);
        const std::string_view bytes = next_token(rest);
        const std::string_view cas = next_token(rest);
        uint64_t number = 0;
        if (!valid_key(key) || !parse_decimal(flags, &number) || number > UINT32_MAX ||
            !parse_decimal(bytes, &size) || (!cas.empty() && !parse_decimal(cas, &number)) ||
            !rest.empty() || line.back() == ' ') {
          return malformed("bad VALUE line " + quoted(line) +
                           " (want VALUE <key> <flags> <bytes> [<cas>])");
        }
      } else if (!parse_decimal(next_token(rest), &size) || !valid_meta_flags(rest) ||
                 line.back() == ' ') {
        return malformed("bad VA line " + quoted(line) + " (want VA <size> <flags>*)");
      }
      if (size > max || next + size + 2 > max) {
        return malformed(quoted(line) + " announces " + std::to_string(size) +
                         " data bytes; the reply would be longer than max_message_bytes " +
                         std::to_string(max));
      }
      const size_t end = next + size + 2;
      if (all.size() < end) return need_more();
      if (all.substr(end - 2, 2) != "\r\n") {
        return malformed("the " + std::to_string(size) + "-byte data block after " + quoted(line) +
                         " is followed by " + quoted(all.substr(end - 2, 2)) + ", not \\r\\n");
      }
      if (word == "VA") return message(end);
      within = Within::kValues;
      pos = end;
      continue;
    }
    if (line == "END") return message(next);
    if (word == "STAT" && within != Within::kValues) {
      if (rest.empty()) return malformed("bad STAT line " + quoted(line));
      within = Within::kStats;
      pos = next;
      continue;
    }
    if (within == Within::kValues) {
      return malformed("expected VALUE or END after a data block, got " + quoted(line));
    }
    if (within == Within::kStats) return malformed("expected STAT or END, got " + quoted(line));
    if (single_line_reply(line)) return message(next);
    return malformed("unknown reply line " + quoted(line));
  }
}

}  // namespace

Result<Codec> Codec::make(const FramingConfig& c) {
  if (c.max_message_bytes == 0) {
    return invalid_argument("framing: max_message_bytes must be at least 1");
  }
  switch (c.kind) {
    case FramingKind::kFixed:
      if (c.fixed_bytes == 0 || c.fixed_bytes > c.max_message_bytes) {
        return invalid_argument("framing: fixed size " + std::to_string(c.fixed_bytes) +
                                " must be between 1 and max_message_bytes (" +
                                std::to_string(c.max_message_bytes) + ")");
      }
      break;
    case FramingKind::kLengthPrefixed:
      if (c.prefix_bytes != 1 && c.prefix_bytes != 2 && c.prefix_bytes != 4 &&
          c.prefix_bytes != 8) {
        return invalid_argument("framing: length prefix of " + std::to_string(c.prefix_bytes) +
                                " bytes; must be 1, 2, 4 or 8");
      }
      break;
    case FramingKind::kLine:
      if (c.delimiter.empty()) return invalid_argument("framing: line delimiter is empty");
      break;
    case FramingKind::kMemcached:
      break;
  }
  return Codec(c);
}

Decoded Codec::decode_at_end(std::span<const std::byte> buf) const {
  Decoded d = decode(buf);
  if (d.status == DecodeStatus::kNeedMore && config_.kind == FramingKind::kLine && !buf.empty() &&
      buf.size() <= config_.max_message_bytes) {
    d.status = DecodeStatus::kMessage;
    d.payload_offset = 0;
    d.payload_bytes = buf.size();
    d.consumed = buf.size();
  }
  return d;
}

LineSkip Codec::skip_line(std::span<const std::byte> buf) const {
  const std::string_view text(reinterpret_cast<const char*>(buf.data()), buf.size());
  const std::string& delimiter = config_.delimiter;
  if (const size_t end = text.find(delimiter); end != std::string_view::npos) {
    return {end + delimiter.size(), true};
  }
  // The last delimiter.size() - 1 bytes may be the start of a delimiter the next read ends.
  return {buf.size() - std::min(buf.size(), delimiter.size() - 1), false};
}

Decoded Codec::decode(std::span<const std::byte> buf) const {
  Decoded d;
  const FramingConfig& c = config_;
  switch (c.kind) {
    case FramingKind::kFixed:
      if (buf.size() >= c.fixed_bytes) {
        d.status = DecodeStatus::kMessage;
        d.payload_offset = 0;
        d.payload_bytes = c.fixed_bytes;
        d.consumed = c.fixed_bytes;
      }
      return d;

    case FramingKind::kLengthPrefixed: {
      if (buf.size() < c.prefix_bytes) return d;
      uint64_t length = read_prefix(buf.data(), c.prefix_bytes, c.byte_order);
      if (c.prefix_counts_itself) {
        if (length < c.prefix_bytes) {
          d.status = DecodeStatus::kMalformed;
          d.error = "length prefix " + std::to_string(length) + " is smaller than the " +
                    std::to_string(c.prefix_bytes) + "-byte prefix it includes";
          return d;
        }
        length -= c.prefix_bytes;
      }
      if (length > c.max_message_bytes) {
        d.status = DecodeStatus::kMalformed;
        d.error = "length prefix announces " + std::to_string(length) +
                  " bytes, over max_message_bytes " + std::to_string(c.max_message_bytes);
        return d;
      }
      if (buf.size() - c.prefix_bytes < length) return d;
      d.status = DecodeStatus::kMessage;
      d.payload_offset = c.prefix_bytes;
      d.payload_bytes = length;
      d.consumed = c.prefix_bytes + length;
      return d;
    }

    case FramingKind::kLine: {
      const std::string_view text(reinterpret_cast<const char*>(buf.data()), buf.size());
      const size_t end = text.find(c.delimiter);
      if (end == std::string_view::npos) {
        // No delimiter yet: malformed once more than a whole message (and a partial delimiter)
        // is buffered without one.
        if (buf.size() > c.max_message_bytes + c.delimiter.size() - 1) {
          d.status = DecodeStatus::kMalformed;
          d.error =
              "no line delimiter within max_message_bytes " + std::to_string(c.max_message_bytes);
          d.skippable = true;
          d.consumed = skip_line(buf).consumed;  // at least one byte: buf holds a delimiter's
        }
        return d;
      }
      if (end > c.max_message_bytes) {
        d.status = DecodeStatus::kMalformed;
        d.error = "line of " + std::to_string(end) + " bytes, over max_message_bytes " +
                  std::to_string(c.max_message_bytes);
        d.skippable = true;
        d.line_ended = true;
        d.consumed = end + c.delimiter.size();
        return d;
      }
      d.status = DecodeStatus::kMessage;
      d.payload_offset = 0;
      d.payload_bytes = end;
      d.consumed = end + c.delimiter.size();
      return d;
    }

    case FramingKind::kMemcached:
      return decode_memcached(
          std::string_view(reinterpret_cast<const char*>(buf.data()), buf.size()),
          c.max_message_bytes);
  }
  return d;
}

size_t Codec::encode_header(uint64_t payload_bytes, std::byte* out) const {
  if (config_.kind != FramingKind::kLengthPrefixed) return 0;
  const uint32_t width = config_.prefix_bytes;
  const uint64_t v = payload_bytes + (config_.prefix_counts_itself ? width : 0);
  for (uint32_t i = 0; i < width; ++i) {
    const uint32_t shift = 8 * (width - 1 - i);
    const uint32_t k = config_.byte_order == ByteOrder::kBig ? i : width - 1 - i;
    out[k] = static_cast<std::byte>((v >> shift) & 0xFF);
  }
  return width;
}

std::span<const std::byte> Codec::trailer() const {
  if (config_.kind != FramingKind::kLine) return {};
  return std::as_bytes(std::span<const char>(config_.delimiter.data(), config_.delimiter.size()));
}

bool Codec::can_frame(uint64_t payload_bytes) const {
  switch (config_.kind) {
    case FramingKind::kFixed:
      return payload_bytes == config_.fixed_bytes;
    case FramingKind::kLengthPrefixed:
      return payload_bytes + (config_.prefix_counts_itself ? config_.prefix_bytes : 0) <=
             prefix_limit(config_.prefix_bytes);
    case FramingKind::kLine:
    case FramingKind::kMemcached:
      return true;
  }
  return false;
}

void Codec::append_framed(std::string& out, std::string_view payload) const {
  std::byte header[header_capacity()];
  const size_t n = encode_header(payload.size(), header);
  out.append(reinterpret_cast<const char*>(header), n);
  out.append(payload);
  const std::span<const std::byte> t = trailer();
  out.append(reinterpret_cast<const char*>(t.data()), t.size());
}

}  // namespace caracal::server
