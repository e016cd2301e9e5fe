// The DPDK port's frame parser (snic_server/src/front/dpdk_packet.cpp) on frames off the wire. The
// first bytes of the input choose the checksum flags a PMD would set and where the frame is cut
// into segments of a chained mbuf; the rest is the frame. The mbufs are built by hand around
// buffers of their exact size (no EAL, no mempool), so a read past a segment is a sanitizer
// finding.
//
// Besides sanitizer findings:
//  - the verdict does not depend on how the frame is cut into segments: the chain and the
//    frame in one segment are classified alike;
//  - an accepted datagram's payload lies inside the frame after the headers, and the worker's
//    copy of it (copy_payload) is the frame's bytes;
//  - an ARP request for us turns into a reply in place (on one segment, as PMDs deliver ARP).
#include <rte_arp.h>
#include <rte_ether.h>
#include <rte_mbuf.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "front/dpdk_packet.hpp"
#include "fuzz_check.hpp"

namespace {

namespace dpdk = caracal::server::dpdk;
using dpdk::RxFrame;

constexpr uint32_t kMaxSegments = 4;

// A chain of mbufs over copies of the frame's pieces, each piece in a buffer of its own size.
class Chain {
 public:
  Chain(const uint8_t* frame, const std::vector<uint32_t>& lengths, uint64_t ol_flags)
      : mbufs_(new rte_mbuf[lengths.size()]()) {
    uint32_t at = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      buffers_.emplace_back(new uint8_t[lengths[i] == 0 ? 1 : lengths[i]]);
      std::memcpy(buffers_.back().get(), frame + at, lengths[i]);
      rte_mbuf& m = mbufs_[i];
      m.buf_addr = buffers_.back().get();
      m.buf_len = static_cast<uint16_t>(lengths[i]);
      m.data_off = 0;
      m.data_len = static_cast<uint16_t>(lengths[i]);
      m.next = i + 1 < lengths.size() ? &mbufs_[i + 1] : nullptr;
      at += lengths[i];
    }
    mbufs_[0].pkt_len = at;
    mbufs_[0].nb_segs = static_cast<uint16_t>(lengths.size());
    mbufs_[0].ol_flags = ol_flags;
  }
  rte_mbuf* head() { return &mbufs_[0]; }

 private:
  std::unique_ptr<rte_mbuf[]> mbufs_;
  std::vector<std::unique_ptr<uint8_t[]>> buffers_;
};

bool same(const RxFrame& a, const RxFrame& b) {
  if (a.kind != b.kind) return false;
  if (a.kind == RxFrame::Kind::kDrop) return a.drop == b.drop;
  if (a.kind == RxFrame::Kind::kArpRequest) return true;
  return rte_is_same_ether_addr(&a.src_mac, &b.src_mac) && a.src_ip_be == b.src_ip_be &&
         a.src_port == b.src_port && a.dst_port == b.dst_port &&
         a.payload_offset == b.payload_offset && a.payload_bytes == b.payload_bytes;
}

const char* name(const RxFrame& f) {
  switch (f.kind) {
    case RxFrame::Kind::kUdp:
      return "udp";
    case RxFrame::Kind::kArpRequest:
      return "arp request";
    case RxFrame::Kind::kDrop:
      return dpdk::frame_drop_name(f.drop);
  }
  return "?";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  caracal::fuzz::Input in(data, size);
  const uint8_t flags = in.u8();
  static constexpr uint64_t kIpFlags[] = {RTE_MBUF_F_RX_IP_CKSUM_UNKNOWN,
                                          RTE_MBUF_F_RX_IP_CKSUM_BAD, RTE_MBUF_F_RX_IP_CKSUM_GOOD,
                                          RTE_MBUF_F_RX_IP_CKSUM_NONE};
  static constexpr uint64_t kL4Flags[] = {RTE_MBUF_F_RX_L4_CKSUM_UNKNOWN,
                                          RTE_MBUF_F_RX_L4_CKSUM_BAD, RTE_MBUF_F_RX_L4_CKSUM_GOOD,
                                          RTE_MBUF_F_RX_L4_CKSUM_NONE};
  const uint64_t ol_flags = kIpFlags[flags & 3] | kL4Flags[(flags >> 2) & 3];
  const uint32_t segments = 1 + (flags >> 4) % kMaxSegments;
  uint16_t cuts[kMaxSegments - 1];
  for (uint32_t i = 0; i + 1 < segments; ++i)
    cuts[i] = in.u16();
  const std::span<const std::byte> frame_bytes = in.rest();
  const auto* frame = reinterpret_cast<const uint8_t*>(frame_bytes.data());
  const uint32_t frame_len = static_cast<uint32_t>(frame_bytes.size());
  if (frame_len == 0 || frame_len > UINT16_MAX) return 0;  // a frame is one segment's length

  // Segments of at least one byte each, cut where the input says.
  std::vector<uint32_t> lengths;
  uint32_t at = 0;
  for (uint32_t i = 0; i + 1 < segments && at + 1 < frame_len; ++i) {
    const uint32_t n = 1 + cuts[i] % (frame_len - at - 1);
    lengths.push_back(n);
    at += n;
  }
  lengths.push_back(frame_len - at);

  dpdk::PortAddress me;
  me.mac = rte_ether_addr{{0x02, 0, 0, 0, 0, 0x02}};
  me.ipv4_be = rte_cpu_to_be_32(0xC0000202);  // 192.0.2.2

  Chain whole(frame, {frame_len}, ol_flags);
  Chain chain(frame, lengths, ol_flags);
  const RxFrame one = dpdk::parse_frame(whole.head(), me);
  const RxFrame cut = dpdk::parse_frame(chain.head(), me);
  CARACAL_FUZZ_CHECK(same(one, cut), "one segment: %s; %zu segments: %s", name(one), lengths.size(),
                     name(cut));

  if (cut.kind == RxFrame::Kind::kUdp) {
    CARACAL_FUZZ_CHECK(cut.payload_offset >= dpdk::kUdpHeadersBytes &&
                           uint64_t{cut.payload_offset} + cut.payload_bytes <= frame_len,
                       "payload [%u, +%u) outside the %u-byte frame", cut.payload_offset,
                       cut.payload_bytes, frame_len);
    std::vector<std::byte> payload(cut.payload_bytes);
    dpdk::copy_payload(chain.head(), cut, payload.data());
    CARACAL_FUZZ_CHECK(payload.empty() || std::memcmp(payload.data(), frame + cut.payload_offset,
                                                      payload.size()) == 0,
                       "the payload copied is not the frame's");
  }
  if (one.kind == RxFrame::Kind::kArpRequest) {
    CARACAL_FUZZ_CHECK(frame_len >= sizeof(rte_ether_hdr) + sizeof(rte_arp_hdr),
                       "an ARP request of %u bytes", frame_len);
    dpdk::arp_request_to_reply(whole.head(), me);
    const auto* arp = reinterpret_cast<const rte_arp_hdr*>(
        rte_pktmbuf_mtod_offset(whole.head(), const uint8_t*, sizeof(rte_ether_hdr)));
    CARACAL_FUZZ_CHECK(arp->arp_opcode == rte_cpu_to_be_16(RTE_ARP_OP_REPLY) &&
                           arp->arp_data.arp_sip == me.ipv4_be,
                       "the ARP reply is not ours");
  }
  return 0;
}
