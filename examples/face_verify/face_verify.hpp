// The face verification handler: a client sends a person's id and a 64x64 face image
// (face_format.hpp has the formats); the handler fetches that person's reference histograms from
// memcached through client queue 0 (key "face:<id>"; the server holds the connection), computes
// the image's uniform-LBP histograms, compares the two (chi-square) and answers match or no
// match with the distance. A missing id, a memcached that is down or slow (the server's call
// fails or times out: its destination's `timeout_ms`), and a stored value that fails its checks
// each get an error status with a reason, never a verdict.
//
// Host/device code. On a GPU a block of kBlockThreads threads serves a batch of up to kBatch
// requests of one queue: its leader sends every request's `get` at once, then the block takes
// the requests in turn, each thread the histograms of its cells of the image while the fetch is
// in flight, then its cells' share of the distance; sums go through shared memory. On the CPU a
// worker thread does the same alone. The baseline servers (bench/baselines) run the same
// functions below the handler (histograms, compare_reference) on their own fetches.
#pragma once

#include <cstdint>

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/client.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/layout.hpp"
#include "face_format.hpp"

namespace caracal::examples::face {

// Sum of one value from every thread of the group, returned to every thread. `partial` is
// shared memory with a word per warp (unused on the CPU and by a single warp).
CARACAL_INLINE uint64_t group_sum([[maybe_unused]] const accel::Group& g, uint64_t v,
                                  [[maybe_unused]] uint64_t* partial) {
#if defined(__CUDA_ARCH__)
  if (g.size() == 1) return v;
  for (uint32_t offset = 16; offset > 0; offset >>= 1)
    v += __shfl_down_sync(0xFFFFFFFFu, v, offset);
  if (g.granularity() == accel::Granularity::kWarp) return __shfl_sync(0xFFFFFFFFu, v, 0);
  if (g.rank() % 32 == 0) partial[g.rank() / 32] = v;
  g.sync();
  uint64_t total = 0;
  for (uint32_t w = 0; w < (g.size() + 31) / 32; ++w)
    total += partial[w];
  g.sync();  // every thread has read `partial` before it is written again
  return total;
#else
  return v;
#endif
}

// The histograms of the cells of `image` this thread owns (cells rank, rank + size, ...) into
// `histograms` (kHistogramBytes). compare_reference reads the same cells in the same thread, so
// no barrier is needed between the two.
CARACAL_INLINE void image_histograms(const accel::Group& g, const uint8_t* image,
                                     uint8_t* histograms) {
  for (uint32_t cell = g.rank(); cell < kCells; cell += g.size())
    cell_histogram(image, cell, histograms + cell * kBins);
}

// The reply header; the leader writes it.
CARACAL_INLINE void write_reply(accel::Response& resp, ReplyStatus status, uint32_t person_id,
                                uint64_t distance, const char* reason) {
  uint32_t n = 0;
  if (reason != nullptr) {
    while (reason[n] != '\0' && n < kMaxReasonBytes && kReplyHeaderBytes + n < resp.capacity)
      ++n;
  }
  if (resp.capacity < kReplyHeaderBytes) return resp.set_error("face: reply buffer too small");
  uint8_t* out = reinterpret_cast<uint8_t*>(resp.data);
  store_u32(out, kReplyMagic);
  store_u16(out + 4, static_cast<uint16_t>(status));
  store_u16(out + 6, static_cast<uint16_t>(n));
  store_u32(out + 8, person_id);
  store_u32(out + 12, 0);
  store_u64(out + 16, distance);
  for (uint32_t i = 0; i < n; ++i)
    out[kReplyHeaderBytes + i] = static_cast<uint8_t>(reason[i]);
  resp.size = kReplyHeaderBytes + n;
}

// Checks `value` (value_bytes, as memcached stored it) as person_id's reference and, when it
// holds, replies with the distance between it and `histograms` (image_histograms' output, the
// same thread's cells). Every thread of the group calls it; the leader writes the reply.
CARACAL_INLINE void compare_reference(const accel::Group& g, uint32_t person_id,
                                      const uint8_t* histograms, const uint8_t* value,
                                      uint32_t value_bytes, uint64_t* partial,
                                      accel::Response& resp) {
  // The header checks read a few bytes every thread reads alike, so the branch is uniform.
  const char* wrong = nullptr;
  if (value_bytes != kReferenceBytes) {
    wrong = "face: stored reference has the wrong length";
  } else if (load_u32(value) != kReferenceMagic) {
    wrong = "face: stored reference has a bad magic number";
  } else if (load_u16(value + 4) != kReferenceVersion) {
    wrong = "face: stored reference has an unknown version";
  } else if (load_u16(value + 6) != kReferenceHeaderBytes || load_u16(value + 8) != kCells ||
             load_u16(value + 10) != kBins || load_u32(value + 16) != kHistogramBytes) {
    wrong = "face: stored reference has a bad shape";
  } else if (load_u32(value + 12) != person_id) {
    wrong = "face: stored reference is another person's";
  }
  if (wrong != nullptr) {
    if (g.leader()) write_reply(resp, ReplyStatus::kCorruptReference, person_id, 0, wrong);
    return;
  }
  const uint8_t* reference = value + kReferenceHeaderBytes;
  const uint32_t checksum =
      static_cast<uint32_t>(group_sum(g, checksum_part(reference, g.rank(), g.size()), partial));
  uint64_t distance = 0;
  for (uint32_t cell = g.rank(); cell < kCells; cell += g.size())
    distance += cell_chi_square(histograms + cell * kBins, reference + cell * kBins);
  distance = group_sum(g, distance, partial);
  if (!g.leader()) return;
  if (checksum + checksum_of_id(person_id) != load_u32(value + 20)) {
    return write_reply(resp, ReplyStatus::kCorruptReference, person_id, 0,
                       "face: stored reference fails its checksum");
  }
  write_reply(resp, distance <= kMatchThreshold ? ReplyStatus::kMatch : ReplyStatus::kNoMatch,
              person_id, distance, nullptr);
}

// The reasons of the errors every server gives alike.
CARACAL_INLINE const char* reason_bad_request() {
  return "face: a request is 4104 bytes: magic FVQ1, person id, 64x64 pixels";
}
CARACAL_INLINE const char* reason_unknown_person() {
  return "face: no reference stored for this person";
}
CARACAL_INLINE const char* reason_store_failed() {
  return "face: memcached is down or did not answer in time";
}

// True when `request` is a face request (size and magic).
CARACAL_INLINE bool well_formed(const std::byte* request, uint32_t bytes) {
  return bytes == kRequestBytes && load_u32(request) == kRequestMagic;
}
CARACAL_INLINE uint32_t person_of(const std::byte* request, uint32_t bytes) {
  return bytes >= kRequestHeaderBytes ? load_u32(request + 4) : 0;
}

// For servers that fetch the reference themselves (the baselines): what the fetch gave.
enum class Fetched : uint32_t { kFound = 0, kMissing = 1, kFailed = 2 };

// Answers `request` given the fetch of its person's reference (`value`: kFound only). Every
// thread of the group calls it; `histograms` (kHistogramBytes) and `partial` as for
// compare_reference, the leader writes the reply.
CARACAL_INLINE void answer_fetched(const accel::Group& g, const std::byte* request,
                                   uint32_t request_bytes, Fetched fetched, const uint8_t* value,
                                   uint32_t value_bytes, uint8_t* histograms, uint64_t* partial,
                                   accel::Response& resp) {
  const uint32_t person = person_of(request, request_bytes);
  if (!well_formed(request, request_bytes) || fetched != Fetched::kFound) {
    if (!g.leader()) return;
    if (!well_formed(request, request_bytes)) {
      write_reply(resp, ReplyStatus::kBadRequest, person, 0, reason_bad_request());
    } else if (fetched == Fetched::kMissing) {
      write_reply(resp, ReplyStatus::kUnknownPerson, person, 0, reason_unknown_person());
    } else {
      write_reply(resp, ReplyStatus::kStoreUnavailable, person, 0, reason_store_failed());
    }
    return;
  }
  image_histograms(g, reinterpret_cast<const uint8_t*>(request) + kRequestHeaderBytes, histograms);
  compare_reference(g, person, histograms, value, value_bytes, partial, resp);
}

// Where the value sits in a memcached `get` reply.
struct Lookup {
  ReplyStatus status;  // kMatch here means found (value_offset, value_bytes)
  uint32_t value_offset;
  uint32_t value_bytes;
  const char* reason;
};

// Parses a reply of `length` bytes of which `have` are at `text`: "END\r\n" (a miss), or
// "VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n"; anything else is memcached failing.
CARACAL_INLINE Lookup parse_get_reply(const char* text, uint32_t have, uint32_t length) {
  if (length == 5 && have >= 5 && accel::equal_bytes(text, "END\r\n", 5)) {
    return {ReplyStatus::kUnknownPerson, 0, 0, reason_unknown_person()};
  }
  if (have < 6 || !accel::equal_bytes(text, "VALUE ", 6)) {
    return {ReplyStatus::kStoreUnavailable, 0, 0, "face: memcached answered with an error"};
  }
  uint32_t line_end = 0;
  while (line_end + 1 < have && !(text[line_end] == '\r' && text[line_end + 1] == '\n'))
    ++line_end;
  uint32_t field = line_end;  // the last field of the VALUE line is the byte count
  while (field > 0 && text[field - 1] != ' ')
    --field;
  uint64_t bytes = 0;
  for (uint32_t i = field; i < line_end && bytes <= length; ++i) {
    if (text[i] < '0' || text[i] > '9') {
      return {ReplyStatus::kStoreUnavailable, 0, 0, "face: bad VALUE line from memcached"};
    }
    bytes = bytes * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  const uint64_t start = uint64_t{line_end} + 2;
  if (line_end + 1 >= have || start + bytes > length) {
    return {ReplyStatus::kStoreUnavailable, 0, 0, "face: short VALUE from memcached"};
  }
  if (start + bytes > have) {
    return {ReplyStatus::kCorruptReference, 0, 0, "face: stored reference has the wrong length"};
  }
  return {ReplyStatus::kMatch, static_cast<uint32_t>(start), static_cast<uint32_t>(bytes), nullptr};
}

// The handler (the agent runs it; see the top of the file).
struct FaceVerify {
  static constexpr accel::Granularity kGranularity = accel::Granularity::kBlock;
  static constexpr uint32_t kBlockThreads = 64;  // a thread per cell
  static constexpr uint32_t kBatch = 8;
  static constexpr uint32_t kMaxResponseBytes = kMaxReplyBytes;
  // A memcached reply with the reference: the VALUE line, the value, "\r\nEND\r\n".
  static constexpr uint32_t kGetReplyCapacity = 4096;
  static_assert(kGetReplyCapacity >= kReferenceBytes + 64);

  enum : uint32_t { kSent = 0, kBad = 1, kNoClient = 2, kQueueFull = 3 };

  // What the group shares: shared memory on a GPU, the worker thread's own on the CPU.
  struct Scratch {
    alignas(16) uint8_t request[kRequestBytes + 8];
    alignas(16) uint8_t reply[kGetReplyCapacity];
    uint8_t histograms[kHistogramBytes];
    uint64_t partial[32];
    uint32_t state[kBatch];
    uint32_t person[kBatch];
    // The leader's word to the group about the current fetch.
    const std::byte* fetched;
    uint32_t fetched_bytes;
    uint32_t fetch_ok;
    Lookup lookup;
  };

  CARACAL_HOST_DEVICE static Scratch& scratch() {
#if defined(__CUDA_ARCH__)
    __shared__ Scratch s;
    return s;
#else
    thread_local Scratch s;
    return s;
#endif
  }

  CARACAL_HOST_DEVICE void operator()(const accel::Request* reqs, accel::Response* resps,
                                      uint32_t count, accel::Context& ctx) {
    Scratch& s = scratch();
    const accel::Group& g = ctx.group();
    const uint64_t first_token = calls_ + 1;
    if (g.leader()) send_gets(reqs, count, ctx, s);
    g.sync();
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t state = s.state[i];
      if (state == kBad) {
        if (g.leader()) {
          write_reply(resps[i], ReplyStatus::kBadRequest, s.person[i], 0, reason_bad_request());
        }
        continue;
      }
      accel::group_copy(g, reinterpret_cast<std::byte*>(s.request), reqs[i].data, kRequestBytes);
      g.sync();
      // The image's histograms while the fetch is in flight.
      image_histograms(g, s.request + kRequestHeaderBytes, s.histograms);
      if (state != kSent) {
        if (g.leader()) {
          write_reply(resps[i], ReplyStatus::kStoreUnavailable, s.person[i], 0,
                      state == kNoClient ? "face: the agent has no client queue for memcached"
                                         : "face: the client queue to memcached is full");
        }
        g.sync();  // the histograms are done with the request before the next copy
        continue;
      }
      if (g.leader()) await_reply(ctx.client(0), first_token + i, s);
      g.sync();
      if (s.fetch_ok != 0) {
        const uint32_t have =
            s.fetched_bytes < kGetReplyCapacity ? s.fetched_bytes : kGetReplyCapacity;
        accel::group_copy(g, reinterpret_cast<std::byte*>(s.reply), s.fetched, have);
        g.sync();
        if (g.leader()) {
          ctx.client(0).release_replies();
          s.lookup = parse_get_reply(reinterpret_cast<const char*>(s.reply), have, s.fetched_bytes);
        }
        g.sync();
      }
      const Lookup lookup = s.lookup;
      if (lookup.status != ReplyStatus::kMatch) {
        if (g.leader()) write_reply(resps[i], lookup.status, s.person[i], 0, lookup.reason);
        g.sync();  // `lookup` is read before the leader writes it again
        continue;
      }
      compare_reference(g, s.person[i], s.histograms, s.reply + lookup.value_offset,
                        lookup.value_bytes, s.partial, resps[i]);
      g.sync();  // scratch is read before the next request overwrites it
    }
  }

 private:
  // The leader: checks each request's header and sends a `get` for each good one, tokens
  // first_token, first_token + 1, ... in request order; then makes them visible at once.
  CARACAL_HOST_DEVICE void send_gets(const accel::Request* reqs, uint32_t count,
                                     accel::Context& ctx, Scratch& s) {
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t token = ++calls_;
      s.person[i] = person_of(reqs[i].data, reqs[i].size);
      if (!well_formed(reqs[i].data, reqs[i].size)) {
        s.state[i] = kBad;
        continue;
      }
      if (ctx.client_count() == 0) {
        s.state[i] = kNoClient;
        continue;
      }
      // "get face:<id>\r\n"
      char command[4 + kMaxKeyBytes + 2];
      accel::copy_bytes(command, "get ", 4);
      const uint32_t key_bytes = reference_key(s.person[i], command + 4);
      command[4 + key_bytes] = '\r';
      command[5 + key_bytes] = '\n';
      s.state[i] = ctx.client(0).send(token, command, 6 + key_bytes) ? kSent : kQueueFull;
    }
    if (ctx.client_count() != 0) ctx.client(0).flush();
  }

