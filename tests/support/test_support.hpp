// Helpers shared by the mqueue tests: a ring in local memory, a region in local memory, and
// small conveniences around entries and environment settings.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "caracal/mqueue/layout.hpp"
#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/shm.hpp"

namespace caracal::mqueue::test {

// One ring and its two index words in ordinary memory, as the accelerator holds them. Index
// words may start anywhere (near UINT32_MAX for wrap-around tests); set them before taking a
// producer or consumer, which read them when constructed.
class LocalRing {
 public:
  explicit LocalRing(const RingGeometry& g, uint32_t start_index = 0)
      : geometry_(g), slots_(size_t{g.slot_bytes} * g.capacity) {
    tail_word_ = start_index;
    head_word_ = start_index;
  }
  LocalRing(const LocalRing&) = delete;
  LocalRing& operator=(const LocalRing&) = delete;

  RingProducer producer() { return RingProducer(slots(), geometry_, &tail_word_, &head_word_); }
  RingConsumer consumer() { return RingConsumer(slots(), geometry_, &tail_word_, &head_word_); }

  std::byte* slots() { return reinterpret_cast<std::byte*>(slots_.data()); }
  std::byte* slot(uint32_t position) { return slots() + size_t{position} * geometry_.slot_bytes; }
  SlotHeader header_at(uint32_t position) {
    SlotHeader h;
    std::memcpy(&h, slot(position), sizeof(h));
    return h;
  }
  void write_header(uint32_t position, const SlotHeader& h) {
    std::memcpy(slot(position), &h, sizeof(h));
  }

  const RingGeometry& geometry() const { return geometry_; }
  uint32_t& tail_word() { return tail_word_; }
  uint32_t& head_word() { return head_word_; }

 private:
  struct alignas(64) Line {
    std::byte bytes[64];
  };
  RingGeometry geometry_;
  std::vector<Line> slots_;  // slot_bytes is a multiple of 64
  alignas(64) uint32_t tail_word_ = 0;
  alignas(64) uint32_t head_word_ = 0;
};

// A region laid out by compute_layout in page-aligned, zeroed local memory.
class LocalRegion {
 public:
  explicit LocalRegion(const RegionGeometry& g, uint64_t epoch = 1)
      : header_(compute_layout(g, epoch)),
        base_(static_cast<std::byte*>(std::aligned_alloc(kPageBytes, header_.region_bytes))) {
    std::memset(base_, 0, header_.region_bytes);
    initialize_region(base_, header_);
  }
  LocalRegion(const LocalRegion&) = delete;
  LocalRegion& operator=(const LocalRegion&) = delete;
  ~LocalRegion() { std::free(base_); }

  std::byte* base() const { return base_; }
  const RegionHeader& header() const { return header_; }
  RegionView view() const { return RegionView(base_); }

 private:
  RegionHeader header_;
  std::byte* base_;
};

// The small region of the line tests: 2 server queues and 1 client queue of 8 slots of 64
// bytes, messages of up to 4 slots, with RX lines and TX lines as asked.
inline RegionGeometry small_lines_geometry(bool rx_lines, bool tx_lines) {
  RegionGeometry g;
  g.server_queue_count = 2;
  g.client_queue_count = 1;
  g.slot_bytes = 64;
  g.ring_capacity = 8;
  g.max_message_bytes = 4 * 64 - kSlotHeaderBytes;
  g.rx_lines = rx_lines;
  g.tx_lines = tx_lines;
  return g;
}

// A LocalRegion and the SmartNIC's view of it through ShmTransport: what a test of the
// protocol between the two sides drives.
class ShmPair {
 public:
  explicit ShmPair(const RegionGeometry& g)
      : region_(g), transport_(region_.base(), region_.header().region_bytes) {}

