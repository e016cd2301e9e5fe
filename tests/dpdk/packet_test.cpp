// The DPDK port's frame parsing and building (dpdk_packet.hpp) on real mbufs from a real
// mempool: the EAL runs with --no-huge --no-pci and no device.
#include "front/dpdk_packet.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <rte_arp.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ip.h>
#include <rte_udp.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace caracal::server::dpdk {
namespace {

rte_mempool* g_pool = nullptr;

class Eal : public ::testing::Environment {
 public:
  void SetUp() override {
    std::vector<std::string> args{
        "caracal_dpdk_packet_test", "--no-huge", "--no-pci", "-m", "64", "--no-shconf",
        "--log-level=error",        "-l",        "0"};
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    if (rte_eal_init(static_cast<int>(argv.size()), argv.data()) < 0) {
      failed_ = std::string("rte_eal_init: ") + rte_strerror(rte_errno);
      return;
    }
    g_pool =
        rte_pktmbuf_pool_create("test_mbufs", 255, 0, 0, RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
    if (g_pool == nullptr) failed_ = std::string("mempool: ") + rte_strerror(rte_errno);
  }
  static std::string failed_;
};
std::string Eal::failed_;

const ::testing::Environment* const kEal = ::testing::AddGlobalTestEnvironment(new Eal);

class Packet : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Eal::failed_.empty()) {
      // Without root the EAL may not start here; as root it must.
      if (geteuid() != 0) GTEST_SKIP() << Eal::failed_;
      FAIL() << Eal::failed_;
    }
    ASSERT_EQ(rte_mempool_in_use_count(g_pool), 0u) << "a previous test leaked mbufs";
    me_.mac = rte_ether_addr{{0x02, 0, 0, 0, 0, 0x02}};
    me_.ipv4_be = inet_addr("192.0.2.2");
    to_.dst_mac = rte_ether_addr{{0x02, 0, 0, 0, 0, 0x01}};
    to_.dst_ip_be = inet_addr("192.0.2.1");
    to_.src_port = 40000;
    to_.dst_port = 7000;
  }
  void TearDown() override {
    if (g_pool != nullptr) {
      EXPECT_EQ(rte_mempool_in_use_count(g_pool), 0u) << "leaked mbufs";
    }
  }

  // A frame as the client would send it: from `to_` to `me_` (addresses swapped).
  rte_mbuf* request(const std::string& payload) {
    PortAddress client{to_.dst_mac, to_.dst_ip_be};
    UdpTo server{me_.mac, me_.ipv4_be, to_.src_port, to_.dst_port};
    return build_udp(g_pool, client, server, bytes(payload), 7, false);
  }
  static std::span<const std::byte> bytes(const std::string& s) {
    return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
  }
  static rte_ipv4_hdr* ip_of(rte_mbuf* m) {
    return rte_pktmbuf_mtod_offset(m, rte_ipv4_hdr*, sizeof(rte_ether_hdr));
  }
  static rte_udp_hdr* udp_of(rte_mbuf* m) {
    return rte_pktmbuf_mtod_offset(m, rte_udp_hdr*, sizeof(rte_ether_hdr) + sizeof(rte_ipv4_hdr));
  }
  // After a header edit: the IPv4 checksum made right again.
  static void fix_ip_checksum(rte_mbuf* m) {
    rte_ipv4_hdr* ip = ip_of(m);
    ip->hdr_checksum = 0;
    ip->hdr_checksum = rte_ipv4_cksum(ip);
  }
  FrameDrop drop_of(rte_mbuf* m) {
    const RxFrame f = parse_frame(m, me_);
    EXPECT_EQ(f.kind, RxFrame::Kind::kDrop);
    return f.drop;
  }

  PortAddress me_;
  UdpTo to_;
};

// The one's complement sum as RFC 1071 writes it, independent of DPDK's.
uint16_t reference_sum(const uint8_t* p, size_t n, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < n; i += 2)
    sum += (uint32_t{p[i]} << 8) | p[i + 1];
  if (n % 2) sum += uint32_t{p[n - 1]} << 8;
  while (sum >> 16)
    sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

