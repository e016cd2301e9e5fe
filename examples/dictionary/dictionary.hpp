// The dictionary handler: a client sends a word, the handler answers with its definition (or
// with the service's not_found text). The dictionary is state for the agent's life: a file of
// `word<TAB>definition` lines that the setup step (dictionary.cpp) loads once per service into
// a hash table in the accelerator's memory (device memory on a GPU, host memory on the CPU);
// every worker reads the same table through the Lookup view it copies, and counts what it
// served in two counters they all share (atomics, as handler.hpp's contract says).
//
// Host/device code: the same Lookup runs on the CPU and in a GPU kernel (one thread per call).
// The table is built on the host by build_table below.
#pragma once

#include <cstdint>

#include "caracal/accel/bytes.hpp"
#include "caracal/accel/handler.hpp"
#include "caracal/mqueue/platform.hpp"

namespace caracal::examples::dictionary {

inline constexpr uint32_t kMaxWordBytes = 64;

// One slot of the open-addressing table; key_bytes 0: empty. Offsets are into the text.
struct Bucket {
  uint32_t key_offset;
  uint32_t key_bytes;
  uint32_t value_offset;
  uint32_t value_bytes;
};

// Shared by every worker of a service, written with relaxed atomic adds: only the totals
// matter, and teardown reads them after the workers have stopped.
struct Counters {
  uint64_t lookups;
  uint64_t misses;
};

CARACAL_INLINE uint8_t fold_case(uint8_t c, bool case_sensitive) {
  return !case_sensitive && c >= 'A' && c <= 'Z' ? static_cast<uint8_t>(c + ('a' - 'A')) : c;
}

// FNV-1a over the (case-folded) bytes.
CARACAL_INLINE uint32_t word_hash(const uint8_t* word, uint32_t bytes, bool case_sensitive) {
  uint32_t h = 2166136261u;
  for (uint32_t i = 0; i < bytes; ++i) {
    h ^= fold_case(word[i], case_sensitive);
    h *= 16777619u;
  }
  return h;
}

CARACAL_INLINE bool same_word(const uint8_t* a, const uint8_t* b, uint32_t bytes,
                              bool case_sensitive) {
  for (uint32_t i = 0; i < bytes; ++i) {
    if (fold_case(a[i], case_sensitive) != fold_case(b[i], case_sensitive)) return false;
  }
  return true;
}

CARACAL_INLINE void count(uint64_t* counter) {
  mqueue::SystemAtomicRef<uint64_t>(*counter).fetch_add(1, mqueue::mo::memory_order_relaxed);
}

// What every worker copies: pointers into the state in the accelerator's memory.
struct Lookup {
  const Bucket* buckets = nullptr;
  uint32_t bucket_mask = 0;  // buckets - 1, a power of two less one
  const uint8_t* text = nullptr;
  uint32_t not_found_offset = 0;
  uint32_t not_found_bytes = 0;
  bool case_sensitive = true;
  Counters* counters = nullptr;

  CARACAL_HOST_DEVICE void operator()(const accel::Request& req, accel::Response& resp,
                                      accel::Context&) const {
    if (req.size == 0 || req.size > kMaxWordBytes) return resp.set_error("a word is 1-64 bytes");
    const auto* word = reinterpret_cast<const uint8_t*>(req.data);
    count(&counters->lookups);
    const uint32_t h = word_hash(word, req.size, case_sensitive);
    for (uint32_t probe = 0; probe <= bucket_mask; ++probe) {
      const Bucket& b = buckets[(h + probe) & bucket_mask];
      if (b.key_bytes == 0) break;
      if (b.key_bytes == req.size &&
          same_word(text + b.key_offset, word, req.size, case_sensitive)) {
        return reply(resp, b.value_offset, b.value_bytes);
      }
    }
    count(&counters->misses);
    reply(resp, not_found_offset, not_found_bytes);
  }

  CARACAL_INLINE void reply(accel::Response& resp, uint32_t offset, uint32_t bytes) const {
    if (bytes > resp.capacity) return resp.set_error("definition larger than a reply");
    accel::copy_bytes(resp.data, text + offset, bytes);
    resp.size = bytes;
  }
};

}  // namespace caracal::examples::dictionary