  // The SmartNIC's handle, as RemoteRegion::attach makes it (a new one resumes the rings at
  // their published indexes). Throws when attach fails.
  RemoteRegion<ShmTransport> attach() {
    Result<RemoteRegion<ShmTransport>> r = RemoteRegion<ShmTransport>::attach(&transport_);
    if (!r.ok()) throw std::runtime_error("attach: " + r.status().message());
    return std::move(r).value();
  }
  const RegionHeader& header() const { return region_.header(); }
  // An index line's word at `byte_offset` (kEntriesWordOffset: the entry count).
  uint32_t& word(IndexArray array, uint32_t queue, uint32_t byte_offset = 0) {
    return *reinterpret_cast<uint32_t*>(region_.base() + index_offset(header(), array, queue) +
                                        byte_offset);
  }

  LocalRegion region_;
  ShmTransport transport_;
};

// A message copied out of a ring.
struct Message {
  std::vector<std::byte> payload;
  uint64_t token = 0;
  uint16_t flags = 0;
};

inline std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

inline std::vector<std::byte> numbered_bytes(uint32_t length, uint32_t salt) {
  std::vector<std::byte> out(length);
  for (uint32_t i = 0; i < length; ++i) {
    out[i] = static_cast<std::byte>((i * 31 + salt) & 0xFF);
  }
  return out;
}

// reserve + copy + commit on any producer; false when reserve or commit refuses.
template <class Producer>
bool push_message(Producer& p, const std::vector<std::byte>& payload, uint64_t token,
                  uint16_t flags = 0) {
  const uint32_t length = static_cast<uint32_t>(payload.size());
  std::byte* dst = p.reserve(length);
  if (dst == nullptr) return false;
  if (length != 0) std::memcpy(dst, payload.data(), length);
  return p.commit(length, token, flags);
}

// An entry's payload (at `payload`, e.g. a copy of it) and header fields, copied out.
inline Message copy_out(const Entry& e, const std::byte* payload) {
  Message m;
  m.payload.assign(payload, payload + e.length);
  m.token = e.token;
  m.flags = e.flags;
  return m;
}

// next() on any consumer, copied out; nullopt unless it returned kReady.
template <class Consumer>
std::optional<Message> pop_message(Consumer& c) {
  Entry e;
  if (c.next(e) != PollResult::kReady) return std::nullopt;
  return copy_out(e, e.payload);
}

// next_by_line() on a RingConsumer with RX lines, copied out: a payload that fits in the line
// from the line's image (what a GPU group serves it from), a longer one from its slots.
inline std::optional<Message> pop_by_line(RingConsumer& c) {
  alignas(16) std::byte image[kLineDataBytes];
  Entry e;
  if (c.next_by_line(e, image) != PollResult::kReady) return std::nullopt;
  return copy_out(e, e.length <= kLineInlineBytes ? image + kSlotHeaderBytes : e.payload);
}

// next_by_line() on the SmartNIC's consumer of a TX ring with TX lines, copied out.
template <class RemoteConsumer>
std::optional<Message> pop_tx_line(RemoteConsumer& c) {
  Entry e;
  if (c.next_by_line(e) != PollResult::kReady) return std::nullopt;
  return copy_out(e, e.payload);
}

// An unsigned setting from the environment, or `fallback` when unset or unparsable.
inline uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long parsed = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') return fallback;
  return parsed;
}

inline uint64_t stress_messages() {
  return env_u64("CARACAL_STRESS_MESSAGES", 2'000'000);
}
// A guard against hangs, not a performance bound: generous, and below CTest's 300 s.
inline uint64_t stress_timeout_s() {
  return env_u64("CARACAL_STRESS_TIMEOUT_S", 240);
}

// A POSIX shm name no other test process (CTest runs tests in parallel) will pick.
inline std::string unique_shm_name(const std::string& tag) {
  static std::atomic<uint32_t> counter{0};
  return "/caracal-test-" + tag + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter.fetch_add(1));
}

}  // namespace caracal::mqueue::test