TEST_F(Packet, BuiltDatagramHasCorrectHeadersAndChecksums) {
  rte_mbuf* m = build_udp(g_pool, me_, to_, bytes("hello"), 0x1234, false);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(rte_pktmbuf_pkt_len(m), kUdpHeadersBytes + 5);
  const auto* eth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
  EXPECT_TRUE(rte_is_same_ether_addr(&eth->dst_addr, &to_.dst_mac));
  EXPECT_TRUE(rte_is_same_ether_addr(&eth->src_addr, &me_.mac));
  const rte_ipv4_hdr* ip = ip_of(m);
  EXPECT_EQ(rte_be_to_cpu_16(ip->total_length), 20 + 8 + 5);
  EXPECT_EQ(rte_be_to_cpu_16(ip->packet_id), 0x1234);
  EXPECT_EQ(ip->src_addr, me_.ipv4_be);
  EXPECT_EQ(ip->dst_addr, to_.dst_ip_be);
  // The header sums to 0xFFFF with its checksum in it.
  EXPECT_EQ(reference_sum(reinterpret_cast<const uint8_t*>(ip), 20), 0xFFFF);
  const rte_udp_hdr* udp = udp_of(m);
  EXPECT_EQ(rte_be_to_cpu_16(udp->src_port), 40000);
  EXPECT_EQ(rte_be_to_cpu_16(udp->dst_port), 7000);
  EXPECT_EQ(rte_be_to_cpu_16(udp->dgram_len), 13);
  uint8_t pseudo[12];
  memcpy(pseudo, &ip->src_addr, 4);
  memcpy(pseudo + 4, &ip->dst_addr, 4);
  pseudo[8] = 0;
  pseudo[9] = IPPROTO_UDP;
  pseudo[10] = 0;
  pseudo[11] = 13;
  const uint16_t partial = reference_sum(pseudo, sizeof pseudo);
  EXPECT_EQ(reference_sum(reinterpret_cast<const uint8_t*>(udp), 13, partial), 0xFFFF);
  EXPECT_EQ(memcmp(udp + 1, "hello", 5), 0);
  rte_pktmbuf_free(m);
}

TEST_F(Packet, OffloadLeavesChecksumsToTheNic) {
  rte_mbuf* m = build_udp(g_pool, me_, to_, bytes("hello"), 1, true);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->ol_flags & (RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM),
            RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_IP_CKSUM | RTE_MBUF_F_TX_UDP_CKSUM);
  EXPECT_EQ(m->l2_len, sizeof(rte_ether_hdr));
  EXPECT_EQ(m->l3_len, sizeof(rte_ipv4_hdr));
  EXPECT_EQ(ip_of(m)->hdr_checksum, 0);
  EXPECT_EQ(udp_of(m)->dgram_cksum, rte_ipv4_phdr_cksum(ip_of(m), m->ol_flags));
  rte_pktmbuf_free(m);
}

TEST_F(Packet, ParsesADatagramForUs) {
  rte_mbuf* m = request("ping!");
  ASSERT_NE(m, nullptr);
  const RxFrame f = parse_frame(m, me_);
  ASSERT_EQ(f.kind, RxFrame::Kind::kUdp);
  EXPECT_TRUE(rte_is_same_ether_addr(&f.src_mac, &to_.dst_mac));
  EXPECT_EQ(f.src_ip_be, to_.dst_ip_be);
  EXPECT_EQ(f.src_port, 40000);
  EXPECT_EQ(f.dst_port, 7000);
  EXPECT_EQ(f.payload_offset, kUdpHeadersBytes);
  EXPECT_EQ(f.payload_bytes, 5u);
  rte_pktmbuf_free(m);
}

