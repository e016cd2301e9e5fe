// The traffic of the stress tests, shared by the gtest binary (the SmartNIC side, and the
// accelerator side when it runs in a thread) and by shm_peer (the accelerator side in a process
// of its own). No gtest here: both sides report the first error as a string.
//
// Message `seq` of queue `q` is fully determined by (q, seq): its length, its bytes and its
// token, so each side checks what it receives without any shared state. Requests carry
// token = (q << 48) | seq; a reply echoes the request's token with a length and bytes of its
// own (another salt), so a SmartNIC that read its own request back would notice. Each side
// checks that sequence numbers arrive in order, one at a time: anything lost, duplicated or
// reordered within a queue is reported at the first entry where it shows.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "caracal/mqueue/region.hpp"
#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/ring.hpp"
#include "caracal/mqueue/shm.hpp"

namespace caracal::mqueue::stress {

using Clock = std::chrono::steady_clock;

// A decimal argument of the peer programs; false unless the whole string is a number.
inline bool parse_u64(const char* s, uint64_t& out) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0') return false;
  out = v;
  return true;
}

inline constexpr uint64_t kRequestSalt = 0x5245'5155'4553'5421ULL;
inline constexpr uint64_t kReplySalt = 0x5245'504C'5921'2121ULL;
inline constexpr uint32_t kBurst = 32;

// The region the stress runs use: small rings and messages up to half a ring, so that
// multi-slot entries and skip markers are frequent.
inline RegionGeometry stress_geometry() {
  RegionGeometry g;
  g.server_queue_count = 3;
  g.client_queue_count = 1;
  g.slot_bytes = 64;
  g.ring_capacity = 64;
  g.max_message_bytes = 32 * 64 - kSlotHeaderBytes;
  return g;
}

// splitmix64's finaliser: a cheap bijective mix, good enough to make patterns unpredictable.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E37'79B9'7F4A'7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58'476D'1CE4'E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D0'49BB'1331'11EBULL;
  return x ^ (x >> 31);
}

inline uint64_t message_seed(uint32_t queue, uint64_t seq, uint64_t salt) {
  return mix64(mix64((uint64_t{queue} << 48) ^ seq) ^ salt);
}

inline uint64_t token_of(uint32_t queue, uint64_t seq) {
  return (uint64_t{queue} << 48) | seq;
}

// Lengths from 0 to max_message_bytes: an eighth empty, half small (at most two slots), the rest
// uniform over the whole range (many slots; these force skip markers at the ring's end).
inline uint32_t message_length(uint64_t seed, const RingGeometry& g) {
  const uint64_t r = mix64(seed ^ 0x4C45'4E47'5448ULL);
  const uint64_t kind = r & 7;
  if (kind == 0) return 0;
  const uint32_t small = 2 * g.slot_bytes - kSlotHeaderBytes;
  const uint32_t limit = kind <= 4 && small < g.max_message_bytes ? small : g.max_message_bytes;
  return static_cast<uint32_t>((r >> 8) % (uint64_t{limit} + 1));
}

inline uint16_t reply_flags(uint64_t seq) {
  return seq % 5 == 0 ? kSlotError : 0;
}

inline void fill_pattern(std::byte* dst, uint32_t length, uint64_t seed) {
  uint32_t i = 0;
  for (; i + 8 <= length; i += 8) {
    const uint64_t w = mix64(seed + i);
    std::memcpy(dst + i, &w, 8);
  }
  if (i < length) {
    const uint64_t w = mix64(seed + i);
    std::memcpy(dst + i, &w, length - i);
  }
}

// Offset of the first byte that differs from the pattern, or -1.
inline int64_t find_pattern_mismatch(const std::byte* src, uint32_t length, uint64_t seed) {
  uint32_t i = 0;
  for (; i < length; i += 8) {
    const uint64_t w = mix64(seed + i);
    const uint32_t n = length - i < 8 ? length - i : 8;
    if (std::memcmp(src + i, &w, n) != 0) {
      for (uint32_t b = 0; b < n; ++b) {
        if (src[i + b] != reinterpret_cast<const std::byte*>(&w)[b]) return i + b;
      }
    }
  }
  return -1;
}

