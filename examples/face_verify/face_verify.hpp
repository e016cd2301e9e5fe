// The face verification handler: a client sends a person's id and a 64x64 face image
// (face_format.hpp has the formats); the handler fetches that person's reference histograms from
// memcached through client queue 0 (key "face:<id>"; the server holds the connection), computes
// the image's uniform-LBP histograms, compares the two (chi-square) and answers match or no
// match with the distance. A missing id, a memcached that is down or slow (the server's call
// fails or times out: its destination's `timeout_ms`), and a stored value that fails its checks
// each get an error status with a reason, never a verdict.
//
// Host/device code. On a GPU a block of kBlockThreads threads serves its queues with up to
// kInFlight requests open: for each new request its leader sends the `get` and every thread
// computes the histograms of its cells of the image while the fetch is in flight; when the
// reply lands, each thread its cells' share of the distance, sums through shared memory. On the
// CPU a worker thread does the same alone. The baseline servers (bench/baselines) run the same
// functions below the handler (histograms, compare_reference) on their own fetches.
#pragma once

#include <cstdint>

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/client.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/accel/overlap.hpp"
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

// The handler (the agent runs it; see the top of the file). Overlapped (overlap.hpp): start()
// checks the request, sends its `get` and computes the image's histograms into the request's
// Pending while the fetch is in flight; finish() runs when the reply lands and compares. In
// between, the worker takes and finishes other requests.
struct FaceVerify {
  static constexpr accel::Granularity kGranularity = accel::Granularity::kBlock;
  static constexpr uint32_t kBlockThreads = 64;  // a thread per cell
  // A queue's RX ring of 512 slots holds 30 requests of 17 slots: a worker of one queue has
  // them all open at once.
  static constexpr uint32_t kInFlight = 32;
  static constexpr uint32_t kMaxResponseBytes = kMaxReplyBytes;
  // A memcached reply with the reference: the VALUE line, the value, "\r\nEND\r\n".
  static constexpr uint32_t kGetReplyCapacity = 4096;
  static_assert(kGetReplyCapacity >= kReferenceBytes + 64);

  enum : uint32_t { kSent = 0, kBad = 1, kNotSent = 2 };

  // Kept for a request between its phases (device memory on a GPU). The leader writes person
  // and state, the group the histograms (read in finish() after the runtime's barrier).
  struct Pending {
    uint32_t person;
    uint32_t state;
    alignas(16) uint8_t histograms[kHistogramBytes];
  };

  // What the group shares within a phase: shared memory on a GPU, the worker thread's own on
  // the CPU.
  struct Scratch {
    alignas(16) uint8_t request[kRequestBytes + 8];
    alignas(16) uint8_t reply[kGetReplyCapacity];
    alignas(16) uint8_t histograms[kHistogramBytes];
    uint64_t partial[32];
    Lookup lookup;  // the leader's parse of the reply
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

  CARACAL_HOST_DEVICE void start(const accel::Request& req, Pending& p, accel::Calls& calls,
                                 accel::Context& ctx) {
    const accel::Group& g = ctx.group();
    // Every thread checks the header (the same few bytes), so the branch is uniform.
    const bool good = well_formed(req.data, req.size);
    if (g.leader()) {
      p.person = person_of(req.data, req.size);
      p.state = good ? send_get(p.person, calls) : kBad;
    }
    if (!good) return;
    Scratch& s = scratch();
    accel::group_copy(g, reinterpret_cast<std::byte*>(s.request), req.data, kRequestBytes);
    g.sync();
    // Counted in shared memory (a bin is incremented once a pixel), then kept in Pending.
    image_histograms(g, s.request + kRequestHeaderBytes, s.histograms);
    g.sync();
    accel::group_copy(g, reinterpret_cast<std::byte*>(p.histograms),
                      reinterpret_cast<const std::byte*>(s.histograms), kHistogramBytes);
  }

  CARACAL_HOST_DEVICE void finish(const accel::Request&, Pending& p, const accel::Replies& replies,
                                  accel::Response& resp, accel::Context& ctx) {
    const accel::Group& g = ctx.group();
    if (p.state == kBad) {
      if (g.leader())
        write_reply(resp, ReplyStatus::kBadRequest, p.person, 0, reason_bad_request());
      return;
    }
    const accel::CallReply& fetched = replies[0];
    if (p.state == kNotSent || fetched.status != accel::CallStatus::kOk) {
      if (g.leader()) {
        const char* reason = fetched.status == accel::CallStatus::kNoClient
                                 ? "face: the agent has no client queue for memcached"
                             : fetched.status == accel::CallStatus::kQueueFull
                                 ? "face: the client queue to memcached is full"
                                 : reason_store_failed();
        write_reply(resp, ReplyStatus::kStoreUnavailable, p.person, 0, reason);
      }
      return;
    }
    Scratch& s = scratch();
    const uint32_t have = fetched.length < kGetReplyCapacity ? fetched.length : kGetReplyCapacity;
    accel::group_copy(g, reinterpret_cast<std::byte*>(s.reply), fetched.data, have);
    g.sync();
    if (g.leader()) {
      s.lookup = parse_get_reply(reinterpret_cast<const char*>(s.reply), have, fetched.length);
    }
    g.sync();
    const Lookup lookup = s.lookup;
    if (lookup.status != ReplyStatus::kMatch) {
      if (g.leader()) write_reply(resp, lookup.status, p.person, 0, lookup.reason);
      return;
    }
    compare_reference(g, p.person, p.histograms, s.reply + lookup.value_offset, lookup.value_bytes,
                      s.partial, resp);
  }

 private:
  // The leader: "get face:<id>\r\n" through client queue 0.
  CARACAL_HOST_DEVICE static uint32_t send_get(uint32_t person, accel::Calls& calls) {
    char command[4 + kMaxKeyBytes + 2];
    accel::copy_bytes(command, "get ", 4);
    const uint32_t key_bytes = reference_key(person, command + 4);
    command[4 + key_bytes] = '\r';
    command[5 + key_bytes] = '\n';
    return calls.send(0, command, 6 + key_bytes) ? kSent : kNotSent;
  }
};

}  // namespace caracal::examples::face