TEST_F(Packet, IgnoresEthernetPaddingAndAcceptsNoUdpChecksum) {
  rte_mbuf* m = request("x");
  ASSERT_NE(m, nullptr);
  udp_of(m)->dgram_cksum = 0;
  ASSERT_NE(rte_pktmbuf_append(m, 60 - rte_pktmbuf_pkt_len(m)), nullptr);
  memset(rte_pktmbuf_mtod_offset(m, char*, kUdpHeadersBytes + 1), 0xAB, 60 - kUdpHeadersBytes - 1);
  const RxFrame f = parse_frame(m, me_);
  ASSERT_EQ(f.kind, RxFrame::Kind::kUdp);
  EXPECT_EQ(f.payload_bytes, 1u);
  rte_pktmbuf_free(m);
}

// Each corruption of a good request, and the reason it is dropped for.
TEST_F(Packet, DropsMalformedFramesWithTheirReason) {
  struct Case {
    const char* what;
    FrameDrop expect;
    void (*edit)(rte_mbuf*);
  };
  static const Case cases[] = {
      {"IPv4 total length past the frame", FrameDrop::kBadLength,
       [](rte_mbuf* m) {
         ip_of(m)->total_length = rte_cpu_to_be_16(200);
         fix_ip_checksum(m);
       }},
      {"IPv4 total length shorter than the header", FrameDrop::kBadLength,
       [](rte_mbuf* m) {
         ip_of(m)->total_length = rte_cpu_to_be_16(16);
         fix_ip_checksum(m);
       }},
      {"IHL of 4 words", FrameDrop::kBadLength,
       [](rte_mbuf* m) {
         ip_of(m)->version_ihl = 0x44;
         fix_ip_checksum(m);
       }},
      {"IP version 6", FrameDrop::kBadLength,
       [](rte_mbuf* m) {
         ip_of(m)->version_ihl = 0x65;
         fix_ip_checksum(m);
       }},
      {"UDP length past the IP packet", FrameDrop::kBadLength,
       [](rte_mbuf* m) { udp_of(m)->dgram_len = rte_cpu_to_be_16(100); }},
      {"UDP length under 8", FrameDrop::kBadLength,
       [](rte_mbuf* m) { udp_of(m)->dgram_len = rte_cpu_to_be_16(7); }},
      {"IPv4 header checksum", FrameDrop::kBadChecksum,
       [](rte_mbuf* m) { ip_of(m)->hdr_checksum ^= 0x0100; }},
      {"UDP checksum", FrameDrop::kBadChecksum,
       [](rte_mbuf* m) { udp_of(m)->dgram_cksum ^= 0x0100; }},
      {"payload changed under the UDP checksum", FrameDrop::kBadChecksum,
       [](rte_mbuf* m) { *rte_pktmbuf_mtod_offset(m, char*, kUdpHeadersBytes) ^= 1; }},
      {"more fragments", FrameDrop::kFragment,
       [](rte_mbuf* m) {
         ip_of(m)->fragment_offset = rte_cpu_to_be_16(RTE_IPV4_HDR_MF_FLAG);
         fix_ip_checksum(m);
       }},
      {"fragment offset", FrameDrop::kFragment,
       [](rte_mbuf* m) {
         ip_of(m)->fragment_offset = rte_cpu_to_be_16(3);
         fix_ip_checksum(m);
       }},
      {"another IPv4 address", FrameDrop::kNotForUs,
       [](rte_mbuf* m) {
         ip_of(m)->dst_addr = inet_addr("192.0.2.99");
         fix_ip_checksum(m);
       }},
      {"another MAC", FrameDrop::kNotForUs,
       [](rte_mbuf* m) { rte_pktmbuf_mtod(m, rte_ether_hdr*)->dst_addr.addr_bytes[5] = 0x77; }},
      {"TCP", FrameDrop::kOtherProtocol,
       [](rte_mbuf* m) {
         ip_of(m)->next_proto_id = IPPROTO_TCP;
         fix_ip_checksum(m);
       }},
      {"IPv6 ethertype", FrameDrop::kOtherProtocol,
       [](rte_mbuf* m) {
         rte_pktmbuf_mtod(m, rte_ether_hdr*)->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV6);
       }},
      {"cut in the IPv4 header", FrameDrop::kTruncated,
       [](rte_mbuf* m) { rte_pktmbuf_trim(m, rte_pktmbuf_pkt_len(m) - 24); }},
      {"cut in the Ethernet header", FrameDrop::kTruncated,
       [](rte_mbuf* m) { rte_pktmbuf_trim(m, rte_pktmbuf_pkt_len(m) - 10); }},
      {"IP packet too short for a UDP header", FrameDrop::kTruncated,
       [](rte_mbuf* m) {
         ip_of(m)->total_length = rte_cpu_to_be_16(24);
         fix_ip_checksum(m);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    rte_mbuf* m = request("payload");
    ASSERT_NE(m, nullptr);
    c.edit(m);
    EXPECT_EQ(frame_drop_name(drop_of(m)), std::string(frame_drop_name(c.expect)));
    rte_pktmbuf_free(m);
  }
}

TEST_F(Packet, TrustsThePmdsChecksumVerdicts) {
  rte_mbuf* m = request("payload");
  ASSERT_NE(m, nullptr);
  m->ol_flags = RTE_MBUF_F_RX_IP_CKSUM_BAD;
  EXPECT_EQ(drop_of(m), FrameDrop::kBadChecksum);
  m->ol_flags = RTE_MBUF_F_RX_L4_CKSUM_BAD;
  EXPECT_EQ(drop_of(m), FrameDrop::kBadChecksum);
  // Marked good by the PMD: not checked again.
  udp_of(m)->dgram_cksum ^= 0x0100;
  m->ol_flags = RTE_MBUF_F_RX_IP_CKSUM_GOOD | RTE_MBUF_F_RX_L4_CKSUM_GOOD;
  EXPECT_EQ(parse_frame(m, me_).kind, RxFrame::Kind::kUdp);
  m->ol_flags = 0;
  EXPECT_EQ(drop_of(m), FrameDrop::kBadChecksum);
  rte_pktmbuf_free(m);
}

// Headers and payload split over two segments at every offset parse (and check) the same, and
// copy_payload finds the payload; an empty one too, whose offset is the end of the chain (DPDK's
// rte_pktmbuf_read of 0 bytes there walks past the last segment).
TEST_F(Packet, ParsesChainedMbufsSplitAnywhere) {
  for (const std::string payload : {"an odd-length payload", ""}) {
    rte_mbuf* whole = request(payload);
    ASSERT_NE(whole, nullptr);
    const uint32_t len = rte_pktmbuf_pkt_len(whole);
    const auto* bytes = rte_pktmbuf_mtod(whole, const uint8_t*);
    for (uint32_t cut = 1; cut < len; ++cut) {
      SCOPED_TRACE("cut at " + std::to_string(cut) + " of " + std::to_string(len));
      rte_mbuf* head = rte_pktmbuf_alloc(g_pool);
      rte_mbuf* tail = rte_pktmbuf_alloc(g_pool);
      ASSERT_TRUE(head && tail);
      memcpy(rte_pktmbuf_append(head, cut), bytes, cut);
      memcpy(rte_pktmbuf_append(tail, len - cut), bytes + cut, len - cut);
      ASSERT_EQ(rte_pktmbuf_chain(head, tail), 0);
      const RxFrame f = parse_frame(head, me_);
      EXPECT_EQ(f.kind, RxFrame::Kind::kUdp) << frame_drop_name(f.drop);
      if (f.kind != RxFrame::Kind::kUdp) {
        rte_pktmbuf_free(head);
        continue;
      }
      EXPECT_EQ(f.payload_bytes, payload.size());
      std::string got(f.payload_bytes, '\0');
      copy_payload(head, f, reinterpret_cast<std::byte*>(got.data()));
      EXPECT_EQ(got, payload);
      // A flipped byte in the second segment is still caught.
      rte_pktmbuf_mtod(tail, uint8_t*)[len - cut - 1] ^= 0x40;
      EXPECT_EQ(drop_of(head), FrameDrop::kBadChecksum);
      rte_pktmbuf_free(head);  // frees the chain
    }
    rte_pktmbuf_free(whole);
  }
}

TEST_F(Packet, AnswersArpRequestsForItsAddressOnly) {
  rte_mbuf* m = build_gratuitous_arp(g_pool, PortAddress{to_.dst_mac, to_.dst_ip_be});
  ASSERT_NE(m, nullptr);
  auto* arp = rte_pktmbuf_mtod_offset(m, rte_arp_hdr*, sizeof(rte_ether_hdr));
  // As a request from the client for someone else: not for us.
  EXPECT_EQ(drop_of(m), FrameDrop::kNotForUs);
  arp->arp_data.arp_tip = me_.ipv4_be;  // now for us
  ASSERT_EQ(parse_frame(m, me_).kind, RxFrame::Kind::kArpRequest);
  arp_request_to_reply(m, me_);
  const auto* eth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
  EXPECT_TRUE(rte_is_same_ether_addr(&eth->dst_addr, &to_.dst_mac));
  EXPECT_TRUE(rte_is_same_ether_addr(&eth->src_addr, &me_.mac));
  EXPECT_EQ(rte_be_to_cpu_16(arp->arp_opcode), RTE_ARP_OP_REPLY);
  EXPECT_TRUE(rte_is_same_ether_addr(&arp->arp_data.arp_sha, &me_.mac));
  EXPECT_EQ(arp->arp_data.arp_sip, me_.ipv4_be);
  EXPECT_TRUE(rte_is_same_ether_addr(&arp->arp_data.arp_tha, &to_.dst_mac));
  EXPECT_EQ(arp->arp_data.arp_tip, to_.dst_ip_be);
  // A reply is not a request: not answered.
  EXPECT_EQ(drop_of(m), FrameDrop::kNotForUs);
  rte_pktmbuf_free(m);
}

TEST_F(Packet, GratuitousArpAnnouncesTheAddress) {
  rte_mbuf* m = build_gratuitous_arp(g_pool, me_);
  ASSERT_NE(m, nullptr);
  const auto* eth = rte_pktmbuf_mtod(m, rte_ether_hdr*);
  EXPECT_TRUE(rte_is_broadcast_ether_addr(&eth->dst_addr));
  const auto* arp = rte_pktmbuf_mtod_offset(m, const rte_arp_hdr*, sizeof(rte_ether_hdr));
  EXPECT_EQ(rte_be_to_cpu_16(arp->arp_opcode), RTE_ARP_OP_REQUEST);
  EXPECT_EQ(arp->arp_data.arp_sip, me_.ipv4_be);
  EXPECT_EQ(arp->arp_data.arp_tip, me_.ipv4_be);
  rte_pktmbuf_free(m);
}

TEST_F(Packet, BuildReturnsTheMbufWhenThePayloadDoesNotFit) {
  const std::string big(RTE_MBUF_DEFAULT_DATAROOM, 'x');
  EXPECT_EQ(build_udp(g_pool, me_, to_, bytes(big), 1, false), nullptr);
  EXPECT_EQ(rte_mempool_in_use_count(g_pool), 0u);
}

TEST_F(Packet, BuildFailsCleanlyWhenThePoolIsEmpty) {
  std::vector<rte_mbuf*> all;
  while (rte_mbuf* m = rte_pktmbuf_alloc(g_pool))
    all.push_back(m);
  EXPECT_EQ(build_udp(g_pool, me_, to_, bytes("x"), 1, false), nullptr);
  EXPECT_EQ(build_gratuitous_arp(g_pool, me_), nullptr);
  for (rte_mbuf* m : all)
    rte_pktmbuf_free(m);
}

}  // namespace
}  // namespace caracal::server::dpdk