// Checks one received entry against what message `seq` of `queue` must be; "" when it is.
inline std::string check_message(const char* what, uint32_t queue, uint64_t seq, const Entry& e,
                                 uint64_t salt, uint16_t flags, const RingGeometry& g) {
  const std::string where =
      std::string(what) + " queue " + std::to_string(queue) + " seq " + std::to_string(seq) + ": ";
  if (e.token != token_of(queue, seq)) {
    const uint64_t got_queue = e.token >> 48;
    const uint64_t got_seq = e.token & ((uint64_t{1} << 48) - 1);
    return where + "got the token of queue " + std::to_string(got_queue) + " seq " +
           std::to_string(got_seq) + " (lost, duplicated or reordered)";
  }
  const uint64_t seed = message_seed(queue, seq, salt);
  const uint32_t length = message_length(seed, g);
  if (e.length != length) {
    return where + "length " + std::to_string(e.length) + ", expected " + std::to_string(length);
  }
  if (e.flags != flags) {
    return where + "flags " + std::to_string(e.flags) + ", expected " + std::to_string(flags);
  }
  if (const int64_t at = find_pattern_mismatch(e.payload, e.length, seed); at >= 0) {
    return where + "payload differs at byte " + std::to_string(at) + " of " +
           std::to_string(e.length);
  }
  return {};
}

// Spin politely: the test machines have few cores and other jobs on them.
inline void idle(uint32_t& idle_rounds) {
  if (++idle_rounds % 64 == 0) {
    std::this_thread::yield();
  } else {
    spin_pause();
  }
}

