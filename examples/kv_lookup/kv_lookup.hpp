// The key-lookup handler: a client sends a key; the handler asks memcached for it through
// client queue 0 (the server holds the connection; the handler never sees a socket) and
// answers with the value, or with NOT_FOUND.
//
// Host/device code: the same handler runs on the CPU and as a GPU kernel (one thread per call;
// the call waits in device code while the SmartNIC talks to memcached).
//
// The request is the key alone (memcached's rules: 1 to 250 bytes, no spaces or control
// characters). The reply is the value's bytes, or the text NOT_FOUND; a bad key or a failed
// call is an error reply (kSlotError) with the reason.
#pragma once

#include <cstdint>

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/client.hpp"
#include "caracal/accel/handler.hpp"

namespace caracal::examples {

struct KeyLookup {
  static constexpr uint32_t kMaxKeyBytes = 250;

  CARACAL_HOST_DEVICE void operator()(const accel::Request& req, accel::Response& resp,
                                      accel::Context& ctx) {
    if (req.size == 0 || req.size > kMaxKeyBytes) return resp.set_error("key must be 1-250 bytes");
    for (uint32_t i = 0; i < req.size; ++i) {
      const auto c = static_cast<unsigned char>(req.data[i]);
      if (c <= ' ' || c == 0x7F) return resp.set_error("key has a space or control character");
    }
    if (ctx.client_count() == 0) return resp.set_error("no client queue for memcached");
    // "get <key>\r\n"
    char command[4 + kMaxKeyBytes + 2];
    accel::copy_bytes(command, "get ", 4);
    accel::copy_bytes(command + 4, req.data, req.size);
    accel::copy_bytes(command + 4 + req.size, "\r\n", 2);
    const uint32_t command_bytes = 4 + req.size + 2;

    // The memcached response lands in the response buffer and is trimmed to the value there.
    const accel::CallResult r =
        ctx.client(0).call(++calls_, command, command_bytes, resp.data, resp.capacity);
    switch (r.status) {
      case accel::CallStatus::kOk:
        break;
      case accel::CallStatus::kRemoteError:
        return resp.set_error("memcached call failed");
      case accel::CallStatus::kReplyTooLarge:
        return resp.set_error("value larger than the reply can carry");
      default:
        return resp.set_error("memcached call did not complete");
    }
    const char* text = reinterpret_cast<const char*>(resp.data);
    if (r.length == 5 && accel::equal_bytes(text, "END\r\n", 5)) {
      accel::copy_bytes(resp.data, "NOT_FOUND", 9);
      resp.size = 9;
      return;
    }
    // VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n
    if (r.length < 6 || !accel::equal_bytes(text, "VALUE ", 6)) {
      return resp.set_error("unexpected reply from memcached");
    }
    uint32_t line_end = 0;
    while (line_end + 1 < r.length && !(text[line_end] == '\r' && text[line_end + 1] == '\n')) {
      ++line_end;
    }
    uint32_t field_start = line_end;  // the last field of the VALUE line is the byte count
    while (field_start > 0 && text[field_start - 1] != ' ')
      --field_start;
    uint64_t bytes = 0;
    for (uint32_t i = field_start; i < line_end; ++i) {
      if (text[i] < '0' || text[i] > '9') return resp.set_error("bad VALUE line from memcached");
      bytes = bytes * 10 + static_cast<uint64_t>(text[i] - '0');
    }
    const uint64_t data_start = uint64_t{line_end} + 2;
    if (data_start + bytes > r.length) return resp.set_error("short VALUE from memcached");
    accel::move_bytes(resp.data, resp.data + data_start, static_cast<uint32_t>(bytes));
    resp.size = static_cast<uint32_t>(bytes);
  }

  uint64_t calls_ = 0;  // the token of each call (one call in flight per worker)
};

}  // namespace caracal::examples
