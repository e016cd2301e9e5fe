// A region header from a hostile or buggy agent (mqueue/): validate_region() on any 112 bytes
// and any mapped size, then, for a header it accepts, the server's attach and a few rounds of
// its data path over that region in local memory (mqueue::ShmTransport, as for an shm agent),
// with words of the region overwritten as the input says (indexes, entry counts, slot headers,
// lines: anything the agent could write).
//
// Besides sanitizer findings (the region is a buffer of exactly the mapped size, so an access
// past it is one):
//  - an accepted header places everything the server reads or writes inside the region: the
//    control words of every queue inside the control area, every ring and block of lines
//    inside the region and clear of the header page, the control area and each other;
//  - every read the server posts has a length that fits the transport's 32-bit length;
//  - a refusal names the field;
//  - attach accepts what validate_region accepts.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "caracal/mqueue/remote_region.hpp"
#include "caracal/mqueue/shm.hpp"
#include "caracal/mqueue/validate.hpp"
#include "fuzz_check.hpp"

namespace {

namespace mq = caracal::mqueue;

// Regions up to this size are attached and served; larger accepted headers are checked for
// their arithmetic only.
constexpr uint64_t kMaxServedBytes = 256 * 1024;
constexpr uint32_t kMaxPokes = 64;
constexpr uint32_t kRounds = 3;

struct Span {
  uint64_t begin;
  uint64_t bytes;
  uint64_t end() const { return begin + bytes; }
};

bool inside(const Span& s, const Span& in) {
  return s.begin >= in.begin && s.bytes <= in.bytes && s.begin - in.begin <= in.bytes - s.bytes;
}
bool apart(const Span& a, const Span& b) {
  return a.end() <= b.begin || b.end() <= a.begin;
}

void check_placement(const mq::RegionHeader& h) {
  const Span region{0, h.region_bytes};
  const Span header{0, h.header_bytes};
  const Span control{h.control_offset, h.control_bytes};
  CARACAL_FUZZ_CHECK(inside(control, region) && apart(control, header),
                     "control area [%llu, +%llu) misplaced",
                     static_cast<unsigned long long>(control.begin),
                     static_cast<unsigned long long>(control.bytes));
  CARACAL_FUZZ_CHECK(h.control_bytes <= UINT32_MAX,
                     "attach reads the %llu-byte control area with one 32-bit read",
                     static_cast<unsigned long long>(h.control_bytes));
  const uint32_t queues = mq::queue_count(h);
  const uint64_t ring_bytes = uint64_t{h.slot_bytes} * h.ring_capacity;
  const uint64_t lines_bytes = uint64_t{h.ring_capacity} * mq::kLineBytes;
  CARACAL_FUZZ_CHECK(ring_bytes <= UINT32_MAX, "a ring of %llu bytes",
                     static_cast<unsigned long long>(ring_bytes));
  for (uint32_t q = 0; q < queues; ++q) {
    for (uint32_t a = 0; a < 4; ++a) {
      const Span word{mq::index_offset(h, static_cast<mq::IndexArray>(a), q), h.control_line_bytes};
      CARACAL_FUZZ_CHECK(inside(word, control),
                         "index line %u of queue %u outside the control area", a, q);
    }
    const Span rx{mq::rx_ring_offset(h, q), ring_bytes};
    const Span tx{mq::tx_ring_offset(h, q), ring_bytes};
    for (const Span& ring : {rx, tx}) {
      CARACAL_FUZZ_CHECK(inside(ring, region) && apart(ring, header) && apart(ring, control),
                         "a ring of queue %u at [%llu, +%llu) misplaced", q,
                         static_cast<unsigned long long>(ring.begin),
                         static_cast<unsigned long long>(ring.bytes));
    }
    CARACAL_FUZZ_CHECK(apart(rx, tx), "queue %u's rings overlap", q);
    if (q > 0) {
      const Span prev_tx{mq::tx_ring_offset(h, q - 1), ring_bytes};
      CARACAL_FUZZ_CHECK(apart(rx, prev_tx), "queue %u's RX ring overlaps queue %u's TX", q, q - 1);
    }
    const uint64_t rings_end = mq::tx_ring_offset(h, queues - 1) + ring_bytes;
    if (mq::has_rx_lines(h) || mq::has_tx_lines(h)) {
      const Span lines[] = {{mq::rx_lines_offset(h, q), mq::has_rx_lines(h) ? lines_bytes : 0},
                            {mq::tx_lines_offset(h, q), mq::has_tx_lines(h) ? lines_bytes : 0}};
      for (const Span& l : lines) {
        if (l.bytes == 0) continue;
        CARACAL_FUZZ_CHECK(inside(l, region) && l.begin >= rings_end,
                           "lines of queue %u at [%llu, +%llu) misplaced", q,
                           static_cast<unsigned long long>(l.begin),
                           static_cast<unsigned long long>(l.bytes));
      }
      CARACAL_FUZZ_CHECK(apart(lines[0], lines[1]), "queue %u's RX and TX lines overlap", q);
      if (q > 0) {
        const Span prev{mq::tx_lines_offset(h, q - 1), mq::has_tx_lines(h) ? lines_bytes : 0};
        const Span first = mq::has_rx_lines(h) ? lines[0] : lines[1];
        CARACAL_FUZZ_CHECK(prev.bytes == 0 || apart(first, prev),
                           "lines of queues %u and %u overlap", q - 1, q);
      }
    }
  }
}

// The server's rounds over an attached region: a message into every RX ring, every TX tail
// fetched, every TX entry taken (from its line first, as the shm data path does), heads
// published.
void serve(mq::RemoteRegion<mq::ShmTransport>& region, caracal::fuzz::Input& in) {
  const mq::RegionHeader& h = region.header();
  const uint32_t queues = region.queue_count();
  for (uint32_t round = 0; round < kRounds; ++round) {
    for (uint32_t q = 0; q < queues; ++q) {
      auto& rx = region.rx(q);
      const uint32_t length = in.u16() % (h.max_message_bytes + 1);
      if (std::byte* dst = rx.reserve(length)) {
        std::memset(dst, 0x5a, length);
        CARACAL_FUZZ_CHECK(rx.commit(length, in.u64()), "commit of a reserved entry failed");
        rx.publish();
      }
    }
    region.fetch_tx_tails();
    (void)region.deliver_tx_tails();
    for (uint32_t q = 0; q < queues; ++q) {
      auto& tx = region.tx(q);
      mq::Entry e;
      mq::PollResult r = mq::PollResult::kReady;
      for (uint32_t n = 0; n <= h.ring_capacity && r == mq::PollResult::kReady; ++n) {
        r = tx.next_by_line(e);
        if (r == mq::PollResult::kEmpty) {
          region.observe_tx_tail(q);
          r = tx.next(e);
        }
        if (r == mq::PollResult::kReady) {
          CARACAL_FUZZ_CHECK(e.length <= h.max_message_bytes, "an entry of %u bytes", e.length);
          volatile std::byte sink{};
          for (uint32_t i = 0; i < e.length; ++i)
            sink = e.payload[i];  // the server copies every byte of a reply
          (void)sink;
        }
      }
      tx.release();
      tx.publish();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  caracal::fuzz::Input in(data, size);
  mq::RegionHeader h;
  const std::span<const std::byte> raw = in.bytes(sizeof(h));
  std::memset(&h, 0, sizeof(h));
  std::memcpy(&h, raw.data(), raw.size());
  const uint64_t mapped = in.u64();

  const caracal::Status s = mq::validate_region(h, mapped);
  if (!s.ok()) {
    CARACAL_FUZZ_CHECK(s.message().starts_with("region field '"), "a refusal without its field: %s",
                       s.message().c_str());
    return 0;
  }
  check_placement(h);
  if (mapped > kMaxServedBytes) return 0;

  // The agent's memory, exactly as large as the mapping: the header, then words the agent
  // wrote anywhere after it.
  const std::unique_ptr<std::byte[]> memory(new std::byte[mapped]());
  std::memcpy(memory.get(), &h, sizeof(h));
  const uint32_t pokes = in.u8() % (kMaxPokes + 1);
  for (uint32_t i = 0; i < pokes; ++i) {
    const uint64_t offset = mq::kPageBytes + in.u32() % ((mapped - mq::kPageBytes) / 4) * 4;
    const uint32_t value = in.u32();
    std::memcpy(memory.get() + offset, &value, sizeof(value));
  }
  mq::ShmTransport transport(memory.get(), mapped);
  caracal::Result<mq::RemoteRegion<mq::ShmTransport>> region =
      mq::RemoteRegion<mq::ShmTransport>::attach(&transport);
  CARACAL_FUZZ_CHECK(region.ok(), "attach refuses what validate_region accepts: %s",
                     region.status().message().c_str());
  serve(*region, in);
  return 0;
}