// The accelerator: echoes every request of queue q (expected[q] of them) into a reply on the
// same queue, checking each request. Returns "" once every reply is published; an error at the
// first bad entry, when the SmartNIC raises the stop word early, or at `deadline`.
inline std::string run_echo_accelerator(const RegionView& view,
                                        const std::vector<uint64_t>& expected,
                                        Clock::time_point deadline) {
  const uint32_t queues = view.server_queue_count() + view.client_queue_count();
  if (expected.size() != queues) {
    return "accelerator: " + std::to_string(expected.size()) + " counts for " +
           std::to_string(queues) + " queues";
  }
  std::vector<RingConsumer> rx;
  std::vector<RingProducer> tx;
  for (uint32_t q = 0; q < queues; ++q) {
    rx.push_back(view.rx_consumer(q));
    tx.push_back(view.tx_producer(q));
  }
  const RingGeometry g = ring_geometry(view.header());
  std::vector<uint64_t> next_seq(queues, 0);
  uint64_t remaining = 0;
  for (uint64_t n : expected) {
    remaining += n;
  }
  uint32_t idle_rounds = 0;
  while (remaining != 0) {
    uint32_t served = 0;
    for (uint32_t q = 0; q < queues; ++q) {
      uint32_t n = 0;
      Entry e;
      alignas(16) std::byte image[kLineDataBytes];
      while (n < kBurst) {
        // With RX lines, as a GPU warp does: a burst's first entry by its line, the rest by
        // the tail (the two may disagree on what is published; neither may take an entry twice).
        const PollResult r =
            n == 0 && rx[q].has_lines() ? rx[q].next_by_line(e, image) : rx[q].next(e);
        if (r == PollResult::kEmpty) break;
        if (r == PollResult::kCorrupt) {
          return "accelerator: queue " + std::to_string(q) +
                 " corrupt RX entry: " + entry_check_name(rx[q].last_check());
        }
        const uint64_t seq = next_seq[q];
        if (seq == expected[q]) {
          return "accelerator: queue " + std::to_string(q) + " got more than the " +
                 std::to_string(expected[q]) + " requests sent";
        }
        if (std::string err = check_message("request", q, seq, e, kRequestSalt, 0, g);
            !err.empty()) {
          // Whether the right entry arrives later (published before its bytes landed) or never.
          // Signed: negative when the consumer has read past the tail it holds.
          const int32_t pending = static_cast<int32_t>(rx[q].pending_slots());
          const uint32_t read = rx[q].read_position();
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          SlotHeader later;
          std::memcpy(&later, e.payload - kSlotHeaderBytes, sizeof(later));
          return "accelerator: " + err + " [read position " + std::to_string(read) +
                 ", slots published past it " + std::to_string(pending) + ", slot " +
                 std::to_string((read - slots_for(e.length, g.slot_bytes)) % g.capacity) +
                 "; 20 ms later its header holds queue " + std::to_string(later.token >> 48) +
                 " seq " + std::to_string(later.token & ((uint64_t{1} << 48) - 1)) +
                 ", tail word now " +
                 std::to_string(load_acquire(view.index_word(IndexArray::kRxTail, q))) + "]";
        }
        const uint64_t reply_seed = message_seed(q, seq, kReplySalt);
        const uint32_t reply_length = message_length(reply_seed, g);
        // Half the replies reserve the largest message and commit less, as a handler that does
        // not know its reply's size in advance does.
        std::byte* out = tx[q].reserve(seq % 2 == 0 ? g.max_message_bytes : reply_length);
        if (out == nullptr) {
          rx[q].unread();  // no room for the reply yet: take the request again later
          break;
        }
        fill_pattern(out, reply_length, reply_seed);
        if (!tx[q].commit(reply_length, e.token, reply_flags(seq))) {
          return "accelerator: queue " + std::to_string(q) + " commit of " +
                 std::to_string(reply_length) + " bytes refused";
        }
        // With TX lines, a short reply is announced before the tail (two in three, so the
        // SmartNIC also meets short entries that only the tail announces).
        if (seq % 3 != 1) tx[q].write_line();
        rx[q].release();
        ++next_seq[q];
        ++n;
      }
      if (n != 0) {
        tx[q].publish();  // replies first, then the RX credits they free
        rx[q].publish();
        served += n;
        remaining -= n;
      }
    }
    if (served != 0) {
      idle_rounds = 0;
      continue;
    }
    idle(idle_rounds);
    if (idle_rounds % 1024 == 0) {
      if (view.stop_requested()) {
        return "accelerator: stop requested with " + std::to_string(remaining) +
               " requests still expected";
      }
      if (Clock::now() > deadline) {
        std::string counts;
        for (uint32_t q = 0; q < queues; ++q) {
          counts += " q" + std::to_string(q) + "=" + std::to_string(next_seq[q]) + "/" +
                    std::to_string(expected[q]);
        }
        return "accelerator: deadline passed; requests served:" + counts;
      }
    }
  }
  return {};
}

