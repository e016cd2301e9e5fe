// Frames of the DPDK port: what a received frame is (ARP for the port's address, a UDP datagram
// for it, or something dropped with a reason), and the frames the port sends (UDP datagrams,
// ARP replies and announcements). Plain functions on mbufs, so they can be tested on real mbufs
// without a port. Needs DPDK (CARACAL_HAVE_DPDK).
//
// What is accepted: Ethernet II to the port's MAC or broadcast; ARP requests for the port's
// address; IPv4 to the port's address, version 4, header length 20 to 60 bytes, a header
// checksum that holds, total length within the frame (Ethernet padding after it is ignored),
// not a fragment; UDP with a length from 8 to what the IP packet holds and a checksum that holds
// (or is 0: none). Checksums are verified in software unless the PMD marked them good or bad
// (RTE_MBUF_F_RX_*_CKSUM_GOOD/BAD). Headers may span segments of a chained mbuf.
#pragma once

#include <rte_ether.h>
#include <rte_mbuf.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace caracal::server::dpdk {

// The port's own addresses. ipv4_be is in network byte order.
struct PortAddress {
  rte_ether_addr mac{};
  uint32_t ipv4_be = 0;
};

// Why a received frame was not served: the `reason` label of caracal_dpdk_drops_total.
enum class FrameDrop : uint8_t {
  kTruncated,      // shorter than the headers it announces
  kBadLength,      // IPv4 header or total length, or UDP length, inconsistent with the frame
  kBadChecksum,    // IPv4 header or UDP checksum does not hold
  kFragment,       // an IPv4 fragment (more-fragments set or an offset): never reassembled
  kNotForUs,       // another MAC, another IPv4 address, or ARP that is not a request for us
  kOtherProtocol,  // not IPv4 or ARP (IPv6, VLAN tags, ...), or IPv4 that is not UDP
  kNoListener,     // UDP to a port no dpdk listener serves
  kCount,
};
const char* frame_drop_name(FrameDrop reason);

struct RxFrame {
  enum class Kind : uint8_t { kUdp, kArpRequest, kDrop };
  Kind kind = Kind::kDrop;
  FrameDrop drop = FrameDrop::kTruncated;  // when kind is kDrop
  // kUdp: the sender and the datagram; addresses in network byte order, ports in host order.
  rte_ether_addr src_mac{};
  uint32_t src_ip_be = 0;
  uint16_t src_port = 0;
  uint16_t dst_port = 0;
  uint32_t payload_offset = 0;  // from the start of the frame
  uint32_t payload_bytes = 0;
};

// Classifies a received frame. Never modifies it.
RxFrame parse_frame(const rte_mbuf* m, const PortAddress& me);

// Copies the payload of a datagram parse_frame accepted (kind kUdp) to `out`, which has room for
// f.payload_bytes, across segments.
void copy_payload(const rte_mbuf* m, const RxFrame& f, std::byte* out);

// Turns an ARP request for me.ipv4_be (checked by parse_frame) into the reply, in place, so the
// mbuf can be sent back. The frame must be contiguous for its Ethernet and ARP headers (ARP
// requests are 42 to 60 bytes, always in one segment).
void arp_request_to_reply(rte_mbuf* m, const PortAddress& me);

// A gratuitous ARP request announcing me (sender and target address both mine, to broadcast),
// so that neighbours learn or refresh the port's MAC. Null when the pool is empty.
rte_mbuf* build_gratuitous_arp(rte_mempool* pool, const PortAddress& me);

struct UdpTo {
  rte_ether_addr dst_mac{};
  uint32_t dst_ip_be = 0;
  uint16_t src_port = 0;  // host order
  uint16_t dst_port = 0;  // host order
};

// Bytes of Ethernet, IPv4 (no options) and UDP headers before the payload.
inline constexpr uint32_t kUdpHeadersBytes = 14 + 20 + 8;

// A UDP datagram from me, in one segment of a new mbuf from `pool`. The payload must fit in the
// mbuf's data room after the headers (the caller checks against the port's MTU). With
// `offload`, the IPv4 and UDP checksums are left to the NIC (ol_flags, l2_len, l3_len, and the
// pseudo-header sum in the UDP checksum as DPDK asks); without, they are computed here. Null
// when the pool is empty or the payload does not fit.
rte_mbuf* build_udp(rte_mempool* pool, const PortAddress& me, const UdpTo& to,
                    std::span<const std::byte> payload, uint16_t ip_id, bool offload);

// The one's complement sum check of a UDP datagram over IPv4 as the receiver does it:
// `udp_bytes` of UDP header and payload starting at `l4_offset` of `m`, with the pseudo-header
// of src/dst. True when the checksum holds.
bool udp_checksum_holds(const rte_mbuf* m, uint32_t l4_offset, uint32_t udp_bytes, uint32_t src_be,
                        uint32_t dst_be);

}  // namespace caracal::server::dpdk
