#include "front/dpdk_packet.hpp"

#include <rte_arp.h>
#include <rte_byteorder.h>
#include <rte_ip.h>
#include <rte_udp.h>

#include <algorithm>
#include <cstring>
#include <iterator>

namespace caracal::server::dpdk {

const char* frame_drop_name(FrameDrop reason) {
  static constexpr const char* kNames[] = {"truncated",  "bad_length", "bad_checksum",
                                           "fragment",   "not_for_us", "other_protocol",
                                           "no_listener"};
  static_assert(std::size(kNames) == static_cast<size_t>(FrameDrop::kCount));
  return kNames[static_cast<size_t>(reason)];
}

namespace {

constexpr uint32_t kEtherBytes = sizeof(rte_ether_hdr);

RxFrame dropped(FrameDrop why) {
  RxFrame f;
  f.kind = RxFrame::Kind::kDrop;
  f.drop = why;
  return f;
}

// One's complement addition of two 16-bit partial sums.
uint16_t add_cksum(uint16_t a, uint16_t b) {
  uint32_t s = uint32_t{a} + b;
  s = (s & 0xFFFF) + (s >> 16);
  return static_cast<uint16_t>(s);
}

uint16_t pseudo_header_sum(uint32_t src_be, uint32_t dst_be, uint16_t udp_bytes) {
  struct {
    uint32_t src;
    uint32_t dst;
    uint8_t zero;
    uint8_t proto;
    uint16_t len;
  } __attribute__((packed)) ph{src_be, dst_be, 0, IPPROTO_UDP, rte_cpu_to_be_16(udp_bytes)};
  static_assert(sizeof(ph) == 12);
  return rte_raw_cksum(&ph, sizeof(ph));
}

RxFrame parse_arp(const rte_mbuf* m, const PortAddress& me) {
  // Always a copy: rte_arp_hdr is 2-byte aligned, and in a chain whose first segment has an odd
  // length the header rte_pktmbuf_read finds in place can sit at an odd address.
  rte_arp_hdr copy;
  const void* in_mbuf = rte_pktmbuf_read(m, kEtherBytes, sizeof(rte_arp_hdr), &copy);
  if (in_mbuf == nullptr) return dropped(FrameDrop::kTruncated);
  if (in_mbuf != &copy) std::memcpy(&copy, in_mbuf, sizeof(copy));
  const rte_arp_hdr* arp = &copy;
  if (arp->arp_hardware != rte_cpu_to_be_16(RTE_ARP_HRD_ETHER) ||
      arp->arp_protocol != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4) || arp->arp_hlen != 6 ||
      arp->arp_plen != 4) {
    return dropped(FrameDrop::kOtherProtocol);
  }
  if (arp->arp_opcode != rte_cpu_to_be_16(RTE_ARP_OP_REQUEST) ||
      arp->arp_data.arp_tip != me.ipv4_be) {
    return dropped(FrameDrop::kNotForUs);
  }
  RxFrame f;
  f.kind = RxFrame::Kind::kArpRequest;
  return f;
}

// The one's complement sum of `len` bytes at `off`, across segments. Not rte_raw_cksum_mbuf:
// in DPDK 22.11 it truncates a segment's unreduced 32-bit sum to 16 bits before the byte swap
// that a segment starting at an odd offset needs, and gets such chains wrong.
bool raw_sum(const rte_mbuf* m, uint32_t off, uint32_t len, uint16_t* out) {
  if (uint64_t{off} + len > rte_pktmbuf_pkt_len(m)) return false;
  const rte_mbuf* seg = m;
  while (seg != nullptr && off >= seg->data_len) {
    off -= seg->data_len;
    seg = seg->next;
  }
  uint16_t sum = 0;
  uint32_t done = 0;
  for (; seg != nullptr && done < len; seg = seg->next, off = 0) {
    const uint32_t n = std::min<uint32_t>(seg->data_len - off, len - done);
    uint16_t part = rte_raw_cksum(rte_pktmbuf_mtod_offset(seg, const char*, off), n);
    if (done & 1) part = rte_bswap16(part);  // this segment's bytes sit at odd positions
    sum = add_cksum(sum, part);
    done += n;
  }
  *out = sum;
  return done == len;
}

}  // namespace

bool udp_checksum_holds(const rte_mbuf* m, uint32_t l4_offset, uint32_t udp_bytes, uint32_t src_be,
                        uint32_t dst_be) {
  uint16_t body = 0;
  if (!raw_sum(m, l4_offset, udp_bytes, &body)) return false;
  return add_cksum(body, pseudo_header_sum(src_be, dst_be, static_cast<uint16_t>(udp_bytes))) ==
         0xFFFF;
}