// The SmartNIC: sends expected[q] requests on each queue through `region`'s RX producers and
// checks every reply read back through its TX consumers. `peer_running` is asked now and then
// while nothing moves; once it says false, a last pass collects what the peer published, and
// anything still missing is an error. Raises the stop word when it gives up.
template <Transport T>
std::string run_smartnic(RemoteRegion<T>& region, const std::vector<uint64_t>& expected,
                         Clock::time_point deadline, const std::function<bool()>& peer_running) {
  const uint32_t queues = region.queue_count();
  if (expected.size() != queues) {
    return "smartnic: " + std::to_string(expected.size()) + " counts for " +
           std::to_string(queues) + " queues";
  }
  const RingGeometry g = ring_geometry(region.header());
  std::vector<uint64_t> sent(queues, 0);
  std::vector<uint64_t> received(queues, 0);
  std::vector<std::byte> scratch(g.max_message_bytes);
  uint64_t remaining = 0;
  for (uint64_t n : expected) {
    remaining += n;
  }
  uint32_t idle_rounds = 0;
  bool last_pass = false;
  bool tails_in_flight = false;
  auto fail = [&](std::string message) {
    region.request_stop();
    return message;
  };
  while (remaining != 0) {
    uint64_t moved = 0;
    for (uint32_t q = 0; q < queues; ++q) {
      RemoteRingProducer<T>& rx = region.rx(q);
      for (uint32_t n = 0; n < kBurst && sent[q] < expected[q]; ++n) {
        const uint64_t seq = sent[q];
        const uint64_t seed = message_seed(q, seq, kRequestSalt);
        const uint32_t length = message_length(seed, g);
        // Both ways in: zero-copy reserve + commit, and push() from a buffer.
        if (seq % 3 == 0) {
          fill_pattern(scratch.data(), length, seed);
          if (!rx.push(scratch.data(), length, token_of(q, seq))) break;
        } else {
          std::byte* dst = rx.reserve(length);
          if (dst == nullptr) break;
          fill_pattern(dst, length, seed);
          if (!rx.commit(length, token_of(q, seq))) {
            return fail("smartnic: queue " + std::to_string(q) + " commit refused");
          }
        }
        ++sent[q];
        ++moved;
      }
      rx.publish();
    }
    // One read of every TX tail in flight at a time: a new fetch would replace the ticket
    // deliver_tx_tails waits for.
    if (!tails_in_flight) {
      region.fetch_tx_tails();
      tails_in_flight = true;
    }
    if (region.deliver_tx_tails()) {
      tails_in_flight = false;
    } else if (Status s = region.transport().progress(); !s.ok()) {
      return fail("smartnic: transport: " + s.message());
    }
    for (uint32_t q = 0; q < queues; ++q) {
      RemoteRingConsumer<T>& tx = region.tx(q);
      Entry e;
      for (;;) {
        PollResult r = tx.next(e);
        // With TX lines over shm: entries announced by their lines, ahead of the tail.
        if constexpr (std::is_same_v<T, ShmTransport>) {
          if (r == PollResult::kEmpty) r = tx.next_by_line(e);
        }
        if (r == PollResult::kEmpty) break;
        if (r == PollResult::kCorrupt) {
          return fail("smartnic: queue " + std::to_string(q) +
                      " corrupt TX entry: " + entry_check_name(tx.last_check()));
        }
        const uint64_t seq = received[q];
        if (seq == sent[q]) {
          return fail("smartnic: queue " + std::to_string(q) + " reply without a request (" +
                      std::to_string(sent[q]) + " sent)");
        }
        if (std::string err = check_message("reply", q, seq, e, kReplySalt, reply_flags(seq), g);
            !err.empty()) {
          return fail("smartnic: " + err);
        }
        ++received[q];
        ++moved;
        --remaining;
      }
      tx.release();
      tx.publish();
    }
    if (moved != 0) {
      idle_rounds = 0;
      continue;
    }
    if (last_pass) break;
    idle(idle_rounds);
    if (idle_rounds % 256 == 0) {
      if (!peer_running()) {
        last_pass = true;  // collect what the peer published before it stopped, then give up
      } else if (Clock::now() > deadline) {
        break;
      }
    }
  }
  if (remaining == 0) return {};
  std::string counts;
  for (uint32_t q = 0; q < queues; ++q) {
    counts += " q" + std::to_string(q) + " sent " + std::to_string(sent[q]) + " replies " +
              std::to_string(received[q]) + "/" + std::to_string(expected[q]) + ";";
  }
  return fail(std::string("smartnic: ") +
              (last_pass ? "the accelerator stopped early:" : "deadline passed:") + counts);
}

// expected[q] for `total` messages over `queues` queues, uneven so that queues drain at
// different times.
inline std::vector<uint64_t> split_messages(uint64_t total, uint32_t queues) {
  std::vector<uint64_t> out(queues, 0);
  uint64_t weights = 0;
  for (uint32_t q = 0; q < queues; ++q) {
    weights += q + 2;
  }
  uint64_t given = 0;
  for (uint32_t q = 0; q < queues; ++q) {
    out[q] = total * (q + 2) / weights;
    given += out[q];
  }
  out[0] += total - given;
  return out;
}

}  // namespace caracal::mqueue::stress