  // The leader: waits for the reply with `token` and tells the group where it is (the reply is
  // released once the group has copied it). Replies of earlier tokens (a call answered after
  // its handler gave up, by an earlier kernel) are dropped.
  CARACAL_HOST_DEVICE static void await_reply(accel::ClientChannel& channel, uint64_t token,
                                              Scratch& s) {
    s.fetch_ok = 0;
    uint32_t spins = 0;
    mqueue::Entry e;
    for (;;) {
      const mqueue::PollResult r = channel.next_reply(e);
      if (r == mqueue::PollResult::kReady) {
        if (e.token < token) {
          channel.release_replies();
          continue;
        }
        if (e.token != token) {
          channel.release_replies();
          s.lookup = {ReplyStatus::kStoreUnavailable, 0, 0, "face: memcached replies out of order"};
          return;
        }
        if ((e.flags & mqueue::kSlotError) != 0) {
          channel.release_replies();
          s.lookup = {ReplyStatus::kStoreUnavailable, 0, 0, reason_store_failed()};
          return;
        }
        s.fetched = e.payload;
        s.fetched_bytes = e.length;
        s.fetch_ok = 1;
        return;
      }
      if (r == mqueue::PollResult::kCorrupt) {
        s.lookup = {ReplyStatus::kStoreUnavailable, 0, 0, "face: the client queue is corrupt"};
        return;
      }
      if (++spins % 4096 == 0 && channel.stop_requested()) {
        s.lookup = {ReplyStatus::kStoreUnavailable, 0, 0, "face: the agent is stopping"};
        return;
      }
      mqueue::spin_pause(100);
    }
  }

  uint64_t calls_ = 0;  // the last token used (the leader's copy counts)
};

}  // namespace caracal::examples::face