RxFrame parse_frame(const rte_mbuf* m, const PortAddress& me) {
  const uint32_t frame_bytes = rte_pktmbuf_pkt_len(m);
  rte_ether_hdr eth_copy;
  const auto* eth =
      static_cast<const rte_ether_hdr*>(rte_pktmbuf_read(m, 0, kEtherBytes, &eth_copy));
  if (eth == nullptr) return dropped(FrameDrop::kTruncated);
  if (!rte_is_same_ether_addr(&eth->dst_addr, &me.mac) &&
      !rte_is_broadcast_ether_addr(&eth->dst_addr)) {
    return dropped(FrameDrop::kNotForUs);
  }
  const uint16_t ether_type = rte_be_to_cpu_16(eth->ether_type);
  if (ether_type == RTE_ETHER_TYPE_ARP) return parse_arp(m, me);
  if (ether_type != RTE_ETHER_TYPE_IPV4) return dropped(FrameDrop::kOtherProtocol);

  // IPv4, read with its longest options so that the UDP header can follow in the same copy.
  uint8_t ip_copy[60 + sizeof(rte_udp_hdr)];
  const auto* ip = static_cast<const rte_ipv4_hdr*>(
      rte_pktmbuf_read(m, kEtherBytes, sizeof(rte_ipv4_hdr), ip_copy));
  if (ip == nullptr) return dropped(FrameDrop::kTruncated);
  if ((ip->version_ihl >> 4) != 4) return dropped(FrameDrop::kBadLength);
  const uint32_t ihl = uint32_t{ip->version_ihl & 0x0Fu} * 4;
  if (ihl < sizeof(rte_ipv4_hdr)) return dropped(FrameDrop::kBadLength);
  const uint32_t total = rte_be_to_cpu_16(ip->total_length);
  if (kEtherBytes + ihl > frame_bytes) return dropped(FrameDrop::kTruncated);
  if (total < ihl || kEtherBytes + total > frame_bytes) return dropped(FrameDrop::kBadLength);
  // The whole header, options included, now that its length is known to be in the frame.
  ip = static_cast<const rte_ipv4_hdr*>(rte_pktmbuf_read(m, kEtherBytes, ihl, ip_copy));
  const uint64_t ip_flags = m->ol_flags & RTE_MBUF_F_RX_IP_CKSUM_MASK;
  if (ip_flags == RTE_MBUF_F_RX_IP_CKSUM_BAD) return dropped(FrameDrop::kBadChecksum);
  if (ip_flags != RTE_MBUF_F_RX_IP_CKSUM_GOOD && rte_raw_cksum(ip, ihl) != 0xFFFF) {
    return dropped(FrameDrop::kBadChecksum);
  }
  if (ip->dst_addr != me.ipv4_be) return dropped(FrameDrop::kNotForUs);
  if ((rte_be_to_cpu_16(ip->fragment_offset) & (RTE_IPV4_HDR_MF_FLAG | RTE_IPV4_HDR_OFFSET_MASK)) !=
      0) {
    return dropped(FrameDrop::kFragment);
  }
  if (ip->next_proto_id != IPPROTO_UDP) return dropped(FrameDrop::kOtherProtocol);
  const uint32_t src_be = ip->src_addr;

  const uint32_t l4 = kEtherBytes + ihl;
  if (total - ihl < sizeof(rte_udp_hdr)) return dropped(FrameDrop::kTruncated);
  rte_udp_hdr udp_copy;
  const auto* udp =
      static_cast<const rte_udp_hdr*>(rte_pktmbuf_read(m, l4, sizeof(rte_udp_hdr), &udp_copy));
  if (udp == nullptr) return dropped(FrameDrop::kTruncated);
  const uint32_t udp_bytes = rte_be_to_cpu_16(udp->dgram_len);
  if (udp_bytes < sizeof(rte_udp_hdr) || udp_bytes > total - ihl) {
    return dropped(FrameDrop::kBadLength);
  }
  const uint64_t l4_flags = m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK;
  if (udp->dgram_cksum != 0) {
    if (l4_flags == RTE_MBUF_F_RX_L4_CKSUM_BAD) return dropped(FrameDrop::kBadChecksum);
    if (l4_flags != RTE_MBUF_F_RX_L4_CKSUM_GOOD &&
        !udp_checksum_holds(m, l4, udp_bytes, src_be, me.ipv4_be)) {
      return dropped(FrameDrop::kBadChecksum);
    }
  }

  RxFrame f;
  f.kind = RxFrame::Kind::kUdp;
  f.src_mac = eth->src_addr;
  f.src_ip_be = src_be;
  f.src_port = rte_be_to_cpu_16(udp->src_port);
  f.dst_port = rte_be_to_cpu_16(udp->dst_port);
  f.payload_offset = l4 + sizeof(rte_udp_hdr);
  f.payload_bytes = udp_bytes - static_cast<uint32_t>(sizeof(rte_udp_hdr));
  return f;
}

void copy_payload(const rte_mbuf* m, const RxFrame& f, std::byte* out) {
  // An empty datagram reads nothing: in a chain, rte_pktmbuf_read of 0 bytes at the frame's end
  // walks past the last segment (DPDK 22.11's __rte_pktmbuf_read) and dereferences null.
  if (f.payload_bytes == 0) return;
  const void* p = rte_pktmbuf_read(m, f.payload_offset, f.payload_bytes, out);
  if (p != out) memcpy(out, p, f.payload_bytes);
}

void arp_request_to_reply(rte_mbuf* m, const PortAddress& me) {
  auto* eth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
  auto* arp = reinterpret_cast<rte_arp_hdr*>(eth + 1);
  arp->arp_opcode = rte_cpu_to_be_16(RTE_ARP_OP_REPLY);
  arp->arp_data.arp_tha = arp->arp_data.arp_sha;
  arp->arp_data.arp_tip = arp->arp_data.arp_sip;
  arp->arp_data.arp_sha = me.mac;
  arp->arp_data.arp_sip = me.ipv4_be;
  eth->dst_addr = arp->arp_data.arp_tha;
  eth->src_addr = me.mac;
  m->ol_flags = 0;
}

rte_mbuf* build_gratuitous_arp(rte_mempool* pool, const PortAddress& me) {
  rte_mbuf* m = rte_pktmbuf_alloc(pool);
  if (m == nullptr) return nullptr;
  auto* eth = reinterpret_cast<rte_ether_hdr*>(
      rte_pktmbuf_append(m, sizeof(rte_ether_hdr) + sizeof(rte_arp_hdr)));
  if (eth == nullptr) {
    rte_pktmbuf_free(m);
    return nullptr;
  }
  memset(&eth->dst_addr, 0xFF, sizeof(eth->dst_addr));
  eth->src_addr = me.mac;
  eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_ARP);
  auto* arp = reinterpret_cast<rte_arp_hdr*>(eth + 1);
  arp->arp_hardware = rte_cpu_to_be_16(RTE_ARP_HRD_ETHER);
  arp->arp_protocol = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
  arp->arp_hlen = RTE_ETHER_ADDR_LEN;
  arp->arp_plen = 4;
  arp->arp_opcode = rte_cpu_to_be_16(RTE_ARP_OP_REQUEST);
  arp->arp_data.arp_sha = me.mac;
  arp->arp_data.arp_sip = me.ipv4_be;
  memset(&arp->arp_data.arp_tha, 0, sizeof(arp->arp_data.arp_tha));
  arp->arp_data.arp_tip = me.ipv4_be;
  return m;
}

rte_mbuf* build_udp(rte_mempool* pool, const PortAddress& me, const UdpTo& to,
                    std::span<const std::byte> payload, uint16_t ip_id, bool offload) {
  rte_mbuf* m = rte_pktmbuf_alloc(pool);
  if (m == nullptr) return nullptr;
  if (payload.size() > 0xFFFF - 28 || kUdpHeadersBytes + payload.size() > rte_pktmbuf_tailroom(m)) {
    rte_pktmbuf_free(m);
    return nullptr;
  }
  auto* frame = rte_pktmbuf_mtod(m, uint8_t*);
  rte_pktmbuf_append(m, static_cast<uint16_t>(kUdpHeadersBytes + payload.size()));
  auto* eth = reinterpret_cast<rte_ether_hdr*>(frame);
  auto* ip = reinterpret_cast<rte_ipv4_hdr*>(frame + sizeof(rte_ether_hdr));
  auto* udp = reinterpret_cast<rte_udp_hdr*>(frame + sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr));
  eth->dst_addr = to.dst_mac;
  eth->src_addr = me.mac;
  eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
  const auto udp_bytes = static_cast<uint16_t>(sizeof(rte_udp_hdr) + payload.size());
  ip->version_ihl = RTE_IPV4_VHL_DEF;
  ip->type_of_service = 0;
  ip->total_length = rte_cpu_to_be_16(static_cast<uint16_t>(sizeof(rte_ipv4_hdr) + udp_bytes));
  ip->packet_id = rte_cpu_to_be_16(ip_id);
  ip->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_DF_FLAG);
  ip->time_to_live = 64;
  ip->next_proto_id = IPPROTO_UDP;
  ip->hdr_checksum = 0;
  ip->src_addr = me.ipv4_be;
  ip->dst_addr = to.dst_ip_be;
  udp->src_port = rte_cpu_to_be_16(to.src_port);
  udp->dst_port = rte_cpu_to_be_16(to.dst_port);
  udp->dgram_len = rte_cpu_to_be_16(udp_bytes);
  udp->dgram_cksum = 0;
  if (!payload.empty()) memcpy(udp + 1, payload.data(), payload.size());
  if (offload) {
    m->l2_len = sizeof(rte_ether_hdr);
    m->l3_len = sizeof(rte_ipv4_hdr);
    m->ol_flags = RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM;
    // The NIC completes the UDP checksum from the pseudo-header sum (DPDK's convention).
    udp->dgram_cksum = rte_ipv4_phdr_cksum(ip, m->ol_flags);
  } else {
    ip->hdr_checksum = rte_ipv4_cksum(ip);
    udp->dgram_cksum = rte_ipv4_udptcp_cksum(ip, udp);  // 0 is sent as 0xFFFF (RFC 768)
  }
  return m;
}

}  // namespace caracal::server::dpdk
